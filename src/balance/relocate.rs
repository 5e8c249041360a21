//! Moving one extent to another place, inside a transaction, so that
//! every holder follows and nothing shared is unshared.
//!
//! Every holder of a tree block or data extent is known by address (the
//! back-references, plus what the running transaction changed), so
//! relocation needs no relocation tree: the extent is copied to its new
//! place, and each holder is made writable and repointed. A holder that
//! is not writable in this transaction is itself copied and its own
//! holders repointed, up to the roots: a block shared by many snapshots
//! is copied once and the copy is shared by all of them.
//!
//! Reference changes are made as a block copy's
//! (`BlockWrite::begin_copy`): no tree reaches anything it did not reach
//! before, so quota accounting has nothing to do (seed 000).

use crate::error::{Error, Result};
use crate::extent::apply::find_extent_item;
use crate::format::items::{data_ref_of, FileExtentItem};
use crate::format::key_type::EXTENT_CSUM;
use crate::format::node::{Body, Node};
use crate::format::tree_id::{CSUM, EXTENT, LOG};
use crate::format::{Key, CSUM_OBJECTID};
use crate::tree::{BlockRead, BlockWrite, Holder, RootPtr};
use crate::txn::DataCopies;
use crate::txn::Txn;
use crate::txn::{RefHolder, Relocation};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What a step learns about holders while it climbs back-references,
/// kept for the rest of its transaction: the last commit's
/// back-references do not change until the commit, and a block found
/// alive stays so unless relocation moves it (then its copy holds
/// everything). Without it, every extent below blocks shared by many
/// snapshots would climb every path to every root again.
#[derive(Default)]
pub(crate) struct Climb {
    committed: HashMap<u64, Arc<Vec<(RefHolder, i64)>>>,
    alive: HashMap<u64, bool>,
}

impl Climb {
    /// Holders of the extent at `bytenr` now, each with its count (items
    /// of a leaf pointing at a data extent; 1 otherwise): the last
    /// commit's back-references from holders still alive, with this
    /// transaction's changes applied. A committed holder that a copy
    /// replaced in this transaction (ordinary copy-on-write, or
    /// relocation) is dead: its copy holds the extent now, as the pending
    /// changes say.
    pub(crate) fn holders(
        &mut self,
        tx: &Txn<'_>,
        bytenr: u64,
    ) -> Result<BTreeMap<RefHolder, i64>> {
        self.holders_at(tx, bytenr, 0)
    }

    fn holders_at(
        &mut self,
        tx: &Txn<'_>,
        bytenr: u64,
        depth: usize,
    ) -> Result<BTreeMap<RefHolder, i64>> {
        crate::extent::check_climb(bytenr, depth)?;
        let mut out: BTreeMap<RefHolder, i64> = BTreeMap::new();
        for &(h, n) in self.committed(tx, bytenr)?.iter() {
            let alive = match h {
                RefHolder::TreeRoot(_) => true,
                RefHolder::TreeParent(p) | RefHolder::DataLeaf(p) => {
                    self.is_alive(tx, p, depth + 1)?
                }
            };
            if alive {
                *out.entry(h).or_insert(0) += n;
            }
        }
        if let Some(p) = tx.pending_refs(bytenr) {
            for (&h, &d) in &p.refs {
                *out.entry(h).or_insert(0) += d;
            }
        }
        out.retain(|_, n| *n > 0);
        Ok(out)
    }

    fn is_alive(&mut self, tx: &Txn<'_>, bytenr: u64, depth: usize) -> Result<bool> {
        if writable_in_place(tx, bytenr) {
            return Ok(true);
        }
        if let Some(&a) = self.alive.get(&bytenr) {
            return Ok(a);
        }
        let a = !self.holders_at(tx, bytenr, depth)?.is_empty();
        self.alive.insert(bytenr, a);
        Ok(a)
    }

    fn committed(&mut self, tx: &Txn<'_>, bytenr: u64) -> Result<Arc<Vec<(RefHolder, i64)>>> {
        if let Some(v) = self.committed.get(&bytenr) {
            return Ok(v.clone());
        }
        let v = Arc::new(crate::extent::backrefs(tx, &tx.root_of(EXTENT)?, bytenr)?);
        self.committed.insert(bytenr, v.clone());
        Ok(v)
    }

    /// The block at `bytenr` was moved: its copy holds what it held.
    fn moved(&mut self, bytenr: u64) {
        self.alive.insert(bytenr, false);
    }
}

/// The block at `bytenr` as the running transaction has it.
fn load(tx: &Txn<'_>, bytenr: u64) -> Result<Arc<Node>> {
    if let Some(n) = tx.dirty_block(bytenr) {
        return Ok(n);
    }
    let root = tx.root_of(EXTENT)?;
    let (_, item) = find_extent_item(tx, &root, bytenr)?
        .ok_or_else(|| Error::corrupt(bytenr, "relocating a block with no extent item"))?;
    tx.read_node(bytenr, item.generation)
}

/// Whether relocation may change the block at `bytenr` in place: a
/// copy it made in this transaction, or a block no other tree shares
/// that this transaction already copied.
fn writable_in_place(tx: &Txn<'_>, bytenr: u64) -> bool {
    tx.is_relocated(bytenr) || tx.is_writable(bytenr)
}

/// Copies the block at `bytenr` to a new place (outside read-only
/// groups) and repoints every holder. Returns the copy's address.
pub(crate) fn move_block(tx: &mut Txn<'_>, climb: &mut Climb, bytenr: u64) -> Result<u64> {
    let node = load(tx, bytenr)?;
    let copy = tx.alloc_node(node.owner, node.level, bytenr)?;
    tx.begin_copy(bytenr);
    crate::tree::count_entry_refs(tx, &node.body, 0..node.nritems(), copy, 1);
    tx.end_copy();
    tx.node_mut(copy)?.body = node.body.clone();
    // Possibly shared by several trees: ordinary changes must copy it.
    tx.adopt_relocated_block(bytenr, copy);
    repoint(tx, climb, bytenr, copy, node.level)?;
    climb.moved(bytenr);
    Ok(copy)
}

/// The version of `bytenr` relocation may change: itself, or a copy
/// every holder now points at.
fn writable(tx: &mut Txn<'_>, climb: &mut Climb, bytenr: u64) -> Result<u64> {
    if writable_in_place(tx, bytenr) {
        return Ok(bytenr);
    }
    move_block(tx, climb, bytenr)
}

/// Makes every holder of the tree block `old` point at `new` instead.
fn repoint(tx: &mut Txn<'_>, climb: &mut Climb, old: u64, new: u64, level: u8) -> Result<()> {
    let transid = tx.transid();
    for (holder, _) in climb.holders(tx, old)? {
        match holder {
            RefHolder::TreeRoot(t) if t != LOG => {
                if tx.root_of(t).ok().map(|r| r.bytenr) != Some(old) {
                    continue;
                }
                let ptr = RootPtr {
                    bytenr: new,
                    generation: transid,
                    level,
                };
                tx.set_root(t, ptr);
                swap_ref(tx, old, new, Holder::Root(t));
            }
            RefHolder::TreeParent(p) => {
                let pw = writable(tx, climb, p)?;
                let mut moved = 0;
                if let Body::Internal(ptrs) = &mut tx.node_mut(pw)?.body {
                    for ptr in ptrs.iter_mut().filter(|ptr| ptr.bytenr == old) {
                        ptr.bytenr = new;
                        ptr.generation = transid;
                        moved += 1;
                    }
                }
                for _ in 0..moved {
                    swap_ref(tx, old, new, Holder::Parent(pw));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn swap_ref(tx: &mut Txn<'_>, old: u64, new: u64, holder: Holder) {
    tx.as_copy(|tx| {
        tx.block_ref(new, holder, 1);
        tx.block_ref(old, holder, -1);
    });
}

/// A data extent's bytes and checksums, read and verified before the
/// step changes anything: a read error or a checksum mismatch then fails
/// the step alone.
pub(crate) struct DataCopy {
    pub bytenr: u64,
    buf: Vec<u8>,
    sums: Option<Vec<u8>>,
}

impl DataCopy {
    /// Reads the data extent `[bytenr, bytenr+len)` and its checksums,
    /// from a copy they match: balance must not spread damage under
    /// fresh checksums.
    pub(crate) fn read(tx: &Txn<'_>, bytenr: u64, len: u64) -> Result<DataCopy> {
        let sums = tx.get(CSUM, &csum_key(bytenr))?;
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| Error::corrupt(bytenr, "huge"))?];
        // Any good copy will do (a bad one is rewritten on the way).
        let read = tx.read_good_data(bytenr, &mut buf, sums.as_deref().unwrap_or(&[]), None);
        read.map_err(|e| match e {
            Error::Corrupt { .. } => Error::io(
                format!("relocating data at {bytenr}: no copy matches its checksums"),
                std::io::Error::from_raw_os_error(libc::EIO),
            ),
            e => e,
        })?;
        Ok(DataCopy { bytenr, buf, sums })
    }

    pub(crate) fn len(&self) -> u64 {
        self.buf.len() as u64
    }
}

fn csum_key(bytenr: u64) -> Key {
    Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr)
}

/// Writes `copy` at `new` (allocated for it), moves its checksums, and
/// repoints every file extent item that references the old place.
pub(crate) fn move_data(
    tx: &mut Txn<'_>,
    climb: &mut Climb,
    copy: DataCopy,
    new: u64,
) -> Result<()> {
    let (bytenr, len) = (copy.bytenr, copy.len());
    let leaves = climb.holders(tx, bytenr)?;
    tx.note_relocation(Relocation {
        from: bytenr,
        to: new,
        len,
        data: true,
    });
    tx.write_data(new, &copy.buf)?;
    if let Some(s) = copy.sums {
        tx.insert(CSUM, csum_key(new), s)?;
        tx.delete(CSUM, &csum_key(bytenr))?;
    }
    for (holder, _) in leaves {
        let RefHolder::DataLeaf(leaf) = holder else {
            continue;
        };
        let lw = writable(tx, climb, leaf)?;
        let moved = repoint_items(tx.node_mut(lw)?, bytenr, len, new)?;
        tx.as_copy(|tx| {
            for _ in 0..moved {
                tx.data_ref(bytenr, len, lw, -1);
                tx.data_ref(new, len, lw, 1);
            }
        });
    }
    tx.note_change();
    Ok(())
}

/// Points the file extent items of `leaf` that reference `old` at `new`.
fn repoint_items(leaf: &mut Node, old: u64, len: u64, new: u64) -> Result<u32> {
    let mut moved = 0;
    if let Body::Leaf(items) = &mut leaf.body {
        for i in 0..items.len() {
            let key = items.key(i);
            if data_ref_of(&key, items.data(i)) != Some((old, len)) {
                continue;
            }
            let mut fe = FileExtentItem::decode(items.data(i)).map_err(|e| key.bad(e))?;
            fe.disk_bytenr = new;
            items.replace_data(i, &fe.encode());
            moved += 1;
        }
    }
    Ok(moved)
}
