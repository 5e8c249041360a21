//! The reference changes a transaction collects.
//!
//! The tree layer reports every pointer it adds or removes as +1/-1 for a
//! holder (`BlockWrite`); the transaction records them here, where opposite
//! changes for the same holder cancel. Folding them into the extent tree
//! is the extent mechanism's work (`extent::apply`), which the commit calls
//! through [`super::Mechanism::settle`]: the queue is the transaction's,
//! the counts are the extent tree's.

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

    /// No changes yet, for an extent of `len` bytes.
    fn empty(len: u64) -> PendingExtent {
        PendingExtent {
            len,
            new_kind: None,
            refs: BTreeMap::new(),
            traced: false,
        }
    }

    /// Adds the changes of `more`, collected later for the same extent.
    pub fn absorb(&mut self, more: PendingExtent) {
        self.traced |= more.traced;
        self.new_kind = self.new_kind.or(more.new_kind);
        for (holder, delta) in more.refs {
            let v = self.refs.entry(holder).or_insert(0);
            *v += delta;
            if *v == 0 {
                self.refs.remove(&holder);
            }
        }
    }
}

/// Adds `more` to the pending changes of `bytenr` in `map`.
pub fn merge_pending(map: &mut BTreeMap<u64, PendingExtent>, bytenr: u64, more: PendingExtent) {
    match map.get_mut(&bytenr) {
        Some(have) => have.absorb(more),
        None => {
            map.insert(bytenr, more);
        }
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
    /// Extents allocated in this transaction. Kept apart from the pending
    /// changes, which a fold before the commit takes (`extent::apply`).
    made: HashSet<u64>,
    /// Pending changes of held extents (see [`DelayedRefs::hold`]).
    held: BTreeMap<u64, PendingExtent>,
}

impl DelayedRefs {
    fn entry(&mut self, bytenr: u64, len: u64) -> &mut PendingExtent {
        let map = if self.held.contains_key(&bytenr) {
            &mut self.held
        } else {
            &mut self.map
        };
        map.entry(bytenr)
            .or_insert_with(|| PendingExtent::empty(len))
    }

    /// Registers an extent allocated in this transaction.
    pub fn new_extent(&mut self, bytenr: u64, len: u64, kind: ExtentKind) {
        self.entry(bytenr, len).new_kind = Some(kind);
        self.made.insert(bytenr);
    }

    /// True when the extent was allocated in this transaction (whether or
    /// not its extent item was folded in already).
    pub fn is_new(&self, bytenr: u64) -> bool {
        self.made.contains(&bytenr)
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

    /// The transaction ended: its copies and the extents it made are
    /// history.
    pub fn end_transaction(&mut self) {
        self.copied.clear();
        self.made.clear();
    }

    /// The pending changes of the extent at `bytenr`.
    pub fn pending(&self, bytenr: u64) -> Option<&PendingExtent> {
        self.map.get(&bytenr).or_else(|| self.held.get(&bytenr))
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.held.is_empty()
    }

    /// Number of extents with pending changes that [`DelayedRefs::take`]
    /// would take.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Takes everything collected so far, except the held extents'.
    pub fn take(&mut self) -> BTreeMap<u64, PendingExtent> {
        std::mem::take(&mut self.map)
    }

    /// Holds back the changes of the new extent at `bytenr` from
    /// [`DelayedRefs::take`] until [`DelayedRefs::release`]: a flush's
    /// extent is allocated in one short transaction and referenced in a
    /// later one, and folded in between it would be freed.
    pub fn hold(&mut self, bytenr: u64, len: u64) {
        let p = self
            .map
            .remove(&bytenr)
            .unwrap_or_else(|| PendingExtent::empty(len));
        self.held.insert(bytenr, p);
    }

    /// Ends [`DelayedRefs::hold`] of `bytenr`: its changes may be folded.
    pub fn release(&mut self, bytenr: u64) {
        if let Some(p) = self.held.remove(&bytenr) {
            merge_pending(&mut self.map, bytenr, p);
        }
    }

    /// Ends every hold (the commit folds everything).
    pub fn release_all(&mut self) {
        for (bytenr, p) in std::mem::take(&mut self.held) {
            merge_pending(&mut self.map, bytenr, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held extent's changes, made before or during the hold, are not
    /// taken until it is released, and stay new meanwhile and after.
    #[test]
    fn held_changes_wait_for_their_release() {
        let mut r = DelayedRefs::default();
        r.new_extent(4096, 4096, ExtentKind::Data);
        r.hold(4096, 4096);
        r.add(4096, 4096, RefHolder::DataLeaf(7), 1);
        r.new_extent(8192, 4096, ExtentKind::Data);
        assert_eq!(r.len(), 1);
        assert!(r.pending(4096).is_some());
        let taken = r.take();
        assert_eq!(taken.keys().copied().collect::<Vec<_>>(), vec![8192]);
        assert!(!r.is_empty(), "the held extent is still pending");
        assert!(
            r.is_new(4096) && r.is_new(8192),
            "folded or not, both are new"
        );
        r.add(4096, 4096, RefHolder::DataLeaf(9), 1);
        r.release(4096);
        let taken = r.take();
        let p = &taken[&4096];
        assert_eq!(p.new_kind, Some(ExtentKind::Data));
        assert_eq!(p.net(), 2);
        assert!(r.is_empty());
        r.end_transaction();
        assert!(!r.is_new(4096));
    }
}
