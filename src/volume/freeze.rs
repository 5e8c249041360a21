//! Freezing (`canopy filesystem freeze`, what fsfreeze does; FIFREEZE
//! does not reach a FUSE daemon): while frozen, nothing reaches the
//! storage, so a snapshot of it taken meanwhile (`rbd snap create`, an
//! LVM or SAN snapshot) holds exactly the commit the freeze made.
//!
//! Every write, barrier and discard passes the [`Gate`]. A freeze waits
//! for the ones under way, then holds the rest until a thaw, or until its
//! deadline passes: a freeze nobody thaws (the tool that took the
//! snapshot died) must not stop the filesystem for good.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// Frozen until then, unless thawed first.
    frozen_until: Option<Instant>,
    /// Writes, barriers and discards under way.
    busy: usize,
}

#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

/// One write, barrier or discard under way; the gate counts it until
/// it is dropped.
pub struct Passage<'a>(&'a Gate);

impl Drop for Passage<'_> {
    fn drop(&mut self) {
        let mut st = crate::sync::lock(&self.0.state);
        st.busy -= 1;
        if st.busy == 0 {
            self.0.changed.notify_all();
        }
    }
}

impl Gate {
    /// Waits while frozen, then counts the caller as under way.
    pub fn pass(&self) -> Passage<'_> {
        let mut st = crate::sync::lock(&self.state);
        while let Some(until) = st.frozen_until {
            let now = Instant::now();
            if now >= until {
                tracing::warn!("a freeze outlived its timeout without a thaw: thawed");
                st.frozen_until = None;
                self.changed.notify_all();
                break;
            }
            st = self
                .changed
                .wait_timeout(st, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st.busy += 1;
        Passage(self)
    }

    /// Freezes for at most `timeout` and waits for the writes under way.
    /// False if frozen already.
    pub fn freeze(&self, timeout: Duration) -> bool {
        let mut st = crate::sync::lock(&self.state);
        if st.frozen_until.is_some_and(|u| u > Instant::now()) {
            return false;
        }
        st.frozen_until = Some(Instant::now() + timeout);
        while st.busy > 0 {
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        true
    }

    /// Lets everything waiting go on. False if not frozen.
    pub fn thaw(&self) -> bool {
        let mut st = crate::sync::lock(&self.state);
        let was = st.frozen_until.take().is_some_and(|u| u > Instant::now());
        self.changed.notify_all();
        was
    }

    /// How long the freeze lasts yet, if frozen.
    pub fn frozen_for(&self) -> Option<Duration> {
        let st = crate::sync::lock(&self.state);
        st.frozen_until
            .and_then(|u| u.checked_duration_since(Instant::now()))
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_freeze_holds_writers_until_the_thaw() {
        let gate = Arc::new(Gate::default());
        assert!(gate.freeze(Duration::from_secs(30)));
        assert!(!gate.freeze(Duration::from_secs(30)), "frozen twice");
        let g = gate.clone();
        // Timed from before the spawn: a thread started late under load
        // still waits for the thaw, which comes 200 ms after this.
        let t = Instant::now();
        let writer = std::thread::spawn(move || {
            drop(g.pass());
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!writer.is_finished(), "a write passed a freeze");
        assert!(gate.thaw());
        assert!(writer.join().unwrap() >= Duration::from_millis(200));
        assert!(!gate.thaw(), "thawed twice");
    }

    #[test]
    fn a_freeze_waits_for_writes_under_way_and_ends_at_its_timeout() {
        let gate = Arc::new(Gate::default());
        let under_way = gate.pass();
        let g = gate.clone();
        let freezer = std::thread::spawn(move || g.freeze(Duration::from_millis(300)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!freezer.is_finished(), "froze with a write under way");
        drop(under_way);
        assert!(freezer.join().unwrap());
        assert!(gate.frozen_for().is_some());
        let t = Instant::now();
        drop(gate.pass());
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert!(gate.frozen_for().is_none(), "thawed by its timeout");
    }
}
