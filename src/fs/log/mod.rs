//! fsync through the log tree: what goes into the log, and when.
//!
//! fsync of an inode writes its buffered data, then copies into the log
//! tree (`txn::log` stores it) only that inode's state, and makes the log
//! durable with its blocks, a superblock write and one barrier: no commit.
//!
//! An inode is logged in one of three modes (the `LOG_INODE` item):
//!
//! - **Full** (fsync of the inode itself): its inode item, every name
//!   (INODE_REF/EXTREF items), every xattr, and for its data the file
//!   ranges changed in this transaction as `LOG_RANGE` items, each with
//!   the extent items covering it and the checksums of extents written in
//!   this transaction. Other inodes than regular files log all extents.
//! - **Names** (an inode whose names the log must carry): its inode item
//!   and every name. Replay creates it if the last commit lacks it, but
//!   never replaces the committed item of an existing one.
//! - **Gone**: the inode no longer exists; replay deletes it.
//!
//! A logged inode's names are always *all* of its names, so replay gives
//! it exactly those: a file renamed and fsynced has the new name only.
//! Whose names the log also carries:
//!
//! - the ancestors changed in this transaction (new or renamed
//!   directories), up to the first unchanged one, so an fsynced file is
//!   reachable after replay;
//! - for each name of a logged inode that the last commit gave to another
//!   inode still alive (renamed away, as editors do with `file~`), that
//!   other inode, so replay does not take its only name;
//! - for an fsynced directory, every child whose name in it changed in
//!   this transaction, so its entries are durable.
//!
//! Seed 003's rule: rename, link and unlink touch the log only for inodes
//! logged in the running transaction, known from an in-memory marker
//! ([`Changes`], in the inode's table entry), never by searching the log. For those, the log's copy
//! of the names is brought up to date at once, so the log never holds two
//! inodes claiming one name.

mod replay;

use super::rangeset::RangeSet;
use super::{dir, file, load_inode_tx, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{DirEntry, InodeItem, ROOT_DIR_INO};
use crate::format::key_type::{
    EXTENT_CSUM, EXTENT_DATA, INODE_EXTREF, INODE_ITEM, INODE_REF, LOG_DATA, LOG_INODE, LOG_RANGE,
    XATTR_ITEM,
};
use crate::format::tree_id::{CSUM, LOG};
use crate::format::{Key, CSUM_OBJECTID, LOG_DATA_CHUNK};
use crate::txn::{Need, Txn};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

pub(crate) use replay::{replay, LoggedBytes};

/// What an fsync must make durable besides the file's data and names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durable {
    /// Everything (fsync(2)).
    All,
    /// What reading the data back needs (fdatasync(2)): not the
    /// timestamps alone.
    Data,
}

/// What an fsync's step in the log found to do.
enum LogStep {
    /// The inode's state is in the log: write it.
    Logged,
    /// Nothing changed since the last commit: wait for that commit.
    Unchanged,
    /// The log cannot be trusted with it (it is stale: a log update
    /// failed after its operation had changed the trees, so the log may
    /// disagree with them; or the log found at open is not replayed
    /// yet): commit instead.
    NeedsCommit,
    /// Its buffered data cannot go into the log: flush it to extents,
    /// then log.
    Flush,
}

/// Most buffered bytes of one file an fsync puts into the log instead of
/// writing them to extents first. A few small writes (a database page,
/// a journal's append) then reach the device in the log write itself:
/// one write per fsync, not a data write and a log write (on a
/// replicated pool, one operation rather than two). More is flushed:
/// every fsync of the file until the next commit writes the leaves that
/// hold its bytes again, and the commit writes them once more to
/// extents.
pub(crate) const LOG_DATA_MAX: u64 = 64 << 10;

/// A file's buffer as an fsync logs it: only what differs from the
/// log's `LOG_DATA` items is copied (a database rewriting its last page
/// changes a few chunks of the up to [`LOG_DATA_MAX`] bytes it buffers).
struct Buffered {
    /// Chunks the log lacks or holds with other bytes: (file offset,
    /// bytes), each within one [`LOG_DATA_CHUNK`] of the file.
    changed: Vec<(u64, Vec<u8>)>,
    /// Offsets of the log's chunks that the buffer no longer holds.
    stale: Vec<u64>,
    /// Every buffered range: what the log holds of the file once the
    /// fsync is done.
    ranges: RangeSet,
    /// Size and times the buffered writes set (the logged inode item
    /// carries them).
    pending: Option<super::inodes::PendingAttrs>,
}

/// `ranges` cut at every multiple of [`LOG_DATA_CHUNK`]: an append that
/// grows the last chunk then changes one item, not all of them.
fn log_chunks(ranges: &super::writeback::Ranges) -> impl Iterator<Item = (u64, &[u8])> {
    ranges.iter().flat_map(|(&at, data)| {
        let mut off = at;
        let mut rest = &data[..];
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let room = (LOG_DATA_CHUNK - off % LOG_DATA_CHUNK) as usize;
            let (head, tail) = rest.split_at(room.min(rest.len()));
            let chunk = (off, head);
            off += head.len() as u64;
            rest = tail;
            Some(chunk)
        })
    })
}

/// Whether a file's buffer may go into the log as it is: no flush holds
/// any of it in flight (those bytes are in neither the buffer nor the
/// tree yet), and at most [`LOG_DATA_MAX`] bytes.
fn fits_the_log(s: &super::inodes::InodeState) -> bool {
    let bytes: u64 = s.buffered.values().map(|d| d.len() as u64).sum();
    s.in_flight.is_empty() && bytes <= LOG_DATA_MAX
}

/// A `LOG_DATA` item of the log: its file offset, and the leaf and slot
/// that hold its bytes (held, not copied).
struct LoggedChunk {
    offset: u64,
    leaf: Arc<crate::format::node::Node>,
    slot: usize,
}

impl LoggedChunk {
    fn bytes(&self) -> &[u8] {
        self.leaf.items().data(self.slot)
    }
}

/// The running log's `LOG_DATA` items of `ino`, in offset order.
fn logged_chunks(tx: &Txn<'_>, tree: u64, ino: u64) -> Result<Vec<LoggedChunk>> {
    let mut out = Vec::new();
    if !tx.has_log() {
        return Ok(out);
    }
    let (s, e) = keys_of(ino, LOG_DATA);
    let end = log_key(tree, e);
    let mut cursor = tx.cursor(LOG, &log_key(tree, s))?;
    while let Some((leaf, slot)) = cursor.leaf() {
        if slot >= leaf.nritems() {
            break;
        }
        let key = leaf.items().key(slot);
        if key >= end {
            break;
        }
        out.push(LoggedChunk {
            offset: key.offset,
            leaf: leaf.clone(),
            slot,
        });
        cursor.next(tx)?;
    }
    Ok(out)
}

/// Compares the buffer with what the log holds, chunk by chunk, both in
/// offset order: equal chunks stay, others are copied or dropped.
fn buffered_against_log(
    buffered: &super::writeback::Ranges,
    logged: &[LoggedChunk],
    pending: Option<super::inodes::PendingAttrs>,
) -> Buffered {
    let mut out = Buffered {
        changed: Vec::new(),
        stale: Vec::new(),
        ranges: RangeSet::default(),
        pending,
    };
    let mut logged = logged.iter().peekable();
    for (off, bytes) in log_chunks(buffered) {
        out.ranges.insert(off, off + bytes.len() as u64);
        while let Some(old) = logged.next_if(|c| c.offset < off) {
            out.stale.push(old.offset);
        }
        match logged.next_if(|c| c.offset == off) {
            Some(old) if old.bytes() == bytes => {}
            // A put replaces an item at the same offset.
            _ => out.changed.push((off, bytes.to_vec())),
        }
    }
    out.stale.extend(logged.map(|c| c.offset));
    out
}

/// `LOG_INODE` values.
pub(crate) const MODE_FULL: u8 = 0;
pub(crate) const MODE_NAMES: u8 = 1;
pub(crate) const MODE_GONE: u8 = 2;

/// Tree items a names update of one inode may change in the log.
pub(crate) const NAME_LOG_ITEMS: u64 = 8;

/// What the running transaction changed in one inode, for logging. It
/// lives in the inode's entry of the inode table, stamped with the
/// transaction; changes of an earlier transaction count as none (its
/// commit made them durable).
#[derive(Default)]
pub(crate) struct Changes {
    transid: u64,
    /// Logged in this transaction (seed 003's marker).
    logged: bool,
    /// File ranges whose extents changed since the inode was last logged.
    ranges: RangeSet,
    /// Children whose names in this directory changed.
    children: HashSet<u64>,
    /// Ranges of the buffer whose bytes the log holds (`LOG_DATA`) and no
    /// flush has written to extents yet: the commit that drops the log
    /// must wait for them ([`crate::txn::LoggedBytes`]).
    logged_bytes: RangeSet,
}

impl Changes {
    /// A flush wrote `[start, end)` of the file to extents in the running
    /// transaction: the log's bytes there are in the trees now.
    pub(crate) fn landed(&mut self, start: u64, end: u64) {
        self.logged_bytes.remove(start, end);
    }

    /// Whether it holds nothing about transaction `transid`.
    pub(crate) fn is_empty_for(&self, transid: u64) -> bool {
        self.transid < transid
            || (!self.logged
                && self.ranges.is_empty()
                && self.children.is_empty()
                && self.logged_bytes.is_empty())
    }
}

/// What the log knows of the running transaction as a whole.
#[derive(Default)]
pub(crate) struct Tracking {
    inner: Mutex<Tracked>,
}

#[derive(Default)]
struct Tracked {
    transid: u64,
    /// A log update failed after its operation had changed the trees:
    /// the log may disagree with them, so fsync commits instead.
    stale: bool,
}

impl Tracking {
    fn set_stale(&self, transid: u64) {
        let mut t = crate::sync::lock(&self.inner);
        t.transid = t.transid.max(transid);
        t.stale |= t.transid == transid;
    }

    fn is_stale(&self, transid: u64) -> bool {
        let t = crate::sync::lock(&self.inner);
        t.transid == transid && t.stale
    }
}

impl super::inodes::InodeTable {
    /// Runs `f` on what transaction `transid` changed in `ino`.
    fn changes<R>(&self, transid: u64, ino: u64, f: impl FnOnce(&mut Changes) -> R) -> R {
        self.advance(transid);
        self.with(ino, |s| {
            if s.changes.transid != transid {
                s.changes = Changes {
                    transid,
                    ..Changes::default()
                };
            }
            f(&mut s.changes)
        })
    }

    /// `f` of what transaction `transid` changed in `ino`, if anything.
    fn changed<R: Default>(&self, transid: u64, ino: u64, f: impl FnOnce(&Changes) -> R) -> R {
        self.advance(transid);
        self.peek(ino, |s| {
            if s.changes.transid == transid {
                f(&s.changes)
            } else {
                R::default()
            }
        })
        .unwrap_or_default()
    }
}

impl Subvol {
    /// The extents of `[start, end)` of `ino` changed.
    fn track_range(&self, transid: u64, ino: u64, start: u64, end: u64) {
        self.inodes
            .changes(transid, ino, |c| c.ranges.insert(start, end));
    }

    pub(crate) fn is_logged(&self, transid: u64, ino: u64) -> bool {
        self.inodes.changed(transid, ino, |c| c.logged)
    }

    /// Marks `inos` logged; the first, logged in full, also has its
    /// changed ranges in the log now.
    fn mark_logged(&self, transid: u64, full: Option<u64>, inos: &[u64]) {
        for &ino in full.iter().chain(inos) {
            self.inodes.changes(transid, ino, |c| {
                c.logged = true;
                if Some(ino) == full {
                    c.ranges.clear();
                }
            });
        }
    }

    /// The ranges of `ino` changed since it was last logged, merged. They
    /// stay noted until the log holding them is applied.
    fn tracked_ranges(&self, transid: u64, ino: u64) -> Vec<(u64, u64)> {
        self.inodes.changed(transid, ino, |c| c.ranges.to_vec())
    }

    fn tracked_children(&self, transid: u64, dir: u64) -> Vec<u64> {
        self.inodes
            .changed(transid, dir, |c| c.children.iter().copied().collect())
    }
}

/// Edits to the log, gathered before any is made so the space they need
/// can be reserved first.
#[derive(Default)]
struct Batch {
    /// Key ranges `[start, end)` of the log to clear.
    clear: Vec<(Key, Key)>,
    /// File ranges of the log to cut out: (ino, start, end).
    punch: Vec<(u64, u64, u64)>,
    puts: Vec<(Key, Vec<u8>)>,
}

impl Batch {
    /// Room for the edits, sized by `tree`'s height (the log's own is no
    /// greater than that of the fs tree it copies from).
    fn need(&self, tree: u64) -> Need {
        let bytes: u64 = self.puts.iter().map(|(_, d)| d.len() as u64 + 40).sum();
        let items = self.puts.len() + 2 * self.punch.len() + self.clear.len() + 2;
        Need::items(tree, items as u64).payload(bytes)
    }

    /// Makes the edits, with the keys of subvolume `tree`'s inodes turned
    /// into the log's (see [`log_key`]). An item a clear would delete and
    /// a put would write back as it is stays untouched: a leaf whose items
    /// an fsync only restates is not copied, so the next log write does
    /// not send it again. (Extent items are never kept that way: a punch
    /// may cut them between the clear and the puts.)
    fn apply(self, tx: &mut Txn<'_>, tree: u64) -> Result<()> {
        let mut puts: BTreeMap<Key, Vec<u8>> = self
            .puts
            .into_iter()
            .map(|(k, d)| (log_key(tree, k), d))
            .collect();
        for (start, end) in self.clear {
            let (start, end) = (log_key(tree, start), log_key(tree, end));
            for (k, d) in tx.range(LOG, &start, &end)? {
                if k.ty != EXTENT_DATA && puts.get(&k) == Some(&d) {
                    puts.remove(&k);
                } else {
                    tx.delete(LOG, &k)?;
                }
            }
        }
        for (ino, s, e) in self.punch {
            file::punch(tx, LOG, super::node_id(tree, ino), s, e)?;
        }
        for (k, d) in puts {
            tx.put(LOG, k, d)?;
        }
        Ok(())
    }
}

/// The log is one tree for every subvolume: an inode's items are keyed by
/// its node id there (the default subvolume's are unchanged). Checksum
/// items keep their key.
fn log_key(tree: u64, k: Key) -> Key {
    if k.objectid == CSUM_OBJECTID {
        return k;
    }
    Key::new(super::node_id(tree, k.objectid), k.ty, k.offset)
}

/// An item of the running transaction's log, if it has one.
fn log_get(tx: &Txn<'_>, tree: u64, key: &Key) -> Result<Option<Vec<u8>>> {
    if tx.has_log() {
        tx.get(LOG, &log_key(tree, *key))
    } else {
        Ok(None)
    }
}

fn keys_of(ino: u64, ty: u8) -> (Key, Key) {
    (Key::new(ino, ty, 0), Key::new(ino, ty + 1, 0))
}

/// Copies the raw items `[start, end)` of the fs tree.
fn copy_items(tx: &Txn<'_>, tree: u64, start: Key, end: Key) -> Result<Vec<(Key, Vec<u8>)>> {
    tx.range(tree, &start, &end)
}

impl Subvol {
    /// fsync(2) and fdatasync(2) of `ino`: its data and the log entries
    /// that make it (and the names that reach it) survive a crash. A
    /// regular file with a few small buffered writes logs their bytes
    /// (see [`LOG_DATA_MAX`]); otherwise its buffer is flushed to extents
    /// first and the log names those.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.sync_file(ino, Durable::All, 0)
    }

    /// fdatasync(2): as [`Subvol::fsync`], but timestamps need not be
    /// durable ([`Durable::Data`]).
    pub fn fdatasync(&self, ino: u64) -> Result<()> {
        self.sync_file(ino, Durable::Data, 0)
    }

    /// fsync(2) (or with `datasync`, fdatasync(2)) asked by thread
    /// `caller`, whom a log write may wait for while it is due back
    /// (see `txn::log::gather`).
    pub fn fsync_as(&self, ino: u64, datasync: bool, caller: u32) -> Result<()> {
        let durable = match datasync {
            true => Durable::Data,
            false => Durable::All,
        };
        self.sync_file(ino, durable, caller.into())
    }

    fn sync_file(&self, ino: u64, durable: Durable, caller: u64) -> Result<()> {
        if !self.core.log_enabled() {
            return self.core.sync();
        }
        let mut step = self
            .core
            .engine
            .write(|tx| self.log_step(tx, ino, true, durable));
        if matches!(step, Ok(LogStep::Flush)) {
            self.flush_file_for_fsync(ino)?;
            self.flush_symlinks_in(ino)?;
            step = self
                .core
                .engine
                .write(|tx| self.log_step(tx, ino, false, durable));
        }
        match step {
            Ok(LogStep::Logged) => self.core.engine.sync_log(caller),
            // Unchanged since the last commit: durable once it is written.
            Ok(LogStep::Unchanged) | Err(Error::NotFound) => self.core.engine.wait_prepared(),
            // No room for the log: a commit does it all.
            Ok(LogStep::NeedsCommit | LogStep::Flush) | Err(Error::NoSpace) => self.core.sync(),
            Err(e) => Err(e),
        }
    }

    /// The log's part of an fsync of `ino`, in one transaction; with
    /// `bytes`, the file's buffered bytes go into the log if they may
    /// ([`Subvol::loggable_bytes`]), else it asks for a flush first.
    fn log_step(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        bytes: bool,
        durable: Durable,
    ) -> Result<LogStep> {
        if tx.has_pending_log() || self.core.tracking.is_stale(tx.transid()) {
            return Ok(LogStep::NeedsCommit);
        }
        let buffered = match bytes {
            true => match self.loggable_bytes(tx, ino)? {
                Some(b) => Some(b),
                None => return Ok(LogStep::Flush),
            },
            false => None,
        };
        Ok(match self.log_inode(tx, ino, buffered, durable)? {
            true => LogStep::Logged,
            false => LogStep::Unchanged,
        })
    }

    /// What of `ino`'s buffer an fsync may put in the log rather than
    /// flush, read with the engine's state lock held (no flush of it can
    /// move on meanwhile): every buffered byte, if `ino` is a regular file
    /// with extents, at most [`LOG_DATA_MAX`] bytes are buffered and no
    /// flush holds any in flight (those are in neither the buffer nor the
    /// tree yet). An inline file is flushed: its data goes into the tree
    /// with no device write anyway.
    fn loggable_bytes(&self, tx: &Txn<'_>, ino: u64) -> Result<Option<Buffered>> {
        let Some(inode) = self.inodes.get(ino) else {
            return Ok(None);
        };
        if !tx.may_log_bytes() {
            return Ok(None);
        }
        // Nobody holds its flush lock (a truncate, a flush): such a holder
        // may commit before it lets go, and that commit could not flush
        // bytes logged meanwhile. One that takes it after this returns
        // waits for the state lock this transaction holds, and its flush
        // then writes what the log holds.
        let Some(_held) = self.inodes.try_lock_flush(ino) else {
            return Ok(None);
        };
        let mut item = load_inode_tx(tx, self.tree, ino)?;
        if item.mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None);
        }
        // Asked before the log is read, so a file whose buffer will be
        // flushed costs no walk; asked again under the lock the comparison
        // holds (writes go on meanwhile, and only ever add bytes: what
        // removes them needs the flush lock held here).
        if !fits_the_log(&crate::sync::lock(&inode.state)) {
            return Ok(None);
        }
        // Found before the entry's lock is taken: reading a log block may
        // need the device.
        let logged = logged_chunks(tx, self.tree, ino)?;
        let taken = {
            let s = crate::sync::lock(&inode.state);
            if !fits_the_log(&s) {
                return Ok(None);
            }
            buffered_against_log(&s.buffered, &logged, s.pending)
        };
        if let Some(p) = taken.pending {
            p.lay_over(&mut item);
        }
        let root = tx.root_of(self.tree)?;
        if item.size <= file::INLINE_MAX.max(file::INLINE_FILE_MAX)
            || file::is_inline(tx, &root, ino)?
        {
            return Ok(None);
        }
        Ok(Some(taken))
    }

    /// A directory's changed children go into the log with it, and a
    /// symlink is logged whole, target included. A long target is
    /// buffered data until the flush `create` runs right after its
    /// transaction: flush those first, so no symlink is logged without
    /// its target.
    fn flush_symlinks_in(&self, dir: u64) -> Result<()> {
        let pending: Vec<u64> = self
            .tracked_children(self.core.engine.transid(), dir)
            .into_iter()
            .filter(|&c| self.buffered_bytes_of(c) > 0)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let links = self.core.engine.read(|r| {
            Ok(pending
                .into_iter()
                .filter(|&c| {
                    super::load_inode_r(r, self.tree, c)
                        .is_ok_and(|i| i.mode & libc::S_IFMT == libc::S_IFLNK)
                })
                .collect::<Vec<u64>>())
        })?;
        links
            .into_iter()
            .try_for_each(|l| self.flush_file_for_fsync(l))
    }

    /// Logs `ino` in full, with `buffered` (its buffer, not flushed) as
    /// its data's newest bytes; false when it did not change in this
    /// transaction (nothing to log).
    fn log_inode(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        buffered: Option<Buffered>,
        durable: Durable,
    ) -> Result<bool> {
        let transid = tx.transid();
        let mut inode = load_inode_tx(tx, self.tree, ino)?;
        let pending = buffered.as_ref().and_then(|b| b.pending);
        let nothing_new = buffered
            .as_ref()
            .is_none_or(|b| b.ranges.is_empty() && b.stale.is_empty());
        if inode.transid < transid && nothing_new && pending.is_none() {
            return Ok(false);
        }
        if let Some(p) = pending {
            p.lay_over(&mut inode);
        }
        let mut batch = Batch::default();
        let item = match durable {
            Durable::Data => self.logged_item_but_times(tx, ino, &inode)?,
            Durable::All => None,
        };
        self.plan_full(tx, ino, &inode, item, &mut batch)?;
        let regular = inode.mode & libc::S_IFMT == libc::S_IFREG;
        let logged_bytes = match buffered {
            Some(b) if regular => plan_bytes(ino, b, &mut batch),
            None if regular => plan_no_bytes(tx, self.tree, ino, &mut batch)?,
            _ => RangeSet::default(),
        };
        let mut visited = HashSet::from([ino]);
        let mut extra = Vec::new();
        self.plan_related(tx, ino, &mut visited, &mut extra)?;
        if super::is_dir(inode.mode) {
            for child in self.tracked_children(transid, ino) {
                if visited.insert(child) {
                    extra.push(child);
                }
            }
        }
        // Names of everything related, found transitively.
        let mut others = Vec::new();
        while let Some(other) = extra.pop() {
            if self.plan_current_names(tx, other, &mut batch)? {
                self.plan_related(tx, other, &mut visited, &mut extra)?;
            }
            others.push(other);
        }
        // Room first: ENOSPC must come before the log changes anything.
        tx.reserve(&batch.need(self.tree))?;
        tx.ensure_log()?;
        batch.apply(tx, self.tree)?;
        // Its data, new extents or written in place, must be durable
        // before the log is: nothing else would tell replay it is not.
        if !super::file::keeps_sums(inode.flags) {
            tx.note_log_unchecked_data();
        }
        // Only now: a failure above leaves the ranges noted for the next
        // fsync and marks nothing logged that is not.
        self.mark_logged(transid, Some(ino), &others);
        if regular {
            tx.note_log_bytes(super::node_id(self.tree, ino), !logged_bytes.is_empty());
            self.inodes
                .changes(transid, ino, |c| c.logged_bytes = logged_bytes);
        }
        Ok(true)
    }

    /// Inodes whose names must be logged with `ino`'s: its ancestors
    /// changed in this transaction, and the live holders of its names in
    /// the last commit.
    fn plan_related(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        visited: &mut HashSet<u64>,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let root = tx.root_of(self.tree)?;
        let committed = tx.committed_root(self.tree);
        for r in dir::refs_of(tx, &root, ino)? {
            let parent = r.ino;
            if parent != ROOT_DIR_INO && !visited.contains(&parent) {
                let p = load_inode_tx(tx, self.tree, parent)?;
                if p.transid >= tx.transid() {
                    visited.insert(parent);
                    out.push(parent);
                }
            }
            let Some(croot) = committed else { continue };
            if let Some(old) = dir::lookup(tx, &croot, parent, &r.name)? {
                if old.ino != ino
                    && !visited.contains(&old.ino)
                    && tx.get(self.tree, &super::inode_key(old.ino))?.is_some()
                {
                    visited.insert(old.ino);
                    out.push(old.ino);
                }
            }
        }
        Ok(())
    }

    /// The inode item the log holds for `ino`'s full record, if it
    /// differs from `inode` only in timestamps: an fdatasync keeps it, so
    /// the leaf that holds it is not written again for a new mtime (a
    /// database's log overwritten in place and fdatasynced: one leaf less
    /// per commit). Its size, owner, mode, flags and block count are
    /// `inode`'s, which is all data retrieval needs.
    fn logged_item_but_times(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        inode: &InodeItem,
    ) -> Result<Option<Vec<u8>>> {
        let full = log_get(tx, self.tree, &Key::new(ino, LOG_INODE, 0))?;
        if full.as_deref() != Some(&[MODE_FULL][..]) {
            return Ok(None);
        }
        let Some(bytes) = log_get(tx, self.tree, &super::inode_key(ino))? else {
            return Ok(None);
        };
        let Ok(mut logged) = InodeItem::decode(&bytes) else {
            return Ok(None);
        };
        logged.atime = inode.atime;
        logged.mtime = inode.mtime;
        logged.ctime = inode.ctime;
        logged.transid = inode.transid;
        Ok((logged.encode() == inode.encode()).then_some(bytes))
    }

    /// The full record of `ino` (see the module doc), with `item` as its
    /// inode item if given (else `inode`'s).
    fn plan_full(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        inode: &InodeItem,
        item: Option<Vec<u8>>,
        batch: &mut Batch,
    ) -> Result<()> {
        let tree = self.tree;
        for ty in [INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, LOG_INODE] {
            batch.clear.push(keys_of(ino, ty));
        }
        batch
            .puts
            .push((Key::new(ino, LOG_INODE, 0), vec![MODE_FULL]));
        let item = item.unwrap_or_else(|| inode.encode());
        batch.puts.push((super::inode_key(ino), item));
        for ty in [INODE_REF, INODE_EXTREF, XATTR_ITEM] {
            let (s, e) = keys_of(ino, ty);
            batch.puts.extend(copy_items(tx, tree, s, e)?);
        }
        let ranges = if inode.mode & libc::S_IFMT == libc::S_IFREG {
            self.tracked_ranges(tx.transid(), ino)
        } else if super::is_dir(inode.mode) {
            Vec::new()
        } else {
            vec![(0, u64::MAX)]
        };
        let root = tx.root_of(tree)?;
        for (s, e) in ranges {
            batch.punch.push((ino, s, e));
            // Ranges may overlap; replay covers their union.
            let range_key = Key::new(ino, LOG_RANGE, s);
            let logged_end = log_get(tx, self.tree, &range_key)?
                .and_then(|d| d.try_into().ok().map(u64::from_le_bytes))
                .unwrap_or(0);
            batch
                .puts
                .push((range_key, e.max(logged_end).to_le_bytes().to_vec()));
            for (k, fe) in file::items_in(tx, &root, ino, s, e)? {
                let from = k.max(s);
                let to = (k + file::item_len(&fe)).min(e);
                if from >= to {
                    continue;
                }
                let part = file::slice(&fe, from - k, to - from)?;
                if let Some((bytenr, _)) = part.disk_extent() {
                    if tx.is_new_extent(bytenr) {
                        let ck = Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr);
                        if let Some(sums) = tx.get(CSUM, &ck)? {
                            batch.puts.push((ck, sums));
                        }
                    }
                }
                batch
                    .puts
                    .push((Key::new(ino, EXTENT_DATA, from), part.encode()));
            }
        }
        Ok(())
    }

    /// `ino`'s names as they are now, or its record as gone if it no
    /// longer exists (an unlinked open file has no names, and replay
    /// deletes it too). Returns whether it exists.
    fn plan_current_names(&self, tx: &Txn<'_>, ino: u64, batch: &mut Batch) -> Result<bool> {
        match load_inode_tx(tx, self.tree, ino) {
            Ok(i) => self.plan_names(tx, ino, &i, batch).map(|()| true),
            Err(Error::NotFound) => {
                plan_gone(ino, batch);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `ino`'s names, and its inode item unless the log has its full
    /// record already.
    fn plan_names(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        inode: &InodeItem,
        batch: &mut Batch,
    ) -> Result<()> {
        let tree = self.tree;
        let kind = inode.mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFDIR {
            // Symlinks and special files are tiny: log them whole.
            return self.plan_full(tx, ino, inode, None, batch);
        }
        let logged = log_get(tx, self.tree, &Key::new(ino, LOG_INODE, 0))?;
        for ty in [INODE_REF, INODE_EXTREF] {
            batch.clear.push(keys_of(ino, ty));
            let (s, e) = keys_of(ino, ty);
            batch.puts.extend(copy_items(tx, tree, s, e)?);
        }
        match logged.as_deref() {
            Some([MODE_FULL]) => {
                // Keep the logged item (its size goes with its logged
                // data); only the link count follows the names.
                if let Some(d) = log_get(tx, self.tree, &super::inode_key(ino))? {
                    if let Ok(mut old) = InodeItem::decode(&d) {
                        old.nlink = inode.nlink;
                        batch.puts.push((super::inode_key(ino), old.encode()));
                    }
                }
            }
            _ => {
                batch.clear.push(keys_of(ino, LOG_INODE));
                batch
                    .puts
                    .push((Key::new(ino, LOG_INODE, 0), vec![MODE_NAMES]));
                // Replay logs a new regular file empty: its data is not
                // in the log.
                batch.puts.push((super::inode_key(ino), inode.encode()));
            }
        }
        Ok(())
    }

    /// Seed 003's rule, called by rename, link and unlink inside their
    /// transaction after they changed the names of `inos`: only inodes
    /// logged in this transaction have their logged names brought up to
    /// date. A failure here cannot undo the operation, so it marks the
    /// log stale (the next fsync commits) instead of failing it.
    pub(crate) fn log_name_changes(&self, tx: &mut Txn<'_>, inos: &[u64]) -> Result<()> {
        let transid = tx.transid();
        let logged: Vec<u64> = inos
            .iter()
            .copied()
            .filter(|&i| self.is_logged(transid, i))
            .collect();
        if logged.is_empty() || !tx.has_log() {
            return Ok(());
        }
        let mut batch = Batch::default();
        for ino in logged {
            self.plan_current_names(tx, ino, &mut batch)?;
        }
        let applied = tx
            .reserve(&batch.need(self.tree))
            .and_then(|()| batch.apply(tx, self.tree));
        match applied {
            Err(Error::NoSpace) => {
                self.core.tracking.set_stale(transid);
                Ok(())
            }
            r => r,
        }
    }

    /// Notes that `[start, end)` of `ino`'s extents changed (for the next
    /// fsync's log). A file that is, or was, small enough to be inline has
    /// its whole range noted: its one item covers it all.
    pub(crate) fn note_extents(&self, tx: &Txn<'_>, ino: u64, old_size: u64, start: u64, end: u64) {
        const S: u64 = crate::format::SECTORSIZE as u64;
        let (s, e) = if old_size <= file::INLINE_FILE_MAX {
            (0, u64::MAX)
        } else {
            (start / S * S, end.div_ceil(S).saturating_mul(S))
        };
        self.track_range(tx.transid(), ino, s, e);
    }

    /// Notes that `child`'s name in `dir` changed (for a directory fsync).
    pub(crate) fn note_name(&self, tx: &Txn<'_>, dir: u64, child: u64) {
        self.inodes.changes(tx.transid(), dir, |c| {
            c.children.insert(child);
        });
    }
}

/// The log's `LOG_DATA` items of `ino` become what the buffer holds:
/// items equal to a buffered chunk stay (their leaves are not written
/// again), changed chunks replace theirs, and the others go. Every logged
/// byte not in the buffer now was flushed since (its extents are in the
/// log's ranges) or cut off, so the log keeps only what the buffer holds,
/// and replay lays those bytes over the logged extents, newest over
/// oldest. Returns the ranges the log then holds.
fn plan_bytes(ino: u64, buffered: Buffered, batch: &mut Batch) -> RangeSet {
    for off in buffered.stale {
        batch.clear.push((
            Key::new(ino, LOG_DATA, off),
            Key::new(ino, LOG_DATA, off.saturating_add(1)),
        ));
    }
    batch.puts.extend(
        buffered
            .changed
            .into_iter()
            .map(|(off, d)| (Key::new(ino, LOG_DATA, off), d)),
    );
    buffered.ranges
}

/// An fsync that flushed `ino`'s buffer: the log keeps none of its
/// bytes (see [`plan_bytes`]).
fn plan_no_bytes(tx: &Txn<'_>, tree: u64, ino: u64, batch: &mut Batch) -> Result<RangeSet> {
    let none = Buffered {
        changed: Vec::new(),
        stale: logged_chunks(tx, tree, ino)?
            .into_iter()
            .map(|c| c.offset)
            .collect(),
        ranges: RangeSet::default(),
        pending: None,
    };
    Ok(plan_bytes(ino, none, batch))
}

/// The fs layer as the engine's commit sees it when the log holds file
/// bytes ([`crate::txn::LoggedBytes`]). It holds the core weakly: the
/// engine outlives it, and an engine whose core is gone commits only
/// once nothing the log holds is buffered ([`Fs`]'s drop flushes all).
pub(crate) struct BytesHook(pub std::sync::Weak<super::Core>);

impl crate::txn::LoggedBytes for BytesHook {
    /// Only the files that still buffer logged bytes: one whose flush
    /// lock the committing thread may hold (a truncate that commits to
    /// free space) flushed when it took the lock, and no fsync logs bytes
    /// of a file while its flush lock is held (`loggable_bytes`).
    fn flush(&self, nodes: &[u64], transid: u64) -> Result<()> {
        let Some(core) = self.0.upgrade() else {
            return Err(Error::Invalid(
                "the fsync log holds file bytes of a filesystem no longer open".into(),
            ));
        };
        for &node in nodes {
            if !self.unflushed(node, transid) {
                continue;
            }
            let (tree, ino) = super::split_node(node);
            match core.subvol(tree) {
                Ok(sv) => sv.flush_file_for_fsync(ino)?,
                // A subvolume deleted meanwhile buffers nothing.
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn unflushed(&self, node: u64, transid: u64) -> bool {
        let Some(core) = self.0.upgrade() else {
            return true;
        };
        let (tree, ino) = super::split_node(node);
        // Only subvolumes open already: opening one reads trees, which
        // needs the state lock the caller holds.
        let Some(sv) = crate::sync::read(&core.subvols).get(&tree).cloned() else {
            return false;
        };
        sv.inodes
            .peek(ino, |s| {
                s.changes.transid == transid
                    && s.buffered
                        .iter()
                        .any(|(&at, d)| s.changes.logged_bytes.overlaps(at, at + d.len() as u64))
            })
            .unwrap_or(false)
    }
}

impl super::Core {
    /// Puts the bytes replay found in the log into their files' buffers,
    /// then, on a writable engine, commits: the commit writes them to
    /// extents in the transaction that drops the log, so the disk always
    /// holds them one way or the other. A file the replay deleted (no
    /// names left) has nothing to take them.
    pub(crate) fn restore_logged_bytes(self: &Arc<Self>, bytes: Vec<LoggedBytes>) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        for b in bytes {
            let live = self
                .engine
                .read(|r| Ok(super::load_inode_r(r, b.tree, b.ino).is_ok()))?;
            if live {
                let sv = self.subvol(b.tree)?;
                sv.restore_logged_bytes(b.ino, b.offset, b.bytes)?;
            }
        }
        if !self.engine.is_read_only() {
            self.sync()?;
        }
        Ok(())
    }
}

/// The log's record of an inode that no longer exists.
fn plan_gone(ino: u64, batch: &mut Batch) {
    batch
        .clear
        .push((Key::new(ino, 0, 0), Key::new(ino.saturating_add(1), 0, 0)));
    batch
        .puts
        .push((Key::new(ino, LOG_INODE, 0), vec![MODE_GONE]));
}

/// Every name in `entries` as (parent, name).
pub(crate) fn name_set(entries: &[DirEntry]) -> HashSet<(u64, Vec<u8>)> {
    entries.iter().map(|e| (e.ino, e.name.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::super::inodes::InodeTable;

    /// Seed 003's marker lives in the inode's entry for one transaction:
    /// the entry stays while that transaction runs and goes once the next
    /// one is seen.
    #[test]
    fn changes_of_an_older_transaction_count_as_none() {
        let t = InodeTable::new();
        t.changes(7, 300, |c| c.logged = true);
        t.changes(7, 301, |c| c.ranges.insert(0, 4096));
        assert!(t.changed(7, 300, |c| c.logged));
        assert!(!t.changed(7, 301, |c| c.logged));
        assert!(t.get(300).is_some(), "kept while its transaction runs");
        assert!(
            !t.changed(8, 300, |c| c.logged),
            "a new transaction starts clean"
        );
        assert!(t.get(300).is_none() && t.get(301).is_none(), "swept");
    }
}
