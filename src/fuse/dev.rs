//! The /dev/fuse transport: each thread reads a request, serves it and
//! writes the reply, on its own clone of the session's descriptor.
//! Under io_uring one such thread stays, for what the rings do not carry
//! (FORGET, INTERRUPT, and anything sent before the rings are ready).
//!
//! **Busy polling** (`busy_poll=`). A process walking or changing a tree
//! sends one request at a time and waits for each answer. A reader
//! asleep in read(2) is woken by the kernel on whichever CPU is idle,
//! and on a virtual machine waking an idle (halted) virtual CPU costs
//! tens of microseconds, more than the request's own work: on the 2-core
//! machines Canopy is measured on, pinning the daemon and the caller to
//! one CPU tripled the creates per second. So the first thread, after
//! each request, keeps asking for the next one without sleeping
//! (non-blocking reads, yielding the CPU to anything else that wants to
//! run) for a while before it sleeps in poll(2). The other threads
//! sleep in read(2) as before, for requests that arrive while the first
//! is busy. (Taking turns to poll, each thread handing the poll on
//! before it served what it read, was slower under pgbench: 2,300-2,500
//! transactions per second against 2,750-2,850: the hand-overs are
//! wake-ups too, one for every request.)
//!
//! How long it polls adapts, as the kernel's haltpoll governor adapts a
//! virtual CPU's poll before it halts ([`Window`]): from 50 µs, doubled
//! each time the next request came after the poll gave up but within
//! `busy_poll` of its start (a longer poll would have caught it), halved
//! each time it came later than that. A tree walk's requests come within
//! the first 50 µs; a database's, spaced by its own fsyncs and CPU work,
//! a few hundred microseconds to a few milliseconds apart, and the
//! poll grows to meet them. An idle mount costs nothing: the poll gives
//! up after at most `busy_poll` and sleeps until the next request.

use super::session::{self, Carrier, Handler, Read, Running};
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `count` threads on /dev/fuse, growing to `most` while every one is
/// busy, chosen for `why`.
pub struct Threads {
    pub count: usize,
    pub most: usize,
    /// The longest the first thread polls for a next request (zero:
    /// never).
    pub busy_poll: Duration,
    pub why: String,
}

impl Carrier for Threads {
    fn init_flags(&self) -> u64 {
        0
    }

    fn carry(self: Box<Self>, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()> {
        start(running, handler, (self.count, self.most), self.busy_poll)
    }

    fn describe(&self) -> String {
        let polling = if self.busy_poll.is_zero() {
            String::new()
        } else {
            format!(
                ", the first polling up to {} µs",
                self.busy_poll.as_micros()
            )
        };
        format!(
            "/dev/fuse, {} threads, up to {} while all are busy{polling} ({})",
            self.count.max(1),
            self.most.max(self.count).max(1),
            self.why
        )
    }
}

/// Starts `threads.0` readers on the session `running.fd`, the first of
/// them polling for up to `busy_poll` after each request, and more while
/// every one is busy, up to `threads.1` in all (see [`Pool`]).
pub fn start(
    running: &mut Running,
    handler: Arc<dyn Handler>,
    threads: (usize, usize),
    busy_poll: Duration,
) -> Result<()> {
    let first = threads.0.max(1);
    let pool = Arc::new(Pool {
        idle: AtomicUsize::new(0),
        started: AtomicUsize::new(first),
        most: threads.1.max(first),
        fd: running.fd.clone(),
        handler: handler.clone(),
        late: running.late_threads(),
    });
    for i in 0..first {
        let pool = pool.clone();
        if i == 0 && !busy_poll.is_zero() {
            // A clone of its own: non-blocking is a property of the open
            // file, and the mount's descriptor stays blocking.
            let fd = Arc::new(session::clone_fd(running.fd.as_raw_fd())?);
            set_nonblocking(fd.as_raw_fd())?;
            running.spawn("fuse-dev-0".into(), move || {
                let mut window = Window::new(busy_poll);
                pool.serve(&fd, |fd, buf| poll_request(fd, buf, &mut window));
            })?;
            continue;
        }
        // The first thread reads the mount's own descriptor; the others
        // clones, so no two threads queue on one descriptor.
        let fd: Arc<OwnedFd> = if i == 0 {
            running.fd.clone()
        } else {
            Arc::new(session::clone_fd(running.fd.as_raw_fd())?)
        };
        running.spawn(format!("fuse-dev-{i}"), move || {
            pool.serve(&fd, session::read_request)
        })?;
    }
    Ok(())
}

/// The readers of one session. A reader serving a request serves nothing
/// else until it has answered, and an fsync waits for its log write (on
/// RBD, milliseconds), so a fixed few readers let only that many fsyncs
/// wait at once and the rest queue in the kernel, unseen by the log
/// write that could carry them (16 fio jobs on RBD: 801 fsyncs a second
/// with 4 readers, 1,950 with 16). So a reader that takes a request
/// while no other is waiting for one starts another first, up to
/// `max_threads`, as libfuse's loop starts a worker when none is idle.
/// Readers started so stay until the session ends: an idle reader
/// sleeps in read(2) and costs its stack and buffers only.
struct Pool {
    /// Readers waiting for a request.
    idle: AtomicUsize,
    /// Readers started, or being started.
    started: AtomicUsize,
    most: usize,
    /// The session's descriptor, cloned for each new reader.
    fd: Arc<OwnedFd>,
    handler: Arc<dyn Handler>,
    /// Where the session finds the readers started late, to join them.
    late: session::LateThreads,
}

impl Pool {
    /// Serves the requests `next` reads from `fd` until it returns None.
    fn serve(
        self: &Arc<Pool>,
        fd: &OwnedFd,
        mut next: impl FnMut(RawFd, &mut [u8]) -> Option<usize>,
    ) {
        let raw = fd.as_raw_fd();
        let mut buf = vec![0u8; session::READ_BUFFER];
        let mut out = vec![0u8; crate::fuse::MAX_WRITE as usize];
        loop {
            self.idle.fetch_add(1, Ordering::SeqCst);
            let read = next(raw, &mut buf);
            let was_idle = self.idle.fetch_sub(1, Ordering::SeqCst);
            let Some(n) = read else {
                return;
            };
            if was_idle == 1 {
                self.grow();
            }
            session::serve_one(raw, &buf[..n], &mut out, &*self.handler);
        }
    }

    /// Starts one more reader, unless `most` are started; a reader that
    /// cannot be started is logged, and the others go on.
    fn grow(self: &Arc<Pool>) {
        let i = self.started.fetch_add(1, Ordering::SeqCst);
        if i >= self.most {
            self.started.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let pool = self.clone();
        let started = session::clone_fd(self.fd.as_raw_fd()).and_then(|fd| {
            std::thread::Builder::new()
                .name(format!("fuse-dev-{i}"))
                .spawn(move || pool.serve(&fd, session::read_request))
                .map_err(|e| Error::io("starting a FUSE thread", e))
        });
        match started {
            Ok(t) => crate::sync::lock(&self.late).push(t),
            Err(e) => {
                self.started.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(error = %e, "another /dev/fuse reader could not start");
            }
        }
    }
}

/// Reads the next request from the non-blocking `fd`: asks again,
/// yielding the CPU between tries, for the `window`, then sleeps until
/// one is queued and tells the window how long that took. The request
/// that woke the poller may have gone to a sleeping reader meanwhile:
/// then it sleeps again, and the window is told only of the first wait.
/// None when the connection is gone.
fn poll_request(fd: RawFd, buf: &mut [u8], window: &mut Window) -> Option<usize> {
    let started = Instant::now();
    let budget = window.length();
    let mut slept = false;
    loop {
        match session::read_once(fd, buf) {
            Read::Request(n) => return Some(n),
            Read::Empty if !slept && started.elapsed() < budget => {
                // SAFETY: no arguments; lets a runnable task have the CPU.
                unsafe { libc::sched_yield() };
            }
            Read::Empty => {
                wait_readable(fd);
                if !slept {
                    window.missed(started.elapsed());
                    slept = true;
                }
            }
            Read::Again => {}
            Read::Gone => return None,
        }
    }
}

/// How long the poller asks for the next request before it sleeps.
/// Grown when a longer poll would have caught the request that came,
/// shrunk when none as long as allowed would have, so it follows the
/// spacing of the requests a busy mount receives and falls back to the
/// floor when they stop (haltpoll's rule for a CPU's poll before it
/// halts, applied to a reader's poll before it sleeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    length: Duration,
    floor: Duration,
    ceiling: Duration,
}

/// Where the window starts and the least it shrinks to: longer than the
/// time a process takes between two requests of a metadata walk (a
/// create is four).
const WINDOW_FLOOR: Duration = Duration::from_micros(50);

impl Window {
    /// A window that may grow to `ceiling` (`busy_poll`).
    fn new(ceiling: Duration) -> Self {
        let floor = WINDOW_FLOOR.min(ceiling);
        Window {
            length: floor,
            floor,
            ceiling,
        }
    }

    fn length(&self) -> Duration {
        self.length
    }

    /// The poll gave up, and the next request came `waited` after the
    /// poll began.
    fn missed(&mut self, waited: Duration) {
        self.length = if waited <= self.ceiling {
            (self.length * 2).min(self.ceiling)
        } else {
            (self.length / 2).max(self.floor)
        };
    }
}

/// Sleeps until `fd` has a request (or the connection ends: the read
/// that follows then says so).
fn wait_readable(fd: RawFd) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; an error (EINTR) only means reading again.
    unsafe { libc::poll(&mut pfd, 1, -1) };
}

fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor this thread owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::io(
            "making a /dev/fuse clone non-blocking",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_window_grows_to_catch_requests_spaced_within_the_ceiling() {
        let mut w = Window::new(2 * MS);
        assert_eq!(w.length(), WINDOW_FLOOR);
        // Requests 700 µs apart: each miss doubles the window until it
        // is longer than the spacing, and then nothing is missed.
        let spacing = Duration::from_micros(700);
        let mut misses = 0;
        while w.length() < spacing {
            w.missed(spacing);
            misses += 1;
        }
        assert_eq!(misses, 4, "50 µs doubled four times passes 700 µs");
        assert_eq!(w.length(), Duration::from_micros(800));
        for _ in 0..10 {
            w.missed(Duration::from_micros(1900));
        }
        assert_eq!(w.length(), 2 * MS, "never past the ceiling");
    }

    #[test]
    fn the_window_falls_back_to_the_floor_when_requests_stop() {
        let mut w = Window::new(2 * MS);
        for _ in 0..10 {
            w.missed(MS);
        }
        assert_eq!(w.length(), 2 * MS);
        let mut sleeps = 0;
        while w.length() > WINDOW_FLOOR {
            w.missed(Duration::from_secs(1));
            sleeps += 1;
        }
        assert_eq!(sleeps, 6, "2 ms halved six times reaches the floor");
        w.missed(Duration::from_secs(1));
        assert_eq!(w.length(), WINDOW_FLOOR, "never below the floor");
    }

    #[test]
    fn a_ceiling_under_the_floor_is_a_fixed_window() {
        let c = Duration::from_micros(20);
        let mut w = Window::new(c);
        assert_eq!(w.length(), c);
        w.missed(Duration::from_micros(10));
        w.missed(Duration::from_secs(1));
        assert_eq!(w.length(), c);
    }
}
