//! Block groups: what kind of extents a range of the device holds.

use super::FreeIndex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    Data,
    Metadata,
    System,
}

#[derive(Clone, Debug)]
pub struct BlockGroup {
    pub start: u64,
    pub len: u64,
    pub kind: GroupKind,
    /// Bytes held by extents (pinned frees already subtracted).
    pub used: u64,
    pub free: FreeIndex,
}

impl BlockGroup {
    pub fn new(start: u64, len: u64, kind: GroupKind, used: u64) -> BlockGroup {
        BlockGroup {
            start,
            len,
            kind,
            used,
            free: FreeIndex::default(),
        }
    }
}

/// Size of a new group: a fraction of the device, within fixed bounds, in
/// whole MiB.
pub fn default_size(kind: GroupKind, device_bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let (frac, lo, hi) = match kind {
        GroupKind::Data => (10, 16 * MIB, 1 << 30),
        GroupKind::Metadata => (32, 8 * MIB, 256 * MIB),
        GroupKind::System => (128, 4 * MIB, 32 * MIB),
    };
    ((device_bytes / frac).clamp(lo, hi) / MIB) * MIB
}
