//! Reference counts and back-references of tree blocks and data extents.
//!
//! During a transaction the tree layer reports every pointer it adds or
//! removes as a +1/-1 for a *holder* (a parent block, a tree's root item, or
//! a leaf holding file extent items). These *delayed references* collect in
//! [`DelayedRefs`], where opposite changes for the same holder cancel. At
//! commit, [`apply`] folds them into the extent tree:
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
mod delayed;
pub mod drop;

pub use backrefs::{backrefs, check_climb, for_each_backref};
pub use delayed::{DelayedRefs, ExtentKind, PendingExtent, RefHolder};
