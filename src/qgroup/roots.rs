//! Which subvolumes reach an extent: found two ways that must agree.
//!
//! - [`RootsWalk`] climbs the back-references of the extent tree from one
//!   extent to the roots above it (what the commit does for the extents it
//!   changed). Each block's answer is remembered for the rest of the walk,
//!   so the blocks a commit traces share the climb above them.
//! - [`compute_usage`] descends every subvolume's tree from its root and
//!   gives every extent the set of subvolumes that reach it (a rescan, and
//!   `canopy check`'s independent count). Blocks are visited level by
//!   level, top first, each once however many trees share it: a block's
//!   set is the union of its parents', complete once the level above is
//!   done.
//!
//! A block the drop queue holds has no back-references and is no tree's
//! root, so what only a deleted subvolume reaches belongs to nobody, in
//! both walks alike.

use crate::cache::{BlockMap, BlockSet};
use crate::error::{Error, Result};
use crate::extent::{backrefs, check_climb, for_each_backref};
use crate::format::items::{data_ref_of, ExtentItem};
use crate::format::key_type::EXTENT_ITEM;
use crate::format::node::Node;
use crate::format::tree_id;
use crate::format::Key;
use crate::tree::{BlockRead, Cursor, RootPtr};
use crate::txn::RefHolder;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;

/// A set of subvolume ids, shared between the blocks that have the same.
pub type Roots = Arc<BTreeSet<u64>>;

/// Climbs back-references in one state of the extent tree.
pub struct RootsWalk {
    extent_root: RootPtr,
    memo: BlockMap<Roots>,
}

impl RootsWalk {
    pub fn new(extent_root: RootPtr) -> RootsWalk {
        RootsWalk {
            extent_root,
            memo: BlockMap::default(),
        }
    }

    /// The subvolumes reaching the data extent at `bytenr`.
    pub fn data_roots<B: BlockRead + ?Sized>(&mut self, b: &B, bytenr: u64) -> Result<Roots> {
        let mut out = BTreeSet::new();
        for (holder, _) in self.backrefs(b, bytenr)? {
            if let RefHolder::DataLeaf(leaf) = holder {
                out.extend(self.block_roots(b, leaf, 0)?.iter().copied());
            }
        }
        Ok(Arc::new(out))
    }

    /// How many file extent items hold the data extent at `bytenr` (its
    /// reference count), and the subvolumes reaching it: it belongs to
    /// one file alone exactly when that is 1 and one subvolume
    /// (`filesystem du`'s exclusive bytes).
    pub fn data_sharing<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        bytenr: u64,
    ) -> Result<(u64, Roots)> {
        let refs = self
            .backrefs(b, bytenr)?
            .iter()
            .filter(|(h, _)| matches!(h, RefHolder::DataLeaf(_)))
            .map(|&(_, n)| n.max(0) as u64)
            .sum();
        Ok((refs, self.data_roots(b, bytenr)?))
    }

    /// The subvolumes reaching the tree block at `bytenr`.
    pub fn tree_roots<B: BlockRead + ?Sized>(&mut self, b: &B, bytenr: u64) -> Result<Roots> {
        self.block_roots(b, bytenr, 0)
    }

    fn block_roots<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        bytenr: u64,
        depth: usize,
    ) -> Result<Roots> {
        if let Some(r) = self.memo.get(&bytenr) {
            return Ok(r.clone());
        }
        check_climb(bytenr, depth)?;
        let mut out = BTreeSet::new();
        let mut parents = Vec::new();
        for (holder, _) in self.backrefs(b, bytenr)? {
            match holder {
                RefHolder::TreeRoot(t) if tree_id::is_shareable(t) => {
                    out.insert(t);
                }
                RefHolder::TreeParent(p) => parents.push(p),
                _ => {}
            }
        }
        let single_parent = parents.len() == 1 && out.is_empty();
        let mut shared = None;
        for p in parents {
            let r = self.block_roots(b, p, depth + 1)?;
            if single_parent {
                shared = Some(r);
            } else {
                out.extend(r.iter().copied());
            }
        }
        let roots = shared.unwrap_or_else(|| Arc::new(out));
        self.memo.insert(bytenr, roots.clone());
        Ok(roots)
    }

    /// Every holder of the extent at `bytenr` in this state.
    pub(crate) fn backrefs<B: BlockRead + ?Sized>(
        &self,
        b: &B,
        bytenr: u64,
    ) -> Result<Vec<(RefHolder, i64)>> {
        backrefs(b, &self.extent_root, bytenr)
    }
}

/// Who reaches a traced extent, as far as level-0 groups can tell, at a
/// cost that does not grow with the number of snapshots sharing it.
///
/// Only the trees `changed` in this transaction (their root moved, or
/// they were cloned or made) can reach an extent differently from the
/// last commit; for them, membership is decided by searching the tree:
/// a tree reaches a block exactly when the one path to the block's
/// lowest key, at the block's level, ends at it (a data extent: one of
/// the leaves holding it). Every other tree reached it then exactly when
/// it reaches it now, so a level-0 group's numbers need to know about
/// those only whether the extent is held by one tree or by several: up to
/// two of them, found by climbing back-references with an early exit,
/// stand for all (the same in both states). The sets returned give
/// `Qgroups::shares` the same answers as the full sets for level-0
/// groups; groups of groups need the full sets ([`RootsWalk`]).
pub struct Reach<'a> {
    changed: &'a BTreeSet<u64>,
    old: State,
    new: State,
    shapes: Shapes,
    witnesses: BlockMap<Roots>,
    kept: &'a mut KeptWitnesses,
    /// Every tree's root at the last commit: an unchanged tree's now.
    committed: &'a BTreeMap<u64, RootPtr>,
}

/// One state of the trees: the extent tree and the roots of the changed
/// trees (absent: the tree did not exist).
struct State {
    extents: RootsWalk,
    roots: BTreeMap<u64, RootPtr>,
    /// The last path searched in each of those trees.
    paths: BTreeMap<u64, Vec<Step>>,
    /// Whether this is the state of the last commit (else: now).
    last_commit: bool,
    /// Blocks looked for and not found in this state's extent tree.
    absent: BlockSet,
}

/// Where a tree block sits in every tree holding it (its lowest key and
/// level), and whether the running transaction made it.
#[derive(Clone, Copy)]
struct Shape {
    key: Key,
    level: u8,
    fresh: bool,
}

/// The shapes of the blocks looked at, in either state: a block of the
/// last commit is not reused before this commit is durable, so an address
/// names the same block in both, unless the block is fresh (its address
/// was free at the last commit).
struct Shapes {
    transid: u64,
    known: BlockMap<Shape>,
}

/// Full sets of witnesses found by earlier commits, each with the roots
/// its trees had then, kept across commits (in the quota state).
///
/// A tree whose root is still the one it had reaches everything it
/// reached: copy-on-write gives every changed tree a new root, and no
/// block a tree reaches is freed or reused. So a kept pair stands as long
/// as both its trees keep their roots and neither is changed in the
/// running transaction. Without it, every commit climbs again from each
/// old block to two roots, a climb that grows with the snapshots sharing
/// the block; with it, the climb stops at the first block whose pair an
/// earlier commit found. Sets with fewer than two trees are not kept: a
/// new snapshot may add to them without changing any root they name.
#[derive(Default)]
pub struct KeptWitnesses {
    /// Block -> each witness with its root then, and the same trees as a
    /// set (what `Reach::witness` returns). The trees are kept beside the
    /// set so that checking a pair reads only its own entry.
    pairs: BlockMap<([(u64, RootPtr); WITNESSES], Roots)>,
}

/// How many blocks' witnesses are kept before they are all forgotten (a
/// few MiB; each commit finds again what it needs).
const KEPT_WITNESSES: usize = 1 << 15;

impl KeptWitnesses {
    /// The pair kept for `bytenr`, if it still stands.
    fn get(
        &mut self,
        bytenr: u64,
        changed: &BTreeSet<u64>,
        committed: &BTreeMap<u64, RootPtr>,
    ) -> Option<Roots> {
        let (pair, trees) = self.pairs.get(&bytenr)?;
        let stands = pair
            .iter()
            .all(|(t, root)| !changed.contains(t) && committed.get(t) == Some(root));
        if stands {
            Some(trees.clone())
        } else {
            self.pairs.remove(&bytenr);
            None
        }
    }

    /// Keeps `trees` as the witnesses of `bytenr` if they are a full pair
    /// of unchanged trees.
    fn keep(&mut self, bytenr: u64, trees: &Roots, committed: &BTreeMap<u64, RootPtr>) {
        let pair: Vec<(u64, RootPtr)> = trees
            .iter()
            .filter_map(|&t| committed.get(&t).map(|&root| (t, root)))
            .collect();
        let Ok(pair) = <[(u64, RootPtr); WITNESSES]>::try_from(pair) else {
            return;
        };
        if self.pairs.len() >= KEPT_WITNESSES {
            self.pairs.clear();
        }
        self.pairs.insert(bytenr, (pair, trees.clone()));
    }
}

/// Blocks a commit of a few changed files looks at, about.
const TYPICAL_BLOCKS: usize = 128;

/// How many trees outside the changed ones stand for all of them.
const WITNESSES: usize = 2;

impl<'a> Reach<'a> {
    /// `old_roots` and `new_roots`: every changed tree's root at the last
    /// commit and now (absent where it did not exist); `committed`: every
    /// tree's root at the last commit.
    pub fn new(
        changed: &'a BTreeSet<u64>,
        (old_extents, old_roots): (RootPtr, BTreeMap<u64, RootPtr>),
        (new_extents, new_roots): (RootPtr, BTreeMap<u64, RootPtr>),
        committed: &'a BTreeMap<u64, RootPtr>,
        kept: &'a mut KeptWitnesses,
        transid: u64,
    ) -> Reach<'a> {
        let state = |extents, roots, last_commit| State {
            extents: RootsWalk::new(extents),
            roots,
            last_commit,
            absent: BlockSet::default(),
            paths: BTreeMap::new(),
        };
        Reach {
            changed,
            old: state(old_extents, old_roots, true),
            new: state(new_extents, new_roots, false),
            // Sized for a commit of a few files, so that one does not
            // grow them step by step.
            shapes: Shapes {
                transid,
                known: BlockMap::with_capacity_and_hasher(TYPICAL_BLOCKS, Default::default()),
            },
            witnesses: BlockMap::with_capacity_and_hasher(TYPICAL_BLOCKS, Default::default()),
            kept,
            committed,
        }
    }

    /// Who reached the extent at `bytenr` at the last commit, and who
    /// reaches it now, as level-0 groups need to know. `made`: the
    /// extent was allocated in this transaction, so nothing reached it
    /// then (its address was free at the last commit).
    pub fn change<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        bytenr: u64,
        data: bool,
        made: bool,
    ) -> Result<(Roots, Roots)> {
        // The blocks holding the extent now: the extent itself, or the
        // leaves pointing at the data.
        let now = if data {
            self.new.data_leaves(b, bytenr)?
        } else {
            vec![bytenr]
        };
        let mut new = self.new.members(b, self.changed, &mut self.shapes, &now)?;
        let mut w = BTreeSet::new();
        for &block in &now {
            // Only a changed tree can reach a block made in this
            // transaction: nothing else points at it.
            if self.shapes.known.get(&block).is_some_and(|s| s.fresh) {
                continue;
            }
            w.extend(self.witness(b, block, 0)?.iter().copied());
            if enough(&w).is_break() {
                break;
            }
        }
        let then = if made {
            Vec::new()
        } else if data {
            self.old.data_leaves(b, bytenr)?
        } else {
            vec![bytenr]
        };
        let mut old = self.old.members(b, self.changed, &mut self.shapes, &then)?;
        old.extend(w.iter().copied().take(WITNESSES));
        new.extend(w.iter().copied().take(WITNESSES));
        Ok((Arc::new(old), Arc::new(new)))
    }

    /// Adds to `traced` what a deleted tree reached (from `root`, its root
    /// at the last commit) that fewer than two unchanged trees reach now:
    /// below a block two of them reach, every extent keeps two holders
    /// outside the changed trees, so no level-0 group's numbers move but
    /// the deleted one's, which is gone. Each entry added costs one unit
    /// of `budget`; false when it runs out.
    pub fn trace_dropped<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        root: RootPtr,
        traced: &mut BTreeMap<u64, (u64, bool)>,
        budget: &mut usize,
    ) -> Result<bool> {
        let ns = b.nodesize() as u64;
        let mut spend = |traced: &mut BTreeMap<u64, (u64, bool)>, at: u64, entry: (u64, bool)| {
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            traced.insert(at, entry);
            true
        };
        let mut seen = BlockSet::default();
        let mut stack = vec![root];
        while let Some(ptr) = stack.pop() {
            if !seen.insert(ptr.bytenr) || self.witness(b, ptr.bytenr, 0)?.len() >= WITNESSES {
                continue;
            }
            if !spend(traced, ptr.bytenr, (ns, false)) {
                return Ok(false);
            }
            let node = b.read_node(ptr.bytenr, ptr.generation)?;
            if node.level != ptr.level {
                return Err(Error::corrupt(ptr.bytenr, "block at the wrong level"));
            }
            if node.level > 0 {
                stack.extend(node.ptrs().iter().map(|p| RootPtr {
                    bytenr: p.bytenr,
                    generation: p.generation,
                    level: node.level - 1,
                }));
                continue;
            }
            for it in node.items() {
                if let Some((d, len)) = data_ref_of(&it.key, it.data) {
                    if !spend(traced, d, (len, true)) {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Up to [`WITNESSES`] trees outside the changed ones that reach the
    /// tree block at `bytenr` now.
    fn witness<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        bytenr: u64,
        depth: usize,
    ) -> Result<Roots> {
        if let Some(r) = self.witnesses.get(&bytenr) {
            return Ok(r.clone());
        }
        if let Some(r) = self.kept.get(bytenr, self.changed, self.committed) {
            self.witnesses.insert(bytenr, r.clone());
            return Ok(r);
        }
        check_climb(bytenr, depth)?;
        let mut out = BTreeSet::new();
        let root = self.new.extents.extent_root;
        let changed = self.changed;
        for_each_backref(b, &root, bytenr, |holder, _| {
            match holder {
                RefHolder::TreeRoot(t) if tree_id::is_shareable(t) && !changed.contains(&t) => {
                    out.insert(t);
                }
                RefHolder::TreeParent(p) => {
                    out.extend(self.witness(b, p, depth + 1)?.iter().copied());
                }
                _ => {}
            }
            Ok(enough(&out))
        })?;
        let r: Roots = Arc::new(out.into_iter().take(WITNESSES).collect());
        self.kept.keep(bytenr, &r, self.committed);
        self.witnesses.insert(bytenr, r.clone());
        Ok(r)
    }
}

/// Stops a climb once it has found enough witnesses.
fn enough(found: &BTreeSet<u64>) -> ControlFlow<()> {
    if found.len() >= WITNESSES {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

impl State {
    /// The changed trees reaching the extent at `bytenr` in this state.
    fn members<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        changed: &BTreeSet<u64>,
        shapes: &mut Shapes,
        blocks: &[u64],
    ) -> Result<BTreeSet<u64>> {
        let mut out = BTreeSet::new();
        for &block in blocks {
            let Some(Shape { key, level, .. }) = self.shape_of(b, shapes, block)? else {
                continue;
            };
            for &t in changed {
                if out.contains(&t) {
                    continue;
                }
                let Some(root) = self.roots.get(&t) else {
                    continue;
                };
                let path = self.paths.entry(t).or_default();
                if tree_reaches(b, root, &key, level, block, path)? {
                    out.insert(t);
                }
            }
        }
        Ok(out)
    }

    /// The leaves holding the data extent at `bytenr` in this state.
    fn data_leaves<B: BlockRead + ?Sized>(&self, b: &B, bytenr: u64) -> Result<Vec<u64>> {
        Ok(self
            .extents
            .backrefs(b, bytenr)?
            .into_iter()
            .filter_map(|(holder, _)| match holder {
                RefHolder::DataLeaf(leaf) => Some(leaf),
                _ => None,
            })
            .collect())
    }

    /// The shape of the tree block at `bytenr`, if this state's extent
    /// tree has it, or if the other state's has it and it is not fresh:
    /// then this state either has the same block or none at that address,
    /// and a search for a freed block finds no tree reaching it either way.
    ///
    /// A block in memory needs no search of the extent tree for its
    /// generation: no address is reused before the commit freeing it is
    /// durable, and freed blocks leave the cache before that, so the block
    /// in memory at an address is the only one either state can have
    /// there (a fresh one only now).
    fn shape_of<B: BlockRead + ?Sized>(
        &mut self,
        b: &B,
        shapes: &mut Shapes,
        bytenr: u64,
    ) -> Result<Option<Shape>> {
        if let Some(s) = shapes.known.get(&bytenr) {
            return Ok((!(self.last_commit && s.fresh)).then_some(*s));
        }
        if self.absent.contains(&bytenr) {
            return Ok(None);
        }
        if let Some(node) = b.node_in_memory(bytenr) {
            let s = shapes.note(bytenr, &node);
            return Ok((!(self.last_commit && s.fresh)).then_some(s));
        }
        let c = Cursor::seek(
            b,
            &self.extents.extent_root,
            &Key::new(bytenr, EXTENT_ITEM, 0),
        )?;
        let item = match c.item() {
            Some(it) if it.key.objectid == bytenr && it.key.ty == EXTENT_ITEM => {
                ExtentItem::decode(it.data).map_err(|e| Error::corrupt(bytenr, e))?
            }
            _ => {
                self.absent.insert(bytenr);
                return Ok(None);
            }
        };
        // Data at the address (groups that mix both): no tree block here.
        if !item.is_tree_block() {
            self.absent.insert(bytenr);
            return Ok(None);
        }
        let node = b.read_node(bytenr, item.generation)?;
        Ok(Some(shapes.note(bytenr, &node)))
    }
}

impl Shapes {
    /// Remembers the shape of `node`, the block at `bytenr`.
    fn note(&mut self, bytenr: u64, node: &Node) -> Shape {
        let s = Shape {
            // An empty block can only be a root: its key is the lowest
            // there is.
            key: node.first_key().unwrap_or(Key::MIN),
            level: node.level,
            fresh: node.generation == self.transid,
        };
        self.known.insert(bytenr, s);
        s
    }
}

/// One node of the last path searched in a tree, with the keys it covers
/// (`lo` up to, not including, `hi`; `None`: no end).
struct Step {
    node: Arc<Node>,
    lo: Key,
    hi: Option<Key>,
}

impl Step {
    fn covers(&self, key: &Key) -> bool {
        self.lo <= *key && self.hi.is_none_or(|hi| *key < hi)
    }
}

/// Whether the tree at `root` reaches the block `bytenr` of level `level`
/// whose lowest key is `key`: a shared block sits at the same place in
/// every tree holding it, so the one path by key decides.
///
/// `path` is the path the last search of this tree took: a search starts
/// from its lowest node that covers `key`, since a commit's blocks cluster
/// in a few files and the upper nodes of one search are the next one's.
/// (The trees do not change while the accounting runs.)
fn tree_reaches<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    key: &Key,
    level: u8,
    bytenr: u64,
    path: &mut Vec<Step>,
) -> Result<bool> {
    if root.level <= level {
        return Ok(root.level == level && root.bytenr == bytenr);
    }
    if path.first().is_some_and(|s| s.node.bytenr != root.bytenr) {
        path.clear();
    }
    while path
        .last()
        .is_some_and(|s| s.node.level <= level || !s.covers(key))
    {
        path.pop();
    }
    if path.is_empty() {
        path.push(Step {
            node: b.read_node(root.bytenr, root.generation)?,
            lo: Key::MIN,
            hi: None,
        });
    }
    while let Some(step) = path.last() {
        let ptrs = step.node.ptrs();
        let i = ptrs.partition_point(|p| p.key <= *key).saturating_sub(1);
        let Some(p) = ptrs.get(i) else {
            return Ok(false);
        };
        if step.node.level <= level + 1 {
            return Ok(step.node.level == level + 1 && p.bytenr == bytenr);
        }
        let child = Step {
            node: b.read_node(p.bytenr, p.generation)?,
            lo: if i == 0 { step.lo } else { p.key },
            hi: ptrs.get(i + 1).map(|next| next.key).or(step.hi),
        };
        path.push(child);
    }
    Ok(false)
}

/// Every extent reachable from a subvolume: its length and who reaches it.
#[derive(Default)]
pub struct Usage {
    pub extents: BTreeMap<u64, (u64, Roots)>,
}

/// Descends the trees `trees` (subvolume id, root) and finds, for every
/// tree block and data extent below them, the set of subvolumes reaching
/// it. A block or extent with one holder shares its holder's set; sets
/// are merged only where paths join, so the cost follows the blocks and
/// extents, not how many snapshots share them.
pub fn compute_usage<B: BlockRead + ?Sized>(b: &B, trees: &[(u64, RootPtr)]) -> Result<Usage> {
    let top = crate::format::node::MAX_LEVEL as usize;
    // Per level: block -> (generation, roots so far).
    let mut levels: Vec<BTreeMap<u64, (u64, Roots)>> = vec![BTreeMap::new(); top + 1];
    for &(id, ptr) in trees {
        let level = usize::from(ptr.level).min(top);
        let alone = Arc::new(BTreeSet::from([id]));
        reach(&mut levels[level], ptr.bytenr, ptr.generation, &alone);
    }
    let ns = b.nodesize() as u64;
    let mut usage = Usage::default();
    // Data extent -> (length, roots so far).
    let mut data: BTreeMap<u64, (u64, Roots)> = BTreeMap::new();
    // One shared set per distinct content, so that what is below a block
    // whose set is complete shares it, and later merges find equal sets
    // by address.
    let mut distinct: HashSet<Roots> = HashSet::new();
    for level in (0..=top).rev() {
        let blocks = std::mem::take(&mut levels[level]);
        for (bytenr, (generation, roots)) in blocks {
            let roots = match distinct.get(&roots) {
                Some(same) => same.clone(),
                None => {
                    distinct.insert(roots.clone());
                    roots
                }
            };
            let node = b.read_node(bytenr, generation)?;
            if usize::from(node.level) != level {
                return Err(Error::corrupt(bytenr, "block at the wrong level"));
            }
            if level > 0 {
                for p in node.ptrs() {
                    reach(&mut levels[level - 1], p.bytenr, p.generation, &roots);
                }
            } else {
                for it in node.items() {
                    if let Some((d, len)) = data_ref_of(&it.key, it.data) {
                        reach(&mut data, d, len, &roots);
                    }
                }
            }
            usage.extents.insert(bytenr, (ns, roots));
        }
    }
    usage.extents.extend(data);
    Ok(usage)
}

/// Adds `roots` to who reaches `at` (`meta`: its generation or length,
/// the same from every holder).
fn reach(map: &mut BTreeMap<u64, (u64, Roots)>, at: u64, meta: u64, roots: &Roots) {
    match map.entry(at) {
        std::collections::btree_map::Entry::Vacant(v) => {
            v.insert((meta, roots.clone()));
        }
        std::collections::btree_map::Entry::Occupied(mut o) => {
            let have = &mut o.get_mut().1;
            if !Arc::ptr_eq(have, roots) && !roots.is_subset(have) {
                Arc::make_mut(have).extend(roots.iter().copied());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(bytenr: u64, generation: u64) -> RootPtr {
        RootPtr {
            bytenr,
            generation,
            level: 1,
        }
    }

    fn pair(a: u64, b: u64) -> Roots {
        Arc::new(BTreeSet::from([a, b]))
    }

    #[test]
    fn a_kept_pair_stands_while_both_trees_keep_their_roots() {
        let mut committed = BTreeMap::from([(257, root(100, 5)), (258, root(200, 6))]);
        let mut kept = KeptWitnesses::default();
        kept.keep(7, &pair(257, 258), &committed);
        let none = BTreeSet::new();
        assert_eq!(kept.get(7, &none, &committed), Some(pair(257, 258)));
        assert_eq!(kept.get(8, &none, &committed), None, "never kept");

        // Changed in the running transaction: the pair may be wrong now.
        assert_eq!(kept.get(7, &BTreeSet::from([258]), &committed), None);
        assert_eq!(kept.get(7, &none, &committed), None, "forgotten");

        // A root that moved at a commit since.
        kept.keep(7, &pair(257, 258), &committed);
        committed.insert(258, root(300, 9));
        assert_eq!(kept.get(7, &none, &committed), None);

        // A deleted tree.
        kept.keep(7, &pair(257, 258), &committed);
        committed.remove(&257);
        assert_eq!(kept.get(7, &none, &committed), None);
    }

    #[test]
    fn fewer_than_two_witnesses_are_not_kept() {
        let committed = BTreeMap::from([(257, root(100, 5))]);
        let mut kept = KeptWitnesses::default();
        kept.keep(7, &Arc::new(BTreeSet::from([257])), &committed);
        kept.keep(8, &Roots::default(), &committed);
        // A tree with no committed root (made in this transaction).
        kept.keep(9, &pair(257, 300), &committed);
        assert!(kept.pairs.is_empty());
    }
}
