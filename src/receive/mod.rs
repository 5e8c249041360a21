//! `canopy receive`, carried out inside the daemon: read-only subvolumes
//! from send streams (Canopy's or kernel btrfs's), after `btrfs receive`.
//!
//! The command copies its input to the daemon over the control socket
//! (`fuse::receive`); the daemon reads the stream from there and applies
//! each command with the filesystem's own operations, so a received file
//! costs no FUSE request at all (through the mount it cost five or six:
//! create, writes, chmod, close, utimes).
//!
//! A stream starts with `subvol` (a new subvolume) or `snapshot` (a
//! writable snapshot of the parent it names, found among the
//! filesystem's subvolumes by the uuid it was received from, or its own);
//! every path it names is resolved beneath the new subvolume (`paths`);
//! at its end the subvolume records the uuid it was received from and
//! becomes read-only. A receive that fails, or whose input ends early
//! (the command interrupted or killed), deletes the subvolume it was
//! making: no half subvolume is left (btrfs leaves it writable; Canopy
//! does not).
//!
//! The kernel caches names and attributes for 60 s, and these changes do
//! not pass through it: every name the receive changes is dropped from
//! its cache at once, and the attributes and pages of every node it
//! changed when the subvolume is finished.

mod apply;
mod paths;

use crate::error::{Error, Result};
use crate::format::inode::ROOT_DIR_INO;
use crate::format::uuid::shown as format_uuid;
use crate::fs::{node_id, Fs, Owner};
use crate::stream::{Command, Reader};
use serde::{Deserialize, Serialize};

/// What to receive, and where.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Request {
    /// The directory the subvolumes appear in (a node id).
    pub dir: u64,
    /// Stop after the first stream's end (more may follow in the input).
    #[serde(default)]
    pub stop_at_end: bool,
}

/// What one received subvolume amounted to.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Its name in the directory received into.
    pub name: String,
    pub uuid: String,
    pub parent_uuid: Option<String>,
    /// Stream bytes and commands it took.
    pub bytes: u64,
    pub commands: u64,
    /// Entries made.
    pub files: u64,
}

/// How far a receive has got.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Event {
    /// Of the subvolume being received: stream bytes read, entries made.
    Progress { bytes: u64, files: u64 },
    /// A subvolume finished.
    Received(Report),
}

/// The kernel's caches of what the receive changes behind its back.
pub trait KernelCache {
    /// `name` in directory `dir` was made, removed or renamed.
    fn entry_changed(&self, dir: u64, name: &[u8]);
    /// `node`'s attributes, data or entries changed.
    fn node_changed(&self, node: u64);
}

/// Commands between two progress events.
const PROGRESS_EVERY: u64 = 1024;

/// Batches of commands the parsing thread may read ahead of the one
/// applying them. A batch ends at [`BATCH_COMMANDS`] commands or
/// [`BATCH_BYTES`] of stream, so the threads meet once per batch, not
/// once per command (a file is five or six commands).
const PARSED_AHEAD: usize = 4;
const BATCH_COMMANDS: usize = 256;
const BATCH_BYTES: u64 = 2 << 20;

/// Receives the streams in `input` into directory `req.dir`, one
/// subvolume each, until the input ends (or after the first, with
/// `stop_at_end`).
///
/// A thread of its own reads, checks and decodes the commands while this
/// one applies them (reading and checksumming were a fifth of the
/// receive's time on one thread). When applying fails, `stop_input`
/// must end a read the parsing thread may be blocked in (the socket's
/// reading half shut, say), so the error is answered at once.
pub fn receive<R: std::io::Read + Send>(
    fs: &Fs,
    req: &Request,
    input: R,
    stop_input: &(dyn Fn() + Sync),
    kernel: &dyn KernelCache,
    events: &mut dyn FnMut(Event),
) -> Result<()> {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel(PARSED_AHEAD);
        let stop_at_end = req.stop_at_end;
        std::thread::Builder::new()
            .name("receive-parse".into())
            .spawn_scoped(scope, move || parse(input, stop_at_end, tx))
            .map_err(|e| Error::io("starting the stream's parsing thread", e))?;
        let mut commands = Commands {
            rx,
            batch: Vec::new().into_iter(),
            end: None,
            bytes: 0,
        };
        let result = receive_commands(fs, req, &mut commands, kernel, events);
        if result.is_err() {
            stop_input();
        }
        // Dropping the receiving end stops a parser that is sending.
        drop(commands);
        result
    })
}

/// Commands as the parsing thread hands them over, each with the stream
/// bytes read up to its end; then, if the batch ends the parsing, why:
/// Ok at the input's end, or the error.
struct Batch {
    commands: Vec<(Command, u64)>,
    end: Option<Result<()>>,
}

/// How much of the input the parsing thread reads at once.
const READ_BUFFER: usize = 1 << 20;

/// The parsing thread: commands from `input` until its end, an error,
/// the first stream's end with `stop_at_end`, or the applier gone. A
/// batch also ends before a read that may wait for the input, so what
/// came is applied while the rest is on its way.
fn parse<R: std::io::Read>(input: R, stop_at_end: bool, tx: std::sync::mpsc::SyncSender<Batch>) {
    let input = std::io::BufReader::with_capacity(READ_BUFFER, input);
    let mut r = match Reader::new(input) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Batch {
                commands: Vec::new(),
                end: Some(Err(e)),
            });
            return;
        }
    };
    loop {
        let mut batch = Batch {
            commands: Vec::with_capacity(BATCH_COMMANDS),
            end: None,
        };
        let start = r.bytes_read();
        while batch.end.is_none()
            && batch.commands.len() < BATCH_COMMANDS
            && r.bytes_read() - start < BATCH_BYTES
            && (batch.commands.is_empty() || r.next_is_buffered())
        {
            match r.read_command() {
                Ok(Some(c)) => {
                    let last = stop_at_end && c == Command::End;
                    batch.commands.push((c, r.bytes_read()));
                    if last {
                        batch.end = Some(Ok(()));
                    }
                }
                Ok(None) => batch.end = Some(Ok(())),
                Err(e) => batch.end = Some(Err(e)),
            }
        }
        let last = batch.end.is_some();
        if tx.send(batch).is_err() || last {
            return;
        }
    }
}

/// The applying side of the parsing thread's channel.
struct Commands {
    rx: std::sync::mpsc::Receiver<Batch>,
    batch: std::vec::IntoIter<(Command, u64)>,
    /// How the parsing ended, once its last batch came.
    end: Option<Result<()>>,
    /// Stream bytes read up to the last command taken.
    bytes: u64,
}

impl Commands {
    /// The next command; None at the end of the input.
    fn next(&mut self) -> Result<Option<Command>> {
        loop {
            if let Some((c, bytes)) = self.batch.next() {
                self.bytes = bytes;
                return Ok(Some(c));
            }
            if let Some(end) = self.end.take() {
                // Reported once; the parser has stopped after it.
                self.end = Some(Ok(()));
                return end.map(|()| None);
            }
            match self.rx.recv() {
                Ok(b) => {
                    self.batch = b.commands.into_iter();
                    self.end = b.end;
                }
                // The parser stops only after a batch with its end.
                Err(_) => return Ok(None),
            }
        }
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

fn receive_commands(
    fs: &Fs,
    req: &Request,
    r: &mut Commands,
    kernel: &dyn KernelCache,
    events: &mut dyn FnMut(Event),
) -> Result<()> {
    let mut received = 0;
    loop {
        let Some(first) = r.next()? else {
            return match received {
                0 => Err(Error::Invalid("the stream holds no subvolume".into())),
                _ => Ok(()),
            };
        };
        let mut one = Receiving::start(fs, kernel, req.dir, first)?;
        match one.fill(r, events) {
            Ok(report) => events(Event::Received(report)),
            Err(e) => return Err(one.abandon(e)),
        }
        received += 1;
        if req.stop_at_end {
            return Ok(());
        }
    }
}

/// A subvolume being received.
struct Receiving<'a> {
    fs: &'a Fs,
    kernel: &'a dyn KernelCache,
    dir: u64,
    name: Vec<u8>,
    /// Its root's node id.
    root: u64,
    uuid: [u8; 16],
    /// The sender's transid of the subvolume, recorded at the end.
    stransid: u64,
    parent_uuid: Option<[u8; 16]>,
}

impl<'a> Receiving<'a> {
    /// Creates the subvolume the stream's first command asks for.
    fn start(
        fs: &'a Fs,
        kernel: &'a dyn KernelCache,
        dir: u64,
        first: Command,
    ) -> Result<Receiving<'a>> {
        let (name, uuid, stransid, parent_uuid) = match first {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => (path, uuid, ctransid, None),
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                ..
            } => (path, uuid, ctransid, Some(clone_uuid)),
            c => {
                return Err(Error::Invalid(format!(
                    "the stream starts with {} instead of subvol or snapshot",
                    c.name()
                )))
            }
        };
        if name.is_empty()
            || name.contains(&b'/')
            || name.contains(&0)
            || name == b"."
            || name == b".."
        {
            return Err(Error::Invalid(format!(
                "the stream names its subvolume {:?}",
                String::from_utf8_lossy(&name)
            )));
        }
        let shown = String::from_utf8_lossy(&name).into_owned();
        match fs.lookup(dir, &name) {
            Ok(_) => return Err(Error::Invalid(format!("{shown} exists already"))),
            Err(Error::NotFound) => {}
            Err(e) => return Err(Error::Invalid(format!("looking up {shown}: {e}"))),
        }
        let made = match parent_uuid {
            None => fs.create_subvolume(dir, &name, Owner { uid: 0, gid: 0 }),
            Some(p) => fs.snapshot(find_subvolume(fs, &p)?, dir, &name, false),
        };
        let root = made
            .map_err(|e| Error::Invalid(format!("creating {shown}: {e}")))?
            .ino;
        kernel.entry_changed(dir, &name);
        Ok(Receiving {
            fs,
            kernel,
            dir,
            name,
            root,
            uuid,
            stransid,
            parent_uuid,
        })
    }

    /// Carries out the stream's commands up to its end, then makes the
    /// subvolume read-only and records where it came from.
    fn fill(&mut self, r: &mut Commands, events: &mut dyn FnMut(Event)) -> Result<Report> {
        let start = r.bytes_read();
        let fs = self.fs;
        let mut target = apply::Target::new(fs, self.kernel, self.root, self.uuid);
        // Clones name their source by uuid, often the same one many times.
        let mut known = std::collections::HashMap::new();
        let mut find = |u: &[u8; 16]| -> Result<u64> {
            if let Some(&root) = known.get(u) {
                return Ok(root);
            }
            let root = find_subvolume(fs, u)?;
            known.insert(*u, root);
            Ok(root)
        };
        let mut commands = 0u64;
        let result = loop {
            let c = match r.next() {
                Ok(Some(c)) => c,
                Ok(None) => {
                    break Err(Error::Invalid(
                        "the stream ends before its end command (truncated?)".into(),
                    ))
                }
                Err(e) => break Err(e),
            };
            commands += 1;
            if c == Command::End {
                break Ok(());
            }
            if let Err(e) = target.apply(c, &mut find) {
                break Err(e);
            }
            if commands.is_multiple_of(PROGRESS_EVERY) {
                events(Event::Progress {
                    bytes: r.bytes_read() - start,
                    files: target.files,
                });
            }
        };
        target.tell_kernel();
        result?;
        fs.set_received(self.root, self.uuid, self.stransid)?;
        self.kernel.node_changed(self.root);
        Ok(Report {
            name: String::from_utf8_lossy(&self.name).into_owned(),
            uuid: format_uuid(&self.uuid),
            parent_uuid: self.parent_uuid.map(|p| format_uuid(&p)),
            bytes: r.bytes_read() - start,
            commands,
            files: target.files,
        })
    }

    /// Deletes the partial subvolume after `e`: the error, saying what
    /// became of it.
    fn abandon(self, e: Error) -> Error {
        let shown = String::from_utf8_lossy(&self.name).into_owned();
        let gone = self.fs.delete_subvolume(self.dir, &self.name);
        self.kernel.entry_changed(self.dir, &self.name);
        match gone {
            Ok(()) => Error::Invalid(format!(
                "{e}; receive failed: deleted the partial subvolume {shown}"
            )),
            Err(d) => Error::Invalid(format!(
                "{e}; receive failed, and deleting the partial subvolume {shown} failed too: {d}"
            )),
        }
    }
}

/// The root node of the subvolume received from `uuid` (or whose own
/// uuid it is), as btrfs receive looks for a parent.
fn find_subvolume(fs: &Fs, uuid: &[u8; 16]) -> Result<u64> {
    let want = format_uuid(uuid);
    let list = fs.list_subvolumes()?;
    let hit = list
        .iter()
        .find(|s| s.received_uuid.as_deref() == Some(&want))
        .or_else(|| list.iter().find(|s| s.uuid.as_deref() == Some(&want)));
    match hit {
        Some(s) => Ok(node_id(s.id, ROOT_DIR_INO)),
        None => Err(Error::Invalid(format!(
            "cannot find the parent subvolume {want}: receive its stream first (or send without -p)"
        ))),
    }
}
