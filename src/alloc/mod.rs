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
//! the previous extent of a file), exact, and by size. A request names a
//! range of lengths: the whole of it where the free space has it, a
//! shorter piece where it is fragmented.
//!
//! Images under 1 GiB use *mixed* groups (data and tree blocks together):
//! with separate groups, a small device strands a large share of its space
//! in groups of the wrong kind. On larger images, new groups of one kind
//! leave the unallocated space the other kinds have been promised
//! ([`Claims`], set by the reservations in `txn::space`), and a group that
//! empties goes back to the unallocated pool at the next commit, so space
//! moves between data and metadata as needs change.
//!
//! A group of the `dup` profile (tree blocks, by default on images of a
//! GiB or more) takes two ranges of the device: the group's own, where its
//! first copy lies, and its mirror, which holds nothing else and contains
//! no superblock copy. A `raid1` group's second copy lies on another
//! device, a `raid1c3` group's second and third on two others, each on
//! the device with the most unallocated space that has room. The first
//! copy of every group lies on device 1 (see `volume`). The allocator
//! records the copies in the [`ChunkMap`] it shares with the engine's
//! [`crate::volume::Volume`], which writes every copy.

mod freespace;
pub mod groups;

pub use freespace::FreeIndex;
pub use groups::{BlockGroup, GroupKind};

use crate::error::{Error, Result};
use crate::format::items::{Stripe, BG_DATA, BG_METADATA, BG_MIXED, BG_SYSTEM};
use crate::format::superblock::{Profile, SystemChunk};
use crate::format::{RESERVED_START, SUPER_OFFSETS, SUPER_SIZE};
use crate::volume::{ChunkMap, PRIMARY_DEVID};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

/// The order `SpaceUsage` lists kinds in, as btrfs does.
const KIND_ORDER: [&str; 4] = ["data", "mixed", "metadata", "system"];

/// A change of the persistent free space, replayed into the free-space trees
/// at commit in the order it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOp {
    /// `[start, start+len)` became free.
    Add(u64, u64),
    /// `[start, start+len)` was allocated.
    Remove(u64, u64),
}

/// Bytes each kind of extent has been promised (see `txn::space`): what
/// the running operations and the commit may still allocate. New groups
/// of one kind leave enough unallocated space for the others' shortfall,
/// so data can never take the last space a promised commit needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    pub data: u64,
    pub metadata: u64,
    pub system: u64,
    /// The tree block size metadata and system claims are made of (0:
    /// count bytes only). In mixed groups only whole blocks of it count
    /// toward them: holes data left smaller than a tree block hold none.
    pub block: u64,
}

/// Device bytes new groups take: on device 1 (the bound layout's first
/// copies), and on the devices that take the other copies together
/// (`distinct`: the most copies of one group that must lie on distinct
/// devices among those).
#[derive(Clone, Copy, Debug, Default)]
struct Need {
    primary: u64,
    others: u64,
    distinct: u64,
}

impl Need {
    fn plus(self, o: Need) -> Need {
        Need {
            primary: self.primary + o.primary,
            others: self.others + o.others,
            distinct: self.distinct.max(o.distinct),
        }
    }
}

/// Device bytes that devices with `free` unallocated bytes each can give
/// to groups whose copies need `distinct` different devices: `x` bytes
/// per device at most, the largest `x` for which the devices hold
/// `distinct` copies of it.
fn spread_capacity(free: &[u64], distinct: u64) -> u64 {
    let sum: u64 = free.iter().sum();
    if distinct <= 1 {
        return sum;
    }
    let holds = |x: u64| free.iter().map(|&f| f.min(x)).sum::<u64>() >= distinct * x;
    let (mut lo, mut hi) = (0u64, sum / distinct);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match holds(mid) {
            true => lo = mid,
            false => hi = mid - 1,
        }
    }
    distinct * lo
}

/// How the device is carved into groups, per kind (`canopy filesystem
/// usage`, after `btrfs filesystem usage`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceUsage {
    /// Every device's size, summed.
    pub device_bytes: u64,
    /// Device space in no group: new groups of any kind come from here,
    /// and balance gives emptied groups back to it.
    pub unallocated: u64,
    pub kinds: Vec<KindUsage>,
}

/// A filesystem and its devices (`canopy filesystem show`, after
/// `btrfs filesystem show`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemShow {
    pub label: String,
    pub uuid: String,
    /// Bytes extents hold (each counted once, however many copies).
    pub bytes_used: u64,
    pub devices: Vec<DeviceShow>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceShow {
    pub devid: u64,
    pub size: u64,
    /// Bytes of the device in block groups, second copies included.
    pub allocated: u64,
    /// The filesystem names the device but the open found it missing
    /// (a degraded mount).
    #[serde(default)]
    pub missing: bool,
    /// What the opener called it, when it named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The groups of one kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindUsage {
    /// `data`, `metadata`, `system` or `mixed`.
    pub kind: String,
    /// `single` or `dup`: how many copies the groups keep.
    #[serde(default)]
    pub profile: String,
    pub groups: u64,
    /// Bytes of those groups.
    pub size: u64,
    /// Bytes their extents hold.
    pub used: u64,
}

impl KindUsage {
    /// Device bytes the groups take: their size times their copies.
    pub fn device_bytes(&self) -> u64 {
        let copies = Profile::parse(&self.profile).map_or(1, Profile::copies);
        copies as u64 * self.size
    }
}

pub struct Allocator {
    groups: BTreeMap<u64, BlockGroup>,
    device_bytes: u64,
    /// Every group is [`GroupKind::Mixed`].
    mixed: bool,
    journal: Vec<FreeOp>,
    pinned: Vec<(u64, u64)>,
    dirty_groups: BTreeSet<u64>,
    claims: Claims,
    /// Bytes [`Allocator::begin_discard`] keeps out of the groups' free
    /// space: free all the same for what statfs reports.
    discarding: u64,
    /// The group balance is emptying: nothing new goes there, and its
    /// free space counts for nobody.
    readonly: BTreeSet<u64>,
    /// Groups a balance will empty later: new extents go elsewhere while
    /// anything else (a new group included) can take them, so balance
    /// does not move them twice, but their free space still counts, so a
    /// balance never takes away space already promised.
    pending: BTreeSet<u64>,
    /// Groups created since the last commit was prepared: no durable
    /// superblock knows them yet, so a log must not name their space
    /// (see `txn::log`).
    added_since_commit: BTreeSet<u64>,
    /// Profile of new groups for tree blocks (metadata, system, mixed).
    metadata_profile: Profile,
    /// Profile of new data groups.
    data_profile: Profile,
    /// Second copies, shared with the engine's volume.
    map: Arc<ChunkMap>,
    /// Every device's usable bytes, by devid (device 1's is
    /// `device_bytes`).
    other_devices: BTreeMap<u64, u64>,
    /// Most system groups the superblock names (see
    /// [`Allocator::system_chunks`]).
    system_chunks_max: usize,
    /// The superblock has the device table (see [`Allocator::set_devices`]).
    device_table: bool,
    /// Device 1 is in the table: always in the bound layout; in the
    /// mapped one until `device remove` takes it out.
    primary_in_table: bool,
    /// Devices being emptied (`canopy device remove`), or missing from a
    /// degraded open: no new copy goes there, and the groups with a copy
    /// there take no new extents.
    leaving: BTreeSet<u64>,
    /// A degraded open writes: a new group keeps the copies the devices
    /// present can hold when its profile asks for more.
    degraded: bool,
    /// Space that became reusable since the discard worker last looked
    /// (`txn::discard`); kept only while a mount discards.
    untrimmed: Option<Untrimmed>,
    /// Starts of the pinned ranges the log freed (while `untrimmed` is
    /// kept): noted apart when they become reusable ([`Untrimmed::log`]).
    log_pinned: HashSet<u64>,
    /// The mapped layout (see `volume`): every group names its first
    /// copy, placed on any device, at a logical address below
    /// `logical_bytes`.
    mapped: bool,
    logical_bytes: u64,
}

/// Space made reusable that the storage has not been told of yet.
#[derive(Debug, Default)]
pub struct Untrimmed {
    /// Logical ranges `(start, len)` made free in their group.
    pub logical: Vec<(u64, u64)>,
    /// Device ranges `(devid, offset, len)` of groups given back to the
    /// unallocated pool.
    pub device: Vec<(u64, u64, u64)>,
    /// Logical ranges the fsync log used and freed: likely its next
    /// transaction's again, so `discard=async` holds them while fsyncs
    /// keep coming (`txn::discard`).
    pub log: Vec<(u64, u64)>,
}

impl Allocator {
    pub fn new(device_bytes: u64, mixed: bool) -> Allocator {
        Allocator {
            metadata_profile: Profile::Single,
            data_profile: Profile::Single,
            map: Arc::new(ChunkMap::default()),
            other_devices: BTreeMap::new(),
            system_chunks_max: crate::format::superblock::SYSTEM_CHUNKS_MAX,
            device_table: false,
            primary_in_table: true,
            leaving: BTreeSet::new(),
            degraded: false,
            groups: BTreeMap::new(),
            device_bytes,
            mixed,
            journal: Vec::new(),
            pinned: Vec::new(),
            dirty_groups: BTreeSet::new(),
            claims: Claims::default(),
            discarding: 0,
            readonly: BTreeSet::new(),
            pending: BTreeSet::new(),
            added_since_commit: BTreeSet::new(),
            untrimmed: None,
            log_pinned: HashSet::new(),
            mapped: false,
            logical_bytes: device_bytes,
        }
    }

    /// Chooses the mapped layout, with a logical address space of
    /// `logical_bytes` (the superblock's total bytes).
    pub fn set_mapped(&mut self, logical_bytes: u64) {
        self.mapped = true;
        self.logical_bytes = logical_bytes;
        self.map.set_mapped(true);
        self.system_chunks_max = crate::format::superblock::SYSTEM_CHUNKS_MAX_MAPPED;
    }

    /// Whether every group names its first copy.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// Moves the end of the mapped layout's logical address space (a
    /// device added or grown).
    pub fn set_logical_bytes(&mut self, logical_bytes: u64) {
        self.logical_bytes = self.logical_bytes.max(logical_bytes);
    }

    /// Starts (or stops) noting the space made reusable, for
    /// [`Allocator::take_untrimmed`].
    pub fn track_untrimmed(&mut self, on: bool) {
        match on {
            true => {
                self.untrimmed.get_or_insert_with(Untrimmed::default);
            }
            false => {
                self.untrimmed = None;
                self.log_pinned.clear();
            }
        }
    }

    /// The space made reusable since the last call (none unless tracked).
    pub fn take_untrimmed(&mut self) -> Untrimmed {
        self.untrimmed
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn note_reusable(&mut self, start: u64, len: u64) {
        if let Some(u) = &mut self.untrimmed {
            match self.log_pinned.remove(&start) {
                true => u.log.push((start, len)),
                false => u.logical.push((start, len)),
            }
        }
    }

    /// Sets the profiles new groups get.
    pub fn set_profiles(&mut self, metadata: Profile, data: Profile) {
        self.metadata_profile = metadata;
        self.data_profile = data;
    }

    /// The profile new groups of `kind` get.
    pub fn profile(&self, kind: GroupKind) -> Profile {
        match kind {
            GroupKind::Data => self.data_profile,
            GroupKind::Metadata | GroupKind::System | GroupKind::Mixed => self.metadata_profile,
        }
    }

    /// Sets the devices beyond device 1 (devid, usable bytes) and whether
    /// the superblock has the device table (it then names up to
    /// `SYSTEM_CHUNKS_MAX_DEVICES` groups, mixed ones included).
    pub fn set_devices(&mut self, others: BTreeMap<u64, u64>, device_table: bool) {
        use crate::format::superblock::{SYSTEM_CHUNKS_MAX, SYSTEM_CHUNKS_MAX_DEVICES};
        self.other_devices = others;
        self.primary_in_table = self.other_devices.remove(&PRIMARY_DEVID).is_some();
        self.device_table = device_table;
        self.system_chunks_max = match (self.mapped, device_table) {
            (true, _) => crate::format::superblock::SYSTEM_CHUNKS_MAX_MAPPED,
            (false, true) => SYSTEM_CHUNKS_MAX_DEVICES,
            (false, false) => SYSTEM_CHUNKS_MAX,
        };
    }

    /// Whether the superblock names the copies of groups of `kind`: those
    /// that hold the root tree and the block group tree, read before the
    /// block group items are. On a mixed image those are mixed groups;
    /// only a filesystem of several devices names them (with device 1
    /// present, copy 0 reads without the map).
    pub fn named_in_superblock(&self, kind: GroupKind) -> bool {
        kind == GroupKind::System || kind == GroupKind::Mixed && self.device_table
    }

    /// Marks device `devid` as being emptied (no new copy goes there, and
    /// the groups with a copy there take no new extents) or not.
    pub fn set_leaving(&mut self, devid: u64, leaving: bool) {
        match leaving {
            true => self.leaving.insert(devid),
            false => self.leaving.remove(&devid),
        };
    }

    /// Devices a degraded open lacks: nothing new goes there, and new
    /// groups keep the copies the others can hold.
    pub fn set_missing(&mut self, devids: &[u64]) {
        for &d in devids {
            self.leaving.insert(d);
        }
        self.degraded = !devids.is_empty();
    }

    /// The devices besides device 1 that take new copies.
    fn staying_others(&self) -> impl Iterator<Item = u64> + '_ {
        self.other_devices
            .keys()
            .copied()
            .filter(|d| !self.leaving.contains(d))
    }

    /// The devices that take the copies a new group keeps beyond its
    /// bound first copy: the others in the bound layout, every staying
    /// device in the mapped one.
    fn spread_devices(&self) -> Vec<u64> {
        let staying = self.has_primary() && !self.leaving.contains(&PRIMARY_DEVID);
        let primary = (self.mapped && staying).then_some(PRIMARY_DEVID);
        primary.into_iter().chain(self.staying_others()).collect()
    }

    /// Every device's id and usable bytes, device 1 first.
    pub fn devices(&self) -> Vec<(u64, u64)> {
        let primary = self
            .has_primary()
            .then_some((PRIMARY_DEVID, self.device_bytes));
        primary
            .into_iter()
            .chain(self.other_devices.iter().map(|(&d, &b)| (d, b)))
            .collect()
    }

    /// Whether device 1 is one of the filesystem's (the mapped layout
    /// can remove it).
    fn has_primary(&self) -> bool {
        !self.mapped || self.primary_in_table
    }

    fn device_size(&self, devid: u64) -> Option<u64> {
        match devid {
            PRIMARY_DEVID => self.has_primary().then_some(self.device_bytes),
            _ => self.other_devices.get(&devid).copied(),
        }
    }

    /// The profile new groups of `kind` get on this image.
    fn new_profile(&self, kind: GroupKind) -> Profile {
        self.profile(self.group_kind(kind))
    }

    /// The map of second copies the engine's volume writes through.
    pub fn chunk_map(&self) -> Arc<ChunkMap> {
        self.map.clone()
    }

    /// The other copies of the groups the superblock names (see
    /// [`Allocator::named_in_superblock`]), the first that fit.
    pub fn system_chunks(&self) -> Vec<SystemChunk> {
        self.groups
            .values()
            .filter(|g| self.named_in_superblock(g.kind))
            .filter(|g| self.mapped || !g.extra.is_empty())
            .take(self.system_chunks_max)
            .map(|g| SystemChunk {
                start: g.start,
                len: g.len,
                first: g.first,
                extra: g.extra.clone(),
            })
            .collect()
    }

    /// Moves the end of the device groups may use to `device_bytes`
    /// (the filesystem grew).
    pub fn grow(&mut self, device_bytes: u64) {
        self.device_bytes = self.device_bytes.max(device_bytes);
    }

    /// Whether a group was created since the last commit was prepared.
    pub fn added_groups_since_commit(&self) -> bool {
        !self.added_since_commit.is_empty()
    }

    /// The commit being prepared records every group there is.
    pub fn groups_committed(&mut self) {
        self.added_since_commit.clear();
    }

    /// Whether data and tree blocks share groups.
    pub fn is_mixed(&self) -> bool {
        self.mixed
    }

    /// The kind of group that holds extents of `kind` on this image.
    pub fn group_kind(&self, kind: GroupKind) -> GroupKind {
        if self.mixed {
            GroupKind::Mixed
        } else {
            kind
        }
    }

    /// Adds a group loaded from disk (`[start, start + len)`, `used`
    /// bytes in use), with the kind and copies its item names; its free
    /// space follows with [`Allocator::load_free`].
    pub fn load_group(
        &mut self,
        start: u64,
        len: u64,
        used: u64,
        item: &crate::format::items::BlockGroupItem,
    ) -> Result<()> {
        let (flags, first, striped) = (item.flags, item.first, item.striped);
        let extra = item.extra.clone();
        let kind = GroupKind::from_flags(flags)
            .ok_or_else(|| Error::corrupt(start, format!("block group flags {flags:#x}")))?;
        if (kind == GroupKind::Mixed) != self.mixed {
            return Err(Error::corrupt(
                start,
                "block group kind does not match the image's mixed-groups feature",
            ));
        }
        if first.is_some() != self.mapped {
            return Err(Error::corrupt(
                start,
                "block group item of the other layout (mapped or bound) than the image's",
            ));
        }
        if start
            .checked_add(len)
            .is_none_or(|e| e > self.logical_bytes)
            || start < RESERVED_START
        {
            return Err(Error::corrupt(start, "block group outside the device"));
        }
        let logical_clash = self
            .groups
            .range(..start + len)
            .next_back()
            .is_some_and(|(_, o)| o.start + o.len > start);
        if self.mapped && logical_clash {
            return Err(Error::corrupt(start, "block groups overlap"));
        }
        let devices = 1 + extra.len() as u64;
        let pairs = devices / 2;
        let whole_units = pairs > 0 && len.is_multiple_of(pairs * crate::volume::STRIPE_UNIT);
        if striped && (first.is_none() || extra.len() % 2 != 1 || !whole_units) {
            return Err(Error::corrupt(
                start,
                "raid10 block group outside the mapped layout, over an odd number of devices, or not in whole units",
            ));
        }
        let mut g = BlockGroup::new(start, len, kind, used);
        g.first = first;
        g.extra = extra;
        g.striped = striped;
        let ranges: Vec<(u64, u64, u64)> = g.ranges().collect();
        for (i, &(devid, s, e)) in ranges.iter().enumerate() {
            self.check_copy_range(start, devid, s, e, i > 0 || self.mapped)?;
            let clash = ranges[..i]
                .iter()
                .any(|&(d, os, oe)| d == devid && os < e && s < oe);
            if clash {
                return Err(Error::corrupt(
                    start,
                    format!("copies of the block group overlap on device {devid}"),
                ));
            }
        }
        self.insert_group(g);
        Ok(())
    }

    /// A loaded group's copy `[s, e)` on `devid` lies inside that device,
    /// apart from every other group's ranges and (for copies beyond the
    /// first) from superblock copies.
    fn check_copy_range(&self, group: u64, devid: u64, s: u64, e: u64, extra: bool) -> Result<()> {
        let size = self.device_size(devid).ok_or_else(|| {
            Error::corrupt(group, format!("block group copy on unknown device {devid}"))
        })?;
        if s < RESERVED_START || e > size || (extra && super_bytes_in(s, e - s) != 0) {
            return Err(Error::corrupt(
                group,
                format!("copy at {s} on device {devid} outside the usable device"),
            ));
        }
        if self.occupied(devid).any(|(os, oe)| os < e && s < oe) {
            return Err(Error::corrupt(
                group,
                format!("copy at {s} on device {devid} overlaps a block group"),
            ));
        }
        Ok(())
    }

    /// Puts a group in the table and its other copies in the chunk map.
    fn insert_group(&mut self, g: BlockGroup) {
        if self.mapped || !g.extra.is_empty() {
            self.map.insert(g.chunk());
        }
        self.groups.insert(g.start, g);
    }

    /// Every range of device `devid` a group holds, in no particular
    /// order.
    fn occupied(&self, devid: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.groups.values().flat_map(move |g| {
            g.ranges()
                .filter(move |r| r.0 == devid)
                .map(|(_, s, e)| (s, e))
        })
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

    /// The free pieces of `[start, start+len)`, across every group it
    /// reaches.
    pub fn free_within(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let end = start.saturating_add(len);
        let first = self.group_containing(start).map_or(start, |g| g.start);
        self.groups
            .range(first..end)
            .flat_map(|(_, g)| {
                let (a, b) = (start.max(g.start), end.min(g.start + g.len));
                match b > a {
                    true => g.free.within(a, b - a),
                    false => Vec::new(),
                }
            })
            .collect()
    }

    fn group_mut_containing(&mut self, bytenr: u64) -> Option<&mut BlockGroup> {
        let (_, g) = self.groups.range_mut(..=bytenr).next_back()?;
        (bytenr < g.start + g.len).then_some(g)
    }

    /// Allocates between `min` and `max` bytes of `kind`, as near `hint` as
    /// the free space allows. Returns `(start, len)`.
    ///
    /// The whole `max` is looked for in the existing groups first, then in
    /// a new group; only when neither has it does a shorter piece (at least
    /// `min`) do, so fragmented free space still takes a write while a
    /// clean device keeps its extents long. Groups a balance will empty,
    /// and groups of another profile than new ones get, come last.
    pub fn alloc(&mut self, kind: GroupKind, min: u64, max: u64, hint: u64) -> Result<(u64, u64)> {
        let (start, len) = self.alloc_transient(kind, min, max, hint)?;
        self.journal.push(FreeOp::Remove(start, len));
        Ok((start, len))
    }

    /// Allocates like [`Allocator::alloc`] space that the running
    /// transaction frees again before its commit (the log's blocks, see
    /// `txn::log`), without telling the free-space tree: the space is
    /// free there at every commit, and the log of a busy fsync workload
    /// takes thousands of blocks per transaction, each of which would
    /// otherwise cost the commit two edits of that tree.
    pub fn alloc_transient(
        &mut self,
        kind: GroupKind,
        min: u64,
        max: u64,
        hint: u64,
    ) -> Result<(u64, u64)> {
        if min == 0 || min > max {
            return Err(Error::Invalid(format!("allocation of {min}..{max} bytes")));
        }
        let kind = self.group_kind(kind);
        let found = self
            .try_alloc_in_groups(kind, max, max, hint, false)
            .or_else(|| {
                self.add_group(kind, max).ok()?;
                self.try_alloc_in_groups(kind, max, max, hint, false)
            })
            .or_else(|| self.try_alloc_in_groups(kind, min, max, hint, false))
            .or_else(|| {
                self.add_group(kind, min).ok()?;
                self.try_alloc_in_groups(kind, min, max, hint, false)
            })
            .or_else(|| self.try_alloc_in_groups(kind, min, max, hint, true));
        let (start, len) = found.ok_or(Error::NoSpace)?;
        self.take(start, len);
        Ok((start, len))
    }

    /// Allocates `len` bytes of `kind` like [`Allocator::alloc_transient`],
    /// but only in groups that exist already: for a log chain's link,
    /// which a superblock about to be written names (`txn::log`), so it
    /// must lie in a group that superblock knows. None when none has room.
    pub fn alloc_transient_in_existing(
        &mut self,
        kind: GroupKind,
        len: u64,
        hint: u64,
    ) -> Option<u64> {
        let kind = self.group_kind(kind);
        let (start, len) = self.try_alloc_in_groups(kind, len, len, hint, false)?;
        self.take(start, len);
        Some(start)
    }

    /// Allocates exactly `[start, start+len)` if all of it is free.
    pub fn alloc_exact(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self.group_mut_containing(start).ok_or(Error::NoSpace)?;
        if !g.free.contains(start, len) {
            return Err(Error::NoSpace);
        }
        self.take(start, len);
        self.journal.push(FreeOp::Remove(start, len));
        Ok(())
    }

    /// Allocates `len` bytes of `kind` near `hint` whose start lies on a
    /// multiple of `unit` on the device (the storage's unit of writing,
    /// see `Device::write_unit`), in free space that holds `room` bytes
    /// from there on, so that a run of extents allocated after it, each
    /// at the end of the one before, stays on whole units. A new group is
    /// made when none has such room; None when none can be (the caller
    /// then allocates as usual) or the group is striped (RAID10: no one
    /// device offset to align).
    ///
    /// The bytes between `hint` and the aligned start stay free, as XFS
    /// leaves them before a stripe-aligned allocation; shorter extents
    /// fill them later.
    pub fn alloc_aligned(
        &mut self,
        kind: GroupKind,
        (len, room): (u64, u64),
        hint: u64,
        unit: u64,
    ) -> Option<(u64, u64)> {
        let sector = crate::format::SECTORSIZE as u64;
        if unit < sector || !unit.is_power_of_two() || len == 0 || room < len {
            return None;
        }
        let kind = self.group_kind(kind);
        let start = match self.aligned_room_at(kind, hint, room, unit) {
            true => hint,
            false => {
                let want = room.checked_add(unit - sector)?;
                let (found, _) = self
                    .try_alloc_in_groups(kind, want, want, hint, false)
                    .or_else(|| {
                        self.add_group(kind, want).ok()?;
                        self.try_alloc_in_groups(kind, want, want, hint, false)
                    })?;
                let start = self.aligned_on_device(found, unit)?;
                debug_assert!(start + room <= found + want, "aligned start past the room");
                start
            }
        };
        self.take(start, len);
        self.journal.push(FreeOp::Remove(start, len));
        Some((start, len))
    }

    /// Whether `at` lies on a unit boundary with `room` free bytes from
    /// there in a writable group of `kind` (a sequential writer's next
    /// extent, whose previous one ended on a boundary).
    fn aligned_room_at(&self, kind: GroupKind, at: u64, room: u64, unit: u64) -> bool {
        let Some(g) = self
            .writable_groups(kind)
            .find(|g| at >= g.start && at < g.start + g.len)
        else {
            return false;
        };
        !self.is_last_resort(g, self.new_group_profile(kind))
            && self.aligned_on_device(at, unit) == Some(at)
            && g.free.contains(at, room)
    }

    /// The first address at or after `logical` (in its group) whose place
    /// on the device is a multiple of `unit` (a power of two, a multiple
    /// of the sector size); None in a striped group.
    fn aligned_on_device(&self, logical: u64, unit: u64) -> Option<u64> {
        let (_, g) = self.groups.range(..=logical).next_back()?;
        if g.striped || logical >= g.start + g.len {
            return None;
        }
        let physical = match &g.first {
            Some(stripe) => stripe.offset + (logical - g.start),
            None => logical,
        };
        Some(logical + (physical.next_multiple_of(unit) - physical))
    }

    /// Whether `g` takes new extents only when no other group can: a
    /// balance will empty it, or it has another profile than `profile`,
    /// the one new groups of its kind get (a conversion left it).
    fn is_last_resort(&self, g: &BlockGroup, profile: Profile) -> bool {
        self.pending.contains(&g.start) || g.profile() != profile
    }

    fn try_alloc_in_groups(
        &self,
        kind: GroupKind,
        min: u64,
        max: u64,
        hint: u64,
        pending: bool,
    ) -> Option<(u64, u64)> {
        // The hint's own group first, then the others nearest the hint
        // first. Groups of another profile than new ones get (a
        // conversion left them, or will empty them) come last, as those
        // a balance will empty.
        let profile = self.new_group_profile(kind);
        let mut order: Vec<&BlockGroup> = self
            .writable_groups(kind)
            .filter(|g| self.is_last_resort(g, profile) == pending)
            .collect();
        order.sort_by_key(|g| {
            if hint >= g.start && hint < g.start + g.len {
                0
            } else {
                g.start.abs_diff(hint).saturating_add(1)
            }
        });
        // No hint (0): by size, so that a new file fills a hole of its
        // size rather than cutting into the nearest larger one.
        order.into_iter().find_map(|g| match hint {
            0 => g.free.by_size(min, max),
            h => g.free.near(h, min, max),
        })
    }

    fn take(&mut self, start: u64, len: u64) {
        if let Some(g) = self.group_mut_containing(start) {
            g.free.remove(start, len);
            g.used += len;
            let s = g.start;
            self.dirty_groups.insert(s);
        }
    }

    /// Frees an extent. Unless `never_committed`, the space stays pinned
    /// until [`Allocator::unpin`] after the commit.
    pub fn free(&mut self, start: u64, len: u64, never_committed: bool) -> Result<()> {
        self.give_back(start, len, never_committed)?;
        self.journal.push(FreeOp::Add(start, len));
        Ok(())
    }

    /// Frees space taken by [`Allocator::alloc_transient`]: pinned until
    /// the commit is durable, and not told to the free-space tree either.
    pub fn free_transient(&mut self, start: u64, len: u64) -> Result<()> {
        self.give_back(start, len, false)?;
        if self.untrimmed.is_some() {
            self.log_pinned.insert(start);
        }
        Ok(())
    }

    /// Frees space taken by [`Allocator::alloc_transient`] that nothing
    /// was ever written to: reusable at once.
    pub fn free_transient_unused(&mut self, start: u64, len: u64) -> Result<()> {
        self.give_back(start, len, true)
    }

    fn give_back(&mut self, start: u64, len: u64, never_committed: bool) -> Result<()> {
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
        if never_committed {
            self.note_reusable(start, len);
        } else {
            self.pinned.push((start, len));
        }
        self.dirty_groups.insert(s);
        Ok(())
    }

    /// Keeps `[start, start+len)`, free on disk, out of allocations without
    /// recording anything (a pending log's blocks and extents).
    pub fn exclude(&mut self, start: u64, len: u64) -> Result<()> {
        let g = self
            .group_mut_containing(start)
            .ok_or_else(|| Error::corrupt(start, "log names space outside any block group"))?;
        if !g.free.contains(start, len) {
            return Err(Error::corrupt(
                start,
                "log names space the last commit does not have free",
            ));
        }
        g.free.remove(start, len);
        Ok(())
    }

    /// Keeps free ranges out of allocations while a discard of them runs
    /// outside the state lock, recording nothing: on disk they stay free.
    /// A group holding one is not empty, so no commit removes it
    /// meanwhile. Only when what has been promised, plus twice the bytes
    /// taken, can still be met without them: a discard must never be why
    /// an operation finds no space. False, with nothing taken, otherwise
    /// (or when a range is not free in one group). `pieces` must not
    /// overlap. [`Allocator::end_discard`] gives them back.
    pub fn begin_discard(&mut self, pieces: &[(u64, u64)]) -> bool {
        let mut taken = Vec::with_capacity(pieces.len());
        for &(start, len) in pieces {
            let Some(g) = self.group_mut_containing(start) else {
                break;
            };
            if !g.free.remove(start, len) {
                break;
            }
            taken.push((start, len));
        }
        let bytes: u64 = taken.iter().map(|p| p.1).sum();
        self.discarding += bytes;
        let margin = Claims {
            data: self.claims.data.saturating_add(bytes.saturating_mul(2)),
            ..self.claims
        };
        if taken.len() == pieces.len() && self.can_meet(&margin) {
            return true;
        }
        self.end_discard(&taken);
        false
    }

    /// Gives back the ranges [`Allocator::begin_discard`] took, as free
    /// as they were (not noted for discarding again).
    pub fn end_discard(&mut self, pieces: &[(u64, u64)]) {
        for &(start, len) in pieces {
            if let Some(g) = self.group_mut_containing(start) {
                g.free.insert(start, len);
            }
            self.discarding = self.discarding.saturating_sub(len);
        }
    }

    /// Makes an excluded range free again at once.
    pub fn include(&mut self, start: u64, len: u64) {
        if let Some(g) = self.group_mut_containing(start) {
            g.free.insert(start, len);
            self.note_reusable(start, len);
        }
    }

    /// Makes an excluded range free once the next commit is durable.
    pub fn release_excluded(&mut self, start: u64, len: u64) {
        self.pinned.push((start, len));
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
                self.note_reusable(start, len);
            }
        }
    }

    /// Bytes freed in the running transaction, reusable after its commit.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.iter().map(|p| p.1).sum()
    }

    /// Changes in the journal, not yet taken.
    pub fn journal_len(&self) -> usize {
        self.journal.len()
    }

    pub fn take_journal(&mut self) -> Vec<FreeOp> {
        std::mem::take(&mut self.journal)
    }

    /// Marks every group's item for rewriting at the next commit.
    pub fn mark_all_groups_dirty(&mut self) {
        self.dirty_groups.extend(self.groups.keys().copied());
    }

    pub fn take_dirty_groups(&mut self) -> Vec<BlockGroup> {
        let starts = std::mem::take(&mut self.dirty_groups);
        starts
            .into_iter()
            .filter_map(|s| self.groups.get(&s).cloned())
            .collect()
    }

    /// Takes an empty group out of use (see [`BlockGroup::is_empty`]) and
    /// returns its free ranges, which the caller removes from the
    /// free-space trees. Its space joins the unallocated pool at once:
    /// nothing the last commit reaches lies in it.
    pub fn remove_group(&mut self, start: u64) -> Option<BlockGroup> {
        if !self.groups.get(&start)?.is_empty() {
            return None;
        }
        self.dirty_groups.remove(&start);
        self.readonly.remove(&start);
        self.pending.remove(&start);
        tracing::debug!(start, "block group emptied: back to unallocated space");
        if let (Some(u), Some(g)) = (&mut self.untrimmed, self.groups.get(&start)) {
            let len = g.len;
            let copies = (0..self.map.copies(start, len))
                .filter_map(|copy| self.map.stripe_of(start, len, copy));
            u.device.extend(copies.map(|s| (s.devid, s.offset, len)));
        }
        self.map.remove(start);
        self.groups.remove(&start)
    }

    /// Starts of the groups that hold nothing.
    pub fn empty_groups(&self) -> Vec<u64> {
        self.groups
            .values()
            .filter(|g| g.is_empty())
            .map(|g| g.start)
            .collect()
    }

    pub fn bytes_used(&self) -> u64 {
        self.groups.values().map(|g| g.used).sum()
    }

    /// Free bytes: in groups (space being discarded too), plus device
    /// space not yet in any group.
    pub fn bytes_free(&self) -> u64 {
        let in_groups: u64 =
            self.groups.values().map(|g| g.free.total()).sum::<u64>() + self.discarding;
        in_groups + self.room_for(self.new_group_profile(GroupKind::Data), Need::default())
    }

    /// Unpinned free bytes in the groups holding extents of `kind` that
    /// take new extents.
    pub fn free_in(&self, kind: GroupKind) -> u64 {
        self.writable_groups(kind).map(|g| g.free.total()).sum()
    }

    /// The groups of `kind` new extents may go to.
    fn writable_groups(&self, kind: GroupKind) -> impl Iterator<Item = &BlockGroup> {
        let kind = self.group_kind(kind);
        self.groups
            .values()
            .filter(move |g| g.kind == kind && !self.readonly.contains(&g.start))
            .filter(|g| !g.ranges().any(|r| self.leaving.contains(&r.0)))
    }

    /// Makes the group at `start` take no new extents (balance empties
    /// it), or take them again. False when there is no such group. Its
    /// free space stops counting toward what was promised: the caller
    /// reserves after it and undoes it if the reservation fails.
    pub fn set_readonly(&mut self, start: u64, readonly: bool) -> bool {
        mark_group(&self.groups, &mut self.readonly, start, readonly)
    }

    pub fn is_readonly(&self, start: u64) -> bool {
        self.readonly.contains(&start)
    }

    /// Marks the group at `start` as one a balance will empty later (see
    /// `pending` above), or not. False when there is no such group.
    pub fn set_pending(&mut self, start: u64, pending: bool) -> bool {
        mark_group(&self.groups, &mut self.pending, start, pending)
    }

    /// Groups and bytes per kind, and the space in no group.
    pub fn usage(&self) -> SpaceUsage {
        let mut kinds: Vec<KindUsage> = Vec::new();
        for g in self.groups.values() {
            let name = g.kind.name();
            let profile = g.profile().name();
            let k = match kinds
                .iter()
                .position(|k| k.kind == name && k.profile == profile)
            {
                Some(i) => &mut kinds[i],
                None => {
                    kinds.push(KindUsage {
                        kind: name.to_string(),
                        profile: profile.to_string(),
                        ..KindUsage::default()
                    });
                    kinds.last_mut().expect("just pushed")
                }
            };
            k.groups += 1;
            k.size += g.len;
            k.used += g.used;
        }
        kinds.sort_by_key(|k| KIND_ORDER.iter().position(|&n| n == k.kind));
        SpaceUsage {
            device_bytes: self.devices().iter().map(|d| d.1).sum(),
            unallocated: self.unallocated_bytes(),
            kinds,
        }
    }

    /// Device space not in any group, on every device.
    pub fn unallocated_bytes(&self) -> u64 {
        self.devices()
            .iter()
            .map(|&(devid, _)| self.unallocated_on(devid))
            .sum()
    }

    /// The ranges `(start, len)` of device `devid` in no group and
    /// holding no superblock copy: unallocated space, which `canopy
    /// filesystem trim` discards.
    pub fn unallocated_ranges(&self, devid: u64) -> Vec<(u64, u64)> {
        let Some(size) = self.device_size(devid) else {
            return Vec::new();
        };
        let mut taken: Vec<(u64, u64)> = self.occupied(devid).collect();
        let supers = SUPER_OFFSETS.iter().filter(|&&s| s + SUPER_SIZE <= size);
        taken.extend(supers.map(|&s| (s, s + SUPER_SIZE)));
        taken.sort_unstable();
        let mut out = Vec::new();
        let mut at = RESERVED_START;
        for (s, e) in taken {
            if s > at {
                out.push((at, s - at));
            }
            at = at.max(e);
        }
        if size > at {
            out.push((at, size - at));
        }
        out
    }

    /// Bytes of device `devid` that groups take.
    pub fn allocated_on(&self, devid: u64) -> u64 {
        self.occupied(devid).map(|(s, e)| e - s).sum()
    }

    /// Space of device `devid` in no group (superblock copies, which no
    /// group's range holds, left out).
    pub fn unallocated_on(&self, devid: u64) -> u64 {
        let Some(size) = self.device_size(devid) else {
            return 0;
        };
        let grouped: u64 = self.occupied(devid).map(|(s, e)| e - s).sum();
        let supers_outside: u64 = SUPER_OFFSETS
            .iter()
            .filter(|&&s| s >= RESERVED_START && s + SUPER_SIZE <= size)
            .filter(|&&s| {
                devid != PRIMARY_DEVID || self.mapped || self.group_containing(s).is_none()
            })
            .count() as u64
            * SUPER_SIZE;
        size.saturating_sub(RESERVED_START)
            .saturating_sub(grouped)
            .saturating_sub(supers_outside)
    }

    /// Device bytes `short` bytes of new groups of `kind` take: on device
    /// 1 and on the others.
    fn cost(&self, kind: GroupKind, short: u64) -> Need {
        let p = self.new_profile(kind);
        let on_primary = self.copies_on_primary(p);
        let elsewhere = self.copies_elsewhere(p);
        Need {
            primary: short * on_primary,
            others: short * elsewhere,
            distinct: self.distinct_devices(p),
        }
    }

    /// Copies of a new group of `p` bound to device 1: the first one in
    /// the bound layout (both for `dup`), none in the mapped one.
    fn copies_on_primary(&self, p: Profile) -> u64 {
        match self.mapped {
            true => 0,
            false => p.copies_on_primary() as u64,
        }
    }

    /// How many of the copies a new group of `p` keeps on the spread
    /// devices must lie on different ones.
    fn distinct_devices(&self, p: Profile) -> u64 {
        match p {
            Profile::Dup => u64::from(self.mapped),
            _ => self.copies_elsewhere(p),
        }
    }

    /// Copies a new group of profile `p` keeps on devices other than 1:
    /// fewer than the profile asks when a degraded open lacks devices.
    fn copies_elsewhere(&self, p: Profile) -> u64 {
        let want = p.copies() as u64 - self.copies_on_primary(p);
        let devices = self.spread_devices().len() as u64;
        match self.degraded && p != Profile::Dup {
            true => want.min(devices),
            false => want,
        }
    }

    /// Device bytes the spread devices (see
    /// [`Allocator::spread_devices`]) can take for new groups whose
    /// copies need `distinct` of them.
    fn others_capacity(&self, distinct: u64) -> u64 {
        let free: Vec<u64> = self
            .spread_devices()
            .into_iter()
            .map(|d| self.unallocated_on(d))
            .collect();
        spread_capacity(&free, distinct)
    }

    /// Bytes a new group of profile `p` could hold, from unallocated
    /// space less what `keep` leaves for other kinds.
    fn room_for(&self, p: Profile, keep: Need) -> u64 {
        let on_primary = self.copies_on_primary(p);
        let primary = match on_primary {
            0 => u64::MAX,
            n => {
                self.unallocated_on(PRIMARY_DEVID)
                    .saturating_sub(keep.primary)
                    / n
            }
        };
        let elsewhere = self.copies_elsewhere(p);
        if elsewhere == 0 {
            return primary;
        }
        let distinct = keep.distinct.max(self.distinct_devices(p));
        let others = self.others_capacity(distinct).saturating_sub(keep.others) / elsewhere;
        primary.min(others)
    }

    /// What each kind still lacks beyond the free space of its groups, to
    /// be met from unallocated space.
    fn shortfalls(&self, c: &Claims) -> [(GroupKind, u64); 3] {
        if self.mixed {
            let want = c.data + c.metadata + c.system;
            let mut short = want.saturating_sub(self.free_in(GroupKind::Mixed));
            if c.block > u64::from(crate::format::SECTORSIZE) {
                let room: u64 = self
                    .writable_groups(GroupKind::Mixed)
                    .map(|g| g.free.whole_blocks(c.block))
                    .sum();
                short = short.max((c.metadata + c.system).saturating_sub(room));
            }
            return [
                (GroupKind::Mixed, short),
                (GroupKind::Data, 0),
                (GroupKind::System, 0),
            ];
        }
        [
            (GroupKind::Data, c.data),
            (GroupKind::Metadata, c.metadata),
            (GroupKind::System, c.system),
        ]
        .map(|(k, want)| (k, want.saturating_sub(self.free_in(k))))
    }

    /// Whether claims `c` can all be met at once, from the groups' free
    /// space and the unallocated pool.
    pub fn can_meet(&self, c: &Claims) -> bool {
        let need = self
            .shortfalls(c)
            .iter()
            .fold(Need::default(), |n, s| n.plus(self.cost(s.0, s.1)));
        let primary_ok = need.primary == 0 || need.primary <= self.unallocated_on(PRIMARY_DEVID);
        primary_ok && need.others <= self.others_capacity(need.distinct)
    }

    /// Most pieces an allocation of `len` bytes of `kind`, in pieces of at
    /// most `max_piece`, can be cut into, whatever order the free extents
    /// are used in: a piece uses up a free extent (or one of the two parts
    /// a hint splits it into), reaches `max_piece`, or ends the request.
    /// The worst case uses the smallest extents first.
    pub fn pieces_bound(&self, kind: GroupKind, len: u64, max_piece: u64) -> u64 {
        let mut lens: Vec<u64> = self
            .writable_groups(kind)
            .flat_map(|g| g.free.iter().map(|(_, l)| l))
            .collect();
        lens.sort_unstable();
        let (mut sum, mut used) = (0u64, 0u64);
        for l in lens {
            if sum >= len {
                break;
            }
            sum += l;
            used += 1;
        }
        // New groups for the rest: a few ranges each (superblock copies).
        2 * used + len.div_ceil(max_piece.max(1)) + 4
    }

    /// Records what the kinds have been promised (see [`Claims`]).
    pub fn set_claims(&mut self, c: Claims) {
        self.claims = c;
    }

    /// Unallocated bytes a new group of `kind` must leave for the others.
    fn kept_for_others(&self, kind: GroupKind) -> Need {
        self.shortfalls(&self.claims)
            .iter()
            .filter(|s| s.0 != kind)
            .fold(Need::default(), |n, s| n.plus(self.cost(s.0, s.1)))
    }

    /// The profile a new group of `kind` gets: the superblock's, unless
    /// the copies cannot be kept. The superblock names every system group
    /// with more copies; past what it holds, a new one keeps one copy
    /// (system groups are 1-32 MiB and hold two small trees: this takes
    /// a pathological image). A degraded open keeps the copies the
    /// devices present can hold.
    fn new_group_profile(&self, kind: GroupKind) -> Profile {
        let kind = self.group_kind(kind);
        let profile = self.new_profile(kind);
        if kind == GroupKind::System
            && profile != Profile::Single
            && self.system_chunks().len() >= self.system_chunks_max
        {
            return Profile::Single;
        }
        // The superblock names a system group's copies in three places,
        // and only the mapped layout stripes.
        let striped_here = self.mapped && !self.named_in_superblock(kind);
        let profile = match profile {
            Profile::Raid10 if !striped_here => Profile::Raid1,
            p => p,
        };
        let kept = self.copies_on_primary(profile) + self.copies_elsewhere(profile);
        match kept {
            k if k >= profile.copies() as u64 => profile,
            0 | 1 => Profile::Single,
            _ => Profile::Raid1,
        }
    }

    /// The size new groups are a fraction of: device 1's in the bound
    /// layout, every device's in the mapped one.
    fn sizing_bytes(&self) -> u64 {
        match self.mapped {
            true => self.devices().iter().map(|d| d.1).sum(),
            false => self.device_bytes,
        }
    }

    /// Carves a new block group of `kind` able to hold `want` bytes, with
    /// the copies its profile keeps.
    fn add_group(&mut self, kind: GroupKind, want: u64) -> Result<()> {
        let profile = self.new_group_profile(kind);
        let named = self.mapped && self.named_in_superblock(kind);
        if named && self.system_chunks().len() >= self.system_chunks_max {
            // Its first copy could not be found at open.
            tracing::error!(
                ?kind,
                "the superblock names as many system groups as it holds"
            );
            return Err(Error::NoSpace);
        }
        // A system group past what the superblock names keeps one copy
        // and takes what room there is; every other keeps what the other
        // kinds were promised.
        let room = match profile == self.new_profile(kind) || self.degraded {
            true => self.room_for(profile, self.kept_for_others(kind)),
            false => self.unallocated_on(PRIMARY_DEVID),
        };
        let target = groups::default_size(kind, self.sizing_bytes())
            .max(want.next_multiple_of(1 << 20))
            .min(room.max(want));
        let (start, len, first, extra) = match self.mapped {
            true => self.place_mapped(profile, target, want),
            false => self
                .place(profile, target, want)
                .map(|(start, len, extra)| (start, len, None, extra)),
        }
        .ok_or(Error::NoSpace)?;
        let mut g = BlockGroup::new(start, len, kind, 0);
        g.first = first;
        g.extra = extra;
        g.striped = profile == Profile::Raid10;
        let free = match first {
            Some(_) => vec![(start, len)],
            None => free_ranges_excluding_supers(start, len),
        };
        for (s, l) in free {
            g.free.insert(s, l);
            self.journal.push(FreeOp::Add(s, l));
        }
        self.dirty_groups.insert(start);
        self.added_since_commit.insert(start);
        tracing::debug!(start, len, ?kind, extra = ?g.extra, "new block group");
        self.insert_group(g);
        Ok(())
    }

    /// Where a new group of `profile` goes: its own range on device 1
    /// (`min` usable bytes, up to `target`) and its other copies, each of
    /// the same length with no superblock copy inside. Halves the target
    /// until every copy finds room.
    fn place(&self, profile: Profile, target: u64, min: u64) -> Option<(u64, u64, Vec<Stripe>)> {
        let mut target = target.max(min);
        loop {
            if let Some((start, len)) = self.find_device_gap(target, min, None) {
                if let Some(extra) = self.place_copies(profile, start, len) {
                    return Some((start, len, extra));
                }
            }
            if target <= min {
                return None;
            }
            target = (target / 2).max(min);
        }
    }

    /// The copies beyond the first of a group at `[start, start + len)`:
    /// on device 1 apart from it (dup), or on other devices, those with
    /// the most unallocated space first (raid1, raid1c3).
    fn place_copies(&self, profile: Profile, start: u64, len: u64) -> Option<Vec<Stripe>> {
        if profile == Profile::Dup {
            let offset = self.find_clean_gap(PRIMARY_DEVID, len, Some((start, start + len)))?;
            return Some(vec![Stripe {
                devid: PRIMARY_DEVID,
                offset,
            }]);
        }
        let want = profile.copies() - 1;
        let devices = self.roomiest_first(self.staying_others().collect());
        let extra = self.copies_on(&devices, len, want);
        if extra.len() < want && self.degraded {
            tracing::warn!(
                start,
                copies = extra.len() + 1,
                profile = profile.name(),
                "degraded: a new group keeps only the copies the devices present can hold"
            );
            return Some(extra);
        }
        (extra.len() == want).then_some(extra)
    }

    /// Where a new group of `profile` goes in the mapped layout: `len`
    /// bytes (at least `min`, up to `target`) at the first logical
    /// address no group holds, and every copy on the spread devices with
    /// the most unallocated space, apart from superblock copies (`dup`'s
    /// two on one device). Halves the target until every copy finds room.
    fn place_mapped(
        &self,
        profile: Profile,
        target: u64,
        min: u64,
    ) -> Option<(u64, u64, Option<Stripe>, Vec<Stripe>)> {
        let sector = crate::format::SECTORSIZE as u64;
        let mut len = target.max(min).next_multiple_of(sector);
        let min = min.next_multiple_of(sector);
        loop {
            let placed = match profile {
                Profile::Raid10 => self.place_striped(len),
                _ => self.place_mapped_copies(profile, len).map(|c| (c, len)),
            };
            if let Some((copies, len)) = placed {
                let start = self.logical_gap(len)?;
                return Some((start, len, Some(copies[0]), copies[1..].to_vec()));
            }
            if len <= min {
                return None;
            }
            len = (len / 2).next_multiple_of(sector).max(min);
        }
    }

    /// The copies of a new mapped group of `len` bytes (see
    /// [`Allocator::place_mapped`]).
    fn place_mapped_copies(&self, profile: Profile, len: u64) -> Option<Vec<Stripe>> {
        let devices = self.roomiest_first(self.spread_devices());
        if profile == Profile::Dup {
            return devices.into_iter().find_map(|devid| {
                let a = self.find_clean_gap(devid, len, None)?;
                let b = self.find_clean_gap(devid, len, Some((a, a + len)))?;
                Some(vec![
                    Stripe { devid, offset: a },
                    Stripe { devid, offset: b },
                ])
            });
        }
        let want = self.copies_elsewhere(profile) as usize;
        let copies = self.copies_on(&devices, len, want);
        if copies.len() < profile.copies() && self.degraded && !copies.is_empty() {
            tracing::warn!(
                copies = copies.len(),
                profile = profile.name(),
                "degraded: a new group keeps only the copies the devices present can hold"
            );
        }
        (copies.len() == want && want > 0).then_some(copies)
    }

    /// The devices of a new RAID10 group of at least `len` bytes, pair
    /// by pair, and its length: as many devices as hold a range of its
    /// share (an even number, two or more; those with the most room
    /// first), each share a whole number of units.
    fn place_striped(&self, len: u64) -> Option<(Vec<Stripe>, u64)> {
        let unit = crate::volume::STRIPE_UNIT;
        let devices = self.roomiest_first(self.spread_devices());
        let most = devices.len() / 2 * 2;
        (2..=most).rev().step_by(2).find_map(|n| {
            let pairs = n as u64 / 2;
            let share = len.div_ceil(pairs).next_multiple_of(unit);
            let stripes = self.copies_on(&devices[..n], share, n);
            (stripes.len() == n).then_some((stripes, share * pairs))
        })
    }

    /// `devices`, those with the most unallocated space first.
    fn roomiest_first(&self, mut devices: Vec<u64>) -> Vec<u64> {
        devices.sort_by_key(|&d| std::cmp::Reverse(self.unallocated_on(d)));
        devices
    }

    /// Up to `want` copies of `len` bytes, one on each of `devices` (in
    /// order) that has room for it apart from superblock copies.
    fn copies_on(&self, devices: &[u64], len: u64, want: usize) -> Vec<Stripe> {
        devices
            .iter()
            .filter_map(|&devid| {
                let offset = self.find_clean_gap(devid, len, None)?;
                Some(Stripe { devid, offset })
            })
            .take(want)
            .collect()
    }

    /// The first logical address from which `len` bytes lie in no group,
    /// inside the mapped layout's address space.
    fn logical_gap(&self, len: u64) -> Option<u64> {
        let mut at = RESERVED_START;
        for g in self.groups.values() {
            if g.start >= at.checked_add(len)? {
                break;
            }
            at = at.max(g.start + g.len);
        }
        (at.checked_add(len)? <= self.logical_bytes).then_some(at)
    }

    /// The gaps between occupied ranges of device `devid`, in order, with
    /// `also` counted as occupied.
    fn device_gaps(&self, devid: u64, also: Option<(u64, u64)>) -> Vec<(u64, u64)> {
        let size = self.device_size(devid).unwrap_or(0);
        let mut taken: Vec<(u64, u64)> = self.occupied(devid).chain(also).collect();
        taken.push((size, size));
        taken.sort_unstable();
        let mut gaps = Vec::new();
        let mut at = RESERVED_START;
        for (s, e) in taken {
            if s > at {
                gaps.push((at, s.min(size)));
            }
            at = at.max(e);
        }
        gaps
    }

    /// The first gap of device 1 that holds `min` free bytes once any
    /// superblock copy in it is cut out; up to `target` bytes of it.
    fn find_device_gap(
        &self,
        target: u64,
        min: u64,
        also: Option<(u64, u64)>,
    ) -> Option<(u64, u64)> {
        let sector = crate::format::SECTORSIZE as u64;
        for (at, end) in self.device_gaps(PRIMARY_DEVID, also) {
            let gap = (end - at) / sector * sector;
            // Whole sectors: a target cut in half, or divided among
            // copies, need not be.
            let mut len = gap.min(target.max(min).next_multiple_of(sector));
            while len < gap && len - super_bytes_in(at, len) < min {
                len = (len + SUPER_SIZE).min(gap);
            }
            if len > 0 && len - super_bytes_in(at, len) >= min {
                return Some((at, len));
            }
        }
        None
    }

    /// The start of `len` unoccupied bytes of device `devid`, apart from
    /// `also`, holding no superblock copy: where a copy can go.
    fn find_clean_gap(&self, devid: u64, len: u64, also: Option<(u64, u64)>) -> Option<u64> {
        let sector = crate::format::SECTORSIZE as u64;
        for (gap_start, end) in self.device_gaps(devid, also) {
            let mut at = gap_start.next_multiple_of(sector);
            while at.checked_add(len).is_some_and(|e| e <= end) {
                let Some(&s) = SUPER_OFFSETS
                    .iter()
                    .find(|&&s| s + SUPER_SIZE > at && s < at + len)
                else {
                    return Some(at);
                };
                at = (s + SUPER_SIZE).next_multiple_of(sector);
            }
        }
        None
    }

    /// Kinds of tree blocks: the root tree and the block group tree live
    /// in system groups, whose second copies the superblock names, so
    /// both can be read from either copy before the block groups are
    /// loaded.
    pub fn kind_for_tree(tree_id: u64) -> GroupKind {
        use crate::format::tree_id::{BLOCK_GROUP, ROOT};
        if tree_id == ROOT || tree_id == BLOCK_GROUP {
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
            GroupKind::Mixed => BG_MIXED,
        }
    }

    pub fn from_flags(flags: u64) -> Option<GroupKind> {
        match flags {
            BG_DATA => Some(GroupKind::Data),
            BG_METADATA => Some(GroupKind::Metadata),
            BG_SYSTEM => Some(GroupKind::System),
            BG_MIXED => Some(GroupKind::Mixed),
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

/// Puts the group at `start` into `set` or takes it out; false when there
/// is no such group.
fn mark_group(
    groups: &BTreeMap<u64, BlockGroup>,
    set: &mut BTreeSet<u64>,
    start: u64,
    on: bool,
) -> bool {
    if !groups.contains_key(&start) {
        return false;
    }
    if on {
        set.insert(start);
    } else {
        set.remove(&start);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn data_item() -> crate::format::items::BlockGroupItem {
        crate::format::items::BlockGroupItem {
            used: 0,
            flags: BG_DATA,
            first: None,
            extra: Vec::new(),
            striped: false,
        }
    }

    /// Two empty 4 MiB data groups covering the whole device after the
    /// reserved start, so no new group can be made.
    fn two_groups() -> (Allocator, u64, u64) {
        let (a_start, b_start) = (RESERVED_START, RESERVED_START + 4 * MIB);
        let mut a = Allocator::new(RESERVED_START + 8 * MIB, false);
        for start in [a_start, b_start] {
            a.load_group(start, 4 * MIB, 0, &data_item())
                .expect("group");
            a.load_free(start, 4 * MIB).expect("free");
        }
        assert_eq!(a.unallocated_bytes(), 0);
        (a, a_start, b_start)
    }

    /// What devices can give to copies on `distinct` different ones: all
    /// of it for one, and no more than the others can match of the
    /// largest for two or three.
    #[test]
    fn spread_capacity_pairs_the_largest_with_the_rest() {
        assert_eq!(spread_capacity(&[100, 300], 1), 400);
        assert_eq!(spread_capacity(&[100, 300], 2), 200);
        assert_eq!(spread_capacity(&[100, 100, 100], 2), 300);
        assert_eq!(spread_capacity(&[100, 100, 400], 3), 300);
        assert_eq!(spread_capacity(&[50, 100, 100], 3), 150);
        assert_eq!(spread_capacity(&[], 2), 0);
    }

    #[test]
    fn pending_groups_take_extents_only_when_nothing_else_can() {
        let (mut a, pending, other) = two_groups();
        assert!(a.set_pending(pending, true));
        // Near the pending group's start, yet placed in the other one.
        let (x, _) = a.alloc(GroupKind::Data, MIB, MIB, pending).expect("alloc");
        assert_eq!(a.group_containing(x).map(|g| g.start), Some(other));
        // Their free space still counts for reservations.
        assert_eq!(a.free_in(GroupKind::Data), 7 * MIB);
        // Once the other group is full, the pending one takes extents.
        a.alloc(GroupKind::Data, 3 * MIB, 3 * MIB, other)
            .expect("fill");
        let (y, _) = a.alloc(GroupKind::Data, MIB, MIB, other).expect("alloc");
        assert_eq!(a.group_containing(y).map(|g| g.start), Some(pending));
    }

    /// Space being discarded takes no extents and keeps its group from
    /// being removed; it comes back whole, and is refused when what was
    /// promised could not be met without it.
    #[test]
    fn space_being_discarded_is_kept_from_allocations_until_given_back() {
        let (mut a, first, second) = two_groups();
        a.track_untrimmed(true);
        let piece = [(first, MIB)];
        let free = a.bytes_free();
        assert!(a.begin_discard(&piece));
        assert_eq!(a.bytes_free(), free, "still free, for statfs");
        assert_eq!(a.empty_groups(), vec![second]);
        let (x, _) = a.alloc(GroupKind::Data, MIB, MIB, first).expect("alloc");
        assert!(x >= first + MIB, "allocated {x}, inside the discard");
        // Not free twice over.
        assert!(!a.begin_discard(&piece));
        a.end_discard(&piece);
        assert_eq!(a.free_in(GroupKind::Data), 7 * MIB);
        assert!(a.take_untrimmed().logical.is_empty());
        // A range that is not free is refused, and nothing is taken.
        assert!(!a.begin_discard(&[(first, MIB), (x, MIB)]));
        assert_eq!(a.free_in(GroupKind::Data), 7 * MIB);
        // With 5 MiB promised, 1 MiB of the 7 free cannot be spared (what
        // is left must hold the promise and twice the discard).
        a.set_claims(Claims {
            data: 5 * MIB,
            ..Claims::default()
        });
        assert!(!a.begin_discard(&piece));
        assert_eq!(a.free_in(GroupKind::Data), 7 * MIB);
        a.set_claims(Claims::default());
        assert!(a.begin_discard(&piece));
    }

    #[test]
    fn aligned_allocations_start_on_a_unit_of_the_device() {
        const UNIT: u64 = 4 * MIB;
        // One group from 1 MiB: its start is not on a unit.
        let start = RESERVED_START;
        let mut a = Allocator::new(start + 32 * MIB, false);
        a.load_group(start, 32 * MIB, 0, &data_item())
            .expect("group");
        a.load_free(start, 32 * MIB).expect("free");
        let room = (2 * MIB, 8 * MIB);
        let got = a.alloc_aligned(GroupKind::Data, room, start, UNIT);
        assert_eq!(got, Some((UNIT, 2 * MIB)));
        assert_eq!(
            a.free_within(start, UNIT - start),
            vec![(start, UNIT - start)]
        );
        // A hint on a boundary with the room after it is taken as it is.
        let got = a.alloc_aligned(GroupKind::Data, room, 12 * MIB, UNIT);
        assert_eq!(got, Some((12 * MIB, 2 * MIB)));
        // Off a boundary, the next one with the room after it.
        let got = a.alloc_aligned(GroupKind::Data, room, 14 * MIB, UNIT);
        assert_eq!(got, Some((16 * MIB, 2 * MIB)));
        // No room that long on a boundary: nothing is taken.
        let free = a.free_in(GroupKind::Data);
        assert_eq!(
            a.alloc_aligned(GroupKind::Data, (MIB, 20 * MIB), 0, UNIT),
            None
        );
        assert_eq!(a.free_in(GroupKind::Data), free);
        assert_eq!(
            a.alloc_aligned(GroupKind::Data, (MIB, MIB), 0, 3 * MIB),
            None
        );
    }

    #[test]
    fn aligned_allocations_align_the_place_on_the_device_in_the_mapped_layout() {
        const UNIT: u64 = 4 * MIB;
        let mut a = Allocator::new(64 * MIB, false);
        a.set_mapped(1 << 40);
        // Logical 1 GiB (on a boundary) lies at 5 MiB of device 1 (not).
        let logical = 1 << 30;
        let item = crate::format::items::BlockGroupItem {
            first: Some(Stripe {
                devid: PRIMARY_DEVID,
                offset: 5 * MIB,
            }),
            ..data_item()
        };
        a.load_group(logical, 16 * MIB, 0, &item).expect("group");
        a.load_free(logical, 16 * MIB).expect("free");
        let got = a.alloc_aligned(GroupKind::Data, (MIB, 4 * MIB), logical, UNIT);
        assert_eq!(got, Some((logical + 3 * MIB, MIB)));
    }

    #[test]
    fn a_readonly_group_takes_nothing_and_its_space_counts_for_nobody() {
        let (mut a, readonly, other) = two_groups();
        assert!(a.set_readonly(readonly, true));
        assert_eq!(a.free_in(GroupKind::Data), 4 * MIB);
        a.alloc(GroupKind::Data, 4 * MIB, 4 * MIB, readonly)
            .expect("fill");
        assert!(matches!(
            a.alloc(GroupKind::Data, MIB, MIB, readonly),
            Err(Error::NoSpace)
        ));
        assert!(a.set_readonly(readonly, false));
        let (x, _) = a.alloc(GroupKind::Data, MIB, MIB, other).expect("alloc");
        assert_eq!(a.group_containing(x).map(|g| g.start), Some(readonly));
    }

    #[test]
    fn dup_groups_take_a_mirror_apart_from_everything_and_from_superblocks() {
        let mut a = Allocator::new(200 * MIB, false);
        a.set_profiles(Profile::Dup, Profile::Single);
        let unallocated = a.unallocated_bytes();
        let mut taken = 0;
        while let Ok((_, len)) = a.alloc(GroupKind::Metadata, MIB, MIB, 0) {
            taken += len;
        }
        a.alloc(GroupKind::System, 4096, 4096, 0)
            .expect("a system group");
        let groups: Vec<&BlockGroup> = a.groups().collect();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for g in &groups {
            assert_eq!(g.profile(), Profile::Dup, "{g:?}");
            let m = g.extra[0].offset;
            assert_eq!(super_bytes_in(m, g.len), 0, "{g:?}");
            ranges.push((g.start, g.start + g.len));
            ranges.push((m, m + g.len));
        }
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
        assert_eq!(a.chunk_map().all().len(), groups.len());
        // Two device bytes per byte held.
        assert!(
            taken * 2 <= unallocated && taken * 2 > unallocated * 8 / 10,
            "{taken} of {unallocated}"
        );
        assert_eq!(a.system_chunks().len(), 1);
        // Data stays single.
        assert!(
            a.alloc(GroupKind::Data, MIB, MIB, 0).is_err()
                || a.groups()
                    .any(|g| g.kind == GroupKind::Data && g.extra.is_empty())
        );
    }

    #[test]
    fn system_groups_past_what_the_superblock_names_keep_one_copy() {
        let max = crate::format::superblock::SYSTEM_CHUNKS_MAX;
        let mut a = Allocator::new(RESERVED_START + 600 * MIB, false);
        a.set_profiles(Profile::Dup, Profile::Single);
        for _ in 0..max + 5 {
            a.alloc(GroupKind::System, MIB, MIB, 0)
                .expect("a system group");
        }
        assert_eq!(a.system_chunks().len(), max);
        let single = a
            .groups()
            .filter(|g| g.kind == GroupKind::System && g.extra.is_empty())
            .count();
        assert!(single >= 5, "{single} single system groups");
    }

    /// Every range of every device the groups take, sorted, per device.
    fn ranges_by_device(a: &Allocator) -> BTreeMap<u64, Vec<(u64, u64)>> {
        let mut by: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for g in a.groups() {
            for (d, s, e) in g.ranges() {
                by.entry(d).or_default().push((s, e));
            }
        }
        for r in by.values_mut() {
            r.sort_unstable();
            assert!(r.windows(2).all(|w| w[0].1 <= w[1].0), "{r:?}");
            assert!(
                r.iter().all(|&(s, e)| s % 4096 == 0 && e % 4096 == 0),
                "whole sectors: {r:?}"
            );
        }
        by
    }

    #[test]
    fn raid1_groups_keep_their_second_copy_on_another_device_until_it_is_full() {
        let mut a = Allocator::new(200 * MIB, false);
        a.set_devices(BTreeMap::from([(2, 120 * MIB)]), true);
        a.set_profiles(Profile::Raid1, Profile::Raid1);
        let mut held = 0;
        while let Ok((_, len)) = a.alloc(GroupKind::Data, MIB, MIB, 0) {
            held += len;
        }
        for g in a.groups() {
            assert_eq!(g.profile(), Profile::Raid1, "{g:?}");
            assert_eq!(g.extra[0].devid, 2);
            assert_eq!(super_bytes_in(g.extra[0].offset, g.len), 0, "{g:?}");
        }
        ranges_by_device(&a);
        // Device 2 (119 MiB usable, less one superblock copy) bounds it.
        assert!(held <= 119 * MIB && held > 100 * MIB, "{held}");
        assert!(a.unallocated_on(2) < 16 * MIB);
        assert!(!a.can_meet(&Claims {
            data: a.free_in(GroupKind::Data) + 32 * MIB,
            ..Claims::default()
        }));
    }

    #[test]
    fn raid1c3_groups_take_two_other_devices_and_the_largest_cannot_pair_with_itself() {
        let mut a = Allocator::new(300 * MIB, false);
        a.set_devices(BTreeMap::from([(2, 300 * MIB), (3, 60 * MIB)]), true);
        a.set_profiles(Profile::Raid1c3, Profile::Raid1c3);
        let before = a.others_capacity(2);
        assert!(before <= 2 * 59 * MIB, "{before}");
        let mut held = 0;
        while let Ok((_, len)) = a.alloc(GroupKind::Metadata, MIB, MIB, 0) {
            held += len;
        }
        for g in a.groups() {
            let mut devs: Vec<u64> = g.extra.iter().map(|s| s.devid).collect();
            devs.sort_unstable();
            assert_eq!(devs, vec![2, 3], "{g:?}");
        }
        ranges_by_device(&a);
        assert!(held <= 59 * MIB && held > 40 * MIB, "{held}");
    }

    #[test]
    fn usage_sums_groups_per_kind() {
        let (mut a, first, _) = two_groups();
        a.alloc(GroupKind::Data, MIB, MIB, first).expect("alloc");
        let u = a.usage();
        assert_eq!(u.device_bytes, RESERVED_START + 8 * MIB);
        assert_eq!(u.unallocated, 0);
        assert_eq!(
            u.kinds,
            vec![KindUsage {
                kind: "data".into(),
                profile: "single".into(),
                groups: 2,
                size: 8 * MIB,
                used: MIB,
            }]
        );
    }
}
