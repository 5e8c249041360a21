//! `canopy check --repair`: mend the damage a crash or a bug leaves in
//! counters the rest of the image determines, on an unmounted image.
//!
//! What it mends ([`super::Fix`]):
//! - block group usage, the superblock's byte count and the free-space
//!   trees, counted again from the extent tree and the drop queue (a
//!   filesystem whose counters disagree with its extents does not even
//!   mount: the allocator could hand out live space);
//! - inode link counts, set to the names found, and `nbytes`, set to
//!   what the inode's file extent items account for;
//! - directory entries listed by name but missing from the index by
//!   position (a listing would not show them): their index items, back;
//! - inodes no name reaches and no orphan item marks (leaked by a crash
//!   between an unlink and its orphan item, or a bug): an orphan item, so
//!   that the next writable mount deletes them as their last unlink would
//!   have (nothing a path reaches changes);
//! - a data extent's reference count and back-references, set to the
//!   leaves whose file extent items point at it (applied before the
//!   other fixes, whose copy-on-write moves such back-references);
//! - a data extent no file extent item points at (leaked): its items in
//!   the extent and checksum trees go and its space is freed;
//! - a tree block's reference count and back-references, set to the
//!   nodes and root items that point at it (with the data extents' ones,
//!   in the first transaction, before anything is folded: the fold of
//!   the other fixes' copy-on-write must meet counts that are right).
//!
//! - a tree block nothing points at: its extent item and back-references
//!   go and its space is freed (what it points at is counted without it);
//! - a data extent file extent items point at without an extent item:
//!   the item comes back with their count and back-references, its space
//!   taken out of the free space before anything else is written.
//!
//! Everything else (a tree block pointed at twice by one node, a tree
//! block without an item, entries missing
//! by name or listed differently by name and by position, damaged
//! blocks) it refuses, and then it changes nothing: it
//! first runs every pass of the check, the ones that read through the
//! engine too (opened with the recounted space when the image's own
//! disagrees), and repairs only if every problem found has a fix. The
//! fixes are one transaction and one commit, so a crash during a repair
//! leaves the image as it was or repaired. A pending fsync log is
//! refused as well: its blocks are in use without being in the extent
//! tree, so the recount would hand them out.

use super::{Fix, Report};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::inode::InodeItem;
use crate::format::items::{encode_ref_count, ExtentItem, EXTENT_FLAG_DATA};
use crate::format::key_type::{
    DIR_INDEX, EXTENT_CSUM, EXTENT_ITEM, INODE_ITEM, SHARED_BLOCK_REF, SHARED_DATA_REF,
    TREE_BLOCK_REF,
};
use crate::format::tree_id::{CSUM, EXTENT};
use crate::format::{Key, CSUM_OBJECTID};
use std::sync::Arc;

/// What a repair did.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing to repair.
    Clean(Report),
    /// Nothing changed: `why`, with the check's report.
    Refused { report: Report, why: String },
    /// Each change made, and the check after them.
    Repaired { changes: Vec<String>, after: Report },
}

/// Checks the filesystem on `devs` (opened to write, unmounted) and
/// repairs it if it can (see the module's doc).
pub fn repair(devs: Vec<Arc<dyn Device>>, progress: &dyn Fn(u64, u64)) -> Result<Outcome> {
    repair_within(devs, progress, super::DEFAULT_MEMORY)
}

/// [`repair`] with the check's records held within about `memory` bytes
/// ([`super::check_all_devices_within`]).
pub fn repair_within(
    devs: Vec<Arc<dyn Device>>,
    progress: &dyn Fn(u64, u64),
    memory: u64,
) -> Result<Outcome> {
    let borrowed: Vec<&dyn Device> = devs.iter().map(|d| d.as_ref()).collect();
    let mut report = super::check_devices_within(&borrowed, progress, memory)?;
    if let Some(why) = unrepairable(&report) {
        return Ok(Outcome::Refused { report, why });
    }
    let space = report.space_plan.clone();
    super::engine_passes(devs.clone(), space.as_ref(), memory, &mut report);
    if let Some(why) = unrepairable(&report) {
        return Ok(Outcome::Refused { report, why });
    }
    if report.is_clean() {
        return Ok(Outcome::Clean(report));
    }
    if report.log.is_some() {
        let why = "a crash left an fsync log: mount once so that it replays (or drop it with \
                   `canopy rescue zero-log`, losing what was fsynced after the last commit), \
                   then repair"
            .to_string();
        return Ok(Outcome::Refused { report, why });
    }
    let opts = crate::OpenOptions {
        space: space.clone(),
        replay_log: false,
        ..Default::default()
    };
    let engine = crate::Engine::open_devices(devs.clone(), &opts)?;
    let mut changes = Vec::new();
    for p in &report.problems {
        changes.push(format!("{}: {} (repaired)", p.location, p.message));
    }
    // Reference counts first, all in the first transaction, before
    // anything is folded: every other change copies blocks on write,
    // which changes the references of those blocks and of what they
    // point at, and the fold must meet counts that are right. Leaked
    // extents last, after the free-space trees are written again: that
    // rewrite takes the allocator's free ranges, which a freed extent
    // joins only at the commit.
    let (refs, rest): (Vec<_>, Vec<_>) = report.problems.iter().partition(|p| {
        matches!(
            p.fix,
            Some(Fix::ExtentRefs { .. } | Fix::BlockRefs { .. } | Fix::MissingData { .. })
        )
    });
    let (leaks, rest): (Vec<_>, Vec<_>) = rest.into_iter().partition(|p| {
        matches!(
            p.fix,
            Some(Fix::LeakedData { .. } | Fix::LeakedBlock { .. })
        )
    });
    // Missing extent items first: their space must leave the free space
    // before any other fix's copy-on-write allocates.
    let mut fixes: Vec<&Fix> = refs.iter().filter_map(|p| p.fix.as_ref()).collect();
    fixes.sort_by_key(|f| !matches!(f, Fix::MissingData { .. }));
    changes.extend(engine.write(|tx| {
        fixes
            .iter()
            .map(|&fix| set_references(tx, fix))
            .collect::<Result<Vec<String>>>()
    })?);
    for p in rest {
        if let Some(change) = apply(&engine, p.fix.as_ref())? {
            changes.push(change);
        }
    }
    if space.is_some() {
        let ranges = engine.rewrite_free_space()?;
        changes.push(format!(
            "block group usage and free space counted again from the extent tree: {} bytes used, {ranges} free ranges",
            engine.space().0
        ));
    }
    for p in leaks {
        if let Some(change) = apply(&engine, p.fix.as_ref())? {
            changes.push(change);
        }
    }
    engine.commit()?;
    drop(engine);
    let after = super::check_all_devices_within(devs, progress, memory)?;
    Ok(Outcome::Repaired { changes, after })
}

/// Why the report cannot be repaired: the first problem without a fix.
fn unrepairable(report: &Report) -> Option<String> {
    let p = report.problems.iter().find(|p| p.fix.is_none())?;
    let others = report.problems.iter().filter(|p| p.fix.is_none()).count() - 1;
    Some(format!(
        "{}: {} is damage --repair does not mend{}",
        p.location,
        p.message,
        match others {
            0 => String::new(),
            n => format!(" ({n} more such problems)"),
        }
    ))
}

/// Applies one inode fix; says what changed (None for the space fix,
/// made once for all).
fn apply(engine: &crate::Engine, fix: Option<&Fix>) -> Result<Option<String>> {
    Ok(Some(match fix.ok_or(Error::NotFound)? {
        Fix::Space | Fix::Counted => return Ok(None),
        Fix::DirIndex { tree, dir, entry } => {
            let (tree, dir) = (*tree, *dir);
            let key = Key::new(dir, DIR_INDEX, entry.index);
            let item = crate::format::inode::DirEntry::encode_all(std::slice::from_ref(entry));
            engine.write(|tx| tx.insert(tree, key, item))?;
            format!(
                "tree {tree} directory {dir}: index {} of '{}' put back",
                entry.index,
                String::from_utf8_lossy(&entry.name)
            )
        }
        &Fix::LinkCount { tree, ino, nlink } => {
            let old = edit_inode(engine, tree, ino, |i| {
                std::mem::replace(&mut i.nlink, nlink)
            })?;
            format!("tree {tree} inode {ino}: link count {old} set to {nlink}")
        }
        &Fix::Nbytes { tree, ino, nbytes } => {
            let old = edit_inode(engine, tree, ino, |i| {
                std::mem::replace(&mut i.nbytes, nbytes)
            })?;
            format!("tree {tree} inode {ino}: nbytes {old} set to {nbytes}")
        }
        Fix::ExtentRefs { .. } | Fix::BlockRefs { .. } | Fix::MissingData { .. } => {
            return Err(Error::Invalid("reference fixes go first, together".into()))
        }
        &Fix::LeakedData { bytenr, len } => {
            engine.write(|tx| free_leaked(tx, bytenr, len, true))?;
            format!("data extent {bytenr}: nothing points at it, its {len} bytes freed")
        }
        &Fix::LeakedBlock { bytenr, len } => {
            engine.write(|tx| free_leaked(tx, bytenr, len, false))?;
            format!("tree block {bytenr}: nothing points at it, freed")
        }
        &Fix::Orphan { tree, ino } => {
            engine.write(|tx| tx.insert(tree, crate::fs::ops::orphan_key(ino), Vec::new()))?;
            format!(
                "tree {tree} inode {ino}: orphan item added (the next writable mount deletes the inode)"
            )
        }
    }))
}

/// Applies a reference fix in `tx`; says what changed.
fn set_references(tx: &mut crate::txn::Txn<'_>, fix: &Fix) -> Result<String> {
    Ok(match fix {
        Fix::ExtentRefs {
            bytenr,
            len,
            holders,
        } => {
            let (bytenr, refs) = (*bytenr, holders.iter().map(|h| u64::from(h.1)).sum::<u64>());
            let old = set_data_refs(tx, (bytenr, *len), holders)?;
            format!(
                "data extent {bytenr}: {old} references set to {refs}, back-references to the {} \
                 leaves that point at it",
                holders.len()
            )
        }
        Fix::MissingData {
            bytenr,
            len,
            holders,
        } => {
            let refs = restore_data_item(tx, (*bytenr, *len), holders)?;
            format!(
                "data extent {bytenr}: its missing extent item put back with {refs} references \
                 from the {} leaves that point at it",
                holders.len()
            )
        }
        Fix::BlockRefs {
            bytenr,
            parents,
            roots,
        } => {
            let old = set_block_refs(tx, *bytenr, parents, roots)?;
            format!(
                "tree block {bytenr}: {old} references set to {}, back-references to {} nodes and \
                 {} tree roots that point at it",
                parents.len() + roots.len(),
                parents.len(),
                roots.len()
            )
        }
        _ => return Err(Error::Invalid("not a reference fix".into())),
    })
}

/// Sets the reference count of the tree block at `bytenr` to its
/// holders' and its back-references to exactly them; returns the old
/// count.
fn set_block_refs(
    tx: &mut crate::txn::Txn<'_>,
    bytenr: u64,
    parents: &[u64],
    roots: &[u64],
) -> Result<u64> {
    let (key, mut item) = crate::extent::apply::find_extent_item(tx, &tx.root_of(EXTENT)?, bytenr)?
        .ok_or(Error::NotFound)?;
    let old = item.refs;
    item.refs = (parents.len() + roots.len()) as u64;
    tx.update(EXTENT, key, item.encode())?;
    delete_back_references(tx, bytenr)?;
    for &p in parents {
        tx.insert(EXTENT, Key::new(bytenr, SHARED_BLOCK_REF, p), Vec::new())?;
    }
    for &t in roots {
        tx.insert(EXTENT, Key::new(bytenr, TREE_BLOCK_REF, t), Vec::new())?;
    }
    Ok(old)
}

/// Deletes every back-reference item of the extent at `bytenr`.
fn delete_back_references(tx: &mut crate::txn::Txn<'_>, bytenr: u64) -> Result<()> {
    let end = Key::new(bytenr, u8::MAX, u64::MAX);
    for (k, _) in tx.range(EXTENT, &Key::new(bytenr, EXTENT_ITEM + 1, 0), &end)? {
        if k.objectid == bytenr && k.ty != EXTENT_ITEM {
            tx.delete(EXTENT, &k)?;
        }
    }
    Ok(())
}

/// Sets the reference count of the data extent `(bytenr, len)` to the
/// holders' and its back-references to exactly them; returns the old
/// count.
fn set_data_refs(
    tx: &mut crate::txn::Txn<'_>,
    (bytenr, len): (u64, u64),
    holders: &[(u64, u32)],
) -> Result<u64> {
    let key = Key::new(bytenr, EXTENT_ITEM, len);
    let data = tx.get(EXTENT, &key)?.ok_or(Error::NotFound)?;
    let mut item = ExtentItem::decode(&data).map_err(|e| Error::corrupt(bytenr, e))?;
    let old = item.refs;
    item.refs = holders.iter().map(|h| u64::from(h.1)).sum();
    tx.update(EXTENT, key, item.encode())?;
    delete_back_references(tx, bytenr)?;
    for &(leaf, count) in holders {
        let k = Key::new(bytenr, SHARED_DATA_REF, leaf);
        tx.insert(EXTENT, k, encode_ref_count(count))?;
    }
    Ok(old)
}

/// Puts back the extent item of the data extent `(bytenr, len)` that
/// `holders` point at, with their back-references, after taking its
/// space out of the free space (the space recount counts it from then
/// on); returns its reference count.
fn restore_data_item(
    tx: &mut crate::txn::Txn<'_>,
    (bytenr, len): (u64, u64),
    holders: &[(u64, u32)],
) -> Result<u64> {
    let free = tx
        .allocator()
        .group_containing(bytenr)
        .ok_or_else(|| Error::corrupt(bytenr, "a data extent outside every block group"))?
        .free
        .contains(bytenr, len);
    if free {
        tx.allocator().alloc_exact(bytenr, len)?;
    }
    let refs = holders.iter().map(|h| u64::from(h.1)).sum();
    let item = ExtentItem {
        refs,
        generation: tx.transid(),
        flags: EXTENT_FLAG_DATA,
        owner: 0,
        level: 0,
    };
    tx.insert(EXTENT, Key::new(bytenr, EXTENT_ITEM, len), item.encode())?;
    for &(leaf, count) in holders {
        let k = Key::new(bytenr, SHARED_DATA_REF, leaf);
        tx.insert(EXTENT, k, encode_ref_count(count))?;
    }
    Ok(refs)
}

/// Frees the extent `(bytenr, len)` nothing points at: its extent item
/// and back-references go from the extent tree, a data extent's
/// checksums from the checksum tree, and its space goes back (at the
/// commit, as any freed extent's).
fn free_leaked(tx: &mut crate::txn::Txn<'_>, bytenr: u64, len: u64, data: bool) -> Result<()> {
    let end = Key::new(bytenr, u8::MAX, u64::MAX);
    for (k, _) in tx.range(EXTENT, &Key::new(bytenr, 0, 0), &end)? {
        if k.objectid == bytenr {
            tx.delete(EXTENT, &k)?;
        }
    }
    if data {
        let sums = Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr);
        match tx.delete(CSUM, &sums) {
            Ok(_) | Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    tx.free_extent(bytenr, len, false)
}

/// Changes inode `ino` of tree `tree` with `f`; returns what `f` does.
fn edit_inode<R>(
    engine: &crate::Engine,
    tree: u64,
    ino: u64,
    f: impl FnOnce(&mut InodeItem) -> R,
) -> Result<R> {
    engine.write(|tx| {
        let key = Key::new(ino, INODE_ITEM, 0);
        let data = tx.get(tree, &key)?.ok_or(Error::NotFound)?;
        let mut item = InodeItem::decode(&data).map_err(|e| Error::corrupt(ino, e))?;
        let r = f(&mut item);
        tx.update(tree, key, item.encode())?;
        Ok(r)
    })
}
