//! Copying blocks for modification.

use super::{child_slot, count_entry_refs, read_child, BlockWrite, Holder, RootPtr};
use crate::error::Result;
use crate::format::Key;
use std::sync::Arc;

/// One step of a writable path: a dirty block and the slot taken in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    pub bytenr: u64,
    pub slot: usize,
}

/// Entries a copied block can gain before its vector grows (a copy is
/// made to be changed, most often by one insert).
const COPY_ROOM: usize = 8;

/// Copies the clean block `bytenr` into a new dirty block owned by `owner`,
/// allocated near `hint`. The copy holds a new reference to everything
/// the original points at.
pub(crate) fn cow_block<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    bytenr: u64,
    generation: u64,
    hint: u64,
) -> Result<u64> {
    let old = b.read_node(bytenr, generation)?;
    let new = b.alloc_node(owner, old.level, hint)?;
    let body = if b.holds_refs(owner) {
        b.begin_copy(bytenr);
        count_entry_refs(b, &old.body, 0..old.nritems(), new, 1);
        b.end_copy();
        old.body.clone_with_room(COPY_ROOM)
    } else {
        // fsync copies the log's path after every write of it: moving the
        // items saves cloning (and then freeing) each one.
        b.forget_replaced(bytenr);
        Arc::try_unwrap(old).map_or_else(
            |shared| shared.body.clone_with_room(COPY_ROOM),
            |node| node.body,
        )
    };
    b.node_mut(new)?.body = body;
    Ok(new)
}

/// Makes the root writable, copying it if needed.
pub(crate) fn cow_root<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
) -> Result<()> {
    if b.is_writable(root.bytenr) {
        return Ok(());
    }
    let new = cow_block(b, owner, root.bytenr, root.generation, root.bytenr)?;
    b.block_ref(new, Holder::Root(owner), 1);
    b.block_ref(root.bytenr, Holder::Root(owner), -1);
    root.bytenr = new;
    root.generation = b.transid();
    Ok(())
}

/// Makes child `slot` of the dirty node `parent` writable, copying it if
/// needed and repointing the parent. Returns the child's address.
pub(crate) fn cow_child<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    parent: u64,
    slot: usize,
) -> Result<u64> {
    let node = b.node_mut(parent)?;
    let level = node.level;
    let ptr = node.ptrs()[slot];
    if b.is_writable(ptr.bytenr) {
        return Ok(ptr.bytenr);
    }
    // Check the child really is the block meant before copying it.
    read_child(b, &ptr, level)?;
    // Near its parent (copied already): a path read from the root down
    // goes forward on the device.
    let new = cow_block(b, owner, ptr.bytenr, ptr.generation, parent)?;
    let transid = b.transid();
    if let crate::format::node::Body::Internal(ptrs) = &mut b.node_mut(parent)?.body {
        ptrs[slot].bytenr = new;
        ptrs[slot].generation = transid;
    }
    b.block_ref(new, Holder::Parent(parent), 1);
    b.block_ref(ptr.bytenr, Holder::Parent(parent), -1);
    Ok(new)
}

/// Makes every block from the root to the leaf where `key` belongs writable
/// and returns that path, root first.
pub(crate) fn cow_path<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: &Key,
) -> Result<Vec<Step>> {
    cow_root(b, owner, root)?;
    let mut path = Vec::with_capacity(usize::from(root.level) + 1);
    let mut at = root.bytenr;
    loop {
        let node = b.node_mut(at)?;
        if node.is_leaf() {
            let slot = match node.items().search(key) {
                Ok(i) | Err(i) => i,
            };
            path.push(Step { bytenr: at, slot });
            return Ok(path);
        }
        let slot = child_slot(node.ptrs(), key);
        path.push(Step { bytenr: at, slot });
        at = cow_child(b, owner, at, slot)?;
    }
}
