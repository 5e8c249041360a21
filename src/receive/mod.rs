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

/// Receives the streams in `input` into directory `req.dir`, one
/// subvolume each, until the input ends (or after the first, with
/// `stop_at_end`).
pub fn receive<R: std::io::Read>(
    fs: &Fs,
    req: &Request,
    input: R,
    kernel: &dyn KernelCache,
    events: &mut dyn FnMut(Event),
) -> Result<()> {
    let mut r = Reader::new(input)?;
    let mut received = 0;
    loop {
        let Some(first) = r.read_command()? else {
            return match received {
                0 => Err(Error::Invalid("the stream holds no subvolume".into())),
                _ => Ok(()),
            };
        };
        let mut one = Receiving::start(fs, kernel, req.dir, first)?;
        match one.fill(&mut r, events) {
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
    fn fill<R: std::io::Read>(
        &mut self,
        r: &mut Reader<R>,
        events: &mut dyn FnMut(Event),
    ) -> Result<Report> {
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
            let c = match r.read_command() {
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
