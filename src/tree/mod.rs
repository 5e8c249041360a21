//! The copy-on-write B+tree.
//!
//! Blocks written in an earlier transaction are never modified: a change
//! copies every block on the path from the root to the leaf ("COW"), and the
//! copies are modified in memory until the transaction commits. A block is
//! modified in place only while it is dirty in the running transaction and
//! not *frozen* (shared with a clone made in this same transaction).
//!
//! The tree does not own storage or reference counts. It works through two
//! traits: [`BlockRead`] (read a block by address, checked against the
//! generation its parent recorded) and [`BlockWrite`] (allocate a dirty block,
//! modify a dirty block, and record reference changes). References are
//! counted per holder: a child block is held by each parent node that points
//! at it and a root block by each tree whose root it is; a data extent is held
//! by each leaf whose file extent items point at it. Every change of a pointer
//! reports +1/-1 for the holder, and the extent layer turns those into counts
//! at commit. A copy of a block therefore adds a reference to each of its
//! children; the original releases its own when its count reaches zero. That
//! one rule gives snapshots for free: cloning a tree adds one reference to its
//! root, and shared blocks stay shared until one side modifies them.
//!
//! Modules: `search` (read-only lookup and cursors), `cow` (copying a path
//! for modification), `mutate` (insert, update, delete), `rebalance`
//! (split, merge, redistribute, root growth and shrink).

mod cow;
mod diff;
mod mutate;
mod rebalance;
mod repack;
mod search;

pub use diff::differing_keys;
pub use mutate::{delete, delete_sorted, insert, put, update};
pub use repack::repack_leaves;
pub use search::{
    block_addresses, count_blocks, get, get_many_with, get_with, prefetch_leaves, Cursor,
};

use crate::error::{Error, Result};
use crate::format::node::{Body, Node, Ptr, HEADER_SIZE, ITEM_HEADER_SIZE};
use crate::format::Key;
use std::sync::Arc;

/// Where a tree's root is: the block, its generation and its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootPtr {
    pub bytenr: u64,
    pub generation: u64,
    pub level: u8,
}

/// Who holds a reference to a tree block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    /// A parent node at this address points at the block.
    Parent(u64),
    /// The tree with this id has the block as its root.
    Root(u64),
}

pub trait BlockRead {
    /// The block at `bytenr`, whose header must carry `generation`.
    fn read_node(&self, bytenr: u64, generation: u64) -> Result<Arc<Node>>;
    fn nodesize(&self) -> usize;
    /// What the item checker compares items against (the device's size).
    fn item_limits(&self) -> crate::format::checker::Limits;
    /// Hints that these blocks will be read soon (readahead); may do
    /// nothing.
    fn prefetch(&self, _bytenrs: &[u64]) {}
    /// The block at `bytenr` if it is in memory, without a generation to
    /// check it against: for a caller that can tell which block an
    /// address names without one (see `qgroup::roots`) and wants its
    /// header without searching the extent tree for its generation.
    /// May always answer `None`.
    fn node_in_memory(&self, _bytenr: u64) -> Option<Arc<Node>> {
        None
    }
}

pub trait BlockWrite: BlockRead {
    fn transid(&self) -> u64;
    /// True when the block is dirty in this transaction and not frozen.
    fn is_writable(&self, bytenr: u64) -> bool;
    /// The dirty block at `bytenr` for modification.
    fn node_mut(&mut self, bytenr: u64) -> Result<&mut Node>;
    /// Allocates a new empty dirty block near `hint`.
    fn alloc_node(&mut self, owner: u64, level: u8, hint: u64) -> Result<u64>;
    /// Records that `holder` gained (+1) or lost (-1) a pointer to `child`.
    fn block_ref(&mut self, child: u64, holder: Holder, delta: i64);
    /// Records that `leaf` gained or lost an item pointing at a data extent.
    fn data_ref(&mut self, bytenr: u64, len: u64, leaf: u64, delta: i64);
    /// Marks the reference changes reported until [`BlockWrite::end_copy`]
    /// as those of a copy of block `original`: the copy holds what the
    /// original held, so no tree gains or loses a way to reach those
    /// children (quota accounting need not look at them).
    fn begin_copy(&mut self, _original: u64) {}
    fn end_copy(&mut self) {}
    /// Whether the blocks of tree `owner` hold references to what they
    /// point at (all but the log's, whose blocks the commit frees as a set).
    fn holds_refs(&self, _owner: u64) -> bool {
        true
    }
    /// Drops block `bytenr` of a tree whose blocks hold no references from
    /// memory as it is being replaced by a copy: no search reaches it
    /// again, so the copy may take its body rather than clone it.
    fn forget_replaced(&mut self, _bytenr: u64) {}
}

/// Largest item payload a leaf can hold.
pub fn max_item_size(nodesize: usize) -> usize {
    nodesize - HEADER_SIZE - ITEM_HEADER_SIZE
}

/// Reads the child behind `ptr` of a node at `parent_level` and checks that
/// it is the block the parent meant.
pub(crate) fn read_child<B: BlockRead + ?Sized>(
    b: &B,
    ptr: &Ptr,
    parent_level: u8,
) -> Result<Arc<Node>> {
    let child = b.read_node(ptr.bytenr, ptr.generation)?;
    if child.level + 1 != parent_level {
        return Err(Error::corrupt(
            ptr.bytenr,
            format!("level {} under a level {parent_level} node", child.level),
        ));
    }
    if child.first_key() != Some(ptr.key) {
        return Err(Error::corrupt(
            ptr.bytenr,
            format!(
                "first key {:?} differs from parent's key {}",
                child.first_key(),
                ptr.key
            ),
        ));
    }
    Ok(child)
}

/// The slot of the pointer to follow for `key` in an internal node.
pub(crate) fn child_slot(ptrs: &[Ptr], key: &Key) -> usize {
    match ptrs.binary_search_by(|p| p.key.cmp(key)) {
        Ok(i) => i,
        Err(0) => 0,
        Err(i) => i - 1,
    }
}

/// A reference a block's entry holds.
pub(crate) enum EntryRef {
    Block(u64),
    Data(u64, u64),
}

/// Calls `f` for every reference held by entries `range` of `body`.
pub(crate) fn entry_refs(body: &Body, range: std::ops::Range<usize>, mut f: impl FnMut(EntryRef)) {
    match body {
        Body::Internal(ptrs) => ptrs[range]
            .iter()
            .for_each(|p| f(EntryRef::Block(p.bytenr))),
        Body::Leaf(items) => {
            for it in items.range(range) {
                if let Some((bytenr, len)) = crate::format::items::data_ref_of(&it.key, it.data) {
                    f(EntryRef::Data(bytenr, len));
                }
            }
        }
    }
}

/// Records `delta` for every reference held by entries `range` of the block
/// `holder` (whose body is `body`).
pub(crate) fn count_entry_refs<B: BlockWrite + ?Sized>(
    b: &mut B,
    body: &Body,
    range: std::ops::Range<usize>,
    holder: u64,
    delta: i64,
) {
    entry_refs(body, range, |r| match r {
        EntryRef::Block(child) => b.block_ref(child, Holder::Parent(holder), delta),
        EntryRef::Data(bytenr, len) => b.data_ref(bytenr, len, holder, delta),
    });
}

/// Creates an empty tree (one empty leaf) owned by `owner`.
pub fn create<B: BlockWrite + ?Sized>(b: &mut B, owner: u64, hint: u64) -> Result<RootPtr> {
    let bytenr = b.alloc_node(owner, 0, hint)?;
    b.block_ref(bytenr, Holder::Root(owner), 1);
    Ok(RootPtr {
        bytenr,
        generation: b.transid(),
        level: 0,
    })
}
