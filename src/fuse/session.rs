//! A FUSE session: the INIT handshake, then requests served by a
//! transport (`dev`: reads and writes on /dev/fuse; `uring`: FUSE over
//! io_uring) until the kernel ends the connection.
//!
//! The handshake is read and answered here, on the mount's own
//! descriptor, before any transport thread starts: what INIT agrees
//! (the writeback cache, io_uring, the largest write) decides how the
//! rest is served.

use super::proto::{self, init};
use super::reply::{self, Reply};
use super::request::{self, Header, Op};
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Serves decoded requests. `FuseFs` is the one implementation; the
/// trait keeps the transports free of filesystem knowledge.
pub trait Handler: Send + Sync + 'static {
    /// The INIT flags wanted among those the kernel `offered`; settles
    /// what depends on them.
    fn init(&mut self, offered: u64) -> u64;
    /// Answers one request (never INIT, which the session handles).
    fn handle(&self, h: &Header, op: Op<'_>) -> Reply;
    /// [`Handler::handle`], with the transport's reply buffer lent for a
    /// body the handler can write in place (file data): the answer is
    /// then [`Reply::Placed`].
    fn handle_into(&self, h: &Header, op: Op<'_>, _buf: &mut [u8]) -> Reply {
        self.handle(h, op)
    }
    /// A request's handler panicked (it was answered EIO): what it was
    /// changing may be half done.
    fn panicked(&self) {}
}

/// `answer()`, or EIO when it panics: the request is answered either way
/// (an unanswered one leaves its caller waiting for ever, in the kernel,
/// where no signal reaches it), and `handler` hears of the panic.
pub fn answer_or_eio(handler: &dyn Handler, opcode: u32, answer: impl FnOnce() -> Reply) -> Reply {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(answer)) {
        Ok(reply) => reply,
        Err(_) => {
            tracing::error!(opcode, "a request's handler panicked: answered EIO");
            handler.panicked();
            Reply::Error(libc::EIO)
        }
    }
}

/// The room a read from /dev/fuse needs: the largest write and its
/// headers (the kernel refuses a smaller buffer).
pub const READ_BUFFER: usize = super::MAX_WRITE as usize + 8192;

/// Which transport serves a mount (`-o transport=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// io_uring if the kernel offers it, else /dev/fuse.
    Auto,
    Uring,
    Dev,
}

/// What INIT told the session about the kernel.
pub struct Offer {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
}

/// How a session is served.
pub struct Config {
    pub transport: Transport,
    /// Threads on /dev/fuse; under io_uring, entries (each with its
    /// thread) spread over the kernel's queues.
    pub threads: usize,
    /// The most /dev/fuse threads started while all the others are busy.
    pub max_threads: usize,
    /// How long the first /dev/fuse thread polls for the next request
    /// before it sleeps (see `dev`); zero never polls.
    pub busy_poll: std::time::Duration,
    /// INIT's `max_background` (see `fuse::bdi`).
    pub max_background: u16,
}

/// A way requests reach the handler once INIT is answered: threads
/// reading /dev/fuse (`dev::Threads`) or io_uring rings
/// (`uring::Rings`).
pub trait Carrier {
    /// INIT flags the carrier needs agreed (io_uring's).
    fn init_flags(&self) -> u64;
    /// Starts serving `handler`'s requests on the session `running`.
    fn carry(self: Box<Self>, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()>;
    /// What serves the mount, for the log.
    fn describe(&self) -> String;
}

/// Answers INIT on `fd` and starts the transport `config` asks for
/// (io_uring under `auto` if the kernel offers it).
pub fn start(fd: Arc<OwnedFd>, mut handler: impl Handler, config: &Config) -> Result<Running> {
    let raw = fd.as_raw_fd();
    let (unique, offer) = read_init(raw)?;
    let flags = handler.init(offer.flags) | (BASE_FLAGS & offer.flags);
    let carrier = match choose(raw, &offer, config) {
        Ok(c) => c,
        Err(e) => {
            write_reply(raw, unique, &Reply::Error(libc::EPROTO));
            return Err(e);
        }
    };
    let flags = flags | carrier.init_flags();
    write_init(raw, unique, &offer, flags, config.max_background);
    let mut running = Running::new(fd);
    running.transport = carrier.describe();
    carrier.carry(&mut running, Arc::new(handler))?;
    Ok(running)
}

/// The carrier for `config` given what INIT offered: io_uring when asked
/// for (or under `auto`, when offered and its rings could be made),
/// else /dev/fuse threads, with why.
fn choose(fd: RawFd, offer: &Offer, config: &Config) -> Result<Box<dyn Carrier>> {
    let offered = offer.flags & init::OVER_IO_URING != 0;
    let dev = |why: String| -> Box<dyn Carrier> {
        Box::new(super::dev::Threads {
            count: config.threads,
            most: config.max_threads,
            busy_poll: config.busy_poll,
            why,
        })
    };
    let not_offered = || {
        format!(
            "{}; {}",
            super::uring::why_not_offered(),
            super::uring::HOW_TO_ENABLE
        )
    };
    match (config.transport, offered) {
        (Transport::Dev, _) => Ok(dev("asked for with transport=dev".into())),
        (Transport::Auto, false) => Ok(dev(not_offered())),
        (Transport::Uring, false) => Err(Error::Invalid(format!(
            "transport=uring: {}",
            not_offered()
        ))),
        (t, true) => match super::uring::Rings::prepare(fd, config.threads) {
            Ok(r) => Ok(Box::new(r)),
            Err(e) if t == Transport::Auto => {
                tracing::warn!(error = %e, "io_uring could not be set up; serving on /dev/fuse");
                Ok(dev(format!("io_uring could not be set up: {e}")))
            }
            Err(e) => Err(e),
        },
    }
}

/// What one read(2) of /dev/fuse gave.
pub enum Read {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// No request is queued (a non-blocking descriptor).
    Empty,
    /// Interrupted, or the request was withdrawn before it was read:
    /// read again.
    Again,
    /// The connection is gone (unmounted or aborted), or reading failed.
    Gone,
}

/// One read(2) of a request from `fd` into `buf`.
pub fn read_once(fd: RawFd, buf: &mut [u8]) -> Read {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Read::Request(n as usize);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Read::Empty,
        Some(libc::EINTR | libc::ENOENT) => Read::Again,
        Some(libc::ENODEV) => Read::Gone,
        e => {
            tracing::error!(errno = ?e, "reading from /dev/fuse failed; ending the session");
            Read::Gone
        }
    }
}

/// Reads one request from `fd` into `buf`; None when the connection is
/// gone (unmounted or aborted).
pub fn read_request(fd: RawFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        match read_once(fd, buf) {
            Read::Request(n) => return Some(n),
            Read::Empty | Read::Again => {}
            Read::Gone => return None,
        }
    }
}

/// Writes a reply to request `unique` on `fd`. A reply to a request the
/// kernel has since withdrawn (ENOENT) is not an error.
pub fn write_reply(fd: RawFd, unique: u64, reply: &Reply) {
    let (error, body): (i32, &[u8]) = match reply {
        Reply::Nothing => return,
        Reply::Error(e) => (-e, &[]),
        Reply::Data(d) => (0, d),
        // Placed in a buffer not given here (`serve_one` writes those).
        Reply::Placed(_) => (-libc::EIO, &[]),
    };
    let header = proto::out_header(unique, error, body.len());
    write_message(fd, &header, body);
}

/// Writes a header and body in one writev.
pub fn write_message(fd: RawFd, header: &[u8], body: &[u8]) -> bool {
    let iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut _,
            iov_len: header.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut _,
            iov_len: body.len(),
        },
    ];
    let parts = if body.is_empty() { 1 } else { 2 };
    loop {
        // SAFETY: the iovecs point at live slices of their lengths.
        let n = unsafe { libc::writev(fd, iov.as_ptr(), parts) };
        if n >= 0 {
            return true;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOENT | libc::ENODEV) => return false,
            e => {
                tracing::warn!(errno = ?e, "writing a FUSE reply failed");
                return false;
            }
        }
    }
}

/// Decodes a /dev/fuse request in `buf` and answers it through
/// `handler`: a request that does not decode gets EIO and a log line.
/// File data is read into `out`, the reader thread's own reply buffer,
/// not into a new one per request: a fresh megabyte for every READ cost
/// its clearing and page faults.
pub fn serve_one(fd: RawFd, buf: &[u8], out: &mut [u8], handler: &dyn Handler) {
    let (h, fixed, rest) = match request::split(buf) {
        Ok(parts) => parts,
        Err(e) => {
            // Answered if its id can be read, so that its caller does
            // not wait for ever.
            tracing::error!(error = %e, "answered EIO");
            if let Some(id) = buf.get(8..16) {
                let unique = u64::from_ne_bytes(id.try_into().unwrap_or([0; 8]));
                write_reply(fd, unique, &Reply::Error(libc::EIO));
            }
            return;
        }
    };
    let reply = match request::decode(h.opcode, fixed, rest) {
        Ok(op) => answer_or_eio(handler, h.opcode, || handler.handle_into(&h, op, out)),
        Err(e) => {
            tracing::error!(opcode = h.opcode, error = %e, "answered EIO");
            Reply::Error(libc::EIO)
        }
    };
    match reply {
        Reply::Placed(n) if n <= out.len() => {
            let header = proto::out_header(h.unique, 0, n);
            write_message(fd, &header, &out[..n]);
        }
        reply => write_reply(fd, h.unique, &reply),
    }
}

/// Reads INIT from `fd`. A kernel speaking another major version gets
/// Canopy's and is asked again, as the protocol says.
pub fn read_init(fd: RawFd) -> Result<(u64, Offer)> {
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let n = read_request(fd, &mut buf)
            .ok_or_else(|| Error::Invalid("the kernel closed FUSE before INIT".into()))?;
        let bad = |e: request::Malformed| Error::Invalid(e.to_string());
        let (h, fixed, rest) = request::split(&buf[..n]).map_err(bad)?;
        let Op::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = request::decode(h.opcode, fixed, rest).map_err(bad)?
        else {
            return Err(Error::Invalid(format!(
                "the kernel's first FUSE request was opcode {}, not INIT",
                h.opcode
            )));
        };
        if major > proto::KERNEL_MAJOR {
            let mut o = proto::Out::default();
            o.u32(proto::KERNEL_MAJOR).u32(proto::KERNEL_MINOR);
            write_reply(fd, h.unique, &Reply::Data(o.0));
            continue;
        }
        if major < proto::KERNEL_MAJOR || minor < proto::MIN_MINOR {
            write_reply(fd, h.unique, &Reply::Error(libc::EPROTO));
            return Err(Error::Invalid(format!(
                "the kernel speaks FUSE {major}.{minor}; Canopy needs 7.{} or later",
                proto::MIN_MINOR
            )));
        }
        let minor = minor.min(proto::KERNEL_MINOR);
        return Ok((
            h.unique,
            Offer {
                minor,
                max_readahead,
                flags,
            },
        ));
    }
}

/// Answers INIT with `flags` (those the kernel offered and Canopy wants)
/// and `max_background`, the kernel's limit on FUSE requests in the
/// background (writeback, read-ahead).
pub fn write_init(fd: RawFd, unique: u64, offer: &Offer, flags: u64, max_background: u16) {
    let max_write = super::MAX_WRITE;
    let out = reply::InitOut {
        minor: offer.minor,
        max_readahead: offer.max_readahead,
        flags: flags | init::INIT_EXT,
        max_background,
        congestion_threshold: super::bdi::congestion_threshold(max_background),
        max_write,
        max_pages: (max_write / 4096) as u16,
    };
    write_reply(fd, unique, &reply::init(&out));
}

/// The flags every Canopy session asks for, when offered: reads may be
/// in flight together, writes up to `max_write`, replies up to
/// `max_pages`.
pub const BASE_FLAGS: u64 = init::ASYNC_READ | init::BIG_WRITES | init::MAX_PAGES;

/// A second descriptor on the session of `fd` (FUSE_DEV_IOC_CLONE), so
/// each thread has its own queue of replies in the kernel.
pub fn clone_fd(fd: RawFd) -> Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| Error::io("opening /dev/fuse", e))?;
    let mut master = fd as u32;
    // SAFETY: the ioctl reads one u32 from a live variable.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), proto::DEV_IOC_CLONE, &mut master) };
    if r != 0 {
        return Err(Error::io(
            "cloning the /dev/fuse session",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(dev.into())
}

/// Serving threads started once the session runs (more /dev/fuse
/// readers while all are busy), kept where the session joins them.
pub type LateThreads = Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>>;

/// The threads serving a session; `finished` once the kernel ended it.
pub struct Running {
    threads: Vec<std::thread::JoinHandle<()>>,
    late: LateThreads,
    /// Kept open so notifications can be written until the end.
    pub fd: Arc<OwnedFd>,
    /// Which transport serves the session, and why (for the log).
    pub transport: String,
}

impl Running {
    pub fn new(fd: Arc<OwnedFd>) -> Running {
        Running {
            threads: Vec::new(),
            late: Arc::default(),
            fd,
            transport: String::new(),
        }
    }

    /// Counts `t` among the session's threads.
    pub fn adopt(&mut self, t: std::thread::JoinHandle<()>) {
        self.threads.push(t);
    }

    pub fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|e| Error::io("starting a FUSE thread", e))?;
        self.threads.push(t);
        Ok(())
    }

    /// Where serving threads started later are kept, to be joined.
    pub fn late_threads(&self) -> LateThreads {
        self.late.clone()
    }

    /// Whether every serving thread has ended (the session is over).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
            && crate::sync::lock(&self.late)
                .iter()
                .all(|t| t.is_finished())
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
        // A thread still serving may start one more until it ends.
        loop {
            let late = std::mem::take(&mut *crate::sync::lock(&self.late));
            if late.is_empty() {
                break;
            }
            for t in late {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Panics(AtomicBool);

    impl Handler for Panics {
        fn init(&mut self, offered: u64) -> u64 {
            offered
        }
        fn handle(&self, _h: &Header, _op: Op<'_>) -> Reply {
            panic!("a handler bug");
        }
        fn panicked(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A handler that panics still answers (EIO), and hears of it.
    #[test]
    fn a_panicking_handler_answers_eio() {
        let h = Panics(AtomicBool::new(false));
        let header = Header {
            opcode: 1,
            unique: 7,
            nodeid: 1,
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let reply = answer_or_eio(&h, 1, || h.handle(&header, Op::Forget { nlookup: 1 }));
        assert_eq!(reply, Reply::Error(libc::EIO));
        assert!(h.0.load(Ordering::SeqCst));
        let fine = answer_or_eio(&h, 1, || Reply::Error(0));
        assert_eq!(fine, Reply::Error(0));
    }
}
