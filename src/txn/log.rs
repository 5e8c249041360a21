//! The log tree's storage: where fsync puts the changes of a few inodes so
//! they are durable without a commit (seed mail 003, btrfs's tree-log).
//!
//! The log is a B+tree like any other, edited through [`Txn`] as tree
//! [`tree_id::LOG`], with three differences:
//!
//! - **No references.** Its blocks get no extent items and its leaves hold
//!   no data references; every block allocated for the log of a
//!   transaction is listed, and the commit that ends the transaction frees
//!   them all at once (pinned: the durable superblock still names the log
//!   until the commit's own superblock replaces it). They are taken and
//!   given back without a word to the free-space tree
//!   (`Allocator::alloc_transient`), which shows them free at every
//!   commit, and a block another replaced leaves the cache at once.
//! - **Written by fsync, not by the commit.** [`Engine::sync_log`] writes
//!   the log's dirty blocks and every superblock copy of the *last written
//!   commit* with the log's root added, then one barrier; replay checks
//!   that root whole and otherwise takes the previous one
//!   ([`load_pending`]). A written block is clean from then on, so a later
//!   edit copies it rather than overwrite what a durable superblock
//!   reaches.
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
//! Each log belongs to one transaction: its superblock carries the root of
//! the commit before it, and the commit of that transaction drops it. A
//! log found at open stays *pending* until the fs layer replays it
//! (`fs::log::replay`); until then its blocks and the new data extents it
//! names are kept out of the allocator, and commits carry it on.

use super::{Engine, State, Txn};
use crate::error::{Error, Result};
use crate::format::key_type::{EXTENT_CSUM, EXTENT_DATA, EXTENT_ITEM, LOG_INODE};
use crate::format::node::{Body, Node};
use crate::format::superblock::{Superblock, INCOMPAT_LOG_CHECKED, INCOMPAT_LOG_TREE};
use crate::format::{tree_id, Key, CSUM_OBJECTID};
use crate::tree::RootPtr;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

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
    /// The root the superblock names as written last.
    pub last_root: u64,
    /// `last` or `previous`; None when no root can be replayed.
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
    /// `last` or `previous`.
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
    /// Its superblock, which a log write repeats with the log's root.
    pub sb: Superblock,
    /// The last log root written: (transaction, root).
    pub log: Option<(u64, RootPtr)>,
    /// Log writes done, in ticket order (see [`State::log_tickets`]).
    pub log_tickets_done: u64,
}

impl State {
    /// Notes the tree roots as the commit being prepared (or the one just
    /// opened) has them; see [`State::committed`].
    pub(crate) fn remember_committed_roots(&mut self) {
        self.committed = self.roots.iter().map(|(&id, r)| (id, r.ptr)).collect();
        self.moved.clear();
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
        let Some(log) = self.log.take() else {
            return Ok(());
        };
        let ns = sh.nodesize as u64;
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
            nonce: new_nonce(self.st.transid),
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
            .new_extent(bytenr, len, crate::extent::ExtentKind::Data);
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
    /// Makes the running transaction's log durable: its dirty blocks and
    /// the superblock of the last written commit naming the log, then one
    /// barrier (see [`Engine::write_log`]). Concurrent callers share the
    /// I/O: one whose blocks another caller already wrote only waits for it.
    pub fn sync_log(&self) -> Result<()> {
        self.check_alive()?;
        let (ticket, transid, ptr, nonce, blocks, nodes) = {
            let mut st = crate::sync::write(&self.state);
            let new_group = st.alloc.added_groups_since_commit();
            let Some(log) = st.log.as_mut() else {
                // No log: the transaction was committed meanwhile (or is
                // being); durable once that commit's I/O is done.
                let last = st.sb.generation;
                drop(st);
                return self.wait_written(last).map(drop);
            };
            if new_group {
                // No durable superblock knows the new group, and the log
                // may name space in it (its own blocks, or data): replay
                // could not place that space. A commit records the group;
                // it is needed once per new group.
                drop(st);
                tracing::debug!("fsync commits: a block group is new in this transaction");
                return self.commit().map(drop);
            }
            let ptr = log.ptr;
            let nonce = log.nonce;
            let mine = std::mem::take(&mut log.unwritten);
            let ticket = st.log_tickets;
            st.log_tickets += 1;
            let mut nodes = Vec::with_capacity(mine.len());
            for b in mine {
                // Blocks freed since (a merge) are no longer dirty.
                if let Some(n) = st.dirty.remove(&b) {
                    nodes.push(n);
                }
            }
            st.log_durable = true;
            let blocks = encode(&self.shared, &nodes);
            crate::sync::lock(&self.shared.inflight)
                .extend(nodes.iter().map(|n| (n.bytenr, n.clone())));
            (ticket, st.transid, ptr, nonce, blocks, nodes)
        };
        let result = self.write_log_in_turn(ticket, transid, ptr, nonce, &blocks);
        {
            let mut inflight = crate::sync::lock(&self.shared.inflight);
            for n in nodes {
                inflight.remove(&n.bytenr);
                self.shared.cache.insert(n);
            }
        }
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    /// Writes a log in the order its blocks were taken: a later root
    /// reaches blocks an earlier caller took, so writing it first would
    /// name blocks not yet on the disk, and the earlier superblock written
    /// after it would name an older root.
    fn write_log_in_turn(
        &self,
        ticket: u64,
        transid: u64,
        ptr: RootPtr,
        nonce: u64,
        blocks: &[(u64, Vec<u8>)],
    ) -> Result<()> {
        // A failed engine wakes the writers queued behind, which fail too.
        let wake_all = |e| {
            self.commit_turn.notify_all();
            e
        };
        let mut io = self.wait_turn(transid - 1).map_err(wake_all)?;
        while io.log_tickets_done < ticket {
            self.check_alive().map_err(wake_all)?;
            io = self
                .commit_turn
                .wait(io)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let result = self.write_log(&mut io, transid, ptr, nonce, blocks);
        io.log_tickets_done = ticket + 1;
        self.commit_turn.notify_all();
        result
    }

    /// Writes the log's new blocks and a superblock naming its root with
    /// one barrier for both, not one after each: the superblock may then
    /// reach the disk before some block (or file data) it depends on, so
    /// it also names the root the previous write of this log made durable,
    /// and replay checks the newer root whole before using it
    /// ([`load_pending`]).
    fn write_log(
        &self,
        io: &mut IoState,
        transid: u64,
        ptr: RootPtr,
        nonce: u64,
        blocks: &[(u64, Vec<u8>)],
    ) -> Result<()> {
        if io.generation >= transid {
            // The transaction's commit is written: it holds everything.
            return Ok(());
        }
        let prev = match io.log {
            Some((t, p)) if t == transid => Some(p),
            _ => None,
        };
        if blocks.is_empty() && prev.is_some_and(|p| p.bytenr == ptr.bytenr) {
            return Ok(());
        }
        let mut sb = io.sb.clone();
        name_log(&mut sb, &ptr);
        let prev = prev.filter(|p| p.bytenr != ptr.bytenr && p.generation == ptr.generation);
        sb.log_prev_root = prev.map_or(0, |p| p.bytenr);
        sb.log_prev_generation = prev.map_or(0, |p| p.generation);
        sb.log_prev_level = prev.map_or(0, |p| p.level);
        sb.log_nonce = nonce;
        sb.incompat |= INCOMPAT_LOG_CHECKED;
        self.write_with_one_barrier(blocks, &sb)?;
        io.log = Some((transid, ptr));
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

fn encode(sh: &super::Shared, nodes: &[Arc<Node>]) -> Vec<(u64, Vec<u8>)> {
    let mut blocks: Vec<(u64, Vec<u8>)> = nodes
        .iter()
        .map(|n| (n.bytenr, n.encode(&sh.fsid, sh.nodesize)))
        .collect();
    blocks.sort_unstable_by_key(|b| b.0);
    blocks
}

/// Makes `sb` name the log at `ptr` (replay's feature bit included).
fn name_log(sb: &mut Superblock, ptr: &RootPtr) {
    sb.log_root = ptr.bytenr;
    sb.log_root_generation = ptr.generation;
    sb.log_root_level = ptr.level;
    sb.incompat |= INCOMPAT_LOG_TREE;
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

/// Reads the log a superblock names and keeps its blocks, and the new data
/// extents it names, out of the allocator (see [`PendingLog`]).
pub(crate) fn load_pending(st: &mut State, sh: &super::Shared) -> Result<()> {
    if st.sb.log_root == 0 {
        return Ok(());
    }
    let (chosen, mut verdict) = choose_root(st, sh)?;
    // What is chosen is whole: commits carry it on as it is.
    st.sb.clear_log();
    let Some(log) = chosen else {
        st.log_found = Some(verdict);
        return Ok(());
    };
    verdict.inodes = log.inodes;
    verdict.new_extents = log.extents.len() as u64;
    verdict.blocks = log.blocks.len() as u64;
    verdict.skipped = log
        .skipped
        .iter()
        .map(|(&node, reason)| SkippedInode {
            node,
            reason: reason.clone(),
        })
        .collect();
    for s in &verdict.skipped {
        tracing::error!(
            node = s.node,
            "the fsync log's items of this inode are refused, so replay leaves it \
             as the last commit has it: {}",
            s.reason
        );
    }
    st.log_found = Some(verdict);
    name_log(&mut st.sb, &log.ptr);
    // `examine` found all of it free in the last commit, without overlaps.
    let ns = sh.nodesize as u64;
    for &b in &log.blocks {
        st.alloc.exclude(b, ns)?;
    }
    for &(b, l) in &log.extents {
        st.alloc.exclude(b, l)?;
    }
    tracing::info!(
        blocks = log.blocks.len(),
        extents = log.extents.len(),
        "found a log tree to replay"
    );
    st.pending_log = Some(log);
    Ok(())
}

/// Opens at the last commit as if the superblock named no log; the next
/// commit (if the engine writes) drops it for good.
pub(crate) fn ignore_pending(st: &mut State) {
    if st.sb.log_root == 0 {
        return;
    }
    tracing::warn!(
        root = st.sb.log_root,
        "not replaying the fsync log: what was fsynced after the last commit is not shown"
    );
    st.sb.clear_log();
    st.log_replayed = true;
}

/// The log root to replay, examined whole ([`examine`]): the last one
/// written, else the previous one (which its own barrier made durable
/// before the last write began), else none: the filesystem opens at its
/// last commit. Each root passed over is named in an ERROR line.
fn choose_root(st: &State, sh: &super::Shared) -> Result<(Option<PendingLog>, LogVerdict)> {
    let sb = &st.sb;
    let last = RootPtr {
        bytenr: sb.log_root,
        generation: sb.log_root_generation,
        level: sb.log_root_level,
    };
    // Logs written before the nonce and the previous root existed carry
    // neither (no feature bit).
    let checked = sb.incompat & INCOMPAT_LOG_CHECKED != 0;
    let nonce = checked.then_some(sb.log_nonce);
    let prev = (checked && sb.log_prev_root != 0).then_some(RootPtr {
        bytenr: sb.log_prev_root,
        generation: sb.log_prev_generation,
        level: sb.log_prev_level,
    });
    let r = super::Reader::new(st, sh);
    let mut verdict = LogVerdict {
        last_root: last.bytenr,
        ..LogVerdict::default()
    };
    for (which, ptr) in [("last", Some(last)), ("previous", prev)] {
        let Some(ptr) = ptr else { continue };
        match examine(&r, st, sh, &ptr, nonce)? {
            Ok(log) => {
                verdict.chosen = Some(which.into());
                return Ok((Some(log), verdict));
            }
            Err(why) => {
                tracing::error!(
                    root = ptr.bytenr,
                    generation = ptr.generation,
                    "dropping the {which} root of the fsync log: {}",
                    why.reason
                );
                verdict.dropped.push(DroppedRoot {
                    which: which.into(),
                    root: ptr.bytenr,
                    reason: why.reason,
                    torn: why.torn,
                });
            }
        }
    }
    tracing::error!(
        generation = sb.generation,
        "no root of the fsync log can be replayed: opening at the last commit; \
         what was fsynced after it is lost"
    );
    Ok((None, verdict))
}

/// Why a log root cannot be replayed.
struct Rejection {
    reason: String,
    /// Blocks or data not as written: a write that did not reach the
    /// disk whole. Otherwise what was written is wrong (damage or a bug).
    torn: bool,
}

impl Rejection {
    fn torn(reason: String) -> Rejection {
        Rejection { reason, torn: true }
    }

    fn invalid(reason: String) -> Rejection {
        Rejection {
            reason,
            torn: false,
        }
    }
}

/// Reads every block of the log at `ptr` and everything it names, and
/// says whether replaying it is safe:
/// - every block is the one its parent names (checksum, address,
///   generation, level) and belongs to this log (owner, `nonce`);
/// - every item passes the item checker;
/// - its blocks, and the data extents it names that the extent tree does
///   not hold, lie in block groups of the last commit, in space free there
///   and apart from each other (a log never names a group or space its
///   own transaction created or reused; see `sync_log`);
/// - the data under every checksum item it holds matches the item.
fn examine(
    r: &super::Reader<'_>,
    st: &State,
    sh: &super::Shared,
    ptr: &RootPtr,
    nonce: Option<u64>,
) -> Result<std::result::Result<PendingLog, Rejection>> {
    let mut seen = Vec::new();
    let walked = walk_log(r, sh, ptr, nonce, &mut seen);
    let found = match walked {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => return Ok(Err(Rejection::invalid(why))),
        Err(Error::Corrupt { bytenr, reason }) => {
            // What was read of a write that never landed must not be
            // taken for the blocks later written there.
            seen.into_iter().for_each(|b| sh.cache.remove(b));
            return Ok(Err(Rejection::torn(format!("block {bytenr}: {reason}"))));
        }
        Err(e) => return Err(e),
    };
    let ns = sh.nodesize as u64;
    let mut claimed = Claimed::default();
    let blocks: Vec<(u64, u64)> = seen.iter().map(|&b| (b, ns)).collect();
    if let Err(why) = claimed.add(st, &blocks) {
        return Ok(Err(Rejection::invalid(why)));
    }
    let mut skipped = found.skipped;
    let mut extents = Vec::new();
    let mut inodes = 0;
    for (node, notes) in found.inodes {
        let mut new = Vec::new();
        let mut wrong = None;
        for &e in &notes.data_refs {
            match r.extent_at(e)? {
                ExtentAt::Data => {}
                ExtentAt::Absent if !extents.contains(&e) && !new.contains(&e) => new.push(e),
                ExtentAt::Absent => {}
                ExtentAt::Other => wrong = Some(e),
            }
        }
        // Space one inode names wrongly costs that inode only.
        if let Some((bytenr, len)) = wrong {
            let why =
                format!("it names {bytenr}+{len}, which is not a data extent of the last commit");
            skipped.insert(node, why);
            continue;
        }
        if let Err(why) = claimed.add(st, &new) {
            skipped.insert(node, why);
            continue;
        }
        extents.append(&mut new);
        inodes += u64::from(notes.log_inode);
    }
    if let Err(why) = sums_cover_extents(&found.sums, &extents) {
        return Ok(Err(Rejection::invalid(why)));
    }
    if let Some(at) = first_bad_data(r, &found.sums)? {
        let why = format!("logged data at {at} does not match its checksum");
        return Ok(Err(Rejection::torn(why)));
    }
    Ok(Ok(PendingLog {
        ptr: *ptr,
        blocks: seen,
        extents,
        inodes,
        skipped,
    }))
}

/// Whether each new extent's checksum item, if the log has one, covers
/// exactly its sectors: replay gives the extent that item (and nothing
/// else), so a short one would leave sectors unchecked or misread.
fn sums_cover_extents(
    sums: &[(u64, Vec<u8>)],
    extents: &[(u64, u64)],
) -> std::result::Result<(), String> {
    let by_start: std::collections::HashMap<u64, usize> =
        sums.iter().map(|(b, s)| (*b, s.len())).collect();
    for &(bytenr, len) in extents {
        let want = len / u64::from(crate::format::SECTORSIZE) * 4;
        match by_start.get(&bytenr) {
            Some(&have) if have as u64 != want => {
                return Err(format!(
                    "its checksum item at {bytenr} holds {have} bytes, \
                     the {len}-byte extent there needs {want}"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Space a log names, accepted so far: in block groups of the last
/// commit, free there, and each range apart from every other.
#[derive(Default)]
struct Claimed {
    /// start → end.
    ranges: BTreeMap<u64, u64>,
}

impl Claimed {
    /// Accepts all of `ranges`, or none of them and says why.
    fn add(&mut self, st: &State, ranges: &[(u64, u64)]) -> std::result::Result<(), String> {
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        let mut end = 0;
        for &(start, len) in &sorted {
            if start < end || self.overlaps(start, start.saturating_add(len)) {
                return Err(format!("it names {start} twice"));
            }
            end = start.saturating_add(len);
            let Some(g) = st.alloc.group_containing(start) else {
                return Err(format!("it names {start}, outside any block group"));
            };
            if !g.free.contains(start, len) {
                return Err(format!(
                    "it names {start}+{len}, not free in the last commit"
                ));
            }
        }
        for (start, len) in sorted {
            self.ranges.insert(start, start.saturating_add(len));
        }
        Ok(())
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        let before = self.ranges.range(..=start).next_back();
        let after = self.ranges.range(start..end).next();
        before.is_some_and(|(_, &e)| e > start) || after.is_some()
    }
}

/// What a walk of a log found in its leaves.
#[derive(Default)]
struct LogContents {
    /// Checksum items: (data extent address, its sector sums).
    sums: Vec<(u64, Vec<u8>)>,
    /// Each inode with no refused item.
    inodes: BTreeMap<u64, InodeNotes>,
    /// Inodes with an item the checker refuses, and why (see
    /// [`PendingLog::skipped`]).
    skipped: BTreeMap<u64, String>,
}

/// What one inode's items in a log add up to, while the walk goes on: an
/// inode's items may span leaves, and one refused item drops them all.
#[derive(Default)]
struct InodeNotes {
    log_inode: bool,
    data_refs: Vec<(u64, u64)>,
}

#[derive(Default)]
struct LogWalk {
    sums: Vec<(u64, Vec<u8>)>,
    inodes: BTreeMap<u64, InodeNotes>,
    skipped: BTreeMap<u64, String>,
}

impl LogWalk {
    fn note(&mut self, key: &Key, data: &[u8]) {
        if key.objectid == CSUM_OBJECTID && key.ty == EXTENT_CSUM {
            self.sums.push((key.offset, data.to_vec()));
            return;
        }
        let notes = self.inodes.entry(key.objectid).or_default();
        if key.ty == LOG_INODE {
            notes.log_inode = true;
        } else if let Some(e) = crate::format::items::data_ref_of(key, data) {
            if key.ty == EXTENT_DATA {
                notes.data_refs.push(e);
            }
        }
    }

    /// What replay would use: every inode with no refused item.
    fn contents(mut self) -> LogContents {
        self.inodes
            .retain(|node, _| !self.skipped.contains_key(node));
        LogContents {
            sums: self.sums,
            inodes: self.inodes,
            skipped: self.skipped,
        }
    }
}

/// Walks the log at `ptr`, noting every block address in `seen`. A block
/// that is not as its parent names it is `Error::Corrupt` (a write that
/// never reached the disk, or damage); a block of another log, or a
/// checksum item the checker refuses, is a rejection. An inode's item the
/// checker refuses leaves that inode out (`LogContents::skipped`): one
/// damaged inode does not cost every other fsync.
fn walk_log(
    r: &super::Reader<'_>,
    sh: &super::Shared,
    ptr: &RootPtr,
    nonce: Option<u64>,
    seen: &mut Vec<u64>,
) -> Result<std::result::Result<LogContents, String>> {
    use crate::tree::BlockRead;
    seen.push(ptr.bytenr);
    let root = r.read_node(ptr.bytenr, ptr.generation)?;
    if root.level != ptr.level {
        return Err(Error::corrupt(ptr.bytenr, "log root at another level"));
    }
    let limits = sh.item_limits();
    let mut found = LogWalk::default();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if node.owner != tree_id::LOG || nonce.is_some_and(|n| node.flags != n) {
            return Err(Error::corrupt(node.bytenr, "not a block of this log"));
        }
        match &node.body {
            Body::Internal(ptrs) => {
                for p in ptrs {
                    seen.push(p.bytenr);
                    stack.push(crate::tree::read_child(r, p, node.level)?);
                }
            }
            Body::Leaf(leaf) => {
                for it in leaf {
                    if let Err(why) = crate::format::checker::check_item(&it.key, &it.data, &limits)
                    {
                        let why = format!("item {} in block {}: {why}", it.key, node.bytenr);
                        if it.key.objectid == CSUM_OBJECTID {
                            return Ok(Err(why));
                        }
                        found.skipped.entry(it.key.objectid).or_insert(why);
                        continue;
                    }
                    found.note(&it.key, &it.data);
                }
            }
        }
    }
    Ok(Ok(found.contents()))
}

/// The first device address under a checksum item in `sums` whose data
/// does not match it.
fn first_bad_data(r: &super::Reader<'_>, sums: &[(u64, Vec<u8>)]) -> Result<Option<u64>> {
    const SECTOR: usize = crate::format::SECTORSIZE as usize;
    const CHUNK_SECTORS: usize = 256;
    let mut buf = vec![0u8; SECTOR * CHUNK_SECTORS];
    for (bytenr, item) in sums {
        for (i, want) in item.chunks(4 * CHUNK_SECTORS).enumerate() {
            let sectors = want.len() / 4;
            let at = bytenr + (i * CHUNK_SECTORS * SECTOR) as u64;
            let data = &mut buf[..sectors * SECTOR];
            r.read_data(at, data)?;
            if let Some(bad) = crate::format::first_bad_sector(data, want) {
                return Ok(Some(at + (bad * SECTOR) as u64));
            }
        }
    }
    Ok(None)
}

/// What the extent tree of the last commit holds where a log names a
/// data extent.
enum ExtentAt {
    /// Nothing: an extent written after the last commit.
    Absent,
    /// A data extent of exactly that length.
    Data,
    /// A tree block, or an extent of another length.
    Other,
}

impl super::Reader<'_> {
    /// What the extent tree records at `(bytenr, len)` (extents are keyed
    /// `(bytenr, EXTENT_ITEM, len)`).
    fn extent_at(&self, (bytenr, len): (u64, u64)) -> Result<ExtentAt> {
        let c = self.cursor(tree_id::EXTENT, &Key::new(bytenr, EXTENT_ITEM, 0))?;
        let Some(it) = c
            .item()
            .filter(|i| i.key.objectid == bytenr && i.key.ty == EXTENT_ITEM)
        else {
            return Ok(ExtentAt::Absent);
        };
        let data = crate::format::items::ExtentItem::decode(&it.data)
            .is_ok_and(|e| !e.is_tree_block() && it.key.offset == len);
        Ok(if data {
            ExtentAt::Data
        } else {
            ExtentAt::Other
        })
    }
}
