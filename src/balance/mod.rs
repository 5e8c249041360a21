//! Balance: emptying chosen block groups by moving their extents into
//! other groups, while the filesystem is in use.
//!
//! A balance starts by choosing its groups (data, metadata and system,
//! optionally only those under a usage percentage) and recording them
//! durably in the root tree: `(BALANCE_OBJECTID, BALANCE_ITEM, 0)` holds
//! the arguments and whether it is paused, and one
//! `(BALANCE_OBJECTID, BALANCE_GROUP, start)` item per group still to
//! empty. The chosen groups become *pending* in the allocator: new
//! extents go elsewhere (a new group included) while anything else can
//! take them. Only the group a step is emptying is read-only, and a step
//! makes it so only if everything already promised (the commit's own
//! reserve, buffered data) still fits without its free space.
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
//! btrfs does. Pausing keeps them (and makes the groups ordinary again);
//! cancelling removes them.
//!
//! On a nearly full disk a step shrinks to what its reservation allows,
//! and reads, verifies and places its data before it changes anything,
//! so it moves something or fails with ENOSPC having changed nothing.
//! A group no step can move anything out of, even after a commit, is
//! skipped ([`skip_group`]) and the balance goes on with the others; it
//! ends as failed, saying how many groups it could not empty.

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
use crate::format::superblock::Profile;

/// Whether `args` chooses a group of `kind` and `profile` with `used` of
/// `len` bytes used. A conversion chooses only groups of another profile,
/// all of them unless a filter narrows them.
fn wants(args: &BalanceArgs, kind: GroupKind, profile: Profile, used: u64, len: u64) -> bool {
    let (filter, convert) = match kind {
        GroupKind::Data => (args.data, args.data_convert),
        GroupKind::Metadata | GroupKind::System => (args.metadata, args.metadata_convert),
        GroupKind::Mixed => (
            args.data.or(args.metadata),
            args.data_convert.or(args.metadata_convert),
        ),
    };
    let filter = match convert {
        Some(target) if target == profile => return false,
        Some(_) => filter.or(Filter::All),
        None => filter,
    };
    match filter {
        Filter::Skip => false,
        Filter::All => true,
        Filter::UsageBelow(pct) => used.saturating_mul(100) < u64::from(pct).saturating_mul(len),
    }
}

/// Whether `args` converts groups of `kind` to another profile.
fn converts(args: &BalanceArgs, kind: GroupKind) -> bool {
    match kind {
        GroupKind::Data => args.data_convert.is_some(),
        GroupKind::Metadata | GroupKind::System => args.metadata_convert.is_some(),
        GroupKind::Mixed => args.data_convert.or(args.metadata_convert).is_some(),
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
    let (args, paused) = BalanceArgs::decode(item).map_err(|e| item_key().bad(e))?;
    Ok(Recorded {
        args,
        paused,
        groups: groups.into_iter().map(|(k, _)| k.offset).collect(),
    })
}

/// Records a new balance and marks its groups pending (new extents go
/// elsewhere while they can). Returns how many groups it will empty;
/// EINPROGRESS if one is recorded already.
///
/// Only the group a step is emptying is read-only: making all of them
/// read-only at once took their free space from promises already made
/// (the commit's own reserve), and on a small image where every group
/// was chosen the next commit found no space at all.
pub fn start(tx: &mut Txn<'_>, args: BalanceArgs) -> Result<usize> {
    if recorded_tx(tx)?.is_some() {
        return Err(Error::Posix(
            libc::EINPROGRESS,
            "a balance is already running or paused (resume or cancel it)",
        ));
    }
    convert(tx, &args)?;
    let chosen: Vec<u64> = tx
        .allocator()
        .groups()
        .filter(|g| {
            // An empty group is given back by the next commit; one that
            // must go (another profile, the device leaving) is chosen
            // all the same, so that nothing new lands in it meanwhile.
            let must_go = args.devid.is_some() || converts(&args, g.kind);
            (g.used > 0 || must_go) && wants(&args, g.kind, profile_of(g), g.used, g.len)
        })
        .filter(|g| args.devid.is_none_or(|d| g.ranges().any(|r| r.0 == d)))
        .map(|g| g.start)
        .collect();
    tx.reserve(&Need::items(ROOT, 1 + chosen.len() as u64))?;
    tx.insert(ROOT, item_key(), args.encode(false))?;
    for &g in &chosen {
        tx.insert(ROOT, group_key(g), Vec::new())?;
        tx.allocator().set_pending(g, true);
    }
    Ok(chosen.len())
}

/// How many copies a group keeps, and where.
fn profile_of(g: &crate::alloc::BlockGroup) -> Profile {
    g.profile()
}

/// Gives new groups the profiles a conversion asks for, from now on (the
/// superblock keeps them, so a resumed balance and later groups follow).
/// Mixed groups hold data and metadata together: a conversion of one is
/// one of both.
fn convert(tx: &mut Txn<'_>, args: &BalanceArgs) -> Result<()> {
    let (d, m) = (args.data_convert, args.metadata_convert);
    if d.is_none() && m.is_none() {
        return Ok(());
    }
    if tx.allocator().is_mixed() && d.is_some() && m.is_some() && d != m {
        return Err(Error::Invalid(
            "mixed block groups hold data and metadata together: convert both to one profile"
                .into(),
        ));
    }
    let (d, m) = match tx.allocator().is_mixed() {
        true => (d.or(m), m.or(d)),
        false => (d, m),
    };
    tx.set_profiles(m, d)
}

/// Marks a recorded balance paused (or running again): a paused
/// balance's groups take new extents like any other.
pub fn set_paused(tx: &mut Txn<'_>, paused: bool) -> Result<Recorded> {
    let mut rec = recorded_tx(tx)?.ok_or(Error::Posix(libc::ENOTCONN, "no balance is recorded"))?;
    tx.reserve(&Need::items(ROOT, 1).deleting())?;
    tx.put(ROOT, item_key(), rec.args.encode(paused))?;
    for &g in &rec.groups {
        tx.allocator().set_pending(g, !paused);
        if paused {
            tx.allocator().set_readonly(g, false);
        }
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
        tx.allocator().set_pending(g, false);
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
    let was_readonly = tx.allocator().is_readonly(group);
    // Read-only takes the group's free space from what reservations may
    // count: the reservation below checks everything promised still
    // fits without it, and a failed step gives the space back.
    let newly = tx.allocator().set_readonly(group, true) && !was_readonly;
    let r = empty_some(tx, group, len, used);
    if r.is_err() && newly {
        tx.allocator().set_readonly(group, false);
    }
    r
}

/// One step's moves out of `group`, read-only already.
fn empty_some(tx: &mut Txn<'_>, group: u64, len: u64, used: u64) -> Result<Step> {
    tx.reserve(&Need::items(ROOT, 1))?;
    // Extents this transaction moved keep their items until the commit:
    // carry on after them.
    let from = tx.relocate_cursor().clamp(group, group + len);
    let mut extents = extents_in(tx, from, group + len)?;
    if extents.is_empty() {
        if used == 0 {
            return forget_group(tx, group);
        }
        return Ok(Step::Waiting { group, used });
    }
    let mut climb = relocate::Climb::default();
    reserve_shrinking(tx, &mut climb, &mut extents)?;
    let plan = plan(tx, &mut climb, extents)?;
    tx.set_relocate_cursor(plan.end);
    let mut moved = Moved::default();
    for m in plan.moves {
        // Moving an earlier extent can leave this one held by nothing
        // alive (its last holder was a copy's old block): skip it. A
        // place allocated for it is freed by the fold, unreferenced.
        if climb.holders(tx, m.bytenr)?.is_empty() {
            continue;
        }
        match m.data {
            None => drop(relocate::move_block(tx, &mut climb, m.bytenr)?),
            Some((copy, new)) => relocate::move_data(tx, &mut climb, copy, new)?,
        }
        moved.extents += 1;
        moved.bytes += m.len;
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

/// Gives up on the first group still listed, for want of room to move
/// its extents (a step failed with ENOSPC even after a commit): it leaves
/// the balance as it is, takes new extents again, and the balance goes on
/// with the others, as btrfs's does. Its start, None if none is left.
pub fn skip_group(tx: &mut Txn<'_>) -> Result<Option<u64>> {
    let Some(rec) = recorded_tx(tx)? else {
        return Ok(None);
    };
    let Some(&group) = rec.groups.first() else {
        return Ok(None);
    };
    forget_group(tx, group)?;
    Ok(Some(group))
}

fn forget_group(tx: &mut Txn<'_>, group: u64) -> Result<Step> {
    tx.reserve(&Need::items(ROOT, 1).deleting())?;
    tx.delete(ROOT, &group_key(group))?;
    tx.allocator().set_readonly(group, false);
    tx.allocator().set_pending(group, false);
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
            let item = ExtentItem::decode(it.data).map_err(|e| Error::corrupt(k.objectid, e))?;
            if !item.is_tree_block() {
                data += k.offset;
            }
            // An extent this transaction allocated (a copy an earlier
            // step moved into a group still to empty) moves after the
            // commit: one move per extent per transaction.
            if item.generation != tx.transid() {
                out.push((k.objectid, k.offset, item));
            }
        }
        if c.next(tx)?.is_none() {
            break;
        }
    }
    Ok(out)
}

/// What a step moves, and where the next step in this transaction
/// starts.
struct Plan {
    moves: Vec<Move>,
    end: u64,
}

/// A tree block, or a data extent read and verified with the place
/// allocated for it.
struct Move {
    bytenr: u64,
    len: u64,
    data: Option<(relocate::DataCopy, u64)>,
}

/// Everything a step can fail on before it changes anything: each data
/// extent is read and verified, and then given its new place, in order.
/// Free space fragmented on a nearly full disk may hold the bytes the
/// reservation counted but not an extent's length in one piece: the step
/// then ends before the first extent without a place (ENOSPC if that is
/// the first), instead of failing half-way through. Extents held by
/// nothing alive are left out (released at the next commit anyway).
fn plan(
    tx: &mut Txn<'_>,
    climb: &mut relocate::Climb,
    extents: Vec<(u64, u64, ExtentItem)>,
) -> Result<Plan> {
    let mut end = 0;
    let mut moves = Vec::with_capacity(extents.len());
    let mut copies = Vec::new();
    for (bytenr, len, item) in extents {
        end = bytenr + len;
        if climb.holders(tx, bytenr)?.is_empty() {
            continue;
        }
        if !item.is_tree_block() {
            copies.push((moves.len(), relocate::DataCopy::read(tx, bytenr, len)?));
        }
        moves.push(Move {
            bytenr,
            len,
            data: None,
        });
    }
    for (i, copy) in copies {
        let m = &mut moves[i];
        match tx.alloc_data(m.len, m.bytenr) {
            Ok(new) => m.data = Some((copy, new)),
            Err(Error::NoSpace) if i > 0 => {
                end = m.bytenr;
                moves.truncate(i);
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Plan { moves, end })
}

/// Reserves for as many of `extents` as fit, halving the step until its
/// worst case does: on a nearly full disk the worst case of a whole step
/// (a path per holder of 64 extents) can be more than is free although
/// one extent at a time moves fine. ENOSPC only when one extent does not
/// fit.
fn reserve_shrinking(
    tx: &mut Txn<'_>,
    climb: &mut relocate::Climb,
    extents: &mut Vec<(u64, u64, ExtentItem)>,
) -> Result<()> {
    loop {
        match reserve_for(tx, climb, extents) {
            Err(Error::NoSpace) if extents.len() > 1 => extents.truncate(extents.len() / 2),
            r => return r,
        }
    }
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
    reserve_moves(tx, paths, data)
}

/// Reserves for moving `data` bytes of extents whose holders' paths up
/// to the roots (`paths` of them, each as tall as the tallest tree) may
/// all need copying: space only, as a move's quota numbers do not change.
pub(crate) fn reserve_moves(tx: &mut Txn<'_>, paths: u64, data: u64) -> Result<()> {
    let tallest = tx
        .tree_ids()
        .into_iter()
        .max_by_key(|&t| tx.root_of(t).map_or(0, |r| r.level))
        .unwrap_or(FS);
    tx.reserve(&Need::items(tallest, paths).data(data).moving())
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

/// Marks the groups of a running (not paused) recorded balance pending
/// again (at open: the allocator does not keep that on disk). The next
/// step makes its group read-only.
pub fn restore_pending(tx: &mut Txn<'_>) -> Result<()> {
    if let Some(rec) = recorded_tx(tx)? {
        for &g in &rec.groups {
            tx.allocator().set_pending(g, !rec.paused);
        }
    }
    Ok(())
}
