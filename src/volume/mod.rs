//! Volumes: the copies of each block group, and a device that writes
//! every copy.
//!
//! Addresses above this layer are logical: a block group's start. A group
//! of the `single` profile is one range of the device at that address; a
//! `dup` group has a second range elsewhere on the same device (its
//! mirror). The first copy always lies at the logical address itself, so
//! an image reads without the map (old images have no map at all) and
//! only writes and repairs need it.
//!
//! [`Volume`] is the device the engine uses: a write lands on every copy,
//! a read comes from the first, and [`Volume::read_copy`] and
//! [`Volume::write_copy`] let a reader that found a bad copy try another
//! and put the good bytes back (see `txn`'s block reads and `scrub`).
//! [`ChunkMap`] is shared with the allocator, which records each group's
//! copies as it makes and removes groups.

use crate::dev::Device;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Where the second copy of a group lies: `[mirror, mirror + len)` holds
/// what `[start, start + len)` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mirror {
    pub start: u64,
    pub len: u64,
    pub mirror: u64,
}

impl Mirror {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// The groups that have a second copy, by start.
#[derive(Default)]
pub struct ChunkMap {
    mirrors: RwLock<BTreeMap<u64, Mirror>>,
}

impl ChunkMap {
    pub fn insert(&self, m: Mirror) {
        crate::sync::write(&self.mirrors).insert(m.start, m);
    }

    pub fn remove(&self, start: u64) {
        crate::sync::write(&self.mirrors).remove(&start);
    }

    /// Forgets every entry (before the block group items, which name
    /// every copy, replace what the superblock named).
    pub fn clear(&self) {
        crate::sync::write(&self.mirrors).clear();
    }

    /// Every mirrored group.
    pub fn all(&self) -> Vec<Mirror> {
        crate::sync::read(&self.mirrors).values().copied().collect()
    }

    /// The mirrored groups that overlap `[offset, offset + len)`.
    fn overlapping(&self, offset: u64, len: u64) -> Vec<Mirror> {
        let end = offset.saturating_add(len);
        let map = crate::sync::read(&self.mirrors);
        map.range(..end)
            .rev()
            .take_while(|(_, m)| m.end() > offset)
            .map(|(_, m)| *m)
            .collect()
    }

    /// How many copies `[offset, offset + len)` has: 2 when it lies
    /// inside one mirrored group, else 1.
    pub fn copies(&self, offset: u64, len: u64) -> usize {
        match self.mirror_of(offset, len) {
            Some(_) => 2,
            None => 1,
        }
    }

    /// The device offset of copy 1 of `[offset, offset + len)`: None
    /// unless the range lies inside one mirrored group.
    pub fn mirror_of(&self, offset: u64, len: u64) -> Option<u64> {
        let map = crate::sync::read(&self.mirrors);
        let (_, m) = map.range(..=offset).next_back()?;
        (offset.checked_add(len)? <= m.end()).then_some(m.mirror + (offset - m.start))
    }
}

/// Errors found and repaired on a volume's device (`canopy device
/// stats`): loaded from the image at open, written back by each commit.
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

/// The engine's device: the raw device plus the map of second copies.
pub struct Volume {
    raw: Arc<dyn Device>,
    map: Arc<ChunkMap>,
    pub errors: ErrorCounts,
    /// Whether bad copies may be rewritten (not on a read-only open).
    repairs: std::sync::atomic::AtomicBool,
}

impl Volume {
    pub fn new(raw: Arc<dyn Device>, map: Arc<ChunkMap>) -> Volume {
        Volume {
            raw,
            map,
            errors: ErrorCounts::default(),
            repairs: std::sync::atomic::AtomicBool::new(true),
        }
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

    /// The device below, for what lives outside every group (superblock
    /// copies).
    pub fn raw(&self) -> &dyn Device {
        self.raw.as_ref()
    }

    pub fn map(&self) -> &Arc<ChunkMap> {
        &self.map
    }

    /// How many copies `[offset, offset + len)` has.
    pub fn copies(&self, offset: u64, len: u64) -> usize {
        self.map.copies(offset, len)
    }

    /// Where copy `copy` of `offset` lies on the device.
    pub fn physical(&self, offset: u64, len: u64, copy: usize) -> Result<u64> {
        match copy {
            0 => Ok(offset),
            1 => self
                .map
                .mirror_of(offset, len)
                .ok_or_else(|| no_copy(offset, copy)),
            _ => Err(no_copy(offset, copy)),
        }
    }

    /// Reads copy `copy` of `buf.len()` bytes at logical `offset`.
    pub fn read_copy(&self, buf: &mut [u8], offset: u64, copy: usize) -> Result<()> {
        let at = self.physical(offset, buf.len() as u64, copy)?;
        let r = self.raw.read_at(buf, at);
        if r.is_err() {
            self.errors.read.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Writes `buf` over copy `copy` only (a repair).
    pub fn write_copy(&self, buf: &[u8], offset: u64, copy: usize) -> Result<()> {
        let at = self.physical(offset, buf.len() as u64, copy)?;
        self.counted_write(self.raw.write_at(buf, at))
    }

    fn counted_write(&self, r: Result<()>) -> Result<()> {
        if r.is_err() {
            self.errors.write.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Writes the parts of `buf` (at logical `offset`) that lie in
    /// mirrored groups to their second copies.
    fn write_mirrors(&self, buf: &[u8], offset: u64, data: bool) -> Result<()> {
        let len = buf.len() as u64;
        for m in self.map.overlapping(offset, len) {
            let from = offset.max(m.start);
            let to = (offset + len).min(m.end());
            let part = &buf[(from - offset) as usize..(to - offset) as usize];
            let at = m.mirror + (from - m.start);
            let r = match data {
                true => self.raw.write_data_at(part, at),
                false => self.raw.write_at(part, at),
            };
            self.counted_write(r)?;
        }
        Ok(())
    }
}

fn no_copy(offset: u64, copy: usize) -> Error {
    Error::Invalid(format!("logical {offset} has no copy {copy}"))
}

impl Device for Volume {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_copy(buf, offset, 0)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.counted_write(self.raw.write_at(buf, offset))?;
        self.write_mirrors(buf, offset, false)
    }

    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.counted_write(self.raw.write_data_at(buf, offset))?;
        self.write_mirrors(buf, offset, true)
    }

    fn barrier(&self) -> Result<()> {
        self.raw.barrier()
    }

    fn size(&self) -> u64 {
        self.raw.size()
    }

    fn refresh_size(&self) -> Result<u64> {
        self.raw.refresh_size()
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.raw.prefetch(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn volume() -> (Arc<MemDevice>, Volume) {
        let raw = Arc::new(MemDevice::new(1 << 20));
        let map = Arc::new(ChunkMap::default());
        map.insert(Mirror {
            start: 64 << 10,
            len: 64 << 10,
            mirror: 512 << 10,
        });
        (raw.clone(), Volume::new(raw, map))
    }

    #[test]
    fn writes_reach_both_copies_and_only_the_mirrored_part() {
        let (raw, vol) = volume();
        // Straddles the end of the mirrored group.
        let buf = vec![7u8; 8192];
        vol.write_at(&buf, (128 << 10) - 4096).expect("write");
        let mut got = vec![0u8; 4096];
        raw.read_at(&mut got, (512 << 10) + (60 << 10))
            .expect("read");
        assert_eq!(got, vec![7u8; 4096]);
        raw.read_at(&mut got, (512 << 10) + (64 << 10))
            .expect("read");
        assert_eq!(got, vec![0u8; 4096], "past the group's end is not mirrored");
        assert_eq!(vol.copies((128 << 10) - 4096, 4096), 2);
        assert_eq!(vol.copies((128 << 10) - 4096, 8192), 1);
    }

    #[test]
    fn a_bad_copy_is_read_and_repaired_by_copy() {
        let (raw, vol) = volume();
        vol.write_at(&[1u8; 4096], 64 << 10).expect("write");
        raw.write_at(&[9u8; 4096], 64 << 10).expect("damage copy 0");
        let mut got = vec![0u8; 4096];
        vol.read_copy(&mut got, 64 << 10, 1).expect("copy 1");
        assert_eq!(got, vec![1u8; 4096]);
        vol.write_copy(&got, 64 << 10, 0).expect("repair");
        vol.read_at(&mut got, 64 << 10).expect("copy 0");
        assert_eq!(got, vec![1u8; 4096]);
        assert!(vol.read_copy(&mut got, 0, 1).is_err(), "unmapped: one copy");
    }
}
