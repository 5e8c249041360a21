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
//! run) for `busy_poll` before it sleeps in poll(2). An idle mount costs
//! nothing; a busy one spends the poll on CPU time nobody else asked
//! for. The other threads sleep in read(2) as before, for requests that
//! arrive while the first is busy.

use super::session::{self, Carrier, Handler, Read, Running};
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `count` threads on /dev/fuse, chosen for `why`.
pub struct Threads {
    pub count: usize,
    /// How long the first thread polls for a next request (zero: never).
    pub busy_poll: Duration,
    pub why: String,
}

impl Carrier for Threads {
    fn init_flags(&self) -> u64 {
        0
    }

    fn carry(self: Box<Self>, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()> {
        start(running, handler, self.count, self.busy_poll)
    }

    fn describe(&self) -> String {
        let polling = if self.busy_poll.is_zero() {
            String::new()
        } else {
            format!(", the first polling {} µs", self.busy_poll.as_micros())
        };
        format!(
            "/dev/fuse, {} threads{polling} ({})",
            self.count.max(1),
            self.why
        )
    }
}

/// Starts `threads` readers on the session `running.fd`, the first of
/// them polling for `busy_poll` after each request.
pub fn start(
    running: &mut Running,
    handler: Arc<dyn Handler>,
    threads: usize,
    busy_poll: Duration,
) -> Result<()> {
    for i in 0..threads.max(1) {
        let h = handler.clone();
        if i == 0 && !busy_poll.is_zero() {
            // A clone of its own: non-blocking is a property of the
            // open file, and the mount's descriptor stays blocking.
            let fd = Arc::new(session::clone_fd(running.fd.as_raw_fd())?);
            set_nonblocking(fd.as_raw_fd())?;
            running.spawn("fuse-dev-0".into(), move || {
                serve_polling(&fd, &*h, busy_poll)
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
        running.spawn(format!("fuse-dev-{i}"), move || serve(&fd, &*h))?;
    }
    Ok(())
}

/// Serves requests from `fd` until the kernel ends the session.
fn serve(fd: &OwnedFd, handler: &dyn Handler) {
    serve_with(fd, handler, session::read_request);
}

/// Serves requests from the non-blocking `fd`, polling `budget` for
/// the next one after each, until the kernel ends the session.
fn serve_polling(fd: &OwnedFd, handler: &dyn Handler, budget: Duration) {
    serve_with(fd, handler, |fd, buf| poll_request(fd, buf, budget));
}

/// Serves the requests `next` reads from `fd` until it returns None.
fn serve_with(
    fd: &OwnedFd,
    handler: &dyn Handler,
    mut next: impl FnMut(RawFd, &mut [u8]) -> Option<usize>,
) {
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; session::READ_BUFFER];
    while let Some(n) = next(raw, &mut buf) {
        session::serve_one(raw, &buf[..n], handler);
    }
}

/// Reads the next request from the non-blocking `fd`: asks again,
/// yielding the CPU between tries, for `budget`, then sleeps until one
/// is queued. None when the connection is gone.
fn poll_request(fd: RawFd, buf: &mut [u8], budget: Duration) -> Option<usize> {
    let started = Instant::now();
    loop {
        match session::read_once(fd, buf) {
            Read::Request(n) => return Some(n),
            Read::Empty if started.elapsed() < budget => {
                // SAFETY: no arguments; lets a runnable task have the CPU.
                unsafe { libc::sched_yield() };
            }
            Read::Empty => wait_readable(fd),
            Read::Again => {}
            Read::Gone => return None,
        }
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
