//! Layouts of the POSIX items of fs trees: inodes, directory entries and
//! inode back-references.

use super::{le_u16, le_u32, le_u64, put_u16, put_u32, put_u64};

type DecodeResult<T> = std::result::Result<T, String>;

/// The inode number of a subvolume's root directory.
pub const ROOT_DIR_INO: u64 = 256;

/// A timestamp: seconds and nanoseconds since the epoch (ordered by
/// seconds, then nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Timespec::default(),
        }
    }
}

/// `(ino, INODE_ITEM, 0)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeItem {
    pub size: u64,
    /// Bytes of data extents and inline data the file holds.
    pub nbytes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    pub rdev: u64,
    pub flags: u64,
    /// Transaction that last changed the inode.
    pub transid: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Birth time.
    pub otime: Timespec,
}

pub const INODE_ITEM_SIZE: usize = 104;

/// Inode flags of `chattr +C` (btrfs's bits): the file's data keeps no
/// checksums (NODATASUM), and writes over data only this file holds go
/// where the data lies instead of to a new extent (NODATACOW). Set
/// together on a file while it is empty, or on a directory, whose new
/// files and directories inherit them.
pub const INODE_NODATASUM: u64 = 1 << 0;
pub const INODE_NODATACOW: u64 = 1 << 1;
/// Inode flag: writeback found the file's data does not compress and stops
/// trying (`compress-force` and setting the compression property undo it).
pub const INODE_NOCOMPRESS: u64 = 1 << 3;
/// Inode flags `chattr` sets (the bits btrfs gives them): writes are
/// synchronous (`S`); nothing may change the file (`i`); data may only be
/// appended (`a`); dump(8) skips it (`d`); reads leave atime (`A`).
pub const INODE_SYNC: u64 = 1 << 5;
pub const INODE_IMMUTABLE: u64 = 1 << 6;
pub const INODE_APPEND: u64 = 1 << 7;
pub const INODE_NODUMP: u64 = 1 << 8;
pub const INODE_NOATIME: u64 = 1 << 9;

fn put_time(b: &mut [u8], at: usize, t: Timespec) {
    put_u64(b, at, t.sec as u64);
    put_u32(b, at + 8, t.nsec);
}

fn time(b: &[u8], at: usize) -> Timespec {
    Timespec {
        sec: le_u64(b, at) as i64,
        nsec: le_u32(b, at + 8),
    }
}

impl InodeItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_ITEM_SIZE];
        put_u64(&mut b, 0, self.size);
        put_u64(&mut b, 8, self.nbytes);
        put_u32(&mut b, 16, self.nlink);
        put_u32(&mut b, 20, self.uid);
        put_u32(&mut b, 24, self.gid);
        put_u32(&mut b, 28, self.mode);
        put_u64(&mut b, 32, self.rdev);
        put_u64(&mut b, 40, self.flags);
        put_u64(&mut b, 48, self.transid);
        put_time(&mut b, 56, self.atime);
        put_time(&mut b, 68, self.mtime);
        put_time(&mut b, 80, self.ctime);
        put_time(&mut b, 92, self.otime);
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<InodeItem> {
        if b.len() != INODE_ITEM_SIZE {
            return Err(format!("inode item of {} bytes", b.len()));
        }
        Ok(InodeItem {
            size: le_u64(b, 0),
            nbytes: le_u64(b, 8),
            nlink: le_u32(b, 16),
            uid: le_u32(b, 20),
            gid: le_u32(b, 24),
            mode: le_u32(b, 28),
            rdev: le_u64(b, 32),
            flags: le_u64(b, 40),
            transid: le_u64(b, 48),
            atime: time(b, 56),
            mtime: time(b, 68),
            ctime: time(b, 80),
            otime: time(b, 92),
        })
    }
}

/// One directory entry: in a DIR_ITEM (several on a hash collision) and,
/// alone, in a DIR_INDEX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// File type as in `d_type` (DT_REG = 8, DT_DIR = 4, ...).
    pub kind: u8,
    /// The DIR_INDEX offset of this entry (its readdir position).
    pub index: u64,
    pub name: Vec<u8>,
}

const DIR_ENTRY_FIXED: usize = 19;

/// Flag of an entry's `kind` naming a subvolume: its inode field is then
/// the subvolume's tree id, and the directory it shows is that tree's
/// root directory (`DT_DIR | SUBVOL_ENTRY`).
pub const SUBVOL_ENTRY: u8 = 0x80;

impl DirEntry {
    /// Whether the entry names another subvolume, not an inode.
    pub fn is_subvolume(&self) -> bool {
        self.kind & SUBVOL_ENTRY != 0
    }

    /// `d_type` as readdir reports it.
    pub fn d_type(&self) -> u8 {
        self.kind & !SUBVOL_ENTRY
    }
}

impl DirEntry {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; DIR_ENTRY_FIXED];
        put_u64(&mut b, 0, self.ino);
        b[8] = self.kind;
        put_u64(&mut b, 9, self.index);
        put_u16(&mut b, 17, self.name.len() as u16);
        out.extend_from_slice(&b);
        out.extend_from_slice(&self.name);
    }

    /// Decodes a sequence of entries (a DIR_ITEM or DIR_INDEX payload).
    pub fn decode_all(mut b: &[u8]) -> DecodeResult<Vec<DirEntry>> {
        let mut out = Vec::new();
        while !b.is_empty() {
            if b.len() < DIR_ENTRY_FIXED {
                return Err("truncated directory entry".into());
            }
            let n = usize::from(le_u16(b, 17));
            if b.len() < DIR_ENTRY_FIXED + n {
                return Err("directory entry name past the item".into());
            }
            out.push(DirEntry {
                ino: le_u64(b, 0),
                kind: b[8],
                index: le_u64(b, 9),
                name: b[DIR_ENTRY_FIXED..DIR_ENTRY_FIXED + n].to_vec(),
            });
            b = &b[DIR_ENTRY_FIXED + n..];
        }
        Ok(out)
    }

    pub fn encode_all(entries: &[DirEntry]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            e.encode_into(&mut out);
        }
        out
    }
}

/// Name hash of DIR_ITEM keys: crc32c of the name (collisions share an item).
pub fn name_hash(name: &[u8]) -> u64 {
    u64::from(super::crc(name))
}

/// Offset of INODE_EXTREF keys: crc32c of the directory's number in the
/// high half, crc32c of the name in the low half (collisions share an item).
pub fn extref_hash(dir: u64, name: &[u8]) -> u64 {
    (u64::from(super::crc(&dir.to_le_bytes())) << 32) | u64::from(super::crc(name))
}
