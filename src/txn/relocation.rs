//! What the transaction exposes to balance and to the quota accounting
//! about blocks and extents that moved, and about the last commit.
//!
//! Balance copies tree blocks and data extents to other places and
//! repoints their holders. The transaction must know which blocks are
//! such copies (balance may change them in place, ordinary changes must
//! copy them), where balance's next step looks, and which extents moved:
//! their reference changes are a copy's, which the quota accounting
//! leaves out. These methods are the only way code outside `txn` reaches
//! those fields.

use super::refs::PendingExtent;
use super::Txn;
use crate::format::node::Node;
use crate::tree::RootPtr;
use std::collections::BTreeMap;
use std::sync::Arc;

/// An extent balance moved in this transaction.
#[derive(Clone, Copy, Debug)]
pub struct Relocation {
    pub from: u64,
    pub to: u64,
    pub len: u64,
    pub data: bool,
}

impl Txn<'_> {
    /// Where balance's next step looks in its group: extents below it
    /// were moved in this transaction (0: the group's start).
    pub fn relocate_cursor(&self) -> u64 {
        self.st.relocate_cursor
    }

    pub(crate) fn set_relocate_cursor(&mut self, at: u64) {
        self.st.relocate_cursor = at;
    }

    /// Records that tree block `copy` is balance's copy of `original`:
    /// balance may change it in place, ordinary changes must copy it
    /// (other trees may share it).
    pub(crate) fn adopt_relocated_block(&mut self, original: u64, copy: u64) {
        self.st.frozen.insert(copy);
        self.st.relocated.insert(copy);
        self.st.changes += 1;
        let len = self.sh.nodesize as u64;
        self.note_relocation(Relocation {
            from: original,
            to: copy,
            len,
            data: false,
        });
    }

    /// Whether `bytenr` is a tree block balance copied in this
    /// transaction.
    pub fn is_relocated(&self, bytenr: u64) -> bool {
        self.st.relocated.contains(&bytenr)
    }

    /// Records an extent balance moved (for the quota accounting).
    pub(crate) fn note_relocation(&mut self, r: Relocation) {
        self.st.relocations.push(r);
    }

    /// Counts a change made outside the tree and allocator calls (which
    /// count their own), so a failed operation knows it changed something.
    pub(crate) fn note_change(&mut self) {
        self.st.changes += 1;
    }

    /// The extents moved since the last call (the commit's accounting
    /// takes them once).
    pub(crate) fn take_relocations(&mut self) -> Vec<Relocation> {
        std::mem::take(&mut self.st.relocations)
    }

    /// Runs `f` with the reference changes it makes marked as a copy's:
    /// the holder moved, what it reaches did not.
    pub(crate) fn as_copy<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.st.refs.set_copying(true);
        let out = f(self);
        self.st.refs.set_copying(false);
        out
    }

    /// Reference changes pending for the extent at `bytenr`.
    pub fn pending_refs(&self, bytenr: u64) -> Option<&PendingExtent> {
        self.st.refs.pending(bytenr)
    }

    /// The tree block at `bytenr` if it is dirty in this transaction.
    pub fn dirty_block(&self, bytenr: u64) -> Option<Arc<Node>> {
        self.st.dirty.get(&bytenr).cloned()
    }

    /// Points tree `id` at the block `ptr` (its root item is rewritten at
    /// commit).
    pub(crate) fn set_root(&mut self, id: u64, ptr: RootPtr) {
        self.st.set_root(id, ptr);
    }

    /// Every tree's root as the last prepared commit has it.
    pub fn committed_roots(&self) -> &BTreeMap<u64, RootPtr> {
        &self.st.committed
    }
}
