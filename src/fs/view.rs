//! A read-only subvolume as `canopy send` reads it: its inodes, names,
//! attributes, extents and data, and which inodes differ from another
//! snapshot. Each call holds the engine's read lock only for itself; a
//! read-only subvolume's contents do not change between calls (balance
//! may move its blocks, not what they hold).

use super::{dir, file, xattr, Core, Fs, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{InodeItem, ROOT_DIR_INO};
use crate::format::items::{FileExtentItem, SubvolIdent};
use crate::format::key_type::INODE_ITEM;
use crate::format::Key;
use crate::tree::Cursor;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One read-only subvolume, for send.
pub struct SubvolView {
    core: Arc<Core>,
    sv: Arc<Subvol>,
}

impl Fs {
    /// The subvolume whose root directory is `node`, which must be
    /// read-only (EINVAL otherwise, as `btrfs send` refuses), unless the
    /// whole filesystem is opened read-only (a read-only mount of an RBD
    /// snapshot): nothing in it can change then.
    pub fn subvolume_view(&self, node: u64) -> Result<SubvolView> {
        let (sv, ino) = self.at(node)?;
        if ino != ROOT_DIR_INO {
            return Err(Error::Invalid(
                "not a subvolume (its root directory)".into(),
            ));
        }
        if !sv.readonly.load(Ordering::Relaxed) && !self.engine().is_read_only() {
            return Err(Error::Invalid(
                "the subvolume is not read-only (snapshot it with -r, or set the ro property)"
                    .into(),
            ));
        }
        Ok(SubvolView {
            core: self.core.clone(),
            sv,
        })
    }
}

impl SubvolView {
    pub fn tree(&self) -> u64 {
        self.sv.tree
    }

    /// Its uuids and transids (given and committed if it had none).
    pub fn ident(&self) -> Result<SubvolIdent> {
        self.core.subvolume_ident(self.sv.tree)
    }

    /// The inode's item; None if the subvolume has no such inode.
    pub fn inode(&self, ino: u64) -> Result<Option<InodeItem>> {
        let tree = self.sv.tree;
        self.core.engine.read(|r| {
            match crate::tree::get(r, &r.root(tree)?, &super::inode_key(ino))? {
                None => Ok(None),
                Some(d) => InodeItem::decode(&d)
                    .map(Some)
                    .map_err(|e| Error::corrupt(ino, e)),
            }
        })
    }

    /// The inode's names, as (directory, name).
    pub fn names(&self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let tree = self.sv.tree;
        self.core.engine.read(|r| {
            let refs = dir::refs_of(r, &r.root(tree)?, ino)?;
            Ok(refs.into_iter().map(|e| (e.ino, e.name)).collect())
        })
    }

    /// Whether directory `dir` has an entry `name`.
    pub fn has_entry(&self, dir: u64, name: &[u8]) -> Result<bool> {
        let tree = self.sv.tree;
        self.core
            .engine
            .read(|r| Ok(dir::lookup(r, &r.root(tree)?, dir, name)?.is_some()))
    }

    pub fn xattrs(&self, ino: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let tree = self.sv.tree;
        self.core
            .engine
            .read(|r| xattr::all(r, &r.root(tree)?, ino))
    }

    /// The file's extent items, by file offset.
    pub fn extents(&self, ino: u64) -> Result<Vec<(u64, FileExtentItem)>> {
        let tree = self.sv.tree;
        self.core
            .engine
            .read(|r| file::items_in(r, &r.root(tree)?, ino, 0, u64::MAX))
    }

    /// File data, decoded and checked.
    pub fn read(&self, ino: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.sv.read(ino, offset, len)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.sv.readlink(ino)
    }

    /// Up to `max` inode numbers from `from` on, in order.
    pub fn inodes_from(&self, from: u64, max: usize) -> Result<Vec<u64>> {
        let tree = self.sv.tree;
        self.core.engine.read(|r| {
            let mut out = Vec::new();
            let mut c = Cursor::seek(r, &r.root(tree)?, &Key::new(from, INODE_ITEM, 0))?;
            while let Some(it) = c.item() {
                if it.key.objectid > super::LAST_LOCAL_INO || out.len() == max {
                    break;
                }
                if it.key.ty == INODE_ITEM {
                    out.push(it.key.objectid);
                }
                c.next(r)?;
            }
            Ok(out)
        })
    }

    /// Inodes whose items differ between this subvolume and `other`: only
    /// blocks one of them holds and the other does not are read.
    pub fn differing_inodes(&self, other: &SubvolView) -> Result<BTreeSet<u64>> {
        let (a, b) = (self.sv.tree, other.sv.tree);
        self.core.engine.read(|r| {
            let mut out = BTreeSet::new();
            crate::tree::differing_keys(r, &r.root(a)?, &r.root(b)?, &mut |k| {
                if (ROOT_DIR_INO..=super::LAST_LOCAL_INO).contains(&k.objectid) {
                    out.insert(k.objectid);
                }
            })?;
            Ok(out)
        })
    }
}
