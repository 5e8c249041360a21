//! The commit's accounting: moving bytes between groups for what the
//! transaction changed (see the module essay).
//!
//! Runs once the delayed references are folded, so the extent tree holds
//! the new back-references; the last commit's extent tree (still on disk:
//! nothing it reaches is reused before this commit is durable) holds the
//! old ones.

use super::roots::{compute_usage, KeptWitnesses, Reach, Roots, RootsWalk};
use super::{subvol_group, Qgroups};
use crate::error::{Error, Result};
use crate::format::items::ExtentItem;
use crate::format::key_type::EXTENT_ITEM;
use crate::format::tree_id::{self, EXTENT};
use crate::format::Key;
use crate::tree::{Cursor, RootPtr};
use crate::txn::{Relocation, Txn};
use std::collections::{BTreeMap, BTreeSet};

/// One traced extent: its length, who reached it at the last commit, and
/// who reaches it now.
struct Change {
    len: u64,
    old: Roots,
    new: Roots,
}

/// Notes that the extent at `bytenr` had reference changes other than a
/// block copy's (called while folding delayed references). Only extents
/// fs trees hold count: data, and tree blocks of fs trees.
pub(crate) fn trace(q: &mut Qgroups, bytenr: u64, len: u64, data: bool, owner: u64) {
    if q.enabled && (data || tree_id::is_shareable(owner)) {
        q.traced.insert(bytenr, (len, data));
    }
}

/// Brings every group's numbers up to the running transaction and writes
/// those that changed. Returns whether it wrote anything.
pub(crate) fn run(tx: &mut Txn<'_>) -> Result<bool> {
    let relocations = tx.take_relocations();
    let q = tx.qgroups_mut();
    let traced = std::mem::take(&mut q.traced);
    let clones = std::mem::take(&mut q.clones);
    let created = std::mem::take(&mut q.created);
    let dropped = std::mem::take(&mut q.dropped);
    let mut full = std::mem::take(&mut q.full);
    if !q.enabled {
        return Ok(false);
    }
    // Tracing a deletion serves level-0 groups only, and neither a
    // rescan's cursor nor balance's pairing of moves looks at what it
    // adds: those commits count from scratch.
    if !dropped.is_empty()
        && (!q.parents.is_empty() || q.rescan.is_some() || !relocations.is_empty())
    {
        full = true;
    }
    let mut traced = trace_both_or_neither(traced, &relocations);
    let rescan = q.rescan;
    if let Some(cursor) = rescan {
        // Extents at or past a rescan's cursor are counted when it
        // reaches them, as they are then.
        traced.retain(|&bytenr, _| bytenr < cursor);
    }
    q.forget_flushed();
    // A clone of a tree that is itself new in this transaction has no
    // last-commit numbers to start from.
    let chained = clones
        .iter()
        .any(|(src, _)| created.contains(src) || clones.iter().any(|(_, d)| d == src));
    let t0 = std::time::Instant::now();
    let mut status_changed = false;
    let trees = Trees {
        clones: &clones,
        created: &created,
        dropped: &dropped,
    };
    let counted = full || chained || !by_difference(tx, &mut traced, &trees)?;
    if counted {
        recount(tx)?;
        tx.qgroups_mut().recounts += 1;
        // A count from scratch is what a rescan would have reached.
        status_changed = tx.qgroups_mut().rescan.take().is_some();
    } else if let Some(cursor) = rescan {
        tx.qgroups_mut().rescan = rescan_batch(tx, cursor)?;
        status_changed = true;
    }
    if status_changed {
        super::ops::write_status(tx)?;
    }
    // What `RUST_LOG=canopy=debug` shows to compare accounting costs.
    tracing::debug!(
        traced = traced.len(),
        clones = clones.len(),
        recount = counted,
        micros = t0.elapsed().as_micros() as u64,
        "qgroup accounting"
    );
    super::write_dirty(tx)
}

/// Moves bytes between groups by what the traced extents, clones and
/// drops changed. False when that cannot be done (a deletion's trace ran
/// past its budget): the commit counts from scratch instead.
fn by_difference(
    tx: &mut Txn<'_>,
    traced: &mut BTreeMap<u64, (u64, bool)>,
    trees: &Trees<'_>,
) -> Result<bool> {
    if traced.is_empty() && trees.clones.is_empty() && trees.dropped.is_empty() {
        return Ok(true);
    }
    let changes = if tx.qgroups().parents.is_empty() {
        let mut kept = std::mem::take(&mut tx.qgroups_mut().kept);
        let changes = walk_level0(tx, traced, trees, &mut kept);
        tx.qgroups_mut().kept = kept;
        changes?
    } else {
        Some(walk(tx, traced)?)
    };
    let Some(changes) = changes else {
        return Ok(false);
    };
    let q = tx.qgroups_mut();
    give_clones_their_share(q, trees.clones, &changes);
    apply(q, &changes)?;
    Ok(true)
}

/// Balance moved each extent of `relocations` as a copy: untraced, the
/// new one reaches what the old one did. When some other change in the
/// transaction traced one of the two (a write to a leaf holding the moved
/// data, a pointer moved to another parent), the other is traced too, so
/// that what one gains the other loses.
///
/// A trace already there is kept as it is: a copy freed in the same
/// transaction leaves its address free at once (it was never committed),
/// and what took the address since (data where a tree block was, on an
/// image whose groups mix both) was traced with its own length and kind.
fn trace_both_or_neither(
    mut traced: BTreeMap<u64, (u64, bool)>,
    relocations: &[Relocation],
) -> BTreeMap<u64, (u64, bool)> {
    for &Relocation {
        from: old,
        to: new,
        len,
        data,
    } in relocations
    {
        if traced.contains_key(&old) || traced.contains_key(&new) {
            traced.entry(old).or_insert((len, data));
            traced.entry(new).or_insert((len, data));
        }
    }
    traced
}

/// Extents a rescan counts per commit: enough to finish soon, few enough
/// that the commit holds the state lock for milliseconds.
const RESCAN_BATCH: usize = 2048;

/// Counts the next batch of extents from `cursor` on, as the trees are
/// now, into the groups. Returns where the next batch starts (None: the
/// rescan is done).
fn rescan_batch(tx: &mut Txn<'_>, cursor: u64) -> Result<Option<u64>> {
    let root = tx.root_of(EXTENT)?;
    let mut batch = Vec::with_capacity(RESCAN_BATCH);
    let mut c = Cursor::seek(tx, &root, &Key::new(cursor, EXTENT_ITEM, 0))?;
    let mut more = false;
    while let Some(it) = c.item() {
        if it.key.ty == EXTENT_ITEM && it.key.objectid >= cursor {
            if batch.len() == RESCAN_BATCH {
                more = true;
                break;
            }
            let item =
                ExtentItem::decode(it.data).map_err(|e| Error::corrupt(it.key.objectid, e))?;
            batch.push((it.key.objectid, it.key.offset, !item.is_tree_block()));
        }
        if c.next(tx)?.is_none() {
            break;
        }
    }
    let mut walk = RootsWalk::new(root);
    let mut counted = Vec::with_capacity(batch.len());
    for &(bytenr, len, data) in &batch {
        let roots = if data {
            walk.data_roots(tx, bytenr)?
        } else {
            walk.tree_roots(tx, bytenr)?
        };
        if !roots.is_empty() {
            counted.push(Change {
                len,
                old: Roots::default(),
                new: roots,
            });
        }
    }
    apply(tx.qgroups_mut(), &counted)?;
    Ok(match batch.last() {
        Some(&(bytenr, _, _)) if more => Some(bytenr + 1),
        _ => None,
    })
}

/// Counts every group from scratch.
fn recount(tx: &mut Txn<'_>) -> Result<()> {
    let trees: Vec<_> = tx
        .tree_ids()
        .into_iter()
        .filter(|&t| tree_id::is_shareable(t))
        .map(|t| tx.root_of(t).map(|r| (t, r)))
        .collect::<Result<_>>()?;
    let usage = compute_usage(tx, &trees)?;
    tx.qgroups_mut().set_from_usage(&usage);
    Ok(())
}

/// Who reached and who reaches each traced extent (all of them: a
/// clone's share needs the unchanged ones too).
fn walk(tx: &Txn<'_>, traced: &BTreeMap<u64, (u64, bool)>) -> Result<Vec<Change>> {
    let old_root = tx
        .committed_root(EXTENT)
        .ok_or_else(|| Error::corrupt(0, "no committed extent tree"))?;
    let mut old = RootsWalk::new(old_root);
    let mut new = RootsWalk::new(tx.root_of(EXTENT)?);
    let mut out = Vec::with_capacity(traced.len());
    for (&bytenr, &(len, data)) in traced {
        let (o, n) = if data {
            (old.data_roots(tx, bytenr)?, new.data_roots(tx, bytenr)?)
        } else {
            (old.tree_roots(tx, bytenr)?, new.tree_roots(tx, bytenr)?)
        };
        out.push(Change {
            len,
            old: o,
            new: n,
        });
    }
    Ok(out)
}

/// What the transaction did to whole trees.
struct Trees<'a> {
    clones: &'a [(u64, u64)],
    created: &'a BTreeSet<u64>,
    dropped: &'a [(u64, RootPtr)],
}

/// Entries a deletion may add to the traced extents before the commit
/// counts from scratch instead (which then costs less: a deletion that
/// traces this much shares its blocks with one other subvolume at most).
const DROP_TRACE_BUDGET: usize = 8_192;

/// The same as [`walk`] as far as level-0 groups can tell, at a cost
/// that does not grow with the number of snapshots (see `roots::Reach`).
/// Adds what deleted trees reached to `traced` first; None when that is
/// past [`DROP_TRACE_BUDGET`].
fn walk_level0(
    tx: &Txn<'_>,
    traced: &mut BTreeMap<u64, (u64, bool)>,
    trees: &Trees<'_>,
    kept: &mut KeptWitnesses,
) -> Result<Option<Vec<Change>>> {
    let (clones, created) = (trees.clones, trees.created);
    let old_extents = tx
        .committed_root(EXTENT)
        .ok_or_else(|| Error::corrupt(0, "no committed extent tree"))?;
    // Trees that may reach something differently from the last commit.
    let mut changed: BTreeSet<u64> = created.clone();
    for &(src, dst) in clones {
        changed.insert(src);
        changed.insert(dst);
    }
    let (mut old_roots, mut new_roots) = (BTreeMap::new(), BTreeMap::new());
    for &(t, then) in trees.dropped {
        changed.insert(t);
        old_roots.insert(t, then);
    }
    changed.extend(
        tx.moved_roots()
            .into_iter()
            .filter(|&t| tree_id::is_shareable(t)),
    );
    for &t in &changed {
        // A tree made and deleted in this transaction has neither.
        if let Ok(now) = tx.root_of(t) {
            new_roots.insert(t, now);
            if let Some(then) = tx.committed_root(t) {
                old_roots.insert(t, then);
            }
        }
    }
    let mut reach = Reach::new(
        &changed,
        (old_extents, old_roots),
        (tx.root_of(EXTENT)?, new_roots),
        tx.committed_roots(),
        kept,
        tx.transid(),
    );
    let mut budget = DROP_TRACE_BUDGET;
    for &(_, then) in trees.dropped {
        if !reach.trace_dropped(tx, then, traced, &mut budget)? {
            return Ok(None);
        }
    }
    let mut out = Vec::with_capacity(traced.len());
    for (&bytenr, &(len, data)) in traced.iter() {
        let made = tx.is_new_extent(bytenr);
        let (old, new) = reach.change(tx, bytenr, data, made)?;
        out.push(Change { len, old, new });
    }
    Ok(Some(out))
}

/// A clone reaches every extent its source reached that was not traced:
/// its referenced bytes are the source's less the traced ones the source
/// reached, and the source's exclusive bytes less the traced ones it held
/// alone are shared now. (Traced extents are moved by [`apply`].)
fn give_clones_their_share(q: &mut Qgroups, clones: &[(u64, u64)], changes: &[Change]) {
    let mut sources = BTreeSet::new();
    for &(src, dst) in clones {
        let reached: u64 = changes
            .iter()
            .filter(|c| c.old.contains(&src))
            .map(|c| c.len)
            .sum();
        let src_ref = q.groups.get(&subvol_group(src)).map_or(0, |g| g.referenced);
        if let Some(g) = q.groups.get_mut(&subvol_group(dst)) {
            g.referenced += src_ref.saturating_sub(reached);
            q.dirty.insert(subvol_group(dst));
        }
        sources.insert(src);
    }
    for src in sources {
        let alone: u64 = changes
            .iter()
            .filter(|c| c.old.len() == 1 && c.old.contains(&src))
            .map(|c| c.len)
            .sum();
        if let Some(g) = q.groups.get_mut(&subvol_group(src)) {
            g.exclusive = alone.min(g.exclusive);
            q.dirty.insert(subvol_group(src));
        }
    }
}

/// Moves each changed extent's bytes between the groups.
fn apply(q: &mut Qgroups, changes: &[Change]) -> Result<()> {
    let mut memo = BTreeMap::new();
    let mut delta: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    for c in changes.iter().filter(|c| c.old != c.new) {
        let len = c.len as i64;
        for (roots, sign) in [(&c.old, -1), (&c.new, 1)] {
            for (g, alone) in q.shares(roots, &mut memo) {
                let d = delta.entry(g).or_insert((0, 0));
                d.0 += sign * len;
                d.1 += sign * len * i64::from(alone);
            }
        }
    }
    for (g, (r, e)) in delta {
        let Some(group) = q.groups.get_mut(&g) else {
            continue;
        };
        let (Some(nr), Some(ne)) = (
            group.referenced.checked_add_signed(r),
            group.exclusive.checked_add_signed(e),
        ) else {
            return Err(Error::corrupt(
                0,
                format!(
                    "qgroup {} would go below zero",
                    crate::format::qgroup::display(g)
                ),
            ));
        };
        if (nr, ne) != (group.referenced, group.exclusive) {
            group.referenced = nr;
            group.exclusive = ne;
            q.dirty.insert(g);
        }
    }
    Ok(())
}
