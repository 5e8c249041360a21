//! The mechanisms above the transaction, as the transaction sees them.
//!
//! Two mechanisms keep state in every transaction and must act at its
//! fixed points: the extent mechanism folds the reference changes into the
//! extent tree and queues dropped trees for the cleaner (`extent`), and the
//! quota groups check limits, hold reservations and account each commit
//! (`qgroup`). Both are built on [`Txn`], so the transaction cannot call
//! them by name without calling upward. Instead it defines what it calls,
//! [`Mechanism`], and keeps each mechanism's state in [`Slots`] without
//! knowing its type; `engine.rs`, above them all, hands the list to
//! [`super::Engine::open_with`]. The calls therefore go one way: `txn`
//! names no module above it (`tests/layers.rs` checks).
//!
//! Every method has a default that does nothing, so a mechanism states
//! only the points it cares about. The engine calls the mechanisms in the
//! order of its list, at each point.

use super::{Reader, Txn};
use crate::error::Result;
use crate::format::superblock::Superblock;
use std::any::Any;

/// What the transaction calls in a mechanism above it.
pub trait Mechanism: Send + Sync {
    /// At open, after the roots are read: loads the mechanism's state into
    /// `slots` from the committed trees.
    fn open(&self, _r: &Reader<'_>, _slots: &mut Slots) -> Result<()> {
        Ok(())
    }

    /// Brings the mechanism's trees up to date with the transaction so far
    /// (folding reference changes): called early by an operation with
    /// many pending changes, and by the commit in rounds until no
    /// mechanism and no index changes anything. True if it changed
    /// anything.
    fn settle(&self, _tx: &mut Txn<'_>) -> Result<bool> {
        Ok(false)
    }

    /// Once per commit, after the first settling: work that reads the
    /// settled trees (quota accounting). True if it changed anything (the
    /// commit settles again).
    fn account(&self, _tx: &mut Txn<'_>) -> Result<bool> {
        Ok(false)
    }

    /// The commit is sealed: `sb` is the superblock it will write, and the
    /// next transaction starts after this call.
    fn sealed(&self, _slots: &mut Slots, _sb: &mut Superblock) {}

    /// Reference changes the mechanism's own work may add at the commit,
    /// beyond those already pending, for reservations (a tree block of
    /// `ns` bytes holds at most `max_entries_per_block`).
    fn commit_entries(&self, _slots: &Slots, _max_entries_per_block: u64) -> u64 {
        0
    }

    /// Tree `id` was created empty.
    fn tree_created(&self, _tx: &mut Txn<'_>, _id: u64) -> Result<()> {
        Ok(())
    }

    /// Tree `dst` was made a clone of `src`.
    fn tree_cloned(&self, _tx: &mut Txn<'_>, _src: u64, _dst: u64) -> Result<()> {
        Ok(())
    }

    /// Tree `id` was dropped: its root's reference is gone.
    fn tree_dropped(&self, _tx: &mut Txn<'_>, _id: u64) -> Result<()> {
        Ok(())
    }

    /// Whether a change adding `referenced` bytes to tree `tree`, of which
    /// `exclusive` are its alone, may go ahead (called by
    /// [`Txn::reserve`] before anything changes).
    fn admit(&self, _slots: &Slots, _tree: u64, _referenced: u64, _exclusive: u64) -> Result<()> {
        Ok(())
    }

    /// `bytes` of buffered data were promised to tree `tree`
    /// ([`Txn::hold_data`]).
    fn data_held(&self, _slots: &mut Slots, _tree: u64, _bytes: u64) {}

    /// A promise of [`Mechanism::data_held`] was kept or dropped.
    fn data_released(&self, _slots: &mut Slots, _tree: u64, _bytes: u64) {}

    /// The extent at `bytenr` had reference changes other than a block
    /// copy's (reported while the references are folded).
    fn extent_changed(
        &self,
        _slots: &mut Slots,
        _bytenr: u64,
        _len: u64,
        _data: bool,
        _owner: u64,
    ) {
    }
}

/// The state mechanisms above the transaction keep in it, one value per
/// type. Guarded by the state lock like the rest of the transaction.
#[derive(Default)]
pub struct Slots(Vec<Box<dyn Any + Send + Sync>>);

impl Slots {
    /// The value of type `T`, if a mechanism put one here.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|b| b.downcast_ref::<T>())
    }

    /// The value of type `T`, made with `T::default()` on first use.
    pub fn entry<T: Any + Send + Sync + Default>(&mut self) -> &mut T {
        let at = match self.position::<T>() {
            Some(at) => at,
            None => {
                self.0.push(Box::new(T::default()));
                self.0.len() - 1
            }
        };
        match self.0[at].downcast_mut::<T>() {
            Some(v) => v,
            None => unreachable!("slot {at} holds the type it was found by"),
        }
    }

    /// Replaces the value of type `T`.
    pub fn set<T: Any + Send + Sync>(&mut self, value: T) {
        match self.position::<T>() {
            Some(at) => self.0[at] = Box::new(value),
            None => self.0.push(Box::new(value)),
        }
    }

    fn position<T: Any>(&self) -> Option<usize> {
        self.0.iter().position(|b| (**b).is::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct Count(u64);

    #[test]
    fn slots_keep_one_value_per_type() {
        let mut s = Slots::default();
        assert!(s.get::<Count>().is_none());
        s.entry::<Count>().0 += 2;
        s.entry::<Count>().0 += 3;
        assert_eq!(s.get::<Count>(), Some(&Count(5)));
        s.set(Count(1));
        s.set(7u32);
        assert_eq!(s.get::<Count>(), Some(&Count(1)));
        assert_eq!(s.get::<u32>(), Some(&7));
    }
}
