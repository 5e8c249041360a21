//! Dropping trees in bounded steps: the drop queue and its cleaner.
//!
//! Dropping a tree takes away its root's reference. A block whose count
//! falls to zero releases everything it points at, and so on down: for a
//! large tree that owns its blocks that cascade visits the whole tree, far
//! too much for one commit, which folds references while holding the state
//! lock. So a cascade that a drop started has a *budget* per transaction.
//! A leaf whose count falls to zero because a dropped tree or another
//! released block of a drop let go of it is released only while the budget
//! lasts; past it, and always for an internal node, the block is
//! *queued*: its extent item goes, and a
//! `(DROP_QUEUE_OBJECTID, DROPPED_BLOCK, bytenr)` item in the root tree
//! keeps its space allocated while it still holds its children's
//! references. [`clean_step`] works through queued blocks in later
//! transactions, each with a fresh budget, until the queue is empty; a
//! block with more references than a budget gives them up in slices, its
//! queue item recording how far it got.
//!
//! Ordinary transactions have no budget: dropping a tree queues its root
//! block and returns. Blocks a dropped tree shared with another tree only
//! lose one reference, so deleting a snapshot costs what it owned alone.
//! The queue is durable, so a drop interrupted by unmount or crash goes on
//! after the next mount.

use crate::error::{Error, Result};
use crate::format::items::{DroppedBlock, ExtentItem};
use crate::format::key_type::DROPPED_BLOCK;
use crate::format::node::Node;
use crate::format::tree_id::ROOT;
use crate::format::{Key, DROP_QUEUE_OBJECTID};
use crate::tree::{BlockRead, BlockWrite, Cursor, RootPtr};
use crate::txn::{Engine, Need, RefHolder, Txn};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Units of work one cleaner transaction may do (see [`refs_in`] and
/// [`BLOCK_COST`]). Each is a few extent-tree or free-space edits at
/// commit, under the state lock: this keeps a commit's hold to a few ms.
pub const STEP_BUDGET: u64 = 256;

/// The running transaction's share of drop work, kept in its slots.
#[derive(Default)]
pub struct DropState {
    /// Holders that let go of their references as part of a drop in this
    /// transaction (a dropped tree's root, released blocks).
    holders: HashSet<RefHolder>,
    /// Units of work the drop may still do in this transaction.
    budget: u64,
    /// Whether this transaction drops or cleans at all.
    active: bool,
    /// Blocks in the queue, as of the running transaction.
    queued: u64,
}

impl Txn<'_> {
    /// The running transaction's [`DropState`].
    pub(crate) fn drop_state(&mut self) -> &mut DropState {
        self.slots_mut().entry()
    }
}

impl Engine {
    /// Tree blocks of dropped trees still waiting for the cleaner.
    pub fn queued_drops(&self) -> u64 {
        self.with_slots(|s| s.get::<DropState>().map_or(0, DropState::queued))
    }
}

impl DropState {
    pub fn new(queued: u64) -> DropState {
        DropState {
            queued,
            ..DropState::default()
        }
    }

    /// A new transaction starts with no budget.
    pub fn start_transaction(&mut self) {
        self.holders.clear();
        self.budget = 0;
        self.active = false;
    }

    /// `holder` let go of its references because of a drop.
    pub fn note_released(&mut self, holder: RefHolder) {
        self.active = true;
        self.holders.insert(holder);
    }

    /// Whether the reference changes `refs` of an extent include one a
    /// drop made (so releasing the extent is part of the cascade).
    pub fn is_drop(&self, refs: &BTreeMap<RefHolder, i64>) -> bool {
        !self.holders.is_empty() && refs.iter().any(|(h, &d)| d < 0 && self.holders.contains(h))
    }

    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// Entries of reference changes the drop work of this transaction may
    /// add at commit, beyond what is already pending (for reservations):
    /// with a budget, the budget overshot by at most one block's entries,
    /// and as many queue items; without, one queue item per holder.
    pub fn commit_work(&self, max_entries_per_block: u64) -> u64 {
        match (self.active, self.budget) {
            (false, _) => 0,
            (true, 0) => self.holders.len() as u64,
            (true, b) => 2 * (b + max_entries_per_block),
        }
    }
}

/// Queue item key of the block at `bytenr`.
fn queue_key(bytenr: u64) -> Key {
    Key::new(DROP_QUEUE_OBJECTID, DROPPED_BLOCK, bytenr)
}

/// Drops tree `id`'s root reference as a drop: what the root block held
/// alone is released by the cleaner, not by this transaction.
pub(crate) fn note_tree_dropped(tx: &mut Txn<'_>, id: u64) {
    tx.drop_state().note_released(RefHolder::TreeRoot(id));
}

/// A tree block whose count reached zero: released now, or queued. In a
/// drop's cascade, internal nodes are always queued (releasing one gives
/// up hundreds of references: the cleaner does that in slices), and
/// leaves are released while the budget lasts. Blocks never committed
/// are always released now (they are few, and nothing on disk holds
/// them).
pub(crate) fn release_or_queue(
    tx: &mut Txn<'_>,
    bytenr: u64,
    item: &ExtentItem,
    from_drop: bool,
) -> Result<()> {
    let never_committed = item.generation == tx.transid();
    if from_drop && !never_committed && (item.level > 0 || tx.drop_state().budget == 0) {
        return enqueue(tx, bytenr, item);
    }
    release_block(tx, bytenr, item, from_drop)
}

fn enqueue(tx: &mut Txn<'_>, bytenr: u64, item: &ExtentItem) -> Result<()> {
    let queued = DroppedBlock {
        generation: item.generation,
        owner: item.owner,
        level: item.level,
        next: 0,
    };
    tx.insert(ROOT, queue_key(bytenr), queued.encode())
        .map_err(|e| match e {
            Error::Exists => Error::corrupt(bytenr, "tree block queued twice for release"),
            e => e,
        })?;
    tx.drop_state().queued += 1;
    Ok(())
}

/// Reads the block released at `bytenr`, checking it is what was
/// recorded.
fn read_released(tx: &Txn<'_>, bytenr: u64, generation: u64, level: u8) -> Result<Arc<Node>> {
    let node = tx.read_node(bytenr, generation)?;
    if node.level != level {
        return Err(Error::corrupt(
            bytenr,
            format!("released as level {level} but is level {}", node.level),
        ));
    }
    Ok(node)
}

/// Frees a tree block and lets go of everything it points at.
fn release_block(tx: &mut Txn<'_>, bytenr: u64, item: &ExtentItem, from_drop: bool) -> Result<()> {
    let node = read_released(tx, bytenr, item.generation, item.level)?;
    if from_drop {
        let cost = BLOCK_COST + refs_in(&node, 0..node.nritems());
        let d = tx.drop_state();
        d.budget = d.budget.saturating_sub(cost);
        d.note_released(RefHolder::TreeParent(bytenr));
    }
    release_children(tx, bytenr, &node, !from_drop);
    free_block(tx, bytenr, item)
}

/// Gives up the references of the block at `bytenr` to what it points
/// at, before its own count is folded (see `apply::run`); the fold then
/// only frees it ([`free_block`]).
pub(crate) fn give_up_children(tx: &mut Txn<'_>, bytenr: u64, item: &ExtentItem) -> Result<()> {
    let node = read_released(tx, bytenr, item.generation, item.level)?;
    release_children(tx, bytenr, &node, true);
    Ok(())
}

/// -1 for everything `node` (at `bytenr`) points at. A block released
/// because copies replaced it (not by a drop) hands its children to them:
/// no tree reaches them differently (see `qgroup`).
fn release_children(tx: &mut Txn<'_>, bytenr: u64, node: &Node, not_dropped: bool) {
    let replaced = not_dropped && tx.was_copied(bytenr);
    if replaced {
        tx.begin_copy(bytenr);
    }
    crate::tree::count_entry_refs(tx, &node.body, 0..node.nritems(), bytenr, -1);
    if replaced {
        tx.end_copy();
    }
}

/// Frees the tree block at `bytenr`, whose children were released.
pub(crate) fn free_block(tx: &mut Txn<'_>, bytenr: u64, item: &ExtentItem) -> Result<()> {
    let never_committed = item.generation == tx.transid();
    tx.forget_block(bytenr, item.owner);
    let ns = tx.nodesize_bytes() as u64;
    tx.free_extent(bytenr, ns, never_committed)
}

/// One cleaner transaction's work: gives it a budget of `budget` units
/// (a reference given up is one, a block freed [`BLOCK_COST`]), reserves
/// what that may cost at commit with `need` (nothing changes when that
/// fails), and works through queued blocks with up to half of the budget
/// (the other half lets the commit release the leaves this frees rather
/// than queue them). A block larger than what is left gives up a slice
/// of its references, and its queue item records how far it got.
/// Returns the references given up.
pub(crate) fn clean_step(tx: &mut Txn<'_>, budget: u64, need: &Need) -> Result<u64> {
    let budget = budget.max(2);
    let before = (tx.drop_state().budget, tx.drop_state().active);
    {
        let d = tx.drop_state();
        d.budget = d.budget.max(budget);
        d.active = true;
    }
    if let Err(e) = tx.reserve(need) {
        let d = tx.drop_state();
        (d.budget, d.active) = before;
        return Err(e);
    }
    let stop_at = budget / 2;
    let mut done = 0;
    while tx.drop_state().queued > 0 && tx.drop_state().budget > stop_at {
        let Some((bytenr, queued)) = first_queued(tx)? else {
            // The count was off (a damaged queue): trust the tree.
            tx.drop_state().queued = 0;
            break;
        };
        // A damaged queue item is reported before this transaction changes
        // anything (it is the next step's first block), so the engine
        // stays up and nothing is freed that a tree still uses.
        let node = match check_queued(tx, bytenr, &queued) {
            Ok(node) => node,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        };
        let allowance = tx.drop_state().budget - stop_at;
        done += release_slice(tx, bytenr, queued, &node, allowance)?;
    }
    Ok(done)
}

/// The block of queue item `queued` at `bytenr`, if it can be worked on:
/// it reads back as recorded, its progress lies within it, and it is not
/// live (a live block has an extent item; releasing it would free what
/// a tree still uses).
fn check_queued(tx: &Txn<'_>, bytenr: u64, queued: &DroppedBlock) -> Result<Arc<Node>> {
    let extents = tx.root_of(crate::format::tree_id::EXTENT)?;
    if super::apply::find_extent_item(tx, &extents, bytenr)?.is_some() {
        return Err(Error::corrupt(
            bytenr,
            "the drop queue names a block still in use",
        ));
    }
    let node = read_released(tx, bytenr, queued.generation, queued.level)?;
    if queued.next as usize > node.nritems() {
        return Err(Error::corrupt(
            bytenr,
            format!(
                "drop progress {} past the block's {} entries",
                queued.next,
                node.nritems()
            ),
        ));
    }
    Ok(node)
}

/// Gives up the references of queued block `bytenr` from its recorded
/// progress on, at most about `allowance` units' worth (at least one
/// entry); frees the block when none are left, or records the progress.
/// Returns the references given up.
fn release_slice(
    tx: &mut Txn<'_>,
    bytenr: u64,
    queued: DroppedBlock,
    node: &Node,
    allowance: u64,
) -> Result<u64> {
    let n = node.nritems();
    let from = (queued.next as usize).min(n);
    let mut to = from;
    let mut refs = 0;
    while to < n {
        let r = refs_in(node, to..to + 1);
        if to > from && refs + r > allowance {
            break;
        }
        refs += r;
        to += 1;
    }
    crate::tree::count_entry_refs(tx, &node.body, from..to, bytenr, -1);
    let finished = to == n;
    {
        let d = tx.drop_state();
        let cost = refs + if finished { BLOCK_COST } else { 0 };
        d.budget = d.budget.saturating_sub(cost.max(1));
        d.note_released(RefHolder::TreeParent(bytenr));
    }
    let key = queue_key(bytenr);
    if finished {
        tx.delete(ROOT, &key)?;
        tx.drop_state().queued -= 1;
        tx.forget_block(bytenr, queued.owner);
        let ns = tx.nodesize_bytes() as u64;
        tx.free_extent(bytenr, ns, false)?;
    } else {
        let next = u32::try_from(to).map_err(|_| Error::corrupt(bytenr, "entry index"))?;
        tx.put(ROOT, key, DroppedBlock { next, ..queued }.encode())?;
    }
    Ok(refs)
}

/// One cleaner transaction on `engine`, committed: the budget shrinks
/// when free space is too short for it, down to one block, and space the
/// last commit holds is waited for before that is given up. Returns the
/// blocks still queued.
pub fn clean_dropped_step(engine: &Engine) -> Result<u64> {
    let _turn = engine.cleaner_turn();
    if engine.queued_drops() == 0 {
        return Ok(0);
    }
    let need = Need::items(ROOT, 1).deleting();
    let mut budget = STEP_BUDGET;
    warm_step(engine, budget)?;
    let mut waited = false;
    loop {
        match engine.write(|tx| clean_step(tx, budget, &need)) {
            Ok(_) => break,
            Err(Error::NoSpace) if budget > 1 => budget /= 16,
            Err(Error::NoSpace) if !waited => {
                engine.commit()?;
                engine.wait_for_freed_space();
                waited = true;
            }
            Err(e) => return Err(e),
        }
    }
    engine.commit()?;
    Ok(engine.queued_drops())
}

/// Reads what the next step will need into the block cache first,
/// holding no lock while reading: the queued blocks it will take, and the
/// leaves below them that only they hold (the commit releases those).
/// Done under the state lock, those reads would stall every other
/// operation.
fn warm_step(engine: &Engine, budget: u64) -> Result<()> {
    let max = usize::try_from(budget / 2 / BLOCK_COST).unwrap_or(usize::MAX);
    let queued = engine.read(|r| read_queue(r, &r.root(ROOT)?, max))?;
    let blocks: Vec<(u64, u64)> = queued.iter().map(|(b, d)| (*b, d.generation)).collect();
    engine.warm_blocks(&blocks);
    let leaves = engine.read(|r| {
        let extents = r.root(crate::format::tree_id::EXTENT)?;
        let mut out = Vec::new();
        for (bytenr, d) in queued.iter().filter(|(_, d)| d.level == 1) {
            let node = r.read_node(*bytenr, d.generation)?;
            let crate::format::node::Body::Internal(ptrs) = &node.body else {
                continue;
            };
            for p in ptrs.iter().skip(d.next as usize) {
                if out.len() as u64 >= budget / BLOCK_COST {
                    return Ok(out);
                }
                let only_holder = super::apply::find_extent_item(r, &extents, p.bytenr)?
                    .is_some_and(|(_, item)| item.refs == 1);
                if only_holder {
                    out.push((p.bytenr, p.generation));
                }
            }
        }
        Ok(out)
    })?;
    engine.warm_blocks(&leaves);
    Ok(())
}

/// What freeing a block costs against the budget beyond its references:
/// its queue item, its extent's free, its read.
const BLOCK_COST: u64 = 4;

/// What giving up the references of entries `range` of `node` costs
/// against the budget: one unit per data extent, [`BLOCK_COST`] per tree
/// block (whose extent item, back-reference and often queue item change).
fn refs_in(node: &Node, range: std::ops::Range<usize>) -> u64 {
    let mut cost = 0;
    crate::tree::entry_refs(&node.body, range, |r| {
        cost += match r {
            crate::tree::EntryRef::Block(_) => BLOCK_COST,
            crate::tree::EntryRef::Data(..) => 1,
        }
    });
    cost
}

/// The first `max` queue items, in address order.
fn read_queue<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    max: usize,
) -> Result<Vec<(u64, DroppedBlock)>> {
    let mut c = Cursor::seek(b, root, &queue_key(0))?;
    let mut out = Vec::new();
    while let Some(it) = c.item() {
        if it.key.objectid != DROP_QUEUE_OBJECTID || it.key.ty != DROPPED_BLOCK || out.len() >= max
        {
            break;
        }
        let d = DroppedBlock::decode(it.data).map_err(|e| Error::corrupt(it.key.offset, e))?;
        out.push((it.key.offset, d));
        c.next(b)?;
    }
    Ok(out)
}

/// The queued block with the lowest address.
fn first_queued(tx: &Txn<'_>) -> Result<Option<(u64, DroppedBlock)>> {
    let root = tx.root_of(ROOT)?;
    Ok(read_queue(tx, &root, 1)?.into_iter().next())
}

/// Blocks in the queue of the tree rooted at `root` (the root tree).
pub(crate) fn count_queued<B: BlockRead + ?Sized>(b: &B, root: &RootPtr) -> Result<u64> {
    Ok(read_queue(b, root, usize::MAX)?.len() as u64)
}
