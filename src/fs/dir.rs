//! Directory entries: by name hash (DIR_ITEM) and by index (DIR_INDEX),
//! and the back-reference from the child to its names (INODE_REF, with
//! INODE_EXTREF for names beyond what one item holds), which
//! gives a directory's parent ("..") and lets rename check for loops by
//! walking up instead of searching the moved subtree.

use super::{errno, NAME_MAX};
use crate::error::{Error, Result};
use crate::format::inode::ROOT_DIR_INO;
use crate::format::inode::{extref_hash, name_hash, DirEntry};
use crate::format::key_type::{DIR_INDEX, DIR_ITEM, INODE_EXTREF, INODE_REF};
use crate::format::Key;
use crate::tree::{BlockRead, Cursor};
use crate::txn::Txn;

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(errno(libc::ENAMETOOLONG, "name longer than 255 bytes"));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(errno(libc::EINVAL, "invalid name"));
    }
    Ok(())
}

fn decode<B: BlockRead + ?Sized>(b: &B, key: &Key, data: &[u8]) -> Result<Vec<DirEntry>> {
    DirEntry::decode_all(super::checked(b, key, data)?).map_err(|reason| key.bad(reason))
}

/// The entry `name` of `dir`, if any.
pub(crate) fn lookup<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
    name: &[u8],
) -> Result<Option<DirEntry>> {
    let key = Key::new(dir, DIR_ITEM, name_hash(name));
    let found = crate::tree::get_with(b, root, &key, |data| {
        Ok(decode(b, &key, data)?.into_iter().find(|e| e.name == name))
    })?;
    found.unwrap_or(Ok(None))
}

/// The index the next entry of `dir` gets: one past the highest in use.
fn next_index(tx: &Txn<'_>, tree: u64, dir: u64) -> Result<u64> {
    let root = tx.root_of(tree)?;
    let last = last_index(tx, &root, dir)?;
    if last >= crate::format::checker::MAX_DIR_INDEX {
        // Not damage (the checker allows the last index): the directory
        // has used every readdir position it can hand out, as a
        // directory may use up its link count.
        return Err(super::errno(
            libc::EMLINK,
            "the directory has used every index it can have",
        ));
    }
    Ok(last + 1)
}

/// The highest index in use in `dir` (1 when it has no entries: indexes
/// start at 2, after "." and "..").
pub(crate) fn last_index<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
) -> Result<u64> {
    let c = Cursor::seek_le(b, root, &Key::new(dir, DIR_INDEX, u64::MAX))?;
    let last = c.and_then(|c| {
        c.item()
            .filter(|i| i.key.objectid == dir && i.key.ty == DIR_INDEX)
            .map(|i| i.key.offset)
    });
    Ok(last.unwrap_or(1))
}

/// The items adding one entry writes, worked out before anything changes:
/// an entry that cannot be added fails cleanly, leaving the tree as it was.
pub(crate) struct Addition {
    by_name: (Key, Vec<u8>),
    by_index: (Key, Vec<u8>),
    /// None for an entry naming a subvolume: its root directory has no
    /// back-reference in this tree (a ROOT_BACKREF stands for it).
    back_ref: Option<(Key, Vec<u8>)>,
}

/// The entry list stored at `key` with `entry` appended, encoded.
fn with_entry(tx: &Txn<'_>, tree: u64, key: &Key, entry: DirEntry) -> Result<Vec<u8>> {
    let mut list = match tx.get(tree, key)? {
        Some(d) => decode(tx, key, &d)?,
        None => Vec::new(),
    };
    list.push(entry);
    Ok(DirEntry::encode_all(&list))
}

/// Names of one inode in one directory share an INODE_REF item up to this
/// size; further names get INODE_EXTREF items keyed by directory and name,
/// so an inode may have any number of names in a directory.
fn ref_item_limit(tx: &Txn<'_>) -> usize {
    crate::tree::max_item_size(tx.nodesize_bytes()) / 4
}

/// Works out the items that add `name -> ino` to `dir`, or fails as
/// [`add`] would. They stay valid while nothing else changes `dir`'s
/// entries or `ino`'s back-references; [`apply`] writes them.
pub(crate) fn plan_add(
    tx: &Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
) -> Result<Addition> {
    let index = next_index(tx, tree, dir)?;
    plan_add_at(tx, tree, dir, name, ino, kind, index)
}

/// Adds an entry at readdir index `index` if that index is free, else at
/// the next one (log replay keeps the index an entry had).
pub(crate) fn add_at(
    tx: &mut Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
    index: u64,
) -> Result<()> {
    let taken = index < 2 || tx.get(tree, &Key::new(dir, DIR_INDEX, index))?.is_some();
    let index = if taken {
        next_index(tx, tree, dir)?
    } else {
        index
    };
    let a = plan_add_at(tx, tree, dir, name, ino, kind, index)?;
    apply(tx, tree, a)
}

/// The names of `ino`: entries whose `ino` is the directory holding it.
pub(crate) fn refs_of<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    ino: u64,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, &Key::new(ino, INODE_REF, 0))?;
    while let Some(it) = c.item() {
        if it.key.objectid != ino || (it.key.ty != INODE_REF && it.key.ty != INODE_EXTREF) {
            break;
        }
        out.extend(decode(b, &it.key, it.data)?);
        c.next(b)?;
    }
    Ok(out)
}

fn plan_add_at(
    tx: &Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
    index: u64,
) -> Result<Addition> {
    let entry = DirEntry {
        ino,
        kind,
        index,
        name: name.to_vec(),
    };
    let name_key = Key::new(dir, DIR_ITEM, name_hash(name));
    let by_name = with_entry(tx, tree, &name_key, entry.clone())?;
    let back_ref = match entry.is_subvolume() {
        true => None,
        false => Some(plan_back_ref(tx, tree, dir, &entry)?),
    };
    let max = crate::tree::max_item_size(tx.nodesize_bytes());
    if by_name.len() > max || back_ref.as_ref().is_some_and(|r| r.1.len() > max) {
        return Err(errno(libc::EOVERFLOW, "too many names with the same hash"));
    }
    Ok(Addition {
        by_name: (name_key, by_name),
        by_index: (
            Key::new(dir, DIR_INDEX, index),
            DirEntry::encode_all(std::slice::from_ref(&entry)),
        ),
        back_ref,
    })
}

/// The child's back-reference item with `entry` (in `dir`) added.
fn plan_back_ref(tx: &Txn<'_>, tree: u64, dir: u64, entry: &DirEntry) -> Result<(Key, Vec<u8>)> {
    let back = DirEntry {
        ino: dir,
        ..entry.clone()
    };
    let mut back_key = ref_key(entry.ino, dir);
    let mut refs = with_entry(tx, tree, &back_key, back.clone())?;
    if refs.len() > ref_item_limit(tx) {
        back_key = extref_key(entry.ino, dir, &entry.name);
        refs = with_entry(tx, tree, &back_key, back)?;
    }
    Ok((back_key, refs))
}

impl Addition {
    /// Whether removing a name of the same inode from another directory
    /// leaves this plan valid: its items are all keyed by the new
    /// directory, except a back-reference, which is the inode's INODE_REF
    /// for the new directory (an INODE_EXTREF item is keyed by a hash that
    /// names of two directories may share).
    pub(crate) fn survives_removal_from(&self, other_dir: u64) -> bool {
        let dir = self.by_name.0.objectid;
        dir != other_dir
            && self
                .back_ref
                .as_ref()
                .is_none_or(|(k, _)| k.ty == INODE_REF && k.offset == dir)
    }
}

/// Fails as [`add`] would, without changing anything: lets an operation
/// that removes names before adding one (rename) check first.
pub(crate) fn check_room(
    tx: &Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
) -> Result<()> {
    plan_add(tx, tree, dir, name, ino, kind).map(|_| ())
}

/// Adds `name -> ino` to `dir`; the caller checked it is absent. Returns
/// the entry's index.
pub(crate) fn add(
    tx: &mut Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
) -> Result<u64> {
    let a = plan_add(tx, tree, dir, name, ino, kind)?;
    let index = a.by_index.0.offset;
    apply(tx, tree, a).map(|()| index)
}

/// Writes the items of a planned addition.
pub(crate) fn apply(tx: &mut Txn<'_>, tree: u64, a: Addition) -> Result<()> {
    tx.put(tree, a.by_name.0, a.by_name.1)?;
    tx.insert(tree, a.by_index.0, a.by_index.1)?;
    match a.back_ref {
        Some((k, d)) => tx.put(tree, k, d).map(drop),
        None => Ok(()),
    }
}

/// `(ino, INODE_REF, dir)`: the child's names in `dir`, in the DIR_ITEM
/// entry layout with the directory in the inode field.
fn ref_key(ino: u64, dir: u64) -> Key {
    Key::new(ino, INODE_REF, dir)
}

/// `(ino, INODE_EXTREF, extref_hash(dir, name))`: names that did not fit
/// the INODE_REF item, same layout (entries of different directories may
/// share one on a hash collision).
fn extref_key(ino: u64, dir: u64, name: &[u8]) -> Key {
    Key::new(ino, INODE_EXTREF, extref_hash(dir, name))
}

/// Drops the child's back-reference for `name` in `dir`.
fn remove_ref(tx: &mut Txn<'_>, tree: u64, dir: u64, ino: u64, name: &[u8]) -> Result<()> {
    for key in [ref_key(ino, dir), extref_key(ino, dir, name)] {
        let Some(data) = tx.get(tree, &key)? else {
            continue;
        };
        let mut refs = decode(tx, &key, &data)?;
        let before = refs.len();
        refs.retain(|r| !(r.ino == dir && r.name == name));
        if refs.len() == before {
            continue;
        }
        return if refs.is_empty() {
            tx.delete(tree, &key).map(|_| ())
        } else {
            tx.put(tree, key, DirEntry::encode_all(&refs)).map(|_| ())
        };
    }
    Err(Error::corrupt(
        ino,
        "directory entry without back-reference",
    ))
}

/// The directory holding directory `dir` (the root is its own parent).
pub(crate) fn parent_of<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
) -> Result<u64> {
    if dir == ROOT_DIR_INO {
        return Ok(dir);
    }
    let c = Cursor::seek(b, root, &ref_key(dir, 0))?;
    let parent = match c.item() {
        Some(i) if i.key.objectid == dir && i.key.ty == INODE_REF => Some(i.key.offset),
        Some(i) if i.key.objectid == dir && i.key.ty == INODE_EXTREF => {
            decode(b, &i.key, i.data)?.first().map(|e| e.ino)
        }
        _ => None,
    };
    parent.ok_or_else(|| Error::corrupt(dir, "directory without a parent reference"))
}

/// Removes the entry `name` from `dir` and returns it.
pub(crate) fn remove(tx: &mut Txn<'_>, tree: u64, dir: u64, name: &[u8]) -> Result<DirEntry> {
    let key = Key::new(dir, DIR_ITEM, name_hash(name));
    let data = tx.get(tree, &key)?.ok_or(Error::NotFound)?;
    let mut entries = decode(tx, &key, &data)?;
    let at = entries
        .iter()
        .position(|e| e.name == name)
        .ok_or(Error::NotFound)?;
    let gone = entries.remove(at);
    if entries.is_empty() {
        tx.delete(tree, &key)?;
    } else {
        tx.put(tree, key, DirEntry::encode_all(&entries))?;
    }
    tx.delete(tree, &Key::new(dir, DIR_INDEX, gone.index))?;
    if !gone.is_subvolume() {
        remove_ref(tx, tree, dir, gone.ino, name)?;
    }
    Ok(gone)
}

/// True when `dir` has no entries.
pub(crate) fn is_empty<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
) -> Result<bool> {
    let c = Cursor::seek(b, root, &Key::new(dir, DIR_ITEM, 0))?;
    Ok(!c
        .item()
        .is_some_and(|i| i.key.objectid == dir && (i.key.ty == DIR_ITEM || i.key.ty == DIR_INDEX)))
}

/// Entries of `dir` from readdir offset `offset` on (offset = index + 1 of
/// the last entry returned; 0 at the start), at most `max`, none past index
/// `last`.
pub(crate) fn list<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
    (offset, last): (u64, u64),
    max: usize,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, &Key::new(dir, DIR_INDEX, offset))?;
    while out.len() < max {
        let Some(it) = c.item() else { break };
        if it.key.objectid != dir || it.key.ty != DIR_INDEX || it.key.offset > last {
            break;
        }
        out.extend(decode(b, &it.key, it.data)?);
        c.next(b)?;
    }
    Ok(out)
}
