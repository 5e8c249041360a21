//! Compression as files see it: the `compression` property (the
//! `btrfs.compression` xattr, inherited by new files and directories),
//! and the compsize report of what a tree of files holds on disk.
//! Writeback does the compressing (`writeback::flush`), the codecs live in
//! `crate::compress`.

use super::{errno, file, is_dir, Fs, Subvol};
use crate::compress::{Codec, PROPERTY};
use crate::error::Result;
use crate::format::inode::INODE_NOCOMPRESS;
use crate::format::inode::ROOT_DIR_INO;
use crate::format::items::{FileExtentItem, FILE_EXTENT_INLINE, FILE_EXTENT_PREALLOC};
use crate::format::tree_id;
use crate::txn::Txn;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Whether `name` is the compression property's xattr.
pub fn is_property(name: &[u8]) -> bool {
    name == PROPERTY
}

/// Checks a value set on the property: a codec name, or none/no. The
/// empty value removes the property (as btrfs takes it).
pub(crate) fn check_value(mode: u32, value: &[u8]) -> Result<()> {
    if mode & libc::S_IFMT != libc::S_IFREG && !is_dir(mode) {
        return Err(errno(
            libc::EINVAL,
            "compression is a property of files and directories",
        ));
    }
    let parsed = std::str::from_utf8(value)
        .ok()
        .map(|s| Codec::parse(s.trim_end_matches('\0')));
    match parsed {
        Some(Ok(_)) => Ok(()),
        _ => Err(errno(
            libc::EINVAL,
            "compression takes zstd, zstd:LEVEL, lz4 or none",
        )),
    }
}

/// The property a new inode of `mode` made in `parent` inherits.
pub(crate) fn inherited(
    tx: &Txn<'_>,
    tree: u64,
    parent: u64,
    mode: u32,
) -> Result<Option<Vec<u8>>> {
    if mode & libc::S_IFMT != libc::S_IFREG && !is_dir(mode) {
        return Ok(None);
    }
    let root = tx.root_of(tree)?;
    super::xattr::find(tx, &root, parent, PROPERTY)
}

/// Setting the property asks writeback to try again on a file it gave
/// up on.
pub(crate) fn forget_giving_up(flags: u64) -> u64 {
    flags & !INODE_NOCOMPRESS
}

/// One row of the compsize report: extents of one encoding.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CompsizeRow {
    /// none, zstd, lz4 or prealloc.
    pub kind: String,
    /// Bytes the extents take on disk (each extent once).
    pub disk: u64,
    /// Bytes they decode to (each extent once).
    pub uncompressed: u64,
    /// Bytes of files that reference them (shared extents once per
    /// reference).
    pub referenced: u64,
}

/// What `canopy filesystem du` reports, after the `compsize` tool.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Compsize {
    pub files: u64,
    pub regular_extents: u64,
    pub refs: u64,
    pub inline: u64,
    /// Bytes inline items store (in tree blocks, not data extents; btrfs
    /// counts them as metadata).
    #[serde(default)]
    pub inline_disk: u64,
    pub total: CompsizeRow,
    pub kinds: Vec<CompsizeRow>,
    /// Bytes of file data (as files reference them) in extents that no
    /// other file, place in a file or snapshot holds: what deleting these
    /// files would free (`btrfs filesystem du`'s Exclusive).
    #[serde(default)]
    pub exclusive: u64,
    /// Bytes of the extents these files share with others (or among
    /// themselves), each byte once (`btrfs filesystem du`'s Set shared).
    #[serde(default)]
    pub set_shared: u64,
}

/// Sums as the walk goes.
#[derive(Default)]
struct Tally {
    report: Compsize,
    rows: BTreeMap<&'static str, CompsizeRow>,
    extents: HashSet<u64>,
    inodes: HashSet<u64>,
    /// The shared bytes met, as ranges of the logical address space.
    shared: super::rangeset::RangeSet,
}

impl Tally {
    fn add(&mut self, kind: &'static str, (disk, uncompressed, referenced): (u64, u64, u64)) {
        for row in [self.rows.entry(kind).or_default(), &mut self.report.total] {
            row.disk += disk;
            row.uncompressed += uncompressed;
            row.referenced += referenced;
        }
    }

    /// Counts `fe`'s bytes as exclusive or shared: `sharing` is its data
    /// extent's reference count and the subvolumes reaching it.
    fn sharing(&mut self, fe: &FileExtentItem, (refs, roots): (u64, usize)) {
        if refs <= 1 && roots <= 1 {
            self.report.exclusive += fe.num_bytes;
        } else {
            let start = fe.disk_bytenr + fe.offset;
            self.shared.insert(start, start + fe.num_bytes);
        }
    }

    fn extent(&mut self, fe: &FileExtentItem) {
        if fe.kind == FILE_EXTENT_INLINE {
            self.report.inline += 1;
            self.report.inline_disk += fe.inline_data.len() as u64;
            let kind = Codec::name_of(fe.compression);
            let (n, ram) = (fe.inline_data.len() as u64, file::item_len(fe));
            return self.add(kind, (n, ram, ram));
        }
        if fe.disk_bytenr == 0 {
            return;
        }
        let kind = match (fe.kind, fe.compression) {
            (FILE_EXTENT_PREALLOC, _) => "prealloc",
            (_, c) => crate::compress::Codec::name_of(c),
        };
        self.report.refs += 1;
        let first = self.extents.insert(fe.disk_bytenr);
        if first {
            self.report.regular_extents += 1;
        }
        let (disk, ram) = match first {
            true => (fe.disk_num_bytes, fe.ram_bytes),
            false => (0, 0),
        };
        self.add(kind, (disk, ram, fe.num_bytes));
    }
}

impl Fs {
    /// The compsize report of `node` and everything under it (nested
    /// subvolumes included; each inode once, however many links it has).
    pub fn compsize(&self, node: u64) -> Result<Compsize> {
        let mut tally = Tally::default();
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            if !tally.inodes.insert(n) {
                continue;
            }
            let (sv, ino) = self.at(n)?;
            sv.compsize_inode(ino, &mut tally, &mut stack)?;
        }
        let mut report = tally.report;
        report.set_shared = tally.shared.to_vec().iter().map(|(s, e)| e - s).sum();
        report.kinds = tally
            .rows
            .into_iter()
            .map(|(kind, row)| CompsizeRow {
                kind: kind.to_string(),
                ..row
            })
            .collect();
        report.total.kind = "TOTAL".into();
        Ok(report)
    }
}

impl Subvol {
    /// Adds a file's extents to the tally, or a directory's entries to
    /// the walk.
    fn compsize_inode(&self, ino: u64, tally: &mut Tally, stack: &mut Vec<u64>) -> Result<()> {
        /// Entries read under one hold of the engine's read lock.
        const BATCH: usize = 4096;
        let mut from = 2;
        loop {
            let more = self.core.engine.read(|r| {
                let i = self.inode_r(r, ino)?;
                let root = r.root(self.tree)?;
                if i.mode & libc::S_IFMT == libc::S_IFREG {
                    tally.report.files += 1;
                    let mut walk = crate::qgroup::roots::RootsWalk::new(r.root(tree_id::EXTENT)?);
                    for (_, fe) in file::items_in(r, &root, ino, 0, u64::MAX)? {
                        tally.extent(&fe);
                        // Inline data is the file's own, as are holes.
                        if fe.kind == FILE_EXTENT_INLINE {
                            tally.report.exclusive += file::item_len(&fe);
                        } else if fe.disk_bytenr != 0 {
                            let (refs, roots) = walk.data_sharing(r, fe.disk_bytenr)?;
                            tally.sharing(&fe, (refs, roots.len()));
                        }
                    }
                    return Ok(None);
                }
                if !is_dir(i.mode) {
                    return Ok(None);
                }
                let entries = super::dir::list(r, &root, ino, (from, u64::MAX), BATCH)?;
                for e in &entries {
                    stack.push(match e.is_subvolume() {
                        true => super::node_id(e.ino, ROOT_DIR_INO),
                        false => self.node(e.ino)?,
                    });
                }
                Ok((entries.len() == BATCH).then(|| entries.last().map_or(from, |e| e.index + 1)))
            })?;
            match more {
                Some(next) => from = next,
                None => return Ok(()),
            }
        }
    }
}
