//! The superblock: the one place that says where the current root tree is.
//!
//! Copies live at [`super::SUPER_OFFSETS`] inside the device. Each copy is
//! checksummed; at open the valid copy with the highest generation wins, so a
//! torn superblock write falls back to the previous commit.

use super::items::Stripe;
use super::{crc, le_u16, le_u32, le_u64, put_u16, put_u32, put_u64, FORMAT_VERSION, MAGIC};
use crate::error::{Error, Result};

const OFF_CSUM: usize = 0;
const OFF_FSID: usize = 32;
const OFF_BYTENR: usize = 48;
const OFF_FLAGS: usize = 56;
const OFF_MAGIC: usize = 64;
const OFF_GENERATION: usize = 72;
const OFF_ROOT: usize = 80;
const OFF_ROOT_GENERATION: usize = 88;
const OFF_LOG_ROOT: usize = 96;
const OFF_LOG_ROOT_GENERATION: usize = 104;
const OFF_TOTAL_BYTES: usize = 112;
const OFF_BYTES_USED: usize = 120;
const OFF_LOG_CHAIN: usize = 128;
const OFF_NODESIZE: usize = 136;
const OFF_SECTORSIZE: usize = 140;
const OFF_COMPAT: usize = 144;
const OFF_COMPAT_RO: usize = 152;
const OFF_INCOMPAT: usize = 160;
const OFF_CSUM_TYPE: usize = 168;
const OFF_ROOT_LEVEL: usize = 170;
const OFF_LOG_ROOT_LEVEL: usize = 171;
const OFF_VERSION: usize = 172;
const OFF_LABEL: usize = 176;
pub const LABEL_MAX: usize = 255;
const OFF_LOG_PREV_ROOT: usize = 432;
const OFF_LOG_PREV_GENERATION: usize = 440;
const OFF_LOG_PREV_LEVEL: usize = 448;
const OFF_LOG_NONCE: usize = 456;
const OFF_METADATA_PROFILE: usize = 464;
const OFF_DATA_PROFILE: usize = 465;
const OFF_SYSTEM_CHUNKS: usize = 468;
const OFF_SYSTEM_ARRAY: usize = 472;
/// A system group's entry without [`INCOMPAT_DEVICES`]: start, length,
/// device-1 offset of the second copy.
const SYSTEM_CHUNK_BYTES: usize = 24;
/// A system group's entry with [`INCOMPAT_DEVICES`]: start, length, then
/// two (devid, offset) pairs for the copies beyond the first (devid 0:
/// none).
const SYSTEM_CHUNK_BYTES_DEVICES: usize = 48;
/// A system group's entry with [`INCOMPAT_MAPPED`]: start, length, then
/// three (devid, offset) pairs for every copy, the first included (devid
/// 0: none).
const SYSTEM_CHUNK_BYTES_MAPPED: usize = 64;
/// Most system groups the superblock can name (the array's room).
pub const SYSTEM_CHUNKS_MAX: usize = 128;
/// The same with [`INCOMPAT_DEVICES`], whose entries are twice as long.
pub const SYSTEM_CHUNKS_MAX_DEVICES: usize = 64;
/// The same with [`INCOMPAT_MAPPED`].
pub const SYSTEM_CHUNKS_MAX_MAPPED: usize = 48;
/// With [`INCOMPAT_DEVICES`]: the devid of the device this copy lies on.
const OFF_DEVID: usize = 3544;
const OFF_DEVICE_COUNT: usize = 3552;
/// With [`INCOMPAT_DEVICES`]: the filesystem's devices, 32 bytes each
/// (devid u64, size u64, uuid 16 bytes).
const OFF_DEVICE_TABLE: usize = 3560;
const DEVICE_ITEM_BYTES: usize = 32;
/// Most devices a filesystem has.
pub const DEVICES_MAX: usize = 16;
const SUPER_BYTES: usize = 4096;

/// Every block group holds data and tree blocks alike (images under
/// 1 GiB); older code would misread the groups' flags.
pub const INCOMPAT_MIXED_GROUPS: u64 = 1;
/// The superblock names a log tree that must be replayed before the
/// image is used; older code would ignore it and lose fsynced changes.
pub const INCOMPAT_LOG_TREE: u64 = 2;
/// Dropped trees are still being freed: the root tree holds queued
/// blocks (`extent::drop`) whose space older code would never give back.
pub const INCOMPAT_DROP_QUEUE: u64 = 4;
/// The log was written with its superblock under one barrier, so the
/// blocks (or data) it names may not all have reached the disk: replay
/// checks it whole and otherwise falls back to the previous log root.
/// Older code would replay a log that may be incomplete.
pub const INCOMPAT_LOG_CHECKED: u64 = 8;
/// File extents may be compressed (zstd or lz4, `crate::compress`); older
/// code would refuse their items. Set for good by the first one written.
pub const INCOMPAT_COMPRESSION: u64 = 16;
/// Root items may carry a subvolume's identity (uuids and transids, for
/// send and receive: `items::SubvolIdent`); older code would refuse their
/// length. Set for good by the first subvolume given one.
pub const INCOMPAT_SUBVOL_UUIDS: u64 = 32;
/// Inline file data may be compressed; older code, whose item checker
/// takes compression on regular extents only, would refuse those files.
/// Set for good by the first one written.
pub const INCOMPAT_COMPRESSED_INLINE: u64 = 64;
/// Tree blocks may have a second copy (the DUP profile): block group
/// items may name one and the superblock names the system groups' (see
/// `Superblock::system_chunks`). Older code would write one copy and let
/// the other go stale, and a later repair would bring the stale one back.
pub const INCOMPAT_DUP: u64 = 128;
/// The filesystem may span several devices: the superblock carries the
/// device table and its system array names copies by device; block
/// groups may keep copies on other devices (RAID1, RAID1C3). Older code
/// would open device 1 alone and write one copy.
pub const INCOMPAT_DEVICES: u64 = 256;
/// Files may keep no checksums of their data (`chattr +C`); older code
/// would fail their reads and report their extents as damaged. Set for
/// good by the first file or directory given the flag.
pub const INCOMPAT_NODATASUM: u64 = 512;
/// The mapped layout (see `volume`): every block group names every copy,
/// the first included, so copies lie on any devices and the logical
/// address space (`total_bytes` long) is the groups' alone; the system
/// array names every system group. Older code would read device 1 at
/// logical addresses. Needs [`INCOMPAT_DEVICES`].
pub const INCOMPAT_MAPPED: u64 = 1024;
/// The superblock names where the fsync log of the transaction after its
/// commit begins: a chain of link blocks (`format::loglink`) that log
/// writes add to without rewriting the superblock. Older code would not
/// look there and lose what was fsynced after the last commit.
pub const INCOMPAT_LOG_CHAIN: u64 = 2048;
/// Log writes on the chain may overlap: one may be sent while the
/// barriers of up to [`LOG_WRITES_IN_FLIGHT_MAX`]` - 1` before it are
/// out (`-o log_writes=2`), so the last links may have landed without the
/// blocks of those writes, and replay must try the newest
/// `LOG_WRITES_IN_FLIGHT_MAX + 1` roots of the chain. Older code tries two
/// and could drop an fsync that returned. Set with
/// [`INCOMPAT_LOG_CHAIN`], whatever the mount's setting, and needs it.
pub const INCOMPAT_LOG_OVERLAP: u64 = 4096;
/// The log may carry file data (`LOG_DATA` items): an fsync of a few
/// small writes logs their bytes rather than writing them to extents, and
/// replay writes them. Older code would drop those bytes. Set with
/// [`INCOMPAT_LOG_CHAIN`], like [`INCOMPAT_LOG_OVERLAP`].
pub const INCOMPAT_LOG_DATA: u64 = 8192;
/// The most log writes that may be out at once (see
/// [`INCOMPAT_LOG_OVERLAP`]).
pub const LOG_WRITES_IN_FLIGHT_MAX: usize = 2;
/// Incompatible features this code understands.
pub const INCOMPAT_SUPPORTED: u64 = INCOMPAT_DUP
    | INCOMPAT_LOG_CHAIN
    | INCOMPAT_LOG_OVERLAP
    | INCOMPAT_LOG_DATA
    | INCOMPAT_MAPPED
    | INCOMPAT_NODATASUM
    | INCOMPAT_DEVICES
    | INCOMPAT_MIXED_GROUPS
    | INCOMPAT_LOG_TREE
    | INCOMPAT_DROP_QUEUE
    | INCOMPAT_LOG_CHECKED
    | INCOMPAT_COMPRESSION
    | INCOMPAT_SUBVOL_UUIDS
    | INCOMPAT_COMPRESSED_INLINE;
/// Read-only-compatible features this code understands.
pub const COMPAT_RO_SUPPORTED: u64 = 0;
pub const CSUM_CRC32C: u16 = 0;

/// How many copies a kind of block group keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// One copy.
    #[default]
    Single,
    /// Two copies on the one device.
    Dup,
    /// Two copies on two devices.
    Raid1,
    /// Three copies on three devices.
    Raid1c3,
    /// Two copies, striped in 64 KiB units over pairs of devices (the
    /// mapped layout only).
    Raid10,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "dup",
            Profile::Raid1 => "raid1",
            Profile::Raid1c3 => "raid1c3",
            Profile::Raid10 => "raid10",
        }
    }

    pub fn parse(s: &str) -> Option<Profile> {
        match s.to_ascii_lowercase().as_str() {
            "single" => Some(Profile::Single),
            "dup" => Some(Profile::Dup),
            "raid1" => Some(Profile::Raid1),
            "raid1c3" => Some(Profile::Raid1c3),
            "raid10" => Some(Profile::Raid10),
            _ => None,
        }
    }

    /// Copies a group of this profile keeps.
    pub fn copies(self) -> usize {
        match self {
            Profile::Single => 1,
            Profile::Dup | Profile::Raid1 | Profile::Raid10 => 2,
            Profile::Raid1c3 => 3,
        }
    }

    /// Copies that lie on device 1 (which holds the first copy of every
    /// group): the rest lie on other devices.
    pub fn copies_on_primary(self) -> usize {
        match self {
            Profile::Dup => 2,
            _ => 1,
        }
    }

    /// Devices the profile needs.
    pub fn min_devices(self) -> usize {
        match self {
            Profile::Single | Profile::Dup => 1,
            Profile::Raid1 => 2,
            Profile::Raid1c3 => 3,
            Profile::Raid10 => 4,
        }
    }

    /// Every profile, for messages.
    pub const ALL: [Profile; 5] = [
        Profile::Single,
        Profile::Dup,
        Profile::Raid1,
        Profile::Raid1c3,
        Profile::Raid10,
    ];

    fn code(self) -> u8 {
        match self {
            Profile::Single => 0,
            Profile::Dup => 1,
            Profile::Raid1 => 2,
            Profile::Raid1c3 => 3,
            Profile::Raid10 => 4,
        }
    }

    fn from_code(c: u8) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.code() == c)
    }
}

/// A system group and where its other copies lie: the superblock carries
/// these so that the root tree and the block group tree, which live in
/// system groups, can be read from any copy before the block group
/// items (which name every group's copies) are loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemChunk {
    pub start: u64,
    pub len: u64,
    /// The first copy, in the mapped layout (None: device 1 at `start`).
    pub first: Option<Stripe>,
    pub extra: Vec<Stripe>,
}

/// One device of the filesystem, as every superblock copy names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceItem {
    pub devid: u64,
    /// Bytes of the device the filesystem uses.
    pub bytes: u64,
    /// Tells this device from another that once had its devid (one
    /// replaced, then found again).
    pub uuid: [u8; 16],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub fsid: [u8; 16],
    pub flags: u64,
    pub generation: u64,
    pub root: u64,
    pub root_generation: u64,
    pub root_level: u8,
    /// 0 when there is no log tree to replay.
    pub log_root: u64,
    pub log_root_generation: u64,
    pub log_root_level: u8,
    /// The log root the previous fsync of the same log made durable (0
    /// for none): where replay goes when `log_root` is not whole.
    pub log_prev_root: u64,
    pub log_prev_generation: u64,
    pub log_prev_level: u8,
    /// Stamped in the header flags of every block of the log, so a block
    /// that a crashed run wrote for a log of the same generation is never
    /// taken for one of this log.
    pub log_nonce: u64,
    /// Where the first link of the next transaction's log chain goes
    /// (0: that transaction's fsyncs commit instead). Its links carry
    /// `log_nonce`; see [`INCOMPAT_LOG_CHAIN`].
    pub log_chain: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub nodesize: u32,
    pub sectorsize: u32,
    pub compat: u64,
    pub compat_ro: u64,
    pub incompat: u64,
    pub label: String,
    /// Profile of new metadata and system groups (and mixed ones).
    pub metadata_profile: Profile,
    /// Profile of new data groups.
    pub data_profile: Profile,
    /// The system groups with more than one copy, at the last commit
    /// (in the mapped layout, every system group).
    pub system_chunks: Vec<SystemChunk>,
    /// The device this copy lies on (1 without [`INCOMPAT_DEVICES`]).
    pub devid: u64,
    /// The filesystem's devices, by devid; without [`INCOMPAT_DEVICES`]
    /// one, device 1, of `total_bytes` (and a zero uuid).
    pub devices: Vec<DeviceItem>,
}

impl Superblock {
    /// Names no log tree.
    pub fn clear_log(&mut self) {
        self.log_root = 0;
        self.log_root_generation = 0;
        self.log_root_level = 0;
        self.log_prev_root = 0;
        self.log_prev_generation = 0;
        self.log_prev_level = 0;
        self.log_nonce = 0;
        self.log_chain = 0;
        self.incompat &= !(INCOMPAT_LOG_TREE
            | INCOMPAT_LOG_CHECKED
            | INCOMPAT_LOG_CHAIN
            | INCOMPAT_LOG_OVERLAP
            | INCOMPAT_LOG_DATA);
    }

    /// Names the chain the next transaction's log writes begin at
    /// `first`, their blocks stamped with `nonce` (and no log tree).
    pub fn name_log_chain(&mut self, first: u64, nonce: u64) {
        self.clear_log();
        self.log_chain = first;
        self.log_nonce = nonce;
        self.incompat |= INCOMPAT_LOG_CHAIN | INCOMPAT_LOG_OVERLAP | INCOMPAT_LOG_DATA;
    }

    /// Encodes the copy that lives at `bytenr`.
    pub fn encode(&self, bytenr: u64) -> Vec<u8> {
        let mut b = vec![0u8; SUPER_BYTES];
        b[OFF_FSID..OFF_FSID + 16].copy_from_slice(&self.fsid);
        put_u64(&mut b, OFF_BYTENR, bytenr);
        put_u64(&mut b, OFF_FLAGS, self.flags);
        b[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
        put_u64(&mut b, OFF_GENERATION, self.generation);
        put_u64(&mut b, OFF_ROOT, self.root);
        put_u64(&mut b, OFF_ROOT_GENERATION, self.root_generation);
        put_u64(&mut b, OFF_LOG_ROOT, self.log_root);
        put_u64(&mut b, OFF_LOG_ROOT_GENERATION, self.log_root_generation);
        put_u64(&mut b, OFF_TOTAL_BYTES, self.total_bytes);
        put_u64(&mut b, OFF_BYTES_USED, self.bytes_used);
        put_u32(&mut b, OFF_NODESIZE, self.nodesize);
        put_u32(&mut b, OFF_SECTORSIZE, self.sectorsize);
        put_u64(&mut b, OFF_COMPAT, self.compat);
        put_u64(&mut b, OFF_COMPAT_RO, self.compat_ro);
        put_u64(&mut b, OFF_INCOMPAT, self.incompat);
        put_u16(&mut b, OFF_CSUM_TYPE, CSUM_CRC32C);
        b[OFF_ROOT_LEVEL] = self.root_level;
        b[OFF_LOG_ROOT_LEVEL] = self.log_root_level;
        put_u64(&mut b, OFF_LOG_PREV_ROOT, self.log_prev_root);
        put_u64(&mut b, OFF_LOG_PREV_GENERATION, self.log_prev_generation);
        b[OFF_LOG_PREV_LEVEL] = self.log_prev_level;
        put_u64(&mut b, OFF_LOG_NONCE, self.log_nonce);
        put_u64(&mut b, OFF_LOG_CHAIN, self.log_chain);
        put_u32(&mut b, OFF_VERSION, FORMAT_VERSION);
        b[OFF_METADATA_PROFILE] = self.metadata_profile.code();
        b[OFF_DATA_PROFILE] = self.data_profile.code();
        self.encode_system_chunks(&mut b);
        if self.has_device_table() {
            put_u64(&mut b, OFF_DEVID, self.devid);
            let devices = &self.devices[..self.devices.len().min(DEVICES_MAX)];
            put_u32(&mut b, OFF_DEVICE_COUNT, devices.len() as u32);
            for (i, d) in devices.iter().enumerate() {
                let at = OFF_DEVICE_TABLE + i * DEVICE_ITEM_BYTES;
                put_u64(&mut b, at, d.devid);
                put_u64(&mut b, at + 8, d.bytes);
                b[at + 16..at + 32].copy_from_slice(&d.uuid);
            }
        }
        let label = self.label.as_bytes();
        let n = label.len().min(LABEL_MAX);
        b[OFF_LABEL..OFF_LABEL + n].copy_from_slice(&label[..n]);
        let sum = crc(&b[OFF_FSID..]);
        put_u32(&mut b, OFF_CSUM, sum);
        b
    }

    /// Whether the superblock carries the device table (and the longer
    /// system array entries).
    pub fn has_device_table(&self) -> bool {
        self.incompat & INCOMPAT_DEVICES != 0
    }

    /// Whether every group names its first copy (the mapped layout).
    pub fn is_mapped(&self) -> bool {
        self.incompat & INCOMPAT_MAPPED != 0
    }

    /// Most system groups the array holds in this layout.
    pub fn system_chunks_max(&self) -> usize {
        match (self.is_mapped(), self.has_device_table()) {
            (true, _) => SYSTEM_CHUNKS_MAX_MAPPED,
            (false, true) => SYSTEM_CHUNKS_MAX_DEVICES,
            (false, false) => SYSTEM_CHUNKS_MAX,
        }
    }

    /// The size device `devid` has in the table.
    pub fn device_bytes(&self, devid: u64) -> Option<u64> {
        self.devices
            .iter()
            .find(|d| d.devid == devid)
            .map(|d| d.bytes)
    }

    fn encode_system_chunks(&self, b: &mut [u8]) {
        let chunks = &self.system_chunks[..self.system_chunks.len().min(self.system_chunks_max())];
        put_u32(b, OFF_SYSTEM_CHUNKS, chunks.len() as u32);
        for (i, c) in chunks.iter().enumerate() {
            if self.is_mapped() {
                let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES_MAPPED;
                put_u64(b, at, c.start);
                put_u64(b, at + 8, c.len);
                let all = c.first.iter().chain(&c.extra).take(3);
                for (j, s) in all.enumerate() {
                    put_u64(b, at + 16 + 16 * j, s.devid);
                    put_u64(b, at + 24 + 16 * j, s.offset);
                }
                continue;
            }
            if !self.has_device_table() {
                let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES;
                put_u64(b, at, c.start);
                put_u64(b, at + 8, c.len);
                put_u64(b, at + 16, c.extra.first().map_or(0, |s| s.offset));
                continue;
            }
            let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES_DEVICES;
            put_u64(b, at, c.start);
            put_u64(b, at + 8, c.len);
            for (j, s) in c.extra.iter().take(2).enumerate() {
                put_u64(b, at + 16 + 16 * j, s.devid);
                put_u64(b, at + 24 + 16 * j, s.offset);
            }
        }
    }

    /// Decodes the copy read from `bytenr`; any inconsistency is an error.
    pub fn decode(b: &[u8], bytenr: u64) -> Result<Superblock> {
        if b.len() < SUPER_BYTES || b[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
            return Err(Error::NotCanopy(format!(
                "no Canopy magic at byte {bytenr}"
            )));
        }
        let bad = |why: &str| Error::corrupt(bytenr, format!("superblock: {why}"));
        if le_u32(b, OFF_CSUM) != crc(&b[OFF_FSID..SUPER_BYTES]) {
            return Err(bad("checksum mismatch"));
        }
        if le_u64(b, OFF_BYTENR) != bytenr {
            return Err(bad("copy records another offset"));
        }
        if le_u32(b, OFF_VERSION) != FORMAT_VERSION || le_u16(b, OFF_CSUM_TYPE) != CSUM_CRC32C {
            return Err(bad("unsupported format version or checksum type"));
        }
        let mut fsid = [0u8; 16];
        fsid.copy_from_slice(&b[OFF_FSID..OFF_FSID + 16]);
        let label_bytes = &b[OFF_LABEL..OFF_LABEL + LABEL_MAX];
        let label_len = label_bytes
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(LABEL_MAX);
        let sb = Superblock {
            fsid,
            flags: le_u64(b, OFF_FLAGS),
            generation: le_u64(b, OFF_GENERATION),
            root: le_u64(b, OFF_ROOT),
            root_generation: le_u64(b, OFF_ROOT_GENERATION),
            root_level: b[OFF_ROOT_LEVEL],
            log_root: le_u64(b, OFF_LOG_ROOT),
            log_root_generation: le_u64(b, OFF_LOG_ROOT_GENERATION),
            log_root_level: b[OFF_LOG_ROOT_LEVEL],
            log_prev_root: le_u64(b, OFF_LOG_PREV_ROOT),
            log_prev_generation: le_u64(b, OFF_LOG_PREV_GENERATION),
            log_prev_level: b[OFF_LOG_PREV_LEVEL],
            log_nonce: le_u64(b, OFF_LOG_NONCE),
            log_chain: le_u64(b, OFF_LOG_CHAIN),
            total_bytes: le_u64(b, OFF_TOTAL_BYTES),
            bytes_used: le_u64(b, OFF_BYTES_USED),
            nodesize: le_u32(b, OFF_NODESIZE),
            sectorsize: le_u32(b, OFF_SECTORSIZE),
            compat: le_u64(b, OFF_COMPAT),
            compat_ro: le_u64(b, OFF_COMPAT_RO),
            incompat: le_u64(b, OFF_INCOMPAT),
            label: String::from_utf8_lossy(&label_bytes[..label_len]).into_owned(),
            metadata_profile: Profile::from_code(b[OFF_METADATA_PROFILE])
                .ok_or_else(|| bad("unknown metadata profile"))?,
            data_profile: Profile::from_code(b[OFF_DATA_PROFILE])
                .ok_or_else(|| bad("unknown data profile"))?,
            system_chunks: Vec::new(),
            devid: 1,
            devices: Vec::new(),
        };
        let mut sb = sb;
        sb.system_chunks = match sb.is_mapped() {
            true => decode_mapped_system_chunks(b),
            false => decode_system_chunks(b, sb.has_device_table()),
        }
        .map_err(|why| bad(&why))?;
        match sb.has_device_table() {
            true => {
                sb.devid = le_u64(b, OFF_DEVID);
                sb.devices = decode_devices(b).map_err(|why| bad(&why))?;
            }
            false => {
                sb.devices = vec![DeviceItem {
                    devid: 1,
                    bytes: sb.total_bytes,
                    uuid: [0; 16],
                }]
            }
        }
        sb.validate().map_err(|why| bad(&why))?;
        Ok(sb)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let ns = self.nodesize;
        if !ns.is_power_of_two() || !(super::MIN_NODESIZE..=super::MAX_NODESIZE).contains(&ns) {
            return Err(format!("nodesize {ns} out of range"));
        }
        if self.sectorsize != super::SECTORSIZE {
            return Err(format!("sectorsize {} unsupported", self.sectorsize));
        }
        if self.incompat & !INCOMPAT_SUPPORTED != 0 {
            return Err(format!(
                "unknown incompatible features {:#x}",
                self.incompat
            ));
        }
        if self.root == 0 || !self.root.is_multiple_of(u64::from(self.sectorsize)) {
            return Err(format!("root tree at bad address {}", self.root));
        }
        if self.root_level > super::node::MAX_LEVEL || self.root_generation > self.generation {
            return Err("root tree level or generation out of range".into());
        }
        if self.root >= self.total_bytes {
            return Err("root tree beyond the device end".into());
        }
        let has_log = self.log_root != 0;
        if has_log != (self.incompat & INCOMPAT_LOG_TREE != 0) {
            return Err("log tree and its feature bit disagree".into());
        }
        if has_log
            && (!self.log_root.is_multiple_of(u64::from(self.sectorsize))
                || self.log_root >= self.total_bytes
                || self.log_root_level > super::node::MAX_LEVEL
                || self.log_root_generation == 0
                || self.log_root_generation > self.generation.saturating_add(1))
        {
            return Err(format!("log tree at bad address {}", self.log_root));
        }
        let dup = self.incompat & INCOMPAT_DUP != 0;
        let uses_dup = self.metadata_profile != Profile::Single
            || self.data_profile != Profile::Single
            || self.system_chunks.iter().any(|c| !c.extra.is_empty());
        if uses_dup && !dup {
            return Err("a second copy without its feature bit".into());
        }
        let spans = [self.metadata_profile, self.data_profile]
            .iter()
            .any(|p| p.min_devices() > 1);
        if spans && !self.has_device_table() {
            return Err("a profile over several devices without the device table".into());
        }
        let striped = [self.metadata_profile, self.data_profile].contains(&Profile::Raid10);
        if striped && !self.is_mapped() {
            return Err("raid10 without the mapped layout".into());
        }
        if self.is_mapped() && !self.has_device_table() {
            return Err("the mapped layout without the device table".into());
        }
        self.validate_devices()?;
        for c in &self.system_chunks {
            self.validate_system_chunk(c)?;
        }
        let checked = self.incompat & INCOMPAT_LOG_CHECKED != 0;
        if checked && !has_log {
            return Err("a checked log without a log tree".into());
        }
        let chained = self.log_chain != 0;
        if chained != (self.incompat & INCOMPAT_LOG_CHAIN != 0) {
            return Err("log chain and its feature bit disagree".into());
        }
        if self.incompat & INCOMPAT_LOG_OVERLAP != 0 && !chained {
            return Err("overlapped log writes without a log chain".into());
        }
        if self.incompat & INCOMPAT_LOG_DATA != 0 && !chained && !has_log {
            return Err("logged file data without a log".into());
        }
        if chained
            && (has_log
                || self.log_nonce == 0
                || !self.log_chain.is_multiple_of(u64::from(self.sectorsize))
                || self.log_chain >= self.total_bytes)
        {
            return Err(format!("log chain at bad address {}", self.log_chain));
        }
        if self.log_prev_root != 0
            && (!checked
                || !self
                    .log_prev_root
                    .is_multiple_of(u64::from(self.sectorsize))
                || self.log_prev_root >= self.total_bytes
                || self.log_prev_level > super::node::MAX_LEVEL
                || self.log_prev_generation != self.log_root_generation)
        {
            return Err(format!(
                "previous log root at bad address {}",
                self.log_prev_root
            ));
        }
        Ok(())
    }
}

impl Superblock {
    /// The device table names device 1 (big enough for the logical
    /// address space) and this copy's device, each id once.
    fn validate_devices(&self) -> std::result::Result<(), String> {
        let mut ids: Vec<u64> = self.devices.iter().map(|d| d.devid).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != self.devices.len() || ids.first() == Some(&0) {
            return Err("the device table names a device twice, or device 0".into());
        }
        // In the bound layout device 1 holds the logical address space;
        // the mapped layout may have removed it.
        let small = |b: u64| !self.is_mapped() && b < self.total_bytes;
        let lacks = self.device_bytes(1).is_none() && !self.is_mapped();
        if lacks || self.device_bytes(1).is_some_and(small) {
            return Err("the device table lacks device 1 or makes it too small".into());
        }
        if self.device_bytes(self.devid).is_none() {
            return Err(format!(
                "copy of device {}, which the table lacks",
                self.devid
            ));
        }
        Ok(())
    }

    /// A system group's copies lie inside their devices, sector-aligned,
    /// on distinct devices, and (on device 1) apart from the group.
    fn validate_system_chunk(&self, c: &SystemChunk) -> std::result::Result<(), String> {
        if self.is_mapped() {
            return self.validate_mapped_system_chunk(c);
        }
        let sector = u64::from(self.sectorsize);
        let bad = || format!("system group at {} and its copies {:?}", c.start, c.extra);
        let fits = |devid: u64, at: u64| {
            at.is_multiple_of(sector)
                && self
                    .device_bytes(devid)
                    .is_some_and(|size| at.checked_add(c.len).is_some_and(|e| e <= size))
        };
        if c.len == 0 || c.extra.is_empty() || !fits(1, c.start) {
            return Err(bad());
        }
        for (i, s) in c.extra.iter().enumerate() {
            let apart = s.devid != 1
                || s.offset >= c.start.saturating_add(c.len)
                || c.start >= s.offset.saturating_add(c.len);
            let repeated = c.extra[..i].iter().any(|o| o.devid == s.devid);
            if !fits(s.devid, s.offset) || !apart || repeated {
                return Err(bad());
            }
        }
        Ok(())
    }
}

impl Superblock {
    /// A system group of the mapped layout: inside the logical address
    /// space, every copy inside its device and sector-aligned; `dup`'s two
    /// on one device apart, others on distinct devices.
    fn validate_mapped_system_chunk(&self, c: &SystemChunk) -> std::result::Result<(), String> {
        let sector = u64::from(self.sectorsize);
        let bad = || {
            format!(
                "system group at {} and its copies {:?} {:?}",
                c.start, c.first, c.extra
            )
        };
        let Some(first) = c.first else {
            return Err(bad());
        };
        let inside = c
            .start
            .checked_add(c.len)
            .is_some_and(|e| e <= self.total_bytes);
        if c.len == 0 || !c.len.is_multiple_of(sector) || !c.start.is_multiple_of(sector) || !inside
        {
            return Err(bad());
        }
        let all: Vec<Stripe> = std::iter::once(first)
            .chain(c.extra.iter().copied())
            .collect();
        for (i, s) in all.iter().enumerate() {
            let fits = s.offset.is_multiple_of(sector)
                && self
                    .device_bytes(s.devid)
                    .is_some_and(|size| s.offset.checked_add(c.len).is_some_and(|e| e <= size));
            let clash = all[..i].iter().any(|o| {
                o.devid == s.devid
                    && (all.len() != 2
                        || o.offset < s.offset.saturating_add(c.len)
                            && s.offset < o.offset.saturating_add(c.len))
            });
            if !fits || clash {
                return Err(bad());
            }
        }
        Ok(())
    }
}

/// The system array of the mapped layout.
fn decode_mapped_system_chunks(b: &[u8]) -> std::result::Result<Vec<SystemChunk>, String> {
    let n = le_u32(b, OFF_SYSTEM_CHUNKS) as usize;
    if n > SYSTEM_CHUNKS_MAX_MAPPED {
        return Err(format!(
            "{n} system groups named, at most {SYSTEM_CHUNKS_MAX_MAPPED} fit"
        ));
    }
    Ok((0..n)
        .map(|i| {
            let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES_MAPPED;
            let all: Vec<Stripe> = (0..3)
                .map(|j| Stripe {
                    devid: le_u64(b, at + 16 + 16 * j),
                    offset: le_u64(b, at + 24 + 16 * j),
                })
                .filter(|s| s.devid != 0)
                .collect();
            SystemChunk {
                start: le_u64(b, at),
                len: le_u64(b, at + 8),
                first: all.first().copied(),
                extra: all.iter().skip(1).copied().collect(),
            }
        })
        .collect())
}

fn decode_system_chunks(b: &[u8], devices: bool) -> std::result::Result<Vec<SystemChunk>, String> {
    let n = le_u32(b, OFF_SYSTEM_CHUNKS) as usize;
    let max = match devices {
        true => SYSTEM_CHUNKS_MAX_DEVICES,
        false => SYSTEM_CHUNKS_MAX,
    };
    if n > max {
        return Err(format!("{n} system groups named, at most {max} fit"));
    }
    Ok((0..n)
        .map(|i| match devices {
            false => {
                let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES;
                SystemChunk {
                    start: le_u64(b, at),
                    len: le_u64(b, at + 8),
                    first: None,
                    extra: vec![Stripe {
                        devid: 1,
                        offset: le_u64(b, at + 16),
                    }],
                }
            }
            true => {
                let at = OFF_SYSTEM_ARRAY + i * SYSTEM_CHUNK_BYTES_DEVICES;
                SystemChunk {
                    start: le_u64(b, at),
                    len: le_u64(b, at + 8),
                    first: None,
                    extra: (0..2)
                        .map(|j| Stripe {
                            devid: le_u64(b, at + 16 + 16 * j),
                            offset: le_u64(b, at + 24 + 16 * j),
                        })
                        .filter(|s| s.devid != 0)
                        .collect(),
                }
            }
        })
        .collect())
}

fn decode_devices(b: &[u8]) -> std::result::Result<Vec<DeviceItem>, String> {
    let n = le_u32(b, OFF_DEVICE_COUNT) as usize;
    if n == 0 || n > DEVICES_MAX {
        return Err(format!("{n} devices named, 1 to {DEVICES_MAX} fit"));
    }
    Ok((0..n)
        .map(|i| {
            let at = OFF_DEVICE_TABLE + i * DEVICE_ITEM_BYTES;
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&b[at + 16..at + 32]);
            DeviceItem {
                devid: le_u64(b, at),
                bytes: le_u64(b, at + 8),
                uuid,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{Device, MemDevice};

    /// What mkfs and `device add` look for is what a superblock holds.
    #[test]
    fn a_written_superblock_is_recognised_as_canopy() {
        let dev = MemDevice::new(1 << 20);
        assert_eq!(crate::dev::existing_filesystem(&dev), None);
        let sb = Superblock {
            fsid: [1; 16],
            flags: 0,
            generation: 1,
            root: 1 << 20,
            root_generation: 1,
            root_level: 0,
            log_root: 0,
            log_root_generation: 0,
            log_root_level: 0,
            log_prev_root: 0,
            log_prev_generation: 0,
            log_prev_level: 0,
            log_nonce: 0,
            log_chain: 0,
            total_bytes: 1 << 30,
            bytes_used: 0,
            nodesize: 16384,
            sectorsize: 4096,
            compat: 0,
            compat_ro: 0,
            incompat: 0,
            label: String::new(),
            metadata_profile: Profile::Single,
            data_profile: Profile::Single,
            system_chunks: Vec::new(),
            devid: 1,
            devices: Vec::new(),
        };
        let off = super::super::SUPER_OFFSETS[0];
        dev.write_at(&sb.encode(off), off).expect("write");
        assert_eq!(crate::dev::existing_filesystem(&dev), Some("Canopy"));
        a_log_chain_round_trips_and_validates(sb);
    }

    /// A commit names where the next log chain begins (issue 57: log
    /// writes no longer write the superblock): the field survives the
    /// round trip, and a chain beside a directly named log, without its
    /// bit, without a nonce or inside a sector is refused.
    fn a_log_chain_round_trips_and_validates(commit: Superblock) {
        let off = super::super::SUPER_OFFSETS[0];
        let mut chained = commit.clone();
        chained.name_log_chain(3 << 20, 77);
        let back = Superblock::decode(&chained.encode(off), off).expect("decode");
        assert_eq!(
            (back.log_chain, back.log_nonce, back.incompat),
            (chained.log_chain, chained.log_nonce, chained.incompat)
        );
        assert_eq!(back.validate(), Ok(()));
        let chained = back;
        let bad = [
            Superblock {
                log_root: 5 << 20,
                log_root_generation: 1,
                incompat: chained.incompat | INCOMPAT_LOG_TREE,
                ..chained.clone()
            },
            Superblock {
                incompat: chained.incompat & !INCOMPAT_LOG_CHAIN,
                ..chained.clone()
            },
            Superblock {
                log_chain: 0,
                incompat: chained.incompat & !INCOMPAT_LOG_CHAIN,
                ..chained.clone()
            },
            Superblock {
                log_nonce: 0,
                ..chained.clone()
            },
            Superblock {
                log_chain: (3 << 20) + 100,
                ..chained.clone()
            },
        ];
        for sb in bad {
            assert!(sb.validate().is_err(), "{sb:?}");
        }
        let mut cleared = chained;
        cleared.clear_log();
        assert_eq!(cleared.validate(), Ok(()));
    }
}
