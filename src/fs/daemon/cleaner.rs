//! The cleaner: frees the blocks of deleted subvolumes in the background.
//!
//! Deleting a subvolume removes its link and its root item in one short
//! commit and queues its root block (`extent::drop`). The cleaner then
//! releases queued blocks in bounded transactions, each committed, so
//! space comes back as it goes while other work keeps running, and an
//! unmount or crash leaves a queue the next mount carries on with.

use crate::error::{Error, Result};
use crate::extent::drop::clean_dropped_step;
use crate::fs::{Core, Fs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long an idle cleaner sleeps before it looks at the queue again
/// (a deletion wakes it at once).
const IDLE: Duration = Duration::from_millis(500);

/// How long the cleaner waits after a failed step before it tries again.
const AFTER_FAILURE: Duration = Duration::from_secs(2);

/// How long `subvolume sync` waits for a cleaner thread that frees
/// nothing before it runs a step itself.
const STUCK: Duration = Duration::from_secs(5);

impl Core {
    /// One bounded cleaner transaction, committed; the blocks still queued.
    pub(crate) fn clean_once(&self) -> Result<u64> {
        clean_dropped_step(&self.engine)
    }
}

impl Fs {
    /// Tree blocks of deleted subvolumes not yet freed.
    pub fn queued_drops(&self) -> u64 {
        self.core.engine.queued_drops()
    }

    /// Frees everything deleted subvolumes still hold, then commits
    /// (`canopy subvolume sync`). With a [`Cleaner`] thread running, waits
    /// for it (two cleaners would only take turns at the state lock and
    /// stall other work twice as often); without one, cleans here.
    /// A thread that stops making progress (a step failing again and
    /// again) is not waited for: the step runs here, and its error is the
    /// answer.
    pub fn clean_deleted(&self) -> Result<()> {
        if self.core.remounted_ro.load(Ordering::Relaxed) && self.queued_drops() > 0 {
            return Err(Error::ReadOnly);
        }
        let mut last = (self.queued_drops(), std::time::Instant::now());
        while self.queued_drops() > 0 {
            let stuck = last.1.elapsed() > STUCK;
            match self.core.running_cleaner() {
                Some(w) if !stuck => {
                    w.notify();
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    self.core.clean_once()?;
                }
            }
            let now = self.queued_drops();
            if now != last.0 {
                last = (now, std::time::Instant::now());
            }
        }
        self.core.sync()
    }

    /// One bounded cleaner step (for tests that interleave it with other
    /// work). Returns the blocks still queued.
    pub fn clean_step(&self) -> Result<u64> {
        self.core.clean_once()
    }
}

/// The daemon's cleaner thread; stops when dropped.
pub struct Cleaner {
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
pub(crate) struct Wake {
    stop: AtomicBool,
    /// The thread is working (false once it stopped, also on a damaged
    /// queue).
    running: AtomicBool,
    pending: Mutex<bool>,
    cond: Condvar,
}

impl Wake {
    fn notify(&self) {
        *crate::sync::lock(&self.pending) = true;
        self.cond.notify_all();
    }

    /// Sleeps up to `d` unless notified meanwhile.
    fn sleep(&self, d: Duration) {
        let mut p = crate::sync::lock(&self.pending);
        if !*p {
            p = self
                .cond
                .wait_timeout(p, d)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        *p = false;
    }
}

impl Cleaner {
    /// Starts cleaning `fs` in the background: at once if an earlier
    /// mount left work, and whenever a subvolume is deleted.
    pub fn start(fs: Arc<Fs>) -> std::io::Result<Cleaner> {
        let wake = Arc::new(Wake::default());
        wake.running.store(true, Ordering::SeqCst);
        *crate::sync::lock(&fs.core.cleaner_wake) = Some(Arc::downgrade(&wake));
        let w = wake.clone();
        let thread = std::thread::Builder::new()
            .name("canopy-cleaner".into())
            .spawn(move || run(&fs, &w))?;
        Ok(Cleaner {
            wake,
            thread: Some(thread),
        })
    }
}

fn run(fs: &Fs, wake: &Wake) {
    work(fs, wake);
    wake.running.store(false, Ordering::SeqCst);
}

fn work(fs: &Fs, wake: &Wake) {
    while !wake.stop.load(Ordering::SeqCst) {
        let core = &fs.core;
        let can_write = !core.engine.is_read_only()
            && !core.remounted_ro.load(Ordering::Relaxed)
            && core.engine.shutdown_reason().is_none();
        if !can_write || core.engine.queued_drops() == 0 {
            wake.sleep(IDLE);
            continue;
        }
        match core.clean_once() {
            Ok(0) => tracing::info!("cleaner: deleted subvolumes are freed"),
            Ok(_) => {}
            Err(e @ Error::Corrupt { .. }) => {
                tracing::error!(error = %e, "cleaner stopped: the drop queue is damaged; run canopy check");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cleaner step failed; trying again later");
                wake.sleep(AFTER_FAILURE);
            }
        }
    }
}

impl Drop for Cleaner {
    fn drop(&mut self) {
        self.wake.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Core {
    /// Tells a running cleaner there is work (a subvolume was deleted).
    pub(crate) fn wake_cleaner(&self) {
        if let Some(w) = self.running_cleaner() {
            w.notify();
        }
    }

    /// The cleaner thread, if one is working and can write (a read-only
    /// remount idles it).
    fn running_cleaner(&self) -> Option<Arc<Wake>> {
        let w = crate::sync::lock(&self.cleaner_wake).clone()?.upgrade()?;
        let idle = self.remounted_ro.load(Ordering::Relaxed);
        (w.running.load(Ordering::SeqCst) && !idle).then_some(w)
    }
}
