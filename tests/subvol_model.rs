//! Subvolumes against a model: random writes, truncates, renames, removes
//! and reflinks interleaved with snapshots (the model copies its state at
//! snapshot time), read-only snapshots, deletes, commits and remounts.
//! After every step each subvolume must list exactly the model's files
//! with the model's contents, and after every remount `check` (with its
//! subvolume-link checks) must be clean.

mod common;

use canopy::balance::{BalanceArgs, Step};
use canopy::dev::{Device, MemDevice};
use canopy::fs::{Fs, Owner, SetAttr};
use canopy::{Engine, OpenOptions};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };
const FILES: u8 = 4;

#[derive(Clone, Debug)]
enum Op {
    Write {
        sv: u8,
        file: u8,
        off: u32,
        len: u16,
        byte: u8,
    },
    Truncate {
        sv: u8,
        file: u8,
        size: u32,
    },
    Remove {
        sv: u8,
        file: u8,
    },
    Rename {
        sv: u8,
        from: u8,
        to: u8,
    },
    /// copy_file_range of whole sectors, possibly between subvolumes.
    Reflink {
        from_sv: u8,
        from: u8,
        to_sv: u8,
        to: u8,
        blocks: u8,
    },
    Snapshot {
        sv: u8,
        readonly: bool,
    },
    Create,
    Delete {
        sv: u8,
    },
    Sync,
    /// One bounded step of the cleaner that frees deleted subvolumes.
    Clean,
    /// One step of a balance of every group (started when none is
    /// recorded), in the running transaction: relocation mixed with the
    /// other changes of one commit.
    Balance,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (any::<u8>(), 0..FILES, 0u32..200_000, 1u16..30_000, any::<u8>())
            .prop_map(|(sv, file, off, len, byte)| Op::Write { sv, file, off, len, byte }),
        2 => (any::<u8>(), 0..FILES, 0u32..200_000)
            .prop_map(|(sv, file, size)| Op::Truncate { sv, file, size }),
        1 => (any::<u8>(), 0..FILES).prop_map(|(sv, file)| Op::Remove { sv, file }),
        2 => (any::<u8>(), 0..FILES, 0..FILES).prop_map(|(sv, from, to)| Op::Rename { sv, from, to }),
        2 => (any::<u8>(), 0..FILES, any::<u8>(), 0..FILES, 1u8..20)
            .prop_map(|(from_sv, from, to_sv, to, blocks)| Op::Reflink { from_sv, from, to_sv, to, blocks }),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(sv, readonly)| Op::Snapshot { sv, readonly }),
        1 => Just(Op::Create),
        1 => any::<u8>().prop_map(|sv| Op::Delete { sv }),
        1 => Just(Op::Sync),
        2 => Just(Op::Clean),
        2 => Just(Op::Balance),
        1 => Just(Op::Reopen),
    ]
}

/// The model of one subvolume: its name in the top level and its files.
#[derive(Clone, Debug)]
struct Model {
    name: String,
    readonly: bool,
    files: BTreeMap<String, Vec<u8>>,
}

fn file_name(i: u8) -> String {
    format!("f{i}")
}

struct World {
    dev: Arc<MemDevice>,
    fs: Option<Fs>,
    /// Index 0 is the top level (tree 5).
    subvols: Vec<Model>,
    made: u32,
    /// Quotas are on: after every sync the recorded qgroup numbers must
    /// equal a count made from scratch.
    quota: bool,
}

impl World {
    fn fs(&self) -> &Fs {
        self.fs.as_ref().expect("mounted")
    }

    fn pick(&self, i: u8) -> usize {
        usize::from(i) % self.subvols.len()
    }

    fn root_of(&self, i: usize) -> u64 {
        match i {
            0 => ROOT,
            _ => {
                self.fs()
                    .lookup(ROOT, self.subvols[i].name.as_bytes())
                    .expect("subvolume")
                    .ino
            }
        }
    }

    fn file(&self, sv: usize, name: &str) -> Option<u64> {
        self.fs()
            .lookup(self.root_of(sv), name.as_bytes())
            .ok()
            .map(|a| a.ino)
    }

    /// The file, created if the model has none (and the subvolume allows).
    fn file_or_new(&mut self, sv: usize, name: &str) -> u64 {
        if let Some(ino) = self.file(sv, name) {
            return ino;
        }
        let root = self.root_of(sv);
        let ino = self
            .fs()
            .create(root, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)
            .expect("create")
            .ino;
        self.subvols[sv].files.insert(name.into(), Vec::new());
        ino
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write {
                sv,
                file,
                off,
                len,
                byte,
            } => {
                let sv = self.pick(sv);
                let name = file_name(file);
                if self.refused(sv) {
                    return;
                }
                let ino = self.file_or_new(sv, &name);
                let data = vec![byte; usize::from(len)];
                self.fs().write(ino, u64::from(off), &data).expect("write");
                let m = self.subvols[sv].files.get_mut(&name).expect("model file");
                let end = off as usize + data.len();
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
            }
            Op::Truncate { sv, file, size } => {
                let sv = self.pick(sv);
                let name = file_name(file);
                let Some(ino) = self.file(sv, &name) else {
                    return;
                };
                let set = SetAttr {
                    size: Some(u64::from(size)),
                    ..Default::default()
                };
                if self.refused(sv) {
                    assert_eq!(
                        self.fs().setattr(ino, &set).unwrap_err().errno(),
                        libc::EROFS
                    );
                    return;
                }
                self.fs().setattr(ino, &set).expect("truncate");
                let m = self.subvols[sv].files.get_mut(&name).expect("model file");
                m.resize(size as usize, 0);
            }
            Op::Remove { sv, file } => {
                let sv = self.pick(sv);
                let name = file_name(file);
                if self.file(sv, &name).is_none() || self.refused(sv) {
                    return;
                }
                let root = self.root_of(sv);
                self.fs()
                    .remove(root, name.as_bytes(), false)
                    .expect("unlink");
                self.subvols[sv].files.remove(&name);
            }
            Op::Rename { sv, from, to } => {
                let sv = self.pick(sv);
                let (a, b) = (file_name(from), file_name(to));
                if self.file(sv, &a).is_none() || self.refused(sv) {
                    return;
                }
                let root = self.root_of(sv);
                self.fs()
                    .rename(root, a.as_bytes(), root, b.as_bytes(), false, false)
                    .expect("rename");
                let m = &mut self.subvols[sv].files;
                let data = m.remove(&a).expect("model file");
                m.insert(b, data);
            }
            Op::Reflink {
                from_sv,
                from,
                to_sv,
                to,
                blocks,
            } => {
                let (fsv, tsv) = (self.pick(from_sv), self.pick(to_sv));
                let (a, b) = (file_name(from), file_name(to));
                let Some(src) = self.file(fsv, &a) else {
                    return;
                };
                if self.refused(tsv) {
                    return;
                }
                let dst = self.file_or_new(tsv, &b);
                let len = u64::from(blocks) * 4096;
                let n = self
                    .fs()
                    .copy_range(src, 0, dst, 0, len)
                    .expect("copy_file_range");
                let bytes = self.subvols[fsv].files[&a][..n as usize].to_vec();
                let m = self.subvols[tsv].files.get_mut(&b).expect("model file");
                if m.len() < bytes.len() {
                    m.resize(bytes.len(), 0);
                }
                m[..bytes.len()].copy_from_slice(&bytes);
            }
            Op::Snapshot { sv, readonly } => {
                let sv = self.pick(sv);
                let name = self.next_name();
                let root = self.root_of(sv);
                self.fs()
                    .snapshot(root, ROOT, name.as_bytes(), readonly)
                    .expect("snapshot");
                let mut copy = self.subvols[sv].clone();
                copy.name = name;
                copy.readonly = readonly;
                self.subvols.push(copy);
            }
            Op::Create => {
                let name = self.next_name();
                self.fs()
                    .create_subvolume(ROOT, name.as_bytes(), ME)
                    .expect("subvolume");
                self.subvols.push(Model {
                    name,
                    readonly: false,
                    files: BTreeMap::new(),
                });
            }
            Op::Delete { sv } => {
                let sv = self.pick(sv);
                if sv == 0 {
                    return;
                }
                let name = self.subvols[sv].name.clone();
                self.fs()
                    .delete_subvolume(ROOT, name.as_bytes())
                    .expect("delete");
                self.subvols.remove(sv);
            }
            Op::Sync => {
                self.fs().sync().expect("sync");
                self.assert_quota_exact();
            }
            Op::Clean => {
                self.fs().clean_step().expect("cleaner step");
            }
            Op::Balance => {
                let step = self
                    .fs()
                    .engine()
                    .write(|tx| match canopy::balance::step(tx)? {
                        Step::Idle => canopy::balance::start(tx, BalanceArgs::all()).map(drop),
                        _ => Ok(()),
                    });
                step.expect("balance step");
            }
            Op::Reopen => self.reopen(),
        }
    }

    /// With quotas on, the numbers of the last commit equal a fresh count.
    fn assert_quota_exact(&self) {
        if !self.quota {
            return;
        }
        common::assert_quota_exact(self.fs(), "qgroups");
    }

    /// Whether a change to subvolume `sv` must fail (and does, EROFS).
    fn refused(&self, sv: usize) -> bool {
        if !self.subvols[sv].readonly {
            return false;
        }
        let root = self.root_of(sv);
        let r = self
            .fs()
            .create(root, b"nope", libc::S_IFREG | 0o644, 0, ME, None);
        assert_eq!(
            r.unwrap_err().errno(),
            libc::EROFS,
            "read-only snapshot changed"
        );
        true
    }

    fn next_name(&mut self) -> String {
        self.made += 1;
        format!("s{}", self.made)
    }

    fn reopen(&mut self) {
        let fs = self.fs.take().expect("mounted");
        fs.sync().expect("sync");
        drop(fs);
        common::assert_fs_clean(&self.dev);
        // Reopened, the engine folds reference changes before the commit
        // after almost every operation, so the accounting (checked after
        // every step) also meets extents folded early.
        let early = OpenOptions {
            settle_early_at: 16,
            ..OpenOptions::default()
        };
        let e = Engine::open(self.dev.clone() as Arc<dyn Device>, &early).expect("open");
        self.fs = Some(Fs::new(Arc::new(e)).expect("fs"));
        self.assert_quota_exact();
    }

    /// Every subvolume lists exactly its model's files, with their bytes,
    /// and no two files anywhere share an inode number.
    fn verify(&self) -> Result<(), TestCaseError> {
        let mut seen = BTreeSet::new();
        let fs = self.fs();
        for (i, m) in self.subvols.iter().enumerate() {
            let root = self.root_of(i);
            let listed: BTreeSet<String> = fs
                .readdir(root, 0, usize::MAX)
                .expect("readdir")
                .into_iter()
                .skip(2)
                .map(|(_, _, _, n)| String::from_utf8_lossy(&n).into_owned())
                // Links to snapshots (top level) and the empty
                // directories that stand for them in snapshots of it.
                .filter(|n| n.starts_with('f'))
                .collect();
            let want: BTreeSet<String> = m.files.keys().cloned().collect();
            prop_assert_eq!(&listed, &want, "files of {}", m.name);
            for (name, data) in &m.files {
                let a = fs.lookup(root, name.as_bytes()).expect("lookup");
                prop_assert!(seen.insert(a.ino), "inode {} seen twice", a.ino);
                prop_assert_eq!(a.size, data.len() as u64, "size of {}/{}", m.name, name);
                let got = fs.read(a.ino, 0, data.len() as u32 + 1).expect("read");
                prop_assert!(&got == data, "contents of {}/{}", m.name, name);
            }
        }
        let names: Vec<String> = fs
            .list_subvolumes()
            .expect("list")
            .into_iter()
            .map(|s| s.path)
            .collect();
        let want: Vec<String> = self.subvols[1..].iter().map(|m| m.name.clone()).collect();
        let (mut a, mut b) = (names, want);
        a.sort();
        b.sort();
        prop_assert_eq!(a, b);
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn subvolumes_and_snapshots_match_a_model(
        ops in proptest::collection::vec(op(), 1..40),
        quota in any::<bool>(),
    ) {
        let (dev, e) = common::mem_engine(256 << 20, 4096);
        let fs = Fs::new(Arc::new(e)).expect("fs");
        if quota {
            fs.quota(canopy::fs::QuotaChange::Enable).expect("quota enable");
        }
        let top = Model { name: String::new(), readonly: false, files: BTreeMap::new() };
        let mut w = World { dev, fs: Some(fs), subvols: vec![top], made: 0, quota };
        for op in &ops {
            w.apply(op);
            w.verify()?;
        }
        w.fs().clean_deleted().expect("clean");
        prop_assert_eq!(w.fs().queued_drops(), 0);
        w.reopen();
        w.verify()?;
    }
}
