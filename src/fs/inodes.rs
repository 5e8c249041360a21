//! The in-memory table of live inodes: one entry per inode that holds
//! something beyond what the tree has (buffered data, open handles, a
//! ghost, a read stream), each under its own lock.
//!
//! Before this table the same facts lived in four global maps, each behind
//! one mutex that every file's reads and writes took. Now two threads
//! working on different files share only the table's map lock, taken
//! briefly to find an entry, and each entry is dropped as soon as it
//! holds nothing.
//!
//! Locks: the engine's state lock (when held) comes first, then the map,
//! then an entry's state. An entry's state lock is never held across
//! device I/O or while waiting for the engine.
//!
//! Each entry also has a *flush lock*, held for a whole flush of the file
//! (its writeback pipeline, see `writeback`) and by the operations that
//! rewrite the file's extents (truncate, fallocate, reflink), so those
//! never interleave with a flush of the same file.

use super::log::Changes;
use super::readahead::Stream;
use super::setid::has_set_id;
use super::writeback::{Ranges, DEFAULT_DIRTY_LIMIT};
use crate::cache::{BlockMap as InodeMap, BlockSet as InodeSet};
use crate::format::inode::{InodeItem, Timespec};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Bytes being flushed: taken from the buffer, not in the tree yet.
pub(crate) type InFlight = BTreeMap<u64, Arc<Vec<u8>>>;

/// What Canopy holds in memory for one inode.
#[derive(Default)]
pub(crate) struct InodeState {
    /// Written data waiting for extents (see `writeback`).
    pub buffered: Ranges,
    /// Data a running flush took: readers still see it until its extents
    /// are in the tree.
    pub in_flight: InFlight,
    /// Bytes in `buffered` and `in_flight`, kept as they change: getattr
    /// asks for it on every call, and a database file holds thousands of
    /// ranges.
    pub held_bytes: u64,
    /// Open file handles: an unlinked inode lives on (as an orphan) until
    /// its last handle is released.
    pub open: u32,
    /// The inode's flags as a writable open or `chattr` last saw them:
    /// writes through a handle opened before `chattr +i` are refused,
    /// and `+S` makes them synchronous (see `attrs`).
    pub attr_flags: u64,
    /// The last attributes of a deleted inode the kernel may still name
    /// (see `ghost`).
    pub ghost: Option<Box<InodeItem>>,
    /// The file's sequential reader, for read-ahead.
    pub stream: Stream,
    /// What the running transaction changed, and whether the inode was
    /// logged in it (see `log`).
    pub changes: Changes,
    /// Size and times that buffered writes set and the tree's item does
    /// not have yet: laid over the item whenever it is loaded (see
    /// `writeback`, "Writes without the state lock").
    pub pending: Option<PendingAttrs>,
    /// Data space the engine holds for this file's next buffered writes,
    /// beyond its buffers' footprint: a write it covers needs no state
    /// lock (see `writeback`).
    pub credit: u64,
    /// Whether the file's mode has a set-user-ID or set-group-ID bit, as
    /// read under the engine's lock or saved since (None: not known). The
    /// kernel asks every write by a caller without CAP_FSETID to clear
    /// those bits (see `setid`); knowing there are none, a write leaves
    /// the engine's lock alone. Every save of the inode item sets it
    /// ([`InodeTable::note_saved`]), so it cannot go stale.
    pub set_id: Option<bool>,
}

/// What buffered writes changed in an inode's attributes. Each only ever
/// grows (a write extends the size, and stamps the times with now), so
/// laying them over the item takes the larger of each; an operation that
/// lowers one (truncate, an explicit mtime) clears it here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PendingAttrs {
    pub size: u64,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

impl PendingAttrs {
    /// Notes a write that ends at `end` at time `now`.
    pub fn wrote(p: Option<PendingAttrs>, end: u64, now: Timespec) -> PendingAttrs {
        let p = p.unwrap_or_default();
        PendingAttrs {
            size: p.size.max(end),
            mtime: p.mtime.max(now),
            ctime: p.ctime.max(now),
        }
    }

    /// Lays these attributes over the item `i` loaded from the tree.
    pub fn lay_over(&self, i: &mut InodeItem) {
        i.size = i.size.max(self.size);
        i.mtime = i.mtime.max(self.mtime);
        i.ctime = i.ctime.max(self.ctime);
    }

    /// Whether the item `i` already says everything these do.
    pub fn within(&self, i: &InodeItem) -> bool {
        let mut laid = i.clone();
        self.lay_over(&mut laid);
        laid == *i
    }
}

impl InodeState {
    /// Whether it holds nothing while `transid` runs.
    fn is_idle(&self, transid: u64) -> bool {
        self.buffered.is_empty()
            && self.in_flight.is_empty()
            && self.open == 0
            && self.ghost.is_none()
            && self.stream == Stream::default()
            && self.changes.is_empty_for(transid)
            && self.pending.is_none()
            && self.credit == 0
    }

    /// Whether a flush has something to do for it: buffered data, or
    /// attributes or credit to settle.
    pub fn needs_flush(&self) -> bool {
        !self.buffered.is_empty() || self.pending.is_some() || self.credit > 0
    }
}

/// One inode's entry.
#[derive(Default)]
pub(crate) struct Inode {
    pub state: Mutex<InodeState>,
    flushing: Mutex<bool>,
    flush_done: Condvar,
}

/// Bytes buffered in the files of every subvolume (not counting those in
/// flight), and how many may be before writers flush.
pub(crate) struct Budget {
    buffered: AtomicU64,
    /// Bytes flushes took and have not written yet: still in memory, so
    /// writers wait for them too (a write needs no lock a flush holds).
    in_flight: AtomicU64,
    limit: AtomicU64,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            buffered: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(DEFAULT_DIRTY_LIMIT),
        }
    }
}

impl Budget {
    pub fn buffered(&self) -> u64 {
        self.buffered.load(Ordering::Relaxed)
    }

    fn add(&self, grown: i64) {
        add_signed(&self.buffered, grown);
    }

    pub fn add_in_flight(&self, grown: i64) {
        add_signed(&self.in_flight, grown);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes.max(1), Ordering::Relaxed);
    }

    pub fn over_limit(&self) -> bool {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        self.buffered().saturating_add(in_flight) > self.limit()
    }
}

fn add_signed(n: &AtomicU64, by: i64) {
    if by >= 0 {
        n.fetch_add(by as u64, Ordering::Relaxed);
    } else {
        n.fetch_sub(by.unsigned_abs(), Ordering::Relaxed);
    }
}

/// The table of one subvolume's inodes.
pub(crate) struct InodeTable {
    /// Hashed like block addresses (one multiplication, not SipHash): a
    /// request looks entries up a dozen times.
    map: Mutex<InodeMap<Arc<Inode>>>,
    /// Inodes that may hold buffered data: each is added when its buffer
    /// gains data and dropped when a look finds it empty, so finding the
    /// dirty files costs what they are, not every live inode.
    dirty: Mutex<InodeSet>,
    /// Inodes whose pages the kernel may have cached: read or written
    /// through the mount since the kernel last forgot them (see
    /// `atime`). Pages the kernel evicted on its own still count.
    cached: Mutex<InodeSet>,
    budget: Arc<Budget>,
    /// The newest transaction the log has seen: what entries noted about
    /// older ones is void.
    transid: AtomicU64,
}

/// The flush lock of one inode, released on drop.
pub(crate) struct FlushLock<'t> {
    table: &'t InodeTable,
    ino: u64,
    pub inode: Arc<Inode>,
}

impl Drop for FlushLock<'_> {
    fn drop(&mut self) {
        *crate::sync::lock(&self.inode.flushing) = false;
        self.inode.flush_done.notify_all();
        self.table.tidy_holding(self.ino, 1);
    }
}

impl InodeTable {
    #[cfg(test)]
    pub fn new() -> InodeTable {
        InodeTable::with_budget(Arc::default())
    }

    /// A table whose buffered bytes count against `budget`.
    pub fn with_budget(budget: Arc<Budget>) -> InodeTable {
        InodeTable {
            map: Mutex::default(),
            dirty: Mutex::default(),
            cached: Mutex::default(),
            budget,
            transid: AtomicU64::new(0),
        }
    }

    /// Notes that transaction `transid` runs; when it is new, drops the
    /// entries that held only what earlier transactions changed.
    pub fn advance(&self, transid: u64) {
        if self.transid.fetch_max(transid, Ordering::Relaxed) < transid {
            let mut map = crate::sync::lock(&self.map);
            map.retain(|_, inode| {
                Arc::strong_count(inode) > 1 || !crate::sync::lock(&inode.state).is_idle(transid)
            });
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        crate::sync::lock(&self.map).get(&ino).cloned()
    }

    fn entry(&self, ino: u64) -> Arc<Inode> {
        crate::sync::lock(&self.map).entry(ino).or_default().clone()
    }

    /// Runs `f` on the state of `ino`, creating the entry if needed and
    /// dropping it afterwards if it holds nothing.
    pub fn with<R>(&self, ino: u64, f: impl FnOnce(&mut InodeState) -> R) -> R {
        let inode = self.entry(ino);
        let r = f(&mut crate::sync::lock(&inode.state));
        drop(inode);
        self.tidy(ino);
        r
    }

    /// Runs `f` on the state of `ino` if it has an entry.
    pub fn peek<R>(&self, ino: u64, f: impl FnOnce(&InodeState) -> R) -> Option<R> {
        let inode = self.get(ino)?;
        let r = f(&crate::sync::lock(&inode.state));
        Some(r)
    }

    /// Drops the entry of `ino` if it holds nothing and nobody uses it.
    fn tidy(&self, ino: u64) {
        self.tidy_holding(ino, 0);
    }

    /// [`InodeTable::tidy`] by a caller holding `held` references.
    fn tidy_holding(&self, ino: u64, held: usize) {
        let mut map = crate::sync::lock(&self.map);
        let Some(inode) = map.get(&ino) else { return };
        // Beside the caller's, the map's reference is the only one: nobody
        // else can be about to change the entry, since getting one takes
        // the map lock.
        let transid = self.transid.load(Ordering::Relaxed);
        if Arc::strong_count(inode) == 1 + held && crate::sync::lock(&inode.state).is_idle(transid)
        {
            map.remove(&ino);
        }
    }

    /// Takes the flush lock of `ino`, waiting for a flush or rewrite of
    /// the file to finish first.
    pub fn lock_flush(&self, ino: u64) -> FlushLock<'_> {
        let inode = self.entry(ino);
        let mut busy = crate::sync::lock(&inode.flushing);
        while *busy {
            busy = inode
                .flush_done
                .wait(busy)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *busy = true;
        drop(busy);
        FlushLock {
            table: self,
            ino,
            inode,
        }
    }

    /// The flush lock of `ino` if nobody holds it.
    pub fn try_lock_flush(&self, ino: u64) -> Option<FlushLock<'_>> {
        let inode = self.get(ino)?;
        let mut busy = crate::sync::lock(&inode.flushing);
        if *busy {
            return None;
        }
        *busy = true;
        drop(busy);
        Some(FlushLock {
            table: self,
            ino,
            inode,
        })
    }

    /// `ino`'s item `stored` was saved in the running transaction: drops
    /// its pending attributes if the item says everything they do, and
    /// notes whether its mode has set-id bits.
    pub fn note_saved(&self, ino: u64, stored: &InodeItem) {
        if let Some(inode) = self.get(ino) {
            let mut s = crate::sync::lock(&inode.state);
            if s.pending.is_some_and(|p| p.within(stored)) {
                s.pending = None;
            }
            s.set_id = Some(has_set_id(stored.mode));
            drop(s);
            drop(inode);
            self.tidy(ino);
        }
    }

    /// Notes whether `ino`'s mode, read by a caller holding the engine's
    /// lock (so no save can come between the read and the note), has
    /// set-id bits; only for an inode with an entry.
    pub fn note_set_id(&self, ino: u64, mode: u32) {
        if let Some(inode) = self.get(ino) {
            crate::sync::lock(&inode.state).set_id = Some(has_set_id(mode));
        }
    }

    /// Forgets the mtime and/or ctime earlier writes set on `ino` (a
    /// setattr gave them explicitly).
    pub fn forget_pending_times(&self, ino: u64, mtime: bool, ctime: bool) {
        if self.get(ino).is_none() {
            return;
        }
        self.with(ino, |s| {
            if let Some(p) = &mut s.pending {
                if mtime {
                    p.mtime = Timespec::default();
                }
                if ctime {
                    p.ctime = Timespec::default();
                }
            }
        });
    }

    /// Notes that `ino`'s buffer just gained data (see `dirty`).
    pub fn mark_dirty(&self, ino: u64) {
        crate::sync::lock(&self.dirty).insert(ino);
    }

    /// Inodes a flush has something to do for (see
    /// [`InodeState::needs_flush`]) and the bytes they hold.
    pub fn dirty_inodes(&self) -> Vec<(u64, u64)> {
        let mut dirty = crate::sync::lock(&self.dirty);
        let mut out = Vec::with_capacity(dirty.len());
        dirty.retain(|&ino| {
            let held = self.peek(ino, |s| s.needs_flush().then_some(s.held_bytes));
            match held.flatten() {
                Some(bytes) => {
                    out.push((bytes, ino));
                    true
                }
                None => false,
            }
        });
        out
    }

    pub(crate) fn add_buffered(&self, grown: i64) {
        self.budget.add(grown);
    }

    /// Notes an open handle of `ino`.
    pub fn open(&self, ino: u64) {
        self.with(ino, |s| s.open += 1);
    }

    /// Drops a handle of `ino`; true when it was the last.
    pub fn release(&self, ino: u64) -> bool {
        self.with(ino, |s| match s.open {
            0 => false,
            n => {
                s.open = n - 1;
                n == 1
            }
        })
    }

    /// Notes that the kernel may now cache pages of `ino` (a read or
    /// write of its data went through it).
    pub fn note_cached(&self, ino: u64) {
        crate::sync::lock(&self.cached).insert(ino);
    }

    /// Whether the kernel may hold pages of `ino` (see
    /// [`InodeTable::note_cached`]).
    pub fn may_be_cached(&self, ino: u64) -> bool {
        crate::sync::lock(&self.cached).contains(&ino)
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.peek(ino, |s| s.open > 0).unwrap_or(false)
    }

    /// The kernel dropped its last reference to `ino` (FORGET): its ghost
    /// and read stream go.
    pub fn forget(&self, ino: u64) {
        crate::sync::lock(&self.cached).remove(&ino);
        if self.get(ino).is_some() {
            self.with(ino, |s| {
                s.ghost = None;
                s.stream = Stream::default();
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_when_they_hold_nothing() {
        let t = InodeTable::new();
        t.open(5);
        t.open(5);
        assert!(t.is_open(5));
        assert!(!t.release(5));
        assert!(t.release(5));
        assert!(t.get(5).is_none(), "an idle entry is dropped");
        {
            let _held = t.lock_flush(6);
            assert!(t.try_lock_flush(6).is_none());
        }
        assert!(t.get(6).is_none(), "the flush lock leaves no entry behind");
        t.with(7, |s| s.stream.end = 1);
        assert!(t.get(7).is_some());
        t.forget(7);
        assert!(t.get(7).is_none());
    }
}
