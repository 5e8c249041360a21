//! `canopy device replace` as the mounted filesystem answers it: start,
//! status and cancel. The copy runs in the daemon's replace thread
//! (`replace::run`), which then puts the target in the source's place
//! (`Engine::replace_finish`), or gives the replace up when it was
//! cancelled, could not copy everything, or a write to the target failed.
//! A replace is not recorded on disk: a crash or an unmount midway
//! leaves the filesystem on the source, and the replace starts over.

use super::Fs;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::replace::{self, Options, Report};
use crate::scrub::{Control, Progress};
use crate::txn::Engine;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplaceState {
    #[default]
    Idle,
    Running,
    Finished,
    Cancelled,
    Failed,
}

/// What `canopy device replace status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReplaceStatus {
    pub state: ReplaceState,
    /// The device replaced, and what the target is called.
    pub source: Option<u64>,
    pub target: Option<String>,
    pub progress: Progress,
    /// What the copy did, once it has ended.
    pub report: Option<Report>,
    pub error: Option<String>,
}

/// The replace of this mount: the running copy's control, and the
/// status of the running or last one.
#[derive(Default)]
pub(super) struct ReplaceJob {
    ctl: Option<Arc<Control>>,
    status: ReplaceStatus,
}

impl Fs {
    /// Starts replacing device `source` with `target` (called `name`) in
    /// the background.
    pub fn replace_start(
        &self,
        source: u64,
        target: Arc<dyn Device>,
        name: String,
        opts: Options,
    ) -> Result<()> {
        self.core.check_balance_writable()?;
        self.check_no_replace()?;
        if self.core.engine.read(crate::balance::recorded)?.is_some() {
            return Err(Error::Posix(
                libc::EINPROGRESS,
                "a balance is recorded: let it finish or cancel it first",
            ));
        }
        let failed = self.core.engine.replace_begin(source, target, &name)?;
        let ctl = Arc::new(Control::default());
        *crate::sync::lock(&self.core.replace_job) = ReplaceJob {
            ctl: Some(ctl.clone()),
            status: ReplaceStatus {
                state: ReplaceState::Running,
                source: Some(source),
                target: Some(name.clone()),
                ..ReplaceStatus::default()
            },
        };
        let (engine, job) = (self.core.engine.clone(), self.core.replace_job.clone());
        let started = self.core.replace_thread.start("replace", move |_| {
            let (report, outcome) = copy_and_finish(&engine, source, name, &ctl, opts, &failed);
            let mut job = crate::sync::lock(&job);
            job.status.progress = ctl.progress();
            job.status.report = report;
            job.status.state = match &outcome {
                Ok(()) => ReplaceState::Finished,
                Err(Error::Posix(libc::ECANCELED, _)) => ReplaceState::Cancelled,
                Err(_) => ReplaceState::Failed,
            };
            job.status.error = outcome.err().map(|e| e.to_string());
            job.ctl = None;
        });
        started.inspect_err(|_| self.core.engine.replace_abandon())
    }

    /// The running replace's progress, or how the last one ended.
    pub fn replace_status(&self) -> ReplaceStatus {
        let job = crate::sync::lock(&self.core.replace_job);
        let mut st = job.status.clone();
        if let Some(ctl) = &job.ctl {
            st.progress = ctl.progress();
        }
        st
    }

    /// Asks the running replace to stop; it gives up at its next batch.
    pub fn replace_cancel(&self) -> Result<()> {
        match &crate::sync::lock(&self.core.replace_job).ctl {
            Some(ctl) => {
                ctl.cancel();
                Ok(())
            }
            None => Err(Error::Invalid("no device replace is running".into())),
        }
    }

    /// Refuses work that changes which devices hold what (a balance, a
    /// device added or removed) while a replace runs.
    pub(super) fn check_no_replace(&self) -> Result<()> {
        match self.core.engine.replace_source() {
            Some(_) => Err(Error::Posix(libc::EBUSY, "a device replace is running")),
            None => Ok(()),
        }
    }
}

impl super::Core {
    /// Cancels a running replace and waits for its thread (at unmount).
    pub(super) fn stop_replace(&self) {
        if let Some(ctl) = &crate::sync::lock(&self.replace_job).ctl {
            ctl.cancel();
        }
        self.replace_thread.join();
    }
}

/// The replace thread's work: the copy, then the swap. Returns the copy's
/// report (when it ran) and whether the replace finished.
fn copy_and_finish(
    engine: &Engine,
    source: u64,
    name: String,
    ctl: &Control,
    opts: Options,
    failed: &AtomicBool,
) -> (Option<Report>, Result<()>) {
    let report = match replace::run(engine, source, ctl, opts) {
        Ok(r) => r,
        Err(e) => {
            engine.replace_abandon();
            return (None, Err(e));
        }
    };
    let outcome = replace::check_complete(&report).and_then(|()| {
        if failed.load(Ordering::SeqCst) {
            return Err(Error::io(
                "writing the replace target",
                std::io::Error::other("a write to the target failed (see the daemon's log)"),
            ));
        }
        engine.replace_finish(name)
    });
    if outcome.is_err() {
        engine.replace_abandon();
    }
    (Some(report), outcome)
}

/// The job's shared slot, for `Core`.
pub(super) type SharedJob = Arc<Mutex<ReplaceJob>>;
