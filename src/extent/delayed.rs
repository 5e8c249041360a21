//! Reference changes collected during a transaction.

use std::collections::{BTreeMap, HashSet};

/// Who holds a reference, as recorded in a back-reference item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefHolder {
    /// A parent node points at this tree block.
    TreeParent(u64),
    /// This tree block is the root of the tree with this id.
    TreeRoot(u64),
    /// File extent items of this leaf point at this data extent.
    DataLeaf(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentKind {
    Tree { owner: u64, level: u8 },
    Data,
}

/// Pending changes for one extent.
#[derive(Clone, Debug)]
pub struct PendingExtent {
    pub len: u64,
    /// Set when the extent was allocated in this transaction (it has no
    /// extent item yet).
    pub new_kind: Option<ExtentKind>,
    pub refs: BTreeMap<RefHolder, i64>,
    /// Some change came from something other than a block copy, so the
    /// set of trees reaching the extent may have changed (see `qgroup`).
    pub traced: bool,
}

impl PendingExtent {
    /// Sum of all changes.
    pub fn net(&self) -> i64 {
        self.refs.values().sum()
    }
}

#[derive(Default)]
pub struct DelayedRefs {
    map: BTreeMap<u64, PendingExtent>,
    /// Changes reported now are a block copy's (`BlockWrite::begin_copy`).
    copying: bool,
    /// Blocks copied in this transaction: when one is released, its
    /// children only move from it to its copies.
    copied: HashSet<u64>,
}

impl DelayedRefs {
    fn entry(&mut self, bytenr: u64, len: u64) -> &mut PendingExtent {
        self.map.entry(bytenr).or_insert_with(|| PendingExtent {
            len,
            new_kind: None,
            refs: BTreeMap::new(),
            traced: false,
        })
    }

    /// Registers an extent allocated in this transaction.
    pub fn new_extent(&mut self, bytenr: u64, len: u64, kind: ExtentKind) {
        self.entry(bytenr, len).new_kind = Some(kind);
    }

    /// True when the extent was allocated in this transaction and its
    /// allocation is still pending.
    pub fn is_new(&self, bytenr: u64) -> bool {
        self.map.get(&bytenr).is_some_and(|p| p.new_kind.is_some())
    }

    pub fn add(&mut self, bytenr: u64, len: u64, holder: RefHolder, delta: i64) {
        let copying = self.copying;
        let e = self.entry(bytenr, len);
        e.traced |= !copying;
        let v = e.refs.entry(holder).or_insert(0);
        *v += delta;
        if *v == 0 {
            e.refs.remove(&holder);
        }
    }

    /// See `BlockWrite::begin_copy`.
    pub fn set_copying(&mut self, on: bool) {
        self.copying = on;
    }

    pub fn note_copied(&mut self, original: u64) {
        self.copied.insert(original);
    }

    /// Whether the block at `bytenr` was copied in this transaction.
    pub fn was_copied(&self, bytenr: u64) -> bool {
        self.copied.contains(&bytenr)
    }

    /// The transaction ended: its copies are history.
    pub fn forget_copies(&mut self) {
        self.copied.clear();
    }

    /// The pending changes of the extent at `bytenr`.
    pub fn pending(&self, bytenr: u64) -> Option<&PendingExtent> {
        self.map.get(&bytenr)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of extents with pending changes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Takes everything collected so far.
    pub fn take(&mut self) -> BTreeMap<u64, PendingExtent> {
        std::mem::take(&mut self.map)
    }
}
