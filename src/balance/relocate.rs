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
use crate::format::items::{data_ref_of, FileExtentItem, COMPRESS_NONE, FILE_EXTENT_REG};
use crate::format::key_type::EXTENT_CSUM;
use crate::format::node::{Body, Node};
use crate::format::tree_id::{CSUM, EXTENT, LOG};
use crate::format::{Key, CSUM_OBJECTID};
use crate::tree::{BlockRead, BlockWrite, Holder, RootPtr};
use crate::txn::DataCopies;
use crate::txn::Txn;
use crate::txn::{RefHolder, Relocation};
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    roots: HashMap<u64, Arc<BTreeSet<u64>>>,
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

    /// The trees that reach the extent or block at `bytenr` now (the log
    /// aside): what decides which quota groups count it.
    pub(crate) fn roots(&mut self, tx: &Txn<'_>, bytenr: u64) -> Result<Arc<BTreeSet<u64>>> {
        self.roots_at(tx, bytenr, 0)
    }

    fn roots_at(&mut self, tx: &Txn<'_>, bytenr: u64, depth: usize) -> Result<Arc<BTreeSet<u64>>> {
        crate::extent::check_climb(bytenr, depth)?;
        if let Some(r) = self.roots.get(&bytenr) {
            return Ok(r.clone());
        }
        let mut out = BTreeSet::new();
        for (h, _) in self.holders_at(tx, bytenr, depth)? {
            match h {
                RefHolder::TreeRoot(t) if t != LOG => {
                    out.insert(t);
                }
                RefHolder::TreeRoot(_) => {}
                RefHolder::TreeParent(p) | RefHolder::DataLeaf(p) => {
                    out.extend(self.roots_at(tx, p, depth + 1)?.iter().copied());
                }
            }
        }
        let out = Arc::new(out);
        self.roots.insert(bytenr, out.clone());
        Ok(out)
    }

    /// The block at `bytenr` was moved: its copy holds what it held.
    fn moved(&mut self, bytenr: u64) {
        self.alive.insert(bytenr, false);
    }
}

/// The block at `bytenr` as the running transaction has it.
pub(crate) fn load(tx: &Txn<'_>, bytenr: u64) -> Result<Arc<Node>> {
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
        // A `chattr +C` file may be writing into it: copy what it wrote.
        tx.wait_in_place(Some(bytenr));
        let sums = tx.get(CSUM, &csum_key(bytenr))?;
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| Error::corrupt(bytenr, "huge"))?];
        // Any good copy will do (a bad one is rewritten on the way); with
        // no checksums (preallocated space, a `chattr +C` file's data),
        // any copy that reads.
        let read = match &sums {
            Some(sums) => tx.read_good_data(bytenr, &mut buf, sums, None),
            None => tx.read_unchecked_data(bytenr, &mut buf, None),
        };
        read.map_err(|e| unreadable(bytenr, e))?;
        Ok(DataCopy { bytenr, buf, sums })
    }

    pub(crate) fn len(&self) -> u64 {
        self.buf.len() as u64
    }
}

/// A data extent no copy of which matches its checksums: EIO, named.
fn unreadable(bytenr: u64, e: Error) -> Error {
    match e {
        Error::Corrupt { .. } => Error::io(
            format!("relocating data at {bytenr}: no copy matches its checksums"),
            std::io::Error::from_raw_os_error(libc::EIO),
        ),
        e => e,
    }
}

pub(crate) fn csum_key(bytenr: u64) -> Key {
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

/// Extents far apart on the device closer than this are read as one.
const STAGE_GAP: u64 = 64 << 10;
/// The longest single read of [`Staged`].
const STAGE_MAX: u64 = 4 << 20;

/// The data extents of one step, all asked of the device at once (so it
/// works on them together, not one after another) and read in device
/// order with neighbours read together: a few large reads replace many
/// small ones where extents lie side by side. Nothing read here is trusted: each extent is
/// checked against its checksums when taken, and one that fails (or a
/// span whose read failed) is read again from a good copy.
pub(crate) struct Staged {
    /// (device start, bytes), by start.
    spans: Vec<(u64, Vec<u8>)>,
}

impl Staged {
    /// Reads `extents` ((start, length), any order), buffers from `pool`.
    pub(crate) fn read(tx: &Txn<'_>, extents: &[(u64, u64)], pool: &mut Vec<Vec<u8>>) -> Staged {
        // `chattr +C` files may be writing into them: read what they wrote.
        for &(start, _) in extents {
            tx.wait_in_place(Some(start));
        }
        let mut sorted = extents.to_vec();
        sorted.sort_unstable();
        // (start, end, how many extents) of each range read as one.
        let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
        for (start, len) in sorted {
            match ranges.last_mut() {
                Some((s, e, n)) if start <= *e + STAGE_GAP && start + len - *s <= STAGE_MAX => {
                    *e = (*e).max(start + len);
                    *n += 1;
                }
                _ => ranges.push((start, start + len, 1)),
            }
        }
        // All asked for first, so the device works on them together.
        let copies: Vec<usize> = ranges
            .iter()
            .map(|&(start, end, _)| tx.preferred_data_copy(start, end - start, 0))
            .collect();
        for (&(start, end, _), &copy) in ranges.iter().zip(&copies) {
            tx.prefetch_data_copy(start, end - start, copy);
        }
        let mut spans = Vec::with_capacity(ranges.len());
        for ((start, end, extents), copy) in ranges.into_iter().zip(copies) {
            if extents == 1 {
                // One extent alone: read straight where it goes.
                continue;
            }
            let mut buf = pool.pop().unwrap_or_default();
            buf.clear();
            buf.resize((end - start) as usize, 0);
            match tx.read_data_copy(start, &mut buf, copy) {
                Ok(()) => spans.push((start, buf)),
                // Each extent of it is read on its own.
                Err(_) => pool.push(buf),
            }
        }
        Staged { spans }
    }

    /// Fills `out` with the extent at `bytenr`, verified with `sums`
    /// (when it has any).
    fn fill(&self, tx: &Txn<'_>, bytenr: u64, out: &mut [u8], sums: Option<&[u8]>) -> Result<()> {
        if let Some(src) = self.slice(bytenr, out.len()) {
            if sums.is_none_or(|sums| crate::format::first_bad_sector(src, sums).is_none()) {
                out.copy_from_slice(src);
                return Ok(());
            }
        }
        let read = match sums {
            Some(sums) => tx.read_good_data(bytenr, out, sums, None),
            None => tx.read_unchecked_data(bytenr, out, None),
        };
        read.map_err(|e| unreadable(bytenr, e))
    }

    fn slice(&self, bytenr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .spans
            .partition_point(|s| s.0 <= bytenr)
            .checked_sub(1)?;
        let (start, buf) = &self.spans[i];
        let from = usize::try_from(bytenr - start).ok()?;
        buf.get(from..from.checked_add(len)?)
    }

    /// Gives the buffers back.
    pub(crate) fn recycle(self, pool: &mut Vec<Vec<u8>>) {
        pool.extend(self.spans.into_iter().map(|s| s.1));
    }
}

/// Whole data extents written one after another into one new extent
/// (`canopy filesystem defragment`): each holder's items point at the
/// same bytes in the new extent (`offset` shifted by where the old
/// extent lies in it), so an extent shared by snapshots and reflinks
/// stays shared. Unlike a move, the reference changes are traced for the
/// quota accounting: a tree now reaches one extent where it reached
/// several, and the commit counts that exactly.
pub(crate) struct Merge {
    /// The old extents, (start, length), in their order in the new one.
    parts: Vec<(u64, u64)>,
    /// Their bytes, one after another, verified.
    buf: Vec<u8>,
    /// Their checksums joined, when they have them (all or none).
    sums: Option<Vec<u8>>,
    /// Where the merged extent goes (allocated for the sum of lengths).
    pub new: u64,
}

impl Merge {
    /// Takes the extents `parts` from `staged` into one buffer (a buffer
    /// of `pool`'s), each verified against its checksums; `new` is set
    /// later.
    pub(crate) fn read(
        tx: &Txn<'_>,
        staged: &Staged,
        parts: Vec<(u64, u64)>,
        pool: &mut Vec<Vec<u8>>,
    ) -> Result<Merge> {
        let total: u64 = parts.iter().map(|p| p.1).sum();
        let total = usize::try_from(total).map_err(|_| Error::corrupt(0, "huge"))?;
        let mut buf = pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(total, 0);
        let mut joined: Vec<u8> = Vec::new();
        let mut with_sums = 0;
        let mut at = 0usize;
        for &(bytenr, len) in &parts {
            let sums = tx.get(CSUM, &csum_key(bytenr))?;
            let end = at + len as usize;
            staged.fill(tx, bytenr, &mut buf[at..end], sums.as_deref())?;
            if let Some(s) = sums {
                joined.extend_from_slice(&s);
                with_sums += 1;
            }
            at = end;
        }
        if with_sums != 0 && with_sums != parts.len() {
            return Err(Error::Invalid(
                "merging data extents with and without checksums".into(),
            ));
        }
        Ok(Merge {
            parts,
            buf,
            sums: (with_sums != 0).then_some(joined),
            new: 0,
        })
    }

    /// How many extents it merges.
    pub(crate) fn extents(&self) -> usize {
        self.parts.len()
    }

    pub(crate) fn len(&self) -> u64 {
        self.buf.len() as u64
    }
}

/// Writes `m`'s extents at `m.new`, one after another, with their
/// checksums joined; repoints every file extent item that references
/// them; then joins items of one file that now follow each other in the
/// new extent into one. Returns how many items went away.
pub(crate) fn merge_data(
    tx: &mut Txn<'_>,
    climb: &mut Climb,
    m: Merge,
    pool: &mut Vec<Vec<u8>>,
) -> Result<u64> {
    let total = m.len();
    tx.write_data(m.new, &m.buf)?;
    // The old extents' checksums go when the fold releases them.
    if let Some(sums) = m.sums {
        tx.insert(CSUM, csum_key(m.new), sums)?;
    }
    // Every holder leaf made writable first, then each rewritten in one
    // pass: a leaf holds many of the extents.
    let mut at: HashMap<u64, (u64, u64)> = HashMap::with_capacity(m.parts.len());
    let mut touched: Vec<u64> = Vec::new();
    let mut base = 0;
    for &(old, len) in &m.parts {
        at.insert(old, (len, base));
        base += len;
        for (holder, _) in climb.holders(tx, old)? {
            if let RefHolder::DataLeaf(leaf) = holder {
                let lw = writable(tx, climb, leaf)?;
                if !touched.contains(&lw) {
                    touched.push(lw);
                }
            }
        }
    }
    for &lw in &touched {
        let moved = repoint_into(tx.node_mut(lw)?, &at, m.new, total)?;
        for (old, n) in moved {
            let len = at.get(&old).map_or(0, |a| a.0);
            tx.data_ref(old, len, lw, -i64::from(n));
            tx.data_ref(m.new, total, lw, i64::from(n));
        }
    }
    pool.push(m.buf);
    let mut joined = 0;
    for lw in touched {
        let n = join_items(tx.node_mut(lw)?, m.new)?;
        if n > 0 {
            tx.data_ref(m.new, total, lw, -i64::from(n));
            joined += u64::from(n);
        }
    }
    tx.note_change();
    Ok(joined)
}

/// Points the file extent items of `leaf` that reference one of the
/// extents in `at` (old start -> length, place in the new extent) at the
/// same bytes of the merged extent at `new`, `len` long. How many items
/// each old extent lost.
fn repoint_into(
    leaf: &mut Node,
    at: &HashMap<u64, (u64, u64)>,
    new: u64,
    len: u64,
) -> Result<BTreeMap<u64, u32>> {
    let mut moved = BTreeMap::new();
    if let Body::Leaf(items) = &mut leaf.body {
        for i in 0..items.len() {
            let key = items.key(i);
            let Some((old, old_len)) = data_ref_of(&key, items.data(i)) else {
                continue;
            };
            let Some(&(want_len, base)) = at.get(&old) else {
                continue;
            };
            if old_len != want_len {
                continue;
            }
            let mut fe = FileExtentItem::decode(items.data(i)).map_err(|e| key.bad(e))?;
            fe.disk_bytenr = new;
            fe.disk_num_bytes = len;
            fe.ram_bytes = len;
            fe.offset += base;
            items.replace_data(i, &fe.encode());
            *moved.entry(old).or_insert(0) += 1;
        }
    }
    Ok(moved)
}

/// Joins each item of `leaf` into the one before it where both are one
/// file's and the second continues the first in the extent at `new` as
/// in the file. The first item of the leaf never goes, so its parent's
/// key stays right. Returns how many items went.
fn join_items(leaf: &mut Node, new: u64) -> Result<u32> {
    let Body::Leaf(items) = &mut leaf.body else {
        return Ok(0);
    };
    let mut joined = 0;
    let mut i = 1;
    while i < items.len() {
        let (ka, kb) = (items.key(i - 1), items.key(i));
        let both = ka.objectid == kb.objectid
            && data_ref_of(&ka, items.data(i - 1)).is_some_and(|(b, _)| b == new)
            && data_ref_of(&kb, items.data(i)).is_some_and(|(b, _)| b == new);
        if !both {
            i += 1;
            continue;
        }
        let mut a = FileExtentItem::decode(items.data(i - 1)).map_err(|e| ka.bad(e))?;
        let b = FileExtentItem::decode(items.data(i)).map_err(|e| kb.bad(e))?;
        let follows = a.kind == FILE_EXTENT_REG
            && b.kind == FILE_EXTENT_REG
            && a.compression == COMPRESS_NONE
            && b.compression == COMPRESS_NONE
            && ka.offset.checked_add(a.num_bytes) == Some(kb.offset)
            && a.offset.checked_add(a.num_bytes) == Some(b.offset);
        if !follows {
            i += 1;
            continue;
        }
        a.num_bytes += b.num_bytes;
        a.generation = a.generation.max(b.generation);
        items.replace_data(i - 1, &a.encode());
        items.remove(i);
        joined += 1;
    }
    Ok(joined)
}
