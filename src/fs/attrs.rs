//! File attributes as chattr(1) and lsattr(1) see them, through
//! `FS_IOC_GETFLAGS`/`SETFLAGS` and the xflags of `FS_IOC_FSGETXATTR`/
//! `FSSETXATTR`: immutable (`i`), append-only (`a`), no dump (`d`), no
//! atime (`A`), synchronous writes (`S`), and compression (`c`, and `m`
//! for none) as the `compression` property, as btrfs maps them.
//!
//! The kernel checks who may set them (the owner, and CAP_LINUX_IMMUTABLE
//! for `i` and `a`) before it asks, but it cannot enforce them on a FUSE
//! file: its own checks read inode flags FUSE never sets. So every call
//! that changes a file asks here first: an immutable inode refuses them
//! all, an append-only one all but appending (and its times set to now);
//! a directory either way refuses removing or renaming its entries, and
//! an immutable one adding them too.

use super::{errno, Subvol};
use crate::compress::{Codec, PROPERTY};
use crate::error::Result;
use crate::format::inode::{
    InodeItem, Timespec, INODE_APPEND, INODE_IMMUTABLE, INODE_NOATIME, INODE_NODATACOW,
    INODE_NODATASUM, INODE_NODUMP, INODE_SYNC,
};
use crate::txn::Need;

/// The `FS_*_FL` bits of `<linux/fs.h>` that Canopy keeps.
const FS_COMPR_FL: u32 = 0x4;
const FS_SYNC_FL: u32 = 0x8;
const FS_IMMUTABLE_FL: u32 = 0x10;
const FS_APPEND_FL: u32 = 0x20;
const FS_NODUMP_FL: u32 = 0x40;
const FS_NOATIME_FL: u32 = 0x80;
const FS_NOCOMP_FL: u32 = 0x400;
const FS_NOCOW_FL: u32 = 0x0080_0000;
/// Each flag kept in the inode item, with its bit there.
const IN_INODE: [(u32, u64); 5] = [
    (FS_SYNC_FL, INODE_SYNC),
    (FS_IMMUTABLE_FL, INODE_IMMUTABLE),
    (FS_APPEND_FL, INODE_APPEND),
    (FS_NODUMP_FL, INODE_NODUMP),
    (FS_NOATIME_FL, INODE_NOATIME),
];
/// Each flag with an `FS_XFLAG_*` twin, and the twin.
const AS_XFLAGS: [(u32, u32); 5] = [
    (FS_IMMUTABLE_FL, 0x8),
    (FS_APPEND_FL, 0x10),
    (FS_SYNC_FL, 0x20),
    (FS_NOATIME_FL, 0x40),
    (FS_NODUMP_FL, 0x80),
];

/// The attribute flags of an inode whose flags are `flags` and whose
/// compression property is `property`.
fn fs_flags(flags: u64, property: Option<&[u8]>) -> u32 {
    let mut out = IN_INODE
        .iter()
        .filter(|(_, bit)| flags & bit != 0)
        .fold(0, |acc, (fl, _)| acc | fl);
    if flags & INODE_NODATACOW != 0 {
        out |= FS_NOCOW_FL;
    }
    match property.map(parse_property) {
        Some(Some(_)) => out |= FS_COMPR_FL,
        Some(None) => out |= FS_NOCOMP_FL,
        None => {}
    }
    out
}

/// A property's codec (None: "none" or unreadable).
fn parse_property(value: &[u8]) -> Option<Codec> {
    let s = std::str::from_utf8(value).ok()?;
    Codec::parse(s.trim_end_matches('\0')).ok().flatten()
}

/// The xflags of attribute flags `fl`.
pub fn to_xflags(fl: u32) -> u32 {
    AS_XFLAGS
        .iter()
        .filter(|(f, _)| fl & f != 0)
        .fold(0, |acc, (_, x)| acc | x)
}

/// Attribute flags `current` with the xflags `xflags` sets in place of
/// theirs (the compression and no-copy-on-write flags have no xflag and
/// stay).
pub fn from_xflags(current: u32, xflags: u32) -> Result<u32> {
    let known = AS_XFLAGS.iter().fold(0, |acc, (_, x)| acc | x);
    if xflags & !known != 0 {
        return Err(errno(libc::EOPNOTSUPP, "file attribute not supported"));
    }
    let kept = current & (FS_COMPR_FL | FS_NOCOMP_FL | FS_NOCOW_FL);
    Ok(AS_XFLAGS
        .iter()
        .filter(|(_, x)| xflags & x != 0)
        .fold(kept, |acc, (f, _)| acc | f))
}

/// EPERM unless `i` may change: neither immutable nor append-only.
pub(super) fn refuse_if_fixed(i: &InodeItem) -> Result<()> {
    match i.flags & (INODE_IMMUTABLE | INODE_APPEND) {
        0 => Ok(()),
        _ => Err(errno(libc::EPERM, "immutable or append-only")),
    }
}

/// EPERM if `i` is immutable.
pub(super) fn refuse_if_immutable(i: &InodeItem) -> Result<()> {
    match i.flags & INODE_IMMUTABLE {
        0 => Ok(()),
        _ => Err(errno(libc::EPERM, "immutable")),
    }
}

/// EPERM unless an open of `i` with `flags` (open(2)'s) keeps its
/// attributes: no writing to an immutable file, and to an append-only
/// one only with O_APPEND and without O_TRUNC.
pub(super) fn refuse_open(i: &InodeItem, flags: i32) -> Result<()> {
    let writing = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
    if !writing {
        return Ok(());
    }
    refuse_if_immutable(i)?;
    let appending = flags & libc::O_APPEND != 0 && flags & libc::O_TRUNC == 0;
    match i.flags & INODE_APPEND != 0 && !appending {
        true => Err(errno(libc::EPERM, "append-only")),
        false => Ok(()),
    }
}

/// EPERM unless fallocate `mode` may change `i`: not at all an immutable
/// file, and an append-only one only to preallocate (mode 0 or
/// KEEP_SIZE), never to punch or zero, as the kernel rules for local
/// filesystems.
pub(super) fn refuse_fallocate(i: &InodeItem, mode: i32) -> Result<()> {
    refuse_if_immutable(i)?;
    match i.flags & INODE_APPEND != 0 && mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
        true => Err(errno(libc::EPERM, "append-only")),
        false => Ok(()),
    }
}

/// EPERM unless setattr `s` may change `i`: nothing of an immutable
/// file; of an append-only one, only its times set to now.
pub(super) fn refuse_setattr(i: &InodeItem, s: &super::SetAttr) -> Result<()> {
    refuse_if_immutable(i)?;
    let fixed = s.mode.is_some()
        || s.uid.is_some()
        || s.gid.is_some()
        || s.size.is_some()
        || ((s.atime.is_some() || s.mtime.is_some()) && !s.times_now && !about_now(s));
    match i.flags & INODE_APPEND != 0 && fixed {
        true => Err(errno(libc::EPERM, "append-only")),
        false => Ok(()),
    }
}

/// Whether the times `s` sets are the present moment give or take a few
/// seconds: under the writeback cache the kernel sends `touch`'s "now",
/// and the times of its own writes, as plain times. What an append-only
/// file refuses is a time made up.
fn about_now(s: &super::SetAttr) -> bool {
    let now = Timespec::now().sec;
    [s.atime, s.mtime]
        .iter()
        .flatten()
        .all(|t| (t.sec - now).abs() <= 5)
}

/// The flags of `i` after `chattr +C` (`on`) or `-C`: no checksums and
/// writes in place, as btrfs's nodatacow. They change only on a
/// directory or an empty regular file, since data already written has
/// checksums the flags would make the file's reads ignore (and data
/// without them a file would then fail to read); on a file with data
/// the request is ignored, as btrfs ignores it. EINVAL with compression
/// (`c`), which needs copy-on-write.
fn no_copy_on_write(i: &InodeItem, on: bool, compressed: bool) -> Result<u64> {
    let bits = INODE_NODATACOW | INODE_NODATASUM;
    if on && compressed {
        return Err(errno(
            libc::EINVAL,
            "no copy-on-write (C) and compression (c) exclude each other",
        ));
    }
    let may_change = super::is_dir(i.mode)
        || (i.mode & libc::S_IFMT == libc::S_IFREG && i.size == 0 && i.nbytes == 0);
    Ok(match (on, may_change) {
        (true, true) => i.flags | bits,
        (false, true) => i.flags & !bits,
        (_, false) => i.flags,
    })
}

/// Whether inode flags `flags` ask writes to be synchronous.
pub(super) fn synchronous(flags: u64) -> bool {
    flags & INODE_SYNC != 0
}

/// Whether inode flags `flags` keep reads from updating atime.
pub(super) fn no_atime(flags: u64) -> bool {
    flags & INODE_NOATIME != 0
}

impl Subvol {
    /// [`super::Fs::open_for_writing`] in this subvolume.
    pub fn open_for_writing(&self, ino: u64, flags: i32) -> Result<()> {
        self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            refuse_open(&i, flags)?;
            // Under the engine's lock, so that no chmod saved meanwhile
            // can leave the entry's set-id note stale.
            self.inodes.with(ino, |s| {
                s.open += 1;
                s.attr_flags = i.flags;
                s.set_id = Some(super::setid::has_set_id(i.mode));
            });
            Ok(())
        })
    }

    /// `FS_IOC_GETFLAGS` of `ino`.
    pub fn file_flags(&self, ino: u64) -> Result<u32> {
        self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            let property = super::xattr::find(r, &r.root(self.tree)?, ino, PROPERTY)?;
            Ok(fs_flags(i.flags, property.as_deref()))
        })
    }

    /// `FS_IOC_SETFLAGS` of `ino` to `fl`. `c` sets the compression
    /// property to zstd unless it names a codec already, `m` to none,
    /// and dropping whichever was set removes it. `C` (see
    /// [`no_copy_on_write`]) excludes `c`, both ways, as on btrfs.
    pub fn set_file_flags(&self, ino: u64, fl: u32) -> Result<()> {
        let known = IN_INODE
            .iter()
            .fold(FS_COMPR_FL | FS_NOCOMP_FL | FS_NOCOW_FL, |a, (f, _)| a | f);
        if fl & !known != 0 {
            return Err(errno(libc::EOPNOTSUPP, "file attribute not supported"));
        }
        if fl & FS_COMPR_FL != 0 && fl & FS_NOCOMP_FL != 0 {
            return Err(errno(libc::EINVAL, "c and m together"));
        }
        let tree = self.tree;
        let bits = IN_INODE
            .iter()
            .filter(|(f, _)| fl & f != 0)
            .fold(0, |acc, (_, b)| acc | b);
        let all_bits = IN_INODE.iter().fold(0, |acc, (_, b)| acc | b);
        let saved = self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, 3).payload(PROPERTY.len() as u64 + 8))?;
            let mut i = self.inode_tx(tx, ino)?;
            let root = tx.root_of(tree)?;
            let property = super::xattr::find(tx, &root, ino, PROPERTY)?;
            let was = fs_flags(i.flags, property.as_deref()) & (FS_COMPR_FL | FS_NOCOMP_FL);
            let wants = fl & (FS_COMPR_FL | FS_NOCOMP_FL);
            i.flags = no_copy_on_write(&i, fl & FS_NOCOW_FL != 0, wants == FS_COMPR_FL)?;
            if i.flags & INODE_NODATASUM != 0 {
                tx.set_incompat(crate::format::superblock::INCOMPAT_NODATASUM);
            }
            if was != wants {
                if i.mode & libc::S_IFMT != libc::S_IFREG && !super::is_dir(i.mode) {
                    return Err(errno(
                        libc::EINVAL,
                        "compression is for files and directories",
                    ));
                }
                i.flags = super::compression::forget_giving_up(i.flags);
                match wants {
                    FS_COMPR_FL => super::xattr::set(tx, tree, ino, PROPERTY, b"zstd", 0)?,
                    FS_NOCOMP_FL => super::xattr::set(tx, tree, ino, PROPERTY, b"none", 0)?,
                    _ => super::xattr::remove(tx, tree, ino, PROPERTY)?,
                }
            }
            i.flags = (i.flags & !all_bits) | bits;
            i.ctime = Timespec::now();
            self.save_inode(tx, ino, i.clone())?;
            Ok(i.flags)
        })?;
        self.inodes.with(ino, |s| s.attr_flags = saved);
        Ok(())
    }
}
