//! The daemon's background threads, all in this module:
//!
//! - `cleaner`: frees the blocks of deleted subvolumes (the drop queue),
//!   started at mount, woken by each deletion;
//! - `balance`: runs the engine's balance steps (`crate::balance`),
//!   started by `canopy balance start` or at mount for a balance an
//!   earlier mount left recorded;
//! - `rescan`: counts the quota groups afresh in committed batches
//!   (`canopy quota rescan`).
//!
//! Each is asked to stop at unmount and leaves its work recorded on disk
//! to carry on later. The periodic commit and the control socket are the
//! FUSE front's (`fuse::mount`, `fuse::control`): they serve the mount, not
//! the filesystem. [`Worker`] is the handle of a balance or rescan thread.

mod balance;
mod cleaner;
mod rescan;

pub use cleaner::Cleaner;
pub(crate) use cleaner::Wake;

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One background thread, if started: its stop flag and handle.
#[derive(Default)]
pub(crate) struct Worker(Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>);

impl Worker {
    /// Starts `run` as thread `name`; `run` returns once its stop flag is
    /// set or its work is done.
    pub fn start(&self, name: &str, run: impl FnOnce(&AtomicBool) + Send + 'static) -> Result<()> {
        let mut slot = crate::sync::lock(&self.0);
        *slot = Some(spawn(name, run)?);
        Ok(())
    }

    /// [`Worker::start`] unless the thread is still running.
    pub fn start_unless_running(
        &self,
        name: &str,
        run: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> Result<()> {
        let mut slot = crate::sync::lock(&self.0);
        if slot.as_ref().is_some_and(|(_, h)| !h.is_finished()) {
            return Ok(());
        }
        *slot = Some(spawn(name, run)?);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        crate::sync::lock(&self.0)
            .as_ref()
            .is_some_and(|(_, h)| !h.is_finished())
    }

    /// Waits for the thread to end by itself.
    pub fn join(&self) {
        let running = crate::sync::lock(&self.0).take();
        if let Some((_, h)) = running {
            let _ = h.join();
        }
    }

    /// Asks the thread to stop and waits for it.
    pub fn stop(&self) {
        let running = crate::sync::lock(&self.0).take();
        if let Some((stop, h)) = running {
            stop.store(true, Ordering::SeqCst);
            let _ = h.join();
        }
    }
}

fn spawn(
    name: &str,
    run: impl FnOnce(&AtomicBool) + Send + 'static,
) -> Result<(Arc<AtomicBool>, JoinHandle<()>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || run(&flag))
        .map_err(|e| Error::io(format!("starting the {name} thread"), e))?;
    Ok((stop, handle))
}
