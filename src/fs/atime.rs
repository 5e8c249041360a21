//! Access times. The kernel leaves atime to a FUSE filesystem, so reads and
//! readdir update it here, by the mount's policy: `noatime` never,
//! `strictatime` on every access, and by default (`relatime`) only when the
//! old atime is not after the last modification or change, or is a day old.
//! That keeps "was this read since it changed?" answerable (mail readers,
//! tmp cleaners) while a file read over and over costs one update a day.

use super::Subvol;
use crate::format::inode::{InodeItem, Timespec};

/// When reads update atime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimePolicy {
    Never,
    #[default]
    Relative,
    Strict,
}

impl AtimePolicy {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            AtimePolicy::Never => 0,
            AtimePolicy::Relative => 1,
            AtimePolicy::Strict => 2,
        }
    }

    pub(crate) fn from_u8(v: u8) -> AtimePolicy {
        match v {
            0 => AtimePolicy::Never,
            2 => AtimePolicy::Strict,
            _ => AtimePolicy::Relative,
        }
    }
}

const DAY_SECS: i64 = 24 * 3600;

/// Whether an access at `now` should update the inode's atime.
pub(crate) fn needs_update(policy: AtimePolicy, i: &InodeItem, now: Timespec) -> bool {
    match policy {
        AtimePolicy::Never => false,
        AtimePolicy::Strict => true,
        AtimePolicy::Relative => {
            i.atime <= i.mtime || i.atime <= i.ctime || now.sec - i.atime.sec >= DAY_SECS
        }
    }
}

impl Subvol {
    /// Under `relatime`, whether a regular file opened for reading is due
    /// to record its next access. The kernel serves reads of cached pages
    /// itself (kept from one open to the next), so a file read again
    /// after a change might never send a read here, its atime would stay
    /// older than its mtime, and "read since it changed?" would be
    /// answered wrongly: such an open drops the cached pages, so its
    /// read comes here and records the access. That happens once per
    /// change (or day), and costs nothing on a cold read, whose pages are
    /// not cached anyway. `strictatime` opens bypass the page cache.
    pub(crate) fn access_due_at_open(&self, ino: u64) -> bool {
        if self.core.atime_policy() != AtimePolicy::Relative
            || self.core.engine.is_read_only()
            || self.core.is_remounted_read_only()
            || self.is_read_only()
        {
            return false;
        }
        let seen = self.core.engine.read(|r| self.inode_r(r, ino));
        seen.is_ok_and(|i| {
            i.mode & libc::S_IFMT == libc::S_IFREG
                && needs_update(AtimePolicy::Relative, &i, Timespec::now())
        })
    }

    /// Records an access of `ino`, whose attributes the caller just read as
    /// `seen`. Failing to record one is logged, never reported: the read
    /// itself succeeded (and a read-only mount records nothing).
    pub(crate) fn accessed(&self, ino: u64, seen: &InodeItem) {
        let now = Timespec::now();
        if self.core.engine.is_read_only()
            || self.core.is_remounted_read_only()
            || self.is_read_only()
            || !needs_update(self.core.atime_policy(), seen, now)
        {
            return;
        }
        let tree = self.tree;
        let r = self.core.engine.write(|tx| {
            // On a full disk the access time waits; the read does not.
            tx.reserve(&crate::txn::Need::items(tree, 1))?;
            let mut i = self.inode_tx(tx, ino)?;
            i.atime = now;
            self.save_inode(tx, ino, i)
        });
        if let Err(e) = r {
            tracing::debug!(ino, error = %e, "atime not updated");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    #[test]
    fn relatime_updates_after_changes_or_a_day() {
        let mut i = InodeItem {
            atime: at(100),
            mtime: at(50),
            ctime: at(50),
            ..Default::default()
        };
        let p = AtimePolicy::Relative;
        assert!(!needs_update(p, &i, at(200)), "read since the last change");
        assert!(needs_update(p, &i, at(100 + DAY_SECS)), "a day old");
        i.mtime = at(150);
        assert!(needs_update(p, &i, at(200)), "changed since the last read");
        assert!(!needs_update(AtimePolicy::Never, &i, at(200)));
        i.mtime = at(50);
        assert!(needs_update(AtimePolicy::Strict, &i, at(200)));
    }
}
