//! The btrfs send stream: the format `canopy send` writes and `canopy
//! receive` reads, byte for byte the one `btrfs send` and `btrfs receive`
//! use (versions 1 and 2), so streams cross between Canopy and kernel btrfs.
//!
//! A stream is the magic `btrfs-stream\0`, a u32 version, then commands.
//! A command is a header (u32 length of its attributes, u16 command, u32
//! crc32c of header and attributes with the crc field zero, seeded with 0
//! and not inverted, as btrfs computes it) and attributes as type-length-
//! value (u16 type, u16 length). In version 2 the data attribute is last
//! and has no length: it runs to the end of the command, so a write may
//! exceed 64 KiB.
//!
//! Nothing read is trusted: a command's declared length is capped
//! ([`MAX_COMMAND`]) before anything is allocated for it, every checksum
//! is checked, and a missing or malformed attribute is an error naming the
//! command.

mod codec;
mod decode;
mod dump;

pub use codec::{Reader, Writer};
pub use dump::dump_line;

/// The stream's first bytes.
pub const MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// Versions Canopy writes and reads.
pub const VERSIONS: [u32; 2] = [1, 2];
/// The largest command read: a version-2 write of 128 KiB of encoded data
/// and its attributes fits many times over; a declared length past it is
/// refused before anything is allocated.
pub const MAX_COMMAND: usize = 4 << 20;
/// The most data one write command carries in version 1 (its length is a
/// u16), and the most Canopy puts in one in version 2.
pub const WRITE_V1: usize = 48 << 10;
pub const WRITE_V2: usize = 1 << 20;

/// Command numbers (`enum btrfs_send_cmd`).
pub mod cmd {
    pub const SUBVOL: u16 = 1;
    pub const SNAPSHOT: u16 = 2;
    pub const MKFILE: u16 = 3;
    pub const MKDIR: u16 = 4;
    pub const MKNOD: u16 = 5;
    pub const MKFIFO: u16 = 6;
    pub const MKSOCK: u16 = 7;
    pub const SYMLINK: u16 = 8;
    pub const RENAME: u16 = 9;
    pub const LINK: u16 = 10;
    pub const UNLINK: u16 = 11;
    pub const RMDIR: u16 = 12;
    pub const SET_XATTR: u16 = 13;
    pub const REMOVE_XATTR: u16 = 14;
    pub const WRITE: u16 = 15;
    pub const CLONE: u16 = 16;
    pub const TRUNCATE: u16 = 17;
    pub const CHMOD: u16 = 18;
    pub const CHOWN: u16 = 19;
    pub const UTIMES: u16 = 20;
    pub const END: u16 = 21;
    pub const UPDATE_EXTENT: u16 = 22;
    pub const FALLOCATE: u16 = 23;
    pub const FILEATTR: u16 = 24;
    pub const ENCODED_WRITE: u16 = 25;
    pub const ENABLE_VERITY: u16 = 26;
}

/// Attribute numbers (`BTRFS_SEND_A_*`).
pub mod attr {
    pub const UUID: u16 = 1;
    pub const CTRANSID: u16 = 2;
    pub const INO: u16 = 3;
    pub const SIZE: u16 = 4;
    pub const MODE: u16 = 5;
    pub const UID: u16 = 6;
    pub const GID: u16 = 7;
    pub const RDEV: u16 = 8;
    pub const CTIME: u16 = 9;
    pub const MTIME: u16 = 10;
    pub const ATIME: u16 = 11;
    pub const OTIME: u16 = 12;
    pub const XATTR_NAME: u16 = 13;
    pub const XATTR_DATA: u16 = 14;
    pub const PATH: u16 = 15;
    pub const PATH_TO: u16 = 16;
    pub const PATH_LINK: u16 = 17;
    pub const FILE_OFFSET: u16 = 18;
    pub const DATA: u16 = 19;
    pub const CLONE_UUID: u16 = 20;
    pub const CLONE_CTRANSID: u16 = 21;
    pub const CLONE_PATH: u16 = 22;
    pub const CLONE_OFFSET: u16 = 23;
    pub const CLONE_LEN: u16 = 24;
    pub const FALLOCATE_MODE: u16 = 25;
    pub const FILEATTR: u16 = 26;
    pub const UNENCODED_FILE_LEN: u16 = 27;
    pub const UNENCODED_LEN: u16 = 28;
    pub const UNENCODED_OFFSET: u16 = 29;
    pub const COMPRESSION: u16 = 30;
    pub const ENCRYPTION: u16 = 31;
    /// The highest attribute number any version defines.
    pub const MAX: u16 = 35;
}

/// `FALLOCATE_MODE` bits, as fallocate(2) takes them.
pub const FALLOC_KEEP_SIZE: u32 = 1;
pub const FALLOC_PUNCH_HOLE: u32 = 2;

/// A time as the stream carries it: u64 seconds and u32 nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// One command, decoded. Paths are relative to the subvolume being
/// received and are bytes, as names are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Subvol {
        path: Vec<u8>,
        uuid: [u8; 16],
        ctransid: u64,
    },
    Snapshot {
        path: Vec<u8>,
        uuid: [u8; 16],
        ctransid: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
    },
    Mkfile {
        path: Vec<u8>,
        ino: u64,
    },
    Mkdir {
        path: Vec<u8>,
        ino: u64,
    },
    Mknod {
        path: Vec<u8>,
        ino: u64,
        mode: u64,
        rdev: u64,
    },
    Mkfifo {
        path: Vec<u8>,
        ino: u64,
    },
    Mksock {
        path: Vec<u8>,
        ino: u64,
    },
    Symlink {
        path: Vec<u8>,
        ino: u64,
        target: Vec<u8>,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// A new name `path` for the file at `target`.
    Link {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    Rmdir {
        path: Vec<u8>,
    },
    SetXattr {
        path: Vec<u8>,
        name: Vec<u8>,
        data: Vec<u8>,
    },
    RemoveXattr {
        path: Vec<u8>,
        name: Vec<u8>,
    },
    Write {
        path: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// Share `len` bytes at `clone_offset` of `clone_path` in the
    /// subvolume `clone_uuid` into `path` at `offset`.
    Clone {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        clone_uuid: [u8; 16],
        clone_ctransid: u64,
        clone_path: Vec<u8>,
        clone_offset: u64,
    },
    Truncate {
        path: Vec<u8>,
        size: u64,
    },
    Chmod {
        path: Vec<u8>,
        mode: u64,
    },
    Chown {
        path: Vec<u8>,
        uid: u64,
        gid: u64,
    },
    Utimes {
        path: Vec<u8>,
        atime: Time,
        mtime: Time,
        ctime: Time,
    },
    /// A range whose data changed without the receiver needing it
    /// (`--no-data` streams).
    UpdateExtent {
        path: Vec<u8>,
        offset: u64,
        size: u64,
    },
    Fallocate {
        path: Vec<u8>,
        mode: u32,
        offset: u64,
        size: u64,
    },
    Fileattr {
        path: Vec<u8>,
        attr: u64,
    },
    /// Data as it lies on disk (`btrfs send --compressed-data`).
    EncodedWrite {
        path: Vec<u8>,
        offset: u64,
        unencoded_file_len: u64,
        unencoded_len: u64,
        unencoded_offset: u64,
        compression: u32,
        encryption: u32,
        data: Vec<u8>,
    },
    End,
}

impl Command {
    /// The command's name as `btrfs receive --dump` prints it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Subvol { .. } => "subvol",
            Command::Snapshot { .. } => "snapshot",
            Command::Mkfile { .. } => "mkfile",
            Command::Mkdir { .. } => "mkdir",
            Command::Mknod { .. } => "mknod",
            Command::Mkfifo { .. } => "mkfifo",
            Command::Mksock { .. } => "mksock",
            Command::Symlink { .. } => "symlink",
            Command::Rename { .. } => "rename",
            Command::Link { .. } => "link",
            Command::Unlink { .. } => "unlink",
            Command::Rmdir { .. } => "rmdir",
            Command::SetXattr { .. } => "set_xattr",
            Command::RemoveXattr { .. } => "remove_xattr",
            Command::Write { .. } => "write",
            Command::Clone { .. } => "clone",
            Command::Truncate { .. } => "truncate",
            Command::Chmod { .. } => "chmod",
            Command::Chown { .. } => "chown",
            Command::Utimes { .. } => "utimes",
            Command::UpdateExtent { .. } => "update_extent",
            Command::Fallocate { .. } => "fallocate",
            Command::Fileattr { .. } => "fileattr",
            Command::EncodedWrite { .. } => "encoded_write",
            Command::End => "end",
        }
    }
}
