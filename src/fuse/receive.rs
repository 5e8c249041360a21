//! `canopy receive` over the control socket. After the request line the
//! command copies its input (the send streams) to the socket and shuts
//! its sending half when the input ends; the daemon reads the streams
//! from the socket and applies them (`receive`), answering with JSON
//! lines: one per event (progress, a subvolume received) with `receive`
//! set, then the last one, without it: success or the error. The command
//! going away mid-stream ends the input early, and the daemon deletes
//! the partial subvolume. A receive runs on its own thread, so other
//! commands are answered meanwhile.

use super::control::{open_request, parse_response, talking, write_response, Request, Response};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::receive::{self, Event, KernelCache};
use std::io::{BufRead, BufReader, Read};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The kernel's caches of the mount, told of the receive's changes.
struct Kernel {
    notifier: super::Notifier,
    /// The node the mount's root has in `fs` (the kernel calls it 1).
    root: u64,
}

impl Kernel {
    fn kernel_node(&self, node: u64) -> u64 {
        if node == self.root {
            1
        } else {
            node
        }
    }
}

impl KernelCache for Kernel {
    fn entry_changed(&self, dir: u64, name: &[u8]) {
        // ENOENT: the kernel does not hold the directory; nothing to drop.
        let _ = self.notifier.inval_entry(self.kernel_node(dir), name);
    }

    fn node_changed(&self, node: u64) {
        let _ = self.notifier.inval_inode(self.kernel_node(node), 0, 0);
    }
}

/// Answers a receive request on its own thread.
/// `read_ahead`: the stream's first bytes, read with the request line.
pub(super) fn serve(
    s: UnixStream,
    read_ahead: Vec<u8>,
    fs: Arc<Fs>,
    notifier: super::Notifier,
    req: receive::Request,
) {
    let spawned = std::thread::Builder::new()
        .name("canopy-receive".into())
        .spawn(move || {
            if let Err(e) = receive_from(&s, read_ahead, &fs, notifier, &req) {
                tracing::warn!(error = %e, "receive: the command went away");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a receive thread");
    }
}

fn receive_from(
    s: &UnixStream,
    read_ahead: Vec<u8>,
    fs: &Fs,
    notifier: super::Notifier,
    req: &receive::Request,
) -> std::io::Result<()> {
    s.set_read_timeout(None)?;
    let kernel = Kernel {
        notifier,
        root: fs.root_node(),
    };
    // Events are best effort: a command gone away shows as the input's
    // early end, which fails the receive.
    let mut events = |e: Event| {
        let _ = write_response(
            s,
            &Response {
                receive: Some(e),
                ..Response::ok()
            },
        );
    };
    // Unbuffered: the receive's parsing thread buffers it.
    let input = std::io::Cursor::new(read_ahead).chain(s);
    // A parser blocked reading the socket wakes with the input's end.
    let stop_input = || {
        let _ = s.shutdown(Shutdown::Read);
    };
    let result = receive::receive(fs, req, input, &stop_input, &kernel, &mut events);
    if let Err(e) = &result {
        tracing::warn!(error = %e, "receive failed");
    }
    write_response(s, &Response::of_unit(result))
}

/// How much of the input the command moves to the daemon at once:
/// std's copy of an unbuffered reader moves 8 KiB per call, and each
/// wakes the daemon's receive thread (77,000 wake-ups for a 634 MB
/// stream). Given a `BufReader`, it writes the reader's whole buffer.
const COPY_CHUNK: usize = 1 << 20;

/// A receive asked of the daemon of a mount.
pub struct Session {
    s: UnixStream,
    mountpoint: PathBuf,
}

/// Ends a receive's input early, from another thread (a signal's): the
/// daemon then deletes the partial subvolume and answers.
pub struct Interrupter(UnixStream);

impl Interrupter {
    pub fn interrupt(&self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

impl Session {
    /// Asks the daemon of `mountpoint` for a receive.
    pub fn start(mountpoint: &Path, req: &receive::Request) -> Result<Session> {
        let s = open_request(mountpoint, &Request::Receive(req.clone()))?;
        Ok(Session {
            s,
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn interrupter(&self) -> Result<Interrupter> {
        self.s
            .try_clone()
            .map(Interrupter)
            .map_err(|e| Error::io("cloning the control socket", e))
    }

    /// Copies `input` to the daemon (on a thread of its own) and calls
    /// `events` with what the daemon reports, until its last answer.
    pub fn run(self, input: Box<dyn Read + Send>, events: &mut dyn FnMut(Event)) -> Result<()> {
        let mnt = self.mountpoint.as_path();
        let mut to = self.s.try_clone().map_err(|e| talking(mnt, e))?;
        // The daemon may stop reading early (an error, or -e): the copy
        // then fails, and the answer says why.
        std::thread::Builder::new()
            .name("receive-input".into())
            .spawn(move || {
                let mut input = BufReader::with_capacity(COPY_CHUNK, input);
                let _ = std::io::copy(&mut input, &mut to);
                let _ = to.shutdown(Shutdown::Write);
            })
            .map_err(|e| Error::io("starting the input thread", e))?;
        let mut r = BufReader::new(&self.s);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).map_err(|e| talking(mnt, e))? == 0 {
                return Err(Error::Invalid(format!(
                    "the daemon of {} went away during the receive",
                    mnt.display()
                )));
            }
            let resp = parse_response(mnt, &line)?;
            match resp.receive {
                Some(e) => events(e),
                None if resp.ok => return Ok(()),
                None => {
                    return Err(Error::Invalid(
                        resp.error.unwrap_or_else(|| "receive failed".into()),
                    ))
                }
            }
        }
    }
}
