//! `canopy balance` as the mounted filesystem answers it: start, status,
//! pause, resume and cancel. The steps run in the daemon's balance thread
//! (`fs::daemon`), committing as they go. A balance recorded by an
//! earlier mount (unmounted or crashed mid-way) is carried on at mount
//! unless it was paused.

use super::{Core, Fs};
use crate::balance::{self, BalanceArgs};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

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

impl Fs {
    /// Records a balance of the groups `args` chooses and starts moving
    /// their extents in the background. Returns the number of groups.
    pub fn balance_start(&self, args: BalanceArgs) -> Result<u64> {
        self.core.check_balance_writable()?;
        self.check_no_replace()?;
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
}

impl Core {
    pub(crate) fn balance_status(&self) -> std::sync::MutexGuard<'_, BalanceStatus> {
        crate::sync::lock(&self.balance_status)
    }

    pub(super) fn check_balance_writable(&self) -> Result<()> {
        if self.remounted_ro.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }
}
