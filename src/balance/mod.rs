//! Balance: emptying chosen block groups by moving their extents into
//! other groups, while the filesystem is in use.
//!
//! A balance starts by choosing its groups (data, metadata and system,
//! optionally only those under a usage percentage) and recording them
//! durably in the root tree: `(BALANCE_OBJECTID, BALANCE_ITEM, 0)` holds
//! the arguments and whether it is paused, and one
//! `(BALANCE_OBJECTID, BALANCE_GROUP, start)` item per group still to
//! empty. The chosen groups become read-only in the allocator, so
//! nothing new lands in them.
//!
//! Then [`step`]s, each one short transaction, move a bounded number of
//! extents out of the first group still listed (`relocate`). A shared
//! extent moves once, and every holder in every snapshot is repointed:
//! nothing is unshared, used space does not grow, and quota numbers do
//! not move (relocation changes no ownership, so it traces nothing).
//! Once a group holds no extent its item goes, and the commit gives the
//! empty group back to unallocated space. Groups made after the start
//! (where moved extents go) are never chosen, so a balance ends.
//!
//! Moving extents deletes and reinserts their back-references and
//! checksums all over the extent and checksum trees, which leaves their
//! leaves part-empty; once the groups are empty, [`repack_step`]s pack
//! those trees' leaves again, so a balance never makes used space grow.
//!
//! The items survive unmount and crash: the next mount carries on, as
//! btrfs does. Pausing keeps them (and makes the groups writable again);
//! cancelling removes them.

pub(crate) mod relocate;

use crate::alloc::GroupKind;
use crate::error::{Error, Result};
use crate::format::items::ExtentItem;
use crate::format::key_type::{BALANCE_GROUP, BALANCE_ITEM, EXTENT_ITEM};
use crate::format::tree_id::{CSUM, EXTENT, FS, ROOT};
use crate::format::{Key, BALANCE_OBJECTID};
use crate::tree::Cursor;
use crate::txn::{Need, Reader, Txn};
use serde::{Deserialize, Serialize};

pub use crate::format::balance::{BalanceArgs, Filter};

/// Whether `args` chooses a group of `kind` with `used` of `len` bytes
/// used.
fn wants(args: &BalanceArgs, kind: GroupKind, used: u64, len: u64) -> bool {
    let filter = match kind {
        GroupKind::Data => args.data,
        GroupKind::Metadata | GroupKind::System => args.metadata,
        GroupKind::Mixed => args.data.or(args.metadata),
    };
    match filter {
        Filter::Skip => false,
        Filter::All => true,
        Filter::UsageBelow(pct) => used.saturating_mul(100) < u64::from(pct).saturating_mul(len),
    }
}

fn item_key() -> Key {
    Key::new(BALANCE_OBJECTID, BALANCE_ITEM, 0)
}

fn group_key(start: u64) -> Key {
    Key::new(BALANCE_OBJECTID, BALANCE_GROUP, start)
}

/// A recorded balance: its arguments, whether paused, the groups left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub args: BalanceArgs,
    pub paused: bool,
    pub groups: Vec<u64>,
}

/// The balance recorded in the root tree, if any.
pub fn recorded(r: &Reader<'_>) -> Result<Option<Recorded>> {
    let Some(item) = r.get(ROOT, &item_key())? else {
        return Ok(None);
    };
    let groups = r.range(ROOT, &group_key(0), &group_key(u64::MAX))?;
    decode_recorded(&item, groups).map(Some)
}

fn recorded_tx(tx: &Txn<'_>) -> Result<Option<Recorded>> {
    let Some(item) = tx.get(ROOT, &item_key())? else {
        return Ok(None);
    };
    let groups = tx.range(ROOT, &group_key(0), &group_key(u64::MAX))?;
    decode_recorded(&item, groups).map(Some)
}

/// A balance from its item and its group items.
fn decode_recorded(item: &[u8], groups: Vec<(Key, Vec<u8>)>) -> Result<Recorded> {
    let (args, paused) = BalanceArgs::decode(item).map_err(|e| Error::BadItem {
        key: item_key(),
        reason: e,
    })?;
    Ok(Recorded {
        args,
        paused,
        groups: groups.into_iter().map(|(k, _)| k.offset).collect(),
    })
}

/// Records a new balance and makes its groups read-only. Returns how
/// many groups it will empty; EINPROGRESS if one is recorded already.
pub fn start(tx: &mut Txn<'_>, args: BalanceArgs) -> Result<usize> {
    if recorded_tx(tx)?.is_some() {
        return Err(Error::Posix(
            libc::EINPROGRESS,
            "a balance is already running or paused (resume or cancel it)",
        ));
    }
    let chosen: Vec<u64> = tx
        .allocator()
        .groups()
        .filter(|g| g.used > 0 && wants(&args, g.kind, g.used, g.len))
        .map(|g| g.start)
        .collect();
    tx.reserve(&Need::items(ROOT, 1 + chosen.len() as u64))?;
    tx.insert(ROOT, item_key(), args.encode(false))?;
    for &g in &chosen {
        tx.insert(ROOT, group_key(g), Vec::new())?;
        tx.allocator().set_readonly(g, true);
    }
    Ok(chosen.len())
}

/// Marks a recorded balance paused (or running again) and sets its
/// groups' read-only state to match.
pub fn set_paused(tx: &mut Txn<'_>, paused: bool) -> Result<Recorded> {
    let mut rec = recorded_tx(tx)?.ok_or(Error::Posix(libc::ENOTCONN, "no balance is recorded"))?;
    tx.reserve(&Need::items(ROOT, 1).deleting())?;
    tx.put(ROOT, item_key(), rec.args.encode(paused))?;
    for &g in &rec.groups {
        tx.allocator().set_readonly(g, !paused);
    }
    rec.paused = paused;
    Ok(rec)
}

/// Forgets the recorded balance; its groups take new extents again.
pub fn cancel(tx: &mut Txn<'_>) -> Result<()> {
    let rec = recorded_tx(tx)?.ok_or(Error::Posix(libc::ENOTCONN, "no balance is recorded"))?;
    tx.reserve(&Need::items(ROOT, 1 + rec.groups.len() as u64).deleting())?;
    for &g in &rec.groups {
        tx.delete(ROOT, &group_key(g))?;
        tx.allocator().set_readonly(g, false);
    }
    tx.delete(ROOT, &item_key())?;
    Ok(())
}

/// Extents moved by one [`step`], bytes included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub extents: u64,
    pub bytes: u64,
}

/// What one [`step`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Extents moved out of the group at `group`; more may be left.
    Moved { group: u64, moved: Moved },
    /// The group at `group` holds no extent item any more: it is done.
    Emptied { group: u64 },
    /// The group holds no extent item but still counts used bytes
    /// (extents of unfinished flushes, blocks a deleted subvolume still
    /// holds): a commit or the cleaner must run first.
    Waiting { group: u64, used: u64 },
    /// Nothing is left: the balance item is gone.
    Finished,
    /// The balance is paused (or none is recorded).
    Idle,
}

/// Most extents and data bytes one step moves: each moves under the state
/// lock with its data read and written there, so a step stays short.
const STEP_EXTENTS: usize = 64;
const STEP_DATA_BYTES: u64 = 8 << 20;

/// Moves a bounded number of extents out of the first group still to
/// empty, or finishes the balance.
pub fn step(tx: &mut Txn<'_>) -> Result<Step> {
    let Some(rec) = recorded_tx(tx)? else {
        return Ok(Step::Idle);
    };
    if rec.paused {
        return Ok(Step::Idle);
    }
    let Some(&group) = rec.groups.first() else {
        tx.reserve(&Need::items(ROOT, 1).deleting())?;
        tx.delete(ROOT, &item_key())?;
        return Ok(Step::Finished);
    };
    let Some((len, used)) = tx
        .allocator()
        .groups()
        .find(|g| g.start == group)
        .map(|g| (g.len, g.used))
    else {
        // Emptied and returned to unallocated space already.
        return forget_group(tx, group);
    };
    tx.allocator().set_readonly(group, true);
    // Extents this transaction moved keep their items until the commit:
    // carry on after them.
    let from = tx.st.relocate_cursor.clamp(group, group + len);
    let extents = extents_in(tx, from, group + len)?;
    let Some(&(last, last_len, _)) = extents.last() else {
        if used == 0 {
            return forget_group(tx, group);
        }
        return Ok(Step::Waiting { group, used });
    };
    tx.st.relocate_cursor = last + last_len;
    let mut climb = relocate::Climb::default();
    reserve_for(tx, &mut climb, &extents)?;
    let mut moved = Moved::default();
    for (bytenr, len, item) in extents {
        if climb.holders(tx, bytenr)?.is_empty() {
            // Released at the next commit anyway.
            continue;
        }
        if item.is_tree_block() {
            relocate::move_block(tx, &mut climb, bytenr)?;
        } else {
            relocate::move_data(tx, &mut climb, bytenr, len)?;
        }
        moved.extents += 1;
        moved.bytes += len;
    }
    if moved.extents == 0 {
        // Every extent left is held only by blocks about to go (copies
        // replaced them, or a deleted subvolume's cleaner holds them).
        return Ok(Step::Waiting { group, used });
    }
    // Folded now, in this step's turn at the state lock, rather than by
    // the commit: a commit after many steps held every other operation
    // up for the fold of all of them (a quarter of a second under 64
    // snapshots). Not while a flush has a flight open: the fold frees
    // extents allocated and not referenced, as its flight's still are.
    if !tx.flights_open() {
        crate::extent::apply::run(tx)?;
    }
    Ok(Step::Moved { group, moved })
}

fn forget_group(tx: &mut Txn<'_>, group: u64) -> Result<Step> {
    tx.reserve(&Need::items(ROOT, 1).deleting())?;
    tx.delete(ROOT, &group_key(group))?;
    tx.allocator().set_readonly(group, false);
    Ok(Step::Emptied { group })
}

/// The first extents of `[start, end)`, up to a step's worth.
fn extents_in(tx: &Txn<'_>, start: u64, end: u64) -> Result<Vec<(u64, u64, ExtentItem)>> {
    let root = tx.root_of(EXTENT)?;
    let mut c = Cursor::seek(tx, &root, &Key::new(start, EXTENT_ITEM, 0))?;
    let mut out = Vec::new();
    let mut data = 0;
    while let Some(it) = c.item() {
        let k = it.key;
        if k.objectid >= end || out.len() >= STEP_EXTENTS || data >= STEP_DATA_BYTES {
            break;
        }
        if k.ty == EXTENT_ITEM {
            let item = ExtentItem::decode(&it.data).map_err(|e| Error::corrupt(k.objectid, e))?;
            if !item.is_tree_block() {
                data += k.offset;
            }
            out.push((k.objectid, k.offset, item));
        }
        if c.next(tx)?.is_none() {
            break;
        }
    }
    Ok(out)
}

/// Reserves a step's worst case: for every extent, a copy of each
/// holder's path up to the root, and the data it rewrites.
fn reserve_for(
    tx: &mut Txn<'_>,
    climb: &mut relocate::Climb,
    extents: &[(u64, u64, ExtentItem)],
) -> Result<()> {
    let mut paths = 0u64;
    let mut data = 0u64;
    for &(bytenr, len, ref item) in extents {
        paths += 1 + climb.holders(tx, bytenr)?.len() as u64;
        if !item.is_tree_block() {
            data += len;
        }
    }
    let tallest = tx
        .tree_ids()
        .into_iter()
        .max_by_key(|&t| tx.root_of(t).map_or(0, |r| r.level))
        .unwrap_or(FS);
    tx.reserve(&Need::items(tallest, paths).data(data))
}

/// Trees whose leaves moving extents leaves part-empty: the extent tree
/// (back-references) and the checksum tree (checksums of moved data).
pub const REPACKED: [u64; 2] = [EXTENT, CSUM];

/// Packs the leaves under one parent of `tree` (one of [`REPACKED`]) from
/// where `from` belongs; where to carry on, None when done.
pub fn repack_step(tx: &mut Txn<'_>, tree: u64, from: &Key) -> Result<Option<Key>> {
    // Copies of the tree's own blocks come out of the commit's global
    // reserve (each block is copied once per transaction); this is the
    // path above them.
    tx.reserve(&Need::items(tree, 1))?;
    tx.repack_leaves(tree, from)
}

/// Makes the groups of a running (not paused) recorded balance read-only
/// again (at open: the allocator does not keep that on disk).
pub fn restore_readonly(tx: &mut Txn<'_>) -> Result<()> {
    if let Some(rec) = recorded_tx(tx)? {
        for &g in &rec.groups {
            tx.allocator().set_readonly(g, !rec.paused);
        }
    }
    Ok(())
}
