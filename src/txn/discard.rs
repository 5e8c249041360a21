//! Discard as space is freed (`-o discard`, `discard=async` by default):
//! the storage learns of freed space without a `canopy filesystem trim`,
//! so a thin image (an image file, an RBD image, a thin block device)
//! gives it back as files go.
//!
//! The allocator notes every range that becomes reusable: space a commit
//! freed once that commit is durable (until then it is pinned, and the
//! last commit's trees may still point into it), and space freed before
//! any commit named it. Nothing else is ever discarded, so a crash at any
//! moment finds everything the last durable commit reaches.
//!
//! - `discard=async`: a range is discarded once it has stayed free for
//!   2 s, in bounded batches from the mount's loop. Space
//!   reused meanwhile (tree blocks are freed and taken again all the
//!   time) is passed over, and so are free pieces shorter than 1 MiB, as
//!   btrfs's async discard skips small extents: tree blocks and small
//!   extents freed between live ones cost nothing. A piece discarded
//!   takes the free space around it to 4 MiB boundaries (see
//!   [`DiscardPass::ASYNC`]). Space the fsync log freed is held back
//!   while fsyncs keep coming: each transaction's log takes as much again
//!   (hundreds of MiB a commit interval under a database), mostly where
//!   the last one lay, and on a thin image every write to space
//!   discarded makes the host allocate again inside the fsync (a
//!   metadata write of the host's before its barrier returns). It is
//!   discarded like the rest once no log write has come for
//!   [`LOG_IDLE`], and at unmount.
//! - `discard=sync` (`discard`): everything a commit made reusable is
//!   discarded right after that commit, before it returns.
//!
//! Each batch's ranges are taken out of allocations at the state lock
//! ([`Allocator::begin_discard`]: in memory only, on disk they stay
//! free), discarded without it, and given back; so no allocation takes a
//! range between the look at the free space and the discard, and no
//! other operation waits for the storage meanwhile (a discard on RBD is
//! a round trip per object, and a full cluster holds it until it has
//! room). When the space cannot be spared (a nearly full filesystem), a
//! batch is discarded under the lock instead. Space of a group given
//! back to unallocated space is always discarded under the lock: a new
//! group could take it otherwise. A device that cannot discard turns
//! discarding off for the mount, once, with a log line.

use super::trim::Trimmed;
use super::Engine;
use crate::alloc::{Allocator, Untrimmed};
use crate::dev::Device;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How freed space reaches the storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiscardMode {
    /// Only `canopy filesystem trim` discards (`nodiscard`).
    #[default]
    Off,
    /// Right after each commit (`discard`, `discard=sync`).
    Sync,
    /// In the background, after a delay (`discard=async`).
    Async,
}

impl DiscardMode {
    fn to_u8(self) -> u8 {
        match self {
            DiscardMode::Off => 0,
            DiscardMode::Sync => 1,
            DiscardMode::Async => 2,
        }
    }

    fn from_u8(v: u8) -> DiscardMode {
        match v {
            1 => DiscardMode::Sync,
            2 => DiscardMode::Async,
            _ => DiscardMode::Off,
        }
    }
}

/// How one call of [`Engine::discard_freed`] works.
#[derive(Clone, Copy, Debug)]
pub struct DiscardPass {
    /// How long a range must have stayed free.
    pub delay: Duration,
    /// Shortest free piece discarded.
    pub min_len: u64,
    /// A piece discarded takes with it the free space around it up to
    /// boundaries of this size (1: the piece alone), so storage made of
    /// objects (RBD's 4 MiB) gets whole objects back where extents meet
    /// in the middle of one.
    pub window: u64,
    /// Most batches (each two short turns at the state lock) this call
    /// does.
    pub batches: usize,
    /// Space the log freed waits until no log write has come for this
    /// long ([`LOG_IDLE`] for `discard=async`; None: it goes like the
    /// rest).
    pub log_idle: Option<Duration>,
}

impl DiscardPass {
    /// `discard=async`'s turn from the mount's loop (every 0.1 s): ranges
    /// free for 2 s (merged where they touch), in pieces of 1 MiB or
    /// more, each with the free space around it to 4 MiB boundaries.
    /// Smaller pieces are skipped: copy-on-write frees tree blocks and
    /// small extents all the time, and discarding each, with the free
    /// space around it, cost a tenth of the fsyncs per second on RBD (a
    /// write to its object each time) for space `rbd du` still counts
    /// (an object with live bytes stays whole). A large piece's
    /// neighbourhood goes too, or the objects where two deleted extents
    /// met would stay, zeroed in two halves: 256 MiB of 8 GiB deleted.
    pub const ASYNC: DiscardPass = DiscardPass {
        delay: Duration::from_secs(2),
        min_len: 1 << 20,
        window: 4 << 20,
        batches: 4,
        log_idle: Some(LOG_IDLE),
    };

    /// `discard=async` at unmount: what waits, at once, log space too.
    pub const AT_CLOSE: DiscardPass = DiscardPass {
        delay: Duration::ZERO,
        batches: usize::MAX,
        log_idle: None,
        ..DiscardPass::ASYNC
    };

    /// Every noted range still free (`discard=sync`).
    pub const ALL: DiscardPass = DiscardPass {
        delay: Duration::ZERO,
        min_len: 1,
        window: 1,
        batches: usize::MAX,
        log_idle: None,
    };
}

/// Most ranges and bytes one batch discards (a discard of an RBD object
/// that holds live blocks is a round trip): what a batch keeps from
/// allocations while its discards run.
const BATCH_RANGES: usize = 64;
const BATCH_BYTES: u64 = 256 << 20;

/// Ranges waiting past which they are joined (their clocks restart).
const WAITING_MAX: usize = 1 << 16;

/// How long no log write must have come before `discard=async` discards
/// the space the log freed: a few commit intervals, so that a database
/// that pauses between bursts keeps its log's space, and one that stopped
/// gives it back within a minute.
pub const LOG_IDLE: Duration = Duration::from_secs(30);

/// Where a noted range lies.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// Logical `(start, len)` inside a block group.
    Logical(u64, u64),
    /// `(devid, offset, len)` of a group given back to unallocated space.
    Device(u64, u64, u64),
}

/// The engine's discard state: the mode and the ranges waiting.
#[derive(Default)]
pub(crate) struct Discards {
    mode: AtomicU8,
    waiting: Mutex<VecDeque<(Instant, Place)>>,
    /// Space the log freed, held while the log is written
    /// ([`DiscardPass::log_idle`]).
    log_space: Mutex<Vec<(u64, u64)>>,
    /// When a log write was last sent.
    last_log_write: Mutex<Option<Instant>>,
}

impl Discards {
    /// Told by each log write that goes out (`txn::log`).
    pub(crate) fn note_log_write(&self) {
        *crate::sync::lock(&self.last_log_write) = Some(Instant::now());
    }

    /// Whether no log write has come for `idle` (or ever).
    fn log_idle_for(&self, idle: Duration, now: Instant) -> bool {
        crate::sync::lock(&self.last_log_write).is_none_or(|at| now.duration_since(at) >= idle)
    }
}

impl Engine {
    /// Sets how freed space reaches the storage from now on.
    pub fn set_discard(&self, mode: DiscardMode) -> Result<()> {
        if self.read_only && mode != DiscardMode::Off {
            return Err(Error::ReadOnly);
        }
        self.discards.mode.store(mode.to_u8(), Ordering::Relaxed);
        let mut st = crate::sync::write(&self.state);
        st.alloc.track_untrimmed(mode != DiscardMode::Off);
        if mode == DiscardMode::Off {
            crate::sync::lock(&self.discards.waiting).clear();
            crate::sync::lock(&self.discards.log_space).clear();
        }
        Ok(())
    }

    pub fn discard_mode(&self) -> DiscardMode {
        DiscardMode::from_u8(self.discards.mode.load(Ordering::Relaxed))
    }

    /// Discards the noted ranges that have been free for `pass.delay`,
    /// in at most `pass.batches` batches; the rest wait for the next
    /// call. Pieces reused meanwhile are passed over, and so are pieces
    /// shorter than `pass.min_len`.
    pub fn discard_freed(&self, pass: DiscardPass) -> Result<Trimmed> {
        let mut done = Trimmed::default();
        for _ in 0..pass.batches {
            if self.discard_mode() == DiscardMode::Off {
                break;
            }
            self.check_alive()?;
            let mut st = crate::sync::write(&self.state);
            let noted = st.alloc.take_untrimmed();
            let batch = self.due_batch(noted, &pass);
            if batch.is_empty() {
                break;
            }
            let mut logical = Vec::new();
            for place in batch {
                match place {
                    Place::Logical(start, len) => logical.push((start, len)),
                    Place::Device(devid, offset, len) => {
                        self.discard_unallocated(&st.alloc, (devid, offset, len), &pass, &mut done)?
                    }
                }
            }
            let pieces = free_pieces(&st.alloc, &logical, &pass);
            self.discard_sparing_lock(st, &pieces, |pieces| {
                for (s, l) in join(pieces.to_vec()) {
                    let ok = self.shared.dev.discard(s, l)?;
                    self.note_support(ok, l, &mut done);
                }
                Ok(())
            })?;
        }
        Ok(done)
    }

    /// Runs `send`, which discards the free `pieces`, outside the state
    /// lock `st` when the allocator can keep them from allocations
    /// meanwhile ([`Allocator::begin_discard`]), so a slow discard (a
    /// round trip per RBD object, or a full cluster that holds it)
    /// stalls no other operation; under it when the space cannot be
    /// spared.
    pub(super) fn discard_sparing_lock(
        &self,
        mut st: std::sync::RwLockWriteGuard<'_, super::State>,
        pieces: &[(u64, u64)],
        send: impl FnOnce(&[(u64, u64)]) -> Result<()>,
    ) -> Result<()> {
        if !st.alloc.begin_discard(pieces) {
            return send(pieces);
        }
        drop(st);
        let sent = send(pieces);
        crate::sync::write(&self.state).alloc.end_discard(pieces);
        sent
    }

    /// `discard=async`'s last turn, after the final commit: what waits
    /// (the log's held space included) would otherwise stay on the
    /// storage until a trim.
    pub(super) fn discard_at_close(&self) {
        if self.discard_mode() != DiscardMode::Async {
            return;
        }
        if let Err(e) = self.discard_freed(DiscardPass::AT_CLOSE) {
            tracing::warn!(error = %e, "discarding freed space at unmount failed");
        }
    }

    /// `discard=sync`'s step after a commit: everything reusable now.
    pub(super) fn discard_after_commit(&self) {
        if self.discard_mode() != DiscardMode::Sync {
            return;
        }
        if let Err(e) = self.discard_freed(DiscardPass::ALL) {
            tracing::warn!(error = %e, "discarding the space a commit freed failed");
        }
    }

    /// Queues what the allocator noted and takes the due ranges of one
    /// batch, merged where they touch.
    fn due_batch(&self, noted: Untrimmed, pass: &DiscardPass) -> Vec<Place> {
        let now = Instant::now();
        let mut waiting = crate::sync::lock(&self.discards.waiting);
        let logical = noted.logical.into_iter().map(|(s, l)| Place::Logical(s, l));
        let device = noted
            .device
            .into_iter()
            .map(|(d, o, l)| Place::Device(d, o, l));
        waiting.extend(logical.chain(device).map(|p| (now, p)));
        let log_space = self.log_space_due(noted.log, pass, now);
        waiting.extend(
            log_space
                .into_iter()
                .map(|(s, l)| (now, Place::Logical(s, l))),
        );
        if waiting.len() > WAITING_MAX {
            // Nobody has taken any for long: keep the ranges, joined.
            let all: Vec<Place> = waiting.drain(..).map(|w| w.1).collect();
            waiting.extend(merge(all).into_iter().map(|p| (now, p)));
        }
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        while let Some(&(at, place)) = waiting.front() {
            if now.duration_since(at) < pass.delay
                || batch.len() >= BATCH_RANGES
                || bytes >= BATCH_BYTES
            {
                break;
            }
            waiting.pop_front();
            bytes += match place {
                Place::Logical(_, l) | Place::Device(_, _, l) => l,
            };
            batch.push(place);
        }
        merge(batch)
    }

    /// Adds `freed`, space the log freed, to what is held, and returns
    /// what is held once the pass lets it go: once the log has been idle
    /// as long as the pass asks.
    fn log_space_due(
        &self,
        freed: Vec<(u64, u64)>,
        pass: &DiscardPass,
        now: Instant,
    ) -> Vec<(u64, u64)> {
        let mut held = crate::sync::lock(&self.discards.log_space);
        held.extend(freed);
        let idle = pass
            .log_idle
            .is_none_or(|idle| self.discards.log_idle_for(idle, now));
        if !idle {
            if held.len() > WAITING_MAX {
                // The log keeps freeing the same blocks: one range each.
                *held = join(std::mem::take(&mut *held));
            }
            return Vec::new();
        }
        join(std::mem::take(&mut *held))
    }

    /// Discards the part of a group given back to unallocated space that
    /// is still unallocated, in pieces of at least the pass's `min_len`.
    /// Under the state lock: no new group may take the space meanwhile.
    fn discard_unallocated(
        &self,
        alloc: &Allocator,
        (devid, offset, len): (u64, u64, u64),
        pass: &DiscardPass,
        done: &mut Trimmed,
    ) -> Result<()> {
        let min_len = pass.min_len.max(1);
        let Some(dev) = self.shared.dev.device(devid) else {
            return Ok(());
        };
        let _pass = self.shared.dev.pass();
        for (s, l) in alloc.unallocated_ranges(devid) {
            let (a, b) = (s.max(offset), (s + l).min(offset + len));
            if b > a && b - a >= min_len {
                let ok = dev.discard(a, b - a)?;
                self.note_support(ok, b - a, done);
            }
        }
        Ok(())
    }

    /// Counts a discard; a device that has none turns discarding off.
    fn note_support(&self, supported: bool, len: u64, done: &mut Trimmed) {
        done.add(len, supported);
        if !supported && self.discard_mode() != DiscardMode::Off {
            tracing::info!(
                "the storage takes no discards: freed space is not discarded on this mount"
            );
            self.discards
                .mode
                .store(DiscardMode::Off.to_u8(), Ordering::Relaxed);
            crate::sync::lock(&self.discards.waiting).clear();
        }
    }
}

/// The free pieces of the logical `ranges` to discard: each free piece of
/// at least `pass.min_len`, with the free space around it to the pass's
/// window boundaries. Disjoint, each inside one group (as
/// [`Allocator::begin_discard`] takes them): the windows are joined before
/// their free space is looked up.
fn free_pieces(alloc: &Allocator, ranges: &[(u64, u64)], pass: &DiscardPass) -> Vec<(u64, u64)> {
    let min_len = pass.min_len.max(1);
    let windows: Vec<(u64, u64)> = ranges
        .iter()
        .flat_map(|&(start, len)| alloc.free_within(start, len))
        .filter(|p| p.1 >= min_len)
        .map(|(s, l)| {
            let (from, to) = widen(s, l, pass.window);
            (from, to - from)
        })
        .collect();
    join(windows)
        .into_iter()
        .flat_map(|(s, l)| alloc.free_within(s, l))
        .collect()
}

/// `[s, s+l)` grown to the `window`-aligned range around it.
fn widen(s: u64, l: u64, window: u64) -> (u64, u64) {
    let window = window.max(1);
    let from = s - s % window;
    let to = (s + l).div_ceil(window).saturating_mul(window);
    (from, to)
}

/// Sorts ranges `(start, len)` and joins those that touch or overlap.
fn join(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut joined: Vec<(u64, u64)> = Vec::new();
    for (s, l) in ranges {
        match joined.last_mut() {
            Some(last) if s <= last.0 + last.1 => last.1 = last.1.max(s + l - last.0),
            _ => joined.push((s, l)),
        }
    }
    joined
}

/// Joins the logical ranges that touch or overlap (device ranges stay as
/// they are).
fn merge(batch: Vec<Place>) -> Vec<Place> {
    let mut logical = Vec::new();
    let mut out = Vec::new();
    for p in batch {
        match p {
            Place::Logical(s, l) => logical.push((s, l)),
            d @ Place::Device(..) => out.push(d),
        }
    }
    out.extend(join(logical).into_iter().map(|(s, l)| Place::Logical(s, l)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_ranges_are_joined_and_device_ranges_kept() {
        let got = merge(vec![
            Place::Logical(8192, 4096),
            Place::Device(2, 0, 100),
            Place::Logical(0, 4096),
            Place::Logical(4096, 4096),
            Place::Logical(20000, 10),
        ]);
        let logical: Vec<_> = got
            .iter()
            .filter_map(|p| match p {
                Place::Logical(s, l) => Some((*s, *l)),
                _ => None,
            })
            .collect();
        assert_eq!(logical, vec![(0, 12288), (20000, 10)]);
        assert_eq!(got.len(), 3);
        assert_eq!(
            join(vec![(10, 5), (0, 20), (30, 1)]),
            vec![(0, 20), (30, 1)]
        );
    }

    #[test]
    fn a_piece_is_widened_to_its_window() {
        assert_eq!(widen(5 << 20, 16384, 4 << 20), (4 << 20, 8 << 20));
        assert_eq!(widen((8 << 20) - 4096, 8192, 4 << 20), (4 << 20, 12 << 20));
        assert_eq!(widen(7, 1, 1), (7, 8));
    }
}
