//! Block groups: what kind of extents a range of the device holds.

use super::FreeIndex;
use crate::format::items::Stripe;
use crate::format::superblock::Profile;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    Data,
    Metadata,
    System,
    /// Data and tree blocks together (images under 1 GiB), so that space
    /// never sits in a group of the wrong kind.
    Mixed,
}

impl GroupKind {
    /// Its name in `canopy filesystem usage`.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Data => "data",
            GroupKind::Metadata => "metadata",
            GroupKind::System => "system",
            GroupKind::Mixed => "mixed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct BlockGroup {
    pub start: u64,
    pub len: u64,
    pub kind: GroupKind,
    /// Bytes held by extents (pinned frees already subtracted).
    pub used: u64,
    pub free: FreeIndex,
    /// Where the first copy lies in the mapped layout (None: device 1 at
    /// `start`, the bound layout; see `volume`).
    pub first: Option<Stripe>,
    /// Where the copies beyond the first lie (see `volume`).
    pub extra: Vec<Stripe>,
    /// RAID10: `first` and `extra` are the devices its units go round
    /// (see `volume::Chunk`).
    pub striped: bool,
}

impl BlockGroup {
    /// Nothing lives here and nothing freed here waits for a commit: the
    /// group can go back to the unallocated pool.
    pub fn is_empty(&self) -> bool {
        self.used == 0 && self.free.total() + self.super_bytes() == self.len
    }

    /// Bytes of superblock copies inside the group's logical range: those
    /// on device 1 in the bound layout, none in the mapped one (whose
    /// copies keep apart from superblocks on every device).
    pub fn super_bytes(&self) -> u64 {
        match self.first {
            Some(_) => 0,
            None => super::super_bytes_in(self.start, self.len),
        }
    }

    /// Where the first copy lies.
    pub fn first_stripe(&self) -> Stripe {
        self.first.unwrap_or(Stripe {
            devid: crate::volume::PRIMARY_DEVID,
            offset: self.start,
        })
    }
}

impl BlockGroup {
    pub fn new(start: u64, len: u64, kind: GroupKind, used: u64) -> BlockGroup {
        BlockGroup {
            start,
            len,
            kind,
            used,
            free: FreeIndex::default(),
            first: None,
            extra: Vec::new(),
            striped: false,
        }
    }

    /// The profile its copies make.
    pub fn profile(&self) -> Profile {
        if self.striped {
            return Profile::Raid10;
        }
        match self.extra.as_slice() {
            [] => Profile::Single,
            [s] if s.devid == self.first_stripe().devid => Profile::Dup,
            [_] => Profile::Raid1,
            _ => Profile::Raid1c3,
        }
    }

    /// Every device range it takes: (devid, start, end).
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let len = self.stripe_len();
        std::iter::once(self.first_stripe())
            .chain(self.extra.iter().copied())
            .map(move |s| (s.devid, s.offset, s.offset + len))
    }

    /// Bytes of each device range: the group's length, or for RAID10
    /// its share on each pair of devices.
    pub fn stripe_len(&self) -> u64 {
        crate::volume::stripe_len(self.len, 1 + self.extra.len(), self.striped)
    }

    /// Its entry in the volume's map of copies.
    pub fn chunk(&self) -> crate::volume::Chunk {
        crate::volume::Chunk {
            start: self.start,
            len: self.len,
            first: self.first_stripe(),
            extra: self.extra.clone(),
            striped: self.striped,
        }
    }
}

/// Size of a new group: a fraction of the device, within fixed bounds, in
/// whole MiB.
pub fn default_size(kind: GroupKind, device_bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let (frac, lo, hi) = match kind {
        GroupKind::Data => (10, 16 * MIB, 1 << 30),
        GroupKind::Metadata => (64, 4 * MIB, 256 * MIB),
        GroupKind::System => (512, MIB, 32 * MIB),
        GroupKind::Mixed => (8, 16 * MIB, 256 * MIB),
    };
    ((device_bytes / frac).clamp(lo, hi) / MIB) * MIB
}
