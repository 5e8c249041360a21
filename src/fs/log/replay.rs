//! Replaying a log found at open, before anything else uses the
//! filesystem (the parent module describes what the log holds).
//!
//! In four passes, inside one transaction that is then committed:
//! 1. inode items, xattrs and data of inodes logged in full; inode items
//!    of inodes logged for their names that the last commit lacks;
//! 2. names: every logged inode gets exactly its logged names (a name the
//!    last commit gave another inode is taken from it);
//! 3. inodes logged as gone lose their names;
//! 4. link counts of every inode touched are recounted from its names;
//!    a file left with none is deleted, as an unlinked file is.
//!
//! Bytes an fsync logged rather than flushed (`LOG_DATA`) are not written
//! here: replay hands them back, and the fs layer puts them in their
//! files' buffers before anything else runs, so the commit that ends the
//! replay writes them to extents (and a read-only mount reads them from
//! memory).

use super::{name_set, MODE_FULL, MODE_GONE, MODE_NAMES};
use crate::error::{Error, Result};
use crate::format::inode::{DirEntry, InodeItem, ROOT_DIR_INO};
use crate::format::items::FileExtentItem;
use crate::format::key_type::{
    EXTENT_CSUM, EXTENT_DATA, INODE_EXTREF, INODE_ITEM, INODE_REF, LOG_DATA, LOG_INODE, LOG_RANGE,
    XATTR_ITEM,
};
use crate::format::tree_id::{CSUM, LOG};
use crate::format::{Key, CSUM_OBJECTID};
use crate::fs::{checked, dir, file, inode_key, is_dir, load_inode_tx, store_inode};
use crate::txn::Txn;
use crate::Engine;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// What the log holds for one inode.
#[derive(Default)]
struct Logged {
    mode: Option<u8>,
    inode: Option<InodeItem>,
    refs: Vec<DirEntry>,
    xattrs: Vec<(Key, Vec<u8>)>,
    ranges: Vec<(u64, u64)>,
    extents: Vec<(Key, FileExtentItem)>,
    /// Logged bytes: (file offset, bytes).
    bytes: Vec<(u64, Vec<u8>)>,
}

/// Bytes of a file the log held (`LOG_DATA`), cut to its logged size:
/// the caller buffers them in the file once the replay's transaction
/// has run, and the commit that follows writes them.
pub(crate) struct LoggedBytes {
    pub tree: u64,
    pub ino: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// Replays the log the engine found at open, if any, and commits unless
/// it held file bytes, which it returns: those need the fs layer's
/// buffers, and the caller commits once they are there (no commit may
/// come between, or the log would be gone with the bytes still in it).
/// The log's inode numbers are node ids: each names its subvolume.
pub(crate) fn replay(engine: &Engine) -> Result<Vec<LoggedBytes>> {
    if !engine.has_pending_log() {
        return Ok(Vec::new());
    }
    let bytes = engine.replay_write(|tx| {
        let (logged, csums) = read_log(tx)?;
        let count = logged.len();
        let mut by_tree: BTreeMap<u64, BTreeMap<u64, Logged>> = BTreeMap::new();
        let mut bytes = Vec::new();
        for (node, mut l) in logged {
            let (tree, ino) = crate::fs::split_node(node);
            take_bytes(tree, ino, &mut l, &mut bytes);
            // Items go back under the inode's own number in its tree.
            for (k, _) in &mut l.xattrs {
                k.objectid = ino;
            }
            for (k, _) in &mut l.extents {
                k.objectid = ino;
            }
            by_tree.entry(tree).or_default().insert(ino, l);
        }
        for (tree, logged) in by_tree {
            if !tx.tree_exists(tree) {
                tracing::error!(tree, "the log names a subvolume that does not exist");
                continue;
            }
            apply(tx, tree, logged, &csums)?;
        }
        tx.finish_replay();
        tracing::info!(
            inodes = count,
            byte_ranges = bytes.len(),
            "replayed the log tree"
        );
        Ok(bytes)
    })?;
    if bytes.is_empty() && !engine.is_read_only() {
        engine.commit()?;
    }
    Ok(bytes)
}

/// Moves the logged bytes of `l` (an inode of subvolume `tree`) to `out`,
/// cut to the logged inode's size: a truncate after the bytes were
/// buffered leaves them past the end until the next fsync drops them.
fn take_bytes(tree: u64, ino: u64, l: &mut Logged, out: &mut Vec<LoggedBytes>) {
    let size = l.inode.as_ref().map_or(0, |i| i.size);
    for (offset, mut bytes) in std::mem::take(&mut l.bytes) {
        let keep = size.saturating_sub(offset).min(bytes.len() as u64) as usize;
        if keep == 0 {
            continue;
        }
        bytes.truncate(keep);
        out.push(LoggedBytes {
            tree,
            ino,
            offset,
            bytes,
        });
    }
}

/// The log's checksum items: data extent address → its sector sums.
type Csums = HashMap<u64, Vec<u8>>;

fn bad(key: &Key, reason: impl Into<String>) -> Error {
    key.bad(reason)
}

/// Every item of the log, checked and grouped by inode. An inode whose
/// items the examination at open refused, or that this layer cannot
/// read (an item of a kind the log does not hold, no mode or inode item),
/// is left out with an ERROR line: it keeps the last commit's state, and
/// the rest of the log replays.
fn read_log(tx: &mut Txn<'_>) -> Result<(BTreeMap<u64, Logged>, Csums)> {
    let refused = tx.refused_log_inodes();
    let mut by_ino: BTreeMap<u64, Logged> = BTreeMap::new();
    let mut unreadable: BTreeMap<u64, Error> = BTreeMap::new();
    let mut csums = HashMap::new();
    for (k, d) in tx.range(LOG, &Key::MIN, &Key::MAX)? {
        if refused.contains(&k.objectid) || unreadable.contains_key(&k.objectid) {
            continue;
        }
        let d = checked(tx, &k, &d)?;
        if k.objectid == CSUM_OBJECTID && k.ty == EXTENT_CSUM {
            csums.insert(k.offset, d.to_vec());
            continue;
        }
        let l = by_ino.entry(k.objectid).or_default();
        if let Err(e) = add_item(l, &k, d) {
            unreadable.insert(k.objectid, e);
        }
    }
    let new_extents = tx.new_log_extents();
    for (&node, l) in &by_ino {
        if unreadable.contains_key(&node) {
            continue;
        }
        if let Err(why) = is_complete(node, l) {
            unreadable.insert(node, bad(&Key::new(node, LOG_INODE, 0), why));
        } else if let Some(k) = unsummed_extent(l, &new_extents, &csums) {
            let why = "logged data written after the last commit without its checksums";
            unreadable.insert(node, bad(&k, why));
        }
    }
    for (node, e) in unreadable {
        tracing::error!(node, "replay leaves out an inode of the fsync log: {e}");
        tx.note_replay_refusal(node, e.to_string());
        by_ino.remove(&node);
    }
    Ok((by_ino, csums))
}

/// Adds one log item to its inode's record.
fn add_item(l: &mut Logged, k: &Key, d: &[u8]) -> Result<()> {
    match k.ty {
        LOG_INODE => l.mode = d.first().copied(),
        INODE_ITEM => l.inode = Some(InodeItem::decode(d).map_err(|e| bad(k, e))?),
        INODE_REF | INODE_EXTREF => l
            .refs
            .extend(DirEntry::decode_all(d).map_err(|e| bad(k, e))?),
        XATTR_ITEM => l.xattrs.push((*k, d.to_vec())),
        LOG_RANGE => {
            let end = d.try_into().map(u64::from_le_bytes).unwrap_or(k.offset);
            l.ranges.push((k.offset, end));
        }
        EXTENT_DATA => {
            let fe = FileExtentItem::decode(d).map_err(|e| bad(k, e))?;
            l.extents.push((*k, fe));
        }
        LOG_DATA => l.bytes.push((k.offset, d.to_vec())),
        _ => return Err(bad(k, "item of a kind the log does not hold")),
    }
    Ok(())
}

/// A logged extent item of `l` whose data was written after the last
/// commit (`new`) and whose checksums the log lacks: replayed, every read
/// of it would fail. (Preallocated space has none and needs none.)
fn unsummed_extent(l: &Logged, new: &HashSet<(u64, u64)>, csums: &Csums) -> Option<Key> {
    // A `chattr +C` file keeps none.
    if l.inode
        .as_ref()
        .is_some_and(|i| !crate::fs::file::keeps_sums(i.flags))
    {
        return None;
    }
    l.extents
        .iter()
        .filter(|(_, fe)| fe.kind == crate::format::items::FILE_EXTENT_REG)
        .find(|(_, fe)| {
            fe.disk_extent()
                .is_some_and(|e| new.contains(&e) && !csums.contains_key(&e.0))
        })
        .map(|(k, _)| *k)
}

/// Whether the log holds all replay needs of an inode (`node`, a node
/// id): its mode, its inode item, and a name for an inode that says it
/// has links (replay gives a logged inode exactly its logged names, so
/// one logged without them would lose every name: a file deleted, a
/// directory left with entries and no name); a directory has one name
/// at most; every name carries the inode's file type (the directory
/// entry replay writes takes it, and link counts follow it).
fn is_complete(node: u64, l: &Logged) -> std::result::Result<(), &'static str> {
    let full_file = l.mode == Some(MODE_FULL)
        && l.inode
            .as_ref()
            .is_some_and(|i| i.mode & libc::S_IFMT == libc::S_IFREG);
    if !l.bytes.is_empty() && !full_file {
        return Err("logged bytes of an inode not logged in full as a regular file");
    }
    let item = match (l.mode, &l.inode) {
        (Some(MODE_GONE), _) => return Ok(()),
        (Some(MODE_FULL | MODE_NAMES), Some(item)) => item,
        _ => return Err("logged inode without its mode or inode item"),
    };

    let (_, ino) = crate::fs::split_node(node);
    if ino != ROOT_DIR_INO && item.nlink > 0 && l.refs.is_empty() {
        return Err("logged inode with links but no names");
    }
    if is_dir(item.mode) && l.refs.len() > 1 {
        return Err("logged directory with more than one name");
    }
    if l.refs.iter().any(|r| r.kind != crate::fs::dtype(item.mode)) {
        return Err("logged name whose file type is not the inode's");
    }
    Ok(())
}

fn apply(tx: &mut Txn<'_>, tree: u64, logged: BTreeMap<u64, Logged>, csums: &Csums) -> Result<()> {
    for (&ino, l) in &logged {
        restore_inode(tx, tree, ino, l, csums)?;
    }
    let mut touched = BTreeSet::new();
    for (&ino, l) in &logged {
        if l.mode != Some(MODE_GONE) && ino != ROOT_DIR_INO {
            restore_names(tx, tree, ino, &l.refs, &mut touched)?;
        }
    }
    for (&ino, l) in &logged {
        if l.mode == Some(MODE_GONE) && ino != ROOT_DIR_INO {
            restore_names(tx, tree, ino, &[], &mut touched)?;
        }
    }
    for ino in touched {
        recount_links(tx, tree, ino)?;
    }
    Ok(())
}

/// Pass 1 for one inode.
fn restore_inode(tx: &mut Txn<'_>, tree: u64, ino: u64, l: &Logged, csums: &Csums) -> Result<()> {
    let Some(item) = l.inode.clone() else {
        return Ok(());
    };
    let exists = tx.get(tree, &inode_key(ino))?.is_some();
    match l.mode {
        Some(MODE_FULL) => {}
        Some(MODE_NAMES) if !exists => {
            // Created in the lost transaction; its data was not logged.
            let mut item = item;
            if item.mode & libc::S_IFMT == libc::S_IFREG {
                item.size = 0;
                item.nbytes = 0;
            }
            return store_inode(tx, tree, ino, item);
        }
        _ => return Ok(()),
    }
    store_inode(tx, tree, ino, item)?;
    let (s, e) = (
        Key::new(ino, XATTR_ITEM, 0),
        Key::new(ino, XATTR_ITEM + 1, 0),
    );
    for (k, _) in tx.range(tree, &s, &e)? {
        tx.delete(tree, &k)?;
    }
    for (k, d) in &l.xattrs {
        tx.put(tree, *k, d.clone())?;
    }
    for &(s, e) in &l.ranges {
        file::punch(tx, tree, ino, s, e)?;
    }
    for (k, fe) in &l.extents {
        if fe.compression != crate::format::items::COMPRESS_NONE {
            file::set_compressed_features(tx, fe);
        }
        if let Some((bytenr, len)) = fe.disk_extent() {
            if tx.claim_logged_extent(bytenr, len)? {
                restore_sums(tx, bytenr, csums.get(&bytenr))?;
            }
        }
        tx.put(tree, *k, fe.encode())?;
    }
    Ok(())
}

/// Gives an extent the replay claimed the checksums the log holds for
/// it. Only claimed extents get them: a checksum item the log kept for an
/// extent freed later in its transaction would otherwise be left behind
/// in the checksum tree, and a later extent at that address, logged by a
/// later run, would be checked against it. For the same reason an item
/// already at this address is replaced, not kept.
fn restore_sums(tx: &mut Txn<'_>, bytenr: u64, sums: Option<&Vec<u8>>) -> Result<()> {
    let key = Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr);
    match sums {
        Some(s) => tx.put(CSUM, key, s.clone()).map(drop),
        None => match tx.delete(CSUM, &key) {
            Ok(_) | Err(Error::NotFound) => Ok(()),
            Err(e) => Err(e),
        },
    }
}

/// Gives `ino` exactly the names `want`: (parent, name) pairs.
fn restore_names(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    want: &[DirEntry],
    touched: &mut BTreeSet<u64>,
) -> Result<()> {
    if tx.get(tree, &inode_key(ino))?.is_none() {
        return Ok(());
    }
    touched.insert(ino);
    let root = tx.root_of(tree)?;
    let have = dir::refs_of(tx, &root, ino)?;
    let wanted = name_set(want);
    for e in &have {
        if !wanted.contains(&(e.ino, e.name.clone())) {
            dir::remove(tx, tree, e.ino, &e.name)?;
            touched.insert(e.ino);
        }
    }
    let had = name_set(&have);
    for e in want {
        if had.contains(&(e.ino, e.name.clone())) {
            continue;
        }
        let parent = e.ino;
        match load_inode_tx(tx, tree, parent) {
            Ok(p) if is_dir(p.mode) => {}
            _ => {
                tracing::error!(
                    ino,
                    parent,
                    "logged name in a directory that does not exist"
                );
                let why = format!("logged name in directory {parent}, which does not exist");
                tx.note_replay_refusal(crate::fs::node_id(tree, ino), why);
                continue;
            }
        }
        let root = tx.root_of(tree)?;
        if let Some(other) = dir::lookup(tx, &root, parent, &e.name)? {
            if other.is_subvolume() {
                // Subvolume links change only in commits: the log cannot
                // have seen this name free.
                tracing::error!(ino, parent, "logged name held by a subvolume");
                let why = format!("logged name in directory {parent} held by a subvolume");
                tx.note_replay_refusal(crate::fs::node_id(tree, ino), why);
                continue;
            }
            dir::remove(tx, tree, parent, &e.name)?;
            touched.insert(other.ino);
        }
        dir::add_at(tx, tree, parent, &e.name, ino, e.kind, e.index)?;
        touched.insert(parent);
    }
    Ok(())
}

/// Gives directory `ino` back a name the last commit gave it, where that
/// name is free and its directory still is one; the directory it is
/// named in, if it got one.
fn restore_committed_name(tx: &mut Txn<'_>, tree: u64, ino: u64) -> Result<Option<u64>> {
    let Some(committed) = tx.committed_root(tree) else {
        return Ok(None);
    };
    for e in dir::refs_of(tx, &committed, ino)? {
        let parent_is_dir = matches!(load_inode_tx(tx, tree, e.ino), Ok(p) if is_dir(p.mode));
        let root = tx.root_of(tree)?;
        if e.ino == ino || !parent_is_dir || dir::lookup(tx, &root, e.ino, &e.name)?.is_some() {
            continue;
        }
        let kind = crate::fs::dtype(libc::S_IFDIR);
        dir::add_at(tx, tree, e.ino, &e.name, ino, kind, e.index)?;
        return Ok(Some(e.ino));
    }
    Ok(None)
}

/// Pass 4: a file's link count is its number of names, and with none it
/// goes; a directory's is 2 plus its subdirectories.
fn recount_links(tx: &mut Txn<'_>, tree: u64, ino: u64) -> Result<()> {
    let mut inode = match load_inode_tx(tx, tree, ino) {
        Err(Error::NotFound) => return Ok(()),
        r => r?,
    };
    let root = tx.root_of(tree)?;
    let names = dir::refs_of(tx, &root, ino)?.len();
    let nameless = names == 0 && ino != ROOT_DIR_INO;
    if nameless && is_dir(inode.mode) && !dir::is_empty(tx, &root, ino)? {
        // Committing this would leak the directory and all below it: it
        // gets back the name the last commit gave it.
        let Some(parent) = restore_committed_name(tx, tree, ino)? else {
            // No such name is free: the replay fails, nothing of it
            // reaches the disk, and the log stays for `nologreplay`,
            // `canopy check` or `rescue zero-log`.
            return Err(Error::corrupt(
                ino,
                "log replay would leave a directory with entries and no name",
            ));
        };
        tracing::error!(ino, "log replay keeps a directory's committed name");
        let why = "its logged names would leave a directory with entries and no name; \
                   it keeps its committed name"
            .to_string();
        tx.note_replay_refusal(crate::fs::node_id(tree, ino), why);
        recount_links(tx, tree, parent)?;
        return recount_links(tx, tree, ino);
    }
    // Named again, or deleted now: either way no longer an orphan.
    let orphan = crate::fs::ops::orphan_key(ino);
    if tx.get(tree, &orphan)?.is_some() {
        tx.delete(tree, &orphan)?;
    }
    if nameless {
        return crate::fs::ops::delete_inode(tx, tree, ino);
    }
    let nlink = if is_dir(inode.mode) {
        let subdirs = dir::list(tx, &root, ino, (0, u64::MAX), usize::MAX)?
            .iter()
            .filter(|e| e.d_type() == crate::fs::dtype(libc::S_IFDIR))
            .count();
        2 + subdirs as u32
    } else {
        names as u32
    };
    if inode.nlink != nlink {
        inode.nlink = nlink;
        store_inode(tx, tree, ino, inode)?;
    }
    Ok(())
}
