//! Giving a file's extents back: orphans, large truncates and hole
//! punches, in bounded steps.
//!
//! Orphans are inodes with no name left that still hold data. An unlinked
//! file open somewhere lives until its last release; a file whose extents
//! are too many to free in one operation is emptied in steps. Either way
//! an ORPHAN_ITEM marks it, so a crash leaves nothing behind: the next
//! mount finishes the deletion. A truncate that cuts more extents than a
//! step frees cuts them from the end, a step at a time, lowering the size
//! with each, so every state a crash can leave is the file truncated to
//! some size between the old and the new one (with no extent past it).
//!
//! Why steps: a deletion reserves a few paths' worth of tree blocks, but
//! freeing tens of thousands of extents (a compressed file has one per
//! 128 KiB, a randomly written one up to one per sector) copies and
//! rewrites that many leaves of the file's tree, the checksum tree and the
//! extent tree. On a full disk that ran out of space half-way through one
//! transaction and shut the filesystem down. Each step frees at most
//! [`STEP_ITEMS`] extent items in a transaction of its own, reserved as a
//! deletion; when the reservation fails the transaction commits (freed
//! blocks come back) and the step goes on.

use super::ops::{check_deletable, delete_inode, log_items, orphan_key};
use super::{file, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::InodeItem;
use crate::txn::{Need, Txn};

/// Extent items one step frees at most.
const STEP_ITEMS: usize = 64;
/// Paths one step reserves: its items are consecutive keys (78 bytes
/// each), in at most three leaves of the file's tree at 4 KiB nodes; their
/// checksums and extent items go at the commit, whose own reservation
/// counts them. No more than an unlink reserves, so that a step fits
/// wherever the unlink before it did.
const STEP_PATHS: u64 = 4;

impl Subvol {
    /// Whether `ino` holds more extent items than one step frees.
    pub(super) fn too_large_to_delete_at_once(&self, tx: &Txn<'_>, ino: u64) -> Result<bool> {
        let root = tx.root_of(self.tree)?;
        Ok(file::first_items(tx, &root, ino, STEP_ITEMS + 1)?.len() > STEP_ITEMS)
    }

    /// Keeps `ino`, its last link just gone, as an orphan: deleted by its
    /// last release, by [`Subvol::delete_emptied`], or by the next mount.
    pub(super) fn make_orphan(&self, tx: &mut Txn<'_>, ino: u64, inode: InodeItem) -> Result<()> {
        tx.put(self.tree, orphan_key(ino), Vec::new())?;
        self.save_inode(tx, ino, inode)
    }

    /// Makes `ino` (its last link just gone) an orphan for
    /// [`Subvol::delete_emptied`] to empty and delete once the running
    /// operation is done.
    pub(super) fn delete_after(&self, tx: &mut Txn<'_>, ino: u64, inode: InodeItem) -> Result<()> {
        self.make_orphan(tx, ino, inode)?;
        crate::sync::lock(&self.emptying).push(ino);
        Ok(())
    }

    /// Deletes the files [`Subvol::delete_after`] set aside. A failure
    /// leaves the orphan for the next mount.
    pub(super) fn delete_emptied(&self) -> Result<()> {
        let queued = std::mem::take(&mut *crate::sync::lock(&self.emptying));
        for ino in queued {
            self.delete_orphan(ino)?;
        }
        Ok(())
    }

    /// Releases a handle; the last one of an orphan deletes it.
    pub fn release(&self, ino: u64) -> Result<()> {
        if !self.inodes.release(ino) {
            return Ok(());
        }
        self.delete_orphan(ino)
    }

    /// Deletes orphan `ino` unless it is open again or no orphan (a name
    /// was given back to it): its extents in steps, then the rest.
    fn delete_orphan(&self, ino: u64) -> Result<()> {
        let tree = self.tree;
        // Every last close comes here: most files are no orphan, and a
        // read lock tells.
        if self
            .core
            .engine
            .read(|r| r.get(tree, &orphan_key(ino)))?
            .is_none()
        {
            return Ok(());
        }
        let still_orphan = |tx: &Txn<'_>| -> Result<bool> {
            Ok(!self.is_open(ino) && tx.get(tree, &orphan_key(ino))?.is_some())
        };
        loop {
            let more = self.core.write_reserved(|tx| {
                if !still_orphan(tx)? {
                    return Ok(false);
                }
                tx.reserve(&Need::items(tree, STEP_PATHS).deleting())?;
                let root = tx.root_of(tree)?;
                let items = file::first_items(tx, &root, ino, STEP_ITEMS + 1)?;
                if items.len() <= STEP_ITEMS {
                    return Ok(false);
                }
                file::punch_first(tx, tree, ino, &items[..STEP_ITEMS]).map(|()| true)
            })?;
            if !more {
                break;
            }
        }
        self.core.write_reserved(|tx| {
            if !still_orphan(tx)? {
                return Ok(());
            }
            tx.reserve(&Need::items(tree, 2 + log_items(tx)).deleting())?;
            let inode = self.inode_tx(tx, ino)?;
            check_deletable(tx, tree, ino)?;
            tx.delete(tree, &orphan_key(ino))?;
            self.discard_buffered(tx, ino);
            delete_inode(tx, tree, ino)?;
            self.inodes.bury(ino, inode);
            self.log_name_changes(tx, &[ino])
        })
    }

    /// Cuts the extents of `ino` past `new_size` from the end, a step at a
    /// time, until one step's worth is left (the truncate itself cuts
    /// that). The caller holds the file's flush lock, with its buffered
    /// data flushed.
    pub(super) fn shrink_in_steps(&self, ino: u64, new_size: u64) -> Result<()> {
        let keep = new_size.next_multiple_of(file::SECTOR);
        let step = || {
            self.core.write_reserved(|tx| {
                let mut i = self.inode_tx(tx, ino)?;
                if new_size >= i.size {
                    return Ok(false);
                }
                // The step's first item starts past where the one before it
                // ends, which is past `keep`.
                let Some(from) = self.cut_last_step(tx, (ino, &mut i), (keep, u64::MAX))? else {
                    return Ok(false);
                };
                i.size = i.size.min(from);
                self.save_inode(tx, ino, i).map(|()| true)
            })
        };
        steps_until_done(step)
    }

    /// Punches the whole sectors of `[start, end)` of `ino` (a file of
    /// `size` bytes) from the end, a step at a time, until one step's
    /// worth of extent items is left there (the punch itself cuts those
    /// and zeroes the partial sectors at the edges). So punching a hole
    /// frees space on a full disk, as deleting does; a crash may leave
    /// part of the hole punched, as on btrfs. The caller holds the file's
    /// flush lock, with its buffered data flushed.
    pub(super) fn punch_in_steps(
        &self,
        ino: u64,
        size: u64,
        (start, end): (u64, u64),
    ) -> Result<()> {
        let first = start.next_multiple_of(file::SECTOR);
        let mut last = end.min(size.next_multiple_of(file::SECTOR)) / file::SECTOR * file::SECTOR;
        let step = || {
            self.core.write_reserved(|tx| {
                let mut i = self.inode_tx(tx, ino)?;
                // Not the range's first item, so it starts inside it.
                let Some(from) = self.cut_last_step(tx, (ino, &mut i), (first, last))? else {
                    return Ok(false);
                };
                self.save_inode(tx, ino, i)?;
                last = from;
                Ok(true)
            })
        };
        steps_until_done(step)
    }

    /// One step of [`Subvol::shrink_in_steps`] or
    /// [`Subvol::punch_in_steps`]: when more than a step's worth of
    /// extent items of `ino` (whose item is `i`) lie in `[first, last)`,
    /// cuts the last [`STEP_ITEMS`] of them, reserved as a deletion, and
    /// returns where the cut began (`i.nbytes` follows; the caller saves
    /// `i`). None: a step's worth or less is left.
    fn cut_last_step(
        &self,
        tx: &mut Txn<'_>,
        (ino, i): (u64, &mut InodeItem),
        (first, last): (u64, u64),
    ) -> Result<Option<u64>> {
        let tree = self.tree;
        let root = tx.root_of(tree)?;
        let tail = file::last_items(tx, &root, ino, (first, last), STEP_ITEMS + 1)?;
        if tail.len() <= STEP_ITEMS {
            return Ok(None);
        }
        tx.reserve(&Need::items(tree, STEP_PATHS).deleting())?;
        let from = tail[tail.len() - STEP_ITEMS].0;
        self.note_extents(tx, ino, i.size, from, last);
        let freed = file::punch(tx, tree, ino, from, last)?;
        i.nbytes = i.nbytes.saturating_add_signed(-freed);
        Ok(Some(from))
    }

    /// Deletes inodes left orphaned by a crash or an unclean unmount.
    pub(crate) fn delete_orphans(&self) -> Result<()> {
        let tree = self.tree;
        let start = orphan_key(0);
        let end = orphan_key(u64::MAX);
        let orphans = self.core.engine.read(|r| r.range(tree, &start, &end))?;
        if orphans.is_empty() {
            return Ok(());
        }
        for (k, _) in &orphans {
            // A damaged orphan stays (and `canopy check` names it) rather
            // than keep the filesystem from mounting.
            match self.delete_orphan(k.offset) {
                Ok(()) => {}
                Err(Error::NotFound) => {
                    self.core.engine.write(|tx| tx.delete(tree, k).map(drop))?;
                }
                Err(e) => tracing::error!(ino = k.offset, error = %e, "orphan left in place"),
            }
        }
        tracing::info!(count = orphans.len(), "deleted orphan inodes");
        self.core.engine.commit().map(|_| ())
    }
}

/// Runs `step` until it says nothing is left. A step with no room even
/// for itself (it changed nothing) ends the steps too: the operation they
/// prepare then tries with its own reservation, and says ENOSPC if that
/// fails.
fn steps_until_done(mut step: impl FnMut() -> Result<bool>) -> Result<()> {
    loop {
        match step() {
            Ok(true) => {}
            Ok(false) | Err(Error::NoSpace) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}
