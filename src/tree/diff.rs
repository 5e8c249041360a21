//! Comparing two trees that share blocks (snapshots of one subvolume): a
//! block both hold is skipped whole, so the work grows with what differs,
//! not with the trees. Blocks are copied on write, so an address both
//! trees reach is the same contents in both.

use super::{child_slot, read_child, BlockRead, RootPtr};
use crate::error::Result;
use crate::format::Key;

/// Calls `f` with the key of every item that differs between the trees:
/// present in one only, or present in both with other data. Keys may come
/// more than once and in no particular order.
pub fn differing_keys<B: BlockRead + ?Sized>(
    b: &B,
    left: &RootPtr,
    right: &RootPtr,
    f: &mut dyn FnMut(&Key),
) -> Result<()> {
    one_way(b, left, right, f)?;
    one_way(b, right, left, f)
}

/// Keys of items in blocks of `from` that `other` does not hold, whose
/// item `other` lacks or holds with other data.
fn one_way<B: BlockRead + ?Sized>(
    b: &B,
    from: &RootPtr,
    other: &RootPtr,
    f: &mut dyn FnMut(&Key),
) -> Result<()> {
    if from.bytenr == other.bytenr {
        return Ok(());
    }
    let mut stack = vec![b.read_node(from.bytenr, from.generation)?];
    while let Some(node) = stack.pop() {
        if node.is_leaf() {
            for it in node.items() {
                if super::get(b, other, &it.key)?.as_deref() != Some(it.data) {
                    f(&it.key);
                }
            }
            continue;
        }
        for p in node.ptrs() {
            if !holds(b, other, &p.key, p.bytenr, node.level - 1)? {
                stack.push(read_child(b, p, node.level)?);
            }
        }
    }
    Ok(())
}

/// Whether the tree at `root` holds block `bytenr` at `level` on the path
/// to `key` (where it would have to be, if it holds it).
fn holds<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    key: &Key,
    bytenr: u64,
    level: u8,
) -> Result<bool> {
    if root.bytenr == bytenr {
        return Ok(true);
    }
    if root.level <= level {
        return Ok(false);
    }
    let mut node = b.read_node(root.bytenr, root.generation)?;
    loop {
        let ptrs = node.ptrs();
        let p = &ptrs[child_slot(ptrs, key)];
        if p.bytenr == bytenr {
            return Ok(true);
        }
        if node.level - 1 <= level {
            return Ok(false);
        }
        node = read_child(b, p, node.level)?;
    }
}
