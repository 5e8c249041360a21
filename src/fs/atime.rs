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

/// What an open for reading does about the access it is due (see
/// [`Subvol::access_at_open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessAtOpen {
    /// None is due: the cached pages serve the reads.
    NotDue,
    /// Recorded now: the kernel's cached atime is stale, its pages not.
    Recorded,
    /// The kernel holds no pages of the file: the open drops none, and
    /// the first read records the access.
    LeftToRead,
}

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
    /// Under `relatime`, what an open for reading of `ino` does about the
    /// access it is due (its atime not after its last change, or a day
    /// old). The kernel serves reads of cached pages itself (kept from one
    /// open to the next), so a file read again after a change might never
    /// send a read here, its atime would stay older than its mtime, and
    /// "read since it changed?" would be answered wrongly. So a file whose
    /// pages the kernel may hold has the access recorded at the open, and
    /// keeps its pages (dropping them cost a database its whole cache at
    /// every open after a write: pgbench re-read thousands of pages a
    /// second). Any other file has nothing cached to lose: the open drops
    /// the (no) pages, the read comes here and records the access, and the
    /// open costs no transaction (a cold `tar` after `cp -a` opens
    /// thousands of files whose access is due). `strictatime` opens bypass
    /// the page cache.
    pub(crate) fn access_at_open(&self, ino: u64) -> AccessAtOpen {
        if self.core.atime_policy() != AtimePolicy::Relative
            || self.core.engine.is_read_only()
            || self.core.is_remounted_read_only()
            || self.is_read_only()
        {
            return AccessAtOpen::NotDue;
        }
        let Ok(seen) = self.core.engine.read(|r| self.inode_r(r, ino)) else {
            return AccessAtOpen::NotDue;
        };
        let due = seen.mode & libc::S_IFMT == libc::S_IFREG
            && !super::attrs::no_atime(seen.flags)
            && needs_update(AtimePolicy::Relative, &seen, Timespec::now());
        match (due, self.inodes.may_be_cached(ino)) {
            (false, _) => AccessAtOpen::NotDue,
            (true, true) => {
                self.accessed(ino, &seen);
                AccessAtOpen::Recorded
            }
            (true, false) => AccessAtOpen::LeftToRead,
        }
    }

    /// Records an access of `ino`, whose attributes the caller just read as
    /// `seen`. Failing to record one is logged, never reported: the read
    /// itself succeeded (and a read-only mount records nothing).
    pub(crate) fn accessed(&self, ino: u64, seen: &InodeItem) {
        let now = Timespec::now();
        if self.core.engine.is_read_only()
            || self.core.is_remounted_read_only()
            || self.is_read_only()
            || super::attrs::no_atime(seen.flags)
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
