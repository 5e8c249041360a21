//! `canopy balance`: runs the engine's balance steps (`crate::balance`)
//! in a thread of the daemon, committing as it goes, with status, pause,
//! resume and cancel. A balance recorded by an earlier mount (unmounted
//! or crashed mid-way) is carried on at mount unless it was paused.

use super::{Core, Fs};
use crate::balance::{self, BalanceArgs, Step};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceState {
    #[default]
    Idle,
    Running,
    Paused,
    Finished,
    Cancelled,
    Failed,
}

/// What `canopy balance status` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceStatus {
    pub state: BalanceState,
    pub args: Option<BalanceArgs>,
    /// Groups chosen when this run (or its resumption) began, and those
    /// still to empty.
    pub groups_total: u64,
    pub groups_left: u64,
    pub extents_moved: u64,
    pub bytes_moved: u64,
    /// Groups left as they were for want of room to move their extents
    /// elsewhere; the balance ends as failed once the others are done.
    #[serde(default)]
    pub groups_no_space: u64,
    pub error: Option<String>,
}

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
    /// Records a balance of the groups `args` chooses and starts moving
    /// their extents in the background. Returns the number of groups.
    pub fn balance_start(&self, args: BalanceArgs) -> Result<u64> {
        self.core.check_balance_writable()?;
        // Blocks of deleted subvolumes are not extents balance can move:
        // free them first.
        self.clean_deleted()?;
        let n = self
            .core
            .write_retrying(|tx| balance::start(tx, args).map(|n| n as u64))?;
        self.core.engine.commit()?;
        self.spawn_balance(args, n)?;
        Ok(n)
    }

    /// Carries on a paused balance, or one an earlier mount left.
    pub fn balance_resume(&self) -> Result<()> {
        self.core.check_balance_writable()?;
        self.core.balance_thread.stop();
        let rec = self
            .core
            .write_retrying(|tx| balance::set_paused(tx, false))?;
        self.core.engine.commit()?;
        self.spawn_balance(rec.args, rec.groups.len() as u64)
    }

    /// Stops moving extents; the balance stays recorded (even across
    /// unmount) until resumed or cancelled.
    pub fn balance_pause(&self) -> Result<()> {
        self.core.balance_thread.stop();
        self.core
            .write_retrying(|tx| balance::set_paused(tx, true).map(drop))?;
        self.core.engine.commit()?;
        self.core.balance_status().state = BalanceState::Paused;
        Ok(())
    }

    /// Stops and forgets the balance. Groups already emptied stay so.
    pub fn balance_cancel(&self) -> Result<()> {
        self.core.balance_thread.stop();
        self.core.write_retrying(balance::cancel)?;
        self.core.engine.commit()?;
        self.core.balance_status().state = BalanceState::Cancelled;
        Ok(())
    }

    pub fn balance_status(&self) -> BalanceStatus {
        let mut st = self.core.balance_status().clone();
        if st.state == BalanceState::Idle {
            // Recorded by an earlier mount and paused: say so.
            if let Ok(Some(rec)) = self.core.engine.read(balance::recorded) {
                st.state = if rec.paused {
                    BalanceState::Paused
                } else {
                    BalanceState::Running
                };
                st.args = Some(rec.args);
                st.groups_left = rec.groups.len() as u64;
                st.groups_total = st.groups_left;
            }
        }
        st
    }

    /// At mount: carries on a balance an earlier mount left running.
    pub fn balance_resume_if_recorded(&self) -> Result<()> {
        let Some(rec) = self.core.engine.read(balance::recorded)? else {
            return Ok(());
        };
        if rec.paused {
            return Ok(());
        }
        tracing::info!(
            groups = rec.groups.len(),
            "carrying on the balance an earlier mount left"
        );
        self.spawn_balance(rec.args, rec.groups.len() as u64)
    }

    /// Waits for the balance thread to end; its final status.
    pub fn balance_wait(&self) -> BalanceStatus {
        self.core.balance_thread.join();
        self.balance_status()
    }

    /// Stops the balance thread (unmount); the balance stays recorded.
    pub fn balance_stop(&self) {
        self.core.balance_thread.stop();
    }

    /// Starts the balance thread on `groups` groups, the status saying so.
    fn spawn_balance(&self, args: BalanceArgs, groups: u64) -> Result<()> {
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
    fn balance_status(&self) -> std::sync::MutexGuard<'_, BalanceStatus> {
        crate::sync::lock(&self.balance_status)
    }

    fn check_balance_writable(&self) -> Result<()> {
        if self.remounted_ro.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Runs a transaction; on ENOSPC flushes buffered data, commits and
    /// tries once more (as ordinary operations do).
    fn write_retrying<R>(
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
