//! The log tree's storage: where fsync puts the changes of a few inodes so
//! they are durable without a commit (seed mail 003, btrfs's tree-log).
//!
//! The log is a B+tree like any other, edited through [`Txn`] as tree
//! [`tree_id::LOG`], with three differences:
//!
//! - **No references.** Its blocks get no extent items and its leaves hold
//!   no data references; every block allocated for the log of a
//!   transaction is listed, and the commit that ends the transaction frees
//!   them all at once (pinned: the durable superblock still leads to the
//!   log until the commit's own superblock replaces it). They are taken and
//!   given back without a word to the free-space tree
//!   (`Allocator::alloc_transient`), which shows them free at every
//!   commit, and a block another replaced leaves the cache at once.
//! - **Written by fsync, not by the commit.** [`Engine::sync_log`] writes
//!   the log's dirty blocks and a chain link naming the log's root
//!   (`format::loglink`), then one barrier, and no superblock: the last
//!   commit's superblock names where the chain begins, and each link
//!   where the next goes. Replay walks the chain, checks the last link's
//!   root whole and otherwise takes an older one, up to the third from
//!   the last (two writes may be out at once: `-o log_writes=2`;
//!   [`load_pending`]). A
//!   written block is clean from then on, so a later edit copies it
//!   rather than overwrite what a durable link reaches.
//! - **Frees pinned while it is durable.** A commit that follows a durable
//!   log keeps everything it frees pinned, so no data extent the log names
//!   is reused before the log is gone from the disk.
//! - **Only space the last commit knows.** Replay places the log on the
//!   last commit's allocator, so a log must not name space in a block
//!   group created since: while the running transaction has made one,
//!   [`Engine::sync_log`] commits instead (once per new group).
//!
//! Replay trusts nothing it has not examined ([`load_pending`]): a root
//! whose blocks, items, placement or logged data do not check out is
//! dropped with an ERROR line for the one before it, or for the last
//! commit, rather than refusing to mount.
//!
//! Each log belongs to one transaction: the superblock of the commit
//! before it starts its chain, and the commit of that transaction drops
//! it. A log found at open stays *pending* until the fs layer replays it
//! (`fs::log::replay`); until then its blocks, its links and the new data
//! extents it names are kept out of the allocator, and commits carry it
//! on, naming its root in the superblock directly. What
//! the open examines, and what it keeps, is in `examine.rs`.

use super::{Engine, State, Txn};
use crate::error::{Error, Result};
use crate::format::loglink::LogLink;
use crate::format::node::Node;
use crate::format::superblock::{Superblock, INCOMPAT_LOG_DATA, INCOMPAT_LOG_TREE};
use crate::format::tree_id;
use crate::tree::RootPtr;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

mod examine;
mod gather;
pub use examine::read_chain;
pub(crate) use examine::{ignore_pending, load_pending};

/// The log of the running transaction.
pub(crate) struct LogTree {
    pub ptr: RootPtr,
    /// Every block allocated for it in this transaction.
    pub blocks: HashSet<u64>,
    /// Blocks allocated since the last log write: the next one writes
    /// those still dirty. (`blocks` keeps every copy an fsync made, so
    /// looking through it cost each fsync the transaction's fsyncs so far.)
    pub unwritten: Vec<u64>,
    /// In the header flags of each of its blocks (see
    /// [`Superblock::log_nonce`]).
    pub nonce: u64,
    /// It names data without checksums (`Txn::note_log_unchecked_data`).
    pub unchecked_data: bool,
    /// Inodes (node ids) whose buffered bytes it holds (`LOG_DATA`), which
    /// the commit that drops it must find in the trees ([`LoggedBytes`]).
    pub byte_nodes: HashSet<u64>,
}

/// The layer that buffers file data (`fs`), as a commit needs it when an
/// fsync logged a file's buffered bytes (`LOG_DATA` items) instead of
/// writing them to extents: the log is then the only durable copy, and
/// the commit drops the log, so the bytes must be in the trees it
/// writes. The commit flushes those files first, and checks under the
/// state lock that nothing the log holds is still only buffered.
pub trait LoggedBytes: Send + Sync {
    /// Flushes to extents the buffered data of those of `nodes` (node
    /// ids) that hold bytes the log of transaction `transid` holds.
    fn flush(&self, nodes: &[u64], transid: u64) -> Result<()>;
    /// Whether bytes of `node` the log of transaction `transid` holds are
    /// still only in the buffer. Called with the state lock held.
    fn unflushed(&self, node: u64, transid: u64) -> bool;
}

/// Where the running transaction's next log link goes
/// (`format::loglink`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChainCursor {
    /// Allocated (transient) for the link; freed with the log's blocks.
    pub at: u64,
    pub nonce: u64,
    /// Its place in the chain.
    pub seq: u64,
}

/// A log found at open and not replayed yet.
pub(crate) struct PendingLog {
    pub ptr: RootPtr,
    /// Its blocks, kept out of the allocator until the replay commits.
    pub blocks: Vec<u64>,
    /// Data extents it names that no extent item records (written after
    /// the last commit), kept out of the allocator until the replay
    /// claims them.
    pub extents: Vec<(u64, u64)>,
    /// Inodes it holds (`LOG_INODE` items).
    pub inodes: u64,
    /// Objects (inodes, as node ids) with an item the checker refuses,
    /// each with why: replay leaves them as the last commit has them.
    pub skipped: BTreeMap<u64, String>,
}

/// What the open found of a log: the roots it passed over and why, and
/// what the chosen one would replay.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LogVerdict {
    /// The root the superblock leads to as written last.
    pub last_root: u64,
    /// `last`, `previous` or `older`; None when no root can be replayed.
    pub chosen: Option<String>,
    pub dropped: Vec<DroppedRoot>,
    /// What the chosen root would replay.
    pub inodes: u64,
    pub new_extents: u64,
    pub blocks: u64,
    /// Inodes of the chosen root replay leaves out, each with why.
    pub skipped: Vec<SkippedInode>,
}

/// An inode of a replayed log whose items the checker refuses: it keeps
/// the state of the last commit, and the rest of the log replays.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SkippedInode {
    /// As the log names it (a node id: subvolume and inode).
    pub node: u64,
    pub reason: String,
}

/// A log root the open would not replay.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DroppedRoot {
    /// `last`, `previous` or `older`.
    pub which: String,
    pub root: u64,
    pub reason: String,
    /// A write that did not reach the disk whole (an fsync that never
    /// returned, at a power loss): expected, not damage.
    pub torn: bool,
}

/// What the commit I/O lock guards: how far the commits have written.
pub(crate) struct IoState {
    /// Generation whose I/O finished last.
    pub generation: u64,
    /// The last log root sent: (transaction, root).
    pub log: Option<(u64, RootPtr)>,
    /// The highest take of log blocks durable (`State::log_takes`).
    pub log_takes_written: u64,
    /// The highest take of log blocks sent (its barrier may be out).
    pub log_takes_sent: u64,
    /// Log writes sent whose barrier has not returned.
    pub log_writes_in_flight: usize,
    /// Who waits for a log write, and whom the next one waits for.
    pub gather: gather::Gather,
}

/// What a log write takes of the running transaction (`Engine::sync_log`).
struct TakenLog {
    /// Its number among the takes (`State::log_takes`).
    take: u64,
    ptr: RootPtr,
    blocks: Vec<(u64, Vec<u8>)>,
    nodes: Vec<Arc<Node>>,
    /// The log names data without checksums.
    unchecked_data: bool,
    /// Nothing new since the last log write: no write at all.
    nothing_new: bool,
}

impl State {
    /// Notes the tree roots as the commit being prepared (or the one just
    /// opened) has them; see [`State::committed`].
    pub(crate) fn remember_committed_roots(&mut self) {
        self.committed = self.roots.iter().map(|(&id, r)| (id, r.ptr)).collect();
        self.moved.clear();
    }

    /// Names in `sb`, the superblock of the commit being prepared, where
    /// the next transaction's log chain begins, and keeps that block for
    /// it; or no chain when no existing group has a free block (that
    /// transaction's fsyncs then commit). A log found at open and not
    /// replayed is named as it is until its replay commits.
    pub(crate) fn start_log_chain(&mut self, sh: &super::Shared, sb: &mut Superblock) {
        if self.pending_log.is_some() || sb.log_root != 0 {
            return;
        }
        let ns = sh.nodesize as u64;
        let kind = crate::alloc::Allocator::kind_for_tree(tree_id::LOG);
        let Some(at) = self.alloc.alloc_transient_in_existing(kind, ns, sb.root) else {
            sb.clear_log();
            return;
        };
        let nonce = new_nonce(self.transid);
        sb.name_log_chain(at, nonce);
        self.log_chain = Some(ChainCursor { at, nonce, seq: 0 });
    }

    /// Gives back the block kept for the next log link when no link was
    /// written yet: it is free in the last commit, and only a link ever
    /// written there makes it matter, so it is reusable at once. The
    /// transaction's fsyncs then commit.
    pub(crate) fn release_log_chain(&mut self, ns: u64) {
        let Some(c) = self.log_chain.take_if(|c| c.seq == 0) else {
            return;
        };
        if let Err(e) = self.alloc.free_transient_unused(c.at, ns) {
            tracing::warn!(at = c.at, "giving back the log link's block: {e}");
        }
    }

    /// Whether `bytenr` is a block of the running transaction's log.
    pub(crate) fn is_log_block(&self, bytenr: u64) -> bool {
        self.log
            .as_ref()
            .is_some_and(|l| l.blocks.contains(&bytenr))
    }

    /// Drops the running transaction's log at its commit: unwritten blocks
    /// are forgotten, and every block's space is freed pinned. Frees stay
    /// pinned for the rest of the commit (`log_durable`).
    pub(crate) fn drop_log(&mut self, sh: &super::Shared) -> Result<()> {
        let ns = sh.nodesize as u64;
        // The next link's block: written links are among the log's blocks.
        if let Some(c) = self.log_chain.take() {
            self.alloc.free_transient(c.at, ns)?;
        }
        let Some(log) = self.log.take() else {
            return Ok(());
        };
        for b in log.blocks {
            self.dirty.remove(&b);
            sh.cache.remove(b);
            self.alloc.free_transient(b, ns)?;
        }
        Ok(())
    }
}

impl Txn<'_> {
    /// Starts the running transaction's log if it has none.
    pub fn ensure_log(&mut self) -> Result<()> {
        if self.st.pending_log.is_some() {
            return Err(Error::Invalid(
                "the log found at open has not been replayed".into(),
            ));
        }
        if self.st.log.is_some() {
            return Ok(());
        }
        self.st.log = Some(LogTree {
            ptr: RootPtr {
                bytenr: 0,
                generation: 0,
                level: 0,
            },
            blocks: HashSet::new(),
            unwritten: Vec::new(),
            // Replay knows this log's blocks by the chain's nonce.
            nonce: self
                .st
                .log_chain
                .map_or_else(|| new_nonce(self.st.transid), |c| c.nonce),
            unchecked_data: false,
            byte_nodes: HashSet::new(),
        });
        let hint = self.st.sb.root;
        let ptr = crate::tree::create(self, tree_id::LOG, hint);
        match ptr {
            Ok(ptr) => {
                if let Some(l) = self.st.log.as_mut() {
                    l.ptr = ptr;
                }
                Ok(())
            }
            Err(e) => {
                self.st.log = None;
                Err(e)
            }
        }
    }

    /// The root of tree `id` as the last prepared commit has it (blocks
    /// it reaches stay readable: freed ones are pinned until the next
    /// commit is durable).
    pub fn committed_root(&self, id: u64) -> Option<RootPtr> {
        self.st.committed.get(&id).copied()
    }

    /// Whether the data extent at `bytenr` was allocated in the running
    /// transaction (so no commit holds its checksums yet).
    pub fn is_new_extent(&self, bytenr: u64) -> bool {
        self.st.refs.is_new(bytenr)
    }

    /// The log now names data that has no checksums (a `chattr +C`
    /// file's): each log write from here on first makes the data written
    /// so far durable ([`Engine::barrier_for_unchecked_data`]), since
    /// replay cannot tell such data from what the disk held before.
    pub fn note_log_unchecked_data(&mut self) {
        if let Some(l) = self.st.log.as_mut() {
            l.unchecked_data = true;
        }
    }

    /// Notes whether the log now holds buffered bytes of `node`
    /// (`LOG_DATA` items), for the commit that drops it
    /// ([`LoggedBytes`]).
    pub fn note_log_bytes(&mut self, node: u64, holds: bool) {
        if let Some(l) = self.st.log.as_mut() {
            match holds {
                true => l.byte_nodes.insert(node),
                false => l.byte_nodes.remove(&node),
            };
        }
    }

    /// Whether an fsync may log buffered bytes now: not while a commit
    /// flushes the files whose bytes the log holds.
    pub fn may_log_bytes(&self) -> bool {
        !self.st.log_bytes_closed
    }

    /// Whether the running transaction has a log.
    pub fn has_log(&self) -> bool {
        self.st.log.is_some()
    }

    /// Whether a log found at open waits for replay.
    pub fn has_pending_log(&self) -> bool {
        self.st.pending_log.is_some()
    }

    /// Inodes of the pending log whose items the examination at open
    /// refused: replay leaves them out.
    pub fn refused_log_inodes(&self) -> std::collections::BTreeSet<u64> {
        self.st
            .pending_log
            .as_ref()
            .map(|p| p.skipped.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Records that replay leaves out `node` of the pending log, for a
    /// reason only replay can see (an item it cannot use, a name it may
    /// not give): [`Engine::log_found`] then names it beside the inodes
    /// the examination at open refused, so `canopy check`, which runs the
    /// same replay in memory, reports exactly what replay leaves out.
    pub fn note_replay_refusal(&mut self, node: u64, reason: String) {
        let Some(v) = self.st.log_found.as_mut() else {
            return;
        };
        if v.skipped.iter().all(|s| s.node != node) {
            v.skipped.push(SkippedInode { node, reason });
        }
    }

    /// The data extents `(bytenr, len)` the pending log names that the
    /// last commit lacks (written after it) and that no replayed item has
    /// claimed yet.
    pub fn new_log_extents(&self) -> HashSet<(u64, u64)> {
        self.st
            .pending_log
            .as_ref()
            .map(|p| p.extents.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Claims a data extent the pending log names and no extent item
    /// records: it becomes an extent of the running transaction, which
    /// the items the replay inserts then reference. Extents the extent
    /// tree already has are left alone. Returns whether this call
    /// claimed it (the replay then gives it the log's checksums).
    pub fn claim_logged_extent(&mut self, bytenr: u64, len: u64) -> Result<bool> {
        let Some(p) = self.st.pending_log.as_mut() else {
            return Ok(false);
        };
        let Some(at) = p.extents.iter().position(|&e| e == (bytenr, len)) else {
            return Ok(false);
        };
        p.extents.swap_remove(at);
        self.st.alloc.include(bytenr, len);
        self.st.alloc.alloc_exact(bytenr, len)?;
        self.st.changes += 1;
        self.st
            .refs
            .new_extent(bytenr, len, super::refs::ExtentKind::Data);
        Ok(true)
    }

    /// Ends the replay: the pending log's blocks, and the extents it named
    /// that nothing claimed, go back to the allocator once the next commit
    /// (which no longer names the log) is durable.
    pub fn finish_replay(&mut self) {
        let Some(p) = self.st.pending_log.take() else {
            return;
        };
        let ns = self.sh.nodesize as u64;
        for b in p.blocks {
            self.st.alloc.release_excluded(b, ns);
        }
        for (b, l) in p.extents {
            self.st.alloc.release_excluded(b, l);
        }
        self.st.sb.clear_log();
        self.st.changes += 1;
        // The commit must happen even if the replay changed no tree.
        self.st.log_replayed = true;
    }
}

impl Engine {
    /// Tells the engine who buffers the file bytes an fsync logs (see
    /// [`LoggedBytes`]); the fs layer does at open.
    pub fn set_logged_bytes(&self, hook: Arc<dyn LoggedBytes>) {
        *crate::sync::lock(&self.logged_bytes) = Some(hook);
    }

    /// Before a commit prepares: flushes the files whose buffered bytes
    /// the running transaction's log holds, and stops fsyncs from logging
    /// more until the commit has prepared (they flush instead).
    pub(super) fn flush_logged_bytes(&self) -> Result<()> {
        let holds_bytes = |st: &State| st.log.as_ref().is_some_and(|l| !l.byte_nodes.is_empty());
        // Most commits find none: the state lock read, not written.
        if !holds_bytes(&crate::sync::read(&self.state)) {
            return Ok(());
        }
        let (nodes, transid) = {
            let mut st = crate::sync::write(&self.state);
            let nodes: Vec<u64> = st
                .log
                .as_ref()
                .map(|l| l.byte_nodes.iter().copied().collect())
                .unwrap_or_default();
            if nodes.is_empty() {
                return Ok(());
            }
            st.log_bytes_closed = true;
            (nodes, st.transid)
        };
        let hook = crate::sync::lock(&self.logged_bytes).clone();
        match hook {
            Some(h) => h.flush(&nodes, transid),
            None => Err(Error::Invalid(
                "the fsync log holds file bytes and nothing can flush them".into(),
            )),
        }
    }

    /// Told by the fs layer as it closes, once nothing is buffered: the
    /// log's bytes are all in the trees, and no flush is needed (or
    /// possible) before the final commit.
    pub fn forget_logged_bytes(&self) {
        if let Some(log) = crate::sync::write(&self.state).log.as_mut() {
            log.byte_nodes.clear();
        }
    }

    /// Whether every byte the running transaction's log holds is in the
    /// trees (so the commit may drop the log). Under the state lock.
    pub(super) fn logged_bytes_landed(&self, st: &State) -> bool {
        let Some(log) = st.log.as_ref() else {
            return true;
        };
        if log.byte_nodes.is_empty() {
            return true;
        }
        let Some(hook) = crate::sync::lock(&self.logged_bytes).clone() else {
            return false;
        };
        log.byte_nodes
            .iter()
            .all(|&n| !hook.unflushed(n, st.transid))
    }

    /// Makes the running transaction's log durable: its dirty blocks and
    /// a chain link naming its root, then one barrier (see
    /// [`Engine::send_log`]).
    ///
    /// Log writes are sent one at a time, under the commit I/O lock, and
    /// the writer takes the blocks only once it holds that lock: every
    /// block logged until then, its own and those of the callers that
    /// queued behind it. Those find their blocks sent when their turn
    /// comes and wait for that write's barrier (a group commit). The
    /// barrier is taken outside the lock, so the next write is sent while
    /// it is out, up to the open's `log_writes_in_flight` (1 by default:
    /// no overlap; at most `LOG_WRITES_IN_FLIGHT_MAX`): replay tries the
    /// newest roots of the chain back to one whose barrier returned
    /// ([`load_pending`]). Whether a caller's blocks are durable is
    /// counted in takes: every take after it logged holds its blocks, and
    /// a barrier covers every write sent before it, so the caller is done
    /// once any later take's barrier has returned.
    ///
    /// A caller about to send the next write may first wait for the
    /// callers the last one served to come back (`gather`): `caller` names
    /// the thread that asked, 0 for none.
    pub fn sync_log(&self, caller: u64) -> Result<()> {
        self.check_alive()?;
        let (transid, needed) = {
            let st = crate::sync::read(&self.state);
            match st.log.as_ref() {
                // No log: the transaction was committed meanwhile (or is
                // being); durable once that commit's I/O is done.
                None => {
                    let last = st.sb.generation;
                    drop(st);
                    return self.wait_written(last).map(drop);
                }
                Some(_) => (st.transid, st.log_takes + 1),
            }
        };
        let mut io = self.wait_turn(transid - 1)?;
        let (ticket, was_due) = io.gather.arrive(caller, needed, Instant::now());
        if was_due {
            // A caller holding the next write for this one looks again.
            self.commit_turn.notify_all();
        }
        let result = self.sync_log_in_turn(io, transid, needed);
        crate::sync::lock(&self.commit_io).gather.leave(ticket);
        result
    }

    /// [`Engine::sync_log`] once the commits before transaction `transid`
    /// are written: waits for a write holding take `needed`, or sends it.
    fn sync_log_in_turn(
        &self,
        mut io: std::sync::MutexGuard<'_, IoState>,
        transid: u64,
        needed: u64,
    ) -> Result<()> {
        loop {
            if io.log_takes_written >= needed {
                // A take made after this caller logged is durable (and,
                // if it served a later transaction, the commit of this one).
                drop(io);
                return self.check_alive();
            }
            let sent = io.log_takes_sent >= needed;
            if !sent && io.log_writes_in_flight < self.log_writes_in_flight {
                let Some(until) = io.gather.hold_until(Instant::now(), io.log_takes_sent) else {
                    break;
                };
                // Callers the last write served are due back: wait for
                // them (or for the hold to end) and look again.
                self.check_alive()?;
                let wait = until.saturating_duration_since(Instant::now());
                io = self
                    .commit_turn
                    .wait_timeout(io, wait)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
                continue;
            }
            // Wait for that write's barrier, or for room for another.
            self.check_alive()?;
            io = self
                .commit_turn
                .wait(io)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let Some(taken) = self.take_log_blocks(&io, transid)? else {
            // Committed meanwhile, or a new group needs a commit: not
            // under the I/O lock, which the commit takes.
            drop(io);
            return self.sync_without_log(transid);
        };
        // Every item the blocks hold was logged after its data was
        // written (a flush inserts items only then), so the barrier after
        // them makes all the data they name durable with the link.
        let started = Instant::now();
        let sent = match taken.unchecked_data && !taken.nothing_new {
            true => self.barrier_for_unchecked_data(),
            false => Ok(()),
        }
        .and_then(|()| self.send_log(&mut io, transid, &taken));
        io.log_takes_sent = io.log_takes_sent.max(taken.take);
        let needs_barrier = matches!(sent, Ok(true));
        if needs_barrier {
            io.log_writes_in_flight += 1;
            self.discards.note_log_write();
        }
        drop(io);
        let result = match sent {
            Ok(true) => crate::dev::Device::barrier(&*self.shared.dev),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        {
            let mut inflight = crate::sync::lock(&self.shared.inflight);
            for n in taken.nodes {
                inflight.remove(&n.bytenr);
                self.shared.cache.insert(n);
            }
        }
        let mut io = crate::sync::lock(&self.commit_io);
        if needs_barrier {
            io.log_writes_in_flight -= 1;
        }
        match &result {
            Ok(()) => {
                io.log_takes_written = io.log_takes_written.max(taken.take);
                let took = needs_barrier.then(|| started.elapsed());
                io.gather.written(taken.take, took, Instant::now());
            }
            Err(e) => self.fail(e),
        }
        // Whoever waits for this barrier, for room for another write, or
        // for the I/O lock's progress (a failure included) looks again.
        self.commit_turn.notify_all();
        drop(io);
        result
    }

    /// The log's blocks not yet written, taken out of the dirty set and
    /// encoded, with the link that names the log's root after them (see
    /// `format::loglink`); None when transaction `transid` has no log any
    /// more (its commit was prepared), no chain to add to, a block group
    /// new in it, or no free block for the next link.
    fn take_log_blocks(&self, io: &IoState, transid: u64) -> Result<Option<TakenLog>> {
        let mut guard = crate::sync::write(&self.state);
        self.check_alive()?;
        // Disjoint borrows of the state's fields from here on.
        let st = &mut *guard;
        if st.transid != transid || st.alloc.added_groups_since_commit() {
            return Ok(None);
        }
        let (Some(log), Some(cursor)) = (st.log.as_mut(), st.log_chain) else {
            return Ok(None);
        };
        let (ptr, unchecked_data) = (log.ptr, log.unchecked_data);
        let written = io.log == Some((transid, ptr));
        if written && log.unwritten.is_empty() {
            st.log_takes += 1;
            return Ok(Some(TakenLog {
                take: st.log_takes,
                ptr,
                blocks: Vec::new(),
                nodes: Vec::new(),
                unchecked_data,
                nothing_new: true,
            }));
        }
        let ns = self.shared.nodesize as u64;
        let kind = crate::alloc::Allocator::kind_for_tree(tree_id::LOG);
        let Some(next) = st.alloc.alloc_transient_in_existing(kind, ns, cursor.at) else {
            return Ok(None);
        };
        let link = LogLink {
            bytenr: cursor.at,
            generation: transid,
            nonce: cursor.nonce,
            seq: cursor.seq,
            root: ptr.bytenr,
            root_generation: ptr.generation,
            root_level: ptr.level,
            next,
        };
        st.log_chain = Some(ChainCursor {
            at: next,
            seq: cursor.seq + 1,
            ..cursor
        });
        // Freed with the log's blocks at the commit.
        log.blocks.insert(cursor.at);
        let mine = std::mem::take(&mut log.unwritten);
        let reached = reached_dirty(&st.dirty, ptr.bytenr);
        let mut nodes = Vec::with_capacity(mine.len());
        for b in mine {
            // A block the tree no longer reaches (a leaf that deletions
            // emptied, as a flush does to the file bytes the log held) is
            // dropped unwritten: the log keeps no references that would
            // free it, and its space goes back with the log's at the
            // commit.
            if let Some(n) = st.dirty.remove(&b) {
                if reached.contains(&b) {
                    nodes.push(n);
                }
            }
        }
        st.log_durable = true;
        st.log_takes += 1;
        let take = st.log_takes;
        let mut blocks = encode(&self.shared, &nodes);
        attach_link(&mut blocks, &link, &self.shared.fsid, ns as usize);
        crate::sync::lock(&self.shared.inflight)
            .extend(nodes.iter().map(|n| (n.bytenr, n.clone())));
        Ok(Some(TakenLog {
            take,
            ptr,
            blocks,
            nodes,
            unchecked_data,
            nothing_new: false,
        }))
    }

    /// Makes transaction `transid`'s changes durable without writing its
    /// log: by its commit, already prepared or made here. A block group
    /// new in the transaction needs that commit: no durable superblock
    /// knows the group, and the log may name space in it (its own
    /// blocks, or data), which replay could not place.
    fn sync_without_log(&self, transid: u64) -> Result<()> {
        let committed = crate::sync::read(&self.state).transid != transid;
        if committed {
            return self.wait_written(transid).map(drop);
        }
        tracing::debug!("fsync commits: a block group is new in this transaction");
        self.commit().map(drop)
    }

    /// Sends the log's new blocks and the link naming its root; the
    /// caller then takes one barrier for all, not one after each. The
    /// link may reach the disk before some block (or file data) it
    /// depends on, or before the blocks of a write still out before it,
    /// so replay checks each root whole before using it and otherwise
    /// takes an older one, back to one whose barrier returned before this
    /// write was sent ([`load_pending`]). Returns whether anything needs
    /// the barrier: not when the transaction's commit is written (it
    /// holds everything), nor for a take with nothing new while no write
    /// is out (every root sent is durable) and the log names no data
    /// without checksums. A take with nothing new beside a write still
    /// out sends nothing but needs a barrier: that write may be the one
    /// that sent its root. So does one whose log names data without
    /// checksums: an fdatasync of a `chattr +C` file overwritten in place
    /// logs nothing new (its extents, and its inode item but the times,
    /// are as logged), but the bytes its flush wrote in place are durable
    /// only after a barrier.
    fn send_log(&self, io: &mut IoState, transid: u64, taken: &TakenLog) -> Result<bool> {
        let all_durable = taken.nothing_new && io.log_writes_in_flight == 0;
        if io.generation >= transid || (all_durable && !taken.unchecked_data) {
            return Ok(false);
        }
        match crate::dev::Device::replicates(&*self.shared.dev) {
            true => self.write_first_copies(&taken.blocks)?,
            false => self.write_blocks(&taken.blocks)?,
        }
        io.log = Some((transid, taken.ptr));
        Ok(true)
    }

    /// Writes only the first copy of each run of log blocks, on storage
    /// that keeps copies of its own (a replicated Ceph pool): a `dup`
    /// group's second copy there would be one more write per fsync for
    /// nothing the pool does not give already. The second copy keeps
    /// what an older transaction left there, which fails the nonce and
    /// generation checks, so no read takes it for the log's block; a log
    /// block is read from its first copy first (`copies.rs`), and the log
    /// is gone at the next commit.
    fn write_first_copies(&self, runs: &[(u64, Vec<u8>)]) -> Result<()> {
        for (offset, bytes) in runs {
            self.shared.dev.write_copy(bytes, *offset, 0)?;
        }
        Ok(())
    }

    /// Waits until every commit prepared so far is written.
    pub fn wait_prepared(&self) -> Result<()> {
        let last = crate::sync::read(&self.state).sb.generation;
        self.wait_written(last).map(drop)
    }

    /// Whether a log found at open waits for replay.
    pub fn has_pending_log(&self) -> bool {
        crate::sync::read(&self.state).pending_log.is_some()
    }

    /// What the open found of a log, if the superblock named one.
    pub fn log_found(&self) -> Option<LogVerdict> {
        crate::sync::read(&self.state).log_found.clone()
    }

    /// Runs the replay of a pending log, which must happen even on a
    /// read-only engine (its result then stays in memory).
    pub(crate) fn replay_write<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<R>) -> Result<R> {
        self.check_alive()?;
        let mut st = crate::sync::write(&self.state);
        let mut tx = Txn::new(&mut st, &self.shared);
        let r = f(&mut tx);
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }
}

/// The dirty blocks of the tree rooted at `root` that it reaches: under
/// copy-on-write a changed block's parent is dirty too, so a walk down
/// through dirty blocks finds every one.
fn reached_dirty(dirty: &super::BlockMap<Arc<Node>>, root: u64) -> HashSet<u64> {
    let mut reached = HashSet::new();
    let mut todo = vec![root];
    while let Some(b) = todo.pop() {
        let Some(n) = dirty.get(&b) else { continue };
        if !reached.insert(b) {
            continue;
        }
        if let crate::format::node::Body::Internal(ptrs) = &n.body {
            todo.extend(ptrs.iter().map(|p| p.bytenr));
        }
    }
    reached
}

fn encode(sh: &super::Shared, nodes: &[Arc<Node>]) -> Vec<(u64, Vec<u8>)> {
    super::commit::encode_runs(nodes.iter().map(|n| &**n).collect(), sh)
}

/// Adds `link` to the runs of encoded log blocks, joined to a run it
/// touches: the next link's block is taken right after a write's blocks,
/// and the next write's blocks come right after it, so the link and the
/// blocks usually go out as one write (on RBD, one operation).
fn attach_link(runs: &mut Vec<(u64, Vec<u8>)>, link: &LogLink, fsid: &[u8; 16], ns: usize) {
    let mut bytes = link.encode(fsid);
    bytes.resize(ns, 0);
    let at = link.bytenr;
    if let Some((_, run)) = runs
        .iter_mut()
        .find(|(start, run)| start + run.len() as u64 == at)
    {
        run.extend_from_slice(&bytes);
    } else if let Some((start, run)) = runs.iter_mut().find(|(start, _)| *start == at + ns as u64) {
        bytes.append(run);
        *run = bytes;
        *start = at;
    } else {
        runs.push((at, bytes));
    }
}

/// Makes `sb` name the log at `ptr` (replay's feature bit included).
fn name_log(sb: &mut Superblock, ptr: &RootPtr) {
    sb.log_root = ptr.bytenr;
    sb.log_root_generation = ptr.generation;
    sb.log_root_level = ptr.level;
    // A log found at open may hold file data (`LOG_DATA` items).
    sb.incompat |= INCOMPAT_LOG_TREE | INCOMPAT_LOG_DATA;
}

/// A log root different from every other: a crash may leave blocks of a
/// log of the same generation that never became durable, and the nonce
/// tells them apart.
fn new_nonce(transid: u64) -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new()
        .hash_one((transid, now, std::process::id()))
        .max(1)
}
