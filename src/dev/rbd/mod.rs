//! A device on a Ceph RBD image, through librbd in the daemon (as QEMU
//! uses RBD), so no kernel rbd module is needed.
//!
//! - `cluster.rs`: connecting, the pool, the image; errors that say what
//!   to do.
//! - `aio.rs`: writes in flight until the barrier, read-ahead.
//! - `lock.rs`: the explicit exclusive lock that keeps one writer across
//!   hosts, and taking it over (fencing the old holder).
//!
//! The barrier waits for every write issued before it and then flushes
//! the image; once the cluster has blocklisted this client (another host
//! took over), every write fails with ESHUTDOWN, the engine's next commit
//! fails, and the filesystem shuts down with a log line that says why.

mod aio;
mod cluster;
mod ffi;
mod lock;
mod watchdog;

use super::exclusive::Access;
use super::source::{OpenHow, RbdSpec};
use super::Device;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub struct RbdDevice {
    /// Declared before the image: requests still in flight are waited
    /// for and released before the image closes.
    writes: aio::InFlight,
    ahead: aio::ReadAhead,
    image: cluster::Image,
    spec: RbdSpec,
    size: AtomicU64,
    /// The first write error: every later barrier fails with it, as a
    /// write that never reached the cluster cannot be made durable later.
    failed: Mutex<Option<String>>,
    /// Whether the fencing message was logged.
    fenced: AtomicBool,
    /// Opened for writing: this client took the image's exclusive lock.
    writer: bool,
    /// The pool keeps two or more copies of each object (asked only by a
    /// writer: nothing else writes a log).
    replicated: bool,
    /// The image's object size (see [`Device::write_unit`]).
    object_bytes: u64,
}

impl RbdDevice {
    /// Opens `spec`'s image: a writer takes its exclusive lock (from
    /// whoever holds it, with `how.takeover`), a read-only mount refuses
    /// an image a writer holds, a tool that only looks just opens it.
    ///
    /// A snapshot never changes: it is opened read-only, by any number of
    /// readers while a writer holds the image, and refused for writing.
    pub fn open(spec: &RbdSpec, access: Access, how: OpenHow) -> Result<RbdDevice> {
        if spec.snap.is_some() && access == Access::Write {
            return Err(Error::Invalid(format!(
                "{spec} is a snapshot, which never changes: mount it read-only (-o ro)"
            )));
        }
        if access == Access::Share && spec.snap.is_none() {
            lock::refuse_if_written(spec)?;
        }
        let image = cluster::Image::open(spec, access != Access::Write)?;
        if access == Access::Write {
            lock::acquire(&image, spec, how.takeover)?;
        }
        let size = image.size()?;
        let object_bytes = image.object_bytes()?;
        // Only a writer writes a log, so only a writer asks (one more
        // round trip to the monitors at open).
        let replicas = match access {
            Access::Write => image.pool.replicas(&spec.pool),
            _ => None,
        };
        tracing::info!(pool = %spec.pool, ?replicas, "copies the pool keeps of each object");
        Ok(RbdDevice {
            replicated: replicas.is_some_and(|n| n >= 2),
            image,
            spec: spec.clone(),
            size: AtomicU64::new(size),
            writes: aio::InFlight::default(),
            ahead: aio::ReadAhead::default(),
            failed: Mutex::new(None),
            fenced: AtomicBool::new(false),
            writer: access == Access::Write,
            object_bytes,
        })
    }

    fn handle(&self) -> ffi::ImageT {
        self.image.handle
    }

    /// Records a failed write (every later barrier fails); says once,
    /// clearly, when the cause is that another host took the image over.
    fn record(&self, e: Error) -> Error {
        if aio::is_blocklisted(&e) && !self.fenced.swap(true, Ordering::Relaxed) {
            tracing::error!(image = %self.spec, "this client was blocklisted: another host took the filesystem over (--break-lock); every write is refused from now on, and the filesystem shuts down");
        }
        let mut f = crate::sync::lock(&self.failed);
        if f.is_none() {
            *f = Some(e.to_string());
        }
        e
    }

    fn wait_all(&self, ops: Vec<std::sync::Arc<aio::Op>>) -> Result<()> {
        let mut first = Ok(());
        for op in ops {
            if let Err(e) = self.wait_for(&op) {
                let e = self.record(e);
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Waits for a write, discard or flush: until it ends, or until this
    /// writer lost the image's exclusive lock (another host took it
    /// over), when librbd may hold it forever. Then the image's handles
    /// are left open at drop: closing them waits for that request too.
    fn wait_for(&self, op: &aio::Op) -> Result<()> {
        // Two looks in a row, so that a moment between librbd's lock
        // states gives nothing up; the cluster's word gives up at once.
        let lost_before = std::cell::Cell::new(false);
        let give_up = || {
            let lost = self.lost_lock();
            let twice = lost_before.replace(lost) && lost;
            twice || (self.writer && self.fenced.load(Ordering::Relaxed))
        };
        let r = aio::check_write_unless(op, give_up);
        if r.as_ref().is_err_and(aio::is_blocklisted) && !op.is_complete() {
            tracing::error!(image = %self.spec, "gave up on a request librbd holds behind the exclusive lock this client lost; the image stays open until the daemon exits");
            self.image.leave_open();
        }
        r
    }

    /// Whether this writer no longer holds the exclusive lock it took at
    /// open (a device opened only to read holds none and loses none).
    fn lost_lock(&self) -> bool {
        self.writer && !self.image.holds_lock()
    }

    /// `e` with the image named (a request's own error knows only
    /// offsets).
    fn naming_image(&self, e: Error) -> Error {
        match e {
            Error::Io { context, cause } => Error::Io {
                context: format!("{context} of {}", self.spec),
                cause,
            },
            e => e,
        }
    }

    /// Sends `buf` to be written at `offset`, in flight until a barrier
    /// (or until the bound on writes in flight makes this one wait).
    fn write_owned(&self, buf: Bytes, offset: u64) -> Result<()> {
        self.sticky()?;
        let len = buf.len() as u64;
        self.wait_all(self.writes.overlapping(offset, len))?;
        let done = self
            .ahead
            .while_writing(offset, len, || {
                let op = aio::Op::write(self.handle(), buf, offset)?;
                Ok(self.writes.push(op))
            })
            .map_err(|e| self.record(e))?;
        self.wait_all(done)?;
        self.earlier_failure()
    }

    /// A write that failed since, as whoever finds it complete saw it.
    fn earlier_failure(&self) -> Result<()> {
        match self.writes.failure() {
            Some(e) => Err(self.record(e)),
            None => Ok(()),
        }
    }

    fn sticky(&self) -> Result<()> {
        match crate::sync::lock(&self.failed).as_ref() {
            Some(why) => Err(Error::io(
                format!("writing {}: an earlier write failed ({why})", self.spec),
                std::io::Error::from_raw_os_error(libc::EIO),
            )),
            None => Ok(()),
        }
    }
}

impl Drop for RbdDevice {
    /// Waits here, with [`RbdDevice::wait_for`]'s bound, for the writes
    /// no barrier waited for: dropped with the queue, a request librbd
    /// holds behind a lost lock would be waited for without one.
    fn drop(&mut self) {
        let _ = self.wait_all(self.writes.all());
    }
}

impl Device for RbdDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.wait_all(self.writes.overlapping(offset, len))?;
        if self.ahead.take(buf, offset) {
            return Ok(());
        }
        // SAFETY: a live handle and a buffer of `buf.len()` bytes.
        let r = unsafe { ffi::rbd_read(self.handle(), offset, buf.len(), buf.as_mut_ptr().cast()) };
        match r {
            n if n == buf.len() as isize => Ok(()),
            n if n < 0 => {
                let e = cluster::errno(
                    n as i64,
                    format!("reading {len} bytes at {offset} of {}", self.spec),
                );
                // A failed read is that read's error, unless it says this
                // client was fenced: then nothing may be written either.
                match aio::is_blocklisted(&e) {
                    true => Err(self.record(e)),
                    false => Err(e),
                }
            }
            n => Err(Error::io(
                format!(
                    "reading {len} bytes at {offset} of {}: only {n} read",
                    self.spec
                ),
                std::io::Error::from_raw_os_error(libc::EIO),
            )),
        }
    }

    /// A copy of `buf` goes out: the write stays in flight after this
    /// returns, so it needs bytes of its own.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_owned(Bytes::copy_from_slice(buf), offset)
    }

    fn write_data_owned(&self, buf: Bytes, offset: u64) -> Result<()> {
        self.write_owned(buf, offset)
    }

    fn barrier(&self) -> Result<()> {
        self.wait_all(self.writes.all())?;
        self.earlier_failure()?;
        let flushed = aio::Op::flush(self.handle()).and_then(|op| self.wait_for(&op));
        flushed.map_err(|e| self.record(self.naming_image(e)))?;
        self.sticky()
    }

    fn replicates(&self) -> bool {
        self.replicated
    }

    /// A write of whole objects is one operation per object on the OSDs;
    /// one that starts or ends inside an object costs a further one
    /// there, at about the price of a whole object's (see `flush`).
    fn write_unit(&self) -> u64 {
        self.object_bytes
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn refresh_size(&self) -> Result<u64> {
        let size = self.image.size()?;
        self.size.store(size, Ordering::Relaxed);
        Ok(size)
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.ahead
            .start(self.handle(), offset, len, self.size(), &self.writes);
    }

    /// `rbd_discard`, after the writes in flight over the range (which
    /// it must follow, not race), with read-ahead of the range dropped.
    /// librbd deletes whole objects the range covers and zeroes or
    /// truncates the ends, so `rbd du` falls.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        self.sticky()?;
        self.wait_all(self.writes.overlapping(offset, len))?;
        // rbd_discard answers with the bytes discarded as an int: a range
        // of 2 GiB or more is EINVAL, so it goes in pieces.
        let mut r = Ok(());
        let mut at = offset;
        while at < offset + len && r.is_ok() {
            let piece = (offset + len - at).min(DISCARD_PIECE);
            // Waited for inside: no read-ahead of the range starts
            // before the discard ends (it might read what was there).
            r = self.ahead.while_writing(at, piece, || {
                aio::Op::discard(self.handle(), at, piece).and_then(|op| self.wait_for(&op))
            });
            at += piece;
        }
        match r {
            Ok(()) => Ok(true),
            Err(e) if aio::errno_of(&e) == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(e) => {
                let e = self.naming_image(e);
                // A failed discard loses nothing, unless it says this
                // client was fenced.
                match aio::is_blocklisted(&e) {
                    true => Err(self.record(e)),
                    false => Err(e),
                }
            }
        }
    }
}

/// Largest range one `rbd_discard` is given (its answer is an int).
const DISCARD_PIECE: u64 = 1 << 30;

/// Creates `spec`'s image of `size` bytes (mkfs); false when it exists.
pub fn create_image(spec: &RbdSpec, size: u64) -> Result<bool> {
    if spec.snap.is_some() {
        return Err(Error::Invalid(format!(
            "{spec} is a snapshot, which never changes"
        )));
    }
    cluster::create(spec, size)
}

/// Removes an image mkfs created and then failed to format.
pub fn remove_created_image(spec: &RbdSpec) {
    if let Err(e) = cluster::remove(spec) {
        tracing::warn!(image = %spec, "could not remove the image mkfs created: {e}");
    }
}
