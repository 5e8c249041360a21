//! The commit: settle every index, encode the dirty blocks, write them,
//! barrier, write the superblocks, barrier.

use super::{persist, Engine, State, Txn};
use crate::cache::BlockMap;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::node::Node;
use crate::format::superblock::Superblock;
use crate::format::{tree_id, SUPER_OFFSETS, SUPER_SIZE};
use std::sync::Arc;

/// Rounds after which a commit that keeps producing changes is a bug.
const MAX_SETTLE_ROUNDS: usize = 100;

/// Largest single write when coalescing adjacent blocks.
const MAX_WRITE_BYTES: usize = 4 << 20;

/// What the I/O phase of a commit needs, taken from the state under lock.
struct Prepared {
    nodes: BlockMap<Arc<Node>>,
    sb: Superblock,
    pinned: Vec<(u64, u64)>,
    /// Freed blocks to drop from the cache before their space is reused.
    retired: Vec<u64>,
}

/// What phase 1 of a commit found.
enum Prepare {
    Ready(Box<Prepared>),
    /// Nothing changed since the last commit, of this generation.
    Nothing(u64),
    /// The log holds bytes still only in a file's buffer
    /// (`log::LoggedBytes`): flush and try again.
    LoggedBytesBuffered,
}

/// Rounds of flushing a commit makes for the bytes the log holds. Fsyncs
/// log no more bytes once it starts, so one round is enough unless a
/// flush failed and gave its bytes back to the buffer.
const LOGGED_BYTES_TRIES: u32 = 3;

impl Engine {
    /// Commits the running transaction and returns its generation. Returns
    /// at once with the last generation when nothing changed.
    pub fn commit(&self) -> Result<u64> {
        self.check_alive()?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let mut tries = 0;
        let prepared = loop {
            self.flush_logged_bytes()?;
            match self.prepare_under_lock()? {
                Prepare::Ready(p) => break p,
                // Nothing new, but the last prepared commit may still be
                // writing: durable means its I/O has finished.
                Prepare::Nothing(last) => return self.wait_written(last),
                // A flush of a file whose bytes the log holds failed or
                // was undone meanwhile: once more, then give up rather
                // than drop the only durable copy of fsynced bytes.
                Prepare::LoggedBytesBuffered if tries < LOGGED_BYTES_TRIES => tries += 1,
                Prepare::LoggedBytesBuffered => {
                    return Err(Error::Invalid(
                        "bytes an fsync logged could not be flushed to extents; \
                         the commit keeps the log instead of dropping them"
                            .into(),
                    ))
                }
            }
        };
        let generation = prepared.sb.generation;
        // Encoded (checksummed) without any lock: the nodes are frozen now.
        let blocks = encode(&prepared.nodes, &self.shared);
        // Two commits may be prepared before either writes; the older must
        // write (and release its pinned space) first, or its superblock
        // would overwrite the newer one and a block freed by the newer one
        // could be reused while the older superblock still points at it.
        let mut io = self.wait_turn(generation - 1)?;
        for &b in &prepared.retired {
            self.shared.cache.remove(b);
        }
        if let Err(e) = self.write_durably(&blocks, &prepared.sb) {
            self.fail(&e);
            io.generation = generation;
            self.commit_turn.notify_all();
            return Err(e);
        }
        {
            let mut inflight = crate::sync::lock(&self.shared.inflight);
            for (bytenr, mut node) in prepared.nodes {
                inflight.remove(&bytenr);
                if let Some(n) = Arc::get_mut(&mut node) {
                    n.body.shrink_to_fit();
                }
                self.shared.cache.insert(node);
            }
        }
        self.unpin(prepared.pinned);
        io.generation = generation;
        self.commit_turn.notify_all();
        drop(io);
        tracing::debug!(generation, "committed");
        self.discard_after_commit();
        Ok(generation)
    }

    /// Phase 1 under the state lock, taken once no flight is open (their
    /// extents are not referenced yet): the commit to write, the last
    /// generation when nothing changed, or word that bytes the log holds
    /// are still buffered. A failure shuts the engine
    /// down.
    fn prepare_under_lock(&self) -> Result<Prepare> {
        let mut st = self.lock_without_flights();
        self.check_alive()?;
        if !self.logged_bytes_landed(&st) {
            return Ok(Prepare::LoggedBytesBuffered);
        }
        let started = std::time::Instant::now();
        let prepared = prepare(&mut st, &self.shared);
        // How long every other operation waited: what latency benchmarks
        // trace back to.
        tracing::debug!(
            held_us = started.elapsed().as_micros() as u64,
            "commit prepared under the state lock"
        );
        match prepared {
            Ok(Some(p)) => Ok(Prepare::Ready(Box::new(p))),
            Ok(None) => Ok(Prepare::Nothing(st.sb.generation)),
            Err(e) => {
                let e = match e {
                    // The reservations promise this cannot happen.
                    Error::NoSpace => Error::Aborted(
                        "the commit ran out of space (a reservation accounting bug)".into(),
                    ),
                    e => e,
                };
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Waits until the I/O of generation `generation` (and every earlier
    /// one) has finished; returns the I/O lock.
    pub(super) fn wait_turn(
        &self,
        generation: u64,
    ) -> Result<std::sync::MutexGuard<'_, super::log::IoState>> {
        let mut io = crate::sync::lock(&self.commit_io);
        while io.generation < generation {
            self.check_alive()?;
            io = self
                .commit_turn
                .wait(io)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Ok(io)
    }

    pub(super) fn wait_written(&self, generation: u64) -> Result<u64> {
        drop(self.wait_turn(generation)?);
        self.check_alive()?;
        Ok(generation)
    }

    /// Writes tree blocks, barrier, every superblock copy, barrier: the
    /// write order of a commit.
    pub(super) fn write_durably(&self, blocks: &[(u64, Vec<u8>)], sb: &Superblock) -> Result<()> {
        self.write_blocks(blocks)?;
        self.shared.dev.barrier()?;
        self.write_superblocks(sb)?;
        self.shared.dev.barrier()
    }

    /// Writes runs of encoded blocks ([`encode_runs`]); not durable until
    /// a barrier (a log write takes its own outside the I/O lock).
    pub(super) fn write_blocks(&self, runs: &[(u64, Vec<u8>)]) -> Result<()> {
        for (offset, bytes) in runs {
            self.shared.dev.write_at(bytes, *offset)?;
        }
        Ok(())
    }

    /// Writes every copy inside the filesystem's part of each device
    /// (not the device's end: space a device grew by is not the
    /// filesystem's until it is resized), each naming its own device.
    fn write_superblocks(&self, sb: &Superblock) -> Result<()> {
        self.write_superblock_copies(sb, &SUPER_OFFSETS)
    }

    /// Writes the copies at `offsets` of every device.
    fn write_superblock_copies(&self, sb: &Superblock, offsets: &[u64]) -> Result<()> {
        // Superblock copies lie outside the volume's mapping (a group
        // may span one, but never uses its bytes).
        let _pass = self.shared.dev.pass();
        for (devid, dev) in self.shared.dev.devices() {
            let bytes = sb.device_bytes(devid).unwrap_or(0);
            let mut own = sb.clone();
            own.devid = devid;
            for &off in offsets {
                if off + SUPER_SIZE <= bytes {
                    dev.write_at(&own.encode(off), off)?;
                }
            }
        }
        Ok(())
    }
}

/// Settles the indexes and takes the dirty blocks out of the state; None
/// when there is nothing to commit.
fn prepare(st: &mut State, sh: &super::Shared) -> Result<Option<Prepared>> {
    if st.dirty.is_empty()
        && st.refs.is_empty()
        && st.dropped.is_empty()
        && !st.log_replayed
        && !st.superblock_changed
        && st.log.is_none()
    {
        return Ok(None);
    }
    // The log ends with the transaction it served.
    st.drop_log(sh)?;
    st.log_bytes_closed = false;
    // No flight is open (`lock_without_flights`): one dropped without
    // ending left its extents unreferenced, and this fold frees them.
    st.refs.release_all();
    let mut tx = Txn::new(st, sh);
    // Once per commit, outside the settle loop: reads beside the commit
    // may count errors meanwhile.
    persist::write_device_stats(&mut tx)?;
    settle(&mut tx)?;
    // Accounting writes quota items, which the indexes must follow.
    let mut accounted = false;
    for m in tx.st.mechanisms {
        accounted |= m.account(&mut tx)?;
    }
    if accounted {
        settle(&mut tx)?;
    }
    st.refs.end_transaction();
    st.relocated.clear();
    st.relocate_cursor = 0;
    st.log_durable = false;
    st.log_replayed = false;
    st.superblock_changed = false;
    st.remember_committed_roots();
    let dirty = std::mem::take(&mut st.dirty);
    st.frozen.clear();
    if let Some((bytenr, _)) = dirty.iter().find(|(_, n)| n.nritems() == 0 && n.level > 0) {
        return Err(Error::corrupt(
            *bytenr,
            "empty internal node survived the commit",
        ));
    }
    let root = st
        .roots
        .get(&tree_id::ROOT)
        .ok_or_else(|| Error::corrupt(0, "root tree missing"))?
        .ptr;
    let mut sb = st.sb.clone();
    sb.generation = st.transid;
    sb.root = root.bytenr;
    sb.root_generation = root.generation;
    sb.root_level = root.level;
    sb.bytes_used = st.alloc.bytes_used();
    sb.system_chunks = st.alloc.system_chunks();
    for m in st.mechanisms {
        m.sealed(&mut st.slots, &mut sb);
    }
    st.transid += 1;
    // After the space counts above: the link's block is the next
    // transaction's, and free in this commit.
    st.start_log_chain(sh, &mut sb);
    st.sb = sb.clone();
    st.alloc.groups_committed();
    let pinned = st.alloc.take_pinned();
    let retired = std::mem::take(&mut st.retired);
    crate::sync::lock(&sh.inflight).extend(dirty.iter().map(|(&b, n)| (b, n.clone())));
    Ok(Some(Prepared {
        nodes: dirty,
        sb,
        pinned,
        retired,
    }))
}

/// The blocks' bytes as they go to disk, in address order.
fn encode(nodes: &BlockMap<Arc<Node>>, sh: &super::Shared) -> Vec<(u64, Vec<u8>)> {
    encode_runs(nodes.values().map(|n| &**n).collect(), sh)
}

/// Encodes `nodes` in address order into runs of adjacent blocks, each
/// one write of at most [`MAX_WRITE_BYTES`]. Each block is encoded where
/// it is written from: a commit holds its dirty blocks once more while
/// it writes, not twice (encoded, then merged).
pub(super) fn encode_runs(mut nodes: Vec<&Node>, sh: &super::Shared) -> Vec<(u64, Vec<u8>)> {
    let ns = sh.nodesize;
    nodes.sort_unstable_by_key(|n| n.bytenr);
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for n in &nodes {
        match runs.last_mut() {
            Some((start, len))
                if *start + (*len * ns) as u64 == n.bytenr
                    && (*len + 1) * ns <= MAX_WRITE_BYTES =>
            {
                *len += 1
            }
            _ => runs.push((n.bytenr, 1)),
        }
    }
    let mut nodes = nodes.into_iter();
    runs.into_iter()
        .map(|(start, len)| {
            let mut buf = vec![0u8; len * ns];
            for (block, n) in buf.chunks_exact_mut(ns).zip(nodes.by_ref()) {
                n.encode_into(&sh.fsid, block);
            }
            (start, buf)
        })
        .collect()
}

/// Repeats the index updates until a round changes nothing.
fn settle(tx: &mut Txn<'_>) -> Result<()> {
    for _ in 0..MAX_SETTLE_ROUNDS {
        let mut did = persist::write_root_items(tx)?;
        for m in tx.st.mechanisms {
            did |= m.settle(tx)?;
        }
        did |= persist::apply_free_journal(tx)?;
        did |= persist::remove_empty_groups(tx)?;
        did |= persist::write_block_groups(tx)?;
        if !did {
            return Ok(());
        }
    }
    Err(Error::corrupt(0, "commit did not settle"))
}
