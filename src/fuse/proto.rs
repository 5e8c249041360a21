//! The kernel's FUSE protocol as far as Canopy speaks it: opcodes, flags,
//! the sizes of the fixed parts of requests, and the byte layouts of
//! replies. Numbers and layouts come from the kernel's uapi `fuse.h`
//! (protocol 7.45); everything is native-endian, every record padded to
//! eight bytes.

/// The protocol version Canopy speaks (7.42 brought FUSE over io_uring;
/// nothing after it changes a request Canopy reads).
pub const KERNEL_MAJOR: u32 = 7;
pub const KERNEL_MINOR: u32 = 45;
/// The oldest minor version Canopy serves: `max_pages` came with 7.28
/// (Linux 4.20); the request layouts read here are older still.
pub const MIN_MINOR: u32 = 28;

/// `struct fuse_in_header`, `struct fuse_out_header`.
pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
    pub const COPY_FILE_RANGE_64: u32 = 53;
}

/// INIT flags (the low 32 bits in `flags`, the high ones in `flags2`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
}

/// `fuse_write_in.write_flags`: the writer lacks CAP_FSETID.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// A write from the kernel's page cache (writeback), not from write(2).
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

/// Notification codes (sent with unique 0, the code in `error`).
pub mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
}

/// FUSE_DEV_IOC_CLONE: `_IOR(229, 0, uint32_t)`.
pub const DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// The size of the fixed part of each request the kernel sends (the
/// struct before any names or data), as of protocol 7.41 with the flags
/// Canopy asks for: over io_uring this part arrives in its own buffer,
/// over /dev/fuse it leads the body. Requests Canopy does not decode
/// have 0.
pub fn fixed_len(opcode: u32) -> usize {
    use opcode::*;
    match opcode {
        FORGET | RENAME | LINK | OPEN | OPENDIR | INTERRUPT | ACCESS | MKDIR => 8,
        GETXATTR | LISTXATTR | BATCH_FORGET | SYNCFS => 8,
        // Without FUSE_SETXATTR_EXT the kernel sends the 8-byte form.
        SETXATTR => 8,
        GETATTR | MKNOD | RENAME2 | FSYNC | FSYNCDIR | CREATE | TMPFILE | BMAP => 16,
        RELEASE | RELEASEDIR | FLUSH | LSEEK | POLL | STATX => 24,
        IOCTL | FALLOCATE => 32,
        READ | READDIR | READDIRPLUS | WRITE => 40,
        GETLK | SETLK | SETLKW => 48,
        COPY_FILE_RANGE | COPY_FILE_RANGE_64 => 56,
        INIT => 64,
        SETATTR => 88,
        _ => 0,
    }
}

/// Appends native-endian fields to a reply.
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    pub fn with_capacity(n: usize) -> Out {
        Out(Vec::with_capacity(n))
    }

    pub fn u16(&mut self, v: u16) -> &mut Out {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Out {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Out {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Out {
        self.0.extend_from_slice(b);
        self
    }

    /// Zero bytes up to the next multiple of eight.
    pub fn pad8(&mut self) -> &mut Out {
        let n = self.0.len().next_multiple_of(8) - self.0.len();
        self.0.resize(self.0.len() + n, 0);
        self
    }

    pub fn zeros(&mut self, n: usize) -> &mut Out {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// `struct fuse_out_header` for a reply of `body_len` bytes.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + body_len) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}
