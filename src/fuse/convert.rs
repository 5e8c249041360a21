//! Conversions between Canopy's types and the FUSE protocol's: errors to
//! errno, times, file types, the caller's identity, and the replies that
//! follow one rule (empty replies, the xattr size protocol).

use crate::format::inode::Timespec;
use crate::fs::{NewNode, Owner};
use fuser::{Errno, FileAttr, FileType, INodeNo, ReplyEmpty, ReplyXattr, Request, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(super) fn err(e: crate::Error) -> Errno {
    if e.errno() == libc::EIO {
        tracing::error!(error = %e, "I/O error");
    } else {
        tracing::debug!(error = %e, "request failed");
    }
    Errno::from_i32(e.errno())
}

pub(super) fn time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
    }
}

pub(super) fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => Timespec {
            sec: -(e.duration().as_secs() as i64),
            nsec: 0,
        },
    }
}

pub(super) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The attributes of a negative entry: only the zero inode number counts.
pub(super) fn absent_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

pub(super) fn reply_empty(r: crate::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

pub(super) fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// A new inode of `mode` asked for by `req`'s caller, whose umask the
/// kernel left unapplied (FUSE_DONT_MASK; see `fs::acl`).
pub(super) fn new_node(req: &Request, mode: u32, rdev: u64, umask: u32) -> NewNode<'static> {
    NewNode {
        mode,
        rdev,
        owner: owner(req),
        target: None,
        umask,
    }
}

pub(super) fn time_or_now(t: Option<TimeOrNow>) -> Option<Timespec> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(s) => timespec(s),
        TimeOrNow::Now => Timespec::now(),
    })
}

/// getxattr/listxattr protocol: size 0 asks for the length; a buffer too
/// small is ERANGE.
pub(super) fn reply_xattr(r: crate::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(err(e)),
    }
}
