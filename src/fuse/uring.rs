//! FUSE over io_uring (Linux 6.14 and later, when the fuse module's
//! `enable_uring` is on): requests arrive as completions of commands
//! Canopy queued on its rings, and one command both answers a request
//! and asks for the next (`COMMIT_AND_FETCH`), so a request costs one
//! system call instead of a read and a write.
//!
//! The kernel keeps one queue per possible CPU and hands a request to
//! the queue of the CPU its caller runs on; every queue must have an
//! entry before the kernel uses any. Each entry is a header buffer and
//! a payload buffer big enough for the largest write. Here every entry
//! has its own thread and ring, pinned to its queue's CPU: an entry is
//! only offered to the kernel while its thread is idle, so a request
//! never waits behind a long fsync on a busy thread of its queue.

use super::proto;
use super::reply::Reply;
use super::request;
use super::session::{answer_or_eio, Carrier, Handler, Running};
use crate::error::{Error, Result};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::os::fd::RawFd;
use std::sync::mpsc;
use std::sync::Arc;

/// How a user turns FUSE over io_uring on.
pub const HOW_TO_ENABLE: &str =
    "to use io_uring, as root: echo 1 > /sys/module/fuse/parameters/enable_uring (Linux 6.14 or later)";

const ENABLE: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel did not offer io_uring at INIT.
pub fn why_not_offered() -> String {
    match std::fs::read_to_string(ENABLE) {
        Err(_) => "this kernel has no FUSE over io_uring".into(),
        Ok(v) if v.trim() == "N" || v.trim() == "0" => {
            "the kernel does not offer io_uring: enable_uring is off".into()
        }
        Ok(_) => "the kernel did not offer io_uring".into(),
    }
}

/// The context of the error a session that could not register its
/// rings fails with (the mount may then try /dev/fuse).
pub const REGISTER_FAILED: &str = "registering FUSE io_uring entries";

/// `struct fuse_uring_req_header`: the in or out header (128 bytes),
/// the request's fixed part (128), then `fuse_uring_ent_in_out`.
const HEADER_LEN: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// The number of queues the kernel keeps: one per possible CPU.
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let highest = text
        .trim()
        .split([',', '-'])
        .filter_map(|n| n.parse::<usize>().ok())
        .max();
    highest.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |h| h + 1,
    )
}

/// One entry: its ring, its buffers, and the queue it serves. The
/// buffers never move while the kernel knows their addresses.
struct Entry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    qid: u16,
    header: Box<[u8; HEADER_LEN]>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

// SAFETY: the raw pointers in `iov` point into the entry's own boxed
// buffers, which move with it to its thread and are used only there.
unsafe impl Send for Entry {}

impl Entry {
    fn new(qid: u16) -> Result<Entry> {
        // Only this entry's thread submits, and it reaps completions
        // only when it waits for them: the kernel need not interrupt it
        // to run completion work.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(4)
            .map_err(|e| Error::io("creating an io_uring", e))?;
        let mut header = Box::new([0u8; HEADER_LEN]);
        let mut payload = vec![0u8; super::MAX_WRITE as usize];
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Ok(Entry {
            ring,
            qid,
            header,
            payload,
            iov,
        })
    }

    /// Queues `cmd` (REGISTER or COMMIT_AND_FETCH) for this entry.
    fn push(&mut self, fd: RawFd, cmd: u32, commit_id: u64) -> std::io::Result<()> {
        // struct fuse_uring_cmd_req: flags, commit_id, qid.
        let mut data = [0u8; 80];
        data[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        data[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd)
            .cmd(data)
            .addr(Some(self.iov.as_ptr() as u64))
            .build();
        let sqe = with_two_iovecs(sqe);
        // SAFETY: the iovecs and buffers live as long as the entry, and
        // an entry whose command may still be in flight is never freed
        // (`abandon`).
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))
    }

    /// Submits what was queued and waits for the next completion: its
    /// result (0: a request is in the buffers).
    fn next(&mut self) -> std::io::Result<i32> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            if let Some(c) = self.ring.completion().next() {
                return Ok(c.result());
            }
        }
    }

    /// A completion that arrived during submission (REGISTER fails
    /// synchronously), if any.
    fn early_result(&mut self) -> std::io::Result<Option<i32>> {
        // With deferred task work, a completion is posted only when the
        // thread asks for events: a wait for one that times out at once
        // does that.
        let now = types::Timespec::new();
        let args = types::SubmitArgs::new().timespec(&now);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) => return Err(e),
        }
        Ok(self.ring.completion().next().map(|c| c.result()))
    }

    /// Answers the request in the buffers; returns its commit id.
    fn serve(&mut self, handler: &dyn Handler) -> u64 {
        let ent = &self.header[ENT_IN_OUT..];
        let commit_id = u64::from_ne_bytes(ent[8..16].try_into().unwrap_or([0; 8]));
        let payload_sz = u32::from_ne_bytes(ent[16..20].try_into().unwrap_or([0; 4])) as usize;
        let (reply, unique) = match request::header(&self.header[..]) {
            Ok((h, _)) => {
                let fixed = &self.header[OP_IN..OP_IN + proto::fixed_len(h.opcode).min(OP_IN)];
                let rest = &self.payload[..payload_sz.min(self.payload.len())];
                let reply = match request::decode(h.opcode, fixed, rest) {
                    // A READ has no rest: the payload buffer is free for
                    // its data, which is then not copied again.
                    Ok(request::Op::Read { offset, size }) => {
                        let op = request::Op::Read { offset, size };
                        let payload = &mut self.payload;
                        answer_or_eio(handler, h.opcode, || handler.handle_into(&h, op, payload))
                    }
                    Ok(op) => answer_or_eio(handler, h.opcode, || handler.handle(&h, op)),
                    Err(e) => {
                        tracing::error!(opcode = h.opcode, error = %e, "answered EIO");
                        Reply::Error(libc::EIO)
                    }
                };
                (reply, h.unique)
            }
            Err(e) => {
                tracing::error!(error = %e, "a ring request without a readable header");
                (Reply::Error(libc::EIO), 0)
            }
        };
        self.put_reply(unique, reply);
        commit_id
    }

    /// Writes the out header and the reply's body into the buffers.
    fn put_reply(&mut self, unique: u64, reply: Reply) {
        let (error, len) = match reply {
            Reply::Data(d) if d.len() <= self.payload.len() => {
                self.payload[..d.len()].copy_from_slice(&d);
                (0, d.len())
            }
            Reply::Data(d) => {
                tracing::error!(len = d.len(), "a reply larger than the ring's buffer: EIO");
                (-libc::EIO, 0)
            }
            Reply::Placed(n) if n <= self.payload.len() => (0, n),
            Reply::Placed(_) => (-libc::EIO, 0),
            Reply::Error(e) => (-e, 0),
            Reply::Nothing => (0, 0),
        };
        self.header[..proto::OUT_HEADER].copy_from_slice(&proto::out_header(unique, error, len));
        self.header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
    }
}

/// `UringCmd80` leaves the SQE's `len` at 0; FUSE wants the number of
/// iovecs (two) there. The entry is `repr(C)` bytes: `len` is the u32 at
/// offset 24 of `struct io_uring_sqe`.
fn with_two_iovecs(sqe: squeue::Entry128) -> squeue::Entry128 {
    // SAFETY: Entry128 is repr(C), 128 bytes of plain data (a zeroed
    // io_uring_sqe and 64 command bytes).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: the same bytes with one field changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// What a ring thread reports: its ring made (prepare), then its
/// entry registered (start), or why not.
type Report = std::result::Result<(), String>;

/// A ring thread waiting for the handler: where to send it, and the
/// thread.
type Waiting = (mpsc::Sender<Arc<dyn Handler>>, std::thread::JoinHandle<()>);

/// The rings of a session, each made by its own thread before INIT is
/// answered (so that a failure can still choose /dev/fuse); the threads
/// then wait for the handler and the word to register.
pub struct Rings {
    threads: Vec<Waiting>,
    reports: mpsc::Receiver<Report>,
    /// (queues, entries per queue)
    shape: (usize, usize),
}

impl Rings {
    /// `threads` entries, each with its thread and ring, spread over
    /// the kernel's queues, at least one each.
    pub fn prepare(fd: RawFd, threads: usize) -> Result<Rings> {
        let queues = possible_cpus();
        let per_queue = (threads / queues).max(1);
        let (report, reports) = mpsc::channel();
        let mut rings = Rings {
            threads: Vec::with_capacity(queues * per_queue),
            reports,
            shape: (0, 0),
        };
        for q in 0..queues {
            for i in 0..per_queue {
                let (go, wait) = mpsc::channel::<Arc<dyn Handler>>();
                let report = report.clone();
                let t = std::thread::Builder::new()
                    .name(format!("fuse-ring-{q}-{i}"))
                    .spawn(move || ring_thread(fd, q as u16, &report, &wait))
                    .map_err(|e| Error::io("starting an io_uring thread", e))?;
                rings.threads.push((go, t));
            }
        }
        // Dropping `rings` on an error tells the threads made so far to
        // end (their `go` channels close).
        wait_all(&rings.reports, rings.threads.len(), "creating an io_uring")?;
        rings.shape = (queues, per_queue);
        Ok(rings)
    }

    /// Registers every entry (INIT has been answered) and serves. An
    /// entry the kernel refuses fails the session: with io_uring agreed,
    /// the kernel holds every request until each queue has an entry.
    fn start(self, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()> {
        let Rings {
            threads, reports, ..
        } = self;
        let count = threads.len();
        for (go, t) in threads {
            // A thread that already ended reports so below.
            let _ = go.send(handler.clone());
            running.adopt(t);
        }
        wait_all(&reports, count, REGISTER_FAILED)
    }
}

/// Waits for a report from each of `count` threads; the first failure
/// is an error in the context `what`.
fn wait_all(reports: &mpsc::Receiver<Report>, count: usize, what: &str) -> Result<()> {
    for _ in 0..count {
        let failed = match reports.recv() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => "an io_uring thread ended".into(),
        };
        return Err(Error::io(what, std::io::Error::other(failed)));
    }
    Ok(())
}

impl Carrier for Rings {
    fn init_flags(&self) -> u64 {
        proto::init::OVER_IO_URING
    }

    /// One /dev/fuse thread for FORGET and INTERRUPT, then the rings.
    fn carry(self: Box<Self>, running: &mut Running, handler: Arc<dyn Handler>) -> Result<()> {
        super::dev::start(running, handler.clone(), (1, 1), std::time::Duration::ZERO)?;
        self.start(running, handler)
    }

    fn describe(&self) -> String {
        let (queues, per_queue) = self.shape;
        format!("io_uring, {queues} queues with {per_queue} entries each (offered by the kernel)")
    }
}

/// One entry's thread: makes its ring on its queue's CPU, waits for the
/// handler, registers, then serves.
fn ring_thread(
    fd: RawFd,
    qid: u16,
    report: &mpsc::Sender<Report>,
    wait: &mpsc::Receiver<Arc<dyn Handler>>,
) {
    pin_to_cpu(qid);
    let mut entry = match Entry::new(qid) {
        Ok(e) => e,
        Err(e) => {
            let _ = report.send(Err(e.to_string()));
            return;
        }
    };
    let _ = report.send(Ok(()));
    let Ok(handler) = wait.recv() else { return };
    let first = entry
        .push(fd, CMD_REGISTER, 0)
        .and_then(|()| entry.early_result());
    let first = match first {
        Ok(Some(r)) if r < 0 => Err(std::io::Error::from_raw_os_error(-r).to_string()),
        Ok(r) => Ok(r),
        Err(e) => Err(e.to_string()),
    };
    let _ = report.send(first.as_ref().map(|_| ()).map_err(Clone::clone));
    if let Ok(r) = first {
        serve(entry, fd, &*handler, r);
    } else {
        abandon(entry);
    }
}

/// Serves requests on `entry` until the session ends. `first`: a
/// completion that came with the registration.
fn serve(mut entry: Entry, fd: RawFd, handler: &dyn Handler, first: Option<i32>) {
    let mut result = first;
    loop {
        let r = match result.take() {
            Some(r) => r,
            None => match entry.next() {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "io_uring wait failed; this entry stops");
                    return abandon(entry);
                }
            },
        };
        let next = match r {
            0.. => {
                let commit_id = entry.serve(handler);
                entry.push(fd, CMD_COMMIT_AND_FETCH, commit_id)
            }
            e if -e == libc::EINTR || -e == libc::EAGAIN => entry.push(fd, CMD_REGISTER, 0),
            // ENOTCONN and the like: the session is over.
            _ => return,
        };
        if let Err(e) = next {
            tracing::error!(error = %e, "io_uring submission failed; this entry stops");
            return;
        }
    }
}

/// Leaks an entry whose command may still be in flight: the kernel may
/// yet copy a request into its buffers, so they must never be freed.
/// Only a failing ring comes here; an entry whose command completed
/// (the session ended) is dropped normally.
fn abandon(entry: Entry) {
    std::mem::forget(entry);
}

/// Runs the calling thread on `cpu` only, where the kernel sends the
/// queue's requests from; a CPU that is offline leaves it unpinned.
fn pin_to_cpu(cpu: u16) {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for any
    // cpu below CPU_SETSIZE, which is checked.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if usize::from(cpu) >= libc::CPU_SETSIZE as usize {
            return;
        }
        libc::CPU_SET(usize::from(cpu), &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
