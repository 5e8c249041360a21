//! Node ids: the inode numbers the mount shows (st_ino, FUSE node ids),
//! one per (subvolume, inode), and the filesystem's operations by node id.
//!
//! Over FUSE a mount has one st_dev, so every inode of every subvolume
//! needs its own number, or du, tar, rsync and cp -a take a file and its
//! snapshot copy for hard links. Each operation finds the subvolume its
//! node belongs to and runs there on the local inode number; operations
//! on two nodes need them in one subvolume (EXDEV otherwise, as on btrfs),
//! except copy_file_range: the pool is one, so extents are shared across.

use super::{
    errno, AtimePolicy, Attr, DirListing, DirListingPlus, Fs, NewNode, Owner, SetAttr, StatFs,
    Subvol, SubvolInfo,
};
use super::{Shown, FS};
use crate::error::{Error, Result};
use crate::format::inode::ROOT_DIR_INO;
use crate::format::tree_id::FIRST_FREE;
use std::sync::Arc;

/// Local inode numbers of a subvolume stay below 2^40: the other 24 bits
/// of a node id (st_ino, FUSE node id) name the subvolume.
pub const INO_BITS: u32 = 40;
/// Highest inode number a subvolume hands out.
pub const LAST_LOCAL_INO: u64 = (1 << INO_BITS) - 1;

/// The node id of inode `ino` of subvolume `tree`: unique across the
/// mount and stable across remounts. The default subvolume's inodes keep
/// their own numbers; subvolume 256 + k's get `(k + 1) << 40` added.
pub fn node_id(tree: u64, ino: u64) -> u64 {
    let index = if tree == FS { 0 } else { tree - FIRST_FREE + 1 };
    (index << INO_BITS) | (ino & LAST_LOCAL_INO)
}

/// The (subvolume, inode) a node id names.
pub fn split_node(node: u64) -> (u64, u64) {
    let index = node >> INO_BITS;
    let tree = if index == 0 {
        FS
    } else {
        index + FIRST_FREE - 1
    };
    (tree, node & LAST_LOCAL_INO)
}

impl Fs {
    pub fn getattr(&self, node: u64) -> Result<Attr> {
        let (sv, ino) = self.at(node)?;
        sv.getattr(ino)
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let (sv, ino) = self.at(parent)?;
        sv.lookup(ino, name)
    }

    /// Creates a file, directory, device node, FIFO, socket or symlink
    /// (`target` for symlinks) named `name` in `parent`.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        let how = NewNode {
            mode,
            rdev,
            owner,
            target,
            umask: 0,
        };
        self.make(parent, name, &how)
    }

    /// [`Fs::create`] as the kernel asks: the umask applies unless
    /// `parent` has a default ACL, which the new inode then inherits.
    pub fn make(&self, parent: u64, name: &[u8], how: &NewNode<'_>) -> Result<Attr> {
        let (sv, ino) = self.at_writable(parent)?;
        sv.create(ino, name, how)
    }

    /// A regular file with no name in `parent`'s subvolume (O_TMPFILE),
    /// open once: an orphan its last release deletes unless [`Fs::link`]
    /// names it first.
    pub fn make_unnamed(&self, parent: u64, how: &NewNode<'_>) -> Result<Attr> {
        let (sv, ino) = self.at_writable(parent)?;
        sv.create_unnamed(ino, how)
    }

    pub fn readlink(&self, node: u64) -> Result<Vec<u8>> {
        let (sv, ino) = self.at(node)?;
        sv.readlink(ino)
    }

    /// Removes `name` from `parent`: a non-directory (`rmdir` false) or an
    /// empty directory (`rmdir` true), which may be an empty subvolume.
    pub fn remove(&self, parent: u64, name: &[u8], rmdir: bool) -> Result<()> {
        let (sv, ino) = self.at_writable(parent)?;
        sv.remove(ino, name, rmdir)
    }

    /// Notes an open handle of `node`.
    pub fn open(&self, node: u64) {
        if let Ok((sv, ino)) = self.at(node) {
            sv.open(ino);
        }
    }

    /// What an open of `node` for reading does about the access it is due
    /// under `relatime` (see [`Subvol::access_at_open`]).
    pub fn access_at_open(&self, node: u64) -> super::AccessAtOpen {
        self.at(node)
            .map_or(super::AccessAtOpen::NotDue, |(sv, ino)| {
                sv.access_at_open(ino)
            })
    }

    /// Releases a handle; the last one of an orphan deletes it.
    pub fn release(&self, node: u64) -> Result<()> {
        let (sv, ino) = self.at(node)?;
        sv.release(ino)
    }

    pub fn link(&self, node: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        let (sv, p, ino) = self.at_both(parent, node)?;
        sv.link(ino, p, name)
    }

    /// rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE semantics.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        let (sv, p, np) = self.at_both(parent, newparent)?;
        sv.rename(p, name, np, newname, noreplace, exchange, None)
    }

    /// rename(2) with RENAME_WHITEOUT: the source name is left holding a
    /// whiteout (a character device 0/0) owned by `owner`, in the same
    /// transaction.
    pub fn rename_whiteout(
        &self,
        (parent, name): (u64, &[u8]),
        (newparent, newname): (u64, &[u8]),
        noreplace: bool,
        owner: Owner,
    ) -> Result<()> {
        let (sv, p, np) = self.at_both(parent, newparent)?;
        sv.rename(p, name, np, newname, noreplace, false, Some(owner))
    }

    pub fn setattr(&self, node: u64, s: &SetAttr) -> Result<Attr> {
        let (sv, ino) = self.at_writable(node)?;
        sv.setattr(ino, s)
    }

    pub fn read(&self, node: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let (sv, ino) = self.at(node)?;
        sv.read(ino, offset, len)
    }

    /// [`Fs::read`] into `out`: the number of bytes read.
    pub fn read_into(&self, node: u64, offset: u64, out: &mut [u8]) -> Result<usize> {
        let (sv, ino) = self.at(node)?;
        sv.read_into(ino, offset, out)
    }

    pub fn write(&self, node: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let (sv, ino) = self.at_writable(node)?;
        sv.write(ino, offset, data)
    }

    /// [`Fs::write`] of pages the kernel writes back from its cache
    /// (see [`Subvol::write_back`]).
    pub fn write_back(&self, node: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let (sv, ino) = self.at_writable(node)?;
        sv.write_back(ino, offset, data)
    }

    /// Directory entries after readdir offset `offset`: (next offset, node,
    /// d_type, name). Offsets 1 and 2 are "." and "..".
    pub fn readdir(&self, node: u64, offset: u64, max: usize) -> Result<Vec<DirListing>> {
        self.readdir_to(node, offset, max, u64::MAX)
    }

    /// [`Fs::readdir`] that ends at entry index `last`, so that a listing
    /// begun at [`Fs::dir_last_index`] ends even while its entries are
    /// renamed within the directory (each rename gives a new index).
    pub fn readdir_to(
        &self,
        node: u64,
        offset: u64,
        max: usize,
        last: u64,
    ) -> Result<Vec<DirListing>> {
        let (sv, ino) = self.at(node)?;
        sv.readdir(ino, offset, max, last)
    }

    /// [`Fs::readdir_to`] with each entry's attributes: (next offset,
    /// attributes (none for an entry deleted meanwhile), name).
    pub fn readdir_plus(
        &self,
        node: u64,
        offset: u64,
        max: usize,
        last: u64,
    ) -> Result<Vec<DirListingPlus>> {
        let (sv, ino) = self.at(node)?;
        sv.readdir_plus(ino, offset, max, last)
    }

    /// The highest entry index directory `node` has now.
    pub fn dir_last_index(&self, node: u64) -> Result<u64> {
        let (sv, ino) = self.at(node)?;
        sv.dir_last_index(ino)
    }

    /// Space and inodes as statfs reports them (the whole pool), in 4 KiB
    /// blocks.
    pub fn statfs(&self) -> StatFs {
        match self.core.subvol(self.root_tree) {
            Ok(sv) => sv.statfs(),
            Err(_) => StatFs {
                blocks: 0,
                free: 0,
                avail: 0,
                files: 0,
            },
        }
    }

    pub fn setxattr(&self, node: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.setxattr_by(node, (name, value), flags, &|_| true)
    }

    /// setxattr(2) by a caller: setting an access ACL clears set-group-ID
    /// unless `may_keep_sgid(file's gid)` (the caller is in the group or
    /// holds CAP_FSETID).
    pub fn setxattr_by(
        &self,
        node: u64,
        (name, value): (&[u8], &[u8]),
        flags: i32,
        may_keep_sgid: &dyn Fn(u32) -> bool,
    ) -> Result<()> {
        let (sv, ino) = self.at_writable(node)?;
        sv.setxattr(ino, (name, value), flags, may_keep_sgid)
    }

    pub fn getxattr(&self, node: u64, name: &[u8]) -> Result<Vec<u8>> {
        let (sv, ino) = self.at(node)?;
        sv.getxattr(ino, name)
    }

    pub fn listxattr(&self, node: u64) -> Result<Vec<u8>> {
        let (sv, ino) = self.at(node)?;
        sv.listxattr(ino)
    }

    pub fn removexattr(&self, node: u64, name: &[u8]) -> Result<()> {
        let (sv, ino) = self.at_writable(node)?;
        sv.removexattr(ino, name)
    }

    /// SEEK_DATA (`data` true) or SEEK_HOLE from `offset`.
    pub fn seek(&self, node: u64, offset: u64, data: bool) -> Result<u64> {
        let (sv, ino) = self.at(node)?;
        sv.seek(ino, offset, data)
    }

    /// fallocate(2): mode 0 and FALLOC_FL_KEEP_SIZE preallocate,
    /// PUNCH_HOLE (with KEEP_SIZE) deallocates, ZERO_RANGE zeroes.
    pub fn fallocate(&self, node: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let (sv, ino) = self.at_writable(node)?;
        sv.fallocate(ino, offset, len, mode)
    }

    /// copy_file_range(2): shares extents where the ranges are
    /// sector-aligned (a reflink, also between subvolumes), copies bytes
    /// otherwise. Returns bytes copied.
    pub fn copy_range(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        let (from, src) = self.at(src)?;
        let (to, dst) = self.at_writable(dst)?;
        to.copy_range(&from, src, src_off, dst, dst_off, len)
    }

    /// Whether the file's data is inline (for tests and inspection).
    pub fn is_inline(&self, node: u64) -> Result<bool> {
        let (sv, ino) = self.at(node)?;
        sv.is_inline(ino)
    }

    /// fsync(2) of `node` (see `log`).
    pub fn fsync(&self, node: u64) -> Result<()> {
        let (sv, ino) = self.at(node)?;
        sv.fsync(ino)
    }

    /// fdatasync(2) of `node`: its timestamps alone need not be durable.
    pub fn fdatasync(&self, node: u64) -> Result<()> {
        let (sv, ino) = self.at(node)?;
        sv.fdatasync(ino)
    }

    /// fsync(2) or fdatasync(2) of `node` as thread `caller` asked it
    /// (the FUSE request's pid; see `Subvol::fsync_as`).
    pub fn fsync_as(&self, node: u64, datasync: bool, caller: u32) -> Result<()> {
        let (sv, ino) = self.at(node)?;
        sv.fsync_as(ino, datasync, caller)
    }

    /// Clears the bits `drop(mode, gid)` names from regular file `node`,
    /// if it has set-id bits at all (see `setid`).
    pub fn clear_set_id(&self, node: u64, drop: impl FnOnce(u32, u32) -> u32) -> Result<bool> {
        let (sv, ino) = self.at_writable(node)?;
        sv.clear_set_id(ino, drop)
    }

    /// Whether a change to `node` would be refused as read-only (EROFS).
    pub fn check_writable(&self, node: u64) -> Result<()> {
        self.at_writable(node).map(drop)
    }

    /// Notes an open of `node` with open(2)'s `flags` that may write:
    /// refused where the subvolume is read-only (EROFS) or the file's
    /// attributes forbid it (EPERM: immutable, or append-only without
    /// O_APPEND).
    pub fn open_for_writing(&self, node: u64, flags: i32) -> Result<()> {
        let (sv, ino) = self.at_writable(node)?;
        sv.open_for_writing(ino, flags)
    }

    /// `FS_IOC_GETFLAGS` of `node` (see `attrs`).
    pub fn file_flags(&self, node: u64) -> Result<u32> {
        let (sv, ino) = self.at(node)?;
        sv.file_flags(ino)
    }

    /// `FS_IOC_SETFLAGS` of `node` (see `attrs`).
    pub fn set_file_flags(&self, node: u64, flags: u32) -> Result<()> {
        let (sv, ino) = self.at_writable(node)?;
        sv.set_file_flags(ino, flags)
    }

    /// `canopy subvolume create`: an empty subvolume `name` in directory
    /// `parent`.
    pub fn create_subvolume(&self, parent: u64, name: &[u8], owner: Owner) -> Result<Attr> {
        let (sv, ino) = self.at_writable(parent)?;
        sv.create_subvolume(ino, name, owner)
    }

    /// `canopy subvolume snapshot [-r]`: `source` must be a subvolume's
    /// root directory; the snapshot becomes `name` in `parent`.
    pub fn snapshot(&self, source: u64, parent: u64, name: &[u8], readonly: bool) -> Result<Attr> {
        let (src, root) = self.at(source)?;
        if root != ROOT_DIR_INO {
            return Err(errno(libc::EINVAL, "the source is not a subvolume"));
        }
        let (sv, ino) = self.at_writable(parent)?;
        sv.snapshot(&src, ino, name, readonly)
    }

    /// `canopy subvolume delete`: the subvolume linked as `name` in
    /// `parent`, whatever it holds.
    pub fn delete_subvolume(&self, parent: u64, name: &[u8]) -> Result<()> {
        let (sv, ino) = self.at_writable(parent)?;
        match sv.subvolume_named(ino, name)? {
            Some(sub) => sv.delete_subvolume(ino, name, sub, false),
            None => Err(errno(libc::EINVAL, "not a subvolume")),
        }
    }

    /// Every subvolume but the top level.
    pub fn list_subvolumes(&self) -> Result<Vec<SubvolInfo>> {
        self.core.list_subvolumes()
    }

    /// One subvolume's record (the top level's too).
    pub fn subvolume_info(&self, id: u64) -> Result<SubvolInfo> {
        self.core.subvolume_info(id)
    }

    /// `canopy subvolume set-default`.
    pub fn set_default_subvolume(&self, id: u64) -> Result<()> {
        self.core.set_default_subvolume(id)
    }

    /// `canopy property set PATH ro true|false` on a subvolume's root.
    pub fn set_subvolume_read_only(&self, node: u64, ro: bool) -> Result<()> {
        let (tree, ino) = split_node(node);
        if ino != ROOT_DIR_INO || tree == FS {
            return Err(errno(libc::EINVAL, "not a subvolume"));
        }
        self.core.set_subvolume_read_only(tree, ro)
    }

    /// The subvolume a mount shows when asked for `shown`.
    pub(super) fn resolve_shown(&self, shown: &Shown) -> Result<u64> {
        match shown {
            Shown::Default => self.core.engine.read(super::subvol::default_subvolume),
            Shown::Id(id) => self.core.subvol(*id).map(|sv| sv.tree),
            Shown::Path(path) => {
                let mut node = node_id(FS, ROOT_DIR_INO);
                for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
                    node = self.lookup(node, part)?.ino;
                }
                let (tree, ino) = split_node(node);
                if ino != ROOT_DIR_INO {
                    return Err(errno(libc::EINVAL, "subvol= names no subvolume"));
                }
                Ok(tree)
            }
        }
    }

    /// The subvolume holding `node`, and the node's local inode number.
    pub(super) fn at(&self, node: u64) -> Result<(Arc<Subvol>, u64)> {
        let (tree, ino) = split_node(node);
        if ino < ROOT_DIR_INO {
            return Err(Error::NotFound);
        }
        Ok((self.core.subvol(tree)?, ino))
    }

    /// [`Fs::at`] for a change: EROFS in a read-only subvolume.
    pub(super) fn at_writable(&self, node: u64) -> Result<(Arc<Subvol>, u64)> {
        let (sv, ino) = self.at(node)?;
        sv.check_writable()?;
        Ok((sv, ino))
    }

    /// Both nodes' subvolume, which must be one (EXDEV otherwise).
    fn at_both(&self, a: u64, b: u64) -> Result<(Arc<Subvol>, u64, u64)> {
        let (sv, a) = self.at_writable(a)?;
        let (tree, b_ino) = split_node(b);
        if tree != sv.tree {
            return Err(errno(libc::EXDEV, "not in the same subvolume"));
        }
        Ok((sv, a, b_ino))
    }

    pub fn set_atime_policy(&self, p: AtimePolicy) {
        self.core
            .atime_policy
            .store(p.to_u8(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets when writeback compresses (`-o compress=`); new flushes
    /// follow it at once.
    pub fn set_compression(&self, p: crate::compress::Policy) {
        *self
            .core
            .compression
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = p;
    }

    pub fn atime_policy(&self) -> AtimePolicy {
        self.core.atime_policy()
    }

    /// Whether listing a directory updates its access time (`nodiratime`).
    pub fn set_dir_atime(&self, on: bool) {
        self.core
            .dir_atime
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_distinct_and_split_back() {
        let last = crate::format::tree_id::LAST_SUBVOL;
        for tree in [FS, FIRST_FREE, FIRST_FREE + 1, last] {
            for ino in [ROOT_DIR_INO, 257, LAST_LOCAL_INO] {
                let n = node_id(tree, ino);
                assert_eq!(split_node(n), (tree, ino));
                assert!(n <= crate::format::checker::LAST_INO);
            }
        }
        assert_eq!(node_id(FS, 300), 300, "the top level keeps its numbers");
        assert_ne!(node_id(FIRST_FREE, 300), node_id(FIRST_FREE + 1, 300));
    }
}
