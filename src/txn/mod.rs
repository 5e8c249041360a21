//! Transactions and the engine that owns them.
//!
//! One transaction runs at a time; every writer *joins* it (takes the state
//! lock for writing and changes trees in memory). No file data is written
//! or read under the state lock: flushes and file reads do their device
//! I/O outside it (`flight`). A commit happens in two phases so that
//! readers are stalled only briefly:
//!
//! 1. Under the write lock, once no flush is mid-flight: fold delayed references into the extent tree,
//!    free-space changes into the free-space trees, block group usage and
//!    root pointers into their trees, repeating until nothing changes; then
//!    encode every dirty block, hand them to the *in-flight* set (where
//!    readers still find them) and open the next transaction.
//! 2. Without the state lock, under the commit I/O lock: write the blocks,
//!    barrier, write every superblock copy, barrier. Only then does the space
//!    freed by that transaction become reusable.
//!
//! A crash before the first superblock copy is durable leaves the previous
//! commit; after, the new one. Nothing a committed superblock reaches is ever
//! overwritten, because freed space stays pinned until the next superblock.
//!
//! If a commit or a change fails half-way with an I/O error or corruption,
//! the engine shuts down (every later call gets `Error::Aborted`); the
//! image keeps its last commit.

mod commit;
mod copies;
mod devices;
mod discard;
mod repair;
mod replace;
pub use copies::CopiesVerdict;
pub(crate) use copies::DataCopies;
mod ctx;
mod flight;
mod freeze;
mod grow;
mod log;
mod mechanism;
mod open;
mod persist;
pub mod refs;
mod relocation;
mod space;
mod trim;

pub use ctx::{Reader, Txn};
pub use discard::{DiscardMode, DiscardPass};
pub use flight::{DataDevice, Flight, Flusher};
pub use grow::{GrowTo, Grown};
pub use log::{read_chain, DroppedRoot, LogVerdict, LoggedBytes, SkippedInode};
pub use mechanism::{Mechanism, Slots};
pub use open::{
    random_fsid, read_best_superblock, read_super_copies, FormatOptions, OpenOptions,
    SpaceOverride, MIN_DEVICE_BYTES, MIXED_BELOW_BYTES,
};
pub use refs::{DelayedRefs, ExtentKind, PendingExtent, RefHolder};
pub use relocation::Relocation;
pub use space::{Need, DELETE_MARGIN_BLOCKS, EXTENT_ITEMS_BYTES};
pub use trim::Trimmed;

use crate::alloc::Allocator;
use crate::cache::{BlockCache, BlockMap, BlockSet};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::items::RootItem;
use crate::format::node::Node;
use crate::format::superblock::Superblock;
use crate::tree::RootPtr;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// A tree's root as the running transaction sees it.
#[derive(Clone, Debug)]
pub(crate) struct RootState {
    pub ptr: RootPtr,
    pub item: RootItem,
    /// The root item in the root tree must be rewritten at commit.
    pub dirty: bool,
}

/// Everything the running transaction changes, guarded by the state lock.
pub(crate) struct State {
    pub transid: u64,
    pub sb: Superblock,
    pub dirty: BlockMap<Arc<Node>>,
    /// Dirty blocks shared with a clone made in this transaction: they must
    /// be copied, not modified, like clean blocks.
    pub frozen: BlockSet,
    pub roots: BTreeMap<u64, RootState>,
    /// Trees dropped in this transaction whose root items go at commit.
    pub dropped: Vec<u64>,
    pub refs: DelayedRefs,
    /// What the mechanisms above keep in the transaction (see
    /// `mechanism`): the drop queue's counters, the quota groups.
    pub slots: Slots,
    /// Called at the transaction's fixed points (see `mechanism`).
    pub mechanisms: Mechanisms,
    pub alloc: Allocator,
    /// Data bytes promised to buffered writes (see `space`).
    pub data_reserved: u64,
    /// Buffered bytes being flushed: their data is allocated, their
    /// tree items still held (see `flight`).
    pub flushing: u64,
    /// Size of every tree that does not share blocks (see `space`).
    pub tree_blocks: space::TreeBlocks,
    /// Counts changes to the trees and the allocator, so a failed
    /// operation can tell whether it changed anything.
    pub changes: u64,
    /// The running transaction's log tree (see `log`).
    pub log: Option<log::LogTree>,
    /// A log found at open, waiting for the fs layer to replay it.
    pub pending_log: Option<log::PendingLog>,
    /// What the open found of a log and decided about it (`canopy check`
    /// reports it).
    pub log_found: Option<log::LogVerdict>,
    /// A log of this transaction reached the disk: frees stay pinned
    /// until the commit is durable.
    pub log_durable: bool,
    /// A commit is flushing the files whose bytes the log holds
    /// (`log::LoggedBytes`): fsyncs flush rather than log more bytes until
    /// it has prepared, so it cannot be kept waiting.
    pub log_bytes_closed: bool,
    /// Takes of the log's blocks by log writes so far (`Engine::sync_log`):
    /// a caller that logged before take N is durable once N is written.
    pub log_takes: u64,
    /// Where the running transaction's next log write puts its link
    /// (see `format::loglink`): set by the commit before it, whose
    /// superblock names the first. None (after an open, or a commit that
    /// found no free block) makes fsync commit instead.
    pub log_chain: Option<log::ChainCursor>,
    /// Tree roots as the last prepared commit has them: what a crash
    /// would find, before the log is replayed.
    pub committed: BTreeMap<u64, RootPtr>,
    /// Trees whose root moved, or that were made, since the last prepared
    /// commit: a superset of those differing from `committed`.
    pub moved: BTreeSet<u64>,
    /// A replay finished: the next commit must write a superblock
    /// without the log even if no tree changed.
    pub log_replayed: bool,
    /// The superblock's own fields changed (the filesystem grew): the
    /// next commit must write it even if no tree changed.
    pub superblock_changed: bool,
    /// Blocks balance copied in this transaction: it may change them in
    /// place, though ordinary changes must copy them (they are frozen).
    pub relocated: BlockSet,
    /// Where balance's next step looks for extents: those below it in
    /// its group were moved in this transaction (their extent items go at
    /// the commit). 0: the group's start.
    pub relocate_cursor: u64,
    /// Extents balance moved in this transaction: (old, new, length, is
    /// data). Their reference changes are a copy's and not traced, unless
    /// something else changed one of the two (see `qgroup::account`).
    pub relocations: Vec<Relocation>,
    /// Committed tree blocks freed in this transaction. The cache keeps
    /// them until the commit is durable: the accounting reads the last
    /// commit's trees, and their space is pinned until then.
    pub retired: Vec<u64>,
}

/// Pending extents (or free-space changes) past which the operation that
/// adds them applies them to the trees, by default.
pub(crate) const SETTLE_EARLY_AT: usize = 4096;

/// Folds the reference changes collected so far into the extent tree, and
/// the allocator's journal into the free-space trees, now, in the running
/// transaction, once there are `at` of either ([`SETTLE_EARLY_AT`] by
/// default). Left to the commit, both for a transaction of random writes
/// (an extent made and one freed per write) held every other operation up
/// for most of a second. The work is done in short turns at the state
/// lock instead (in smaller batches, so about a tenth more of it); the
/// commit settles what is left. Open flights' extents stay pending
/// (`DelayedRefs::hold`).
fn settle_if_many(tx: &mut Txn<'_>, at: usize) -> Result<()> {
    if tx.st.refs.len() >= at {
        for m in tx.st.mechanisms {
            m.settle(tx)?;
        }
    }
    if tx.st.alloc.journal_len() >= at {
        persist::apply_free_journal(tx)?;
    }
    Ok(())
}

impl State {
    /// Points tree `id` at the block `ptr`: its root item is rewritten at
    /// commit and the quota accounting looks at the tree (`moved`). Every
    /// move of a root goes through here.
    pub(crate) fn set_root(&mut self, id: u64, ptr: RootPtr) {
        if let Some(rs) = self.roots.get_mut(&id) {
            rs.ptr = ptr;
            rs.dirty = true;
            self.moved.insert(id);
        }
    }
}

/// The mechanisms above the transaction, in the order it calls them.
pub(crate) type Mechanisms = &'static [&'static dyn Mechanism];

/// What readers and the commit I/O share outside the state lock.
pub(crate) struct Shared {
    /// The device as the engine sees it: every write reaches each copy.
    pub dev: Arc<crate::volume::Volume>,
    pub cache: BlockCache,
    pub inflight: Mutex<BlockMap<Arc<Node>>>,
    pub fsid: [u8; 16],
    pub nodesize: usize,
    /// Items the checker rejected and the log has already named, so a
    /// bad leaf read again is not reported again.
    pub reported: Mutex<HashSet<(u64, crate::format::Key)>>,
    /// Flushes writing data outside the state lock (see `flight`).
    pub flights: Arc<flight::Flights>,
    /// Data reads outside the state lock, which freed space waits for
    /// (see `flight`).
    pub reads: flight::ReadEpochs,
}

/// How many rejected items [`Shared::reported`] remembers.
const REPORTED_MAX: usize = 4096;

impl Shared {
    pub fn item_limits(&self) -> crate::format::checker::Limits {
        crate::format::checker::Limits {
            device_size: self.dev.size(),
        }
    }

    /// Runs the item checker over a leaf just read from disk and logs
    /// each violation once, with the block address. The items stay in
    /// the leaf: the code that decodes one checks it again and fails with
    /// EIO for that inode alone.
    fn check_leaf(&self, node: &Node) {
        let limits = self.item_limits();
        for item in node.items() {
            let Err(why) = crate::format::checker::check_item(&item.key, item.data, &limits) else {
                continue;
            };
            let mut seen = crate::sync::lock(&self.reported);
            if seen.len() < REPORTED_MAX && seen.insert((node.bytenr, item.key)) {
                tracing::error!(block = node.bytenr, key = %item.key, "bad item: {why}");
            }
        }
    }
}

/// An open Canopy image.
pub struct Engine {
    shared: Shared,
    state: RwLock<State>,
    /// The commit I/O lock, holding the generation whose I/O finished
    /// last: commits write strictly in generation order (see commit.rs).
    commit_io: Mutex<log::IoState>,
    commit_turn: Condvar,
    failed: Failure,
    read_only: bool,
    /// Log writes that may be out at once (`OpenOptions`).
    log_writes_in_flight: usize,
    /// See [`OpenOptions::settle_early_at`].
    settle_early_at: usize,
    /// One cleaner step at a time (`extent::drop`): a step reads the
    /// blocks it will release without the state lock, which is safe only
    /// while no other step can free them.
    cleaner_turn: Mutex<()>,
    /// Tells the committer that the running transaction grew past its
    /// bound on changed tree blocks (see [`Engine::wait_commit_wanted`]).
    commit_wanted: CommitWanted,
    /// What the opener called each device (`OpenOptions::device_names`,
    /// and `add_device`'s name), by devid.
    device_names: RwLock<BTreeMap<u64, String>>,
    /// Transactions and data reads outside the state lock so far: what a
    /// mount's own work looks like from below, for background work that
    /// yields to it (scrub sleeps only while this moves).
    foreground: AtomicU64,
    /// How freed space reaches the storage, and the ranges waiting.
    discards: discard::Discards,
    /// The layer above that buffers the file bytes an fsync logged
    /// (`log::LoggedBytes`), once it has said so.
    logged_bytes: Mutex<Option<Arc<dyn log::LoggedBytes>>>,
}

impl Engine {
    /// How much foreground work (transactions, data reads) the engine has
    /// seen: a count that moves while the mount is busy.
    pub fn foreground_work(&self) -> u64 {
        self.foreground.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A bound on the running transaction's changed tree blocks and the
/// signal a writer gives once it is crossed.
struct CommitWanted {
    /// Bytes of changed tree blocks past which a commit is wanted.
    limit: AtomicU64,
    wanted: Mutex<bool>,
    cv: Condvar,
}

impl Default for CommitWanted {
    fn default() -> CommitWanted {
        CommitWanted {
            limit: AtomicU64::new(u64::MAX),
            wanted: Mutex::new(false),
            cv: Condvar::new(),
        }
    }
}

/// Why the engine shut down, once it has. Checked by every buffered
/// write, which takes no other engine lock: a flag read is all it costs
/// while the engine is alive.
#[derive(Default)]
pub(crate) struct Failure {
    happened: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Failure {
    /// Records the first reason; false if there was one already.
    fn set(&self, why: String) -> bool {
        let mut w = crate::sync::lock(&self.why);
        if w.is_some() {
            return false;
        }
        *w = Some(why);
        self.happened.store(true, Ordering::Release);
        true
    }

    fn reason(&self) -> Option<String> {
        if !self.happened.load(Ordering::Acquire) {
            return None;
        }
        crate::sync::lock(&self.why).clone()
    }
}

impl Engine {
    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.failed.reason() {
            Some(why) => Err(Error::Aborted(why)),
            None => Ok(()),
        }
    }

    /// Stops all changes from here on (they fail with `Aborted`), keeping
    /// the last commit: something above found the engine's state may be
    /// half changed (a request's handler panicked).
    pub fn shut_down(&self, why: &str) {
        self.fail(&Error::Invalid(why.to_string()));
    }

    fn fail(&self, e: &Error) {
        if self.failed.set(e.to_string()) {
            tracing::error!(error = %e, "shutting the filesystem down");
        }
    }

    /// Runs `f` inside the running transaction. Errors that leave the trees
    /// consistent (not found, exists, invalid argument, and any error met
    /// before the first change: ENOSPC from a reservation, a bad item, a
    /// failed read) are returned as they are; any other error shuts the
    /// engine down, keeping the last commit.
    pub fn write<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<R>) -> Result<R> {
        self.check_alive()?;
        self.foreground
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let mut st = crate::sync::write(&self.state);
        let changes = st.changes;
        let mut tx = Txn::new(&mut st, &self.shared);
        let r = f(&mut tx);
        if r.is_ok() {
            if let Err(e) = settle_if_many(&mut tx, self.settle_early_at) {
                // Taken changes are lost half-applied: nothing may go on.
                self.fail(&e);
                return Err(e);
            }
        }
        match &r {
            Err(Error::NotFound | Error::Exists | Error::Invalid(_) | Error::Posix(..)) => {}
            // Nothing changed yet: the trees are as they were, so a bad
            // item, a failed read or ENOSPC is this operation's error only.
            Err(_) if st.changes == changes => {}
            Err(Error::NoSpace) => self.fail(&Error::Aborted(
                "ran out of space half-way through an operation (its reservation was too small)"
                    .into(),
            )),
            Err(e) => self.fail(e),
            Ok(_) => {}
        }
        let dirty = (st.dirty.len() * self.shared.nodesize) as u64;
        drop(st);
        if dirty >= self.commit_wanted.limit.load(Ordering::Relaxed) {
            self.want_commit();
        }
        r
    }

    /// Sets the bytes of changed tree blocks past which a writer asks for
    /// a commit ([`Engine::wait_commit_wanted`]); `u64::MAX`, the default,
    /// never asks.
    pub fn set_dirty_metadata_limit(&self, bytes: u64) {
        self.commit_wanted.limit.store(bytes, Ordering::Relaxed);
    }

    fn want_commit(&self) {
        let mut wanted = crate::sync::lock(&self.commit_wanted.wanted);
        if !*wanted {
            *wanted = true;
            self.commit_wanted.cv.notify_all();
        }
    }

    /// Waits at most `timeout` for a writer to find the running
    /// transaction past its bound on changed tree blocks; true if one did
    /// (the request is taken: the caller commits). The mount's commit
    /// loop waits here, so the bound is kept within a few operations, not
    /// within its polling interval.
    pub fn wait_commit_wanted(&self, timeout: std::time::Duration) -> bool {
        let wanted = crate::sync::lock(&self.commit_wanted.wanted);
        let (mut wanted, _) = self
            .commit_wanted
            .cv
            .wait_timeout_while(wanted, timeout, |w| !*w)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::take(&mut *wanted)
    }

    /// Runs `f` against the current state (including uncommitted changes)
    /// while other readers run too.
    pub fn read<R>(&self, f: impl FnOnce(&Reader<'_>) -> Result<R>) -> Result<R> {
        self.check_alive()?;
        let st = crate::sync::read(&self.state);
        f(&Reader::new(&st, &self.shared))
    }

    /// Blocks in each tree that shares none, as the reservations count
    /// them (for tests: a fresh open counts them from scratch).
    pub fn tree_block_counts(&self) -> Vec<(u64, u64)> {
        let st = crate::sync::read(&self.state);
        st.tree_blocks.iter().map(|(&k, &v)| (k, v)).collect()
    }

    /// Reads committed tree blocks `(bytenr, generation)` into the block
    /// cache without the state lock, so work that will need them under
    /// the lock (the cleaner's) finds them in memory. Only for blocks no
    /// one can free meanwhile; a block whose generation does not match is
    /// left out.
    pub(crate) fn warm_blocks(&self, blocks: &[(u64, u64)]) {
        let sh = &self.shared;
        let ns = sh.nodesize as u64;
        let cold: Vec<(u64, u64)> = blocks
            .iter()
            .copied()
            .filter(|&(b, _)| !sh.cache.contains(b))
            .collect();
        for &(b, _) in &cold {
            sh.dev.prefetch(b, ns);
        }
        for (bytenr, generation) in cold {
            let mut buf = vec![0u8; sh.nodesize];
            if sh.dev.read_at(&mut buf, bytenr).is_err() {
                continue;
            }
            if let Ok(n) = Node::decode(&buf, bytenr, &sh.fsid) {
                if n.generation == generation {
                    sh.cache.insert(Arc::new(n));
                }
            }
        }
    }

    /// Held for one cleaner step (see `cleaner_turn`).
    pub(crate) fn cleaner_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::sync::lock(&self.cleaner_turn)
    }

    /// Reads the state the mechanisms above keep in the transaction
    /// (see `mechanism`), under the state lock.
    pub fn with_slots<R>(&self, f: impl FnOnce(&Slots) -> R) -> R {
        f(&crate::sync::read(&self.state).slots)
    }

    /// Why the engine shut down while open, if it did.
    pub fn shutdown_reason(&self) -> Option<String> {
        self.failed.reason()
    }

    /// Whether data and tree blocks share block groups.
    pub fn is_mixed(&self) -> bool {
        crate::sync::read(&self.state).alloc.is_mixed()
    }

    /// Profiles new (metadata, data) groups get.
    pub fn profiles(
        &self,
    ) -> (
        crate::format::superblock::Profile,
        crate::format::superblock::Profile,
    ) {
        let st = crate::sync::read(&self.state);
        (st.sb.metadata_profile, st.sb.data_profile)
    }

    /// The groups with more than one copy, and where those lie.
    pub fn mirrors(&self) -> Vec<crate::volume::Chunk> {
        self.shared.dev.map().all()
    }

    /// Each device's error counters since they were last reset (kept in
    /// the image by each commit), by devid: reads failed, copies found
    /// bad, copies repaired, writes failed.
    pub fn device_errors(&self) -> Vec<(u64, [u64; 4])> {
        self.shared
            .dev
            .all_errors()
            .into_iter()
            .map(|(devid, e)| (devid, e.snapshot()))
            .collect()
    }

    /// Sets every device's error counters to zero; the next commit
    /// (which this asks for) records it.
    pub fn reset_device_errors(&self) {
        let mut st = crate::sync::write(&self.state);
        for (_, e) in self.shared.dev.all_errors() {
            e.set([0; 4]);
        }
        st.superblock_changed = true;
    }

    /// What the opener called each device, by devid (devices it named).
    pub fn device_names(&self) -> BTreeMap<u64, String> {
        crate::sync::read(&self.device_names).clone()
    }

    /// The filesystem's devices as its superblock names them, and which
    /// are present.
    pub fn devices(&self) -> Vec<(crate::format::superblock::DeviceItem, bool)> {
        let st = crate::sync::read(&self.state);
        st.sb
            .devices
            .iter()
            .map(|d| (*d, self.shared.dev.device(d.devid).is_some()))
            .collect()
    }

    /// Whether the engine was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Generation of the running transaction.
    pub fn transid(&self) -> u64 {
        crate::sync::read(&self.state).transid
    }

    /// Generation of the last commit.
    pub fn committed_generation(&self) -> u64 {
        crate::sync::read(&self.state).sb.generation
    }

    pub fn nodesize(&self) -> usize {
        self.shared.nodesize
    }

    /// Bytes of tree blocks the running transaction made or changed:
    /// what its commit will encode and write, held in memory until then.
    pub fn dirty_metadata_bytes(&self) -> u64 {
        let blocks = crate::sync::read(&self.state).dirty.len();
        (blocks * self.shared.nodesize) as u64
    }

    pub fn fsid(&self) -> [u8; 16] {
        self.shared.fsid
    }

    /// The filesystem's label (empty for none).
    pub fn label(&self) -> String {
        crate::sync::read(&self.state).sb.label.clone()
    }

    /// Who the filesystem is and what its devices hold (`canopy
    /// filesystem show`).
    pub fn show(&self) -> crate::alloc::FilesystemShow {
        let st = crate::sync::read(&self.state);
        let devices = st
            .alloc
            .devices()
            .into_iter()
            .map(|(devid, size)| crate::alloc::DeviceShow {
                devid,
                size,
                allocated: st.alloc.allocated_on(devid),
                missing: self.shared.dev.device(devid).is_none(),
                path: crate::sync::read(&self.device_names).get(&devid).cloned(),
            })
            .collect();
        crate::alloc::FilesystemShow {
            label: st.sb.label.clone(),
            uuid: crate::format::uuid::shown(&self.shared.fsid),
            bytes_used: st.alloc.bytes_used(),
            devices,
        }
    }

    /// Bytes in use and bytes free (for statfs).
    pub fn space(&self) -> (u64, u64) {
        let st = crate::sync::read(&self.state);
        (st.alloc.bytes_used(), st.alloc.bytes_free())
    }

    /// How the device is carved into groups (`canopy filesystem usage`).
    pub fn usage(&self) -> crate::alloc::SpaceUsage {
        crate::sync::read(&self.state).alloc.usage()
    }

    /// Space for statfs: (total bytes, free bytes, bytes writers can
    /// still get). The last leaves out what is promised to buffered data,
    /// the commit, and the margin kept for deletions.
    pub fn space_for_statfs(&self) -> (u64, u64, u64) {
        let st = crate::sync::read(&self.state);
        let (used, free) = (st.alloc.bytes_used(), st.alloc.bytes_free());
        let avail = st.data_available(self.shared.nodesize as u64);
        (used + free, free.saturating_sub(st.data_reserved), avail)
    }

    /// Data bytes promised to buffered writes.
    pub fn data_reserved(&self) -> u64 {
        crate::sync::read(&self.state).data_reserved
    }

    /// Free-space histogram: (bucket low in sectors, extents, bytes).
    pub fn free_histogram(&self) -> Vec<(u64, u64, u64)> {
        crate::sync::read(&self.state).alloc.free_histogram()
    }

    /// Number of blocks in the clean block cache.
    pub fn cached_blocks(&self) -> usize {
        self.shared.cache.len()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.read_only || self.check_alive().is_err() {
            return;
        }
        if let Err(e) = self.commit() {
            tracing::error!(error = %e, "final commit failed");
            return;
        }
        self.discard_at_close();
    }
}
