//! `canopy send`: a read-only subvolume as a btrfs send stream, whole or
//! as the difference from a parent snapshot.
//!
//! A full send is the difference from an empty subvolume, so both go one
//! way. The inodes to look at are every inode (full) or those whose items
//! differ from the parent's, found by comparing the two trees and skipping
//! every block they share (`tree::differing_keys`): the work grows with
//! the change, not with the snapshot. Then, keeping a model of the
//! receiver's names as commands change them (`names`):
//!
//! 1. every name that goes away is freed: unlinked, or for an inode that
//!    keeps living under other names only, renamed to an orphan name
//!    (`o<ino>-<transid>-<n>`) in the subvolume's root; a directory that
//!    moves or goes is renamed to its orphan name;
//! 2. inodes are created or put at their new names parents first (by
//!    depth in the new tree), with their data, owner, mode and xattrs;
//! 3. directories that went are removed (all are orphans in the root by
//!    then, and empty); then every changed inode gets its times.
//!
//! Freeing every leaving name first is what makes the orderings btrfs
//! send is careful about come out right without special cases: a name
//! taken over by another inode, two names swapped, a directory moved
//! under its former child.

mod data;
mod names;

use crate::error::{Error, Result};
use crate::fs::{Fs, SubvolView};
use crate::stream::{Command, Writer};
use serde::{Deserialize, Serialize};
use std::io::Write;

/// What to send.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Request {
    /// The subvolume to send (its root's node id).
    pub snapshot: u64,
    /// The parent for an incremental send (its root's node id).
    pub parent: Option<u64>,
    /// Subvolumes the receiver holds whose extents may be sent as clones.
    #[serde(default)]
    pub clone_sources: Vec<u64>,
    /// The stream version: 1 or 2.
    pub proto: u32,
    /// The subvolume's name in the stream (what the receiver creates).
    pub name: Vec<u8>,
}

/// What a send wrote.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    pub bytes: u64,
    pub commands: u64,
    /// Inodes created, changed or deleted.
    pub inodes: u64,
    /// Of those, the ones sent so far (progress).
    #[serde(default)]
    pub done: u64,
    /// File bytes sent as data, and as clones.
    pub data_bytes: u64,
    pub cloned_bytes: u64,
    pub incremental: bool,
}

/// Progress a long send reports: bytes written and inodes done.
pub type Progress<'a> = &'a mut dyn FnMut(&Summary);

/// Writes the stream of `req` to `out`.
pub fn send(
    fs: &Fs,
    req: &Request,
    out: &mut dyn Write,
    progress: Progress<'_>,
) -> Result<Summary> {
    let new = fs.subvolume_view(req.snapshot)?;
    let parent = req
        .parent
        .map(|p| fs.subvolume_view(p).map(std::sync::Arc::new))
        .transpose()?;
    if parent.as_ref().is_some_and(|p| p.tree() == new.tree()) {
        return Err(Error::Invalid("the parent is the subvolume itself".into()));
    }
    let sources = req
        .clone_sources
        .iter()
        .map(|&n| fs.subvolume_view(n))
        .collect::<Result<Vec<_>>>()?;
    let mut s = Sender::new(new, parent, sources, Writer::new(out, req.proto)?)?;
    s.start(&req.name)?;
    s.run(progress)?;
    s.put(&Command::End)?;
    s.w.flush()?;
    s.summary.bytes = s.w.written();
    Ok(s.summary)
}

/// One send in progress.
pub(crate) struct Sender<'w> {
    pub(crate) new: SubvolView,
    pub(crate) old: Option<std::sync::Arc<SubvolView>>,
    pub(crate) sources: Vec<SubvolView>,
    pub(crate) w: Writer<&'w mut dyn Write>,
    pub(crate) summary: Summary,
    pub(crate) uuid: [u8; 16],
    pub(crate) ctransid: u64,
    /// Extents sent so far, for clones within the stream.
    pub(crate) sent: data::SentExtents,
    pub(crate) clone_index: Option<data::CloneIndex>,
    /// The newest ctransid of the clone sources and the parent (None:
    /// none): an extent written after it is in none of them.
    pub(crate) sources_ctransid: Option<u64>,
}

impl<'w> Sender<'w> {
    fn new(
        new: SubvolView,
        old: Option<std::sync::Arc<SubvolView>>,
        sources: Vec<SubvolView>,
        w: Writer<&'w mut dyn Write>,
    ) -> Result<Sender<'w>> {
        let ident = new.ident()?;
        // A subvolume received from elsewhere is named as its origin, so
        // a chain of send and receive keeps finding parents (as btrfs).
        let uuid = match ident.received_uuid {
            u if u != [0; 16] => u,
            _ => ident.uuid,
        };
        let ctransid = match ident.received_uuid != [0; 16] {
            true => ident.stransid,
            false => ident.ctransid,
        };
        let mut s = Sender {
            new,
            old,
            sources,
            w,
            summary: Summary::default(),
            uuid,
            ctransid,
            sent: Default::default(),
            clone_index: None,
            sources_ctransid: None,
        };
        let mut newest = None;
        for v in s.source_views() {
            newest = newest.max(Some(v.ident()?.ctransid));
        }
        s.sources_ctransid = newest;
        Ok(s)
    }

    pub(crate) fn put(&mut self, c: &Command) -> Result<()> {
        self.summary.commands += 1;
        self.w.put(c)
    }

    fn start(&mut self, name: &[u8]) -> Result<()> {
        let path = name.to_vec();
        match &self.old {
            None => self.put(&Command::Subvol {
                path,
                uuid: self.uuid,
                ctransid: self.ctransid,
            }),
            Some(old) => {
                let (clone_uuid, clone_ctransid) = stream_ident(old)?;
                self.summary.incremental = true;
                self.put(&Command::Snapshot {
                    path,
                    uuid: self.uuid,
                    ctransid: self.ctransid,
                    clone_uuid,
                    clone_ctransid,
                })
            }
        }
    }
}

/// How a stream names subvolume `v`: by the uuid it was received from,
/// if any, else its own.
pub(crate) fn stream_ident(v: &SubvolView) -> Result<([u8; 16], u64)> {
    let i = v.ident()?;
    Ok(match i.received_uuid != [0; 16] {
        true => (i.received_uuid, i.stransid),
        false => (i.uuid, i.ctransid),
    })
}
