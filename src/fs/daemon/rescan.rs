//! The quota rescan thread: commits until the rescan the quota tree
//! records is done, each commit counting a batch (`qgroup::account`).

use crate::error::{Error, Result};
use crate::format::tree_id::QUOTA;
use crate::fs::Core;
use crate::txn::Need;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Pause between a rescan's commits, so other work gets the state lock.
const RESCAN_PAUSE: Duration = Duration::from_millis(5);

impl Core {
    pub(crate) fn spawn_rescan(self: &Arc<Self>) -> Result<()> {
        let core = self.clone();
        self.rescan_thread
            .start_unless_running("quota-rescan", move |stop| {
                if let Err(e) = core.rescan_until_done(stop) {
                    tracing::error!(error = %e, "quota rescan stopped");
                }
            })
    }

    /// Commits until the rescan is done (each commit counts a batch) or
    /// `stop` is set.
    pub(crate) fn rescan_until_done(&self, stop: &AtomicBool) -> Result<()> {
        while !stop.load(Ordering::SeqCst) {
            if self.remounted_ro.load(Ordering::Relaxed) {
                return Err(Error::ReadOnly);
            }
            let running = self.engine.read(|r| Ok(r.qgroups().rescan_cursor()))?;
            if running.is_none() {
                return Ok(());
            }
            self.engine.write(|tx| {
                tx.reserve(&Need::items(QUOTA, 1))?;
                tx.quota_rescan_touch()
            })?;
            self.engine.commit()?;
            std::thread::sleep(RESCAN_PAUSE);
        }
        Ok(())
    }
}
