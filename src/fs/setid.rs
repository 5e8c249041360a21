//! Clearing set-user-ID and set-group-ID bits when a file changes.
//!
//! The kernel leaves this to Canopy (FUSE's `HANDLE_KILLPRIV_V2`): then it
//! never asks for `security.capability` before each write, which would
//! cost a round trip per write. The rules are the kernel's own for local
//! filesystems: a write, truncate or fallocate by a caller without
//! CAP_FSETID, and any chown of a non-directory, clear the set-user-ID
//! bit, and the set-group-ID bit if the file is group-executable or the
//! caller is outside the file's group. Who the caller is (capabilities,
//! groups) is the FUSE layer's to know; it decides through `drop`.

use super::Subvol;
use crate::error::Result;
use crate::format::inode::Timespec;
use crate::txn::Need;

/// Whether `mode` has a set-user-ID or set-group-ID bit.
pub(crate) fn has_set_id(mode: u32) -> bool {
    mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

/// The set-id bits of a file with `mode` that a change by a caller
/// clears: set-user-ID always, set-group-ID when the file is
/// group-executable or `in_group` (the caller's membership in the file's
/// group) says no.
pub fn bits_to_clear(mode: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut drop = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group()) {
        drop |= libc::S_ISGID;
    }
    drop
}

impl Subvol {
    /// Clears the bits `drop(mode, gid)` names from `ino`, a file of any
    /// kind but a directory (whose set-group-ID bit means inheritance),
    /// if it has set-id bits at all (`drop` is asked only then, so finding
    /// out who the caller is costs nothing on ordinary files). Writes
    /// reach only regular files; a chown clears the bits of fifos,
    /// sockets and device nodes too, as Linux does. True when it cleared
    /// something.
    pub fn clear_set_id(&self, ino: u64, drop: impl FnOnce(u32, u32) -> u32) -> Result<bool> {
        // What an open file's entry knows spares each write of a database
        // the engine's lock, which a log step or a commit may hold.
        if self.inodes.peek(ino, |s| s.set_id) == Some(Some(false)) {
            return Ok(false);
        }
        let set_id = libc::S_ISUID | libc::S_ISGID;
        let read = self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            self.inodes.note_set_id(ino, i.mode);
            Ok((i.mode, i.gid))
        });
        let (mode, gid) = match read {
            Ok(found) => found,
            Err(crate::Error::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        if !has_set_id(mode) || mode & libc::S_IFMT == libc::S_IFDIR {
            return Ok(false);
        }
        let bits = drop(mode, gid) & set_id;
        if bits == 0 {
            return Ok(false);
        }
        let tree = self.tree;
        self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, 1))?;
            let mut i = self.inode_tx(tx, ino)?;
            if i.mode & bits == 0 {
                return Ok(false);
            }
            i.mode &= !bits;
            i.ctime = Timespec::now();
            self.save_inode(tx, ino, i).map(|()| true)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::bits_to_clear;
    use libc::{S_ISGID, S_ISUID, S_IXGRP};

    #[test]
    fn set_group_id_stays_only_for_members_on_a_file_not_group_executable() {
        let both = S_ISUID | S_ISGID;
        assert_eq!(bits_to_clear(both | 0o777, || true), both);
        assert_eq!(bits_to_clear(both | 0o767, || true), S_ISUID);
        assert_eq!(bits_to_clear(both | 0o767, || false), both);
        assert_eq!(bits_to_clear(S_ISGID | 0o767, || true), 0);
        assert_eq!(bits_to_clear(S_ISGID | S_IXGRP, || true), S_ISGID);
        assert_eq!(bits_to_clear(0o777, || false), 0);
    }
}
