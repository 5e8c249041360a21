//! Ghosts: inodes already deleted that the kernel may still name.
//!
//! Canopy deletes an inode as soon as its last link and its last open
//! handle are gone, so its space comes back at once. The kernel keeps its
//! own copy of the inode until it sends FORGET, and meanwhile it may still
//! send requests for it: with the writeback cache it stamps the ctime of an
//! unlinked file itself and later sends that as a `setattr`, and an O_PATH
//! descriptor can still `fstat` the file. Answering those with ENOENT makes
//! the next `syncfs` of the whole filesystem fail for a file that is simply
//! gone. A ghost keeps the inode's last attributes in its entry of the
//! inode table until FORGET, so such requests get the answer a kernel
//! filesystem would give (nlink 0); it holds no data and never reaches the
//! disk.

use super::inodes::InodeTable;
use crate::format::inode::InodeItem;

impl InodeTable {
    /// Remembers `inode` as it was deleted.
    pub fn bury(&self, ino: u64, mut inode: InodeItem) {
        inode.nlink = 0;
        self.with(ino, |s| s.ghost = Some(Box::new(inode)));
    }

    /// Applies `change` to the ghost of `ino`, if there is one, and returns
    /// its attributes after the change.
    pub fn haunt(&self, ino: u64, change: impl FnOnce(&mut InodeItem)) -> Option<InodeItem> {
        self.get(ino)?;
        self.with(ino, |s| {
            let g = s.ghost.as_mut()?;
            change(g);
            Some((**g).clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ghost_answers_until_forgotten() {
        let g = InodeTable::new();
        let inode = InodeItem {
            nlink: 1,
            mode: libc::S_IFREG | 0o644,
            ..Default::default()
        };
        g.bury(300, inode);
        let seen = g.haunt(300, |i| i.mtime.sec = 7).expect("ghost");
        assert_eq!((seen.nlink, seen.mtime.sec), (0, 7));
        assert!(g.haunt(301, |_| {}).is_none());
        g.forget(300);
        assert!(g.haunt(300, |_| {}).is_none());
    }
}
