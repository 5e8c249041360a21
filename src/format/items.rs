//! Layouts of the item kinds the engine itself reads and writes.
//!
//! Each type encodes to a `Vec<u8>` and decodes from a slice, returning a
//! description of the problem when the slice cannot be this item.

use super::{le_u32, le_u64, put_u64};

type DecodeResult<T> = std::result::Result<T, String>;

fn need(b: &[u8], n: usize, what: &str) -> DecodeResult<()> {
    if b.len() < n {
        return Err(format!("{what} item of {} bytes, need {n}", b.len()));
    }
    Ok(())
}

/// `(tree id, ROOT_ITEM, 0)` in the root tree: where a tree's root block is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootItem {
    pub bytenr: u64,
    pub generation: u64,
    pub level: u8,
    /// Generation of the last snapshot/clone taken of (or as) this tree: blocks
    /// no newer than this may be shared with another tree.
    pub last_snapshot: u64,
    /// The tree this one was cloned from (0 for none).
    pub parent_id: u64,
    pub flags: u64,
    /// Generation in which this tree was created.
    pub created: u64,
    pub name: Vec<u8>,
    /// Who the subvolume is to send and receive (absent in images made
    /// before it existed, until a subvolume is created, snapshotted, made
    /// read-only or sent).
    pub ident: Option<SubvolIdent>,
}

const ROOT_ITEM_FIXED: usize = 8 * 6 + 1 + 2;

/// A subvolume's identity, as btrfs's root item carries it: what send
/// streams name subvolumes by, so a receiver finds an incremental
/// stream's parent. Follows the name in the root item (72 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubvolIdent {
    /// Its own, random at creation.
    pub uuid: [u8; 16],
    /// The uuid of the subvolume it is a snapshot of (zero: none).
    pub parent_uuid: [u8; 16],
    /// The uuid of the subvolume a receive made it from (zero: none).
    pub received_uuid: [u8; 16],
    /// The transaction of its last change that send can see: creation,
    /// or when it was last made read-only.
    pub ctransid: u64,
    /// The sender's ctransid, for a received subvolume.
    pub stransid: u64,
    /// The transaction that finished receiving it.
    pub rtransid: u64,
}

pub const SUBVOL_IDENT_SIZE: usize = 72;

impl SubvolIdent {
    fn encode_into(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.uuid);
        b.extend_from_slice(&self.parent_uuid);
        b.extend_from_slice(&self.received_uuid);
        b.extend_from_slice(&self.ctransid.to_le_bytes());
        b.extend_from_slice(&self.stransid.to_le_bytes());
        b.extend_from_slice(&self.rtransid.to_le_bytes());
    }

    fn decode(b: &[u8]) -> SubvolIdent {
        let uuid = |at: usize| {
            let mut u = [0u8; 16];
            u.copy_from_slice(&b[at..at + 16]);
            u
        };
        SubvolIdent {
            uuid: uuid(0),
            parent_uuid: uuid(16),
            received_uuid: uuid(32),
            ctransid: le_u64(b, 48),
            stransid: le_u64(b, 56),
            rtransid: le_u64(b, 64),
        }
    }
}

impl RootItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ROOT_ITEM_FIXED + self.name.len()];
        put_u64(&mut b, 0, self.bytenr);
        put_u64(&mut b, 8, self.generation);
        put_u64(&mut b, 16, self.last_snapshot);
        put_u64(&mut b, 24, self.parent_id);
        put_u64(&mut b, 32, self.flags);
        put_u64(&mut b, 40, self.created);
        b[48] = self.level;
        super::put_u16(&mut b, 49, self.name.len() as u16);
        b[ROOT_ITEM_FIXED..].copy_from_slice(&self.name);
        if let Some(ident) = &self.ident {
            ident.encode_into(&mut b);
        }
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<RootItem> {
        need(b, ROOT_ITEM_FIXED, "root")?;
        let name_len = usize::from(super::le_u16(b, 49));
        let named = ROOT_ITEM_FIXED + name_len;
        let ident = match b.len() {
            n if n == named => None,
            n if n == named + SUBVOL_IDENT_SIZE => Some(SubvolIdent::decode(&b[named..])),
            _ => return Err("root item name length disagrees with item size".into()),
        };
        Ok(RootItem {
            bytenr: le_u64(b, 0),
            generation: le_u64(b, 8),
            last_snapshot: le_u64(b, 16),
            parent_id: le_u64(b, 24),
            flags: le_u64(b, 32),
            created: le_u64(b, 40),
            level: b[48],
            name: b[ROOT_ITEM_FIXED..named].to_vec(),
            ident,
        })
    }
}

pub const EXTENT_FLAG_DATA: u64 = 1;
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 2;

/// `(bytenr, EXTENT_ITEM, length)` in the extent tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentItem {
    /// Number of references: the sum over its back-reference items.
    pub refs: u64,
    /// Generation in which the extent was allocated.
    pub generation: u64,
    pub flags: u64,
    /// For tree blocks: the tree that allocated it, and its level.
    pub owner: u64,
    pub level: u8,
}

pub const EXTENT_ITEM_SIZE: usize = 33;

impl ExtentItem {
    pub fn is_tree_block(&self) -> bool {
        self.flags & EXTENT_FLAG_TREE_BLOCK != 0
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; EXTENT_ITEM_SIZE];
        put_u64(&mut b, 0, self.refs);
        put_u64(&mut b, 8, self.generation);
        put_u64(&mut b, 16, self.flags);
        put_u64(&mut b, 24, self.owner);
        b[32] = self.level;
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<ExtentItem> {
        need(b, EXTENT_ITEM_SIZE, "extent")?;
        let flags = le_u64(b, 16);
        if flags.count_ones() != 1 || flags & !(EXTENT_FLAG_DATA | EXTENT_FLAG_TREE_BLOCK) != 0 {
            return Err(format!("extent item flags {flags:#x} invalid"));
        }
        Ok(ExtentItem {
            refs: le_u64(b, 0),
            generation: le_u64(b, 8),
            flags,
            owner: le_u64(b, 24),
            level: b[32],
        })
    }
}

/// `(DROP_QUEUE_OBJECTID, DROPPED_BLOCK, bytenr)`: a queued tree block,
/// with what its extent item said (the item itself is gone), and how far
/// the cleaner got: entries before `next` have given up their references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DroppedBlock {
    pub generation: u64,
    pub owner: u64,
    pub level: u8,
    pub next: u32,
}

pub const DROPPED_BLOCK_SIZE: usize = 21;

impl DroppedBlock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DROPPED_BLOCK_SIZE];
        put_u64(&mut b, 0, self.generation);
        put_u64(&mut b, 8, self.owner);
        b[16] = self.level;
        b[17..21].copy_from_slice(&self.next.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<DroppedBlock> {
        if b.len() != DROPPED_BLOCK_SIZE {
            return Err(format!("dropped block item of {} bytes", b.len()));
        }
        let level = b[16];
        if level > super::node::MAX_LEVEL {
            return Err(format!("dropped block of level {level}"));
        }
        Ok(DroppedBlock {
            generation: le_u64(b, 0),
            owner: le_u64(b, 8),
            level,
            next: le_u32(b, 17),
        })
    }
}

/// Payload of a SHARED_DATA_REF: how many items of the leaf point here.
pub fn encode_ref_count(count: u32) -> Vec<u8> {
    count.to_le_bytes().to_vec()
}

pub fn decode_ref_count(b: &[u8]) -> DecodeResult<u32> {
    need(b, 4, "data ref")?;
    Ok(le_u32(b, 0))
}

pub const BG_DATA: u64 = 1;
pub const BG_SYSTEM: u64 = 2;
pub const BG_METADATA: u64 = 4;
/// Data and tree blocks in one group (small images: see `alloc`).
pub const BG_MIXED: u64 = BG_DATA | BG_METADATA;
/// The group has a second copy on the same device (the DUP profile): its
/// item carries where, and every write goes to both.
pub const BG_DUP: u64 = 32;
/// The group has a second copy on another device (RAID1).
pub const BG_RAID1: u64 = 16;
/// The group has two more copies, on two other devices (RAID1C3).
pub const BG_RAID1C3: u64 = 512;
/// The group keeps two copies striped over pairs of devices (RAID10, the
/// mapped layout only): its item lists the devices pair by pair.
pub const BG_RAID10: u64 = 64;
const BG_PROFILES: u64 = BG_DUP | BG_RAID1 | BG_RAID1C3 | BG_RAID10;
/// The item names every copy, the first included (the mapped layout, see
/// `volume`), as (devid, offset) pairs.
pub const BG_LISTED: u64 = 1 << 48;

pub use crate::volume::Stripe;

/// `(start, BLOCK_GROUP_ITEM, length)` in the block group tree.
///
/// used u64, flags u64 (kind and profile bit), then the copies beyond the
/// first: nothing for a single group (16 bytes); with [`BG_DUP`] the
/// device-1 offset of the second copy (24 bytes); with [`BG_RAID1`] the
/// second copy's devid and offset (32 bytes); with [`BG_RAID1C3`] two such
/// pairs (48 bytes). A group's start is also where its first copy lies on
/// device 1, so reading needs no mapping; only the other copies do.
/// With [`BG_LISTED`] (the mapped layout) every copy follows as a
/// (devid, offset) pair, the first included: 32, 48 or 64 bytes; with
/// [`BG_RAID10`] an even number of pairs, each pair of devices holding
/// the two copies of every other 64 KiB unit (see `volume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    pub used: u64,
    /// The kind (`BG_DATA`, `BG_SYSTEM`, `BG_METADATA`, `BG_MIXED`),
    /// without the profile bit: that follows from `extra`.
    pub flags: u64,
    /// Where the first copy lies, in the mapped layout (None: device 1
    /// at the group's start).
    pub first: Option<Stripe>,
    /// Where the copies beyond the first lie (for RAID10, the devices
    /// after the first).
    pub extra: Vec<Stripe>,
    /// RAID10: `first` and `extra` are the devices the units are striped
    /// over, mirrors side by side.
    pub striped: bool,
}

pub const BLOCK_GROUP_ITEM_SIZE: usize = 16;

impl BlockGroupItem {
    /// The profile bit the copies make: DUP for one more copy on device
    /// 1, RAID1 for one on another device, RAID1C3 for two.
    fn profile_bit(&self) -> u64 {
        let first_devid = self.first.map_or(1, |f| f.devid);
        if self.striped {
            return BG_RAID10;
        }
        match self.extra.as_slice() {
            [] => 0,
            [s] if s.devid == first_devid => BG_DUP,
            [_] => BG_RAID1,
            _ => BG_RAID1C3,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let bit = self.profile_bit();
        let mut b = vec![0u8; BLOCK_GROUP_ITEM_SIZE];
        put_u64(&mut b, 0, self.used);
        if let Some(first) = self.first {
            put_u64(&mut b, 8, self.flags | bit | BG_LISTED);
            for s in std::iter::once(&first).chain(&self.extra) {
                b.extend_from_slice(&s.devid.to_le_bytes());
                b.extend_from_slice(&s.offset.to_le_bytes());
            }
            return b;
        }
        put_u64(&mut b, 8, self.flags | bit);
        for s in &self.extra {
            if bit != BG_DUP {
                b.extend_from_slice(&s.devid.to_le_bytes());
            }
            b.extend_from_slice(&s.offset.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<BlockGroupItem> {
        need(b, BLOCK_GROUP_ITEM_SIZE, "block group")?;
        let raw = le_u64(b, 8);
        let flags = raw & !BG_PROFILES & !BG_LISTED;
        if ![BG_DATA, BG_SYSTEM, BG_METADATA, BG_MIXED].contains(&flags) {
            return Err(format!("block group flags {raw:#x} invalid"));
        }
        if raw & BG_LISTED != 0 {
            return Self::decode_listed(b, raw, flags);
        }
        let (want, extra) = match raw & BG_PROFILES {
            0 => (16, Vec::new()),
            BG_DUP if b.len() == 24 => (
                24,
                vec![Stripe {
                    devid: 1,
                    offset: le_u64(b, 16),
                }],
            ),
            BG_RAID1 if b.len() == 32 => (32, stripes_at(b, 1)),
            BG_RAID1C3 if b.len() == 48 => (48, stripes_at(b, 2)),
            bits @ (BG_DUP | BG_RAID1 | BG_RAID1C3) => {
                return Err(format!(
                    "block group item of {} bytes with profile bits {bits:#x}",
                    b.len()
                ))
            }
            _ => return Err(format!("block group flags {raw:#x} invalid")),
        };
        if b.len() != want {
            return Err(format!("block group item of {} bytes", b.len()));
        }
        if raw & (BG_RAID1 | BG_RAID1C3) != 0 {
            let devids = distinct_devids(&extra);
            if devids.len() != extra.len() || devids.contains(&0) || devids.contains(&1) {
                return Err(format!(
                    "block group copies on devices {:?}: each must be another device than 1 and than each other",
                    extra.iter().map(|s| s.devid).collect::<Vec<_>>()
                ));
            }
        }
        Ok(BlockGroupItem {
            used: le_u64(b, 0),
            flags,
            first: None,
            extra,
            striped: false,
        })
    }

    /// An item of the mapped layout: every copy as a (devid, offset)
    /// pair, as many as the profile bit says, `dup`'s both on one device
    /// and the others' on distinct devices.
    fn decode_listed(b: &[u8], raw: u64, flags: u64) -> DecodeResult<BlockGroupItem> {
        let pairs = b.len().saturating_sub(16) / 16;
        let copies = match raw & BG_PROFILES {
            0 => 1,
            BG_DUP | BG_RAID1 => 2,
            BG_RAID1C3 => 3,
            BG_RAID10 if pairs >= 2 && pairs.is_multiple_of(2) => pairs,
            BG_RAID10 => {
                return Err(format!(
                    "raid10 block group item of {} bytes: an even number of devices, two or more",
                    b.len()
                ))
            }
            _ => return Err(format!("block group flags {raw:#x} invalid")),
        };
        if b.len() != 16 + 16 * copies {
            return Err(format!(
                "block group item of {} bytes for {copies} listed copies",
                b.len()
            ));
        }
        let all = stripes_at(b, copies);
        let devids = distinct_devids(&all);
        let distinct = match raw & BG_DUP {
            0 => copies,
            _ => 1,
        };
        if devids.len() != distinct || devids.contains(&0) {
            return Err(format!(
                "block group copies on devices {:?} do not make its profile",
                all.iter().map(|s| s.devid).collect::<Vec<_>>()
            ));
        }
        Ok(BlockGroupItem {
            used: le_u64(b, 0),
            flags,
            first: Some(all[0]),
            extra: all[1..].to_vec(),
            striped: raw & BG_RAID10 != 0,
        })
    }
}

/// The devices `stripes` lie on, each once, in order.
fn distinct_devids(stripes: &[Stripe]) -> Vec<u64> {
    let mut devids: Vec<u64> = stripes.iter().map(|s| s.devid).collect();
    devids.sort_unstable();
    devids.dedup();
    devids
}

/// `n` (devid, offset) pairs from byte 16.
fn stripes_at(b: &[u8], n: usize) -> Vec<Stripe> {
    (0..n)
        .map(|i| Stripe {
            devid: le_u64(b, 16 + 16 * i),
            offset: le_u64(b, 24 + 16 * i),
        })
        .collect()
}

/// A device's error counters since they were last reset (`canopy device
/// stats`): reads that failed, copies found bad (checksum, address or
/// generation), bad copies rewritten from a good one, writes that failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub read_errors: u64,
    pub corruption_errors: u64,
    pub corrected: u64,
    pub write_errors: u64,
}

pub const DEVICE_STATS_SIZE: usize = 32;

/// A device replace in progress (`canopy device replace`), so that a
/// mount after an unmount or a crash carries it on: which device is
/// replaced, the uuid and size the target will have in the device table
/// (its marker carries the uuid too), whether reads avoid the source, and
/// the name the target was opened by (to open it again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevReplaceItem {
    pub source: u64,
    pub target_bytes: u64,
    pub target_uuid: [u8; 16],
    pub avoid_source: bool,
    pub name: Vec<u8>,
}

/// Longest target name a replace item holds.
pub const DEV_REPLACE_NAME_MAX: usize = 4096;

impl DevReplaceItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 35];
        put_u64(&mut b, 0, self.source);
        put_u64(&mut b, 8, self.target_bytes);
        b[16..32].copy_from_slice(&self.target_uuid);
        b[32] = u8::from(self.avoid_source);
        b[33..35].copy_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.name);
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<DevReplaceItem> {
        need(b, 35, "device replace")?;
        let len = usize::from(u16::from_le_bytes([b[33], b[34]]));
        if b.len() != 35 + len || len == 0 || len > DEV_REPLACE_NAME_MAX {
            return Err(format!(
                "device replace item of {} bytes naming {len}",
                b.len()
            ));
        }
        let source = le_u64(b, 0);
        if !(1..=super::superblock::DEVICES_MAX as u64).contains(&source) || b[32] > 1 {
            return Err(format!(
                "device replace of device {source}, flags {}",
                b[32]
            ));
        }
        let mut target_uuid = [0u8; 16];
        target_uuid.copy_from_slice(&b[16..32]);
        Ok(DevReplaceItem {
            source,
            target_bytes: le_u64(b, 8),
            target_uuid,
            avoid_source: b[32] == 1,
            name: b[35..].to_vec(),
        })
    }
}

impl DeviceStats {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DEVICE_STATS_SIZE];
        put_u64(&mut b, 0, self.read_errors);
        put_u64(&mut b, 8, self.corruption_errors);
        put_u64(&mut b, 16, self.corrected);
        put_u64(&mut b, 24, self.write_errors);
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<DeviceStats> {
        if b.len() != DEVICE_STATS_SIZE {
            return Err(format!("device stats of {} bytes", b.len()));
        }
        Ok(DeviceStats {
            read_errors: le_u64(b, 0),
            corruption_errors: le_u64(b, 8),
            corrected: le_u64(b, 16),
            write_errors: le_u64(b, 24),
        })
    }
}

pub const FILE_EXTENT_INLINE: u8 = 0;
pub const FILE_EXTENT_REG: u8 = 1;
pub const FILE_EXTENT_PREALLOC: u8 = 2;

pub const COMPRESS_NONE: u8 = 0;
pub const COMPRESS_ZSTD: u8 = 1;
pub const COMPRESS_LZ4: u8 = 2;
/// Most bytes a compressed extent decodes to: readers never allocate
/// more for one, whatever its item says.
pub const COMPRESSED_MAX: u64 = 128 << 10;
/// Most bytes a compressed inline extent decodes to: one sector, as in
/// btrfs (a larger file is better off in an extent of its own).
pub const COMPRESSED_INLINE_MAX: u64 = super::SECTORSIZE as u64;

/// `(inode, EXTENT_DATA, file offset)` in an fs tree.
///
/// Inline extents carry their (possibly compressed) bytes after the 21-byte
/// header; regular and prealloc extents point into a data extent on disk, and
/// `offset`/`num_bytes` select the part of the decoded extent this file range
/// uses (so reflinks and partial overwrites share one extent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileExtentItem {
    pub generation: u64,
    /// Decoded (uncompressed) length of the whole extent.
    pub ram_bytes: u64,
    pub compression: u8,
    pub kind: u8,
    pub disk_bytenr: u64,
    pub disk_num_bytes: u64,
    pub offset: u64,
    pub num_bytes: u64,
    pub inline_data: Vec<u8>,
}

const FE_HEADER: usize = 21;
const FE_REG_SIZE: usize = FE_HEADER + 32;

impl FileExtentItem {
    /// An uncompressed regular extent used whole: `len` bytes at `disk`,
    /// written in transaction `generation`.
    pub fn whole(disk: u64, len: u64, generation: u64) -> FileExtentItem {
        FileExtentItem {
            generation,
            ram_bytes: len,
            compression: 0,
            kind: FILE_EXTENT_REG,
            disk_bytenr: disk,
            disk_num_bytes: len,
            offset: 0,
            num_bytes: len,
            inline_data: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let body = if self.kind == FILE_EXTENT_INLINE {
            self.inline_data.len()
        } else {
            32
        };
        let mut b = vec![0u8; FE_HEADER + body];
        put_u64(&mut b, 0, self.generation);
        put_u64(&mut b, 8, self.ram_bytes);
        b[16] = self.compression;
        b[20] = self.kind;
        if self.kind == FILE_EXTENT_INLINE {
            b[FE_HEADER..].copy_from_slice(&self.inline_data);
        } else {
            put_u64(&mut b, 21, self.disk_bytenr);
            put_u64(&mut b, 29, self.disk_num_bytes);
            put_u64(&mut b, 37, self.offset);
            put_u64(&mut b, 45, self.num_bytes);
        }
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<FileExtentItem> {
        need(b, FE_HEADER, "file extent")?;
        let kind = b[20];
        let mut fe = FileExtentItem {
            generation: le_u64(b, 0),
            ram_bytes: le_u64(b, 8),
            compression: b[16],
            kind,
            disk_bytenr: 0,
            disk_num_bytes: 0,
            offset: 0,
            num_bytes: 0,
            inline_data: Vec::new(),
        };
        match kind {
            FILE_EXTENT_INLINE => fe.inline_data = b[FE_HEADER..].to_vec(),
            FILE_EXTENT_REG | FILE_EXTENT_PREALLOC => {
                if b.len() != FE_REG_SIZE {
                    return Err(format!("regular file extent item of {} bytes", b.len()));
                }
                fe.disk_bytenr = le_u64(b, 21);
                fe.disk_num_bytes = le_u64(b, 29);
                fe.offset = le_u64(b, 37);
                fe.num_bytes = le_u64(b, 45);
            }
            _ => return Err(format!("file extent type {kind} unknown")),
        }
        Ok(fe)
    }

    /// The data extent this item references, if any: `(bytenr, length)`.
    pub fn disk_extent(&self) -> Option<(u64, u64)> {
        (self.kind != FILE_EXTENT_INLINE && self.disk_bytenr != 0)
            .then_some((self.disk_bytenr, self.disk_num_bytes))
    }
}

/// The data extent an item of a leaf references, if it is a file extent item
/// pointing at one. This is how the extent layer learns data references
/// without knowing about files.
pub fn data_ref_of(key: &super::Key, data: &[u8]) -> Option<(u64, u64)> {
    if key.ty != super::key_type::EXTENT_DATA {
        return None;
    }
    FileExtentItem::decode(data).ok()?.disk_extent()
}
