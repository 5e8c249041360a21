//! Decoding the kernel's requests. A request is a header, a fixed part
//! whose layout its opcode gives (`proto::fixed_len`), and a variable
//! rest (names, data). Over /dev/fuse the three come in one buffer; over
//! io_uring in three, so decoding takes the parts apart.
//!
//! The kernel is trusted to speak the protocol, but a short or
//! ill-formed request is an error reply, never a panic: every field is
//! read through bounds checks.

use super::proto::{self, opcode};

/// `struct fuse_in_header`, without its length and extension fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A request that does not follow the protocol.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed FUSE request: {0}")]
pub struct Malformed(pub &'static str);

/// The fields of SETATTR that are set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub valid: u32,
    pub size: u64,
    /// (seconds, nanoseconds)
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One decoded request; names and data borrow the request's buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    /// (node, lookups) pairs, 16 bytes each.
    BatchForget {
        nodes: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnode: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release,
    Fsync {
        datasync: bool,
    },
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush,
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir,
    Fsyncdir,
    Create {
        flags: u32,
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    /// O_TMPFILE: a file with no name, opened (its name argument is the
    /// kernel's placeholder and means nothing).
    Tmpfile {
        mode: u32,
        umask: u32,
    },
    Interrupt {
        unique: u64,
    },
    Ioctl {
        cmd: u32,
        in_data: &'a [u8],
        out_size: u32,
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: i64,
        whence: u32,
    },
    CopyFileRange {
        off_in: u64,
        node_out: u64,
        off_out: u64,
        len: u64,
        /// COPY_FILE_RANGE_64: the count is replied as 64 bits.
        wide: bool,
    },
    /// Anything else: answered ENOSYS.
    Other(u32),
}

/// Reads the fixed part field by field and the rest as names and data.
struct Args<'a> {
    fixed: &'a [u8],
    at: usize,
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let b = self
            .fixed
            .get(self.at..self.at + N)
            .ok_or(Malformed("fixed part too short"))?;
        self.at += N;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        self.bytes::<4>().map(u32::from_ne_bytes)
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        self.bytes::<8>().map(u64::from_ne_bytes)
    }

    fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        if self.at + n > self.fixed.len() {
            return Err(Malformed("fixed part too short"));
        }
        self.at += n;
        Ok(())
    }

    /// A NUL-terminated name from the rest, without its NUL.
    fn name(&mut self) -> Result<&'a [u8], Malformed> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(Malformed("name without its NUL"))?;
        let name = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Ok(name)
    }

    fn data(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.rest.len() {
            return Err(Malformed("data shorter than announced"));
        }
        let (d, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(d)
    }

    fn time(&mut self) -> Result<i64, Malformed> {
        self.u64().map(|t| t as i64)
    }
}

/// The header at the start of `buf`, and the length the kernel gave the
/// whole request.
pub fn header(buf: &[u8]) -> Result<(Header, usize), Malformed> {
    let mut a = Args {
        fixed: buf
            .get(..proto::IN_HEADER)
            .ok_or(Malformed("short header"))?,
        at: 0,
        rest: &[],
    };
    let len = a.u32()? as usize;
    let h = Header {
        opcode: a.u32()?,
        unique: a.u64()?,
        nodeid: a.u64()?,
        uid: a.u32()?,
        gid: a.u32()?,
        pid: a.u32()?,
    };
    if len < proto::IN_HEADER {
        return Err(Malformed("length shorter than the header"));
    }
    Ok((h, len))
}

/// A request as read from /dev/fuse: header, fixed part and rest.
pub fn split(buf: &[u8]) -> Result<(Header, &[u8], &[u8]), Malformed> {
    let (h, len) = header(buf)?;
    let body = buf
        .get(proto::IN_HEADER..len)
        .ok_or(Malformed("request longer than what was read"))?;
    let (fixed, rest) = body.split_at(proto::fixed_len(h.opcode).min(body.len()));
    Ok((h, fixed, rest))
}

/// Decodes the fixed part and rest of a request of opcode `op`.
pub fn decode<'a>(op: u32, fixed: &'a [u8], rest: &'a [u8]) -> Result<Op<'a>, Malformed> {
    let mut a = Args { fixed, at: 0, rest };
    let a = &mut a;
    Ok(match op {
        opcode::INIT => init(a)?,
        opcode::DESTROY => Op::Destroy,
        opcode::LOOKUP => Op::Lookup { name: a.name()? },
        opcode::FORGET => Op::Forget { nlookup: a.u64()? },
        opcode::BATCH_FORGET => batch_forget(a)?,
        opcode::GETATTR => Op::Getattr,
        opcode::SETATTR => Op::Setattr(setattr(a)?),
        opcode::READLINK => Op::Readlink,
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE => Op::Release,
        opcode::RELEASEDIR => Op::Releasedir,
        opcode::FLUSH => Op::Flush,
        opcode::OPENDIR => Op::Opendir,
        opcode::FSYNCDIR => Op::Fsyncdir,
        opcode::SYMLINK => Op::Symlink {
            name: a.name()?,
            target: a.name()?,
        },
        opcode::UNLINK => Op::Unlink { name: a.name()? },
        opcode::RMDIR => Op::Rmdir { name: a.name()? },
        opcode::REMOVEXATTR => Op::Removexattr { name: a.name()? },
        opcode::OPEN => Op::Open { flags: a.u32()? },
        opcode::INTERRUPT => Op::Interrupt { unique: a.u64()? },
        opcode::FSYNC => {
            a.skip(8)?;
            Op::Fsync {
                datasync: a.u32()? & proto::FSYNC_FDATASYNC != 0,
            }
        }
        opcode::LISTXATTR => Op::Listxattr { size: a.u32()? },
        opcode::LSEEK => {
            a.skip(8)?;
            Op::Lseek {
                offset: a.u64()? as i64,
                whence: a.u32()?,
            }
        }
        _ => return decode_more(op, a),
    })
}

/// The requests that carry names, then those that move data.
fn decode_more<'a>(op: u32, a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    Ok(match op {
        opcode::MKNOD => Op::Mknod {
            mode: a.u32()?,
            rdev: a.u32()?,
            umask: a.u32()?,
            name: a.name()?,
        },
        opcode::MKDIR => Op::Mkdir {
            mode: a.u32()?,
            umask: a.u32()?,
            name: a.name()?,
        },
        opcode::RENAME | opcode::RENAME2 => Op::Rename {
            newdir: a.u64()?,
            flags: if op == opcode::RENAME2 { a.u32()? } else { 0 },
            name: a.name()?,
            newname: a.name()?,
        },
        opcode::LINK => Op::Link {
            oldnode: a.u64()?,
            newname: a.name()?,
        },
        opcode::SETXATTR => {
            let (size, flags) = (a.u32()?, a.u32()?);
            let name = a.name()?;
            Op::Setxattr {
                flags,
                name,
                value: a.data(size as usize)?,
            }
        }
        opcode::GETXATTR => {
            let size = a.u32()?;
            a.skip(4)?;
            Op::Getxattr {
                size,
                name: a.name()?,
            }
        }
        opcode::TMPFILE => {
            let _flags = a.u32()?;
            Op::Tmpfile {
                mode: a.u32()?,
                umask: a.u32()?,
            }
        }
        opcode::CREATE => Op::Create {
            flags: a.u32()?,
            mode: a.u32()?,
            umask: a.u32()?,
            name: {
                a.skip(4)?;
                a.name()?
            },
        },
        _ => return decode_data(op, a),
    })
}

/// The requests that read, write or copy file data.
fn decode_data<'a>(op: u32, a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    Ok(match op {
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => {
            a.skip(8)?;
            let (offset, size) = (a.u64()?, a.u32()?);
            match op {
                opcode::READ => Op::Read { offset, size },
                _ => Op::Readdir {
                    offset,
                    size,
                    plus: op == opcode::READDIRPLUS,
                },
            }
        }
        opcode::WRITE => write(a)?,
        opcode::IOCTL => ioctl(a)?,
        opcode::FALLOCATE => {
            a.skip(8)?;
            Op::Fallocate {
                offset: a.u64()?,
                length: a.u64()?,
                mode: a.u32()?,
            }
        }
        opcode::COPY_FILE_RANGE | opcode::COPY_FILE_RANGE_64 => {
            a.skip(8)?;
            let off_in = a.u64()?;
            let node_out = a.u64()?;
            a.skip(8)?;
            Op::CopyFileRange {
                off_in,
                node_out,
                off_out: a.u64()?,
                len: a.u64()?,
                wide: op == opcode::COPY_FILE_RANGE_64,
            }
        }
        other => Op::Other(other),
    })
}

/// INIT: the short form of kernels before 7.36 ends after `flags`.
fn init<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let (major, minor, max_readahead, low) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
    let high = if low as u64 & proto::init::INIT_EXT != 0 {
        a.u32()?
    } else {
        0
    };
    Ok(Op::Init {
        major,
        minor,
        max_readahead,
        flags: u64::from(low) | (u64::from(high) << 32),
    })
}

fn batch_forget<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let count = a.u32()? as usize;
    let nodes = a.data(count.checked_mul(16).ok_or(Malformed("forget count"))?)?;
    Ok(Op::BatchForget { nodes })
}

fn setattr<'a>(a: &mut Args<'a>) -> Result<SetattrIn, Malformed> {
    let valid = a.u32()?;
    a.skip(12)?; // padding, fh
    let size = a.u64()?;
    a.skip(8)?; // lock_owner
    let (at, mt, ct) = (a.time()?, a.time()?, a.time()?);
    let (atn, mtn, ctn) = (a.u32()?, a.u32()?, a.u32()?);
    let mode = a.u32()?;
    a.skip(4)?;
    Ok(SetattrIn {
        valid,
        size,
        atime: (at, atn),
        mtime: (mt, mtn),
        ctime: (ct, ctn),
        mode,
        uid: a.u32()?,
        gid: a.u32()?,
    })
}

fn write<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    a.skip(8)?;
    let offset = a.u64()?;
    let size = a.u32()?;
    let write_flags = a.u32()?;
    Ok(Op::Write {
        offset,
        write_flags,
        data: a.data(size as usize)?,
    })
}

fn ioctl<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    a.skip(12)?; // fh, flags
    let cmd = a.u32()?;
    a.skip(8)?; // arg
    let in_size = a.u32()?;
    let out_size = a.u32()?;
    Ok(Op::Ioctl {
        cmd,
        in_data: a.data(in_size as usize)?,
        out_size,
    })
}

/// The (node, lookups) pairs of a BATCH_FORGET.
pub fn forgotten(nodes: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    nodes.chunks_exact(16).map(|c| {
        let mut n = [0u8; 8];
        let mut l = [0u8; 8];
        n.copy_from_slice(&c[..8]);
        l.copy_from_slice(&c[8..]);
        (u64::from_ne_bytes(n), u64::from_ne_bytes(l))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /dev/fuse request: header, then `body`.
    fn request(op: u32, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&((40 + body.len()) as u32).to_ne_bytes());
        b.extend_from_slice(&op.to_ne_bytes());
        b.extend_from_slice(&7u64.to_ne_bytes()); // unique
        b.extend_from_slice(&5u64.to_ne_bytes()); // node
        for v in [1000u32, 100, 42, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(body);
        b
    }

    fn parse(buf: &[u8]) -> Result<Op<'_>, Malformed> {
        let (h, fixed, rest) = split(buf)?;
        decode(h.opcode, fixed, rest)
    }

    #[test]
    fn well_formed_requests_decode() {
        let b = request(opcode::LOOKUP, b"name\0");
        let (h, _, _) = split(&b).unwrap();
        assert_eq!(
            (h.unique, h.nodeid, h.uid, h.gid, h.pid),
            (7, 5, 1000, 100, 42)
        );
        assert_eq!(parse(&b), Ok(Op::Lookup { name: b"name" }));
        let mut body = vec![0u8; 8];
        body[..8].copy_from_slice(&9u64.to_ne_bytes());
        body.extend_from_slice(b"a\0b\0");
        assert_eq!(
            parse(&request(opcode::RENAME, &body)),
            Ok(Op::Rename {
                newdir: 9,
                flags: 0,
                name: b"a",
                newname: b"b"
            })
        );
        let mut w = vec![0u8; 40];
        w[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        w[16..20].copy_from_slice(&3u32.to_ne_bytes());
        w.extend_from_slice(b"xyz");
        assert_eq!(
            parse(&request(opcode::WRITE, &w)),
            Ok(Op::Write {
                offset: 4096,
                write_flags: 0,
                data: b"xyz"
            })
        );
        assert_eq!(parse(&request(999, &[])), Ok(Op::Other(999)));
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        // Too short for a header; a length beyond what was read; a name
        // without its NUL; data shorter than announced; a fixed part cut.
        assert!(split(&[0u8; 12]).is_err());
        let mut b = request(opcode::LOOKUP, b"x\0");
        b[0..4].copy_from_slice(&4096u32.to_ne_bytes());
        assert!(split(&b).is_err());
        assert!(parse(&request(opcode::LOOKUP, b"no-nul")).is_err());
        let mut w = vec![0u8; 40];
        w[16..20].copy_from_slice(&100u32.to_ne_bytes());
        w.extend_from_slice(b"short");
        assert!(parse(&request(opcode::WRITE, &w)).is_err());
        assert!(parse(&request(opcode::SETATTR, &[0u8; 30])).is_err());
        let mut f = vec![0u8; 8];
        f[..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse(&request(opcode::BATCH_FORGET, &f)).is_err());
        let mut x = vec![0u8; 8];
        x[..4].copy_from_slice(&50u32.to_ne_bytes());
        x.extend_from_slice(b"user.a\0tiny");
        assert!(parse(&request(opcode::SETXATTR, &x)).is_err());
    }

    #[test]
    fn every_truncation_of_every_request_is_handled() {
        // Each opcode with a full-sized zeroed body and a name, then every
        // shorter cut of it: decoding answers, never panics.
        for op in 1..=60u32 {
            let mut body = vec![0u8; proto::fixed_len(op)];
            body.extend_from_slice(b"n\0t\0");
            let full = request(op, &body);
            for cut in 0..full.len() {
                let mut b = full[..cut].to_vec();
                if cut >= 4 {
                    b[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
                }
                let _ = parse(&b);
            }
        }
    }
}
