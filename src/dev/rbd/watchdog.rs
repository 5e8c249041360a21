//! Names a request the cluster has held too long, from a thread of its
//! own. A waiter cannot always say it: a paused cluster (`ceph osd
//! pause`) holds librbd's own calls too, the waiter's look at the
//! exclusive lock included, so the waiter never gets back to look at the
//! clock. Every wait for a request registers here while it lasts; the
//! watchdog wakes every few seconds and warns once for each wait older
//! than [`SLOW_REQUEST`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long a request may wait for the cluster before the daemon says so
/// (an OSD's own "slow request" warning comes at 30 s).
pub(super) const SLOW_REQUEST: Duration = Duration::from_secs(30);

/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// A request being waited for.
struct Waiting {
    since: Instant,
    what: String,
    said: bool,
}

static WAITING: Mutex<BTreeMap<u64, Waiting>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
static STARTED: Once = Once::new();

/// A wait registered with the watchdog; dropping it ends the watch.
pub(super) struct Watched(u64);

impl Drop for Watched {
    fn drop(&mut self) {
        crate::sync::lock(&WAITING).remove(&self.0);
    }
}

/// Watches a wait for the request `what` describes, from now until the
/// returned guard drops.
pub(super) fn watch(what: String) -> Watched {
    STARTED.call_once(start);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let waiting = Waiting {
        since: Instant::now(),
        what,
        said: false,
    };
    crate::sync::lock(&WAITING).insert(id, waiting);
    Watched(id)
}

/// Starts the watchdog thread, which lives as long as the process: it
/// sleeps between looks and holds nothing but the registry's lock,
/// briefly. Without a thread (the system refused one) waits go unnamed,
/// as they did before, and that is said once.
fn start() {
    let spawned = std::thread::Builder::new()
        .name("rbd-watchdog".into())
        .spawn(|| loop {
            std::thread::sleep(LOOK_EVERY);
            look(Instant::now());
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no watchdog thread: requests the cluster holds will not be named");
    }
}

/// Warns once for each wait older than [`SLOW_REQUEST`] at `now`;
/// returns the ones it warned for.
fn look(now: Instant) -> Vec<u64> {
    let mut waiting = crate::sync::lock(&WAITING);
    let mut said = Vec::new();
    for (&id, w) in waiting.iter_mut() {
        let waited = now.saturating_duration_since(w.since);
        if !w.said && waited >= SLOW_REQUEST {
            w.said = true;
            said.push(id);
            tracing::warn!(
                request = %w.what,
                waited_secs = waited.as_secs(),
                "the Ceph cluster has not answered a request yet: writes and fsyncs wait for it \
                 (a full pool or cluster holds writes until space is freed, and a paused one \
                 everything; `ceph health detail` says which)"
            );
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::{look, watch, SLOW_REQUEST};
    use std::time::{Duration, Instant};

    #[test]
    fn a_wait_is_named_once_after_the_slow_request_time_and_forgotten_when_it_ends() {
        // Other tests' waits may be registered too: look for this one.
        let w = watch("writing 4096 bytes at 0 (watchdog test)".into());
        let fresh = watch("flushing (watchdog test)".into());
        let later = fresh_plus(SLOW_REQUEST - Duration::from_secs(1));
        assert!(!look(later).contains(&fresh.0), "a wait named early");
        let later = fresh_plus(SLOW_REQUEST + Duration::from_secs(1));
        let said = look(later);
        assert!(
            said.contains(&w.0) && said.contains(&fresh.0),
            "held waits not named"
        );
        assert!(!look(later).contains(&w.0), "named twice");
        let id = w.0;
        drop(w);
        assert!(
            !super::WAITING.lock().unwrap().contains_key(&id),
            "kept after its end"
        );
    }

    fn fresh_plus(d: Duration) -> Instant {
        Instant::now() + d
    }
}
