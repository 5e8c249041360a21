//! Reference counts and back-references of tree blocks and data extents.
//!
//! During a transaction the tree layer reports every pointer it adds or
//! removes as a +1/-1 for a *holder* (a parent block, a tree's root item, or
//! a leaf holding file extent items). These *delayed references* collect in
//! the transaction's queue (`txn::refs`), where opposite changes for the
//! same holder cancel. [`apply`] folds them into the extent tree, early
//! when many are pending and at every commit (the transaction calls it
//! through [`Extents`], its [`Mechanism`]):
//!
//! - `(bytenr, EXTENT_ITEM, length)` carries the total count, the generation
//!   and, for tree blocks, level and allocating tree;
//! - one back-reference item per holder: `SHARED_BLOCK_REF` (parent block),
//!   `TREE_BLOCK_REF` (tree whose root it is), `SHARED_DATA_REF` (leaf, with
//!   the number of its items pointing here).
//!
//! When a count reaches zero the extent is freed; a freed tree block in turn
//! releases everything it points at, so dropping a clone or snapshot frees
//! exactly the blocks nothing else holds, and copying a shared block never
//! unshares its children.

pub mod apply;
mod backrefs;
pub mod drop;

pub use backrefs::{backrefs, check_climb, for_each_backref};

use crate::error::Result;
use crate::format::superblock::{Superblock, INCOMPAT_DROP_QUEUE};
use crate::format::tree_id::ROOT;
use crate::txn::{Mechanism, Reader, Slots, Txn};
use drop::DropState;

/// The extent mechanism at the transaction's fixed points: it folds the
/// reference changes, and keeps the drop queue's counters ([`DropState`]).
pub struct Extents;

impl Mechanism for Extents {
    fn open(&self, r: &Reader<'_>, slots: &mut Slots) -> Result<()> {
        let queued = drop::count_queued(r, &r.root(ROOT)?)?;
        slots.set(DropState::new(queued));
        Ok(())
    }

    fn settle(&self, tx: &mut Txn<'_>) -> Result<bool> {
        apply::run(tx)
    }

    /// The superblock says whether drops are queued (an older version
    /// must not mount an image whose space the queue holds), and the
    /// next transaction starts without a drop budget.
    fn sealed(&self, slots: &mut Slots, sb: &mut Superblock) {
        let drops = slots.entry::<DropState>();
        sb.incompat = if drops.queued() > 0 {
            sb.incompat | INCOMPAT_DROP_QUEUE
        } else {
            sb.incompat & !INCOMPAT_DROP_QUEUE
        };
        drops.start_transaction();
    }

    fn commit_entries(&self, slots: &Slots, max_entries_per_block: u64) -> u64 {
        slots
            .get::<DropState>()
            .map_or(0, |d| d.commit_work(max_entries_per_block))
    }

    fn tree_dropped(&self, tx: &mut Txn<'_>, id: u64) -> Result<()> {
        drop::note_tree_dropped(tx, id);
        Ok(())
    }
}
