//! Directory entries: by name hash (DIR_ITEM) and by index (DIR_INDEX),
//! and the back-reference from the child to its names (INODE_REF), which
//! gives a directory's parent ("..") and lets rename check for loops by
//! walking up instead of searching the moved subtree.

use super::{errno, NAME_MAX};
use crate::error::{Error, Result};
use crate::format::inode::ROOT_DIR_INO;
use crate::format::inode::{name_hash, DirEntry};
use crate::format::key_type::{DIR_INDEX, DIR_ITEM, INODE_REF};
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

fn decode(dir: u64, data: &[u8]) -> Result<Vec<DirEntry>> {
    DirEntry::decode_all(data).map_err(|e| Error::corrupt(dir, e))
}

/// The entry `name` of `dir`, if any.
pub(crate) fn lookup<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
    name: &[u8],
) -> Result<Option<DirEntry>> {
    let key = Key::new(dir, DIR_ITEM, name_hash(name));
    let Some(data) = crate::tree::get(b, root, &key)? else {
        return Ok(None);
    };
    Ok(decode(dir, &data)?.into_iter().find(|e| e.name == name))
}

/// The index the next entry of `dir` gets: one past the highest in use.
fn next_index(tx: &Txn<'_>, tree: u64, dir: u64) -> Result<u64> {
    let root = tx.root_of(tree)?;
    let c = Cursor::seek_le(tx, &root, &Key::new(dir, DIR_INDEX, u64::MAX))?;
    let last = c.and_then(|c| {
        c.item()
            .filter(|i| i.key.objectid == dir && i.key.ty == DIR_INDEX)
            .map(|i| i.key.offset)
    });
    Ok(last.map_or(2, |l| l + 1))
}

/// Adds `name -> ino` to `dir`; the caller checked it is absent.
pub(crate) fn add(
    tx: &mut Txn<'_>,
    tree: u64,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: u8,
) -> Result<()> {
    let index = next_index(tx, tree, dir)?;
    let entry = DirEntry {
        ino,
        kind,
        index,
        name: name.to_vec(),
    };
    let key = Key::new(dir, DIR_ITEM, name_hash(name));
    let mut entries = match tx.get(tree, &key)? {
        Some(d) => decode(dir, &d)?,
        None => Vec::new(),
    };
    entries.push(entry.clone());
    tx.put(tree, key, DirEntry::encode_all(&entries))?;
    tx.insert(
        tree,
        Key::new(dir, DIR_INDEX, index),
        DirEntry::encode_all(std::slice::from_ref(&entry)),
    )?;
    add_ref(tx, tree, dir, entry)
}

fn ref_key(ino: u64, dir: u64) -> Key {
    Key::new(ino, INODE_REF, dir)
}

/// Records on the child that `dir` names it: `(ino, INODE_REF, dir)` holds
/// its names in `dir` (several for hard links in one directory), in the
/// DIR_ITEM entry layout with the directory in the inode field.
fn add_ref(tx: &mut Txn<'_>, tree: u64, dir: u64, entry: DirEntry) -> Result<()> {
    let key = ref_key(entry.ino, dir);
    let mut refs = match tx.get(tree, &key)? {
        Some(d) => decode(entry.ino, &d)?,
        None => Vec::new(),
    };
    refs.push(DirEntry { ino: dir, ..entry });
    tx.put(tree, key, DirEntry::encode_all(&refs)).map(|_| ())
}

/// Drops the child's back-reference for `name` in `dir`.
fn remove_ref(tx: &mut Txn<'_>, tree: u64, dir: u64, ino: u64, name: &[u8]) -> Result<()> {
    let key = ref_key(ino, dir);
    let data = tx
        .get(tree, &key)?
        .ok_or_else(|| Error::corrupt(ino, "directory entry without back-reference"))?;
    let mut refs = decode(ino, &data)?;
    refs.retain(|r| r.name != name);
    if refs.is_empty() {
        tx.delete(tree, &key).map(|_| ())
    } else {
        tx.put(tree, key, DirEntry::encode_all(&refs)).map(|_| ())
    }
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
    c.item()
        .filter(|i| i.key.objectid == dir && i.key.ty == INODE_REF)
        .map(|i| i.key.offset)
        .ok_or_else(|| Error::corrupt(dir, "directory without a parent reference"))
}

/// Removes the entry `name` from `dir` and returns it.
pub(crate) fn remove(tx: &mut Txn<'_>, tree: u64, dir: u64, name: &[u8]) -> Result<DirEntry> {
    let key = Key::new(dir, DIR_ITEM, name_hash(name));
    let data = tx.get(tree, &key)?.ok_or(Error::NotFound)?;
    let mut entries = decode(dir, &data)?;
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
    remove_ref(tx, tree, dir, gone.ino, name)?;
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
/// the last entry returned; 0 at the start), at most `max`.
pub(crate) fn list<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    dir: u64,
    offset: u64,
    max: usize,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, &Key::new(dir, DIR_INDEX, offset))?;
    while out.len() < max {
        let Some(it) = c.item() else { break };
        if it.key.objectid != dir || it.key.ty != DIR_INDEX {
            break;
        }
        out.extend(decode(dir, &it.data)?);
        c.next(b)?;
    }
    Ok(out)
}
