//! The on-disk format: constants, keys, tree block layout, superblock and the
//! layout of every item kind.
//!
//! Everything here is pure encoding and decoding of bytes; nothing does I/O.
//! All integers are little-endian. `docs/architecture.md` describes the same
//! format in prose; keep the two in step.

pub mod balance;
pub mod checker;
pub mod inode;
pub mod items;
pub mod key;
pub mod leaf;
pub mod loglink;
pub mod node;
pub mod qgroup;
pub mod superblock;
pub mod uuid;

pub use key::Key;

/// Magic number in every superblock: "_CANOPY_" read as little-endian bytes.
pub const MAGIC: [u8; 8] = *b"_CANOPY_";
/// Format version written by this code.
pub const FORMAT_VERSION: u32 = 1;

/// Superblock copies live at these byte offsets (those inside the device).
pub const SUPER_OFFSETS: [u64; 3] = [64 << 10, 64 << 20, 256 << 30];
/// Size of one superblock copy.
pub const SUPER_SIZE: u64 = 4096;
/// The first MiB of the device is never allocated (boot loaders, labels).
pub const RESERVED_START: u64 = 1 << 20;

pub const MIN_NODESIZE: u32 = 4096;
pub const MAX_NODESIZE: u32 = 65536;
pub const DEFAULT_NODESIZE: u32 = 16384;
pub const SECTORSIZE: u32 = 4096;
/// Most bytes one `LOG_DATA` item holds: the file's bytes from its
/// offset to the end of that chunk of the file at most. Half a sector,
/// so that an item fits a leaf of the smallest node size (4 KiB).
pub const LOG_DATA_CHUNK: u64 = SECTORSIZE as u64 / 2;

/// Well-known tree ids (objectids of ROOT_ITEMs in the root tree).
pub mod tree_id {
    /// The root tree: lists every other tree. Its root is in the superblock.
    pub const ROOT: u64 = 1;
    /// Reference counts and back-references of every block and data extent.
    pub const EXTENT: u64 = 2;
    /// Block group items (data / metadata / system, used bytes).
    pub const BLOCK_GROUP: u64 = 3;
    /// The default subvolume's fs tree.
    pub const FS: u64 = 5;
    /// Data checksums (crc32c per sector).
    pub const CSUM: u64 = 7;
    /// Quota groups.
    pub const QUOTA: u64 = 8;
    /// Free space indexed by start (XFS bnobt).
    pub const FREE_BY_START: u64 = 10;
    /// Free space indexed by length (XFS cntbt).
    pub const FREE_BY_LEN: u64 = 11;
    /// First id handed to user subvolumes and snapshots.
    pub const FIRST_FREE: u64 = 256;
    /// Objectid of the log tree root items (written by fsync).
    pub const LOG: u64 = u64::MAX - 6;
    /// Objectid of relocation trees used by balance.
    pub const RELOC: u64 = u64::MAX - 7;
    /// Objectid of the root tree's `DEFAULT_SUBVOL` item.
    pub const DEFAULT_DIR: u64 = 6;
    /// Highest subvolume id: every (subvolume, inode) pair must map to a
    /// distinct 64-bit inode number (see `fs::node`), which leaves 24 bits
    /// for the subvolume.
    pub const LAST_SUBVOL: u64 = FIRST_FREE + (1 << 24) - 3;

    /// Ids of subvolumes and snapshots users make.
    pub fn is_subvolume(id: u64) -> bool {
        (FIRST_FREE..=LAST_SUBVOL).contains(&id)
    }

    /// Trees whose blocks may be shared with another tree (snapshots, clones).
    /// Blocks of all other trees always have exactly one reference.
    pub fn is_shareable(id: u64) -> bool {
        id == FS || (FIRST_FREE..RELOC).contains(&id)
    }
}

/// Key types. Values follow btrfs where the meaning is the same.
pub mod key_type {
    pub const INODE_ITEM: u8 = 1;
    pub const INODE_REF: u8 = 12;
    /// Overflow back-reference: `(ino, INODE_EXTREF, extref_hash(dir, name))`,
    /// used once the inode's INODE_REF item for `dir` is full.
    pub const INODE_EXTREF: u8 = 13;
    pub const XATTR_ITEM: u8 = 24;
    pub const ORPHAN_ITEM: u8 = 48;
    pub const DIR_LOG_INDEX: u8 = 72;
    pub const DIR_ITEM: u8 = 84;
    pub const DIR_INDEX: u8 = 96;
    /// File extent item: `(inode, EXTENT_DATA, file offset)`.
    pub const EXTENT_DATA: u8 = 108;
    /// Data checksums: `(CSUM_OBJECTID, EXTENT_CSUM, disk bytenr)`.
    pub const EXTENT_CSUM: u8 = 128;
    /// A tree's root: `(tree id, ROOT_ITEM, 0)` in the root tree.
    pub const ROOT_ITEM: u8 = 132;
    /// `(subvolume, ROOT_BACKREF, parent subvolume)` in the root tree:
    /// where the subvolume's directory entry is. Payload: one directory
    /// entry whose inode field is the directory holding it.
    pub const ROOT_BACKREF: u8 = 144;
    /// `(parent subvolume, ROOT_REF, subvolume)`: the same, keyed from the
    /// parent (to list and to refuse deleting a parent of others).
    pub const ROOT_REF: u8 = 156;
    /// An allocated extent: `(bytenr, EXTENT_ITEM, length)`.
    pub const EXTENT_ITEM: u8 = 168;
    /// Back-reference from a tree's root item: `(bytenr, TREE_BLOCK_REF, tree id)`.
    pub const TREE_BLOCK_REF: u8 = 176;
    /// Reserved: keyed data back-reference `(root, inode, offset)` (not yet written).
    pub const EXTENT_DATA_REF: u8 = 178;
    /// Back-reference from a parent node: `(bytenr, SHARED_BLOCK_REF, parent)`.
    pub const SHARED_BLOCK_REF: u8 = 182;
    /// Back-reference from a leaf's file extent items:
    /// `(bytenr, SHARED_DATA_REF, leaf)`, payload: count u32.
    pub const SHARED_DATA_REF: u8 = 184;
    /// `(start, BLOCK_GROUP_ITEM, length)` in the block group tree.
    pub const BLOCK_GROUP_ITEM: u8 = 192;
    /// Free extent: `(start, FREE_EXTENT, len)` in the by-start tree and
    /// `(len, FREE_EXTENT, start)` in the by-length tree.
    pub const FREE_EXTENT: u8 = 199;
    /// Log tree only: how an inode was logged (one byte, `fs::log`).
    pub const LOG_INODE: u8 = 220;
    /// Log tree only: a file range whose extent items the log holds in
    /// full (value: the range's end, u64).
    pub const LOG_RANGE: u8 = 221;
    /// Log tree only: bytes of a file an fsync logged instead of writing
    /// them to an extent (at most [`super::LOG_DATA_CHUNK`] of them, from the key's
    /// offset, within one chunk; `fs::log`).
    pub const LOG_DATA: u8 = 222;
    /// `(DEFAULT_DIR, DEFAULT_SUBVOL, 0)` in the root tree: the subvolume
    /// a mount shows when none is asked for (u64; absent: tree 5).
    pub const DEFAULT_SUBVOL: u8 = 230;
    /// `(DROP_QUEUE_OBJECTID, DROPPED_BLOCK, bytenr)` in the root tree: a
    /// tree block of a dropped tree that nothing references any more but
    /// that still holds what it points at, waiting for the cleaner
    /// (`extent::drop`). Payload: [`crate::format::items::DroppedBlock`].
    pub const DROPPED_BLOCK: u8 = 234;
    /// `(BALANCE_OBJECTID, BALANCE_ITEM, 0)` in the root tree: a balance
    /// in progress (`balance`).
    pub const BALANCE_ITEM: u8 = 248;
    /// `(BALANCE_OBJECTID, BALANCE_GROUP, start)`: a group it has still to
    /// empty.
    pub const BALANCE_GROUP: u8 = 249;
    /// `(DEV_REPLACE_OBJECTID, DEV_REPLACE, 0)` in the root tree: a device
    /// replace in progress ([`crate::format::items::DevReplaceItem`]).
    pub const DEV_REPLACE: u8 = 250;
    /// `(DEVICE_STATS_OBJECTID, DEVICE_STATS, devid)` in the root tree:
    /// the device's error counters ([`crate::format::items::DeviceStats`]).
    pub const DEVICE_STATS: u8 = 251;
    pub const QGROUP_STATUS: u8 = 240;
    pub const QGROUP_INFO: u8 = 242;
    pub const QGROUP_LIMIT: u8 = 244;
    pub const QGROUP_RELATION: u8 = 246;
}

/// Objectid under which checksum items are keyed in the checksum tree.
pub const CSUM_OBJECTID: u64 = u64::MAX - 9;

/// Objectid of a balance's items in the root tree.
pub const BALANCE_OBJECTID: u64 = u64::MAX - 3;

/// Objectid of a device replace's item in the root tree.
pub const DEV_REPLACE_OBJECTID: u64 = u64::MAX - 12;

/// Objectid of the devices' error counters in the root tree.
pub const DEVICE_STATS_OBJECTID: u64 = u64::MAX - 11;

/// Objectid of the drop queue's items in the root tree.
pub const DROP_QUEUE_OBJECTID: u64 = u64::MAX - 10;

/// Checksum of a byte range as stored everywhere in the format.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The first sector of `data` whose checksum differs from its entry in
/// `sums` (4 bytes per sector, as a checksum item holds them) or has no
/// entry there.
pub fn first_bad_sector(data: &[u8], sums: &[u8]) -> Option<usize> {
    data.chunks(SECTORSIZE as usize)
        .enumerate()
        .find(|&(i, sector)| !sector_matches(sums, i, sector))
        .map(|(i, _)| i)
}

/// Whether `sector` matches entry `index` of `sums` (4 bytes per sector,
/// as a checksum item holds them); a sector without an entry does not.
pub fn sector_matches(sums: &[u8], index: usize, sector: &[u8]) -> bool {
    sums.get(index * 4..index * 4 + 4) == Some(&crc(sector).to_le_bytes()[..])
}

/// Little-endian field readers that never panic: callers check lengths first.
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::{crc, first_bad_sector, SECTORSIZE};

    /// A sector whose checksum differs, or that has none, is bad; the
    /// first one is named.
    #[test]
    fn first_bad_sector_names_a_mismatch_or_a_missing_sum() {
        let data: Vec<u8> = (0..3 * SECTORSIZE as usize)
            .map(|i| (i / 97) as u8)
            .collect();
        let mut sums: Vec<u8> = data
            .chunks(SECTORSIZE as usize)
            .flat_map(|s| crc(s).to_le_bytes())
            .collect();
        assert_eq!(first_bad_sector(&data, &sums), None);
        assert_eq!(first_bad_sector(&data, &sums[..8]), Some(2));
        sums[5] ^= 1;
        assert_eq!(first_bad_sector(&data, &sums), Some(1));
    }
}
