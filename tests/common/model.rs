//! A model-checked workload: random tree operations applied both to the
//! engine and to a `BTreeMap` per tree, compared after every step that reads
//! and after every commit and reopen, with `check` as the oracle for
//! reference counts and space.

use super::assert_clean;
use canopy::dev::{Device, MemDevice};
use canopy::format::items::FileExtentItem;
use canopy::format::key_type::EXTENT_DATA;
use canopy::format::tree_id::{FIRST_FREE, FS};
use canopy::tree::max_item_size;
use canopy::{Engine, Error, Key, OpenOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub enum Op {
    Insert {
        tree: usize,
        key: u16,
        len: u16,
    },
    Put {
        tree: usize,
        key: u16,
        len: u16,
    },
    Delete {
        tree: usize,
        key: u16,
    },
    /// Delete every `step`-th key of `count` from `from` at once (present
    /// or not), as `Txn::delete_sorted` does.
    DeleteSorted {
        tree: usize,
        from: u16,
        count: u8,
        step: u8,
    },
    Scan {
        tree: usize,
        key: u16,
        count: u8,
        backward: bool,
    },
    /// Insert a file extent item pointing at a new data extent.
    NewData {
        tree: usize,
        key: u16,
        blocks: u8,
    },
    /// Copy an existing file extent item to another key (a reflink).
    Reflink {
        tree: usize,
        from: u16,
        to: u16,
    },
    Clone {
        tree: usize,
    },
    Drop {
        tree: usize,
    },
    Commit,
    /// One bounded step of the cleaner that frees dropped trees.
    Clean,
    Reopen,
}

pub struct Harness {
    pub dev: Arc<MemDevice>,
    engine: Option<Engine>,
    model: BTreeMap<u64, BTreeMap<Key, Vec<u8>>>,
    next_tree: u64,
    nodesize: usize,
    stamp: u64,
    pub check_every_commit: bool,
}

fn item_key(k: u16) -> Key {
    Key::new(u64::from(k) * 7 + 257, 2, u64::from(k) % 3)
}

fn data_key(k: u16) -> Key {
    Key::new(u64::from(k) * 7 + 257, EXTENT_DATA, 0)
}

impl Harness {
    pub fn new(nodesize: u32) -> Harness {
        Harness::with_size(nodesize, 256 << 20)
    }

    pub fn with_size(nodesize: u32, bytes: u64) -> Harness {
        let (dev, e) = super::mem_engine(bytes, nodesize);
        let mut model = BTreeMap::new();
        model.insert(FS, BTreeMap::new());
        Harness {
            dev,
            engine: Some(e),
            model,
            next_tree: FIRST_FREE,
            nodesize: nodesize as usize,
            stamp: 0,
            check_every_commit: true,
        }
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine open")
    }

    fn tree_id(&self, idx: usize) -> u64 {
        let ids: Vec<u64> = self.model.keys().copied().collect();
        ids[idx % ids.len()]
    }

    /// Item payload: deterministic bytes so that a wrong item is detected.
    fn value(&mut self, len: u16) -> Vec<u8> {
        self.stamp += 1;
        let max = max_item_size(self.nodesize);
        let len = (usize::from(len) % (max + 1)).min(max);
        let s = self.stamp;
        (0..len).map(|i| (s as usize * 31 + i * 7) as u8).collect()
    }

    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Insert { tree, key, len } => {
                let id = self.tree_id(tree);
                let v = self.value(len);
                let k = item_key(key);
                let r = self.engine().write(|tx| tx.insert(id, k, v.clone()));
                let m = self.model.get_mut(&id).expect("tree");
                if let std::collections::btree_map::Entry::Vacant(e) = m.entry(k) {
                    r.expect("insert");
                    e.insert(v);
                } else {
                    assert!(matches!(r, Err(Error::Exists)), "{r:?}");
                }
            }
            Op::Put { tree, key, len } => {
                let id = self.tree_id(tree);
                let v = self.value(len);
                let k = item_key(key);
                let old = self
                    .engine()
                    .write(|tx| tx.put(id, k, v.clone()))
                    .expect("put");
                let m = self.model.get_mut(&id).expect("tree");
                assert_eq!(old, m.insert(k, v));
            }
            Op::Delete { tree, key } => {
                let id = self.tree_id(tree);
                let k = if key % 4 == 0 {
                    data_key(key)
                } else {
                    item_key(key)
                };
                let r = self.engine().write(|tx| tx.delete(id, &k));
                let m = self.model.get_mut(&id).expect("tree");
                match m.remove(&k) {
                    Some(v) => assert_eq!(r.expect("delete"), v),
                    None => assert!(matches!(r, Err(Error::NotFound)), "{r:?}"),
                }
            }
            Op::DeleteSorted {
                tree,
                from,
                count,
                step,
            } => {
                let id = self.tree_id(tree);
                let mut keys: Vec<Key> = (0..u32::from(count))
                    .map(|j| (u32::from(from) + j * u32::from(step.max(1))) as u16)
                    .map(|k| if k % 4 == 0 { data_key(k) } else { item_key(k) })
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                let r = self.engine().write(|tx| tx.delete_sorted(id, &keys));
                let m = self.model.get_mut(&id).expect("tree");
                let present = keys.iter().filter(|k| m.remove(k).is_some()).count();
                assert_eq!(r.expect("delete_sorted"), present);
            }
            Op::Scan {
                tree,
                key,
                count,
                backward,
            } => self.scan(tree, key, count, backward),
            Op::NewData { tree, key, blocks } => self.new_data(tree, key, blocks),
            Op::Reflink { tree, from, to } => {
                let id = self.tree_id(tree);
                let m = &self.model[&id];
                let Some((_, v)) = m.range(data_key(from)..).find(|(k, _)| k.ty == EXTENT_DATA)
                else {
                    return;
                };
                let v = v.clone();
                let k = data_key(to);
                self.engine()
                    .write(|tx| tx.put(id, k, v.clone()))
                    .expect("reflink");
                self.model.get_mut(&id).expect("tree").insert(k, v);
            }
            Op::Clone { tree } => {
                if self.model.len() >= 6 {
                    return;
                }
                let src = self.tree_id(tree);
                let dst = self.next_tree;
                self.next_tree += 1;
                self.engine()
                    .write(|tx| tx.clone_tree(src, dst, b"clone"))
                    .expect("clone");
                let copy = self.model[&src].clone();
                self.model.insert(dst, copy);
            }
            Op::Drop { tree } => {
                let id = self.tree_id(tree);
                if id == FS {
                    return;
                }
                self.engine().write(|tx| tx.drop_tree(id)).expect("drop");
                self.model.remove(&id);
            }
            Op::Commit => {
                self.engine().commit().expect("commit");
                if self.check_every_commit {
                    assert_clean(self.dev.as_ref());
                }
            }
            Op::Clean => {
                canopy::extent::drop::clean_dropped_step(self.engine()).expect("clean");
                if self.check_every_commit {
                    assert_clean(self.dev.as_ref());
                }
            }
            Op::Reopen => self.reopen(),
        }
    }

    fn new_data(&mut self, tree: usize, key: u16, blocks: u8) {
        let id = self.tree_id(tree);
        let len = (u64::from(blocks % 8) + 1) * 4096;
        let k = data_key(key);
        let stamp = self.stamp;
        self.stamp += 1;
        let v = self
            .engine()
            .write(|tx| {
                let bytenr = tx.alloc_data(len, 0)?;
                tx.write_data(bytenr, &vec![stamp as u8; len as usize])?;
                let fe = FileExtentItem::whole(bytenr, len, tx.transid());
                tx.put(id, k, fe.encode())?;
                Ok(fe.encode())
            })
            .expect("new data");
        self.model.get_mut(&id).expect("tree").insert(k, v);
    }

    fn scan(&self, tree: usize, key: u16, count: u8, backward: bool) {
        let id = self.tree_id(tree);
        let start = item_key(key);
        let m = &self.model[&id];
        let want: Vec<Key> = if backward {
            m.range(..=start)
                .rev()
                .take(usize::from(count))
                .map(|(k, _)| *k)
                .collect()
        } else {
            m.range(start..)
                .take(usize::from(count))
                .map(|(k, _)| *k)
                .collect()
        };
        let got = self
            .engine()
            .read(|r| {
                let root = r.root(id)?;
                let mut out = Vec::new();
                if backward {
                    let Some(mut c) = canopy::tree::Cursor::seek_le(r, &root, &start)? else {
                        return Ok(out);
                    };
                    while out.len() < usize::from(count) {
                        let Some(it) = c.item() else { break };
                        out.push(it.key);
                        if c.prev(r)?.is_none() {
                            break;
                        }
                    }
                } else {
                    let mut c = canopy::tree::Cursor::seek(r, &root, &start)?;
                    while out.len() < usize::from(count) {
                        let Some(it) = c.item() else { break };
                        out.push(it.key);
                        c.next(r)?;
                    }
                }
                Ok(out)
            })
            .expect("scan");
        assert_eq!(
            got, want,
            "scan of tree {id} from {start} backward={backward}"
        );
    }

    pub fn reopen(&mut self) {
        let e = self.engine.take().expect("engine");
        e.commit().expect("commit before reopen");
        drop(e);
        assert_clean(self.dev.as_ref());
        let e = Engine::open(self.dev.clone() as Arc<dyn Device>, &OpenOptions::default())
            .expect("reopen");
        self.engine = Some(e);
        self.verify_all();
    }

    /// Compares every tree with the model.
    pub fn verify_all(&self) {
        let ids: Vec<u64> = self.model.keys().copied().collect();
        for id in ids {
            let got = self
                .engine()
                .read(|r| r.range(id, &Key::MIN, &Key::MAX))
                .expect("range");
            let want: Vec<(Key, Vec<u8>)> = self.model[&id]
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(got.len(), want.len(), "tree {id} item count");
            assert!(got == want, "tree {id} contents differ");
            self.verify_many(id);
        }
        let trees = self.engine().read(|r| Ok(r.tree_ids())).expect("ids");
        for id in self.model.keys() {
            assert!(trees.contains(id), "tree {id} missing");
        }
    }

    /// Looks up every key of tree `id`, some twice, and keys it lacks,
    /// in one sorted `get_many_with`: each answer must be the model's.
    fn verify_many(&self, id: u64) {
        let mut keys: Vec<Key> = self.model[&id].keys().copied().collect();
        keys.extend((0..1500u16).step_by(11).map(item_key));
        keys.extend(self.model[&id].keys().step_by(5).copied());
        keys.sort();
        let got = self
            .engine()
            .read(|r| r.get_many_with(id, &keys, |k, d| (*k, d.to_vec())))
            .expect("get_many_with");
        assert_eq!(got.len(), keys.len());
        for (key, found) in keys.iter().zip(got) {
            let want = self.model[&id].get(key).map(|v| (*key, v.clone()));
            assert!(found == want, "tree {id} key {key}: get_many_with differs");
        }
    }

    /// Verifies every tree, frees everything dropped, and checks that
    /// no block leaked (`check` after the reopen).
    pub fn finish(mut self) {
        self.verify_all();
        while canopy::extent::drop::clean_dropped_step(self.engine()).expect("clean") > 0 {}
        self.reopen();
    }
}
