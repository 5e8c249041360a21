//! Who asks over the control socket, and what they may ask.
//!
//! The socket of a daemon run by root is open to every user (mode 0666),
//! as btrfs's ioctls are open to every process: the kernel tells who is
//! at the other end (SO_PEERCRED), and each request is checked here with
//! btrfs's rules. Root, and the user who runs the daemon (a user's own
//! mount, whose socket nobody else can reach), may ask anything. Others:
//!
//! - create a subvolume where they may create a directory (write and
//!   search on the parent), owned by them;
//! - snapshot a subvolume they own (as btrfs: "snapshots are limited to
//!   owners of the source") and may read, where they may create;
//! - delete a subvolume only on a mount with `user_subvol_rm_allowed`,
//!   with the rights `rmdir` would need (and write and search on the
//!   subvolume's root, as btrfs asks);
//! - set a subvolume read-only or writable if they own it;
//! - list, show, `filesystem du` and `filesystem extents` what they may
//!   read; sync, usage and the status of running jobs;
//!
//! and nothing else: quotas, balance, scrub, devices, replace, resize,
//! send, receive and the default subvolume answer "needs root".

use super::control::Request;
use crate::error::{Error, Result};
use crate::fs::{acl, Fs};
use std::os::unix::net::UnixStream;

/// The process at the other end of a control connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    pub uid: u32,
    pub gid: u32,
    pid: i32,
}

/// What a request needs of a file.
const READ: u32 = 4;
const WRITE: u32 = 2;
const SEARCH: u32 = 1;

impl Peer {
    /// The credentials the kernel recorded for the other end of `s`.
    pub fn of(s: &UnixStream) -> std::io::Result<Peer> {
        use std::os::fd::AsRawFd;
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: an open socket, a ucred to fill and its length.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Peer {
            uid: cred.uid,
            gid: cred.gid,
            pid: cred.pid,
        })
    }

    /// Root, or the user the daemon runs as.
    fn may_ask_anything(&self) -> bool {
        // SAFETY: geteuid cannot fail.
        self.uid == 0 || self.uid == unsafe { libc::geteuid() }
    }

    /// Whether `gid` is the peer's group or a supplementary one (read
    /// from /proc while the peer is connected).
    fn in_group(&self, gid: u32) -> bool {
        gid == self.gid
            || std::fs::read_to_string(format!("/proc/{}/status", self.pid)).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Groups:"))
                    .is_some_and(|g| g.split_whitespace().any(|g| g.parse() == Ok(gid)))
            })
    }
}

/// The rules a mount applies beyond the peer's rights.
#[derive(Clone, Copy, Debug, Default)]
pub struct Policy {
    /// `-o user_subvol_rm_allowed`: users may delete subvolumes.
    pub user_subvol_rm: bool,
}

/// `req` as `peer` may ask it (a subvolume they create is theirs), or
/// why not. `node` maps the inode numbers a command saw to node ids.
pub(super) fn authorize(
    req: Request,
    peer: &Peer,
    fs: &Fs,
    policy: Policy,
    node: impl Fn(u64) -> u64,
) -> Result<Request> {
    if peer.may_ask_anything() {
        return Ok(req);
    }
    let may = |n: u64, want: u32| may_access(fs, peer, node(n), want);
    match req {
        Request::Sync
        | Request::Usage
        | Request::Writeback
        | Request::SubvolSync
        | Request::ScrubStatus
        | Request::BalanceStatus
        | Request::ReplaceStatus
        | Request::QuotaRescanStatus => Ok(req),
        Request::Extents { node: n } | Request::Compsize { node: n } => {
            may(n, READ)?;
            Ok(req)
        }
        Request::Defragment { node: n, .. } => {
            // As btrfs: whoever may write the file may defragment it.
            may(n, WRITE)?;
            Ok(req)
        }
        Request::SubvolShow { node: n } => {
            may(n, READ | SEARCH)?;
            Ok(req)
        }
        Request::SubvolList => {
            may(1, READ | SEARCH)?;
            Ok(req)
        }
        Request::SubvolCreate { parent, name, .. } => {
            may(parent, WRITE | SEARCH)?;
            Ok(Request::SubvolCreate {
                parent,
                name,
                uid: peer.uid,
                gid: peer.gid,
            })
        }
        Request::SubvolSnapshot { source, parent, .. } => {
            may(parent, WRITE | SEARCH)?;
            may(source, READ | SEARCH)?;
            owns(
                fs,
                peer,
                node(source),
                "snapshots are limited to the source's owner",
            )?;
            Ok(req)
        }
        Request::SubvolSetReadOnly { node: n, .. } => {
            owns(
                fs,
                peer,
                node(n),
                "only its owner changes a subvolume's flags",
            )?;
            Ok(req)
        }
        Request::SubvolDelete { parent, ref name } => {
            if !policy.user_subvol_rm {
                return Err(Error::Posix(
                    libc::EPERM,
                    "deleting a subvolume needs root, or the mount option user_subvol_rm_allowed",
                ));
            }
            may(parent, WRITE | SEARCH)?;
            let victim = fs.lookup(node(parent), name)?;
            sticky_allows(fs, peer, node(parent), victim.uid)?;
            may_access(fs, peer, victim.ino, WRITE | SEARCH)?;
            Ok(req)
        }
        _ => Err(Error::Posix(libc::EPERM, "this command needs root")),
    }
}

/// EACCES unless `peer` has `want` on `node`, by its mode or its access
/// ACL.
fn may_access(fs: &Fs, peer: &Peer, node: u64, want: u32) -> Result<()> {
    let a = fs.getattr(node)?;
    let granted = match fs.getxattr(node, acl::ACCESS) {
        Ok(bytes) => {
            acl::Acl::decode(&bytes)?.permits(peer.uid, &|g| peer.in_group(g), (a.uid, a.gid), want)
        }
        Err(e) if e.errno() == libc::ENODATA => {
            let shift = if peer.uid == a.uid {
                6
            } else if peer.in_group(a.gid) {
                3
            } else {
                0
            };
            (a.mode >> shift) & want == want
        }
        Err(e) => return Err(e),
    };
    match granted {
        true => Ok(()),
        false => Err(Error::Posix(libc::EACCES, "permission denied")),
    }
}

/// EPERM unless `peer` owns `node`.
fn owns(fs: &Fs, peer: &Peer, node: u64, why: &'static str) -> Result<()> {
    match fs.getattr(node)?.uid == peer.uid {
        true => Ok(()),
        false => Err(Error::Posix(libc::EPERM, why)),
    }
}

/// EPERM if directory `parent` is sticky and `peer` owns neither it nor
/// the entry (owned by `entry_uid`) it would remove.
fn sticky_allows(fs: &Fs, peer: &Peer, parent: u64, entry_uid: u32) -> Result<()> {
    let p = fs.getattr(parent)?;
    match p.mode & libc::S_ISVTX != 0 && peer.uid != p.uid && peer.uid != entry_uid {
        true => Err(Error::Posix(libc::EPERM, "sticky directory")),
        false => Ok(()),
    }
}
