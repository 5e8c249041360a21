//! Encoding replies. A reply is nothing (FORGET), an errno, or a body
//! the transport sends after the out header; the encoders here lay the
//! kernel's structs out field by field (`proto::Out`).

use super::proto::Out;
use std::time::Duration;

/// What a request is answered with.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// FORGET and BATCH_FORGET take no reply.
    Nothing,
    /// A positive errno.
    Error(i32),
    Data(Vec<u8>),
    /// A body of this many bytes already written into the buffer the
    /// transport lent ([`super::session::Handler::handle_into`]).
    Placed(usize),
}

impl Reply {
    pub fn empty() -> Reply {
        Reply::Data(Vec::new())
    }
}

/// `struct fuse_attr`, in the units the kernel wants.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// (seconds, nanoseconds) since the epoch.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

fn attr(o: &mut Out, a: &FileAttr) {
    o.u64(a.ino).u64(a.size).u64(a.blocks);
    o.u64(a.atime.0 as u64)
        .u64(a.mtime.0 as u64)
        .u64(a.ctime.0 as u64);
    o.u32(a.atime.1).u32(a.mtime.1).u32(a.ctime.1);
    o.u32(a.mode).u32(a.nlink).u32(a.uid).u32(a.gid).u32(a.rdev);
    o.u32(a.blksize).u32(0);
}

/// `struct fuse_entry_out`: a node id 0 is a negative entry, cached for
/// `ttl` like a positive one.
fn entry_out(o: &mut Out, a: &FileAttr, generation: u64, ttl: Duration) {
    let (s, ns) = (ttl.as_secs(), ttl.subsec_nanos());
    o.u64(a.ino).u64(generation).u64(s).u64(s).u32(ns).u32(ns);
    attr(o, a);
}

pub fn entry(a: &FileAttr, generation: u64, ttl: Duration) -> Reply {
    let mut o = Out::with_capacity(128);
    entry_out(&mut o, a, generation, ttl);
    Reply::Data(o.0)
}

pub fn attr_reply(a: &FileAttr, ttl: Duration) -> Reply {
    let mut o = Out::with_capacity(104);
    o.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
    attr(&mut o, a);
    Reply::Data(o.0)
}

fn open_out(o: &mut Out, fh: u64, flags: u32) {
    o.u64(fh).u32(flags).u32(0);
}

pub fn open(fh: u64, flags: u32) -> Reply {
    let mut o = Out::with_capacity(16);
    open_out(&mut o, fh, flags);
    Reply::Data(o.0)
}

pub fn create(a: &FileAttr, generation: u64, ttl: Duration, fh: u64, flags: u32) -> Reply {
    let mut o = Out::with_capacity(144);
    entry_out(&mut o, a, generation, ttl);
    open_out(&mut o, fh, flags);
    Reply::Data(o.0)
}

/// `struct fuse_write_out`.
pub fn written(n: u32) -> Reply {
    let mut o = Out::with_capacity(8);
    o.u32(n).u32(0);
    Reply::Data(o.0)
}

/// `struct fuse_copy_file_range_out` (COPY_FILE_RANGE_64).
pub fn copied(n: u64) -> Reply {
    Reply::Data(n.to_ne_bytes().to_vec())
}

/// `struct fuse_getxattr_out`: the size a value or list needs.
pub fn xattr_size(n: u32) -> Reply {
    written(n)
}

pub fn lseek(offset: u64) -> Reply {
    Reply::Data(offset.to_ne_bytes().to_vec())
}

/// `struct fuse_statfs_out`.
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

pub fn statfs(s: &Statfs) -> Reply {
    let mut o = Out::with_capacity(80);
    o.u64(s.blocks)
        .u64(s.bfree)
        .u64(s.bavail)
        .u64(s.files)
        .u64(s.ffree);
    o.u32(s.bsize).u32(s.namelen).u32(s.frsize).u32(0).zeros(24);
    Reply::Data(o.0)
}

/// `struct fuse_ioctl_out` with `result` and the data copied out.
pub fn ioctl(result: i32, out: &[u8]) -> Reply {
    let mut o = Out::with_capacity(16 + out.len());
    o.u32(result as u32).u32(0).u32(0).u32(0).bytes(out);
    Reply::Data(o.0)
}

/// A READDIR or READDIRPLUS reply filling up to the kernel's buffer.
pub struct Listing {
    out: Out,
    max: usize,
}

impl Listing {
    pub fn new(max: u32) -> Listing {
        Listing {
            out: Out::with_capacity((max as usize).min(1 << 20)),
            max: max as usize,
        }
    }

    /// `struct fuse_dirent`; false (and nothing added) if it does not fit.
    pub fn add(&mut self, ino: u64, offset: u64, dtype: u32, name: &[u8]) -> bool {
        let size = (24 + name.len()).next_multiple_of(8);
        if self.out.0.len() + size > self.max {
            return false;
        }
        let o = &mut self.out;
        o.u64(ino).u64(offset).u32(name.len() as u32).u32(dtype);
        o.bytes(name).pad8();
        true
    }

    /// `struct fuse_direntplus`; false if it does not fit.
    pub fn add_plus(
        &mut self,
        a: &FileAttr,
        generation: u64,
        ttl: Duration,
        offset: u64,
        name: &[u8],
    ) -> bool {
        let size = (128 + 24 + name.len()).next_multiple_of(8);
        if self.out.0.len() + size > self.max {
            return false;
        }
        entry_out(&mut self.out, a, generation, ttl);
        let o = &mut self.out;
        o.u64(a.ino)
            .u64(offset)
            .u32(name.len() as u32)
            .u32((a.mode >> 12) & 0xf);
        o.bytes(name).pad8();
        true
    }

    pub fn done(self) -> Reply {
        Reply::Data(self.out.0)
    }
}

/// `struct fuse_init_out`.
pub struct InitOut {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
}

pub fn init(i: &InitOut) -> Reply {
    let mut o = Out::with_capacity(64);
    o.u32(super::proto::KERNEL_MAJOR)
        .u32(i.minor)
        .u32(i.max_readahead);
    o.u32(i.flags as u32)
        .u16(i.max_background)
        .u16(i.congestion_threshold);
    // time_gran: nanoseconds; map_alignment 0.
    o.u32(i.max_write).u32(1).u16(i.max_pages).u16(0);
    o.u32((i.flags >> 32) as u32).u32(0).u16(0).zeros(22);
    Reply::Data(o.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(r: Reply) -> usize {
        match r {
            Reply::Data(d) => d.len(),
            _ => usize::MAX,
        }
    }

    #[test]
    fn structs_have_the_kernels_sizes() {
        let a = FileAttr::default();
        let ttl = Duration::from_secs(1);
        assert_eq!(len(entry(&a, 0, ttl)), 128);
        assert_eq!(len(attr_reply(&a, ttl)), 104);
        assert_eq!(len(open(0, 0)), 16);
        assert_eq!(len(create(&a, 0, ttl, 0, 0)), 144);
        assert_eq!(len(written(0)), 8);
        let s = Statfs {
            blocks: 0,
            bfree: 0,
            bavail: 0,
            files: 0,
            ffree: 0,
            bsize: 0,
            namelen: 0,
            frsize: 0,
        };
        assert_eq!(len(statfs(&s)), 80);
        let i = InitOut {
            minor: 45,
            max_readahead: 0,
            flags: 0,
            max_background: 0,
            congestion_threshold: 0,
            max_write: 0,
            max_pages: 0,
        };
        assert_eq!(len(init(&i)), 64);
    }

    #[test]
    fn listings_stop_at_the_kernels_buffer() {
        let mut l = Listing::new(64);
        assert!(l.add(1, 1, 4, b"abcdefgh"));
        assert!(l.add(2, 2, 8, b"x"));
        assert!(!l.add(3, 3, 8, b"too-long-to-fit"));
        assert_eq!(len(l.done()), 32 + 32);
    }
}
