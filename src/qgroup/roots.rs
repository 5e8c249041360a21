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

use crate::error::{Error, Result};
use crate::format::items::data_ref_of;
use crate::format::key_type::{SHARED_BLOCK_REF, SHARED_DATA_REF, TREE_BLOCK_REF};
use crate::format::tree_id;
use crate::format::Key;
use crate::tree::{BlockRead, Cursor, RootPtr};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// A set of subvolume ids, shared between the blocks that have the same.
pub type Roots = Arc<BTreeSet<u64>>;

/// Tree levels a walk may climb before the extent tree is taken for
/// corrupt (a cycle of back-references).
const MAX_CLIMB: usize = 2 * crate::format::node::MAX_LEVEL as usize + 2;

/// Climbs back-references in one state of the extent tree.
pub struct RootsWalk {
    extent_root: RootPtr,
    memo: HashMap<u64, Roots>,
}

impl RootsWalk {
    pub fn new(extent_root: RootPtr) -> RootsWalk {
        RootsWalk {
            extent_root,
            memo: HashMap::new(),
        }
    }

    /// The subvolumes reaching the data extent at `bytenr`.
    pub fn data_roots<B: BlockRead + ?Sized>(&mut self, b: &B, bytenr: u64) -> Result<Roots> {
        let mut out = BTreeSet::new();
        for (ty, holder) in self.backrefs(b, bytenr)? {
            if ty == SHARED_DATA_REF {
                out.extend(self.block_roots(b, holder, 0)?.iter().copied());
            }
        }
        Ok(Arc::new(out))
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
        if depth > MAX_CLIMB {
            return Err(Error::corrupt(
                bytenr,
                "back-references climb higher than any tree",
            ));
        }
        let mut out = BTreeSet::new();
        let mut parents = Vec::new();
        for (ty, holder) in self.backrefs(b, bytenr)? {
            match ty {
                TREE_BLOCK_REF if tree_id::is_shareable(holder) => {
                    out.insert(holder);
                }
                SHARED_BLOCK_REF => parents.push(holder),
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

    /// (key type, holder) of every back-reference of the extent at
    /// `bytenr`.
    fn backrefs<B: BlockRead + ?Sized>(&self, b: &B, bytenr: u64) -> Result<Vec<(u8, u64)>> {
        let mut out = Vec::new();
        let mut c = Cursor::seek(b, &self.extent_root, &Key::new(bytenr, TREE_BLOCK_REF, 0))?;
        let mut cur = c.item().map(|it| it.key);
        while let Some(k) = cur {
            if k.objectid != bytenr || k.ty > SHARED_DATA_REF {
                break;
            }
            out.push((k.ty, k.offset));
            cur = c.next(b)?.map(|it| it.key);
        }
        Ok(out)
    }
}

/// Every extent reachable from a subvolume: its length and who reaches it.
#[derive(Default)]
pub struct Usage {
    pub extents: BTreeMap<u64, (u64, Roots)>,
}

/// Descends the trees `trees` (subvolume id, root) and finds, for every
/// tree block and data extent below them, the set of subvolumes reaching
/// it.
pub fn compute_usage<B: BlockRead + ?Sized>(b: &B, trees: &[(u64, RootPtr)]) -> Result<Usage> {
    let top = crate::format::node::MAX_LEVEL as usize;
    // Per level: block -> (generation, roots so far).
    let mut levels: Vec<BTreeMap<u64, (u64, BTreeSet<u64>)>> = vec![BTreeMap::new(); top + 1];
    for &(id, ptr) in trees {
        let level = usize::from(ptr.level).min(top);
        let e = levels[level]
            .entry(ptr.bytenr)
            .or_insert((ptr.generation, BTreeSet::new()));
        e.1.insert(id);
    }
    let ns = b.nodesize() as u64;
    let mut usage = Usage::default();
    let mut data: BTreeMap<u64, (u64, BTreeSet<u64>)> = BTreeMap::new();
    for level in (0..=top).rev() {
        let blocks = std::mem::take(&mut levels[level]);
        for (bytenr, (generation, roots)) in blocks {
            let node = b.read_node(bytenr, generation)?;
            if usize::from(node.level) != level {
                return Err(Error::corrupt(bytenr, "block at the wrong level"));
            }
            if level > 0 {
                for p in node.ptrs() {
                    let e = levels[level - 1]
                        .entry(p.bytenr)
                        .or_insert((p.generation, BTreeSet::new()));
                    e.1.extend(roots.iter().copied());
                }
            } else {
                for it in node.items() {
                    if let Some((d, len)) = data_ref_of(&it.key, &it.data) {
                        let e = data.entry(d).or_insert((len, BTreeSet::new()));
                        e.1.extend(roots.iter().copied());
                    }
                }
            }
            usage.extents.insert(bytenr, (ns, Arc::new(roots)));
        }
    }
    for (d, (len, roots)) in data {
        usage.extents.insert(d, (len, Arc::new(roots)));
    }
    Ok(usage)
}
