//! Repacking leaves that work spread over a tree left part-empty.
//!
//! Balance deletes and reinserts every back-reference of the extents it
//! moves: the old keys go from leaves all over the extent tree, the new
//! ones arrive where the copies were allocated, often between keys that
//! fill their leaves already, whose splits leave half-full leaves. The
//! tree stays correct but takes more blocks than before, and "balance
//! never makes used space grow" would not hold. Repacking pulls entries
//! into each leaf from its right neighbour while they fit and drops the
//! leaves emptied, one parent's children per call, so a caller can work
//! through a large tree in short transactions.

use super::cow::{cow_child, cow_path};
use super::rebalance::{content_bytes, entry_sizes, fix_up, move_leading, ptr_mut, sync_key};
use super::{read_child, BlockWrite, Cursor, Holder, RootPtr};
use crate::error::Result;
use crate::format::node::HEADER_SIZE;
use crate::format::Key;

/// Packs the leaves under the parent of the leaf where `from` belongs,
/// from that leaf to the parent's last child. Returns where the next call
/// carries on, or None once the tree's last leaf was packed.
pub fn repack_leaves<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    from: &Key,
) -> Result<Option<Key>> {
    if root.level == 0 {
        return Ok(None);
    }
    let path = cow_path(b, owner, root, from)?;
    let up = path.len() - 2;
    let parent = path[up].bytenr;
    let mut slot = path[up].slot;
    while slot + 1 < ptr_mut(b, parent)?.len() {
        if pull_from_right(b, owner, parent, slot)? {
            slot += 1;
        }
    }
    let last = {
        let level = b.node_mut(parent)?.level;
        let ptr = ptr_mut(b, parent)?[slot];
        read_child(b, &ptr, level)?.items().last().map(|it| it.key)
    };
    fix_up(b, owner, root, &path)?;
    let Some(after) = last.and_then(|k| k.successor()) else {
        return Ok(None);
    };
    // The next item's own key: a key between two leaves would lead back
    // to the leaf before it.
    Ok(Cursor::seek(b, root, &after)?.item().map(|it| it.key))
}

/// Moves as many leading entries of child `slot + 1` of `parent` into
/// child `slot` as fit there; removes the right child once empty. Returns
/// true when the left child is full (the caller moves on), false when the
/// right one was emptied and removed (its new right neighbour is next).
fn pull_from_right<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<bool> {
    let cap = b.nodesize() - HEADER_SIZE;
    let level = b.node_mut(parent)?.level;
    let (lptr, rptr) = {
        let ptrs = ptr_mut(b, parent)?;
        (ptrs[slot], ptrs[slot + 1])
    };
    let room = cap.saturating_sub(content_bytes(&read_child(b, &lptr, level)?.body));
    let sizes = entry_sizes(&read_child(b, &rptr, level)?.body);
    let mut taken = 0;
    let k = sizes
        .iter()
        .take_while(|&&s| {
            taken += s;
            taken <= room
        })
        .count();
    if k == 0 {
        return Ok(true);
    }
    let left = cow_child(b, owner, parent, slot)?;
    let right = cow_child(b, owner, parent, slot + 1)?;
    if move_leading(b, right, left, k)? == 0 {
        ptr_mut(b, parent)?.remove(slot + 1);
        b.block_ref(right, Holder::Parent(parent), -1);
        return Ok(false);
    }
    sync_key(b, parent, slot + 1)?;
    Ok(true)
}
