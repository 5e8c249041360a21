//! Mounting without root: the set-uid `fusermount3` mounts, then hands
//! the /dev/fuse descriptor back over a socket (SCM_RIGHTS) whose number
//! it finds in `_FUSE_COMMFD`; `fusermount3 -u` unmounts.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const FUSERMOUNT: &str = "fusermount3";

/// Mounts on `mountpoint` with the comma-separated `options`; returns
/// the session's descriptor.
pub fn mount(mountpoint: &Path, options: &str) -> Result<OwnedFd> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| Error::io("making a socket for fusermount3", e))?;
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o")
        .arg(options)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", their_fd.to_string());
    // SAFETY: only fcntl, which is async-signal-safe, runs in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("running {FUSERMOUNT} (is fuse3 installed?)"), e))?;
    drop(theirs);
    let fd = receive_fd(&ours);
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for {FUSERMOUNT}"), e))?;
    match fd {
        Some(fd) if out.status.success() => Ok(fd),
        _ => Err(Error::Invalid(format!(
            "{FUSERMOUNT} could not mount on {}: {}",
            mountpoint.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The descriptor fusermount3 sends, if it sends one.
fn receive_fd(sock: &UnixStream) -> Option<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the
    // recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    loop {
        // SAFETY: msg describes live buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
        if n > 0 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    }
}

/// Unmounts (lazily) a mount fusermount3 made.
pub fn unmount(mountpoint: &Path) {
    let r = Command::new(FUSERMOUNT)
        .args(["-u", "-q", "-z", "--"])
        .arg(mountpoint)
        .status();
    if !r.is_ok_and(|s| s.success()) {
        tracing::warn!(mountpoint = %mountpoint.display(), "{FUSERMOUNT} -u failed");
    }
}
