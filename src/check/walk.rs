//! Walking every tree from the superblock, recording what points where.

use super::sorted::Sorter;
use super::Report;
use crate::dev::Device;
use crate::format::items::{
    decode_ref_count, BlockGroupItem, DroppedBlock, ExtentItem, FileExtentItem, RootItem,
};
use crate::format::key_type::{
    DROPPED_BLOCK, EXTENT_DATA, EXTENT_ITEM, FREE_EXTENT, ROOT_ITEM, SHARED_BLOCK_REF,
    SHARED_DATA_REF, TREE_BLOCK_REF,
};
use crate::format::leaf;
use crate::format::node::{Body, Item, Node, Ptr};
use crate::format::superblock::Superblock;
use crate::format::superblock::INCOMPAT_DROP_QUEUE;
use crate::format::{tree_id, Key, DROP_QUEUE_OBJECTID};
use crate::txn::RefHolder;
use crate::volume::{Chunk, ChunkMap};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A tree block as found by the walk.
pub(super) struct FoundBlock {
    pub level: u8,
    /// As its header says (the parent's record of it is checked apart).
    pub generation: u64,
    pub owner: u64,
    pub holders: Vec<RefHolder>,
}

/// Everything the walk learned. What grows with the number of extents
/// is kept as sorted records (within the check's memory budget); what
/// grows with the number of tree blocks stays in memory.
pub(super) struct Found {
    pub blocks: BTreeMap<u64, FoundBlock>,
    /// Data extents as file extent items point at them:
    /// `[address, length, leaf]`, one per item.
    pub data: Sorter<3>,
    /// The extent tree's items as [`ExtentRecord`]s.
    pub extents: Sorter<6>,
    /// Free ranges `[start, length]` as the by-start and the by-length
    /// trees list them.
    pub free_by_start: Sorter<2>,
    pub free_by_len: Sorter<2>,
    /// Items of the root and block group trees (a few per subvolume and
    /// per group).
    pub items: HashMap<u64, Vec<Item>>,
    /// Blocks in the drop queue (`extent::drop`): allocated, holding
    /// their children, held by nothing.
    pub queued: BTreeSet<u64>,
}

impl Found {
    fn new(budget: u64) -> Found {
        Found {
            blocks: BTreeMap::new(),
            data: Sorter::new(budget / 4),
            extents: Sorter::new(budget / 2),
            free_by_start: Sorter::new(budget / 8),
            free_by_len: Sorter::new(budget / 8),
            items: HashMap::new(),
            queued: BTreeSet::new(),
        }
    }
}

/// An extent tree item as a record, in the extent tree's order:
/// - an extent item: `[address, 0, length, refs, generation, flags << 8 |
///   level]`, the last word `u64::MAX` when the item does not decode;
/// - a back-reference: `[address, 1, holder kind, holder, count, 0]`,
///   holder kinds as [`holder_code`] numbers them.
pub(super) type ExtentRecord = [u64; 6];
pub(super) const RECORD_ITEM: u64 = 0;
pub(super) const RECORD_BACKREF: u64 = 1;
pub(super) const UNDECODED: u64 = u64::MAX;

pub(super) fn holder_code(h: RefHolder) -> (u64, u64) {
    match h {
        RefHolder::TreeParent(b) => (0, b),
        RefHolder::TreeRoot(t) => (1, t),
        RefHolder::DataLeaf(b) => (2, b),
    }
}

pub(super) fn holder_of(kind: u64, id: u64) -> RefHolder {
    match kind {
        0 => RefHolder::TreeParent(id),
        1 => RefHolder::TreeRoot(id),
        _ => RefHolder::DataLeaf(id),
    }
}

/// The record of extent tree item `k`, or what is wrong with it.
fn extent_record(k: Key, data: &[u8]) -> Result<ExtentRecord, String> {
    let holder = match k.ty {
        EXTENT_ITEM => {
            return Ok(match ExtentItem::decode(data) {
                Ok(e) => {
                    let flags = e.flags << 8 | u64::from(e.level);
                    [
                        k.objectid,
                        RECORD_ITEM,
                        k.offset,
                        e.refs,
                        e.generation,
                        flags,
                    ]
                }
                Err(_) => [k.objectid, RECORD_ITEM, k.offset, 0, 0, UNDECODED],
            })
        }
        SHARED_BLOCK_REF => RefHolder::TreeParent(k.offset),
        TREE_BLOCK_REF => RefHolder::TreeRoot(k.offset),
        SHARED_DATA_REF => RefHolder::DataLeaf(k.offset),
        t => return Err(format!("unexpected key type {t} in the extent tree")),
    };
    let count = match k.ty {
        SHARED_DATA_REF => decode_ref_count(data)?,
        _ => 1,
    };
    let (kind, id) = holder_code(holder);
    Ok([k.objectid, RECORD_BACKREF, kind, id, u64::from(count), 0])
}

/// The holder the walk records for a queued block: the queue itself.
pub(super) const QUEUE_HOLDER: RefHolder = RefHolder::TreeRoot(DROP_QUEUE_OBJECTID);

/// The filesystem's devices the check was given, by devid.
pub(super) type Devices<'a> = BTreeMap<u64, &'a dyn Device>;

/// Every superblock copy on device `devid`: whole, of the newest
/// generation (an older one is a warning) and naming that device.
pub(super) fn check_super_copies(
    devid: u64,
    dev: &dyn Device,
    best: &Superblock,
    report: &mut Report,
) {
    let name = |off: u64| match best.devices.len() {
        1 => format!("superblock copy at {off}"),
        _ => format!("superblock copy at {off} of device {devid}"),
    };
    for (off, r) in crate::txn::read_super_copies(dev) {
        match r {
            Ok(sb) if sb.devid != devid => report.problem(
                name(off),
                format!("names device {} on device {devid}", sb.devid),
            ),
            Ok(sb) if sb.generation == best.generation => {}
            Ok(sb) => report.warning(
                name(off),
                format!(
                    "generation {} older than {}",
                    sb.generation, best.generation
                ),
            ),
            Err(e) => report.problem(name(off), e.to_string()),
        }
    }
}

struct Walker<'a> {
    /// Entries of the next block read whose references are already gone
    /// (a queued block's progress); reset once used.
    skip_entries: usize,
    devs: &'a Devices<'a>,
    sb: &'a Superblock,
    found: Found,
    /// A record could not be written to a temporary file (reported once).
    spill_failed: bool,
    read: u64,
    estimate: u64,
    progress: &'a dyn Fn(u64, u64),
    /// Second copies: the superblock's system groups at first, every
    /// group's once the block group tree has been walked.
    mirrors: ChunkMap,
}

/// Key bounds a block must respect: `lo <= key < hi`.
#[derive(Clone, Copy)]
struct Bounds {
    lo: Option<Key>,
    hi: Option<Key>,
    first: Option<Key>,
}

/// Walks every tree; `budget` bounds the records it keeps in memory.
pub(super) fn walk_all(
    devs: &Devices<'_>,
    sb: &Superblock,
    report: &mut Report,
    progress: &dyn Fn(u64, u64),
    budget: u64,
) -> Found {
    let mut w = Walker {
        skip_entries: 0,
        devs,
        sb,
        found: Found::new(budget),
        spill_failed: false,
        read: 0,
        estimate: (sb.bytes_used / u64::from(sb.nodesize)).max(1),
        progress,
        mirrors: ChunkMap::default(),
    };
    w.mirrors.set_mapped(sb.is_mapped());
    for c in &sb.system_chunks {
        w.mirrors
            .insert(Chunk::new(c.start, c.len, c.first, c.extra.clone()));
    }
    let root_tree = (sb.root, sb.root_generation, sb.root_level);
    w.walk_tree(tree_id::ROOT, root_tree, report);
    let mut trees = vec![];
    let mut queue = vec![];
    for it in w.found.items.get(&tree_id::ROOT).into_iter().flatten() {
        match it.key.ty {
            ROOT_ITEM => match RootItem::decode(&it.data) {
                Ok(ri) => trees.push((it.key.objectid, ri)),
                Err(e) => report.problem(format!("root item of tree {}", it.key.objectid), e),
            },
            DROPPED_BLOCK => match DroppedBlock::decode(&it.data) {
                Ok(d) => queue.push((it.key.offset, d)),
                Err(e) => report.problem(format!("drop queue item {}", it.key), e),
            },
            _ => {}
        }
    }
    report.trees = trees.len() + 1;
    // The block group tree first: it names the other groups' copies.
    trees.sort_by_key(|(id, _)| *id != tree_id::BLOCK_GROUP);
    for (i, (id, ri)) in trees.into_iter().enumerate() {
        if i == 1 {
            w.learn_mirrors();
        }
        if ri.generation > sb.generation {
            report.problem(
                format!("root item of tree {id}"),
                format!("generation {} newer than the superblock", ri.generation),
            );
        }
        w.walk_tree(id, (ri.bytenr, ri.generation, ri.level), report);
    }
    w.walk_queue(&queue, report);
    if queue.is_empty() == (sb.incompat & INCOMPAT_DROP_QUEUE != 0) {
        report.problem(
            "superblock",
            format!(
                "drop queue feature bit disagrees with the {} queued blocks",
                queue.len()
            ),
        );
    }
    report.tree_blocks = w.found.blocks.len() as u64;
    w.found
}

/// Trees whose items are kept as they are (the rest of what the space
/// checks need becomes records).
fn keeps_items(id: u64) -> bool {
    [tree_id::ROOT, tree_id::BLOCK_GROUP].contains(&id)
}

impl Walker<'_> {
    fn walk_tree(
        &mut self,
        id: u64,
        (bytenr, generation, level): (u64, u64, u8),
        report: &mut Report,
    ) {
        let bounds = Bounds {
            lo: None,
            hi: None,
            first: None,
        };
        self.visit(
            id,
            bytenr,
            generation,
            level,
            RefHolder::TreeRoot(id),
            bounds,
            report,
        );
    }

    /// Walks every queued block as the top of what it still holds (its
    /// entries from the cleaner's progress on). The queue's blocks belong
    /// to no tree; their items are not kept.
    fn walk_queue(&mut self, queue: &[(u64, DroppedBlock)], report: &mut Report) {
        for &(bytenr, d) in queue {
            if self.found.blocks.contains_key(&bytenr) {
                report.problem(
                    format!("drop queue block {bytenr}"),
                    "queued but still reachable from a tree",
                );
            }
            self.found.queued.insert(bytenr);
            let bounds = Bounds {
                lo: None,
                hi: None,
                first: None,
            };
            // The cleaner has given up the references before `next`.
            self.skip_entries = d.next as usize;
            self.visit(
                DROP_QUEUE_OBJECTID,
                bytenr,
                d.generation,
                d.level,
                QUEUE_HOLDER,
                bounds,
                report,
            );
        }
        report.queued_blocks = queue.len() as u64;
    }

    /// Reads the block from its first copy, or from the next when the
    /// first cannot be read, fails its checks or is older than its parent
    /// says; a bad copy before a good one is reported (scrub repairs it).
    /// Copies on a missing device are skipped (its absence is reported).
    fn read_block(
        &mut self,
        bytenr: u64,
        generation: u64,
        report: &mut Report,
    ) -> crate::error::Result<Node> {
        let ns = u64::from(self.sb.nodesize);
        let copies = self.mirrors.copies(bytenr, ns);
        let mut bad: Vec<(usize, crate::Error)> = Vec::new();
        for copy in 0..copies {
            let Some(s) = self.mirrors.stripe_of(bytenr, ns, copy) else {
                continue;
            };
            if !self.devs.contains_key(&s.devid) {
                continue;
            }
            match self.read_copy(bytenr, copy, generation) {
                Ok(node) => {
                    for (c, e) in bad {
                        report.problem(
                            format!("tree block {bytenr} copy {c}"),
                            format!("{e}; copy {copy} is good: `canopy scrub` repairs it"),
                        );
                    }
                    return Ok(node);
                }
                Err(e) => bad.push((copy, e)),
            }
        }
        match bad.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Err(crate::Error::corrupt(
                bytenr,
                "every copy lies on a missing device",
            )),
        }
    }

    /// Copy `copy` of block `bytenr`, checked, with a generation other
    /// than `generation` an error where there are other copies (the walk
    /// then tries the next; the header checks report a mismatch of all).
    fn read_copy(
        &mut self,
        bytenr: u64,
        copy: usize,
        generation: u64,
    ) -> crate::error::Result<Node> {
        let mut buf = vec![0u8; self.sb.nodesize as usize];
        let len = buf.len() as u64;
        if bytenr
            .checked_add(len)
            .is_none_or(|e| e > self.sb.total_bytes)
        {
            return Err(crate::Error::corrupt(
                bytenr,
                "block beyond the end of the filesystem",
            ));
        }
        let stripe = self
            .mirrors
            .stripe_of(bytenr, len, copy)
            .ok_or_else(|| crate::Error::corrupt(bytenr, format!("block has no copy {copy}")))?;
        let device_end = self.sb.device_bytes(stripe.devid).unwrap_or(0);
        let dev = self.devs.get(&stripe.devid).copied();
        let (Some(dev), true) = (
            dev,
            stripe
                .offset
                .checked_add(len)
                .is_some_and(|e| e <= device_end),
        ) else {
            return Err(crate::Error::corrupt(
                bytenr,
                format!("copy {copy} beyond the end of device {}", stripe.devid),
            ));
        };
        dev.read_at(&mut buf, stripe.offset)?;
        self.read += 1;
        if self.read.is_multiple_of(256) {
            (self.progress)(self.read, self.estimate.max(self.read));
        }
        let node = Node::decode(&buf, bytenr, &self.sb.fsid)?;
        if node.generation != generation && self.mirrors.copies(bytenr, len) > 1 {
            return Err(crate::Error::corrupt(
                bytenr,
                format!(
                    "generation {} where its parent expects {generation}",
                    node.generation
                ),
            ));
        }
        Ok(node)
    }

    /// Learns the copies of every group from the block group tree, once
    /// it has been walked.
    fn learn_mirrors(&mut self) {
        for it in self
            .found
            .items
            .get(&tree_id::BLOCK_GROUP)
            .into_iter()
            .flatten()
        {
            if let Ok(g) = BlockGroupItem::decode(&it.data) {
                if g.first.is_some() || !g.extra.is_empty() {
                    let mut c = Chunk::new(it.key.objectid, it.key.offset, g.first, g.extra);
                    c.striped = g.striped;
                    self.mirrors.insert(c);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn visit(
        &mut self,
        tree: u64,
        bytenr: u64,
        generation: u64,
        level: u8,
        holder: RefHolder,
        bounds: Bounds,
        report: &mut Report,
    ) {
        let loc = format!("tree {tree} block {bytenr}");
        let skip = std::mem::take(&mut self.skip_entries);
        if let Some(b) = self.found.blocks.get_mut(&bytenr) {
            b.holders.push(holder);
            if b.level != level {
                report.problem(
                    loc,
                    format!("reached as level {level} and as level {}", b.level),
                );
            }
            return;
        }
        let node = match self.read_block(bytenr, generation, report) {
            Ok(n) => n,
            Err(e) => {
                report.problem(loc, e.to_string());
                return;
            }
        };
        self.found.blocks.insert(
            bytenr,
            FoundBlock {
                level: node.level,
                generation: node.generation,
                owner: node.owner,
                holders: vec![holder],
            },
        );
        check_header(&node, generation, level, self.sb, &loc, report);
        check_keys(&node, &bounds, &loc, report);
        if skip > node.nritems() {
            report.problem(
                &loc,
                format!(
                    "drop progress {skip} past the block's {} entries",
                    node.nritems()
                ),
            );
        }
        match &node.body {
            Body::Internal(ptrs) => {
                self.visit_children(tree, &node, &ptrs[skip.min(ptrs.len())..], bounds, report);
            }
            Body::Leaf(items) => {
                self.visit_leaf(tree, bytenr, items.range(skip..items.len()), report);
            }
        }
    }

    /// Visits the children `ptrs` point at (those of `node` from where a
    /// drop got to), each within the keys its neighbours bound.
    fn visit_children(
        &mut self,
        tree: u64,
        node: &Node,
        ptrs: &[Ptr],
        bounds: Bounds,
        report: &mut Report,
    ) {
        for (i, p) in ptrs.iter().enumerate() {
            let b = Bounds {
                lo: Some(p.key),
                hi: ptrs.get(i + 1).map(|n| n.key).or(bounds.hi),
                first: Some(p.key),
            };
            let child_level = node.level.saturating_sub(1);
            self.visit(
                tree,
                p.bytenr,
                p.generation,
                child_level,
                RefHolder::TreeParent(node.bytenr),
                b,
                report,
            );
        }
    }

    fn visit_leaf(&mut self, tree: u64, bytenr: u64, items: leaf::Iter<'_>, report: &mut Report) {
        // The logical address space: device 1 in the bound layout.
        let device_size = match self.sb.is_mapped() {
            true => self.sb.total_bytes,
            false => self.devs.get(&1).map_or(self.sb.total_bytes, |d| d.size()),
        };
        let limits = crate::format::checker::Limits { device_size };
        for it in items.clone() {
            if let Err(why) = crate::format::checker::check_item(&it.key, it.data, &limits) {
                report.problem(
                    format!("tree {tree} leaf {bytenr} item {}", it.key),
                    format!("bad item: {why}"),
                );
            }
        }
        for it in items.clone().filter(|it| it.key.ty == EXTENT_DATA) {
            let fe = match FileExtentItem::decode(it.data) {
                Ok(fe) => fe,
                Err(e) => {
                    report.problem(format!("tree {tree} leaf {bytenr} item {}", it.key), e);
                    continue;
                }
            };
            let Some((disk, len)) = fe.disk_extent() else {
                continue;
            };
            let record = [disk, len, bytenr];
            let pushed = self.found.data.push(record);
            self.note_spill(pushed, report);
        }
        self.keep_records(tree, items.clone(), report);
        if keeps_items(tree) {
            self.found
                .items
                .entry(tree)
                .or_default()
                .extend(items.map(|it| it.to_item()));
        }
    }

    /// The extent tree's and the free-space trees' items as records.
    fn keep_records(&mut self, tree: u64, items: leaf::Iter<'_>, report: &mut Report) {
        for it in items {
            let k = it.key;
            let pushed = match tree {
                tree_id::EXTENT => match extent_record(k, it.data) {
                    Ok(r) => self.found.extents.push(r),
                    Err(why) => {
                        report.problem(format!("extent tree item {k}"), why);
                        continue;
                    }
                },
                tree_id::FREE_BY_START if k.ty == FREE_EXTENT => {
                    self.found.free_by_start.push([k.objectid, k.offset])
                }
                tree_id::FREE_BY_LEN if k.ty == FREE_EXTENT => {
                    self.found.free_by_len.push([k.offset, k.objectid])
                }
                _ => continue,
            };
            self.note_spill(pushed, report);
        }
    }

    fn note_spill(&mut self, pushed: std::io::Result<()>, report: &mut Report) {
        if let Err(e) = pushed {
            if !std::mem::replace(&mut self.spill_failed, true) {
                report.problem("check", format!("cannot write a temporary file: {e}"));
            }
        }
    }
}

fn check_header(
    node: &Node,
    generation: u64,
    level: u8,
    sb: &Superblock,
    loc: &str,
    report: &mut Report,
) {
    if node.generation != generation {
        report.problem(
            loc,
            format!(
                "generation {} but its parent recorded {generation}",
                node.generation
            ),
        );
    }
    if node.generation > sb.generation {
        report.problem(
            loc,
            format!("generation {} newer than the superblock", node.generation),
        );
    }
    if node.level != level {
        report.problem(
            loc,
            format!("level {} where {level} was expected", node.level),
        );
    }
}

fn check_keys(node: &Node, b: &Bounds, loc: &str, report: &mut Report) {
    let Some(first) = node.first_key() else {
        if b.first.is_some() {
            report.problem(loc, "empty block below an internal node");
        }
        return;
    };
    if b.first.is_some_and(|f| f != first) {
        report.problem(
            loc,
            format!("first key {first} differs from the parent's key"),
        );
    }
    let last = match &node.body {
        Body::Leaf(v) => v.last_key(),
        Body::Internal(v) => v.last().map(|p| p.key),
    };
    if b.lo.is_some_and(|lo| first < lo) || last.zip(b.hi).is_some_and(|(l, hi)| l >= hi) {
        report.problem(loc, "keys outside the range the parent gives this block");
    }
}
