//! The allocator: block groups and their free space.
//!
//! The device is carved into block groups as it fills; each holds one kind of
//! extent (data, metadata, or system: the root tree) and is also the
//! allocation group, as in XFS. The free space of each group is indexed both
//! by start and by length (XFS's bnobt and cntbt), in memory here and
//! persistently in the two free-space trees, which the commit brings up to
//! date from the journal of changes this module keeps.
//!
//! Space freed in a transaction is *pinned*: not reusable until that
//! transaction's commit is on disk, so a crash can never find a committed
//! block overwritten. Space allocated and freed within one transaction was
//! never committed and is reusable at once.
//!
//! Allocation modes (see `freespace`): near a hint (the block being copied,
//! the previous extent of a file), exact, and by size.

mod freespace;
pub mod groups;

pub use freespace::FreeIndex;
pub use groups::{BlockGroup, GroupKind};

use crate::error::{Error, Result};
use crate::format::items::{BG_DATA, BG_METADATA, BG_SYSTEM};
use crate::format::{RESERVED_START, SUPER_OFFSETS, SUPER_SIZE};
use std::collections::{BTreeMap, BTreeSet};

/// A change of the persistent free space, replayed into the free-space trees
/// at commit in the order it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOp {
    /// `[start, start+len)` became free.
    Add(u64, u64),
    /// `[start, start+len)` was allocated.
    Remove(u64, u64),
}

pub struct Allocator {
    groups: BTreeMap<u64, BlockGroup>,
    device_bytes: u64,
    journal: Vec<FreeOp>,
    pinned: Vec<(u64, u64)>,
    dirty_groups: BTreeSet<u64>,
}

impl Allocator {
    pub fn new(device_bytes: u64) -> Allocator {
        Allocator {
            groups: BTreeMap::new(),
            device_bytes,
            journal: Vec::new(),
            pinned: Vec::new(),
            dirty_groups: BTreeSet::new(),
        }
    }

    /// Adds a group loaded from disk; its free space follows with
    /// [`Allocator::load_free`].
    pub fn load_group(&mut self, start: u64, len: u64, flags: u64, used: u64) -> Result<()> {
        let kind = GroupKind::from_flags(flags)
            .ok_or_else(|| Error::corrupt(start, format!("block group flags {flags:#x}")))?;
        if start.checked_add(len).is_none_or(|e| e > self.device_bytes) || start < RESERVED_START {
            return Err(Error::corrupt(start, "block group outside the device"));
        }
        if self.group_containing(start).is_some() {
            return Err(Error::corrupt(start, "block groups overlap"));
        }
        self.groups
            .insert(start, BlockGroup::new(start, len, kind, used));
        Ok(())
    }

    /// Adds a free extent loaded from the by-start free-space tree.
    pub fn load_free(&mut self, start: u64, len: u64) -> Result<()> {
        let end = start
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(|| Error::corrupt(start, "free extent of impossible length"))?;
        let g = self
            .group_mut_containing(start)
            .filter(|g| end <= g.start + g.len)
            .ok_or_else(|| Error::corrupt(start, "free extent outside any block group"))?;
        if !g.free.insert(start, len) {
            return Err(Error::corrupt(start, "free extents overlap"));
        }
        Ok(())
    }

    pub fn groups(&self) -> impl Iterator<Item = &BlockGroup> {
        self.groups.values()
    }

    pub fn group_containing(&self, bytenr: u64) -> Option<&BlockGroup> {
        let (_, g) = self.groups.range(..=bytenr).next_back()?;
        (bytenr < g.start + g.len).then_some(g)
    }

    fn group_mut_containing(&mut self, bytenr: u64) -> Option<&mut BlockGroup> {
        let (_, g) = self.groups.range_mut(..=bytenr).next_back()?;
        (bytenr < g.start + g.len).then_some(g)
    }

    /// Allocates between `min` and `max` bytes of `kind`, as near `hint` as
    /// the free space allows. Returns `(start, len)`.
    pub fn alloc(&mut self, kind: GroupKind, min: u64, max: u64, hint: u64) -> Result<(u64, u64)> {
        if min == 0 || min > max {
            return Err(Error::Invalid(format!("allocation of {min}..{max} bytes")));
        }
        let found = self.try_alloc_in_groups(kind, min, max, hint);
        let (start, len) = match found {
            Some(x) => x,
            None => {
                self.add_group(kind, max)?;
                self.try_alloc_in_groups(kind, min, max, hint)
                    .ok_or(Error::NoSpace)?
            }
        };
        self.take(start, len);
        Ok((start, len))
    }

    /// Allocates exactly `[start, start+len)` if all of it is free.
    pub fn alloc_exact(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.group_mut_containing(start).ok_or(Error::NoSpace)?;
        if !g.free.contains(start, len) {
            return Err(Error::NoSpace);
        }
        self.take(start, len);
        Ok(())
    }

    fn try_alloc_in_groups(
        &self,
        kind: GroupKind,
        min: u64,
        max: u64,
        hint: u64,
    ) -> Option<(u64, u64)> {
        // The hint's own group first, then the others nearest the hint first.
        let mut order: Vec<&BlockGroup> = self.groups.values().filter(|g| g.kind == kind).collect();
        order.sort_by_key(|g| {
            if hint >= g.start && hint < g.start + g.len {
                0
            } else {
                g.start.abs_diff(hint).saturating_add(1)
            }
        });
        order.into_iter().find_map(|g| g.free.near(hint, min, max))
    }

    fn take(&mut self, start: u64, len: u64) {
        if let Some(g) = self.group_mut_containing(start) {
            g.free.remove(start, len);
            g.used += len;
            let s = g.start;
            self.dirty_groups.insert(s);
        }
        self.journal.push(FreeOp::Remove(start, len));
    }

    /// Frees an extent. Unless `never_committed`, the space stays pinned
    /// until [`Allocator::unpin`] after the commit.
    pub fn free(&mut self, start: u64, len: u64, never_committed: bool) -> Result<()> {
        let g = self
            .group_mut_containing(start)
            .ok_or_else(|| Error::corrupt(start, "freeing space outside any block group"))?;
        g.used = g
            .used
            .checked_sub(len)
            .ok_or_else(|| Error::corrupt(start, "block group used bytes underflow"))?;
        if never_committed {
            g.free.insert(start, len);
        }
        let s = g.start;
        if !never_committed {
            self.pinned.push((start, len));
        }
        self.dirty_groups.insert(s);
        self.journal.push(FreeOp::Add(start, len));
        Ok(())
    }

    /// Takes the extents pinned so far; pass them to [`Allocator::unpin`]
    /// once the commit that freed them is durable.
    pub fn take_pinned(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.pinned)
    }

    pub fn unpin(&mut self, extents: Vec<(u64, u64)>) {
        for (start, len) in extents {
            if let Some(g) = self.group_mut_containing(start) {
                g.free.insert(start, len);
            }
        }
    }

    pub fn take_journal(&mut self) -> Vec<FreeOp> {
        std::mem::take(&mut self.journal)
    }

    pub fn take_dirty_groups(&mut self) -> Vec<BlockGroup> {
        let starts = std::mem::take(&mut self.dirty_groups);
        starts
            .into_iter()
            .filter_map(|s| self.groups.get(&s).cloned())
            .collect()
    }

    pub fn bytes_used(&self) -> u64 {
        self.groups.values().map(|g| g.used).sum()
    }

    /// Free bytes: in groups, plus device space not yet in any group.
    pub fn bytes_free(&self) -> u64 {
        let in_groups: u64 = self.groups.values().map(|g| g.free.total()).sum();
        in_groups + self.unallocated_bytes()
    }

    fn free_in(&self, kind: GroupKind) -> u64 {
        self.groups
            .values()
            .filter(|g| g.kind == kind)
            .map(|g| g.free.total())
            .sum()
    }

    /// Whether `data_bytes` of data can be written while leaving metadata
    /// space for at least `meta_reserve` bytes of tree blocks (so that the
    /// commit, and deleting files later, never run out of room).
    pub fn has_room(&self, data_bytes: u64, meta_reserve: u64) -> bool {
        let mut unallocated = self.unallocated_bytes();
        let data_free = self.free_in(GroupKind::Data);
        if data_bytes > data_free {
            // New data groups come out of unallocated space, in group units.
            let group = groups::default_size(GroupKind::Data, self.device_bytes);
            let need = (data_bytes - data_free).div_ceil(group) * group;
            let need = need.min(unallocated.max(data_bytes - data_free));
            if need > unallocated {
                return false;
            }
            unallocated -= need;
        }
        self.free_in(GroupKind::Metadata) + unallocated >= meta_reserve
            && self.free_in(GroupKind::System) + unallocated >= meta_reserve / 8
    }

    fn unallocated_bytes(&self) -> u64 {
        let grouped: u64 = self.groups.values().map(|g| g.len).sum();
        self.device_bytes
            .saturating_sub(RESERVED_START)
            .saturating_sub(grouped)
    }

    /// Carves a new block group of `kind` able to hold `want` bytes.
    fn add_group(&mut self, kind: GroupKind, want: u64) -> Result<()> {
        let target =
            groups::default_size(kind, self.device_bytes).max(want.next_multiple_of(1 << 20));
        let (start, len) = self.find_device_gap(target, want).ok_or(Error::NoSpace)?;
        let mut g = BlockGroup::new(start, len, kind, 0);
        for (s, l) in free_ranges_excluding_supers(start, len) {
            g.free.insert(s, l);
            self.journal.push(FreeOp::Add(s, l));
        }
        self.dirty_groups.insert(start);
        tracing::debug!(start, len, ?kind, "new block group");
        self.groups.insert(start, g);
        Ok(())
    }

    /// The first gap between groups of at least `min` bytes, up to `target`.
    fn find_device_gap(&self, target: u64, min: u64) -> Option<(u64, u64)> {
        let mut at = RESERVED_START;
        let ends = self
            .groups
            .values()
            .map(|g| (g.start, g.start + g.len))
            .chain(std::iter::once((self.device_bytes, self.device_bytes)));
        for (gs, ge) in ends {
            let gap = gs.saturating_sub(at);
            // A gap must hold `min` even after superblock copies are cut out.
            if gap >= min + SUPER_SIZE {
                let len = gap.min(target);
                return Some((at, len - len % crate::format::SECTORSIZE as u64));
            }
            at = at.max(ge);
        }
        None
    }

    /// Kinds of tree blocks: the root tree lives in system groups.
    pub fn kind_for_tree(tree_id: u64) -> GroupKind {
        if tree_id == crate::format::tree_id::ROOT {
            GroupKind::System
        } else {
            GroupKind::Metadata
        }
    }

    /// Free-space histogram like `xfs_db freesp`: (bucket low, extents, bytes)
    /// for power-of-two buckets of extent length in sectors.
    pub fn free_histogram(&self) -> Vec<(u64, u64, u64)> {
        let mut buckets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for g in self.groups.values() {
            for (_, len) in g.free.iter() {
                let sectors = len / crate::format::SECTORSIZE as u64;
                let low = if sectors == 0 {
                    0
                } else {
                    1 << sectors.ilog2()
                };
                let e = buckets.entry(low).or_default();
                e.0 += 1;
                e.1 += len;
            }
        }
        buckets.into_iter().map(|(k, (n, b))| (k, n, b)).collect()
    }
}

impl GroupKind {
    pub fn flags(self) -> u64 {
        match self {
            GroupKind::Data => BG_DATA,
            GroupKind::Metadata => BG_METADATA,
            GroupKind::System => BG_SYSTEM,
        }
    }

    pub fn from_flags(flags: u64) -> Option<GroupKind> {
        match flags {
            BG_DATA => Some(GroupKind::Data),
            BG_METADATA => Some(GroupKind::Metadata),
            BG_SYSTEM => Some(GroupKind::System),
            _ => None,
        }
    }
}

/// The ranges of `[start, start+len)` left after removing superblock copies.
pub fn free_ranges_excluding_supers(start: u64, len: u64) -> Vec<(u64, u64)> {
    let end = start + len;
    let mut out = Vec::new();
    let mut at = start;
    for &s in SUPER_OFFSETS
        .iter()
        .filter(|&&s| s + SUPER_SIZE > start && s < end)
    {
        if s > at {
            out.push((at, s - at));
        }
        at = at.max(s + SUPER_SIZE);
    }
    if at < end {
        out.push((at, end - at));
    }
    out
}

/// Bytes of superblock copies inside `[start, start+len)`.
pub fn super_bytes_in(start: u64, len: u64) -> u64 {
    let free: u64 = free_ranges_excluding_supers(start, len)
        .iter()
        .map(|r| r.1)
        .sum();
    len - free
}
