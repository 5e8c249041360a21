//! Folding delayed references into the extent tree at commit.
//!
//! This runs inside the commit, above the tree layer (it edits the extent
//! tree with ordinary tree operations, which may themselves copy blocks and
//! so add more delayed references; the commit repeats until none are left).

use crate::error::{Error, Result};
use crate::format::items::{
    decode_ref_count, encode_ref_count, ExtentItem, EXTENT_FLAG_DATA, EXTENT_FLAG_TREE_BLOCK,
};
use crate::format::key_type::{EXTENT_ITEM, SHARED_BLOCK_REF, SHARED_DATA_REF, TREE_BLOCK_REF};
use crate::format::tree_id::EXTENT;
use crate::format::Key;
use crate::tree::{BlockRead, Cursor};
use crate::txn::{ExtentKind, PendingExtent, RefHolder};
use std::collections::{BTreeMap, HashMap};

use crate::txn::Txn;

/// Applies every delayed reference collected so far. Returns false when
/// there was nothing to apply.
pub fn run(tx: &mut Txn<'_>) -> Result<bool> {
    let mut batch = tx.take_delayed_refs();
    if batch.is_empty() {
        return Ok(false);
    }
    let mut handed = hand_over_released(tx, &mut batch)?;
    let mut sums_gone = Vec::new();
    for (bytenr, pending) in batch {
        let found = handed.remove(&bytenr);
        apply_one(tx, bytenr, pending, found, &mut sums_gone)?;
    }
    // The checksums of the data released, deleted together (freed
    // extents stay pinned until the commit, so no new checksum item can
    // take one of these keys meanwhile). Some are gone already (balance
    // and defragment move them with the data).
    if !sums_gone.is_empty() {
        sums_gone.sort_unstable();
        tx.delete_sorted(crate::format::tree_id::CSUM, &sums_gone)?;
    }
    Ok(true)
}

/// Lets the tree blocks this batch releases give up their children's
/// references inside the same batch, not one fold round later.
///
/// A copied block's children get +1 from the copy now and -1 from the
/// original when the original's count reaches zero. Released in the fold
/// (as `apply_one` would), the -1 arrives in the next round, so every
/// child's extent item is found and rewritten twice and its count goes up
/// and back down. Handed over first, the two meet: the count stays, only
/// the back-reference changes. This is most of what a commit after many
/// copies (balance moving blocks shared by snapshots, or a big rename)
/// spends in the extent tree. Blocks a drop releases keep their own pace
/// (the cleaner's budget). Returns the blocks handed over with their
/// extent items (only their own fold changes those).
fn hand_over_released(
    tx: &mut Txn<'_>,
    batch: &mut BTreeMap<u64, PendingExtent>,
) -> Result<HashMap<u64, (Key, ExtentItem)>> {
    let mut handed = HashMap::new();
    let mut work: Vec<u64> = batch
        .iter()
        .filter(|(_, p)| may_release_tree_block(p))
        .map(|(&b, _)| b)
        .collect();
    while let Some(bytenr) = work.pop() {
        let Some(p) = batch.get(&bytenr) else {
            continue;
        };
        if handed.contains_key(&bytenr)
            || !may_release_tree_block(p)
            || tx.drop_state().is_drop(&p.refs)
        {
            continue;
        }
        let net = p.net();
        let root = tx.root_of(EXTENT)?;
        let Some((key, item)) = find_extent_item(tx, &root, bytenr)? else {
            // apply_one reports it.
            continue;
        };
        if !item.is_tree_block() || item.refs as i64 + net != 0 {
            continue;
        }
        super::drop::give_up_children(tx, bytenr, &item)?;
        handed.insert(bytenr, (key, item));
        for (child, changes) in tx.take_delayed_refs() {
            if changes.net() < 0 {
                work.push(child);
            }
            crate::txn::refs::merge_pending(batch, child, changes);
        }
    }
    Ok(handed)
}

/// Whether `p` may bring an existing tree block's count to zero.
fn may_release_tree_block(p: &PendingExtent) -> bool {
    p.new_kind.is_none()
        && p.net() < 0
        && p.refs
            .keys()
            .all(|h| matches!(h, RefHolder::TreeParent(_) | RefHolder::TreeRoot(_)))
}

/// The extent item of the extent starting at `bytenr`: its key and content.
pub fn find_extent_item<B: BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
    bytenr: u64,
) -> Result<Option<(Key, ExtentItem)>> {
    let c = Cursor::seek(b, root, &Key::new(bytenr, EXTENT_ITEM, 0))?;
    let Some(it) = c.item() else { return Ok(None) };
    if it.key.objectid != bytenr || it.key.ty != EXTENT_ITEM {
        return Ok(None);
    }
    let item = ExtentItem::decode(it.data).map_err(|e| Error::corrupt(bytenr, e))?;
    Ok(Some((it.key, item)))
}

fn new_item(kind: ExtentKind, transid: u64) -> ExtentItem {
    match kind {
        ExtentKind::Tree { owner, level } => ExtentItem {
            refs: 0,
            generation: transid,
            flags: EXTENT_FLAG_TREE_BLOCK,
            owner,
            level,
        },
        ExtentKind::Data => ExtentItem {
            refs: 0,
            generation: transid,
            flags: EXTENT_FLAG_DATA,
            owner: 0,
            level: 0,
        },
    }
}

/// Folds `p` into the extent at `bytenr`. `handed`: its extent item, when
/// `hand_over_released` already found it and released its children.
fn apply_one(
    tx: &mut Txn<'_>,
    bytenr: u64,
    p: PendingExtent,
    handed: Option<(Key, ExtentItem)>,
    sums_gone: &mut Vec<Key>,
) -> Result<()> {
    let children_handed = handed.is_some();
    let (mut item, len, existed) = item_to_change(tx, bytenr, &p, handed)?;
    if p.traced {
        // Even when the changes cancel out: a pointer that moved from
        // one leaf to another may now be reached by other trees.
        let data = !item.is_tree_block();
        tx.trace_for_quota(bytenr, len, data, item.owner);
    }
    if existed && p.refs.is_empty() {
        return Ok(());
    }
    for (&holder, &delta) in &p.refs {
        update_backref(tx, bytenr, holder, delta, existed)?;
    }
    let total = item.refs as i64 + p.net();
    if total < 0 {
        return Err(Error::corrupt(
            bytenr,
            format!("reference count would be {total}"),
        ));
    }
    let key = Key::new(bytenr, EXTENT_ITEM, len);
    if total == 0 {
        if existed {
            tx.delete(EXTENT, &key)?;
        }
        if item.is_tree_block() {
            if children_handed {
                return super::drop::free_block(tx, bytenr, &item);
            }
            let from_drop = tx.drop_state().is_drop(&p.refs);
            return super::drop::release_or_queue(tx, bytenr, &item, from_drop);
        }
        return release_data(tx, bytenr, len, sums_gone);
    }
    if existed && item.refs == total as u64 {
        // Holders swapped (a copy replaced one): the item stays as it is.
        return Ok(());
    }
    item.refs = total as u64;
    if existed {
        tx.put(EXTENT, key, item.encode())?;
    } else {
        tx.insert(EXTENT, key, item.encode()).map_err(|e| match e {
            Error::Exists => Error::corrupt(bytenr, "newly allocated extent already has an item"),
            e => e,
        })?;
    }
    Ok(())
}

/// The extent item `p` changes, its length, and whether it is on the
/// tree already (false: a new extent's item, to insert).
fn item_to_change(
    tx: &Txn<'_>,
    bytenr: u64,
    p: &PendingExtent,
    handed: Option<(Key, ExtentItem)>,
) -> Result<(ExtentItem, u64, bool)> {
    let existing = match handed {
        Some(found) => Some(found),
        // Made in this transaction: it has no item yet (the insert
        // reports one that is there anyway), and no search is needed.
        None if p.new_kind.is_some() => None,
        None => find_extent_item(tx, &tx.root_of(EXTENT)?, bytenr)?,
    };
    match (existing, p.new_kind) {
        (Some((k, it)), None) => Ok((it, k.offset, true)),
        (None, Some(kind)) => Ok((new_item(kind, tx.transid()), p.len, false)),
        (Some(_), Some(_)) => Err(Error::corrupt(
            bytenr,
            "newly allocated extent already has an item",
        )),
        (None, None) => Err(Error::corrupt(
            bytenr,
            "reference change for an extent with no item",
        )),
    }
}

fn backref_key(bytenr: u64, holder: RefHolder) -> Key {
    match holder {
        RefHolder::TreeParent(p) => Key::new(bytenr, SHARED_BLOCK_REF, p),
        RefHolder::TreeRoot(id) => Key::new(bytenr, TREE_BLOCK_REF, id),
        RefHolder::DataLeaf(l) => Key::new(bytenr, SHARED_DATA_REF, l),
    }
}

/// Applies `delta` to the back-reference of `holder` to the extent at
/// `bytenr`. `existed`: the extent had an item before this fold (a new
/// one has no back-references to look up).
fn update_backref(
    tx: &mut Txn<'_>,
    bytenr: u64,
    holder: RefHolder,
    delta: i64,
    existed: bool,
) -> Result<()> {
    let key = backref_key(bytenr, holder);
    let bad = |why: &str| Error::corrupt(bytenr, format!("back-reference {key}: {why}"));
    if let RefHolder::DataLeaf(_) = holder {
        // Taken out and put back only if some count is left: the common
        // changes (a new extent's first holder, the last holder of a
        // freed one) cost one tree edit.
        let old = match existed {
            false => None,
            true => match tx.delete(EXTENT, &key) {
                Ok(d) => Some(d),
                Err(Error::NotFound) => None,
                Err(e) => return Err(e),
            },
        };
        let old = match old {
            Some(d) => i64::from(decode_ref_count(&d).map_err(|e| bad(&e))?),
            None => 0,
        };
        let new = old + delta;
        return match new {
            0 => Ok(()),
            1..=0xffff_ffff => tx
                .insert(EXTENT, key, encode_ref_count(new as u32))
                .map_err(|e| match e {
                    Error::Exists => bad("recorded twice"),
                    e => e,
                }),
            _ => Err(bad("count out of range")),
        };
    }
    match delta {
        1 => tx.insert(EXTENT, key, Vec::new()).map_err(|e| match e {
            Error::Exists => bad("holder already recorded"),
            e => e,
        }),
        -1 => tx.delete(EXTENT, &key).map(|_| ()).map_err(|e| match e {
            Error::NotFound => bad("holder not recorded"),
            e => e,
        }),
        _ => Err(bad("a holder can point at a tree block only once")),
    }
}

/// Frees a data extent whose count reached zero, with its checksums.
fn release_data(tx: &mut Txn<'_>, bytenr: u64, len: u64, sums_gone: &mut Vec<Key>) -> Result<()> {
    sums_gone.push(Key::new(
        crate::format::CSUM_OBJECTID,
        crate::format::key_type::EXTENT_CSUM,
        bytenr,
    ));
    // A data extent stays pinned even when never committed: an unlocked
    // read may still be reading it (see `txn::flight`).
    tx.free_extent(bytenr, len, false)
}
