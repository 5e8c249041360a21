//! Keeping the tree balanced after a change.
//!
//! Invariants restored by [`fix_up`], bottom-up along the modified path:
//! - no block's content exceeds the block (overflow: first shift entries
//!   into a neighbour with room, otherwise split into as many roughly equal
//!   pieces as needed, so even several large items fit);
//! - no non-root block is less than a quarter full while it has a sibling
//!   (underflow: merge with the sibling if both fit in one block, otherwise
//!   redistribute the two evenly);
//! - every parent key equals its child's first key;
//! - the root is not an internal node with a single child (the tree shrinks)
//!   and grows a new root when the old one overflows.
//!
//! Moving entries between blocks changes who holds the references those
//! entries carry, so every move is reported through `count_entry_refs`.

use super::cow::{cow_child, Step};
use super::{count_entry_refs, BlockWrite, Holder, RootPtr};
use crate::error::{Error, Result};
use crate::format::node::{Body, Leaf, Ptr, HEADER_SIZE, PTR_SIZE};

pub(super) fn entry_sizes(body: &Body) -> Vec<usize> {
    match body {
        Body::Leaf(items) => (0..items.len()).map(|i| items.entry_size(i)).collect(),
        Body::Internal(ptrs) => vec![PTR_SIZE; ptrs.len()],
    }
}

pub(super) fn content_bytes(body: &Body) -> usize {
    match body {
        Body::Leaf(items) => items.content_bytes(),
        Body::Internal(ptrs) => ptrs.len() * PTR_SIZE,
    }
}

fn empty_like(body: &Body) -> Body {
    match body {
        Body::Leaf(_) => Body::Leaf(Leaf::new()),
        Body::Internal(_) => Body::Internal(Vec::new()),
    }
}

fn split_off(body: &mut Body, at: usize) -> Body {
    match body {
        Body::Leaf(v) => Body::Leaf(v.split_off(at)),
        Body::Internal(v) => Body::Internal(v.split_off(at)),
    }
}

fn append(body: &mut Body, other: Body) {
    match (body, other) {
        (Body::Leaf(a), Body::Leaf(b)) => a.append(&b),
        (Body::Internal(a), Body::Internal(b)) => a.extend(b),
        _ => {}
    }
}

fn len(body: &Body) -> usize {
    match body {
        Body::Leaf(v) => v.len(),
        Body::Internal(v) => v.len(),
    }
}

fn first_key(body: &Body) -> Option<crate::format::Key> {
    match body {
        Body::Leaf(v) => v.first_key(),
        Body::Internal(v) => v.first().map(|p| p.key),
    }
}

/// Indices where new pieces start so that every piece fits in `cap` bytes
/// and pieces are about equal. Each entry alone must fit.
fn partition(sizes: &[usize], cap: usize) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    let mut pieces_left = total.div_ceil(cap).max(1);
    let mut left = total;
    let mut acc = 0;
    let mut cuts = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let target = left.div_ceil(pieces_left);
        if acc > 0 && (acc + s > cap || acc + s / 2 > target) {
            cuts.push(i);
            left -= acc;
            pieces_left = pieces_left.saturating_sub(1).max(1);
            acc = 0;
        }
        acc += s;
    }
    cuts
}

/// The cut that splits `sizes` into two fitting pieces with the smallest
/// larger half.
fn best_two_way_cut(sizes: &[usize], cap: usize) -> Option<usize> {
    let total: usize = sizes.iter().sum();
    let mut acc = 0;
    let mut best: Option<(usize, usize)> = None;
    for (i, &s) in sizes.iter().enumerate().skip(1) {
        acc += sizes[i - 1];
        let _ = s;
        let worst = acc.max(total - acc);
        if acc <= cap && total - acc <= cap && best.is_none_or(|(w, _)| worst < w) {
            best = Some((worst, i));
        }
    }
    best.map(|(_, i)| i)
}

pub(super) fn ptr_mut<B: BlockWrite + ?Sized>(b: &mut B, parent: u64) -> Result<&mut Vec<Ptr>> {
    match &mut b.node_mut(parent)?.body {
        Body::Internal(ptrs) => Ok(ptrs),
        Body::Leaf(_) => Err(Error::corrupt(parent, "parent is a leaf")),
    }
}

/// Sets the key of pointer `slot` of `parent` to its child's first key.
pub(super) fn sync_key<B: BlockWrite + ?Sized>(b: &mut B, parent: u64, slot: usize) -> Result<()> {
    sync_key_changed(b, parent, slot).map(drop)
}

/// [`sync_key`], telling whether the key changed.
fn sync_key_changed<B: BlockWrite + ?Sized>(b: &mut B, parent: u64, slot: usize) -> Result<bool> {
    let ptr = ptr_mut(b, parent)?[slot];
    let child = b.read_node(ptr.bytenr, ptr.generation)?;
    match child.first_key() {
        Some(k) if k != ptr.key => {
            ptr_mut(b, parent)?[slot].key = k;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Moves entries `from_body[range]`'s references from holder `from` to `to`.
fn move_refs<B: BlockWrite + ?Sized>(
    b: &mut B,
    moved: &Body,
    range: std::ops::Range<usize>,
    from: u64,
    to: u64,
) {
    count_entry_refs(b, moved, range.clone(), to, 1);
    count_entry_refs(b, moved, range, from, -1);
}

/// Splits the overflowing child `slot` of `parent` into enough pieces.
fn split_child<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<()> {
    let cap = b.nodesize() - HEADER_SIZE;
    let child = ptr_mut(b, parent)?[slot].bytenr;
    let node = b.node_mut(child)?;
    let level = node.level;
    let cuts = partition(&entry_sizes(&node.body), cap);
    let mut tails = Vec::new();
    for &cut in cuts.iter().rev() {
        tails.push(split_off(&mut b.node_mut(child)?.body, cut));
    }
    let transid = b.transid();
    for (i, tail) in tails.into_iter().rev().enumerate() {
        let new = b.alloc_node(owner, level, child)?;
        move_refs(b, &tail, 0..len(&tail), child, new);
        let key = first_key(&tail).ok_or_else(|| Error::corrupt(child, "empty split piece"))?;
        b.node_mut(new)?.body = tail;
        ptr_mut(b, parent)?.insert(
            slot + 1 + i,
            Ptr {
                key,
                bytenr: new,
                generation: transid,
            },
        );
        b.block_ref(new, Holder::Parent(parent), 1);
    }
    sync_key(b, parent, slot)
}

/// Merges or evens out the underfull child `slot` of `parent` with a sibling.
fn merge_child<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<()> {
    let n = ptr_mut(b, parent)?.len();
    if n < 2 {
        return sync_key(b, parent, slot);
    }
    let (ls, rs) = if slot + 1 < n {
        (slot, slot + 1)
    } else {
        (slot - 1, slot)
    };
    let l = cow_child(b, owner, parent, ls)?;
    let r = cow_child(b, owner, parent, rs)?;
    let cap = b.nodesize() - HEADER_SIZE;
    let lbody = std::mem::replace(&mut b.node_mut(l)?.body, Body::Leaf(Leaf::new()));
    let rbody = std::mem::replace(&mut b.node_mut(r)?.body, Body::Leaf(Leaf::new()));
    let nl = len(&lbody);
    let nr = len(&rbody);
    if content_bytes(&lbody) + content_bytes(&rbody) <= cap {
        move_refs(b, &rbody, 0..nr, r, l);
        let empty = empty_like(&rbody);
        let mut all = lbody;
        append(&mut all, rbody);
        b.node_mut(l)?.body = all;
        b.node_mut(r)?.body = empty;
        ptr_mut(b, parent)?.remove(rs);
        b.block_ref(r, Holder::Parent(parent), -1);
        return sync_key(b, parent, ls);
    }
    let mut all = lbody;
    append(&mut all, rbody);
    let cut = best_two_way_cut(&entry_sizes(&all), cap)
        .ok_or_else(|| Error::corrupt(l, "siblings cannot be redistributed"))?;
    let right = split_off(&mut all, cut);
    // Entries that changed block: [cut, nl) went right, or [nl, cut) went left.
    if cut < nl {
        move_refs(b, &right, 0..nl - cut, l, r);
    } else if cut > nl {
        move_refs(b, &all, nl..cut, r, l);
    }
    debug_assert_eq!(len(&all) + len(&right), nl + nr);
    b.node_mut(l)?.body = all;
    b.node_mut(r)?.body = right;
    sync_key(b, parent, ls)?;
    sync_key(b, parent, rs)
}

/// Free bytes of child `slot` of `parent`, if entries may be shifted into
/// it: a block of a tree that snapshots may share only when this
/// transaction already made it writable, so that keeping blocks full never
/// unshares one.
fn sibling_room<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<Option<usize>> {
    let ptr = ptr_mut(b, parent)?[slot];
    if crate::format::tree_id::is_shareable(owner) && !b.is_writable(ptr.bytenr) {
        return Ok(None);
    }
    let cap = b.nodesize() - HEADER_SIZE;
    let level = b.node_mut(parent)?.level;
    let node = super::read_child(b, &ptr, level)?;
    Ok(Some(cap.saturating_sub(content_bytes(&node.body))))
}

/// How many entries, taken in order from `sizes`, to shift into a
/// neighbour with `room` free bytes: at least `need` bytes (the overflow),
/// and otherwise about half the difference in fill (`excess`), so both
/// blocks keep room for later inserts; always leaving one entry behind.
/// None when `room` cannot take enough.
fn shift_count(
    sizes: impl Iterator<Item = usize>,
    count: usize,
    room: usize,
    need: usize,
    excess: usize,
) -> Option<usize> {
    let want = need.max(excess / 2);
    let mut taken = 0;
    let mut k = 0;
    for s in sizes.take(count.saturating_sub(1)) {
        if taken >= want || taken + s > room {
            break;
        }
        taken += s;
        k += 1;
    }
    (k > 0 && taken >= need).then_some(k)
}

/// Moves the first `k` entries of block `from` to the end of its left
/// neighbour `to` (both writable), references included. Returns how many
/// entries `from` keeps.
pub(super) fn move_leading<B: BlockWrite + ?Sized>(
    b: &mut B,
    from: u64,
    to: u64,
    k: usize,
) -> Result<usize> {
    let mut moved = std::mem::replace(&mut b.node_mut(from)?.body, Body::Leaf(Leaf::new()));
    let kept = split_off(&mut moved, k);
    move_refs(b, &moved, 0..k, from, to);
    append(&mut b.node_mut(to)?.body, moved);
    let left = len(&kept);
    b.node_mut(from)?.body = kept;
    Ok(left)
}

/// Makes the overflowing child `slot` of `parent` fit by shifting its first
/// entries into its left neighbour or its last ones into its right one,
/// evening out the two. Ascending inserts (new extents, new inodes)
/// then fill blocks instead of leaving a half-full block behind every
/// split. Returns false when no neighbour has room for enough.
fn shift_to_sibling<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<bool> {
    let cap = b.nodesize() - HEADER_SIZE;
    let child = ptr_mut(b, parent)?[slot].bytenr;
    let sizes = entry_sizes(&b.node_mut(child)?.body);
    let total: usize = sizes.iter().sum();
    let need = total.saturating_sub(cap);
    let siblings = ptr_mut(b, parent)?.len();
    if slot > 0 {
        if let Some(room) = sibling_room(b, owner, parent, slot - 1)? {
            let excess = (total + room).saturating_sub(cap);
            if let Some(k) = shift_count(sizes.iter().copied(), sizes.len(), room, need, excess) {
                let left = cow_child(b, owner, parent, slot - 1)?;
                move_leading(b, child, left, k)?;
                sync_key(b, parent, slot)?;
                return Ok(true);
            }
        }
    }
    if slot + 1 < siblings {
        if let Some(room) = sibling_room(b, owner, parent, slot + 1)? {
            let excess = (total + room).saturating_sub(cap);
            if let Some(k) =
                shift_count(sizes.iter().rev().copied(), sizes.len(), room, need, excess)
            {
                let right = cow_child(b, owner, parent, slot + 1)?;
                let moved = split_off(&mut b.node_mut(child)?.body, sizes.len() - k);
                move_refs(b, &moved, 0..k, child, right);
                let old = std::mem::replace(&mut b.node_mut(right)?.body, Body::Leaf(Leaf::new()));
                let mut all = moved;
                append(&mut all, old);
                b.node_mut(right)?.body = all;
                sync_key(b, parent, slot + 1)?;
                sync_key(b, parent, slot)?;
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Restores the invariants along `path` (root first) after blocks on it
/// changed: every level is checked.
pub(crate) fn fix_up<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    path: &[Step],
) -> Result<()> {
    fix_path(b, owner, root, path, false)
}

/// Restores the invariants along `path` (root first) after a change to
/// its leaf alone. Stops at the first level that neither split, shifted
/// nor merged and whose first key stayed: nothing above it changed. Most
/// edits end at the leaf's parent instead of walking up to the root.
pub(crate) fn fix_up_leaf<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    path: &[Step],
) -> Result<()> {
    fix_path(b, owner, root, path, true)
}

fn fix_path<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    path: &[Step],
    stop_early: bool,
) -> Result<()> {
    let cap = b.nodesize() - HEADER_SIZE;
    for d in (1..path.len()).rev() {
        let parent = path[d - 1].bytenr;
        let slot = path[d - 1].slot;
        let content = content_bytes(&b.node_mut(path[d].bytenr)?.body);
        if content > cap {
            if !shift_to_sibling(b, owner, parent, slot)? {
                split_child(b, owner, parent, slot)?;
            }
        } else if content < cap / 4 {
            merge_child(b, owner, parent, slot)?;
        } else {
            let changed = sync_key_changed(b, parent, slot)?;
            // The parent's size is the same, and its own first key moved
            // only if this was its first child.
            if stop_early && !(changed && slot == 0) {
                break;
            }
        }
    }
    fix_root(b, owner, root)
}

/// Grows the tree when the root overflows and shrinks it while the root is
/// an internal node with one child.
fn fix_root<B: BlockWrite + ?Sized>(b: &mut B, owner: u64, root: &mut RootPtr) -> Result<()> {
    let cap = b.nodesize() - HEADER_SIZE;
    while b.is_writable(root.bytenr) {
        let node = b.node_mut(root.bytenr)?;
        let content = content_bytes(&node.body);
        let level = node.level;
        if content > cap {
            let key = node
                .first_key()
                .ok_or_else(|| Error::corrupt(root.bytenr, "overflowing empty root"))?;
            let new = b.alloc_node(owner, level + 1, root.bytenr)?;
            b.node_mut(new)?.body = Body::Internal(vec![Ptr {
                key,
                bytenr: root.bytenr,
                generation: root.generation,
            }]);
            b.block_ref(root.bytenr, Holder::Root(owner), -1);
            b.block_ref(root.bytenr, Holder::Parent(new), 1);
            b.block_ref(new, Holder::Root(owner), 1);
            *root = RootPtr {
                bytenr: new,
                generation: b.transid(),
                level: level + 1,
            };
            split_child(b, owner, new, 0)?;
        } else if level > 0 && node.nritems() == 1 {
            let old = root.bytenr;
            let Body::Internal(ptrs) =
                std::mem::replace(&mut node.body, Body::Internal(Vec::new()))
            else {
                return Err(Error::corrupt(old, "internal root without pointers"));
            };
            let child = ptrs[0];
            b.block_ref(child.bytenr, Holder::Parent(old), -1);
            b.block_ref(child.bytenr, Holder::Root(owner), 1);
            b.block_ref(old, Holder::Root(owner), -1);
            *root = RootPtr {
                bytenr: child.bytenr,
                generation: child.generation,
                level: level - 1,
            };
        } else {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_fits_and_balances() {
        let sizes = vec![100; 50];
        let cuts = partition(&sizes, 3000);
        assert_eq!(cuts, vec![25]);
        let big = vec![2000, 2000, 2000, 10];
        let cuts = partition(&big, 3000);
        assert_eq!(cuts.len(), 2);
    }

    #[test]
    fn two_way_cut_is_balanced() {
        assert_eq!(best_two_way_cut(&[10, 10, 10, 10], 30), Some(2));
        assert_eq!(best_two_way_cut(&[30, 30], 20), None);
    }
}
