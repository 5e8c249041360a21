//! The balance thread: steps through the engine's balance
//! (`crate::balance`), committing as it goes, and repacks the leaves it
//! left part-empty. `fs::balance` starts, pauses and reports it.

use crate::balance::{self, BalanceArgs, Step};
use crate::error::{Error, Result};
use crate::fs::balance::{BalanceState, BalanceStatus};
use crate::fs::{Core, Fs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Steps between commits. Each step folds its own reference changes
/// (`balance::step`), so a commit holds the state lock for a few ms; each
/// commit makes the next steps copy again every parent and root whose
/// children moved, so fewer commits are faster: 8 steps took 1.8 s for 6k
/// blocks under 64 snapshots, 16 took 1.3 s, 64 took 1.0 s (measured
/// when the commits folded, and held the lock for 100-250 ms).
const STEPS_PER_COMMIT: u32 = 16;

/// Pause after each step. The state lock goes to whoever asks first once
/// it is free, and the balance thread asks again at once: operations
/// waiting for it starved across back-to-back steps (a write waited up
/// to 210 ms under 64 snapshots although no step held the lock 75 ms).
/// The pause lets them in; it costs the balance about a tenth.
const PAUSE_BETWEEN_STEPS: Duration = Duration::from_micros(200);

/// Repack steps (one parent's leaves each) between commits.
const REPACK_STEPS_PER_COMMIT: u32 = 16;

/// Commits in a row that found a group still counting bytes it holds no
/// extent for, before the balance gives up on it.
const MAX_WAITS: u32 = 50;

impl Fs {
    /// Starts the balance thread on `groups` groups, the status saying so.
    pub(crate) fn spawn_balance(&self, args: BalanceArgs, groups: u64) -> Result<()> {
        *self.core.balance_status() = BalanceStatus {
            state: BalanceState::Running,
            args: Some(args),
            groups_total: groups,
            groups_left: groups,
            ..BalanceStatus::default()
        };
        let core = self.core.clone();
        let status = self.core.balance_status.clone();
        self.core.balance_thread.start("balance", move |stop| {
            let r = core.run_balance(stop, &status);
            let mut st = crate::sync::lock(&status);
            match r {
                Ok(true) if st.groups_no_space > 0 => {
                    st.state = BalanceState::Failed;
                    st.error = Some(format!(
                        "{} of {} block groups could not be emptied: no space left on device \
                         for their extents (free some space, or balance fewer groups \
                         with a usage filter)",
                        st.groups_no_space, st.groups_total
                    ));
                }
                Ok(true) => st.state = BalanceState::Finished,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "balance stopped");
                    st.state = BalanceState::Failed;
                    st.error = Some(e.to_string());
                }
            }
        })
    }
}

impl Core {
    /// Runs a transaction; on ENOSPC flushes buffered data, commits and
    /// tries once more (as ordinary operations do).
    pub(crate) fn write_retrying<R>(
        &self,
        mut f: impl FnMut(&mut crate::txn::Txn<'_>) -> Result<R>,
    ) -> Result<R> {
        match self.engine.write(&mut f) {
            Err(Error::NoSpace) => {
                self.flush_all()?;
                self.engine.commit()?;
                self.engine.wait_for_freed_space();
                self.engine.write(f)
            }
            r => r,
        }
    }

    /// Packs the leaves the balance left part-empty (`balance::REPACKED`),
    /// in short transactions. Only an improvement: the balance item is gone
    /// already, so an unmount or crash meanwhile just leaves it undone, and
    /// a full disk ends it early.
    fn repack_after_balance(&self, stop: &AtomicBool) -> Result<()> {
        for tree in balance::REPACKED {
            let mut from = Some(crate::format::Key::MIN);
            let mut since_commit = 0;
            while let Some(key) = from {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                from = match self.engine.write(|tx| balance::repack_step(tx, tree, &key)) {
                    Err(Error::NoSpace) => None,
                    r => r?,
                };
                std::thread::sleep(PAUSE_BETWEEN_STEPS);
                since_commit += 1;
                if since_commit >= REPACK_STEPS_PER_COMMIT {
                    self.engine.commit()?;
                    since_commit = 0;
                }
            }
        }
        self.engine.commit().map(drop)
    }

    /// Steps until the balance ends (true) or `stop` is set (false).
    fn run_balance(&self, stop: &AtomicBool, status: &Mutex<BalanceStatus>) -> Result<bool> {
        let mut since_commit = 0;
        let mut waits = 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                self.engine.commit()?;
                return Ok(false);
            }
            let step = match self.write_retrying(balance::step) {
                Err(Error::NoSpace) => {
                    // No group left to skip: the step that failed was the
                    // last one (removing the balance item).
                    let group = self
                        .write_retrying(balance::skip_group)?
                        .ok_or(Error::NoSpace)?;
                    tracing::warn!(group, "no room to empty a block group: balance skips it");
                    let mut st = crate::sync::lock(status);
                    st.groups_no_space += 1;
                    st.groups_left = st.groups_left.saturating_sub(1);
                    waits = 0;
                    continue;
                }
                r => r?,
            };
            std::thread::sleep(PAUSE_BETWEEN_STEPS);
            since_commit += 1;
            match step {
                Step::Moved { moved, .. } => {
                    waits = 0;
                    let mut st = crate::sync::lock(status);
                    st.extents_moved += moved.extents;
                    st.bytes_moved += moved.bytes;
                }
                Step::Emptied { .. } => {
                    waits = 0;
                    let mut st = crate::sync::lock(status);
                    st.groups_left = st.groups_left.saturating_sub(1);
                }
                Step::Waiting { group, used } => {
                    waits += 1;
                    if waits > MAX_WAITS {
                        return Err(Error::Invalid(format!(
                            "block group at {group} still counts {used} bytes that balance cannot move"
                        )));
                    }
                    // Unfinished flushes and freed space settle at a
                    // commit; blocks of deleted subvolumes with the cleaner.
                    self.flush_all()?;
                    while self.engine.queued_drops() > 0 {
                        self.clean_once()?;
                    }
                    self.engine.commit()?;
                    since_commit = 0;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Step::Finished => {
                    self.engine.commit()?;
                    crate::sync::lock(status).groups_left = 0;
                    self.repack_after_balance(stop)?;
                    return Ok(true);
                }
                Step::Idle => return Ok(false),
            }
            if since_commit >= STEPS_PER_COMMIT {
                self.engine.commit()?;
                since_commit = 0;
            }
        }
    }
}
