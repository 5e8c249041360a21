//! Subvolumes and snapshots: many fs trees in one pool, each shown as a
//! directory of its parent.
//!
//! A subvolume is an fs tree (id 256 and up) with its own inode numbers
//! and root directory (inode 256). It appears in its parent subvolume as a
//! directory entry flagged [`SUBVOL_ENTRY`] whose inode field is the
//! subvolume's tree id; the entry has no INODE_REF in the parent's tree.
//! Instead the root tree records the link both ways:
//!
//! - `(parent tree, ROOT_REF, subvolume)` and
//! - `(subvolume, ROOT_BACKREF, parent tree)`,
//!
//! each holding one directory entry: the directory holding the link (in
//! the entry's inode field), its readdir index and its name.
//!
//! A snapshot is a subvolume made by cloning another's tree: one new root
//! reference, O(1) whatever the size of the source. Creating, snapshotting
//! and deleting commit at once, so the log tree never has to describe a
//! subvolume link.

use super::{dir, dtype, errno, is_dir, load_inode_r, Attr, Core};
use super::{node_id, Owner, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{DirEntry, Timespec, ROOT_DIR_INO, SUBVOL_ENTRY};
use crate::format::key_type::{DEFAULT_SUBVOL, ROOT_BACKREF, ROOT_REF};
use crate::format::tree_id::{self, DEFAULT_DIR, FS, ROOT};
use crate::format::Key;
use crate::txn::{Need, Reader, Txn};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Root item flag: the subvolume is read-only.
pub(crate) const ROOT_READONLY: u64 = 1;

/// Items a subvolume link changes at most: the two directory items, the
/// parent's inode, two root references, the new tree's root directory.
const LINK_ITEMS: u64 = 12;

/// One subvolume, as `canopy subvolume list` and `show` report it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SubvolInfo {
    /// Its tree id.
    pub id: u64,
    /// The last transaction that changed it.
    pub generation: u64,
    /// The subvolume holding its directory entry (5 for the top level).
    pub parent: u64,
    /// Its path from the top of the pool (tree 5).
    pub path: String,
    pub readonly: bool,
    /// The subvolume it is a snapshot of (None for one made empty).
    pub snapshot_of: Option<u64>,
    /// The transaction that made it.
    pub created: u64,
    /// Its uuid, the uuid of what it is a snapshot of, and of the
    /// subvolume a receive made it from (as btrfs shows them; None: none).
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub parent_uuid: Option<String>,
    #[serde(default)]
    pub received_uuid: Option<String>,
    /// The transaction of its last change send sees, and for a received
    /// subvolume the sender's.
    #[serde(default)]
    pub ctransid: u64,
    #[serde(default)]
    pub stransid: u64,
}

fn root_ref_key(parent: u64, child: u64) -> Key {
    Key::new(parent, ROOT_REF, child)
}

fn root_backref_key(child: u64, parent: u64) -> Key {
    Key::new(child, ROOT_BACKREF, parent)
}

fn default_key() -> Key {
    Key::new(DEFAULT_DIR, DEFAULT_SUBVOL, 0)
}

/// Where subvolume `tree`'s entry is: (parent tree, the entry with the
/// directory in its inode field). None for tree 5 (and for a subvolume
/// whose link is gone).
pub(crate) fn link_of<B>(b: &B, tree: u64) -> Result<Option<(u64, DirEntry)>>
where
    B: RootTreeRead + ?Sized,
{
    let start = Key::new(tree, ROOT_BACKREF, 0);
    let end = Key::new(tree, ROOT_BACKREF, u64::MAX);
    let Some((k, d)) = b.root_range(&start, &end)?.into_iter().next() else {
        return Ok(None);
    };
    let entry = DirEntry::decode_all(super::checked(b, &k, &d)?)
        .ok()
        .and_then(|mut v| v.pop())
        .ok_or_else(|| k.bad("root back-reference without an entry"))?;
    Ok(Some((k.offset, entry)))
}

/// Reading the root tree from a reader or a transaction alike.
pub(crate) trait RootTreeRead: crate::tree::BlockRead {
    fn root_range(&self, start: &Key, end: &Key) -> Result<Vec<(Key, Vec<u8>)>>;
}

impl RootTreeRead for Reader<'_> {
    fn root_range(&self, start: &Key, end: &Key) -> Result<Vec<(Key, Vec<u8>)>> {
        self.range(ROOT, start, end)
    }
}

impl RootTreeRead for Txn<'_> {
    fn root_range(&self, start: &Key, end: &Key) -> Result<Vec<(Key, Vec<u8>)>> {
        self.range(ROOT, start, end)
    }
}

impl Subvol {
    /// The subvolume `name` in `parent` links to, if it is one.
    pub(crate) fn subvolume_named(&self, parent: u64, name: &[u8]) -> Result<Option<u64>> {
        self.core.engine.read(|r| {
            let root = r.root(self.tree)?;
            Ok(dir::lookup(r, &root, parent, name)?
                .filter(DirEntry::is_subvolume)
                .map(|e| e.ino))
        })
    }

    /// Node id of the directory holding this subvolume's root (".." of
    /// its root directory); the top level is its own parent.
    pub(crate) fn parent_of_root(&self, r: &Reader<'_>) -> Result<u64> {
        Ok(match link_of(r, self.tree)? {
            Some((parent, e)) => node_id(parent, e.ino),
            None => node_id(self.tree, ROOT_DIR_INO),
        })
    }

    /// Flushes the buffered data of every file of this subvolume.
    pub(crate) fn flush_own(&self) -> Result<()> {
        let mut dirty = self.inodes.dirty_inodes();
        dirty.sort_unstable();
        for (_, ino) in dirty.into_iter().rev() {
            self.flush_file(ino)?;
        }
        Ok(())
    }

    /// `canopy subvolume create`: a new empty subvolume `name` in `parent`.
    pub(crate) fn create_subvolume(&self, parent: u64, name: &[u8], owner: Owner) -> Result<Attr> {
        self.link_new_subvolume(parent, name, |tx, id| {
            tx.create_tree(id, name)?;
            super::ident::assign_new(tx, id, None)?;
            let mut root = super::root_dir_item(tx.transid());
            root.uid = owner.uid;
            root.gid = owner.gid;
            tx.insert(id, super::inode_key(ROOT_DIR_INO), root.encode())
        })
    }

    /// `canopy subvolume snapshot`: subvolume `name` in `parent` becomes a
    /// clone of `source` (read-only if asked). Everything written to the
    /// source before the call is in it, buffered data included.
    pub(crate) fn snapshot(
        &self,
        source: &Subvol,
        parent: u64,
        name: &[u8],
        readonly: bool,
    ) -> Result<Attr> {
        source.flush_own()?;
        self.link_new_subvolume(parent, name, |tx, id| {
            tx.clone_tree(source.tree, id, name)?;
            stub_nested_links(tx, source.tree, id)?;
            super::ident::assign_new(tx, id, Some(source.tree))?;
            if readonly {
                tx.set_root_flags(id, ROOT_READONLY)?;
            }
            Ok(())
        })
    }

    /// Makes a subvolume with `make(tx, id)`, links it as `name` in
    /// `parent` and commits.
    fn link_new_subvolume(
        &self,
        parent: u64,
        name: &[u8],
        make: impl Fn(&mut Txn<'_>, u64) -> Result<()>,
    ) -> Result<Attr> {
        dir::check_name(name)?;
        self.check_writable()?;
        let mut highest = crate::sync::lock(&self.core.subvol_lock);
        let tree = self.tree;
        // Never an id used before in this mount: the kernel may still
        // hold node ids of a deleted subvolume.
        let id = self
            .core
            .engine
            .read(|r| Ok(next_subvolume_id(r)))?
            .max(*highest + 1);
        if !tree_id::is_subvolume(id) {
            return Err(errno(libc::ENOSPC, "every subvolume id is in use"));
        }
        self.core.write_reserved(|tx| {
            // The snapshot's group and the memberships it inherits.
            let quota = crate::qgroup::ops::items_for_subvolume(tx.qgroups(), Some(tree));
            tx.reserve(&Need::items(tree, LINK_ITEMS + quota))?;
            let mut p = self.inode_tx(tx, parent)?;
            if !is_dir(p.mode) {
                return Err(errno(libc::ENOTDIR, "not a directory"));
            }
            let root = tx.root_of(tree)?;
            if dir::lookup(tx, &root, parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            p.nlink = p
                .nlink
                .checked_add(1)
                .ok_or(errno(libc::EMLINK, "too many links"))?;
            // Planned before anything changes: a name that does not fit
            // leaves no tree behind.
            let kind = dtype(libc::S_IFDIR) | SUBVOL_ENTRY;
            dir::check_room(tx, tree, parent, name, id, kind)?;
            make(tx, id)?;
            let index = dir::add(tx, tree, parent, name, id, kind)?;
            put_links(tx, tree, id, parent, index, name)?;
            let now = Timespec::now();
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, parent, p)
        })?;
        *highest = id;
        drop(highest);
        self.core.engine.commit()?;
        let i = self
            .core
            .engine
            .read(|r| load_inode_r(r, id, ROOT_DIR_INO))?;
        Ok(super::ops::attr_of(node_id(id, ROOT_DIR_INO), &i))
    }

    /// Deletes subvolume `sub`, linked as `name` in `parent` (rmdir, or
    /// `canopy subvolume delete`), and commits; the cleaner frees its
    /// blocks afterwards. Refused for the default
    /// subvolume, the one the mount shows, one holding other subvolumes,
    /// and (for rmdir, `only_empty`) one that is not empty.
    pub(crate) fn delete_subvolume(
        &self,
        parent: u64,
        name: &[u8],
        sub: u64,
        only_empty: bool,
    ) -> Result<()> {
        self.check_writable()?;
        let _serial = crate::sync::lock(&self.core.subvol_lock);
        self.core
            .engine
            .read(|r| self.check_deletable(r, sub, only_empty))?;
        let doomed = self.core.subvol(sub)?;
        doomed.deleting.store(true, Ordering::Relaxed);
        let deleted = self.unlink_subvolume(parent, name, &doomed);
        if deleted.is_err() {
            doomed.deleting.store(false, Ordering::Relaxed);
        }
        deleted?;
        crate::sync::write(&self.core.subvols).remove(&sub);
        self.core.engine.commit()?;
        self.core.wake_cleaner();
        Ok(())
    }

    /// The transaction of [`Subvol::delete_subvolume`]: the link, both
    /// root references and the tree go, and whatever `doomed` still
    /// buffers is dropped with its reservation.
    fn unlink_subvolume(&self, parent: u64, name: &[u8], doomed: &Subvol) -> Result<()> {
        let (tree, sub) = (self.tree, doomed.tree);
        // Flushed first: a flush still running when the tree goes would
        // find it gone.
        doomed.flush_own()?;
        self.core.write_reserved(|tx| {
            let quota = crate::qgroup::ops::items_for_subvolume(tx.qgroups(), Some(sub));
            tx.reserve(&Need::items(tree, LINK_ITEMS + quota).deleting())?;
            let root = tx.root_of(tree)?;
            match dir::lookup(tx, &root, parent, name)? {
                Some(e) if e.is_subvolume() && e.ino == sub => {}
                _ => return Err(Error::NotFound),
            }
            dir::remove(tx, tree, parent, name)?;
            tx.delete(ROOT, &root_ref_key(tree, sub))?;
            tx.delete(ROOT, &root_backref_key(sub, tree))?;
            let mut p = self.inode_tx(tx, parent)?;
            p.nlink = p.nlink.saturating_sub(1);
            let now = Timespec::now();
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, parent, p)?;
            for (_, ino) in doomed.inodes.dirty_inodes() {
                doomed.discard_buffered(tx, ino);
            }
            tx.drop_tree(sub)
        })
    }

    fn check_deletable(&self, r: &Reader<'_>, sub: u64, only_empty: bool) -> Result<()> {
        if sub == default_subvolume(r)? {
            return Err(errno(
                libc::EPERM,
                "the default subvolume cannot be deleted",
            ));
        }
        if sub == self.core.shown.load(Ordering::Relaxed) {
            return Err(errno(libc::EBUSY, "the mount shows this subvolume"));
        }
        let refs = r.range(ROOT, &root_ref_key(sub, 0), &root_ref_key(sub, u64::MAX))?;
        if !refs.is_empty() {
            return Err(errno(
                libc::ENOTEMPTY,
                "the subvolume holds other subvolumes",
            ));
        }
        if only_empty {
            let root = r.root(sub)?;
            if !dir::is_empty(r, &root, ROOT_DIR_INO)? {
                return Err(errno(libc::ENOTEMPTY, "directory not empty"));
            }
        }
        Ok(())
    }

    /// rename(2) where the source or the destination names a subvolume:
    /// the link moves within this subvolume (its root references follow);
    /// it never replaces anything, nor is it replaced.
    pub(crate) fn rename_subvolume(
        &self,
        tx: &mut Txn<'_>,
        parent: u64,
        src: &DirEntry,
        (newparent, newname): (u64, &[u8]),
        dst: Option<&DirEntry>,
        exchange: bool,
    ) -> Result<()> {
        if dst.is_some_and(|d| d.ino == src.ino && d.kind == src.kind) {
            return Ok(());
        }
        if exchange || dst.is_some() {
            return Err(errno(libc::EEXIST, "a subvolume link is never replaced"));
        }
        let tree = self.tree;
        dir::check_room(tx, tree, newparent, newname, src.ino, src.kind)?;
        dir::remove(tx, tree, parent, &src.name)?;
        let index = dir::add(tx, tree, newparent, newname, src.ino, src.kind)?;
        put_links(tx, tree, src.ino, newparent, index, newname)?;
        // The link counts as a subdirectory of its directory.
        self.adjust_parents(tx, parent, newparent, (true, false), Timespec::now())
    }
}

/// The links to other subvolumes that snapshot `snap` copied from
/// `source` become empty directories, as in btrfs: a snapshot does not
/// reach into the subvolumes nested in its source (they have no root
/// reference from it).
fn stub_nested_links(tx: &mut Txn<'_>, source: u64, snap: u64) -> Result<()> {
    let nested = tx.range(
        ROOT,
        &root_ref_key(source, 0),
        &root_ref_key(source, u64::MAX),
    )?;
    if nested.is_empty() {
        return Ok(());
    }
    tx.reserve(&Need::items(snap, 4 * nested.len() as u64))?;
    let mut next = super::last_ino(tx, &tx.root_of(snap)?)?.max(ROOT_DIR_INO) + 1;
    for (k, d) in nested {
        let Some(link) = DirEntry::decode_all(super::checked(tx, &k, &d)?)
            .ok()
            .and_then(|mut v| v.pop())
        else {
            continue;
        };
        dir::remove(tx, snap, link.ino, &link.name)?;
        let stub = super::root_dir_item(tx.transid());
        tx.insert(snap, super::inode_key(next), stub.encode())?;
        dir::add(tx, snap, link.ino, &link.name, next, dtype(libc::S_IFDIR))?;
        next += 1;
    }
    Ok(())
}

/// Writes both root references of subvolume `child` linked as `name`
/// (readdir index `index`) in directory `dir` of tree `parent`.
fn put_links(
    tx: &mut Txn<'_>,
    parent: u64,
    child: u64,
    dir: u64,
    index: u64,
    name: &[u8],
) -> Result<()> {
    let entry = DirEntry {
        ino: dir,
        kind: dtype(libc::S_IFDIR) | SUBVOL_ENTRY,
        index,
        name: name.to_vec(),
    };
    let data = DirEntry::encode_all(std::slice::from_ref(&entry));
    tx.put(ROOT, root_ref_key(parent, child), data.clone())?;
    tx.put(ROOT, root_backref_key(child, parent), data)
        .map(drop)
}

/// The id the next subvolume gets: one past the highest in use.
fn next_subvolume_id(r: &Reader<'_>) -> u64 {
    r.tree_ids()
        .into_iter()
        .filter(|&id| tree_id::is_subvolume(id))
        .max()
        .map_or(tree_id::FIRST_FREE, |m| m + 1)
}

/// The subvolume a mount shows when none is asked for.
pub(crate) fn default_subvolume(r: &Reader<'_>) -> Result<u64> {
    Ok(match r.get(ROOT, &default_key())? {
        Some(d) => d
            .try_into()
            .map(u64::from_le_bytes)
            .ok()
            .filter(|&id| r.tree_exists(id))
            .unwrap_or(FS),
        None => FS,
    })
}

impl Core {
    /// `canopy subvolume set-default`.
    pub(crate) fn set_default_subvolume(&self, id: u64) -> Result<()> {
        self.write_reserved(|tx| {
            if !(id == FS || tree_id::is_subvolume(id)) || !tx.tree_exists(id) {
                return Err(Error::NotFound);
            }
            tx.reserve(&Need::items(ROOT, 1))?;
            tx.put(ROOT, default_key(), id.to_le_bytes().to_vec())
                .map(drop)
        })?;
        self.engine.commit().map(drop)
    }

    /// `canopy property set PATH ro true|false` on a subvolume.
    pub(crate) fn set_subvolume_read_only(self: &Arc<Self>, id: u64, ro: bool) -> Result<()> {
        let sv = self.subvol(id)?;
        if ro {
            sv.flush_own()?;
        }
        self.write_reserved(|tx| {
            tx.reserve(&Need::items(ROOT, 1))?;
            let flags = tx.root_item(id)?.flags;
            let flags = if ro {
                flags | ROOT_READONLY
            } else {
                flags & !ROOT_READONLY
            };
            tx.set_root_flags(id, flags)?;
            super::ident::read_only_changed(tx, id, ro)
        })?;
        sv.readonly.store(ro, Ordering::Relaxed);
        self.engine.commit().map(drop)
    }

    /// Every subvolume but the top level, by id.
    pub(crate) fn list_subvolumes(&self) -> Result<Vec<SubvolInfo>> {
        self.engine.read(|r| {
            r.tree_ids()
                .into_iter()
                .filter(|&id| tree_id::is_subvolume(id))
                .map(|id| subvolume_info(r, id))
                .collect()
        })
    }

    /// One subvolume's record.
    pub(crate) fn subvolume_info(&self, id: u64) -> Result<SubvolInfo> {
        self.engine.read(|r| subvolume_info(r, id))
    }
}

fn subvolume_info(r: &Reader<'_>, id: u64) -> Result<SubvolInfo> {
    let item = r.root_item(id)?;
    let ident = item.ident;
    let parent = link_of(r, id)?.map_or(0, |(p, _)| p);
    Ok(SubvolInfo {
        id,
        generation: item.generation,
        parent,
        path: path_of(r, id)?,
        readonly: item.flags & ROOT_READONLY != 0,
        snapshot_of: (item.parent_id != 0).then_some(item.parent_id),
        created: item.created,
        uuid: ident.and_then(|i| shown_uuid(&i.uuid)),
        parent_uuid: ident.and_then(|i| shown_uuid(&i.parent_uuid)),
        received_uuid: ident.and_then(|i| shown_uuid(&i.received_uuid)),
        ctransid: ident.map_or(0, |i| i.ctransid),
        stransid: ident.map_or(0, |i| i.stransid),
    })
}

/// A uuid as people write it; None for the zero uuid (none).
fn shown_uuid(u: &[u8; 16]) -> Option<String> {
    (*u != [0; 16]).then(|| crate::format::uuid::shown(u))
}

/// Subvolume `id`'s path from the top level ("" for tree 5). Bounded by
/// the number of links walked, so a damaged image cannot loop it.
pub(crate) fn path_of(r: &Reader<'_>, id: u64) -> Result<String> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut at = id;
    let mut steps = 0u32;
    while let Some((parent, link)) = link_of(r, at)? {
        parts.push(link.name);
        let root = r.root(parent)?;
        let mut d = link.ino;
        while d != ROOT_DIR_INO {
            let up = dir::refs_of(r, &root, d)?
                .into_iter()
                .next()
                .ok_or_else(|| Error::corrupt(d, "directory without a name"))?;
            parts.push(up.name);
            d = up.ino;
            steps += 1;
            if steps > 1 << 16 {
                return Err(Error::corrupt(d, "loop in directory parents"));
            }
        }
        at = parent;
        steps += 1;
        if steps > 1 << 16 {
            return Err(Error::corrupt(at, "loop in subvolume links"));
        }
    }
    let names: Vec<String> = parts
        .iter()
        .rev()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Ok(names.join("/"))
}
