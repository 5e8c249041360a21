//! Volumes: the devices of a filesystem, the copies of each block group,
//! and a device that writes every copy.
//!
//! Addresses above this layer are logical: a block group's start plus an
//! offset. Two layouts map them to devices. In the *bound* layout (one
//! device, and images made before the mapped layout) the first copy of
//! every group lies on device 1 at the logical address itself, so an
//! image reads without the map, and only the further copies are mapped:
//! `dup` a second range on device 1 (its mirror), `raid1` a second copy
//! on another device, `raid1c3` two more on two other devices. In the
//! *mapped* layout (several devices; docs/architecture.md, "Devices")
//! every group names every copy, the first included, so a group's copies
//! may lie on any devices and the logical address space is the groups'
//! alone; an address no group holds has no copy at all.
//!
//! [`Volume`] is the device the engine uses: a write lands on every copy,
//! a read comes from the first copy whose device is present, and
//! [`Volume::read_copy`] and [`Volume::write_copy`] let a reader that
//! found a bad copy try another and put the good bytes back (see `txn`'s
//! block reads and `scrub`). [`ChunkMap`] is shared with the allocator,
//! which records each group's copies as it makes and removes groups.

mod freeze;

use crate::dev::Device;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The device that holds the first copy of every group in the bound
/// layout (and the one a single-device filesystem has).
pub const PRIMARY_DEVID: u64 = 1;

/// One copy of a group's bytes: `offset` on device `devid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stripe {
    pub devid: u64,
    pub offset: u64,
}

/// A mapped group: the logical range `[start, start + len)` lies at
/// `first` and the same bytes at each of `extra`. In the bound layout
/// `first` is device 1 at `start`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub start: u64,
    pub len: u64,
    pub first: Stripe,
    pub extra: Vec<Stripe>,
    /// RAID10: the group's units of [`STRIPE_UNIT`] bytes go round the
    /// pairs of devices (`first` and `extra[0]`, then `extra[1]` and
    /// `extra[2]`, ...), each pair holding a unit's two copies, so each
    /// device range holds `len / pairs` bytes.
    pub striped: bool,
}

/// The bytes of a RAID10 group that lie together on one pair of devices
/// before the next pair takes over (as btrfs's stripe length).
pub const STRIPE_UNIT: u64 = 64 << 10;

/// Bytes of each device range of a group of `len` bytes over `devices`
/// device ranges: the group's length, or for RAID10 (`striped`) its
/// share on each pair of devices.
pub fn stripe_len(len: u64, devices: usize, striped: bool) -> u64 {
    let pairs = devices as u64 / 2;
    match striped {
        true => len / pairs.max(1),
        false => len,
    }
}

impl Chunk {
    /// A group of the bound layout: its first copy on device 1 at `start`.
    pub fn bound(start: u64, len: u64, extra: Vec<Stripe>) -> Chunk {
        Chunk {
            start,
            len,
            first: Stripe {
                devid: PRIMARY_DEVID,
                offset: start,
            },
            extra,
            striped: false,
        }
    }

    /// A group whose first copy lies at `first` (the mapped layout) or,
    /// for None, on device 1 at `start`.
    pub fn new(start: u64, len: u64, first: Option<Stripe>, extra: Vec<Stripe>) -> Chunk {
        let mut c = Chunk::bound(start, len, extra);
        if let Some(first) = first {
            c.first = first;
        }
        c
    }

    fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Every device range, the first copy's included (for RAID10 every
    /// device the units go round), each [`Chunk::stripe_len`] long.
    pub fn stripes(&self) -> impl Iterator<Item = Stripe> + '_ {
        std::iter::once(self.first).chain(self.extra.iter().copied())
    }

    /// Pairs of devices a RAID10 group's units go round.
    fn pairs(&self) -> u64 {
        let devices = 1 + self.extra.len() as u64;
        devices / 2
    }

    /// Bytes of each device range.
    pub fn stripe_len(&self) -> u64 {
        stripe_len(self.len, 1 + self.extra.len(), self.striped)
    }

    /// Copies of every byte.
    pub fn copies(&self) -> usize {
        match self.striped {
            true => 2,
            false => 1 + self.extra.len(),
        }
    }

    /// Copy `copy` of `[offset, offset + len)` inside the group: None
    /// when the range crosses a RAID10 unit (its pieces lie apart; see
    /// [`Chunk::split`]).
    fn stripe(&self, offset: u64, len: u64, copy: usize) -> Option<Stripe> {
        let rel = offset - self.start;
        if !self.striped {
            let s = match copy {
                0 => self.first,
                n => *self.extra.get(n - 1)?,
            };
            return Some(Stripe {
                devid: s.devid,
                offset: s.offset + rel,
            });
        }
        let unit = rel / STRIPE_UNIT;
        if copy > 1 || (rel + len.max(1) - 1) / STRIPE_UNIT != unit {
            return None;
        }
        let (pair, row) = (unit % self.pairs(), unit / self.pairs());
        let s = self.stripes().nth(2 * pair as usize + copy)?;
        Some(Stripe {
            devid: s.devid,
            offset: s.offset + row * STRIPE_UNIT + rel % STRIPE_UNIT,
        })
    }

    /// `[offset, offset + len)` (inside the group) cut where RAID10 units
    /// end: each piece lies whole on its devices.
    fn split(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        if !self.striped || len == 0 {
            return vec![(offset, len)];
        }
        let mut out = Vec::new();
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let unit_end = self.start + ((at - self.start) / STRIPE_UNIT + 1) * STRIPE_UNIT;
            let to = unit_end.min(end);
            out.push((at, to - at));
            at = to;
        }
        out
    }
}

/// The mapped groups by start: in the bound layout those with more than
/// one copy, in the mapped layout every group.
#[derive(Default)]
pub struct ChunkMap {
    chunks: RwLock<BTreeMap<u64, Chunk>>,
    /// The mapped layout: a range outside every chunk has no copy.
    mapped: std::sync::atomic::AtomicBool,
}

impl ChunkMap {
    /// Chooses the mapped layout (true) or the bound one.
    pub fn set_mapped(&self, mapped: bool) {
        self.mapped.store(mapped, Ordering::Relaxed);
    }

    /// Whether every group names its first copy (see the module's doc).
    pub fn is_mapped(&self) -> bool {
        self.mapped.load(Ordering::Relaxed)
    }

    pub fn insert(&self, c: Chunk) {
        crate::sync::write(&self.chunks).insert(c.start, c);
    }

    pub fn remove(&self, start: u64) {
        crate::sync::write(&self.chunks).remove(&start);
    }

    /// Forgets every entry (before the block group items, which name
    /// every copy, replace what the superblock named).
    pub fn clear(&self) {
        crate::sync::write(&self.chunks).clear();
    }

    /// Every group with more than one copy.
    pub fn all(&self) -> Vec<Chunk> {
        crate::sync::read(&self.chunks).values().cloned().collect()
    }

    /// The mapped groups that overlap `[offset, offset + len)`, last
    /// first.
    fn overlapping(&self, offset: u64, len: u64) -> Vec<Chunk> {
        let end = offset.saturating_add(len);
        let map = crate::sync::read(&self.chunks);
        map.range(..end)
            .rev()
            .take_while(|(_, c)| c.end() > offset)
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// `[offset, offset + len)` in pieces that each lie whole on their
    /// devices: cut at RAID10 unit ends, else the range itself.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let map = crate::sync::read(&self.chunks);
        match Self::containing(&map, offset, len) {
            Some(c) => c.split(offset, len),
            None => vec![(offset, len)],
        }
    }

    /// How many copies `[offset, offset + len)` has: those of the group
    /// it lies inside, else 1 in the bound layout (device 1's) and 0 in
    /// the mapped one.
    pub fn copies(&self, offset: u64, len: u64) -> usize {
        let map = crate::sync::read(&self.chunks);
        match Self::containing(&map, offset, len) {
            Some(c) => c.copies(),
            None if self.is_mapped() => 0,
            None => 1,
        }
    }

    /// Where copy `copy` of `[offset, offset + len)` lies: None unless
    /// the range has that copy.
    pub fn stripe_of(&self, offset: u64, len: u64, copy: usize) -> Option<Stripe> {
        let map = crate::sync::read(&self.chunks);
        match Self::containing(&map, offset, len) {
            Some(c) => c.stripe(offset, len, copy),
            None if copy == 0 && !self.is_mapped() => Some(Stripe {
                devid: PRIMARY_DEVID,
                offset,
            }),
            None => None,
        }
    }

    fn containing(map: &BTreeMap<u64, Chunk>, offset: u64, len: u64) -> Option<&Chunk> {
        let (_, c) = map.range(..=offset).next_back()?;
        (offset.checked_add(len)? <= c.end()).then_some(c)
    }
}

/// Errors found and repaired on one device (`canopy device stats`):
/// loaded from the image at open, written back by each commit.
#[derive(Default)]
pub struct ErrorCounts {
    /// Reads the device failed.
    pub read: AtomicU64,
    /// Copies read whole but wrong: bad checksum, another block, or an
    /// older generation than their parent names (a lost write).
    pub corrupt: AtomicU64,
    /// Bad copies rewritten from a good one.
    pub corrected: AtomicU64,
    /// Writes the device failed.
    pub write: AtomicU64,
}

impl ErrorCounts {
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.read.load(Ordering::Relaxed),
            self.corrupt.load(Ordering::Relaxed),
            self.corrected.load(Ordering::Relaxed),
            self.write.load(Ordering::Relaxed),
        ]
    }

    /// Sets the counters (to what the image recorded, or to zero).
    pub fn set(&self, counts: [u64; 4]) {
        self.read.store(counts[0], Ordering::Relaxed);
        self.corrupt.store(counts[1], Ordering::Relaxed);
        self.corrected.store(counts[2], Ordering::Relaxed);
        self.write.store(counts[3], Ordering::Relaxed);
    }
}

/// The engine's device: the filesystem's devices by id plus the map of
/// copies. A device missing from a degraded open is absent from
/// `devices`; its copies fail to read and write.
pub struct Volume {
    /// Changes only when a device is added or removed (`canopy device
    /// add|remove`), under the engine's state lock.
    devices: RwLock<BTreeMap<u64, Arc<dyn Device>>>,
    /// Device 1's size as the filesystem recorded it, for a degraded
    /// open without it.
    primary_bytes: u64,
    /// The logical address space's size in the mapped layout (see
    /// [`Volume::set_logical_bytes`]).
    logical_bytes: AtomicU64,
    map: Arc<ChunkMap>,
    errors: RwLock<BTreeMap<u64, Arc<ErrorCounts>>>,
    /// Whether bad copies may be rewritten (not on a read-only open).
    repairs: std::sync::atomic::AtomicBool,
    /// A device being filled to replace another (`canopy device
    /// replace`): every write to the source's copies reaches it too.
    target: RwLock<Option<ReplaceTarget>>,
    /// What every write, barrier and discard passes (see `freeze`).
    gate: freeze::Gate,
}

/// The device a replace fills, and whether a write to it failed (the
/// replace then fails; the filesystem, which does not need the target
/// yet, goes on).
struct ReplaceTarget {
    source: u64,
    dev: Arc<dyn Device>,
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl Volume {
    /// A volume of one device (id 1).
    pub fn new(raw: Arc<dyn Device>, map: Arc<ChunkMap>) -> Volume {
        let sizes = BTreeMap::from([(PRIMARY_DEVID, raw.size())]);
        Volume::with_devices(BTreeMap::from([(PRIMARY_DEVID, raw)]), &sizes, map)
    }

    /// A volume of `devices` by id; `sizes` names every device the
    /// filesystem has, present or not, with its size.
    pub fn with_devices(
        devices: BTreeMap<u64, Arc<dyn Device>>,
        sizes: &BTreeMap<u64, u64>,
        map: Arc<ChunkMap>,
    ) -> Volume {
        Volume {
            primary_bytes: sizes.get(&PRIMARY_DEVID).copied().unwrap_or(0),
            logical_bytes: AtomicU64::new(0),
            errors: RwLock::new(
                sizes
                    .keys()
                    .chain(devices.keys())
                    .map(|&d| (d, Arc::default()))
                    .collect(),
            ),
            devices: RwLock::new(devices),
            map,
            repairs: std::sync::atomic::AtomicBool::new(true),
            target: RwLock::new(None),
            gate: freeze::Gate::default(),
        }
    }

    /// Sets the end of the logical address space of the mapped layout
    /// (the superblock's total bytes: every device's, as they were added).
    pub fn set_logical_bytes(&self, bytes: u64) {
        self.logical_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Starts sending every write to device `source`'s copies to
    /// `target` too, at the same offsets (present or missing, `source`
    /// keeps its writes). Returns the flag a failed write to `target`
    /// sets.
    pub fn set_replace_target(
        &self,
        source: u64,
        target: Arc<dyn Device>,
    ) -> Arc<std::sync::atomic::AtomicBool> {
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        *crate::sync::write(&self.target) = Some(ReplaceTarget {
            source,
            dev: target,
            failed: failed.clone(),
        });
        failed
    }

    /// Stops writing to the replace target (a replace cancelled or
    /// failed) and returns it.
    pub fn clear_replace_target(&self) -> Option<Arc<dyn Device>> {
        crate::sync::write(&self.target).take().map(|t| t.dev)
    }

    /// The device being replaced, if a replace is going.
    pub fn replace_source(&self) -> Option<u64> {
        crate::sync::read(&self.target).as_ref().map(|t| t.source)
    }

    /// Writes `buf` at physical `offset` of the replace target: a copy
    /// of the source's bytes there.
    pub fn write_replace_target(&self, buf: &[u8], offset: u64) -> Result<()> {
        let _pass = self.gate.pass();
        let target = crate::sync::read(&self.target);
        let t = target
            .as_ref()
            .ok_or_else(|| Error::Invalid("no device replace is going".into()))?;
        t.dev.write_at(buf, offset)
    }

    /// Puts the replace target in its source's place, with fresh error
    /// counters, and returns the source (None if it was missing). Data
    /// writes run without the engine's lock, so the target takes the
    /// source's place before it stops being a target: a write racing
    /// the swap reaches it one way or the other (or both).
    pub fn take_replacement(&self) -> Result<Option<Arc<dyn Device>>> {
        let (source, dev) = crate::sync::read(&self.target)
            .as_ref()
            .map(|t| (t.source, t.dev.clone()))
            .ok_or_else(|| Error::Invalid("no device replace is going".into()))?;
        crate::sync::write(&self.errors).insert(source, Arc::default());
        let old = crate::sync::write(&self.devices).insert(source, dev);
        crate::sync::write(&self.target).take();
        Ok(old)
    }

    /// A write meant for device `devid`'s copy at `offset` also goes to
    /// the replace target when `devid` is being replaced. Its failure is
    /// the replace's, recorded in the flag.
    fn mirror_to_target(&self, devid: u64, offset: u64, buf: &[u8], data: bool) {
        let target = crate::sync::read(&self.target);
        let Some(t) = target.as_ref().filter(|t| t.source == devid) else {
            return;
        };
        let r = match data {
            true => t.dev.write_data_at(buf, offset),
            false => t.dev.write_at(buf, offset),
        };
        if let Err(e) = r {
            tracing::error!(devid, offset, error = %e, "device replace: writing the target failed");
            t.failed.store(true, Ordering::SeqCst);
        }
    }

    /// Waits while the volume is frozen; what writes to a device
    /// directly (superblocks, unallocated space) holds this meanwhile.
    pub fn pass(&self) -> freeze::Passage<'_> {
        self.gate.pass()
    }

    /// Holds every later write, barrier and discard until [`Volume::thaw`]
    /// or `timeout`, once those under way have finished, and makes
    /// everything written before durable. False if frozen already.
    pub fn freeze(&self, timeout: std::time::Duration) -> Result<bool> {
        if !self.gate.freeze(timeout) {
            return Ok(false);
        }
        // Writes sent before (an RBD write is in flight until a barrier)
        // reach the storage before anyone snapshots it.
        for (_, d) in self.devices() {
            if let Err(e) = d.barrier() {
                self.gate.thaw();
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Ends a freeze; false if not frozen.
    pub fn thaw(&self) -> bool {
        self.gate.thaw()
    }

    /// How much longer a freeze holds, if frozen.
    pub fn frozen_for(&self) -> Option<std::time::Duration> {
        self.gate.frozen_for()
    }

    /// Whether a reader that found a bad copy may rewrite it.
    pub fn repairs(&self) -> bool {
        self.repairs.load(Ordering::Relaxed)
    }

    /// Stops (or allows) rewriting bad copies: a read-only open writes
    /// nothing.
    pub fn set_repairs(&self, on: bool) {
        self.repairs.store(on, Ordering::Relaxed);
    }

    /// Device `devid`, when present.
    pub fn device(&self, devid: u64) -> Option<Arc<dyn Device>> {
        crate::sync::read(&self.devices).get(&devid).cloned()
    }

    /// The present devices, by id: superblock copies live on each,
    /// outside every group.
    pub fn devices(&self) -> Vec<(u64, Arc<dyn Device>)> {
        crate::sync::read(&self.devices)
            .iter()
            .map(|(&id, d)| (id, d.clone()))
            .collect()
    }

    /// Takes a new device as `devid` (`canopy device add`): copies the
    /// allocator places there from now on are written to it.
    pub fn add_device(&self, devid: u64, dev: Arc<dyn Device>) {
        crate::sync::write(&self.devices).insert(devid, dev);
        crate::sync::write(&self.errors).entry(devid).or_default();
    }

    /// Lets device `devid` go (`canopy device remove`, once no copy lies
    /// on it) and returns it.
    pub fn remove_device(&self, devid: u64) -> Option<Arc<dyn Device>> {
        crate::sync::write(&self.errors).remove(&devid);
        crate::sync::write(&self.devices).remove(&devid)
    }

    pub fn map(&self) -> &Arc<ChunkMap> {
        &self.map
    }

    /// The error counters of device `devid` (those of an unknown device
    /// count nowhere).
    pub fn errors(&self, devid: u64) -> Arc<ErrorCounts> {
        crate::sync::read(&self.errors)
            .get(&devid)
            .cloned()
            .unwrap_or_default()
    }

    /// Every device's counters, by id.
    pub fn all_errors(&self) -> Vec<(u64, Arc<ErrorCounts>)> {
        crate::sync::read(&self.errors)
            .iter()
            .map(|(&id, e)| (id, e.clone()))
            .collect()
    }

    /// How many copies `[offset, offset + len)` has.
    pub fn copies(&self, offset: u64, len: u64) -> usize {
        self.map.copies(offset, len)
    }

    /// Where copy `copy` of `offset` lies.
    pub fn stripe(&self, offset: u64, len: u64, copy: usize) -> Result<Stripe> {
        self.map
            .stripe_of(offset, len, copy)
            .ok_or_else(|| match self.map.copies(offset, len) {
                0 => Error::corrupt(offset, "the address lies in no block group"),
                _ => Error::Invalid(format!("logical {offset} has no copy {copy}")),
            })
    }

    /// Whether copy `copy` of `[offset, offset + len)` lies on a present
    /// device (not on one a degraded open is missing).
    pub fn copy_present(&self, offset: u64, len: u64, copy: usize) -> bool {
        self.map.pieces(offset, len).into_iter().all(|(o, l)| {
            self.stripe(o, l, copy)
                .is_ok_and(|s| self.device(s.devid).is_some())
        })
    }

    /// The copy a data read of `[offset, offset + len)` tries first.
    /// Copies on different present devices are taken in turn by `hint`
    /// (the inode read), so readers of different files read from
    /// different devices while one file keeps to one device, where its
    /// reads stay sequential; copies sharing a device (`dup`) give the
    /// first of them.
    pub fn preferred_copy(&self, offset: u64, len: u64, hint: u64) -> usize {
        let copies = self.copies(offset, len);
        if copies <= 1 {
            return 0;
        }
        // A RAID10 range goes round the devices whichever copy it takes:
        // its first piece's devices stand for it.
        let (offset, len) = self.map.pieces(offset, len)[0];
        // raid1c3 has the most copies.
        let mut distinct = [(0usize, 0u64); 3];
        let mut n = 0;
        for copy in 0..copies.min(distinct.len()) {
            let Ok(s) = self.stripe(offset, len, copy) else {
                continue;
            };
            let seen = distinct[..n].iter().any(|&(_, d)| d == s.devid);
            if !seen && self.device(s.devid).is_some() {
                distinct[n] = (copy, s.devid);
                n += 1;
            }
        }
        match n {
            0 => 0,
            n => distinct[(hint % n as u64) as usize].0,
        }
    }

    /// The device id of copy `copy` of `offset` (for error counters and
    /// messages); 0 when there is no such copy.
    pub fn devid_of(&self, offset: u64, len: u64, copy: usize) -> u64 {
        let (offset, len) = self.map.pieces(offset, len)[0];
        self.stripe(offset, len, copy).map_or(0, |s| s.devid)
    }

    fn present(&self, s: Stripe) -> Result<Arc<dyn Device>> {
        self.device(s.devid).ok_or_else(|| missing(s.devid))
    }

    /// Reads copy `copy` of `buf.len()` bytes at logical `offset`.
    pub fn read_copy(&self, buf: &mut [u8], offset: u64, copy: usize) -> Result<()> {
        let pieces = self.map.pieces(offset, buf.len() as u64);
        if pieces.len() > 1 {
            for (o, l) in pieces {
                let at = (o - offset) as usize;
                self.read_copy(&mut buf[at..at + l as usize], o, copy)?;
            }
            return Ok(());
        }
        let s = self.stripe(offset, buf.len() as u64, copy)?;
        self.read_stripe(buf, s)
    }

    /// Reads `buf.len()` bytes at `s`, counting a failure of a present
    /// device.
    fn read_stripe(&self, buf: &mut [u8], s: Stripe) -> Result<()> {
        let r = self.present(s).and_then(|d| d.read_at(buf, s.offset));
        if r.is_err() && self.device(s.devid).is_some() {
            self.errors(s.devid).read.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Starts reading copy `copy` of `[offset, offset + len)` ahead of
    /// need (scrub reads every copy).
    pub fn prefetch_copy(&self, offset: u64, len: u64, copy: usize) {
        for (o, l) in self.map.pieces(offset, len) {
            if let Ok(s) = self.stripe(o, l, copy) {
                if let Some(d) = self.device(s.devid) {
                    d.prefetch(s.offset, l);
                }
            }
        }
    }

    /// Writes `buf` over copy `copy` only (a repair).
    pub fn write_copy(&self, buf: &[u8], offset: u64, copy: usize) -> Result<()> {
        let pieces = self.map.pieces(offset, buf.len() as u64);
        if pieces.len() > 1 {
            for (o, l) in pieces {
                let at = (o - offset) as usize;
                self.write_copy(&buf[at..at + l as usize], o, copy)?;
            }
            return Ok(());
        }
        let _pass = self.gate.pass();
        let s = self.stripe(offset, buf.len() as u64, copy)?;
        self.mirror_to_target(s.devid, s.offset, buf, false);
        let r = self.present(s).and_then(|d| d.write_at(buf, s.offset));
        self.counted_write(s.devid, r)
    }

    /// Counts a copy read whole but found wrong.
    pub fn note_corrupt(&self, offset: u64, len: u64, copy: usize) {
        let devid = self.devid_of(offset, len, copy);
        self.errors(devid).corrupt.fetch_add(1, Ordering::Relaxed);
    }

    fn counted_write(&self, devid: u64, r: Result<()>) -> Result<()> {
        if r.is_err() {
            self.errors(devid).write.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Writes `buf` (at logical `offset`) to copy 0 and, for the parts
    /// that lie in groups with more copies, to each of them.
    fn write_all(&self, buf: Payload<'_>, offset: u64, data: bool) -> Result<()> {
        let _pass = self.gate.pass();
        let put = |s: Stripe, part: Payload<'_>| {
            // A device a degraded open lacks misses the write; its copy
            // is stale should it come back, and reads find it so (by
            // generation or checksum) and heal it. A device being
            // replaced passes its writes on to the target, missing or not.
            self.mirror_to_target(s.devid, s.offset, part.as_slice(), data);
            let Some(d) = self.device(s.devid) else {
                return Ok(());
            };
            let r = match (data, part) {
                (true, Payload::Owned(b)) => d.write_data_owned(b, s.offset),
                (true, Payload::Borrowed(p)) => d.write_data_at(p, s.offset),
                (false, p) => d.write_at(p.as_slice(), s.offset),
            };
            self.counted_write(s.devid, r)
        };
        let len = buf.len() as u64;
        let chunks = self.map.overlapping(offset, len);
        if self.map.is_mapped() {
            let covered: u64 = chunks
                .iter()
                .map(|c| (offset + len).min(c.end()) - offset.max(c.start))
                .sum();
            if covered != len {
                return Err(Error::corrupt(
                    offset,
                    format!("a write of {len} bytes reaches past the block groups"),
                ));
            }
        } else {
            put(
                Stripe {
                    devid: PRIMARY_DEVID,
                    offset,
                },
                buf.part(0..buf.len()),
            )?;
        }
        for c in chunks {
            let from = offset.max(c.start);
            let to = (offset + len).min(c.end());
            if c.striped {
                for (o, l) in c.split(from, to - from) {
                    let range = (o - offset) as usize..(o - offset + l) as usize;
                    for copy in 0..c.copies() {
                        if let Some(s) = c.stripe(o, l, copy) {
                            put(s, buf.part(range.clone()))?;
                        }
                    }
                }
                continue;
            }
            let range = (from - offset) as usize..(to - offset) as usize;
            let skip = usize::from(!self.map.is_mapped());
            for s in c.stripes().skip(skip) {
                put(
                    Stripe {
                        devid: s.devid,
                        offset: s.offset + (from - c.start),
                    },
                    buf.part(range.clone()),
                )?;
            }
        }
        Ok(())
    }

    fn primary(&self) -> Option<Arc<dyn Device>> {
        self.device(PRIMARY_DEVID)
    }
}

/// A write's bytes as [`Volume::write_all`] passes them on: borrowed from
/// the caller, or given away ([`Device::write_data_owned`]), when every
/// device and copy takes a share of them.
enum Payload<'a> {
    Borrowed(&'a [u8]),
    Owned(Bytes),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Borrowed(b) => b,
            Payload::Owned(b) => b,
        }
    }

    /// The bytes in `range`, shared rather than copied.
    fn part(&self, range: std::ops::Range<usize>) -> Payload<'_> {
        match self {
            Payload::Borrowed(b) => Payload::Borrowed(&b[range]),
            Payload::Owned(b) => Payload::Owned(b.slice(range)),
        }
    }
}

fn missing(devid: u64) -> Error {
    Error::io(
        format!("reaching device {devid}"),
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("device {devid} is missing (a degraded mount)"),
        ),
    )
}

impl Device for Volume {
    /// Reads the first copy whose device is present (in a degraded open
    /// without the first copy's device, the next).
    /// A RAID10 range piece by piece, each from its own first present
    /// copy.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let pieces = self.map.pieces(offset, len);
        if pieces.len() > 1 {
            for (o, l) in pieces {
                let at = (o - offset) as usize;
                self.read_at(&mut buf[at..at + l as usize], o)?;
            }
            return Ok(());
        }
        let first = self.stripe(offset, len, 0)?;
        if self.device(first.devid).is_some() {
            return self.read_stripe(buf, first);
        }
        let mut last = None;
        for copy in 1..self.copies(offset, len) {
            match self.read_copy(buf, offset, copy) {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| missing(first.devid)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_all(Payload::Borrowed(buf), offset, false)
    }

    /// Every device keeps copies of its own.
    fn replicates(&self) -> bool {
        // Asked by every log write: no copy of the device list.
        let devices = crate::sync::read(&self.devices);
        !devices.is_empty() && devices.values().all(|d| d.replicates())
    }

    /// The largest of the devices' units (they are powers of two: an
    /// extent aligned to it is aligned to each of them).
    fn write_unit(&self) -> u64 {
        let devices = crate::sync::read(&self.devices);
        devices.values().map(|d| d.write_unit()).max().unwrap_or(0)
    }

    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_all(Payload::Borrowed(buf), offset, true)
    }

    /// Each device (and each copy) gets a share of `buf`, not a copy.
    fn write_data_owned(&self, buf: Bytes, offset: u64) -> Result<()> {
        self.write_all(Payload::Owned(buf), offset, true)
    }

    /// Every present device's barrier: a commit's blocks lie on all of
    /// them.
    fn barrier(&self) -> Result<()> {
        let _pass = self.gate.pass();
        for (_, d) in self.devices() {
            d.barrier()?;
        }
        let target = crate::sync::read(&self.target)
            .as_ref()
            .map(|t| t.dev.clone());
        if let Some(t) = target {
            // The replace's own barrier: a failure fails it, not the
            // commit.
            if let Err(e) = t.barrier() {
                tracing::error!(error = %e, "device replace: the target's barrier failed");
                if let Some(t) = crate::sync::read(&self.target).as_ref() {
                    t.failed.store(true, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    /// The end of the logical address space: device 1's size in the
    /// bound layout, the filesystem's total in the mapped one.
    fn size(&self) -> u64 {
        if self.map.is_mapped() {
            return self.logical_bytes.load(Ordering::Relaxed);
        }
        self.primary().map_or(self.primary_bytes, |d| d.size())
    }

    /// Device 1's size as the device reports it now (what `filesystem
    /// resize` may grow to).
    fn refresh_size(&self) -> Result<u64> {
        match self.primary() {
            Some(d) => d.refresh_size(),
            None => Ok(self.primary_bytes),
        }
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.prefetch_copy(offset, len, 0)
    }

    /// Every copy of the logical range (a device a degraded open lacks
    /// is passed over); true if some device did it.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        let _pass = self.gate.pass();
        let mut done = false;
        if !self.map.is_mapped() {
            if let Some(d) = self.primary() {
                done = d.discard(offset, len)?;
            }
        }
        let skip = usize::from(!self.map.is_mapped());
        for c in self.map.overlapping(offset, len) {
            let from = offset.max(c.start);
            let to = (offset + len).min(c.end());
            let ranges = match c.striped {
                true => striped_ranges(&c, from, to - from),
                false => c
                    .stripes()
                    .skip(skip)
                    .map(|s| (s.devid, s.offset + (from - c.start), to - from))
                    .collect(),
            };
            for (devid, at, n) in ranges {
                if let Some(d) = self.device(devid) {
                    done |= d.discard(at, n)?;
                }
            }
        }
        Ok(done)
    }
}

/// The device ranges `(devid, offset, len)` that hold `[offset, offset +
/// len)` of a RAID10 group, both copies, each device's pieces joined
/// where they touch (units of one pair lie end to end on its devices).
fn striped_ranges(c: &Chunk, offset: u64, len: u64) -> Vec<(u64, u64, u64)> {
    let mut all: Vec<(u64, u64, u64)> = c
        .split(offset, len)
        .into_iter()
        .flat_map(|(o, l)| {
            (0..c.copies())
                .filter_map(move |copy| c.stripe(o, l, copy).map(|s| (s.devid, s.offset, l)))
        })
        .collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (devid, at, n) in all {
        match out.last_mut() {
            Some(last) if last.0 == devid && last.1 + last.2 == at => last.2 += n,
            _ => out.push((devid, at, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn chunk(extra: Vec<Stripe>) -> Chunk {
        Chunk::bound(64 << 10, 64 << 10, extra)
    }

    fn volume(devices: usize, extra: Vec<Stripe>) -> (Vec<Arc<MemDevice>>, Volume) {
        let map = Arc::new(ChunkMap::default());
        map.insert(chunk(extra));
        volume_of(devices, 1 << 20, map)
    }

    /// `devices` in-memory devices of `size` bytes, devids 1, 2, ..., over
    /// `map`.
    fn volume_of(devices: usize, size: u64, map: Arc<ChunkMap>) -> (Vec<Arc<MemDevice>>, Volume) {
        let raws: Vec<Arc<MemDevice>> = (0..devices)
            .map(|_| Arc::new(MemDevice::new(size)))
            .collect();
        let devs: BTreeMap<u64, Arc<dyn Device>> = raws
            .iter()
            .enumerate()
            .map(|(i, r)| (i as u64 + 1, r.clone() as Arc<dyn Device>))
            .collect();
        let sizes = devs.keys().map(|&d| (d, size)).collect();
        (raws, Volume::with_devices(devs, &sizes, map))
    }

    fn dup() -> Vec<Stripe> {
        vec![Stripe {
            devid: 1,
            offset: 512 << 10,
        }]
    }

    #[test]
    fn writes_reach_both_copies_and_only_the_mirrored_part() {
        let (raw, vol) = volume(1, dup());
        // Straddles the end of the mirrored group.
        let buf = vec![7u8; 8192];
        vol.write_at(&buf, (128 << 10) - 4096).expect("write");
        let mut got = vec![0u8; 4096];
        raw[0]
            .read_at(&mut got, (512 << 10) + (60 << 10))
            .expect("read");
        assert_eq!(got, vec![7u8; 4096]);
        raw[0]
            .read_at(&mut got, (512 << 10) + (64 << 10))
            .expect("read");
        assert_eq!(got, vec![0u8; 4096], "past the group's end is not mirrored");
        assert_eq!(vol.copies((128 << 10) - 4096, 4096), 2);
        assert_eq!(vol.copies((128 << 10) - 4096, 8192), 1);
    }

    #[test]
    fn a_discard_reaches_every_copy_of_the_range_and_nothing_else() {
        let (raw, vol) = volume(1, dup());
        vol.write_at(&[5u8; 16384], (64 << 10) + 8192)
            .expect("write");
        assert!(vol.discard((64 << 10) + 12288, 4096).expect("discard"));
        let mut got = vec![0u8; 16384];
        for at in [64 << 10, 512 << 10] {
            raw[0].read_at(&mut got, at + 8192).expect("read");
            let mut want = vec![5u8; 16384];
            want[4096..8192].fill(0);
            assert_eq!(got, want, "copy at {at}");
        }
    }

    #[test]
    fn a_bad_copy_is_read_and_repaired_by_copy() {
        let (raw, vol) = volume(1, dup());
        vol.write_at(&[1u8; 4096], 64 << 10).expect("write");
        raw[0]
            .write_at(&[9u8; 4096], 64 << 10)
            .expect("damage copy 0");
        let mut got = vec![0u8; 4096];
        vol.read_copy(&mut got, 64 << 10, 1).expect("copy 1");
        assert_eq!(got, vec![1u8; 4096]);
        vol.write_copy(&got, 64 << 10, 0).expect("repair");
        vol.read_at(&mut got, 64 << 10).expect("copy 0");
        assert_eq!(got, vec![1u8; 4096]);
        assert!(vol.read_copy(&mut got, 0, 1).is_err(), "unmapped: one copy");
    }

    fn raid1c3() -> Vec<Stripe> {
        vec![
            Stripe {
                devid: 2,
                offset: 128 << 10,
            },
            Stripe {
                devid: 3,
                offset: 256 << 10,
            },
        ]
    }

    #[test]
    fn raid1c3_copies_land_on_their_devices() {
        let (raw, vol) = volume(3, raid1c3());
        vol.write_at(&[5u8; 4096], (64 << 10) + 4096)
            .expect("write");
        let mut got = vec![0u8; 4096];
        raw[1].read_at(&mut got, (128 << 10) + 4096).expect("dev 2");
        assert_eq!(got, vec![5u8; 4096]);
        raw[2].read_at(&mut got, (256 << 10) + 4096).expect("dev 3");
        assert_eq!(got, vec![5u8; 4096]);
        assert_eq!(vol.copies(64 << 10, 4096), 3);
        assert_eq!(vol.devid_of(64 << 10, 4096, 2), 3);
        raw[1]
            .write_at(&[0u8; 4096], (128 << 10) + 4096)
            .expect("damage");
        vol.read_copy(&mut got, (64 << 10) + 4096, 1)
            .expect("copy 1");
        assert_eq!(got, vec![0u8; 4096], "copy 1 is device 2's");
    }

    /// Reads of different inodes take copies on different devices in
    /// turn; `dup` copies share a device, so reads keep to the first; a
    /// degraded volume prefers only copies it has.
    #[test]
    fn reads_spread_over_devices_not_over_one_device() {
        let at = 64 << 10;
        let (_, vol) = volume(3, raid1c3());
        let chosen: Vec<usize> = (0..6)
            .map(|ino| vol.preferred_copy(at, 4096, ino))
            .collect();
        assert_eq!(chosen, [0, 1, 2, 0, 1, 2]);
        assert_eq!(vol.preferred_copy(0, 4096, 7), 0, "unmapped: one copy");
        let (_, vol) = volume(1, dup());
        assert!((0..4).all(|ino| vol.preferred_copy(at, 4096, ino) == 0));
        let (_, vol) = volume(3, raid1c3());
        vol.remove_device(2);
        let chosen: Vec<usize> = (0..4)
            .map(|ino| vol.preferred_copy(at, 4096, ino))
            .collect();
        assert_eq!(chosen, [0, 2, 0, 2]);
    }

    /// A RAID10 group over four devices: units go round the two pairs,
    /// each unit's two copies on one pair, rows end to end on each
    /// device; a write crossing units lands piece by piece and reads
    /// back whole from either copy.
    #[test]
    fn raid10_units_go_round_the_pairs() {
        let map = Arc::new(ChunkMap::default());
        map.set_mapped(true);
        let at = |devid: u64| Stripe {
            devid,
            offset: 1 << 20,
        };
        let start = 8 << 20;
        map.insert(Chunk {
            start,
            len: 1 << 20,
            first: at(1),
            extra: vec![at(2), at(3), at(4)],
            striped: true,
        });
        let (raws, vol) = volume_of(4, 4 << 20, map);
        vol.set_logical_bytes(16 << 20);
        let unit = STRIPE_UNIT as usize;
        let data: Vec<u8> = (0..3 * unit).map(|i| (i / unit + 1) as u8).collect();
        // Units 1, 2 and 3: pair 2, pair 1 (row 1), pair 2 (row 1).
        vol.write_at(&data, start + STRIPE_UNIT).expect("write");
        let mut got = vec![0u8; unit];
        for (dev, row, want) in [
            (2usize, 0u64, 1u8),
            (3, 0, 1),
            (0, 1, 2),
            (1, 1, 2),
            (2, 1, 3),
            (3, 1, 3),
        ] {
            raws[dev]
                .read_at(&mut got, (1 << 20) + row * STRIPE_UNIT)
                .expect("read");
            assert!(
                got.iter().all(|&b| b == want),
                "device {} row {row}",
                dev + 1
            );
        }
        for copy in 0..2 {
            let mut back = vec![0u8; data.len()];
            vol.read_copy(&mut back, start + STRIPE_UNIT, copy)
                .expect("read");
            assert!(back == data, "copy {copy}");
        }
        assert_eq!(vol.copies(start, 4096), 2);
        assert_eq!(vol.map().pieces(start + 4096, STRIPE_UNIT).len(), 2);
        assert!(
            vol.read_copy(&mut got, 32 << 20, 0).is_err(),
            "no group there"
        );
    }

    #[test]
    fn a_volume_without_device_1_reads_the_next_copy_and_names_the_missing_device() {
        let raw2 = Arc::new(MemDevice::new(1 << 20));
        raw2.write_at(&[3u8; 4096], 128 << 10).expect("write");
        let map = Arc::new(ChunkMap::default());
        map.insert(chunk(vec![Stripe {
            devid: 2,
            offset: 128 << 10,
        }]));
        assert!(!map.is_mapped());
        let devs: BTreeMap<u64, Arc<dyn Device>> = BTreeMap::from([(2, raw2 as Arc<dyn Device>)]);
        let sizes = BTreeMap::from([(1, 1 << 20), (2, 1 << 20)]);
        let vol = Volume::with_devices(devs, &sizes, map);
        let mut got = vec![0u8; 4096];
        vol.read_at(&mut got, 64 << 10).expect("copy 1 on device 2");
        assert_eq!(got, vec![3u8; 4096]);
        let err = vol.read_at(&mut got, 0).expect_err("one copy, on device 1");
        assert!(err.to_string().contains("device 1 is missing"), "{err}");
        assert_eq!(vol.size(), 1 << 20);
    }
}
