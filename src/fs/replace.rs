//! `canopy device replace` as the mounted filesystem answers it: start,
//! status and cancel. The copy runs in the daemon's replace thread
//! (`replace::run`), which then puts the target in the source's place
//! (`Engine::replace_finish`), or gives the replace up when it was
//! cancelled, could not copy everything, or a write to the target failed.
//! An unmount stops the copy and keeps the replace's record; the next
//! mount (as after a crash) resumes it ([`Fs::replace_resume_if_recorded`]).

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
    /// Set with a cancel at unmount: the thread keeps the record.
    suspend: Arc<AtomicBool>,
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
        let failed =
            self.core
                .engine
                .replace_begin(source, target.clone(), &name, opts.avoid_source)?;
        self.spawn_replace(source, target, name, opts, failed)
    }

    /// Resumes the replace an earlier mount recorded (cut short by an
    /// unmount or a crash), opening its target with `open` by the name it
    /// was given. A target that cannot be opened, or is not the one the
    /// replace began with, gives the replace up (the filesystem stays on
    /// the source) and says why.
    pub fn replace_resume_if_recorded(
        &self,
        open: impl FnOnce(&str) -> Result<Arc<dyn Device>>,
    ) -> Result<()> {
        let engine = &self.core.engine;
        let Some(record) = engine.recorded_replace()? else {
            return Ok(());
        };
        let name = String::from_utf8_lossy(&record.name).into_owned();
        let opened = open(&name);
        let resumed = opened
            .as_ref()
            .map_err(|e| Error::Invalid(format!("opening {name}: {e}")))
            .and_then(|t| engine.replace_resume(t.clone()));
        let (record, failed) = match resumed {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(target = %name, error = %e, "device replace cannot resume; giving it up");
                return engine.replace_abandon(opened.ok());
            }
        };
        let opts = Options {
            avoid_source: record.avoid_source,
        };
        let target = opened?;
        self.spawn_replace(record.source, target, name, opts, failed)
    }

    /// Starts the replace thread over a target the engine writes to.
    fn spawn_replace(
        &self,
        source: u64,
        target: Arc<dyn Device>,
        name: String,
        opts: Options,
        failed: Arc<AtomicBool>,
    ) -> Result<()> {
        let ctl = Arc::new(Control::default());
        let suspend = Arc::new(AtomicBool::new(false));
        *crate::sync::lock(&self.core.replace_job) = ReplaceJob {
            ctl: Some(ctl.clone()),
            suspend: suspend.clone(),
            status: ReplaceStatus {
                state: ReplaceState::Running,
                source: Some(source),
                target: Some(name.clone()),
                ..ReplaceStatus::default()
            },
        };
        let (engine, job) = (self.core.engine.clone(), self.core.replace_job.clone());
        let started = self.core.replace_thread.start("replace", move |_| {
            let run = Run {
                engine: &engine,
                source,
                name,
                ctl: &ctl,
                opts,
                failed: &failed,
                suspend: &suspend,
            };
            let (report, outcome) = run.copy_and_finish();
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
        started.inspect_err(|_| {
            let _ = self.core.engine.replace_abandon(Some(target.clone()));
        })
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
    /// Stops a running replace and waits for its thread (at unmount);
    /// its record stays, so the next mount resumes it.
    pub(super) fn stop_replace(&self) {
        {
            let job = crate::sync::lock(&self.replace_job);
            if let Some(ctl) = &job.ctl {
                job.suspend.store(true, Ordering::SeqCst);
                ctl.cancel();
            }
        }
        self.replace_thread.join();
    }
}

/// What the replace thread works with.
struct Run<'a> {
    engine: &'a Engine,
    source: u64,
    name: String,
    ctl: &'a Control,
    opts: Options,
    /// Set by a failed write to the target.
    failed: &'a AtomicBool,
    /// Set when an unmount stops the copy.
    suspend: &'a AtomicBool,
}

impl Run<'_> {
    /// The copy, then the swap. Returns the copy's report (when it ran)
    /// and whether the replace finished.
    fn copy_and_finish(self) -> (Option<Report>, Result<()>) {
        let report = match replace::run(self.engine, self.source, self.ctl, self.opts) {
            Ok(r) => r,
            Err(e) => {
                self.stop();
                return (None, Err(e));
            }
        };
        let outcome = replace::check_complete(&report).and_then(|()| {
            if self.failed.load(Ordering::SeqCst) {
                return Err(Error::io(
                    "writing the replace target",
                    std::io::Error::other("a write to the target failed (see the daemon's log)"),
                ));
            }
            self.engine.replace_finish(self.name.clone())
        });
        if outcome.is_err() {
            self.stop();
        }
        (Some(report), outcome)
    }

    /// A replace that did not finish: kept for the next mount when an
    /// unmount stopped it, else given up.
    fn stop(&self) {
        if self.suspend.load(Ordering::SeqCst) {
            return self.engine.replace_suspend();
        }
        if let Err(e) = self.engine.replace_abandon(None) {
            tracing::error!(error = %e, "giving the device replace up failed");
        }
    }
}

/// The job's shared slot, for `Core`.
pub(super) type SharedJob = Arc<Mutex<ReplaceJob>>;
