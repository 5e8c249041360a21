//! The namespace operations of a subvolume: unlink and rmdir, link,
//! and rename (with its flags and the orphan an unlinked open file
//! becomes).

use super::ops::*;
use super::{attrs, dir, dtype, errno, is_dir, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{DirEntry, InodeItem, Timespec, ROOT_DIR_INO};
use crate::txn::{Need, Txn};

impl Subvol {
    /// Removes `name` from `parent`: a non-directory (`rmdir` false) or an
    /// empty directory (`rmdir` true).
    pub fn remove(&self, parent: u64, name: &[u8], rmdir: bool) -> Result<()> {
        let removed = self.remove_entry(parent, name, rmdir);
        self.delete_emptied()?;
        match removed? {
            Some(_) if !rmdir => Err(errno(libc::EISDIR, "is a directory")),
            Some(sub) => self.delete_subvolume(parent, name, sub, true),
            None => Ok(()),
        }
    }

    /// [`Subvol::remove`] of an entry naming an inode; one naming a
    /// subvolume is left alone and its id returned (deleting a subvolume
    /// is a transaction of its own).
    fn remove_entry(&self, parent: u64, name: &[u8], rmdir: bool) -> Result<Option<u64>> {
        let tree = self.tree;
        self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, CREATE_ITEMS + log_items(tx)).deleting())?;
            let mut p = self.parent_dir(tx, parent)?;
            attrs::refuse_if_fixed(&p)?;
            let root = self.root_ptr_tx(tx)?;
            let e = dir::lookup(tx, &root, parent, name)?.ok_or(Error::NotFound)?;
            if e.is_subvolume() {
                return Ok(Some(e.ino));
            }
            let child = self.inode_tx(tx, e.ino)?;
            self.check_removable(tx, (e.ino, &child), rmdir)?;
            dir::remove(tx, tree, parent, name)?;
            let now = Timespec::now();
            if rmdir {
                p.nlink = p.nlink.saturating_sub(1);
            }
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, parent, p)?;
            self.drop_link(tx, e.ino, child, now)?;
            self.note_name(tx, parent, e.ino);
            self.log_name_changes(tx, &[e.ino]).map(|()| None)
        })
    }

    /// One link fewer; at zero the inode and its data go, or, while it is
    /// open, it becomes an orphan that goes at its last release.
    fn drop_link(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        mut inode: InodeItem,
        now: Timespec,
    ) -> Result<()> {
        let tree = self.tree;
        let links = if is_dir(inode.mode) {
            0
        } else {
            inode.nlink.saturating_sub(1)
        };
        inode.nlink = links;
        inode.ctime = now;
        if links > 0 {
            return self.save_inode(tx, ino, inode);
        }
        if self.is_open(ino) {
            return self.make_orphan(tx, ino, inode);
        }
        self.discard_buffered(tx, ino);
        if self.too_large_to_delete_at_once(tx, ino)? {
            return self.delete_after(tx, ino, inode);
        }
        delete_inode(tx, tree, ino)?;
        self.inodes.bury(ino, inode);
        Ok(())
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        dir::check_name(name)?;
        let tree = self.tree;
        self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, CREATE_ITEMS + log_items(tx)))?;
            let mut p = self.parent_dir(tx, parent)?;
            attrs::refuse_if_immutable(&p)?;
            let mut i = self.inode_tx(tx, ino)?;
            if is_dir(i.mode) {
                return Err(errno(libc::EPERM, "hard link to a directory"));
            }
            attrs::refuse_if_fixed(&i)?;
            let root = self.root_ptr_tx(tx)?;
            if dir::lookup(tx, &root, parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            i.nlink = i
                .nlink
                .checked_add(1)
                .ok_or(errno(libc::EMLINK, "too many links"))?;
            let now = Timespec::now();
            dir::add(tx, tree, parent, name, ino, dtype(i.mode))?;
            // An unnamed open file (O_TMPFILE) given a name is no longer
            // an orphan: its last close must not delete it.
            if i.nlink == 1 && tx.get(tree, &orphan_key(ino))?.is_some() {
                tx.delete(tree, &orphan_key(ino))?;
            }
            i.ctime = now;
            self.save_inode(tx, ino, i.clone())?;
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, parent, p)?;
            self.note_name(tx, parent, ino);
            self.log_name_changes(tx, &[ino])?;
            Ok(self.attr(ino, &i))
        })
    }

    /// rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE / RENAME_WHITEOUT
    /// semantics (`whiteout`: who owns the whiteout left at the source).
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
        whiteout: Option<Owner>,
    ) -> Result<()> {
        dir::check_name(newname)?;
        if whiteout.is_some() && exchange {
            return Err(errno(libc::EINVAL, "a whiteout cannot be exchanged"));
        }
        let whiteout = match whiteout {
            Some(owner) => Some((self.alloc_ino()?, owner)),
            None => None,
        };
        let tree = self.tree;
        let extra = if whiteout.is_some() { CREATE_ITEMS } else { 0 };
        let renamed = self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, RENAME_ITEMS + extra + 2 * log_items(tx)))?;
            attrs::refuse_if_fixed(&self.parent_dir(tx, parent)?)?;
            let to = self.parent_dir(tx, newparent)?;
            let root = self.root_ptr_tx(tx)?;
            let src = dir::lookup(tx, &root, parent, name)?.ok_or(Error::NotFound)?;
            let dst = dir::lookup(tx, &root, newparent, newname)?;
            // Adding to a directory, or also removing (replacing, exchanging).
            match dst.is_some() {
                true => attrs::refuse_if_fixed(&to)?,
                false => attrs::refuse_if_immutable(&to)?,
            }
            if src.is_subvolume() || dst.as_ref().is_some_and(|d| d.is_subvolume()) {
                if whiteout.is_some() {
                    return Err(errno(libc::EINVAL, "a subvolume leaves no whiteout"));
                }
                let to = (newparent, newname);
                return self.rename_subvolume(tx, parent, &src, to, dst.as_ref(), exchange);
            }
            let src_inode = self.inode_tx(tx, src.ino)?;
            attrs::refuse_if_fixed(&src_inode)?;
            if is_dir(src_inode.mode)
                && parent != newparent
                && self.is_ancestor(tx, src.ino, newparent)?
            {
                return Err(errno(libc::EINVAL, "cannot move a directory into itself"));
            }
            if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
                return Ok(());
            }
            let now = Timespec::now();
            let ends = RenameEnds {
                from: (parent, name),
                to: (newparent, newname),
                now,
            };
            if exchange {
                let dst = dst.ok_or(Error::NotFound)?;
                return self.rename_exchange(tx, &ends, (&src, &src_inode), &dst);
            }
            if noreplace && dst.is_some() {
                return Err(Error::Exists);
            }
            self.rename_over(tx, &ends, (&src, &src_inode), dst.as_ref(), whiteout)
        });
        self.delete_emptied()?;
        renamed
    }

    /// Moves the entry `src` to its new name, replacing `dst` if there is
    /// one, and leaves `whiteout` at the old name if asked.
    fn rename_over(
        &self,
        tx: &mut Txn<'_>,
        ends: &RenameEnds<'_>,
        (src, src_inode): (&DirEntry, &InodeItem),
        dst: Option<&DirEntry>,
        whiteout: Option<(u64, Owner)>,
    ) -> Result<()> {
        let ((parent, name), (newparent, newname), now) = (ends.from, ends.to, ends.now);
        let tree = self.tree;
        // Planned before anything changes, so that a name that does not
        // fit fails cleanly; applied as planned when the removals below
        // cannot have touched its items (a move to another directory
        // over no entry: most renames), planned again otherwise.
        let plan = dir::plan_add(tx, tree, newparent, newname, src.ino, src.kind)?;
        if let Some(d) = dst {
            self.unlink_replaced(tx, ends, src_inode, d)?;
        }
        dir::remove(tx, tree, parent, name)?;
        if dst.is_none() && plan.survives_removal_from(parent) {
            dir::apply(tx, tree, plan)?;
        } else {
            dir::add(tx, tree, newparent, newname, src.ino, src.kind)?;
        }
        if let Some(w) = whiteout {
            self.add_whiteout(tx, (parent, name), w, now)?;
        }
        self.adjust_parents(tx, parent, newparent, (is_dir(src_inode.mode), false), now)?;
        self.touch_ctime(tx, src.ino, now)?;
        self.note_name(tx, parent, src.ino);
        self.note_name(tx, newparent, src.ino);
        let replaced = dst.map_or(src.ino, |d| d.ino);
        self.log_name_changes(tx, &[src.ino, replaced])
    }

    /// Whether the entry of inode `ino` may go for a directory (`as_dir`:
    /// rmdir, or a directory renamed over it) or for a file (unlink, or a
    /// file renamed over it): a directory gives way only to a directory,
    /// and only when empty; a file only to a file. Removing its last link
    /// must also be able to delete its items.
    fn check_removable(
        &self,
        tx: &Txn<'_>,
        (ino, inode): (u64, &InodeItem),
        as_dir: bool,
    ) -> Result<()> {
        attrs::refuse_if_fixed(inode)?;
        let root = self.root_ptr_tx(tx)?;
        match (as_dir, is_dir(inode.mode)) {
            (true, false) => return Err(errno(libc::ENOTDIR, "not a directory")),
            (false, true) => return Err(errno(libc::EISDIR, "is a directory")),
            (true, true) if !dir::is_empty(tx, &root, ino)? => {
                return Err(errno(libc::ENOTEMPTY, "directory not empty"))
            }
            _ => {}
        }
        if self.last_link(ino, inode) {
            check_deletable(tx, self.tree, ino)?;
        }
        Ok(())
    }

    /// RENAME_EXCHANGE of two entries of non-subvolume inodes.
    fn rename_exchange(
        &self,
        tx: &mut Txn<'_>,
        ends: &RenameEnds<'_>,
        (src, src_inode): (&DirEntry, &InodeItem),
        dst: &DirEntry,
    ) -> Result<()> {
        let ((parent, name), (newparent, newname), now) = (ends.from, ends.to, ends.now);
        let tree = self.tree;
        let dst_inode = self.inode_tx(tx, dst.ino)?;
        attrs::refuse_if_fixed(&dst_inode)?;
        if is_dir(dst_inode.mode) && parent != newparent && self.is_ancestor(tx, dst.ino, parent)? {
            return Err(errno(libc::EINVAL, "cannot move a directory into itself"));
        }
        dir::check_room(tx, tree, parent, name, dst.ino, dst.kind)?;
        dir::check_room(tx, tree, newparent, newname, src.ino, src.kind)?;
        dir::remove(tx, tree, parent, name)?;
        dir::remove(tx, tree, newparent, newname)?;
        dir::add(tx, tree, parent, name, dst.ino, dst.kind)?;
        dir::add(tx, tree, newparent, newname, src.ino, src.kind)?;
        let dirs = (is_dir(src_inode.mode), is_dir(dst_inode.mode));
        self.adjust_parents(tx, parent, newparent, dirs, now)?;
        self.touch_ctime(tx, src.ino, now)?;
        self.touch_ctime(tx, dst.ino, now)?;
        for (dir, child) in [
            (parent, src.ino),
            (parent, dst.ino),
            (newparent, src.ino),
            (newparent, dst.ino),
        ] {
            self.note_name(tx, dir, child);
        }
        self.log_name_changes(tx, &[src.ino, dst.ino])
    }

    /// Removes the entry a rename replaces, `d`, after checking that the
    /// source (of `src_inode`) may replace it.
    fn unlink_replaced(
        &self,
        tx: &mut Txn<'_>,
        ends: &RenameEnds<'_>,
        src_inode: &InodeItem,
        d: &DirEntry,
    ) -> Result<()> {
        let ((newparent, newname), now, tree) = (ends.to, ends.now, self.tree);
        let d_inode = self.inode_tx(tx, d.ino)?;
        self.check_removable(tx, (d.ino, &d_inode), is_dir(src_inode.mode))?;
        dir::remove(tx, tree, newparent, newname)?;
        if is_dir(d_inode.mode) {
            let mut np = self.inode_tx(tx, newparent)?;
            np.nlink = np.nlink.saturating_sub(1);
            self.save_inode(tx, newparent, np)?;
        }
        self.drop_link(tx, d.ino, d_inode, now)?;
        self.note_name(tx, newparent, d.ino);
        Ok(())
    }

    pub(super) fn touch_ctime(&self, tx: &mut Txn<'_>, ino: u64, now: Timespec) -> Result<()> {
        let mut i = self.inode_tx(tx, ino)?;
        i.ctime = now;
        self.save_inode(tx, ino, i)
    }

    /// True when `dir` is `ino` or lies below it: walks up from `dir`
    /// through the parent back-references, O(depth).
    ///
    /// A corrupt image can make the parents loop. Brent's cycle detection
    /// notices within twice the loop's length plus its distance from
    /// `dir`, so the walk is bounded by the real depth, not by a counter
    /// read from disk.
    fn is_ancestor(&self, tx: &Txn<'_>, ino: u64, dir: u64) -> Result<bool> {
        let root = self.root_ptr_tx(tx)?;
        let (mut at, mut mark) = (dir, dir);
        let (mut steps, mut lap) = (0u64, 1u64);
        loop {
            if at == ino {
                return Ok(true);
            }
            if at == ROOT_DIR_INO {
                return Ok(false);
            }
            at = dir::parent_of(tx, &root, at)?;
            if at == mark {
                return Err(Error::corrupt(dir, "loop in directory parents"));
            }
            steps += 1;
            if steps == lap {
                (mark, steps, lap) = (at, 0, lap.saturating_mul(2));
            }
        }
    }
}

/// Where a rename takes an entry from and to, and its time.
struct RenameEnds<'n> {
    from: (u64, &'n [u8]),
    to: (u64, &'n [u8]),
    now: Timespec,
}
