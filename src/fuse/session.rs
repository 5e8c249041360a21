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
    /// Threads on /dev/fuse, or per queue under io_uring.
    pub threads: usize,
}

/// Answers INIT on `fd` and starts the transport `config` asks for
/// (io_uring under `auto` if the kernel offers it).
pub fn start(fd: Arc<OwnedFd>, mut handler: impl Handler, config: &Config) -> Result<Running> {
    let raw = fd.as_raw_fd();
    let (unique, offer) = read_init(raw)?;
    let flags = handler.init(offer.flags) | (BASE_FLAGS & offer.flags);
    let offered = offer.flags & init::OVER_IO_URING != 0;
    let rings = match (config.transport, offered) {
        (Transport::Dev, _) => None,
        (Transport::Auto, false) => {
            tracing::info!(
                "transport: /dev/fuse ({}; {})",
                super::uring::why_not_offered(),
                super::uring::HOW_TO_ENABLE
            );
            None
        }
        (Transport::Uring, false) => {
            write_reply(raw, unique, &Reply::Error(libc::EPROTO));
            return Err(Error::Invalid(format!(
                "transport=uring: {}; {}",
                super::uring::why_not_offered(),
                super::uring::HOW_TO_ENABLE
            )));
        }
        (t, true) => match super::uring::Rings::prepare(raw, config.threads) {
            Ok(r) => Some(r),
            Err(e) if t == Transport::Auto => {
                tracing::warn!(error = %e, "transport: /dev/fuse (io_uring could not be set up)");
                None
            }
            Err(e) => {
                write_reply(raw, unique, &Reply::Error(libc::EPROTO));
                return Err(e);
            }
        },
    };
    let uring = if rings.is_some() {
        init::OVER_IO_URING
    } else {
        0
    };
    write_init(raw, unique, &offer, flags | uring);
    let handler: Arc<dyn Handler> = Arc::new(handler);
    let mut running = Running::new(fd);
    match rings {
        Some(rings) => {
            super::dev::start(&mut running, handler.clone(), 1)?;
            rings.start(&mut running, handler)?;
        }
        None => {
            if config.transport == Transport::Dev {
                tracing::info!(threads = config.threads, "transport: /dev/fuse (asked for)");
            }
            super::dev::start(&mut running, handler, config.threads)?;
        }
    }
    Ok(running)
}

/// Reads one request from `fd` into `buf`; None when the connection is
/// gone (unmounted or aborted).
pub fn read_request(fd: RawFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Some(n as usize);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // Interrupted, or the request was withdrawn before it was read.
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
            Some(libc::ENODEV) => return None,
            e => {
                tracing::error!(errno = ?e, "reading from /dev/fuse failed; ending the session");
                return None;
            }
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
pub fn serve_one(fd: RawFd, buf: &[u8], handler: &dyn Handler) {
    let (h, fixed, rest) = match request::split(buf) {
        Ok(parts) => parts,
        Err(e) => {
            tracing::error!(error = %e, "dropped a request that has no readable header");
            return;
        }
    };
    let reply = match request::decode(h.opcode, fixed, rest) {
        Ok(op) => handler.handle(&h, op),
        Err(e) => {
            tracing::error!(opcode = h.opcode, error = %e, "answered EIO");
            Reply::Error(libc::EIO)
        }
    };
    write_reply(fd, h.unique, &reply);
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

/// Answers INIT with `flags` (those the kernel offered and Canopy wants).
pub fn write_init(fd: RawFd, unique: u64, offer: &Offer, flags: u64) {
    let max_write = super::MAX_WRITE;
    let out = reply::InitOut {
        minor: offer.minor,
        max_readahead: offer.max_readahead,
        flags: flags | init::INIT_EXT,
        max_background: 16,
        congestion_threshold: 12,
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

/// The threads serving a session; `finished` once the kernel ended it.
pub struct Running {
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Kept open so notifications can be written until the end.
    pub fd: Arc<OwnedFd>,
}

impl Running {
    pub fn new(fd: Arc<OwnedFd>) -> Running {
        Running {
            threads: Vec::new(),
            fd,
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

    /// Whether every serving thread has ended (the session is over).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}
