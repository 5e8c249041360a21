//! Telling the kernel of changes it did not ask for: messages written
//! to the session's /dev/fuse descriptor with unique 0 and the
//! notification's code where a reply has its error.

use super::proto::{self, notify, Out};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

/// Writes notifications once the session exists.
#[derive(Clone, Default)]
pub struct Notifier {
    fd: Arc<OnceLock<Arc<OwnedFd>>>,
}

impl Notifier {
    /// From now on, notifications go to `fd`.
    pub fn attach(&self, fd: Arc<OwnedFd>) {
        let _ = self.fd.set(fd);
    }

    fn send(&self, code: i32, body: &[u8]) -> std::io::Result<()> {
        let Some(fd) = self.fd.get() else {
            return Ok(());
        };
        let header = proto::out_header(0, code, body.len());
        if super::session::write_message(fd.as_raw_fd(), &header, body) {
            Ok(())
        } else {
            Err(std::io::Error::other("the kernel refused the notification"))
        }
    }

    /// Drops the kernel's cached attributes of `node` and, unless
    /// `offset` is negative, its cached pages from `offset` for `len`
    /// bytes (0: to the end).
    pub fn inval_inode(&self, node: u64, offset: i64, len: i64) -> std::io::Result<()> {
        let mut o = Out::with_capacity(24);
        o.u64(node).u64(offset as u64).u64(len as u64);
        self.send(notify::INVAL_INODE, &o.0)
    }

    /// Drops the kernel's cached entry `name` in directory `parent`.
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        let mut o = Out::with_capacity(24 + name.len());
        o.u64(parent)
            .u32(name.len() as u32)
            .u32(0)
            .bytes(name)
            .bytes(&[0]);
        self.send(notify::INVAL_ENTRY, &o.0)
    }
}
