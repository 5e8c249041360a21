//! Defragmentation (`canopy filesystem defragment`): a file written in
//! small pieces (random writes with fsync, appends from many writers)
//! holds many short data extents scattered over the device; they are
//! rewritten into long ones, written in file order.
//!
//! btrfs rewrites such a file's data as new writes, which unshares every
//! extent a snapshot or reflink shared (their space doubles). Canopy
//! merges the extents themselves instead (`balance::relocate::merge_data`):
//! consecutive short extents of the file are copied, whole, one after
//! another into one new extent of at most [`file::EXTENT_MAX`], and every
//! item that referenced one of them, in this file, in snapshots and in
//! reflinked files alike, points at the same bytes of the new one. Items
//! of one file that now continue each other are joined. Nothing is
//! unshared, so used space does not grow once the old extents are freed
//! by the commit.
//!
//! Extents are only merged with others that the same trees reach through
//! as many leaves, so a merged extent never makes a snapshot hold
//! bytes only the live file held (quota numbers stay what they were; the
//! commit's accounting traces the change anyway, so they stay exact
//! whatever is merged). An extent the file uses less than half of, a
//! compressed, inline or preallocated one, and one this request wrote
//! itself ends a run.
//!
//! Each step is one short turn at the engine's lock, like a balance step:
//! it reads and verifies the extents it merges and allocates their new
//! place before changing anything, so a step either merges or fails with
//! nothing changed. A request does a bounded range of one file and says
//! where to go on, so the command shows progress and the control socket
//! stays free; the mount's commits (and the command's when it is done) give
//! the old extents' space back.

mod recompress;

use super::{file, Fs, Subvol};
use crate::balance::relocate::{merge_data, Climb, Merge, Staged};
use crate::compress::Codec;
use crate::error::{Error, Result};
use crate::format::items::{FileExtentItem, COMPRESS_NONE, FILE_EXTENT_REG};
use crate::txn::Txn;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most data bytes one step copies (as a balance step).
const STEP_DATA_BYTES: u64 = 8 << 20;
/// Bytes of the file one step looks at for runs.
const STEP_WINDOW: u64 = 10 << 20;
/// How long one request works before it answers with where to go on.
const REQUEST_TIME: Duration = Duration::from_millis(500);
/// Other operations get the lock between steps.
const PAUSE_BETWEEN_STEPS: Duration = Duration::from_micros(200);

/// What a defragment request asks.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DefragArgs {
    /// Where in the file to start.
    pub start: u64,
    /// Extents this long or longer are left alone (btrfs's `-t`; capped
    /// at the longest data extent Canopy writes).
    pub threshold: u64,
    /// Rewrite every extent not compressed with this codec yet, instead
    /// of merging short ones (btrfs's `-c`; see [`recompress`]).
    #[serde(default)]
    pub compress: Option<Codec>,
}

/// What one request did to one file, and where the next one goes on.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DefragReport {
    /// Extents merged into others (each run of n extents counts n - 1).
    pub merged: u64,
    /// New extents written.
    pub written: u64,
    /// Data bytes copied.
    pub bytes: u64,
    /// File extent items joined into the one before them.
    pub items_joined: u64,
    /// Extents rewritten compressed (`-c`).
    #[serde(default)]
    pub recompressed: u64,
    /// Extents `-c` left as they were: compressing them saved nothing.
    #[serde(default)]
    pub incompressible: u64,
    /// Device bytes of the extents `-c` rewrote, and of what replaced
    /// them.
    #[serde(default)]
    pub stored_before: u64,
    #[serde(default)]
    pub stored_after: u64,
    /// Where the next request starts; None at the end of the file.
    pub next: Option<u64>,
    /// Files (node ids) whose attributes changed (`-c` changes the
    /// `nbytes` of every file that shares what it rewrote): the kernel's
    /// cached attributes of them are dropped.
    #[serde(skip)]
    pub changed: BTreeSet<u64>,
}

impl DefragReport {
    /// Adds `more`'s counts (a later step's or request's) to these.
    pub fn add(&mut self, more: &DefragReport) {
        self.merged += more.merged;
        self.written += more.written;
        self.bytes += more.bytes;
        self.items_joined += more.items_joined;
        self.recompressed += more.recompressed;
        self.incompressible += more.incompressible;
        self.stored_before += more.stored_before;
        self.stored_after += more.stored_after;
        self.changed.extend(&more.changed);
    }
}

/// The longest extent a merge makes, and the shortest left alone.
fn effective_threshold(threshold: u64) -> u64 {
    threshold.clamp(2 * file::SECTOR, file::EXTENT_MAX)
}

impl Fs {
    /// Defragments regular file `node` from `args.start` on, for about
    /// half a second; the report says where to go on.
    pub fn defragment(&self, node: u64, args: DefragArgs) -> Result<DefragReport> {
        let (sv, ino) = self.at_writable(node)?;
        if sv.getattr(ino)?.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::Invalid(
                "defragment works on regular files (-r descends into directories)".into(),
            ));
        }
        sv.flush_file(ino)?;
        if let Some(codec) = args.compress {
            return self.recompress(&sv, ino, args.start, codec);
        }
        let threshold = effective_threshold(args.threshold);
        let started = Instant::now();
        let mut report = DefragReport {
            next: Some(args.start),
            ..Default::default()
        };
        let mut state = StepState::default();
        while let Some(from) = report.next {
            if started.elapsed() >= REQUEST_TIME {
                break;
            }
            let done = self
                .core
                .write_reserved(|tx| sv.defrag_step(tx, ino, from, threshold, &mut state))?;
            report.add(&done);
            report.next = done.next;
            if done.written > 0 {
                std::thread::sleep(PAUSE_BETWEEN_STEPS);
            }
        }
        // Commits come from the mount's bound on dirty metadata while
        // files are done piece by piece (a commit per piece cost a tenth
        // of the time, and one per file nine tenths of recompressing
        // /usr/share/doc), and from the command once it is done.
        Ok(report)
    }
}

impl Fs {
    /// [`Fs::defragment`] with `-c`: recompresses regular file `ino`
    /// from `start` on, for about half a second. A `chattr +C` file is
    /// left alone (as btrfs never compresses one).
    fn recompress(&self, sv: &Subvol, ino: u64, start: u64, codec: Codec) -> Result<DefragReport> {
        let flags = self.core.engine.read(|r| sv.inode_r(r, ino))?.flags;
        if !file::keeps_sums(flags) {
            return Ok(DefragReport::default());
        }
        let started = Instant::now();
        let mut report = DefragReport {
            next: Some(start),
            ..Default::default()
        };
        let mut made = HashSet::new();
        while let Some(from) = report.next {
            let turn = sv.recompress_turn(ino, from, codec, &mut made)?;
            report.add(&turn.report);
            report.next = turn.report.next;
            if turn.wants_commit {
                // The log or the running transaction holds the next
                // extent; a commit lets it go.
                self.core.engine.commit()?;
                if started.elapsed() < REQUEST_TIME {
                    continue;
                }
                // A writer that keeps replacing the extent there could
                // hold the request forever: it is skipped this time.
                if report.next == Some(start) {
                    report.next = Some(start + 1);
                }
                break;
            }
            if started.elapsed() >= REQUEST_TIME {
                break;
            }
            if turn.report.written > 0 {
                std::thread::sleep(PAUSE_BETWEEN_STEPS);
            }
        }
        Ok(report)
    }
}

/// What a request's steps keep between them.
#[derive(Default)]
struct StepState {
    /// Buffers to reuse: fresh ones cost a page fault per page.
    pool: Vec<Vec<u8>>,
    /// The extents this request wrote: not merged again.
    made: HashSet<u64>,
}

/// Extents to merge, (start, length), in file order.
type Run = Vec<(u64, u64)>;

/// One extent the file references, in file order.
struct Candidate {
    /// Where in the file it is first used.
    at: u64,
    bytenr: u64,
    len: u64,
    /// Bytes of it the file's items in the window use.
    used: u64,
    /// Whether it may join a run at all.
    mergeable: bool,
}

/// Who reaches an extent: extents merge only with ones reached alike,
/// by the same trees through as many leaves (a reflink in another file
/// adds a leaf; an item split in two by an overwrite usually does not).
#[derive(PartialEq, Eq)]
struct Reach {
    roots: Arc<BTreeSet<u64>>,
    leaves: usize,
}

impl Subvol {
    /// One step: the runs of short extents of `ino` from `from` on, up
    /// to a step's worth of bytes, each merged into one extent.
    fn defrag_step(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        from: u64,
        threshold: u64,
        state: &mut StepState,
    ) -> Result<DefragReport> {
        let pool = &mut state.pool;
        let size = self.inode_tx(tx, ino)?.size;
        let root = tx.root_of(self.tree)?;
        let window_end = from.saturating_add(STEP_WINDOW);
        let items = file::items_in(tx, &root, ino, from, window_end)?;
        let mut climb = Climb::default();
        let candidates = candidates(&items, from, threshold, &state.made);
        let (mut runs, stop) = runs_of(tx, &mut climb, &candidates)?;
        let next = match stop {
            Some(i) => Some(candidates[i].at),
            // Where the next item starts (a sparse file's next data may
            // lie far past the window), if anywhere.
            None if window_end < size => file::items_from(tx, &root, ino, window_end, 1)?
                .first()
                .map(|(k, _)| *k),
            None => None,
        };
        let mut done = DefragReport {
            next,
            ..Default::default()
        };
        if runs.is_empty() {
            return Ok(done);
        }
        let all = runs.len();
        reserve_shrinking(tx, &mut climb, &mut runs)?;
        if runs.len() < all {
            // The rest waits for the next step.
            let first_left = runs_after(&candidates, &runs);
            done.next = Some(first_left.unwrap_or(from));
        }
        let all: Vec<(u64, u64)> = runs.iter().flatten().copied().collect();
        let staged = Staged::read(tx, &all, pool);
        let mut merges = Vec::with_capacity(runs.len());
        let mut hint = runs[0][0].0;
        for run in runs {
            let first = run[0].0;
            let mut m = Merge::read(tx, &staged, run, pool)?;
            m.new = match tx.alloc_data(m.len(), hint) {
                Ok(new) => new,
                Err(Error::NoSpace) if !merges.is_empty() => {
                    // The rest waits for the next step (after a commit).
                    done.next = Some(run_start(&candidates, first).unwrap_or(from));
                    break;
                }
                Err(e) => return Err(e),
            };
            hint = m.new + m.len();
            merges.push(m);
        }
        for m in merges {
            state.made.insert(m.new);
            done.merged += m.extents() as u64 - 1;
            done.written += 1;
            done.bytes += m.len();
            done.items_joined += merge_data(tx, &mut climb, m, pool)?;
        }
        staged.recycle(pool);
        if !tx.flights_open() {
            crate::extent::apply::run(tx)?;
        }
        Ok(done)
    }
}

/// Where the first run after `runs` starts (the runs are in file order).
fn runs_after(candidates: &[Candidate], runs: &[Run]) -> Option<u64> {
    let last = runs.last()?.last()?.0;
    let i = candidates.iter().position(|c| c.bytenr == last)?;
    candidates.get(i + 1).map(|c| c.at)
}

/// The file offset where the extent at `bytenr` is first used.
fn run_start(candidates: &[Candidate], bytenr: u64) -> Option<u64> {
    candidates.iter().find(|c| c.bytenr == bytenr).map(|c| c.at)
}

/// The extents the items from `from` on reference, in order of first
/// use, each once.
fn candidates(
    items: &[(u64, FileExtentItem)],
    from: u64,
    threshold: u64,
    made: &HashSet<u64>,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::new();
    for (k, fe) in items {
        if *k < from {
            continue;
        }
        let Some((bytenr, len)) = fe.disk_extent() else {
            // A hole or inline data ends a run.
            out.push(Candidate {
                at: *k,
                bytenr: 0,
                len: 0,
                used: 0,
                mergeable: false,
            });
            continue;
        };
        if let Some(&i) = index.get(&bytenr) {
            out[i].used += fe.num_bytes;
            continue;
        }
        index.insert(bytenr, out.len());
        let plain = fe.kind == FILE_EXTENT_REG && fe.compression == COMPRESS_NONE;
        out.push(Candidate {
            at: *k,
            bytenr,
            len,
            used: fe.num_bytes,
            mergeable: plain && len < threshold && !made.contains(&bytenr),
        });
    }
    for c in &mut out {
        // Mostly dead bytes would be copied for little.
        c.mergeable &= c.used.saturating_mul(2) >= c.len;
    }
    out
}

/// Runs of at least two mergeable extents, reached alike, whose lengths
/// add up to at most [`file::EXTENT_MAX`], up to a step's bytes; and the
/// index of the first candidate not looked at when those ran out.
fn runs_of(
    tx: &Txn<'_>,
    climb: &mut Climb,
    candidates: &[Candidate],
) -> Result<(Vec<Run>, Option<usize>)> {
    let mut runs: Vec<Run> = Vec::new();
    let mut run: Run = Vec::new();
    let mut run_reach: Option<Reach> = None;
    let mut bytes = 0;
    let close = |run: &mut Run, runs: &mut Vec<Run>, bytes: &mut u64| {
        if run.len() > 1 {
            *bytes += run.iter().map(|r| r.1).sum::<u64>();
            runs.push(std::mem::take(run));
        } else {
            run.clear();
        }
    };
    for (i, c) in candidates.iter().enumerate() {
        if !c.mergeable {
            close(&mut run, &mut runs, &mut bytes);
            run_reach = None;
        } else {
            let holders = climb.holders(tx, c.bytenr)?;
            let reach = Reach {
                roots: climb.roots(tx, c.bytenr)?,
                leaves: holders.len(),
            };
            let run_len: u64 = run.iter().map(|r| r.1).sum();
            if holders.is_empty()
                || run_reach.as_ref() != Some(&reach)
                || run_len + c.len > file::EXTENT_MAX
            {
                close(&mut run, &mut runs, &mut bytes);
            }
            if holders.is_empty() {
                run_reach = None;
                continue;
            }
            run.push((c.bytenr, c.len));
            run_reach = Some(reach);
        }
        if bytes >= STEP_DATA_BYTES {
            // What is in `run` is looked at again by the next step.
            let resume = i + 1 - run.len();
            return Ok((runs, candidates.get(resume).map(|_| resume)));
        }
    }
    close(&mut run, &mut runs, &mut bytes);
    Ok((runs, None))
}

/// Reserves a step's worst case: a copy of the path to every leaf that
/// holds one of the extents (each is copied once, however many of them
/// it holds), and the data rewritten.
fn reserve_for(tx: &mut Txn<'_>, climb: &mut Climb, runs: &[Run]) -> Result<()> {
    let mut leaves = BTreeSet::new();
    let mut data = 0u64;
    for &(bytenr, len) in runs.iter().flatten() {
        leaves.extend(climb.holders(tx, bytenr)?.into_keys());
        data += len;
    }
    // The checksum tree's items and the extent tree's references too.
    crate::balance::reserve_moves(tx, 2 + 2 * leaves.len() as u64, data)
}

/// [`reserve_for`] as many runs as fit, halving until they do: ENOSPC
/// only when one run does not.
fn reserve_shrinking(tx: &mut Txn<'_>, climb: &mut Climb, runs: &mut Vec<Run>) -> Result<()> {
    loop {
        match reserve_for(tx, climb, runs) {
            Err(Error::NoSpace) if runs.len() > 1 => runs.truncate(runs.len() / 2),
            r => return r,
        }
    }
}
