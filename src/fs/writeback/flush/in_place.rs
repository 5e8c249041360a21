//! Where the flush of a `chattr +C` file writes (btrfs's nodatacow).
//!
//! Such a file keeps no checksums, so bytes it overwrites may be
//! overwritten where they lie: no new extent, no item changes, no
//! fragmentation of a database or disk image rewritten in place. That is
//! safe only for data no one else can see. An extent is written in place
//! when the file holds it alone both now and in the last commit: every
//! reference to it is one of the file's own items over the extent's span
//! in the file, and it lies under no tree but the file's subvolume (a
//! snapshot or reflink made or deleted since the last commit counts, since a
//! crash brings the last commit back). Anything else (holes, inline or
//! compressed data, shared extents) gets new extents, as for any file.
//! Preallocated space the file holds alone is written in place too, and
//! its items become regular ones.
//!
//! Until the data is written, relocation, snapshots and reflinks wait
//! for it (`Txn::write_in_place`): they would otherwise copy or share
//! bytes about to change.

use super::*;
use crate::balance::relocate::Climb;
use crate::format::items::{FileExtentItem, FILE_EXTENT_PREALLOC, FILE_EXTENT_REG};
use crate::format::tree_id::EXTENT;
use crate::tree::RootPtr;
use crate::txn::RefHolder;
use std::collections::HashMap;

/// Where one part of a flush goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// New extents, allocated for it.
    New,
    /// Over data the file holds alone, at this device address inside the
    /// data extent at `extent`: its items stay as they are.
    Over { extent: u64, bytenr: u64 },
    /// Into preallocated space the file holds alone: its items become
    /// regular ones.
    Prealloc { extent: u64, bytenr: u64 },
}

impl Place {
    /// The data extent and device address a part written in place goes
    /// to (None for new extents).
    pub(super) fn target(self) -> Option<(u64, u64)> {
        match self {
            Place::New => None,
            Place::Over { extent, bytenr } | Place::Prealloc { extent, bytenr } => {
                Some((extent, bytenr))
            }
        }
    }
}

/// What one flush learned about which extents the file holds alone.
#[derive(Default)]
pub(super) struct Alone {
    climb: Climb,
    known: HashMap<u64, bool>,
}

/// The parts of the sector-aligned span `[first, last)` of `ino` (a
/// `chattr +C` file of tree `tree`), in order, each with where it goes.
pub(super) fn places(
    tx: &Txn<'_>,
    (tree, ino): (u64, u64),
    (first, last): (u64, u64),
    alone: &mut Alone,
) -> Result<Vec<(u64, u64, Place)>> {
    let root = tx.root_of(tree)?;
    let mut out: Vec<(u64, u64, Place)> = Vec::new();
    let mut push = |from: u64, to: u64, place: Place| match out.last_mut() {
        Some((_, end, Place::New)) if place == Place::New && *end == from => *end = to,
        _ => out.push((from, to, place)),
    };
    let mut pos = first;
    for (k, fe) in file::items_in(tx, &root, ino, first, last)? {
        let from = k.max(first);
        let to = (k + file::item_len(&fe)).min(last);
        if from >= to {
            continue;
        }
        if from > pos {
            push(pos, from, Place::New);
        }
        let place = match writable_kind(&fe) && held_alone(tx, alone, (tree, ino), k, &fe)? {
            true => {
                let extent = fe.disk_bytenr;
                let bytenr = extent + fe.offset + (from - k);
                match fe.kind {
                    FILE_EXTENT_PREALLOC => Place::Prealloc { extent, bytenr },
                    _ => Place::Over { extent, bytenr },
                }
            }
            false => Place::New,
        };
        push(from, to, place);
        pos = to;
    }
    if pos < last {
        push(pos, last, Place::New);
    }
    Ok(out)
}

/// Whether `fe` names bytes on the device as they are (not inline, not
/// compressed, not a hole).
fn writable_kind(fe: &FileExtentItem) -> bool {
    (fe.kind == FILE_EXTENT_REG || fe.kind == FILE_EXTENT_PREALLOC)
        && fe.disk_bytenr != 0
        && !file::is_compressed(fe)
}

/// Whether the file holds the extent `fe` names (the item at `k`) alone,
/// now and in the last commit.
fn held_alone(
    tx: &Txn<'_>,
    alone: &mut Alone,
    (tree, ino): (u64, u64),
    k: u64,
    fe: &FileExtentItem,
) -> Result<bool> {
    if let Some(&known) = alone.known.get(&fe.disk_bytenr) {
        return Ok(known);
    }
    // Where the extent's first byte lies in the file: the file's own
    // items over it are laid out from there.
    let answer = match k.checked_sub(fe.offset) {
        Some(base) => {
            alone_now(tx, &mut alone.climb, (tree, ino), base, fe)?
                && alone_committed(tx, (tree, ino), base, fe)?
        }
        None => false,
    };
    alone.known.insert(fe.disk_bytenr, answer);
    Ok(answer)
}

/// In the running transaction: only leaves of `tree` hold the extent,
/// and their references are all the file's items over its span.
fn alone_now(
    tx: &Txn<'_>,
    climb: &mut Climb,
    (tree, ino): (u64, u64),
    base: u64,
    fe: &FileExtentItem,
) -> Result<bool> {
    let holders = climb.holders(tx, fe.disk_bytenr)?;
    let Some(total) = leaf_references(holders) else {
        return Ok(false);
    };
    let roots = climb.roots(tx, fe.disk_bytenr)?;
    if roots.len() != 1 || !roots.contains(&tree) {
        return Ok(false);
    }
    Ok(total == own_refs(tx, &tx.root_of(tree)?, ino, base, fe)?)
}

/// In the last commit: the extent is new since, or it is younger than
/// the subvolume's last snapshot (so no snapshot's leaves hold it) and
/// its references are all the file's items over its span.
fn alone_committed(
    tx: &Txn<'_>,
    (tree, ino): (u64, u64),
    base: u64,
    fe: &FileExtentItem,
) -> Result<bool> {
    let committed = tx.committed_roots();
    let Some(extent_root) = committed.get(&EXTENT).copied() else {
        return Ok(false);
    };
    let found = crate::extent::apply::find_extent_item(tx, &extent_root, fe.disk_bytenr)?;
    let Some((_, item)) = found else {
        // Allocated in this transaction: nothing committed holds it.
        return Ok(true);
    };
    if item.generation <= tx.root_item(tree)?.last_snapshot {
        return Ok(false);
    }
    let Some(tree_root) = committed.get(&tree).copied() else {
        return Ok(false);
    };
    let holders = crate::extent::backrefs(tx, &extent_root, fe.disk_bytenr)?;
    let Some(total) = leaf_references(holders) else {
        return Ok(false);
    };
    Ok(total == own_refs(tx, &tree_root, ino, base, fe)?)
}

/// The references `holders` make, all from leaves' items; None if any
/// holder is not a leaf.
fn leaf_references(holders: impl IntoIterator<Item = (RefHolder, i64)>) -> Option<i64> {
    holders
        .into_iter()
        .try_fold(0, |total, (holder, n)| match holder {
            RefHolder::DataLeaf(_) => Some(total + n),
            _ => None,
        })
}

/// How many items of `ino` in the tree at `root` reference the extent of
/// `fe` over its span in the file, which starts at `base`.
fn own_refs(tx: &Txn<'_>, root: &RootPtr, ino: u64, base: u64, fe: &FileExtentItem) -> Result<i64> {
    let end = base.saturating_add(fe.disk_num_bytes);
    let items = file::items_in(tx, root, ino, base, end)?;
    Ok(items
        .iter()
        .filter(|(_, f)| writable_kind(f) && f.disk_bytenr == fe.disk_bytenr)
        .count() as i64)
}
