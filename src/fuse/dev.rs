//! The /dev/fuse transport: each thread reads a request, serves it and
//! writes the reply, on its own clone of the session's descriptor.
//! Under io_uring one such thread stays, for what the rings do not carry
//! (FORGET, INTERRUPT, and anything sent before the rings are ready).

use super::session::{self, Carrier, Handler, Running};
use crate::error::Result;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// `count` threads on /dev/fuse, chosen for `why`.
pub struct Threads {
    pub count: usize,
    pub why: String,
}

impl Carrier for Threads {
    fn init_flags(&self) -> u64 {
        0
    }

    fn carry(self: Box<Self>, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()> {
        start(running, handler, self.count)
    }

    fn describe(&self) -> String {
        format!("/dev/fuse, {} threads ({})", self.count.max(1), self.why)
    }
}

/// Starts `threads` readers on the session `running.fd`.
pub fn start(running: &mut Running, handler: Arc<dyn Handler>, threads: usize) -> Result<()> {
    for i in 0..threads.max(1) {
        // The first thread reads the mount's own descriptor; the others
        // clones, so no two threads queue on one descriptor.
        let fd: Arc<OwnedFd> = if i == 0 {
            running.fd.clone()
        } else {
            Arc::new(session::clone_fd(running.fd.as_raw_fd())?)
        };
        let h = handler.clone();
        running.spawn(format!("fuse-dev-{i}"), move || serve(&fd, &*h))?;
    }
    Ok(())
}

/// Serves requests from `fd` until the kernel ends the session.
fn serve(fd: &OwnedFd, handler: &dyn Handler) {
    let mut buf = vec![0u8; session::READ_BUFFER];
    while let Some(n) = session::read_request(fd.as_raw_fd(), &mut buf) {
        session::serve_one(fd.as_raw_fd(), &buf[..n], handler);
    }
}
