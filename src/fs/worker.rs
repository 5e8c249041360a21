//! The daemon's background threads (balance, quota rescan): each is
//! started on request or at mount, asked to stop at unmount, and leaves
//! its work recorded on disk to carry on later.

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
