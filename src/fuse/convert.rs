//! Conversions between Canopy's types and the FUSE protocol's: errors to
//! errno, attributes, the caller's identity, and the replies that follow
//! one rule (empty replies, the xattr size protocol).

use super::proto::fattr;
use super::reply::{self, FileAttr, Reply};
use super::request::{Header, SetattrIn};
use crate::format::inode::Timespec;
use crate::fs::{Attr, NewNode, Owner, SetAttr};

pub(super) fn err(e: crate::Error) -> i32 {
    if e.errno() == libc::EIO {
        tracing::error!(error = %e, "I/O error");
    } else {
        tracing::debug!(error = %e, "request failed");
    }
    e.errno()
}

fn time(t: Timespec) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// `a` as the kernel sees it, as node `node`.
pub(super) fn file_attr(a: &Attr, node: u64) -> FileAttr {
    FileAttr {
        ino: node,
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 4096,
    }
}

pub(super) fn reply_empty(r: crate::Result<()>) -> Reply {
    match r {
        Ok(()) => Reply::empty(),
        Err(e) => Reply::Error(err(e)),
    }
}

pub(super) fn owner(h: &Header) -> Owner {
    Owner {
        uid: h.uid,
        gid: h.gid,
    }
}

/// A new inode of `mode` asked for by `h`'s caller, whose umask the
/// kernel left unapplied (FUSE_DONT_MASK; see `fs::acl`).
pub(super) fn new_node(h: &Header, mode: u32, rdev: u64, umask: u32) -> NewNode<'static> {
    NewNode {
        mode,
        rdev,
        owner: owner(h),
        target: None,
        umask,
    }
}

/// The changes a SETATTR asks for.
pub(super) fn setattr(s: &SetattrIn) -> SetAttr {
    let has = |bit: u32| s.valid & bit != 0;
    let at = |(sec, nsec): (i64, u32)| Timespec { sec, nsec };
    let time = |set: u32, now: u32, t: (i64, u32)| match (has(set), has(now)) {
        (true, true) => Some(Timespec::now()),
        (true, false) => Some(at(t)),
        _ => None,
    };
    SetAttr {
        mode: has(fattr::MODE).then_some(s.mode),
        uid: has(fattr::UID).then_some(s.uid),
        gid: has(fattr::GID).then_some(s.gid),
        size: has(fattr::SIZE).then_some(s.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, s.atime),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, s.mtime),
        ctime: has(fattr::CTIME).then(|| at(s.ctime)),
        times_now: [
            (fattr::ATIME, fattr::ATIME_NOW),
            (fattr::MTIME, fattr::MTIME_NOW),
        ]
        .iter()
        .all(|&(set, now)| !has(set) || has(now)),
    }
}

/// getxattr/listxattr protocol: size 0 asks for the length; a buffer too
/// small is ERANGE.
pub(super) fn reply_xattr(r: crate::Result<Vec<u8>>, size: u32) -> Reply {
    match r {
        Ok(v) if size == 0 => reply::xattr_size(v.len() as u32),
        Ok(v) if v.len() > size as usize => Reply::Error(libc::ERANGE),
        Ok(v) => Reply::Data(v),
        Err(e) => Reply::Error(err(e)),
    }
}
