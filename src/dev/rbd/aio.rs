//! Asynchronous requests: writes that stay in flight until the next
//! barrier, and read-ahead that fetches what a reader will want next.
//!
//! A Canopy commit writes hundreds of tree blocks and data extents and
//! then waits for all of them at one barrier; issuing them one by one and
//! waiting for each would pay a network round trip per block. So a write
//! is sent with `rbd_aio_write` and `write_at` returns at once; the
//! barrier waits for every write issued before it, then flushes. The
//! order the engine relies on holds because a read or write of a range
//! first waits for the writes in flight that overlap it.

use super::cluster::errno;
use super::ffi;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One asynchronous request and the buffer librbd reads from or into.
pub struct Op {
    c: ffi::CompletionT,
    /// Where librbd reads a write's bytes from or puts a read's: in
    /// `shared` for a write, else from `Box::into_raw`.
    buf: NonNull<[u8]>,
    /// A write's bytes, held until the request ends: librbd reads them
    /// in place (`rbd_disable_zero_copy_writes` is off).
    shared: Option<Bytes>,
    pub off: u64,
    /// The buffer goes back to [`SPARE_BUFFERS`] when the request ends.
    spare: bool,
    /// What the request does, for its errors.
    kind: Kind,
    /// Set by librbd's completion callback, so that a waiter can wait
    /// with a timeout (librbd's own wait has none).
    done: Arc<Done>,
    /// librbd took the request (false: it refused it at once and will
    /// never complete it).
    sent: bool,
    /// A waiter gave up on the request (see [`Op::wait_unless`]): if it
    /// is still incomplete when dropped, its completion and buffer are
    /// left to librbd rather than waited for.
    abandoned: AtomicBool,
}

#[derive(Clone, Copy)]
enum Kind {
    Read,
    Write,
    Discard { len: u64 },
    Flush,
}

/// Whether a request completed, and a condition to wait for it on.
#[derive(Default)]
struct Done {
    complete: Mutex<bool>,
    cv: Condvar,
}

/// librbd's completion callback: `arg` is the [`Done`] reference
/// [`Op::new`] gave it, taken back here once.
unsafe extern "C" fn completed(_c: ffi::CompletionT, arg: *mut libc::c_void) {
    // SAFETY: `arg` came from Arc::into_raw in Op::new, and librbd calls
    // the callback once per completion.
    let done = unsafe { Arc::from_raw(arg as *const Done) };
    *crate::sync::lock(&done.complete) = true;
    done.cv.notify_all();
}

/// How often a waiter for a write asks whether to give up on it.
const GIVE_UP_TICK: Duration = Duration::from_millis(500);

/// Buffers of read-ahead requests ([`AHEAD_CHUNK`] bytes) kept for the
/// next ones. A fresh buffer costs librbd a page fault and the kernel a
/// page cleared for every 4 KiB it fills: a sequential reader on RBD spent
/// a tenth of the daemon's time there. The daemon's allocator gives freed
/// memory back to the system at once, so without these every request
/// faulted its buffer in anew.
static SPARE_BUFFERS: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// Most spare buffers kept: requests end and start about one at a time
/// as a reader goes, so a few serve a whole window (ten read no faster
/// than four behind a 32 MiB window), and idle memory stays at 16 MiB.
const MAX_SPARE_BUFFERS: usize = 4;

/// A buffer from `Box::into_raw` that no request uses.
struct Spare(NonNull<[u8]>);

// SAFETY: nothing else holds the buffer; it moves between threads whole.
unsafe impl Send for Spare {}

/// The buffer of a request that moves no data (discard, flush).
fn empty_buffer() -> NonNull<[u8]> {
    NonNull::from(Box::leak(Box::<[u8]>::default()))
}

/// A buffer of `len` bytes for librbd to read into, from `Box::into_raw`,
/// and whether it is read-ahead's size (kept when the request ends): a
/// spare one if there is, else a fresh one, not zeroed: librbd fills it,
/// and it is read only once the read returned its whole length.
fn read_buffer(len: usize) -> (NonNull<[u8]>, bool) {
    let pooled = len as u64 == AHEAD_CHUNK;
    let spare = pooled
        .then(|| crate::sync::lock(&SPARE_BUFFERS).pop())
        .flatten();
    match spare {
        Some(Spare(buf)) => (buf, true),
        None => {
            let raw = Box::into_raw(Box::<[u8]>::new_uninit_slice(len)) as *mut [u8];
            // SAFETY: Box::into_raw never returns null.
            (unsafe { NonNull::new_unchecked(raw) }, pooled)
        }
    }
}

// SAFETY: completions may be waited on from any thread; the buffer is
// only touched by librbd until completion, then read.
unsafe impl Send for Op {}
unsafe impl Sync for Op {}

impl Drop for Op {
    fn drop(&mut self) {
        if self.sent && self.abandoned.load(Ordering::Relaxed) && !self.is_complete() {
            // librbd holds a request that may never end (one queued
            // behind an exclusive lock this client lost): its completion
            // and buffer stay allocated for whatever librbd does later.
            std::mem::forget(self.shared.take());
            return;
        }
        // SAFETY: a live completion, waited for (if librbd took it)
        // before it is released, so librbd is done with the buffer
        // before it is kept or freed.
        unsafe {
            if self.sent {
                ffi::rbd_aio_wait_for_complete(self.c);
            }
            ffi::rbd_aio_release(self.c);
        }
        if self.shared.is_some() {
            return;
        }
        if self.spare {
            let mut spares = crate::sync::lock(&SPARE_BUFFERS);
            if spares.len() < MAX_SPARE_BUFFERS {
                spares.push(Spare(self.buf));
                return;
            }
        }
        // SAFETY: from Box::into_raw, and librbd is done with it.
        drop(unsafe { Box::from_raw(self.buf.as_ptr()) });
    }
}

impl Op {
    fn new(kind: Kind, buf: NonNull<[u8]>, off: u64, spare: bool) -> Result<Op> {
        Op::with_buffer(kind, buf, None, off, spare)
    }

    /// A request on `buf`, which is `shared`'s bytes when that is given
    /// (else from `Box::into_raw`, released with the request).
    fn with_buffer(
        kind: Kind,
        buf: NonNull<[u8]>,
        shared: Option<Bytes>,
        off: u64,
        spare: bool,
    ) -> Result<Op> {
        let done = Arc::new(Done::default());
        let arg = Arc::into_raw(done.clone()) as *mut libc::c_void;
        let mut c = ptr::null_mut();
        // SAFETY: an out-pointer; the callback takes `arg` back once.
        let r = unsafe { ffi::rbd_aio_create_completion(arg, Some(completed), &mut c) };
        if r < 0 {
            // SAFETY: without `shared` the buffer came from
            // Box::into_raw and is not shared; `arg` went to no completion.
            unsafe {
                if shared.is_none() {
                    drop(Box::from_raw(buf.as_ptr()));
                }
                drop(Arc::from_raw(arg as *const Done));
            }
            return Err(errno(r.into(), "creating an RBD completion"));
        }
        Ok(Op {
            c,
            buf,
            shared,
            off,
            spare,
            kind,
            done,
            sent: true,
            abandoned: AtomicBool::new(false),
        })
    }

    /// Notes librbd's answer to the call that sent the request: one it
    /// refused at once never completes (and its callback never runs).
    fn sent(mut self, r: libc::c_int) -> Result<Arc<Op>> {
        if r < 0 {
            self.sent = false;
            return Err(errno(r.into(), self.what()));
        }
        Ok(Arc::new(self))
    }

    /// What the request does, as its errors say.
    fn what(&self) -> String {
        match self.kind {
            Kind::Read => format!("reading {} bytes at {}", self.len(), self.off),
            Kind::Write => format!("writing {} bytes at {}", self.len(), self.off),
            Kind::Discard { len } => format!("discarding {len} bytes at {}", self.off),
            Kind::Flush => "flushing".to_string(),
        }
    }

    pub fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    pub fn end(&self) -> u64 {
        self.off + self.len()
    }

    pub fn overlaps(&self, off: u64, len: u64) -> bool {
        self.off < off + len && off < self.end()
    }

    /// Sends `data` to be written at `off`; librbd reads it in place, so
    /// the request holds it until it ends (a write once copied it into a
    /// fresh buffer: a fifth of the daemon's time in a sequential write,
    /// most of it faulting those pages in).
    pub fn write(image: ffi::ImageT, data: Bytes, off: u64) -> Result<Arc<Op>> {
        let buf = NonNull::from(&*data);
        let op = Op::with_buffer(Kind::Write, buf, Some(data), off, false)?;
        // SAFETY: the bytes live until the completion is released (Drop)
        // and nothing changes them (`Bytes` is immutable).
        let r = unsafe {
            ffi::rbd_aio_write(
                image,
                off,
                buf.len(),
                op.buf.as_ptr() as *const libc::c_char,
                op.c,
            )
        };
        op.sent(r)
    }

    /// Sends a discard of `len` bytes at `off`.
    pub fn discard(image: ffi::ImageT, off: u64, len: u64) -> Result<Arc<Op>> {
        let op = Op::new(Kind::Discard { len }, empty_buffer(), off, false)?;
        // SAFETY: a live handle and completion.
        let r = unsafe { ffi::rbd_aio_discard(image, off, len, op.c) };
        op.sent(r)
    }

    /// Sends a flush of every write librbd completed.
    pub fn flush(image: ffi::ImageT) -> Result<Arc<Op>> {
        let op = Op::new(Kind::Flush, empty_buffer(), 0, false)?;
        // SAFETY: a live handle and completion.
        let r = unsafe { ffi::rbd_aio_flush(image, op.c) };
        op.sent(r)
    }

    /// Starts reading `len` bytes at `off`.
    pub fn read(image: ffi::ImageT, len: usize, off: u64) -> Result<Arc<Op>> {
        let (buf, spare) = read_buffer(len);
        let op = Op::new(Kind::Read, buf, off, spare)?;
        // SAFETY: as for write; nothing reads the buffer before completion.
        let r = unsafe {
            ffi::rbd_aio_read(image, off, len, op.buf.as_ptr() as *mut libc::c_char, op.c)
        };
        op.sent(r)
    }

    pub fn is_complete(&self) -> bool {
        // SAFETY: a live completion.
        unsafe { ffi::rbd_aio_is_complete(self.c) != 0 }
    }

    /// Waits for the request; its return value (bytes, or a negative errno).
    /// A wait that has to wait is watched (`watchdog`): one the cluster
    /// holds is named in the log.
    pub fn wait(&self) -> i64 {
        let _watched = (!self.is_complete()).then(|| super::watchdog::watch(self.what()));
        // SAFETY: a live completion; several threads may wait on one.
        unsafe {
            ffi::rbd_aio_wait_for_complete(self.c);
            ffi::rbd_aio_get_return_value(self.c) as i64
        }
    }

    /// Waits for the request like [`Op::wait`], but asks `give_up` every
    /// [`GIVE_UP_TICK`] while it is incomplete, and gives up on it (None)
    /// when that says so. librbd queues a write behind the exclusive lock
    /// and never ends it once another host took the lock over: without
    /// this, the fenced writer's fsync (and its unmount) hung forever.
    pub fn wait_unless(&self, give_up: impl Fn() -> bool) -> Option<i64> {
        let _watched = super::watchdog::watch(self.what());
        loop {
            let complete = crate::sync::lock(&self.done.complete);
            if *complete {
                drop(complete);
                return Some(self.wait());
            }
            let (guard, _) = self
                .done
                .cv
                .wait_timeout(complete, GIVE_UP_TICK)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let complete = *guard;
            // Unlocked before asking librbd: its callback takes this lock.
            drop(guard);
            if !complete && give_up() {
                self.abandoned.store(true, Ordering::Relaxed);
                return None;
            }
        }
    }

    /// The bytes read, once [`Op::wait`] returned their full length.
    fn data(&self) -> &[u8] {
        // SAFETY: the request is complete (callers wait first), so librbd
        // no longer writes the buffer.
        unsafe { self.buf.as_ref() }
    }
}

/// Writes in flight, in the order they were issued.
///
/// A write stays here until it is complete, even while a writer past the
/// bounds waits for it, so a barrier sees every write issued before it
/// (it once left the queue when a writer took it to wait for, and a
/// barrier on another thread could flush without it). The first write
/// that failed is kept, so every barrier reports it, whoever saw it
/// complete.
#[derive(Default)]
pub struct InFlight {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Arc<Op>>,
    failed: Option<Arc<Op>>,
}

/// Writes beyond these wait for the oldest: they bound the memory that
/// copies of written data hold, and the work a barrier waits for.
const MAX_WRITES: usize = 64;
const MAX_WRITE_BYTES: u64 = 64 << 20;

impl InFlight {
    /// The writes in flight that overlap `[off, off+len)`.
    pub fn overlapping(&self, off: u64, len: u64) -> Vec<Arc<Op>> {
        let q = crate::sync::lock(&self.queue);
        q.ops
            .iter()
            .filter(|o| o.overlaps(off, len))
            .cloned()
            .collect()
    }

    /// Adds `op` and returns the writes the caller must wait for: the
    /// oldest beyond the bounds.
    pub fn push(&self, op: Arc<Op>) -> Vec<Arc<Op>> {
        let mut q = crate::sync::lock(&self.queue);
        q.ops.push_back(op);
        q.forget_complete();
        let mut count = q.ops.len();
        let mut bytes: u64 = q.ops.iter().map(|o| o.len()).sum();
        let mut out = Vec::new();
        for o in &q.ops {
            if count <= MAX_WRITES && bytes <= MAX_WRITE_BYTES {
                break;
            }
            count -= 1;
            bytes -= o.len();
            out.push(o.clone());
        }
        out
    }

    /// Every write in flight (a barrier waits for them).
    pub fn all(&self) -> Vec<Arc<Op>> {
        crate::sync::lock(&self.queue).ops.iter().cloned().collect()
    }

    /// The first write that failed, as an error.
    pub fn failure(&self) -> Option<Error> {
        let q = crate::sync::lock(&self.queue);
        q.failed.as_ref().and_then(|op| check_write(op).err())
    }
}

impl Queue {
    /// Drops the complete writes, keeping the first that failed.
    fn forget_complete(&mut self) {
        let failed = &mut self.failed;
        self.ops.retain(|o| {
            if !o.is_complete() {
                return true;
            }
            if failed.is_none() && o.wait() < 0 {
                *failed = Some(o.clone());
            }
            false
        });
    }
}

/// Reads started ahead of the reader, by offset.
#[derive(Default)]
pub struct ReadAhead {
    inner: Mutex<Ahead>,
}

#[derive(Default)]
struct Ahead {
    ops: BTreeMap<u64, Arc<Op>>,
    /// Offsets in the order they were started, for eviction.
    order: VecDeque<u64>,
    bytes: u64,
    /// Requests read to their end, newest last: kept for a while, not
    /// dropped at once (see [`Ahead::finished`]).
    finished: VecDeque<Arc<Op>>,
}

/// Requests read to their end that read-ahead keeps: the kernel sends a
/// sequential reader's requests from several threads, so the read of a
/// request's middle may arrive after the read of its end.
const KEEP_FINISHED: usize = 2;

/// Memory read-ahead may hold, and the size of one of its requests (RBD's
/// default object size: one request per object).
const AHEAD_BYTES: u64 = 64 << 20;
const AHEAD_CHUNK: u64 = 4 << 20;

impl Ahead {
    fn covered(&self, off: u64, len: u64) -> bool {
        self.ops
            .range(..=off)
            .next_back()
            .is_some_and(|(_, o)| o.end() >= off + len)
    }

    /// The requests that together hold `[off, end)`, in order.
    fn covering(&self, off: u64, end: u64) -> Option<Vec<Arc<Op>>> {
        let mut at = off;
        let mut out = Vec::new();
        while at < end {
            let (_, op) = self.ops.range(..=at).next_back()?;
            if op.end() <= at {
                return None;
            }
            at = op.end();
            out.push(op.clone());
        }
        Some(out)
    }

    /// Drops `op` if it is still the request at its offset (a write may
    /// have replaced it meanwhile).
    fn forget_if_same(&mut self, op: &Arc<Op>) {
        if self.ops.get(&op.off).is_some_and(|o| Arc::ptr_eq(o, op)) {
            self.forget(op.off);
        }
    }

    /// Notes that `op` was read to its end: it goes once
    /// [`KEEP_FINISHED`] requests finished after it, so a late read of its
    /// middle still finds it.
    fn finished(&mut self, op: Arc<Op>) {
        if self.finished.iter().any(|o| Arc::ptr_eq(o, &op)) {
            return;
        }
        self.finished.push_back(op);
        while self.finished.len() > KEEP_FINISHED {
            if let Some(old) = self.finished.pop_front() {
                self.forget_if_same(&old);
            }
        }
    }

    fn insert(&mut self, op: Arc<Op>) {
        let a = self;
        a.bytes += op.len();
        a.order.push_back(op.off);
        if let Some(old) = a.ops.insert(op.off, op) {
            a.bytes -= old.len();
        }
        while a.bytes > AHEAD_BYTES {
            let Some(k) = a.order.pop_front() else { break };
            if let Some(o) = a.ops.remove(&k) {
                a.bytes -= o.len();
            }
        }
    }

    fn forget(&mut self, key: u64) {
        if let Some(o) = self.ops.remove(&key) {
            self.bytes -= o.len();
            self.order.retain(|&k| k != key);
        }
    }

    fn invalidate(&mut self, off: u64, len: u64) {
        let stale: Vec<u64> = self
            .ops
            .range(..off + len)
            .filter(|(_, o)| o.overlaps(off, len))
            .map(|(&k, _)| k)
            .collect();
        for k in stale {
            self.forget(k);
        }
    }
}

/// Where read-ahead of `[off, off + len)` ends: a large range (a
/// sequential reader's window) runs on to the end of its last object, so
/// the next window, which starts where this one was asked to end, finds
/// that object read and goes on in whole objects: one request per object
/// rather than two. Small ranges (tree blocks) are read as asked.
fn streaming_end(off: u64, len: u64) -> u64 {
    let end = off.saturating_add(len);
    if len < AHEAD_CHUNK / 4 {
        return end;
    }
    end.div_ceil(AHEAD_CHUNK).saturating_mul(AHEAD_CHUNK)
}

impl ReadAhead {
    /// Starts reads of the parts of `[off, off+len)` not yet being read
    /// and not being written: librbd may answer a read with the data from
    /// before a write still in flight over it.
    pub fn start(&self, image: ffi::ImageT, off: u64, len: u64, size: u64, writes: &InFlight) {
        let mut a = crate::sync::lock(&self.inner);
        let end = streaming_end(off, len).min(size);
        let mut at = off;
        while at < end {
            let next = (at / AHEAD_CHUNK + 1) * AHEAD_CHUNK;
            let piece = next.min(end) - at;
            if !a.covered(at, piece) && writes.overlapping(at, piece).is_empty() {
                match Op::read(image, piece as usize, at) {
                    Ok(op) => a.insert(op),
                    Err(_) => return,
                }
            }
            at += piece;
        }
    }

    /// Runs `issue`, which sends a write of `[off, off+len)`, with no
    /// read-ahead of that range started meanwhile, and drops what read-ahead
    /// holds of it: a read started before the write may hold the old data.
    pub fn while_writing<T>(&self, off: u64, len: u64, issue: impl FnOnce() -> T) -> T {
        let mut a = crate::sync::lock(&self.inner);
        a.invalidate(off, len);
        issue()
    }

    /// Copies `[off, off+buf.len())` out of reads started earlier, if they
    /// hold all of it (one request or several in a row) and succeeded. A
    /// read that reaches the end of a request consumes it.
    pub fn take(&self, buf: &mut [u8], off: u64) -> bool {
        let end = off + buf.len() as u64;
        let Some(ops) = crate::sync::lock(&self.inner).covering(off, end) else {
            return false;
        };
        if ops.iter().any(|op| op.wait() != op.len() as i64) {
            let mut a = crate::sync::lock(&self.inner);
            ops.iter().for_each(|op| a.forget(op.off));
            return false;
        }
        for op in ops {
            let (from, to) = (off.max(op.off), end.min(op.end()));
            let src = &op.data()[(from - op.off) as usize..(to - op.off) as usize];
            buf[(from - off) as usize..(to - off) as usize].copy_from_slice(src);
            if to == op.end() {
                crate::sync::lock(&self.inner).finished(op);
            }
        }
        true
    }
}

/// The error of a finished write, if it failed.
fn check_write(op: &Op) -> Result<()> {
    answer(op, op.wait())
}

/// The error of a write (or discard or flush), if it failed; once it
/// ends or `give_up` says this client can no longer expect it to (then
/// the error is ESHUTDOWN, as the cluster's own for a fenced client).
pub fn check_write_unless(op: &Op, give_up: impl Fn() -> bool) -> Result<()> {
    match op.wait_unless(give_up) {
        Some(r) => answer(op, r),
        None => Err(errno(
            -i64::from(libc::ESHUTDOWN),
            format!(
                "{}: this client lost the image's exclusive lock, and librbd holds the request",
                op.what()
            ),
        )),
    }
}

fn answer(op: &Op, r: i64) -> Result<()> {
    match r {
        r if r < 0 => Err(errno(r, op.what())),
        _ => Ok(()),
    }
}

/// Whether `e` is the cluster refusing a client it blocklisted.
pub fn is_blocklisted(e: &Error) -> bool {
    errno_of(e) == Some(libc::ESHUTDOWN)
}

/// The errno an I/O error carries.
pub fn errno_of(e: &Error) -> Option<i32> {
    match e {
        Error::Io { cause, .. } => cause.raw_os_error(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{streaming_end, AHEAD_CHUNK};

    #[test]
    fn a_window_runs_to_its_last_objects_end_and_a_small_read_does_not() {
        const MIB: u64 = 1 << 20;
        assert_eq!(streaming_end(3 * MIB, 6 * MIB), 3 * AHEAD_CHUNK);
        assert_eq!(streaming_end(AHEAD_CHUNK, AHEAD_CHUNK), 2 * AHEAD_CHUNK);
        assert_eq!(streaming_end(5 * MIB, 16 << 10), 5 * MIB + (16 << 10));
    }
}
