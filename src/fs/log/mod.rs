//! fsync through the log tree: what goes into the log, and when.
//!
//! fsync of an inode writes its buffered data, then copies into the log
//! tree (`txn::log` stores it) only that inode's state, and makes the log
//! durable with its blocks, a superblock write and one barrier: no commit.
//!
//! An inode is logged in one of three modes (the `LOG_INODE` item):
//!
//! - **Full** (fsync of the inode itself): its inode item, every name
//!   (INODE_REF/EXTREF items), every xattr, and for its data the file
//!   ranges changed in this transaction as `LOG_RANGE` items, each with
//!   the extent items covering it and the checksums of extents written in
//!   this transaction. Other inodes than regular files log all extents.
//! - **Names** (an inode whose names the log must carry): its inode item
//!   and every name. Replay creates it if the last commit lacks it, but
//!   never replaces the committed item of an existing one.
//! - **Gone**: the inode no longer exists; replay deletes it.
//!
//! A logged inode's names are always *all* of its names, so replay gives
//! it exactly those: a file renamed and fsynced has the new name only.
//! Whose names the log also carries:
//!
//! - the ancestors changed in this transaction (new or renamed
//!   directories), up to the first unchanged one, so an fsynced file is
//!   reachable after replay;
//! - for each name of a logged inode that the last commit gave to another
//!   inode still alive (renamed away, as editors do with `file~`), that
//!   other inode, so replay does not take its only name;
//! - for an fsynced directory, every child whose name in it changed in
//!   this transaction, so its entries are durable.
//!
//! Seed 003's rule: rename, link and unlink touch the log only for inodes
//! logged in the running transaction, known from an in-memory marker
//! ([`Changes`], in the inode's table entry), never by searching the log. For those, the log's copy
//! of the names is brought up to date at once, so the log never holds two
//! inodes claiming one name.

mod replay;

use super::rangeset::RangeSet;
use super::{dir, file, load_inode_tx, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{DirEntry, InodeItem, ROOT_DIR_INO};
use crate::format::key_type::{
    EXTENT_CSUM, EXTENT_DATA, INODE_EXTREF, INODE_ITEM, INODE_REF, LOG_INODE, LOG_RANGE, XATTR_ITEM,
};
use crate::format::tree_id::{CSUM, LOG};
use crate::format::{Key, CSUM_OBJECTID};
use crate::txn::{Need, Txn};
use std::collections::HashSet;
use std::sync::Mutex;

pub(crate) use replay::replay;

/// What an fsync's step in the log found to do.
enum LogStep {
    /// The inode's state is in the log: write it.
    Logged,
    /// Nothing changed since the last commit: wait for that commit.
    Unchanged,
    /// The log cannot be trusted with it (it is stale: a log update
    /// failed after its operation had changed the trees, so the log may
    /// disagree with them; or the log found at open is not replayed
    /// yet): commit instead.
    NeedsCommit,
}

/// `LOG_INODE` values.
pub(crate) const MODE_FULL: u8 = 0;
pub(crate) const MODE_NAMES: u8 = 1;
pub(crate) const MODE_GONE: u8 = 2;

/// Tree items a names update of one inode may change in the log.
pub(crate) const NAME_LOG_ITEMS: u64 = 8;

/// What the running transaction changed in one inode, for logging. It
/// lives in the inode's entry of the inode table, stamped with the
/// transaction; changes of an earlier transaction count as none (its
/// commit made them durable).
#[derive(Default)]
pub(crate) struct Changes {
    transid: u64,
    /// Logged in this transaction (seed 003's marker).
    logged: bool,
    /// File ranges whose extents changed since the inode was last logged.
    ranges: RangeSet,
    /// Children whose names in this directory changed.
    children: HashSet<u64>,
}

impl Changes {
    /// Whether it holds nothing about transaction `transid`.
    pub(crate) fn is_empty_for(&self, transid: u64) -> bool {
        self.transid < transid
            || (!self.logged && self.ranges.is_empty() && self.children.is_empty())
    }
}

/// What the log knows of the running transaction as a whole.
#[derive(Default)]
pub(crate) struct Tracking {
    inner: Mutex<Tracked>,
}

#[derive(Default)]
struct Tracked {
    transid: u64,
    /// A log update failed after its operation had changed the trees:
    /// the log may disagree with them, so fsync commits instead.
    stale: bool,
}

impl Tracking {
    fn set_stale(&self, transid: u64) {
        let mut t = crate::sync::lock(&self.inner);
        t.transid = t.transid.max(transid);
        t.stale |= t.transid == transid;
    }

    fn is_stale(&self, transid: u64) -> bool {
        let t = crate::sync::lock(&self.inner);
        t.transid == transid && t.stale
    }
}

impl super::inodes::InodeTable {
    /// Runs `f` on what transaction `transid` changed in `ino`.
    fn changes<R>(&self, transid: u64, ino: u64, f: impl FnOnce(&mut Changes) -> R) -> R {
        self.advance(transid);
        self.with(ino, |s| {
            if s.changes.transid != transid {
                s.changes = Changes {
                    transid,
                    ..Changes::default()
                };
            }
            f(&mut s.changes)
        })
    }

    /// `f` of what transaction `transid` changed in `ino`, if anything.
    fn changed<R: Default>(&self, transid: u64, ino: u64, f: impl FnOnce(&Changes) -> R) -> R {
        self.advance(transid);
        self.peek(ino, |s| {
            if s.changes.transid == transid {
                f(&s.changes)
            } else {
                R::default()
            }
        })
        .unwrap_or_default()
    }
}

impl Subvol {
    /// The extents of `[start, end)` of `ino` changed.
    fn track_range(&self, transid: u64, ino: u64, start: u64, end: u64) {
        self.inodes
            .changes(transid, ino, |c| c.ranges.insert(start, end));
    }

    pub(crate) fn is_logged(&self, transid: u64, ino: u64) -> bool {
        self.inodes.changed(transid, ino, |c| c.logged)
    }

    /// Marks `inos` logged; the first, logged in full, also has its
    /// changed ranges in the log now.
    fn mark_logged(&self, transid: u64, full: Option<u64>, inos: &[u64]) {
        for &ino in full.iter().chain(inos) {
            self.inodes.changes(transid, ino, |c| {
                c.logged = true;
                if Some(ino) == full {
                    c.ranges.clear();
                }
            });
        }
    }

    /// The ranges of `ino` changed since it was last logged, merged. They
    /// stay noted until the log holding them is applied.
    fn tracked_ranges(&self, transid: u64, ino: u64) -> Vec<(u64, u64)> {
        self.inodes.changed(transid, ino, |c| c.ranges.to_vec())
    }

    fn tracked_children(&self, transid: u64, dir: u64) -> Vec<u64> {
        self.inodes
            .changed(transid, dir, |c| c.children.iter().copied().collect())
    }
}

/// Edits to the log, gathered before any is made so the space they need
/// can be reserved first.
#[derive(Default)]
struct Batch {
    /// Key ranges `[start, end)` of the log to clear.
    clear: Vec<(Key, Key)>,
    /// File ranges of the log to cut out: (ino, start, end).
    punch: Vec<(u64, u64, u64)>,
    puts: Vec<(Key, Vec<u8>)>,
}

impl Batch {
    /// Room for the edits, sized by `tree`'s height (the log's own is no
    /// greater than that of the fs tree it copies from).
    fn need(&self, tree: u64) -> Need {
        let bytes: u64 = self.puts.iter().map(|(_, d)| d.len() as u64 + 40).sum();
        let items = self.puts.len() + 2 * self.punch.len() + self.clear.len() + 2;
        Need::items(tree, items as u64).payload(bytes)
    }

    /// Makes the edits, with the keys of subvolume `tree`'s inodes turned
    /// into the log's (see [`log_key`]).
    fn apply(self, tx: &mut Txn<'_>, tree: u64) -> Result<()> {
        for (start, end) in self.clear {
            let (start, end) = (log_key(tree, start), log_key(tree, end));
            for (k, _) in tx.range(LOG, &start, &end)? {
                tx.delete(LOG, &k)?;
            }
        }
        for (ino, s, e) in self.punch {
            file::punch(tx, LOG, super::node_id(tree, ino), s, e)?;
        }
        for (k, d) in self.puts {
            tx.put(LOG, log_key(tree, k), d)?;
        }
        Ok(())
    }
}

/// The log is one tree for every subvolume: an inode's items are keyed by
/// its node id there (the default subvolume's are unchanged). Checksum
/// items keep their key.
fn log_key(tree: u64, k: Key) -> Key {
    if k.objectid == CSUM_OBJECTID {
        return k;
    }
    Key::new(super::node_id(tree, k.objectid), k.ty, k.offset)
}

/// An item of the running transaction's log, if it has one.
fn log_get(tx: &Txn<'_>, tree: u64, key: &Key) -> Result<Option<Vec<u8>>> {
    if tx.has_log() {
        tx.get(LOG, &log_key(tree, *key))
    } else {
        Ok(None)
    }
}

fn keys_of(ino: u64, ty: u8) -> (Key, Key) {
    (Key::new(ino, ty, 0), Key::new(ino, ty + 1, 0))
}

/// Copies the raw items `[start, end)` of the fs tree.
fn copy_items(tx: &Txn<'_>, tree: u64, start: Key, end: Key) -> Result<Vec<(Key, Vec<u8>)>> {
    tx.range(tree, &start, &end)
}

impl Subvol {
    /// fsync(2) and fdatasync(2) of `ino`: its data and the log entries
    /// that make it (and the names that reach it) survive a crash.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        if !self.core.log_enabled() {
            return self.core.sync();
        }
        self.flush_file_for_fsync(ino)?;
        self.flush_symlinks_in(ino)?;
        let step = self.core.engine.write(|tx| {
            if tx.has_pending_log() || self.core.tracking.is_stale(tx.transid()) {
                return Ok(LogStep::NeedsCommit);
            }
            Ok(match self.log_inode(tx, ino)? {
                true => LogStep::Logged,
                false => LogStep::Unchanged,
            })
        });
        match step {
            Ok(LogStep::Logged) => self.core.engine.sync_log(),
            // Unchanged since the last commit: durable once it is written.
            Ok(LogStep::Unchanged) | Err(Error::NotFound) => self.core.engine.wait_prepared(),
            // No room for the log: a commit does it all.
            Ok(LogStep::NeedsCommit) | Err(Error::NoSpace) => self.core.sync(),
            Err(e) => Err(e),
        }
    }

    /// A directory's changed children go into the log with it, and a
    /// symlink is logged whole, target included. A long target is
    /// buffered data until the flush `create` runs right after its
    /// transaction: flush those first, so no symlink is logged without
    /// its target.
    fn flush_symlinks_in(&self, dir: u64) -> Result<()> {
        let pending: Vec<u64> = self
            .tracked_children(self.core.engine.transid(), dir)
            .into_iter()
            .filter(|&c| self.buffered_bytes_of(c) > 0)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let links = self.core.engine.read(|r| {
            Ok(pending
                .into_iter()
                .filter(|&c| {
                    super::load_inode_r(r, self.tree, c)
                        .is_ok_and(|i| i.mode & libc::S_IFMT == libc::S_IFLNK)
                })
                .collect::<Vec<u64>>())
        })?;
        links
            .into_iter()
            .try_for_each(|l| self.flush_file_for_fsync(l))
    }

    /// Logs `ino` in full; false when it did not change in this
    /// transaction (nothing to log).
    fn log_inode(&self, tx: &mut Txn<'_>, ino: u64) -> Result<bool> {
        let transid = tx.transid();
        let inode = load_inode_tx(tx, self.tree, ino)?;
        if inode.transid < transid {
            return Ok(false);
        }
        let mut batch = Batch::default();
        self.plan_full(tx, ino, &inode, &mut batch)?;
        let mut visited = HashSet::from([ino]);
        let mut extra = Vec::new();
        self.plan_related(tx, ino, &mut visited, &mut extra)?;
        if super::is_dir(inode.mode) {
            for child in self.tracked_children(transid, ino) {
                if visited.insert(child) {
                    extra.push(child);
                }
            }
        }
        // Names of everything related, found transitively.
        let mut others = Vec::new();
        while let Some(other) = extra.pop() {
            if self.plan_current_names(tx, other, &mut batch)? {
                self.plan_related(tx, other, &mut visited, &mut extra)?;
            }
            others.push(other);
        }
        // Room first: ENOSPC must come before the log changes anything.
        tx.reserve(&batch.need(self.tree))?;
        tx.ensure_log()?;
        batch.apply(tx, self.tree)?;
        // Its data, new extents or written in place, must be durable
        // before the log is: nothing else would tell replay it is not.
        if !super::file::keeps_sums(inode.flags) {
            tx.note_log_unchecked_data();
        }
        // Only now: a failure above leaves the ranges noted for the next
        // fsync and marks nothing logged that is not.
        self.mark_logged(transid, Some(ino), &others);
        Ok(true)
    }

    /// Inodes whose names must be logged with `ino`'s: its ancestors
    /// changed in this transaction, and the live holders of its names in
    /// the last commit.
    fn plan_related(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        visited: &mut HashSet<u64>,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let root = tx.root_of(self.tree)?;
        let committed = tx.committed_root(self.tree);
        for r in dir::refs_of(tx, &root, ino)? {
            let parent = r.ino;
            if parent != ROOT_DIR_INO && !visited.contains(&parent) {
                let p = load_inode_tx(tx, self.tree, parent)?;
                if p.transid >= tx.transid() {
                    visited.insert(parent);
                    out.push(parent);
                }
            }
            let Some(croot) = committed else { continue };
            if let Some(old) = dir::lookup(tx, &croot, parent, &r.name)? {
                if old.ino != ino
                    && !visited.contains(&old.ino)
                    && tx.get(self.tree, &super::inode_key(old.ino))?.is_some()
                {
                    visited.insert(old.ino);
                    out.push(old.ino);
                }
            }
        }
        Ok(())
    }

    /// The full record of `ino` (see the module doc).
    fn plan_full(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        inode: &InodeItem,
        batch: &mut Batch,
    ) -> Result<()> {
        let tree = self.tree;
        for ty in [INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, LOG_INODE] {
            batch.clear.push(keys_of(ino, ty));
        }
        batch
            .puts
            .push((Key::new(ino, LOG_INODE, 0), vec![MODE_FULL]));
        batch.puts.push((super::inode_key(ino), inode.encode()));
        for ty in [INODE_REF, INODE_EXTREF, XATTR_ITEM] {
            let (s, e) = keys_of(ino, ty);
            batch.puts.extend(copy_items(tx, tree, s, e)?);
        }
        let ranges = if inode.mode & libc::S_IFMT == libc::S_IFREG {
            self.tracked_ranges(tx.transid(), ino)
        } else if super::is_dir(inode.mode) {
            Vec::new()
        } else {
            vec![(0, u64::MAX)]
        };
        let root = tx.root_of(tree)?;
        for (s, e) in ranges {
            batch.punch.push((ino, s, e));
            // Ranges may overlap; replay covers their union.
            let range_key = Key::new(ino, LOG_RANGE, s);
            let logged_end = log_get(tx, self.tree, &range_key)?
                .and_then(|d| d.try_into().ok().map(u64::from_le_bytes))
                .unwrap_or(0);
            batch
                .puts
                .push((range_key, e.max(logged_end).to_le_bytes().to_vec()));
            for (k, fe) in file::items_in(tx, &root, ino, s, e)? {
                let from = k.max(s);
                let to = (k + file::item_len(&fe)).min(e);
                if from >= to {
                    continue;
                }
                let part = file::slice(&fe, from - k, to - from)?;
                if let Some((bytenr, _)) = part.disk_extent() {
                    if tx.is_new_extent(bytenr) {
                        let ck = Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr);
                        if let Some(sums) = tx.get(CSUM, &ck)? {
                            batch.puts.push((ck, sums));
                        }
                    }
                }
                batch
                    .puts
                    .push((Key::new(ino, EXTENT_DATA, from), part.encode()));
            }
        }
        Ok(())
    }

    /// `ino`'s names as they are now, or its record as gone if it no
    /// longer exists (an unlinked open file has no names, and replay
    /// deletes it too). Returns whether it exists.
    fn plan_current_names(&self, tx: &Txn<'_>, ino: u64, batch: &mut Batch) -> Result<bool> {
        match load_inode_tx(tx, self.tree, ino) {
            Ok(i) => self.plan_names(tx, ino, &i, batch).map(|()| true),
            Err(Error::NotFound) => {
                plan_gone(ino, batch);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `ino`'s names, and its inode item unless the log has its full
    /// record already.
    fn plan_names(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        inode: &InodeItem,
        batch: &mut Batch,
    ) -> Result<()> {
        let tree = self.tree;
        let kind = inode.mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFDIR {
            // Symlinks and special files are tiny: log them whole.
            return self.plan_full(tx, ino, inode, batch);
        }
        let logged = log_get(tx, self.tree, &Key::new(ino, LOG_INODE, 0))?;
        for ty in [INODE_REF, INODE_EXTREF] {
            batch.clear.push(keys_of(ino, ty));
            let (s, e) = keys_of(ino, ty);
            batch.puts.extend(copy_items(tx, tree, s, e)?);
        }
        match logged.as_deref() {
            Some([MODE_FULL]) => {
                // Keep the logged item (its size goes with its logged
                // data); only the link count follows the names.
                if let Some(d) = log_get(tx, self.tree, &super::inode_key(ino))? {
                    if let Ok(mut old) = InodeItem::decode(&d) {
                        old.nlink = inode.nlink;
                        batch.puts.push((super::inode_key(ino), old.encode()));
                    }
                }
            }
            _ => {
                batch.clear.push(keys_of(ino, LOG_INODE));
                batch
                    .puts
                    .push((Key::new(ino, LOG_INODE, 0), vec![MODE_NAMES]));
                // Replay logs a new regular file empty: its data is not
                // in the log.
                batch.puts.push((super::inode_key(ino), inode.encode()));
            }
        }
        Ok(())
    }

    /// Seed 003's rule, called by rename, link and unlink inside their
    /// transaction after they changed the names of `inos`: only inodes
    /// logged in this transaction have their logged names brought up to
    /// date. A failure here cannot undo the operation, so it marks the
    /// log stale (the next fsync commits) instead of failing it.
    pub(crate) fn log_name_changes(&self, tx: &mut Txn<'_>, inos: &[u64]) -> Result<()> {
        let transid = tx.transid();
        let logged: Vec<u64> = inos
            .iter()
            .copied()
            .filter(|&i| self.is_logged(transid, i))
            .collect();
        if logged.is_empty() || !tx.has_log() {
            return Ok(());
        }
        let mut batch = Batch::default();
        for ino in logged {
            self.plan_current_names(tx, ino, &mut batch)?;
        }
        let applied = tx
            .reserve(&batch.need(self.tree))
            .and_then(|()| batch.apply(tx, self.tree));
        match applied {
            Err(Error::NoSpace) => {
                self.core.tracking.set_stale(transid);
                Ok(())
            }
            r => r,
        }
    }

    /// Notes that `[start, end)` of `ino`'s extents changed (for the next
    /// fsync's log). A file that is, or was, small enough to be inline has
    /// its whole range noted: its one item covers it all.
    pub(crate) fn note_extents(&self, tx: &Txn<'_>, ino: u64, old_size: u64, start: u64, end: u64) {
        const S: u64 = crate::format::SECTORSIZE as u64;
        let (s, e) = if old_size <= file::INLINE_FILE_MAX {
            (0, u64::MAX)
        } else {
            (start / S * S, end.div_ceil(S).saturating_mul(S))
        };
        self.track_range(tx.transid(), ino, s, e);
    }

    /// Notes that `child`'s name in `dir` changed (for a directory fsync).
    pub(crate) fn note_name(&self, tx: &Txn<'_>, dir: u64, child: u64) {
        self.inodes.changes(tx.transid(), dir, |c| {
            c.children.insert(child);
        });
    }
}

/// The log's record of an inode that no longer exists.
fn plan_gone(ino: u64, batch: &mut Batch) {
    batch
        .clear
        .push((Key::new(ino, 0, 0), Key::new(ino.saturating_add(1), 0, 0)));
    batch
        .puts
        .push((Key::new(ino, LOG_INODE, 0), vec![MODE_GONE]));
}

/// Every name in `entries` as (parent, name).
pub(crate) fn name_set(entries: &[DirEntry]) -> HashSet<(u64, Vec<u8>)> {
    entries.iter().map(|e| (e.ino, e.name.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::super::inodes::InodeTable;

    /// Seed 003's marker lives in the inode's entry for one transaction:
    /// the entry stays while that transaction runs and goes once the next
    /// one is seen.
    #[test]
    fn changes_of_an_older_transaction_count_as_none() {
        let t = InodeTable::new();
        t.changes(7, 300, |c| c.logged = true);
        t.changes(7, 301, |c| c.ranges.insert(0, 4096));
        assert!(t.changed(7, 300, |c| c.logged));
        assert!(!t.changed(7, 301, |c| c.logged));
        assert!(t.get(300).is_some(), "kept while its transaction runs");
        assert!(
            !t.changed(8, 300, |c| c.logged),
            "a new transaction starts clean"
        );
        assert!(t.get(300).is_none() && t.get(301).is_none(), "swept");
    }
}
