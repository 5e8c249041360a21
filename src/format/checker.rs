//! The item checker: what each item kind must satisfy beyond decoding,
//! with btrfs's tree-checker as the model.
//!
//! [`super::node::Node::decode`] already proves a block is well formed
//! (checksum, address, key order, item bounds). This module proves each
//! item *means* something the layers above can act on without harm: an
//! inode's size and mode are possible, a symlink fits in a page, a file
//! extent lies inside its data extent and inside the device, a name has a
//! legal length and the hash its key claims. Every sum of two disk values
//! is checked here, so code that has passed an item through [`check_item`]
//! may add its fields without overflow.
//!
//! The engine runs the checker on every leaf it reads from disk and logs
//! each violation once with the block address; the fs layer runs it again
//! on each item it decodes (an item can move to another leaf in memory), so
//! a bad item is EIO for the inode it belongs to and nothing else.
//! `canopy check` runs it over every leaf.

use super::inode::{extref_hash, name_hash, DirEntry, InodeItem};
use super::items::{
    decode_ref_count, BlockGroupItem, ExtentItem, FileExtentItem, RootItem, Stripe,
    COMPRESSED_INLINE_MAX, COMPRESSED_MAX, COMPRESS_LZ4, COMPRESS_NONE, COMPRESS_ZSTD,
    FILE_EXTENT_INLINE, FILE_EXTENT_REG,
};
use super::key_type::*;
use super::{Key, RESERVED_START, SECTORSIZE};

/// Largest file size: what `loff_t` can address.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Longest symlink target (PATH_MAX less its terminating NUL).
pub const MAX_SYMLINK: u64 = 4095;
/// Longest file or xattr name.
pub const MAX_NAME: usize = 255;
/// Largest xattr value Linux passes (XATTR_SIZE_MAX).
pub const MAX_XATTR_VALUE: usize = 65536;
/// Lowest and highest inode numbers a file may have.
pub const FIRST_INO: u64 = super::inode::ROOT_DIR_INO;
pub const LAST_INO: u64 = u64::MAX - 256;
/// Highest directory index (readdir position): a listing hands out the
/// next index as its offset, and a directory offset the kernel can seek
/// to must stay below 2^62 in the form that carries no bound
/// (`fuse::dircookie`). Indexes count the names ever made in a
/// directory, so a real one never comes near.
pub const MAX_DIR_INDEX: u64 = (1 << 62) - 2;

/// What items are checked against: the device they live on.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub device_size: u64,
}

type Verdict = std::result::Result<(), String>;

fn fail<T>(why: impl Into<String>) -> std::result::Result<T, String> {
    Err(why.into())
}

/// Checks one item; the error says what is wrong with it.
pub fn check_item(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    match key.ty {
        INODE_ITEM => check_inode(key, data),
        INODE_REF => check_refs(key, data, false),
        INODE_EXTREF => check_refs(key, data, true),
        DIR_ITEM => check_dir_item(key, data),
        DIR_INDEX => check_dir_index(key, data),
        XATTR_ITEM => check_xattr(key, data),
        EXTENT_DATA => check_file_extent(key, data, limits),
        ORPHAN_ITEM => check_ino(key.offset, "orphan item's inode").and(check_empty(data)),
        EXTENT_CSUM => check_csum(key, data, limits),
        ROOT_ITEM => check_root_item(key, data),
        ROOT_REF => check_root_ref(key, data, false),
        ROOT_BACKREF => check_root_ref(key, data, true),
        DEFAULT_SUBVOL => match data.try_into().map(u64::from_le_bytes) {
            Ok(id) if id == super::tree_id::FS || super::tree_id::is_subvolume(id) => Ok(()),
            _ => fail("default subvolume that is not a subvolume id"),
        },
        EXTENT_ITEM => check_extent(key, data, limits),
        DROPPED_BLOCK => check_dropped_block(key, data, limits),
        TREE_BLOCK_REF | SHARED_BLOCK_REF => check_empty(data),
        SHARED_DATA_REF => match decode_ref_count(data)? {
            0 => fail("data back-reference with count 0"),
            _ => Ok(()),
        },
        BLOCK_GROUP_ITEM => check_block_group(key, data, limits),
        FREE_EXTENT => check_empty(data),
        LOG_INODE => check_ino(key.objectid, "logged inode").and(match data {
            [0..=2] => Ok(()),
            _ => fail("log mode is not one byte of 0, 1 or 2"),
        }),
        LOG_RANGE => match data.try_into().map(u64::from_le_bytes) {
            Ok(end) if end > key.offset => check_ino(key.objectid, "logged range's inode"),
            _ => fail("logged range that does not end after its start"),
        },
        LOG_DATA => check_ino(key.objectid, "logged data's inode").and(check_log_data(key, data)),
        BALANCE_ITEM if key.objectid == super::BALANCE_OBJECTID && key.offset == 0 => {
            super::balance::BalanceArgs::decode(data).map(drop)
        }
        BALANCE_GROUP if key.objectid == super::BALANCE_OBJECTID => check_empty(data),
        BALANCE_ITEM | BALANCE_GROUP => fail("balance item outside the balance's key range"),
        DEV_REPLACE if key.objectid == super::DEV_REPLACE_OBJECTID && key.offset == 0 => {
            super::items::DevReplaceItem::decode(data).map(drop)
        }
        DEV_REPLACE => fail("device replace item outside its key"),
        DEVICE_STATS
            if key.objectid == super::DEVICE_STATS_OBJECTID
                && (1..=super::superblock::DEVICES_MAX as u64).contains(&key.offset) =>
        {
            super::items::DeviceStats::decode(data).map(drop)
        }
        DEVICE_STATS => fail("device stats outside their key range (devids 1 to 16)"),
        QGROUP_STATUS | QGROUP_INFO | QGROUP_LIMIT | QGROUP_RELATION => {
            super::qgroup::check(key, data)
        }
        // Kinds this version does not write (log items) are
        // checked by the code that will read them.
        _ => Ok(()),
    }
}

/// Logged file bytes: some, within one chunk of the file (which also
/// keeps them below the largest file size).
fn check_log_data(key: &Key, data: &[u8]) -> Verdict {
    let chunk = super::LOG_DATA_CHUNK;
    let room = chunk - key.offset % chunk;
    if data.is_empty() || data.len() as u64 > room {
        return fail(format!(
            "logged data of {} bytes at offset {} (1 to {room} fit its chunk)",
            data.len(),
            key.offset
        ));
    }
    if key.offset.saturating_add(data.len() as u64) > MAX_FILE_SIZE {
        return fail("logged data past the largest file size");
    }
    Ok(())
}

/// `(tree id, ROOT_ITEM, 0)`: the format writes no other offset, and a
/// second item for one tree would be a second root for it.
fn check_root_item(key: &Key, data: &[u8]) -> Verdict {
    if key.offset != 0 {
        return fail(format!(
            "root item of tree {} with key offset {} (the format writes 0)",
            key.objectid, key.offset
        ));
    }
    RootItem::decode(data).map(drop)
}

fn check_dropped_block(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    if key.objectid != super::DROP_QUEUE_OBJECTID {
        return fail("dropped block outside the drop queue");
    }
    check_device_range(
        key.offset,
        u64::from(super::MIN_NODESIZE),
        limits,
        "dropped block",
    )?;
    super::items::DroppedBlock::decode(data).map(drop)
}

fn check_empty(data: &[u8]) -> Verdict {
    match data.len() {
        0 => Ok(()),
        n => fail(format!("item of {n} bytes where none are expected")),
    }
}

fn check_ino(ino: u64, what: &str) -> Verdict {
    if (FIRST_INO..=LAST_INO).contains(&ino) {
        Ok(())
    } else {
        fail(format!("{what} {ino} is outside {FIRST_INO}..={LAST_INO}"))
    }
}

/// A range of the device that data or checksums may describe.
fn check_device_range(start: u64, len: u64, limits: &Limits, what: &str) -> Verdict {
    let end = start
        .checked_add(len)
        .ok_or_else(|| format!("{what} {start}+{len} overflows"))?;
    if start < RESERVED_START || end > limits.device_size {
        return fail(format!(
            "{what} {start}..{end} is outside the device (1 MiB..{})",
            limits.device_size
        ));
    }
    if !start.is_multiple_of(u64::from(SECTORSIZE)) {
        return fail(format!("{what} at {start} is not sector-aligned"));
    }
    Ok(())
}

fn check_inode(key: &Key, data: &[u8]) -> Verdict {
    check_ino(key.objectid, "inode number")?;
    if key.offset != 0 {
        return fail(format!("inode item with key offset {}", key.offset));
    }
    let i = InodeItem::decode(data)?;
    check_inode_fields(&i)
}

/// Field rules of an inode, also used by code that holds a decoded inode.
pub fn check_inode_fields(i: &InodeItem) -> Verdict {
    let ty = i.mode & libc::S_IFMT;
    let known = [
        libc::S_IFREG,
        libc::S_IFDIR,
        libc::S_IFLNK,
        libc::S_IFCHR,
        libc::S_IFBLK,
        libc::S_IFIFO,
        libc::S_IFSOCK,
    ];
    if !known.contains(&ty) {
        return fail(format!("inode mode {:o} has no known file type", i.mode));
    }
    if i.mode & !(libc::S_IFMT | 0o7777) != 0 {
        return fail(format!("inode mode {:o} has unknown bits", i.mode));
    }
    if i.size > MAX_FILE_SIZE {
        return fail(format!("inode size {} is past the largest file", i.size));
    }
    if ty == libc::S_IFLNK && !(1..=MAX_SYMLINK).contains(&i.size) {
        return fail(format!("symlink of {} bytes (1..=4095 allowed)", i.size));
    }
    // A directory has its name and its "." (0 links: removed while open,
    // an orphan waiting for its last close).
    if ty == libc::S_IFDIR && i.nlink == 1 {
        return fail("directory with 1 link (0 when orphaned, else at least 2)");
    }
    if i.atime.nsec >= 1_000_000_000
        || i.mtime.nsec >= 1_000_000_000
        || i.ctime.nsec >= 1_000_000_000
        || i.otime.nsec >= 1_000_000_000
    {
        return fail("inode time with 10^9 nanoseconds or more");
    }
    Ok(())
}

/// A file or xattr name: 1..=255 bytes.
fn check_name_len(name: &[u8], what: &str) -> Verdict {
    if name.is_empty() || name.len() > MAX_NAME {
        return fail(format!("{what} of {} bytes", name.len()));
    }
    Ok(())
}

/// A directory entry's name: a legal length, and no '/' or NUL; "." and
/// ".." are never stored.
fn check_entry_name(name: &[u8]) -> Verdict {
    check_name_len(name, "name")?;
    if name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".." {
        return fail(format!("name {:?} is not a legal file name", show(name)));
    }
    Ok(())
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(&name[..name.len().min(64)]).into_owned()
}

/// `d_type` values an entry may carry; an entry naming a subvolume is a
/// directory whose inode field is a subvolume id.
fn check_entry(e: &DirEntry) -> Verdict {
    check_entry_name(&e.name)?;
    check_index(e.index)?;
    if e.is_subvolume() {
        return check_subvolume_entry(e);
    }
    check_ino(e.ino, "entry's inode")?;
    const DT: [u8; 7] = [1, 2, 4, 6, 8, 10, 12];
    if !DT.contains(&e.kind) {
        return fail(format!(
            "entry {:?} has file type {}",
            show(&e.name),
            e.kind
        ));
    }
    Ok(())
}

/// An index a listing can hand out and resume from.
fn check_index(index: u64) -> Verdict {
    if index > MAX_DIR_INDEX {
        return fail(format!(
            "directory index {index} is past the last one ({MAX_DIR_INDEX})"
        ));
    }
    Ok(())
}

fn check_subvolume_entry(e: &DirEntry) -> Verdict {
    if e.d_type() != 4 {
        return fail(format!(
            "subvolume entry {:?} is not a directory",
            show(&e.name)
        ));
    }
    if !super::tree_id::is_subvolume(e.ino) {
        return fail(format!(
            "entry {:?} names subvolume {}, not a subvolume id",
            show(&e.name),
            e.ino
        ));
    }
    Ok(())
}

/// ROOT_REF / ROOT_BACKREF: between two subvolumes (or the default tree
/// and one), carrying one subvolume entry in a directory.
fn check_root_ref(key: &Key, data: &[u8], back: bool) -> Verdict {
    let (child, parent) = if back {
        (key.objectid, key.offset)
    } else {
        (key.offset, key.objectid)
    };
    let is_tree = |id| id == super::tree_id::FS || super::tree_id::is_subvolume(id);
    if !super::tree_id::is_subvolume(child) || !is_tree(parent) || child == parent {
        return fail(format!("root reference from {parent} to {child}"));
    }
    match DirEntry::decode_all(data)?.as_slice() {
        [e] => {
            check_entry_name(&e.name)?;
            check_ino(e.ino, "subvolume's directory")
        }
        _ => fail("root reference without exactly one entry"),
    }
}

fn check_refs(key: &Key, data: &[u8], extended: bool) -> Verdict {
    check_ino(key.objectid, "inode number")?;
    let refs = DirEntry::decode_all(data)?;
    if refs.is_empty() {
        return fail("inode back-reference item with no names");
    }
    for r in &refs {
        check_entry_name(&r.name)?;
        // Each name carries its directory in the entry's inode field; a
        // plain ref is keyed by that directory, an extended one by a hash.
        check_ino(r.ino, "parent directory")?;
        check_index(r.index)?;
        let keyed = if extended {
            extref_hash(r.ino, &r.name)
        } else {
            r.ino
        };
        if keyed != key.offset {
            return fail(format!("name {:?} under the wrong key", show(&r.name)));
        }
    }
    Ok(())
}

fn check_dir_item(key: &Key, data: &[u8]) -> Verdict {
    check_ino(key.objectid, "directory number")?;
    let entries = DirEntry::decode_all(data)?;
    if entries.is_empty() {
        return fail("directory item with no entries");
    }
    for e in &entries {
        check_entry(e)?;
        if name_hash(&e.name) != key.offset {
            return fail(format!("entry {:?} under the wrong hash", show(&e.name)));
        }
    }
    Ok(())
}

fn check_dir_index(key: &Key, data: &[u8]) -> Verdict {
    check_ino(key.objectid, "directory number")?;
    let entries = DirEntry::decode_all(data)?;
    let [e] = entries.as_slice() else {
        return fail(format!("directory index with {} entries", entries.len()));
    };
    check_entry(e)?;
    if e.index != key.offset || key.offset < 2 || key.offset > MAX_DIR_INDEX {
        return fail(format!(
            "directory index {} names index {}",
            key.offset, e.index
        ));
    }
    Ok(())
}

/// Xattr items: `(name len u16, value len u32, name, value)` repeated.
fn check_xattr(key: &Key, mut data: &[u8]) -> Verdict {
    check_ino(key.objectid, "inode number")?;
    if data.is_empty() {
        return fail("xattr item with no attributes");
    }
    while !data.is_empty() {
        if data.len() < 6 {
            return fail("truncated xattr");
        }
        let nl = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let vl = u32::from_le_bytes([data[2], data[3], data[4], data[5]]) as usize;
        let Some(rest) = data.get(6..).filter(|r| r.len() >= nl.saturating_add(vl)) else {
            return fail("xattr past its item");
        };
        let name = &rest[..nl];
        check_name_len(name, "xattr name")?;
        if vl > MAX_XATTR_VALUE {
            return fail(format!("xattr value of {vl} bytes"));
        }
        if name_hash(name) != key.offset {
            return fail(format!("xattr {:?} under the wrong hash", show(name)));
        }
        data = &rest[nl + vl..];
    }
    Ok(())
}

/// A compressed extent: a known codec, at most a chunk decoded (a sector
/// inline) and no larger on disk than decoded (a plain write would have
/// been smaller).
fn check_compressed(fe: &FileExtentItem) -> Verdict {
    if fe.compression != COMPRESS_ZSTD && fe.compression != COMPRESS_LZ4 {
        return fail(format!("compression type {} unknown", fe.compression));
    }
    let (chunk, stored) = match fe.kind {
        FILE_EXTENT_REG => (COMPRESSED_MAX, fe.disk_num_bytes),
        FILE_EXTENT_INLINE => (COMPRESSED_INLINE_MAX, fe.inline_data.len() as u64),
        kind => return fail(format!("compressed file extent of type {kind}")),
    };
    if fe.ram_bytes == 0 || fe.ram_bytes > chunk || stored > fe.ram_bytes {
        return fail(format!(
            "compressed extent of {stored} bytes stored says it decodes to {} (at most {chunk})",
            fe.ram_bytes
        ));
    }
    Ok(())
}

fn check_file_extent(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    check_ino(key.objectid, "inode number")?;
    let fe = FileExtentItem::decode(data)?;
    if fe.compression != COMPRESS_NONE {
        check_compressed(&fe)?;
    }
    let len = if fe.kind == FILE_EXTENT_INLINE {
        let plain = fe.compression == COMPRESS_NONE;
        if fe.inline_data.is_empty() || (plain && fe.ram_bytes != fe.inline_data.len() as u64) {
            return fail(format!(
                "inline extent of {} bytes says {}",
                fe.inline_data.len(),
                fe.ram_bytes
            ));
        }
        fe.ram_bytes
    } else {
        if fe.num_bytes == 0 || !fe.num_bytes.is_multiple_of(u64::from(SECTORSIZE)) {
            return fail(format!("file extent of {} bytes", fe.num_bytes));
        }
        // Extents sit on sector boundaries of the file (only inline data
        // may end between them); a truncate or punch would cut one into
        // pieces that are not whole sectors.
        if !key.offset.is_multiple_of(u64::from(SECTORSIZE)) {
            return fail(format!(
                "file extent at unaligned file offset {}",
                key.offset
            ));
        }
        if fe.disk_bytenr != 0 {
            check_device_range(fe.disk_bytenr, fe.disk_num_bytes, limits, "data extent")?;
            if !fe.disk_num_bytes.is_multiple_of(u64::from(SECTORSIZE)) {
                return fail(format!("data extent of {} bytes", fe.disk_num_bytes));
            }
            let used_end = fe.offset.checked_add(fe.num_bytes);
            let plain = fe.compression == COMPRESS_NONE;
            let decoded = if plain {
                fe.disk_num_bytes
            } else {
                fe.ram_bytes
            };
            if used_end.is_none_or(|e| e > decoded) || (plain && fe.ram_bytes != fe.disk_num_bytes)
            {
                return fail(format!(
                    "file extent uses {}+{} of a {}-byte extent",
                    fe.offset, fe.num_bytes, fe.disk_num_bytes
                ));
            }
        }
        fe.num_bytes
    };
    // The extent holding the last byte a file may have ends at 2^63: its
    // length is whole sectors.
    let limit = MAX_FILE_SIZE.next_multiple_of(SECTORSIZE as u64);
    if key.offset.checked_add(len).is_none_or(|e| e > limit) {
        return fail(format!(
            "file extent {}+{len} is past the largest file",
            key.offset
        ));
    }
    Ok(())
}

fn check_csum(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    if data.is_empty() || !data.len().is_multiple_of(4) {
        return fail(format!("checksum item of {} bytes", data.len()));
    }
    let covered = (data.len() / 4) as u64 * u64::from(SECTORSIZE);
    check_device_range(key.offset, covered, limits, "checksummed range")
}

fn check_extent(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    ExtentItem::decode(data)?;
    if key.offset == 0 {
        return fail("extent of 0 bytes");
    }
    check_device_range(key.objectid, key.offset, limits, "extent")
}

fn check_block_group(key: &Key, data: &[u8], limits: &Limits) -> Verdict {
    let bg = BlockGroupItem::decode(data)?;
    check_device_range(key.objectid, key.offset, limits, "block group")?;
    if key.offset == 0 || !key.offset.is_multiple_of(u64::from(SECTORSIZE)) {
        return fail(format!(
            "block group of {} bytes, not a whole number of sectors",
            key.offset
        ));
    }
    if bg.used > key.offset {
        return fail(format!(
            "block group of {} bytes with {} used",
            key.offset, bg.used
        ));
    }
    if let Some(first) = bg.first {
        return check_listed_copies(key, first, &bg.extra, bg.striped);
    }
    for s in &bg.extra {
        let what = format!("copy of block group {} on device {}", key.objectid, s.devid);
        // Other devices' sizes are the allocator's to check, at load.
        let range_limits = match s.devid {
            1 => *limits,
            _ => Limits {
                device_size: u64::MAX,
            },
        };
        check_device_range(s.offset, key.offset, &range_limits, &what)?;
        if s.devid == 1
            && s.offset < key.objectid.saturating_add(key.offset)
            && key.objectid < s.offset.saturating_add(key.offset)
        {
            return fail(format!(
                "block group {} and its second copy at {} overlap",
                key.objectid, s.offset
            ));
        }
    }
    Ok(())
}

/// The copies of a group of the mapped layout: each sector-aligned past
/// the reserved start (devices' sizes are the allocator's to check, at
/// load), none overlapping another on the same device; a striped group's
/// length a whole number of units on each pair of devices.
fn check_listed_copies(key: &Key, first: Stripe, extra: &[Stripe], striped: bool) -> Verdict {
    let any_size = Limits {
        device_size: u64::MAX,
    };
    let all: Vec<Stripe> = std::iter::once(first)
        .chain(extra.iter().copied())
        .collect();
    let pairs = (all.len() / 2) as u64;
    let unit = crate::volume::STRIPE_UNIT;
    let len = match striped {
        true if pairs > 0 && key.offset.is_multiple_of(pairs * unit) => key.offset / pairs,
        true => {
            return fail(format!(
            "raid10 block group {} of {} bytes is not a whole number of units on its {} devices",
            key.objectid,
            key.offset,
            all.len()
        ))
        }
        false => key.offset,
    };
    for (i, s) in all.iter().enumerate() {
        let what = format!("copy of block group {} on device {}", key.objectid, s.devid);
        check_device_range(s.offset, len, &any_size, &what)?;
        let clash = all[..i].iter().any(|o| {
            o.devid == s.devid
                && o.offset < s.offset.saturating_add(len)
                && s.offset < o.offset.saturating_add(len)
        });
        if clash {
            return fail(format!(
                "copies of block group {} overlap on device {}",
                key.objectid, s.devid
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::inode::Timespec;

    const LIM: Limits = Limits {
        device_size: 1 << 30,
    };

    fn inode(mode: u32, size: u64, nlink: u32) -> Vec<u8> {
        InodeItem {
            mode,
            size,
            nlink,
            atime: Timespec::default(),
            ..Default::default()
        }
        .encode()
    }

    #[test]
    fn inodes_must_be_possible() {
        let k = Key::new(300, INODE_ITEM, 0);
        assert!(check_item(&k, &inode(libc::S_IFREG | 0o644, 10, 1), &LIM).is_ok());
        assert!(check_item(&k, &inode(libc::S_IFLNK | 0o777, 1 << 61, 1), &LIM).is_err());
        assert!(check_item(&k, &inode(libc::S_IFLNK | 0o777, 0, 1), &LIM).is_err());
        assert!(check_item(&k, &inode(0o644, 1, 1), &LIM).is_err());
        assert!(check_item(&k, &inode(libc::S_IFDIR | 0o755, 0, 1), &LIM).is_err());
        assert!(check_item(&k, &inode(libc::S_IFDIR | 0o755, 0, 0), &LIM).is_ok());
        assert!(check_item(&k, &inode(libc::S_IFREG, u64::MAX, 1), &LIM).is_err());
        let far = Key::new(u64::MAX - 10, INODE_ITEM, 0);
        assert!(check_item(&far, &inode(libc::S_IFREG, 0, 1), &LIM).is_err());
    }

    fn reg(disk: u64, disk_len: u64, offset: u64, len: u64) -> Vec<u8> {
        FileExtentItem {
            generation: 1,
            ram_bytes: disk_len,
            compression: COMPRESS_NONE,
            kind: crate::format::items::FILE_EXTENT_REG,
            disk_bytenr: disk,
            disk_num_bytes: disk_len,
            offset,
            num_bytes: len,
            inline_data: Vec::new(),
        }
        .encode()
    }

    #[test]
    fn file_extents_stay_inside_their_extent_and_the_device() {
        let k = Key::new(300, EXTENT_DATA, 0);
        assert!(check_item(&k, &reg(2 << 20, 8192, 4096, 4096), &LIM).is_ok());
        assert!(check_item(&k, &reg(2 << 20, 8192, 4096, 8192), &LIM).is_err());
        assert!(check_item(&k, &reg(u64::MAX - 4095, 8192, 0, 4096), &LIM).is_err());
        assert!(check_item(&k, &reg(LIM.device_size, 4096, 0, 4096), &LIM).is_err());
        assert!(check_item(&k, &reg(2 << 20, 8192, u64::MAX - 4095, 8192), &LIM).is_err());
        let far = Key::new(300, EXTENT_DATA, u64::MAX - 4096);
        assert!(check_item(&far, &reg(2 << 20, 8192, 0, 8192), &LIM).is_err());
        // A hole (no disk extent) is fine anywhere inside the file.
        assert!(check_item(&k, &reg(0, 0, 0, 1 << 20), &LIM).is_ok());
        // But on a sector boundary, like every extent.
        let unaligned = Key::new(300, EXTENT_DATA, 4097);
        assert!(check_item(&unaligned, &reg(2 << 20, 8192, 0, 4096), &LIM).is_err());
    }

    #[test]
    fn names_are_checked_against_their_hash_and_length() {
        let e = |name: &[u8]| {
            DirEntry::encode_all(&[DirEntry {
                ino: 300,
                kind: 8,
                index: 5,
                name: name.to_vec(),
            }])
        };
        let k = Key::new(256, DIR_ITEM, name_hash(b"a"));
        assert!(check_item(&k, &e(b"a"), &LIM).is_ok());
        assert!(check_item(&k, &e(b"b"), &LIM).is_err());
        assert!(check_item(&Key::new(256, DIR_INDEX, 5), &e(b"a/b"), &LIM).is_err());
        assert!(check_item(&Key::new(256, DIR_INDEX, 6), &e(b"ab"), &LIM).is_err());
        assert!(check_item(&Key::new(256, DIR_INDEX, 5), &e(&[b'x'; 256]), &LIM).is_err());
    }

    /// An index a listing cannot resume after would be listed again and
    /// again (the cookie of the next one saturates).
    #[test]
    fn directory_indexes_stay_below_what_a_listing_can_resume_from() {
        let at = |index: u64| {
            DirEntry::encode_all(&[DirEntry {
                ino: 300,
                kind: 8,
                index,
                name: b"a".to_vec(),
            }])
        };
        let idx = |i| Key::new(256, DIR_INDEX, i);
        assert!(check_item(&idx(MAX_DIR_INDEX), &at(MAX_DIR_INDEX), &LIM).is_ok());
        for bad in [MAX_DIR_INDEX + 1, (1 << 62) - 1, u64::MAX] {
            assert!(check_item(&idx(bad), &at(bad), &LIM).is_err(), "{bad}");
            let by_name = Key::new(256, DIR_ITEM, name_hash(b"a"));
            assert!(check_item(&by_name, &at(bad), &LIM).is_err(), "{bad}");
            let back = Key::new(300, INODE_REF, 300);
            assert!(check_item(&back, &at(bad), &LIM).is_err(), "{bad}");
        }
    }

    #[test]
    fn root_items_are_keyed_at_offset_zero() {
        let item = RootItem {
            bytenr: 1 << 20,
            generation: 3,
            level: 0,
            last_snapshot: 0,
            parent_id: 0,
            flags: 0,
            created: 1,
            name: Vec::new(),
            ident: None,
        }
        .encode();
        assert!(check_item(&Key::new(256, ROOT_ITEM, 0), &item, &LIM).is_ok());
        let moved = Key::new(256, ROOT_ITEM, u64::MAX - 4095);
        assert!(check_item(&moved, &item, &LIM).is_err());
    }
}
