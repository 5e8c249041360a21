//! Encoding and decoding commands.

use super::{attr, cmd, Command, Time, MAGIC, MAX_COMMAND, VERSIONS};
use crate::error::{Error, Result};
use std::io::{Read, Write};

const HEADER: usize = 10;

/// The checksum btrfs puts on a command: crc32c seeded with 0 and not
/// inverted at either end (the crate's form inverts both).
fn stream_crc(bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!0, bytes)
}

fn bad(what: String) -> Error {
    Error::Invalid(format!("send stream: {what}"))
}

/// Writes commands to a stream.
pub struct Writer<W: Write> {
    out: W,
    version: u32,
    buf: Vec<u8>,
    written: u64,
}

impl<W: Write> Writer<W> {
    /// Starts a stream of `version` (1 or 2): writes its header.
    pub fn new(mut out: W, version: u32) -> Result<Writer<W>> {
        if !VERSIONS.contains(&version) {
            return Err(Error::Invalid(format!(
                "send stream version {version}: only 1 and 2 are written"
            )));
        }
        out.write_all(MAGIC)
            .map_err(|e| Error::io("writing the stream", e))?;
        out.write_all(&version.to_le_bytes())
            .map_err(|e| Error::io("writing the stream", e))?;
        Ok(Writer {
            out,
            version,
            buf: Vec::with_capacity(64 << 10),
            written: 17,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Bytes written so far, header included.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn put(&mut self, c: &Command) -> Result<()> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0; HEADER]);
        let number = encode_attrs(c, &mut Attrs(&mut self.buf), self.version)?;
        let len = u32::try_from(self.buf.len() - HEADER)
            .map_err(|_| Error::Invalid("send stream: command over 4 GiB".into()))?;
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..6].copy_from_slice(&number.to_le_bytes());
        let crc = stream_crc(&self.buf);
        self.buf[6..10].copy_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&self.buf)
            .map_err(|e| Error::io("writing the stream", e))?;
        self.written += self.buf.len() as u64;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| Error::io("writing the stream", e))
    }
}

/// Appends attributes to a command being built.
struct Attrs<'a>(&'a mut Vec<u8>);

impl Attrs<'_> {
    fn bytes(&mut self, ty: u16, v: &[u8]) -> Result<()> {
        let len = u16::try_from(v.len())
            .map_err(|_| bad(format!("attribute {ty} of {} bytes", v.len())))?;
        self.0.extend_from_slice(&ty.to_le_bytes());
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(v);
        Ok(())
    }

    fn u64(&mut self, ty: u16, v: u64) -> Result<()> {
        self.bytes(ty, &v.to_le_bytes())
    }

    fn u32(&mut self, ty: u16, v: u32) -> Result<()> {
        self.bytes(ty, &v.to_le_bytes())
    }

    fn time(&mut self, ty: u16, t: Time) -> Result<()> {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&(t.sec as u64).to_le_bytes());
        b[8..].copy_from_slice(&t.nsec.to_le_bytes());
        self.bytes(ty, &b)
    }

    /// The data attribute: in version 2 last and without a length.
    fn data(&mut self, v: &[u8], version: u32) -> Result<()> {
        if version < 2 {
            return self.bytes(attr::DATA, v);
        }
        self.0.extend_from_slice(&attr::DATA.to_le_bytes());
        self.0.extend_from_slice(v);
        Ok(())
    }
}

/// Adds `c`'s attributes in the order btrfs emits them; returns its number.
fn encode_attrs(c: &Command, a: &mut Attrs<'_>, version: u32) -> Result<u16> {
    use Command as C;
    Ok(match c {
        C::Subvol {
            path,
            uuid,
            ctransid,
        } => {
            a.bytes(attr::PATH, path)?;
            a.bytes(attr::UUID, uuid)?;
            a.u64(attr::CTRANSID, *ctransid)?;
            cmd::SUBVOL
        }
        C::Snapshot {
            path,
            uuid,
            ctransid,
            clone_uuid,
            clone_ctransid,
        } => {
            a.bytes(attr::PATH, path)?;
            a.bytes(attr::UUID, uuid)?;
            a.u64(attr::CTRANSID, *ctransid)?;
            a.bytes(attr::CLONE_UUID, clone_uuid)?;
            a.u64(attr::CLONE_CTRANSID, *clone_ctransid)?;
            cmd::SNAPSHOT
        }
        C::Mkfile { path, ino } => path_ino(a, path, *ino, cmd::MKFILE)?,
        C::Mkdir { path, ino } => path_ino(a, path, *ino, cmd::MKDIR)?,
        C::Mkfifo { path, ino } => path_ino(a, path, *ino, cmd::MKFIFO)?,
        C::Mksock { path, ino } => path_ino(a, path, *ino, cmd::MKSOCK)?,
        C::Mknod {
            path,
            ino,
            mode,
            rdev,
        } => {
            path_ino(a, path, *ino, cmd::MKNOD)?;
            a.u64(attr::MODE, *mode)?;
            a.u64(attr::RDEV, *rdev)?;
            cmd::MKNOD
        }
        C::Symlink { path, ino, target } => {
            path_ino(a, path, *ino, cmd::SYMLINK)?;
            a.bytes(attr::PATH_LINK, target)?;
            cmd::SYMLINK
        }
        c => return encode_names(c, a, version),
    })
}

/// Commands on names, xattrs and data.
fn encode_names(c: &Command, a: &mut Attrs<'_>, version: u32) -> Result<u16> {
    use Command as C;
    Ok(match c {
        C::Rename { from, to } => {
            a.bytes(attr::PATH, from)?;
            a.bytes(attr::PATH_TO, to)?;
            cmd::RENAME
        }
        C::Link { path, target } => {
            a.bytes(attr::PATH, path)?;
            a.bytes(attr::PATH_LINK, target)?;
            cmd::LINK
        }
        C::Unlink { path } => {
            a.bytes(attr::PATH, path)?;
            cmd::UNLINK
        }
        C::Rmdir { path } => {
            a.bytes(attr::PATH, path)?;
            cmd::RMDIR
        }
        C::SetXattr { path, name, data } => {
            a.bytes(attr::PATH, path)?;
            a.bytes(attr::XATTR_NAME, name)?;
            a.bytes(attr::XATTR_DATA, data)?;
            cmd::SET_XATTR
        }
        C::RemoveXattr { path, name } => {
            a.bytes(attr::PATH, path)?;
            a.bytes(attr::XATTR_NAME, name)?;
            cmd::REMOVE_XATTR
        }
        C::Write { path, offset, data } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::FILE_OFFSET, *offset)?;
            a.data(data, version)?;
            cmd::WRITE
        }
        c => return encode_more(c, a, version),
    })
}

fn path_ino(a: &mut Attrs<'_>, path: &[u8], ino: u64, number: u16) -> Result<u16> {
    a.bytes(attr::PATH, path)?;
    a.u64(attr::INO, ino)?;
    Ok(number)
}

fn encode_more(c: &Command, a: &mut Attrs<'_>, version: u32) -> Result<u16> {
    use Command as C;
    Ok(match c {
        C::Clone {
            path,
            offset,
            len,
            clone_uuid,
            clone_ctransid,
            clone_path,
            clone_offset,
        } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::FILE_OFFSET, *offset)?;
            a.u64(attr::CLONE_LEN, *len)?;
            a.bytes(attr::CLONE_UUID, clone_uuid)?;
            a.u64(attr::CLONE_CTRANSID, *clone_ctransid)?;
            a.bytes(attr::CLONE_PATH, clone_path)?;
            a.u64(attr::CLONE_OFFSET, *clone_offset)?;
            cmd::CLONE
        }
        C::Truncate { path, size } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::SIZE, *size)?;
            cmd::TRUNCATE
        }
        C::Chmod { path, mode } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::MODE, *mode)?;
            cmd::CHMOD
        }
        C::Chown { path, uid, gid } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::UID, *uid)?;
            a.u64(attr::GID, *gid)?;
            cmd::CHOWN
        }
        C::Utimes {
            path,
            atime,
            mtime,
            ctime,
        } => {
            a.bytes(attr::PATH, path)?;
            a.time(attr::ATIME, *atime)?;
            a.time(attr::MTIME, *mtime)?;
            a.time(attr::CTIME, *ctime)?;
            cmd::UTIMES
        }
        c => return encode_v2(c, a, version),
    })
}

/// The commands version 2 added, `update_extent` and `end`.
fn encode_v2(c: &Command, a: &mut Attrs<'_>, version: u32) -> Result<u16> {
    use Command as C;
    Ok(match c {
        C::UpdateExtent { path, offset, size } => {
            a.bytes(attr::PATH, path)?;
            a.u64(attr::FILE_OFFSET, *offset)?;
            a.u64(attr::SIZE, *size)?;
            cmd::UPDATE_EXTENT
        }
        C::Fallocate {
            path,
            mode,
            offset,
            size,
        } => {
            need_v2(version, "fallocate")?;
            a.bytes(attr::PATH, path)?;
            a.u32(attr::FALLOCATE_MODE, *mode)?;
            a.u64(attr::FILE_OFFSET, *offset)?;
            a.u64(attr::SIZE, *size)?;
            cmd::FALLOCATE
        }
        C::Fileattr { path, attr: v } => {
            need_v2(version, "fileattr")?;
            a.bytes(attr::PATH, path)?;
            a.u64(attr::FILEATTR, *v)?;
            cmd::FILEATTR
        }
        C::EncodedWrite {
            path,
            offset,
            unencoded_file_len,
            unencoded_len,
            unencoded_offset,
            compression,
            encryption,
            data,
        } => {
            need_v2(version, "encoded_write")?;
            a.bytes(attr::PATH, path)?;
            a.u64(attr::FILE_OFFSET, *offset)?;
            a.u64(attr::UNENCODED_FILE_LEN, *unencoded_file_len)?;
            a.u64(attr::UNENCODED_LEN, *unencoded_len)?;
            a.u64(attr::UNENCODED_OFFSET, *unencoded_offset)?;
            a.u32(attr::COMPRESSION, *compression)?;
            a.u32(attr::ENCRYPTION, *encryption)?;
            a.data(data, version)?;
            cmd::ENCODED_WRITE
        }
        C::End => cmd::END,
        _ => unreachable!("the other encode_ functions take the other commands"),
    })
}

fn need_v2(version: u32, what: &str) -> Result<()> {
    match version >= 2 {
        true => Ok(()),
        false => Err(bad(format!("{what} needs version 2"))),
    }
}

/// Reads commands from a stream; several streams may follow each other
/// (as `btrfs send` of several subvolumes writes them).
pub struct Reader<R: Read> {
    inp: R,
    version: u32,
    buf: Vec<u8>,
    read: u64,
    commands: u64,
}

impl<R: Read> Reader<R> {
    /// Reads and checks the stream's header.
    pub fn new(mut inp: R) -> Result<Reader<R>> {
        let mut head = [0u8; 17];
        read_exact(&mut inp, &mut head, "the stream header")?;
        let version = check_header(&head)?;
        Ok(Reader {
            inp,
            version,
            buf: Vec::new(),
            read: 17,
            commands: 0,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The next command; None at the end of the input. A stream header
    /// between commands starts the next stream.
    pub fn read_command(&mut self) -> Result<Option<Command>> {
        let mut head = [0u8; HEADER];
        if !read_or_eof(&mut self.inp, &mut head)? {
            return Ok(None);
        }
        if head == MAGIC[..HEADER] {
            let mut rest = [0u8; 7];
            read_exact(&mut self.inp, &mut rest, "a stream header")?;
            let mut whole = [0u8; 17];
            whole[..HEADER].copy_from_slice(&head);
            whole[HEADER..].copy_from_slice(&rest);
            self.version = check_header(&whole)?;
            self.read += 17;
            return self.read_command();
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let number = u16::from_le_bytes([head[4], head[5]]);
        let at = self.commands;
        if len > MAX_COMMAND {
            return Err(bad(format!(
                "command {at} declares {len} bytes, more than the {MAX_COMMAND} allowed"
            )));
        }
        self.buf.clear();
        self.buf.extend_from_slice(&head);
        self.buf[6..10].fill(0);
        self.buf.resize(HEADER + len, 0);
        read_exact(&mut self.inp, &mut self.buf[HEADER..], "a command")?;
        let want = u32::from_le_bytes([head[6], head[7], head[8], head[9]]);
        if stream_crc(&self.buf) != want {
            return Err(bad(format!("command {at} (type {number}): bad checksum")));
        }
        self.read += (HEADER + len) as u64;
        self.commands += 1;
        let attrs = parse_attrs(&self.buf[HEADER..], self.version)
            .map_err(|e| bad(format!("command {at} (type {number}): {e}")))?;
        super::decode::command(number, &attrs)
            .map(Some)
            .map_err(|e| bad(format!("command {at} (type {number}): {e}")))
    }
}

impl<R: Read> Reader<std::io::BufReader<R>> {
    /// Whether the next command lies whole in the input's buffer, so
    /// reading it cannot wait for the input.
    pub fn next_is_buffered(&self) -> bool {
        let b = self.inp.buffer();
        if b.len() < HEADER {
            return false;
        }
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        b.len() - HEADER >= len
    }
}

fn check_header(head: &[u8; 17]) -> Result<u32> {
    if &head[..13] != MAGIC {
        return Err(bad("not a send stream (no btrfs-stream magic)".into()));
    }
    let version = u32::from_le_bytes([head[13], head[14], head[15], head[16]]);
    if !VERSIONS.contains(&version) {
        return Err(bad(format!(
            "version {version} is not supported (1 and 2 are)"
        )));
    }
    Ok(version)
}

fn read_exact<R: Read>(inp: &mut R, buf: &mut [u8], what: &str) -> Result<()> {
    inp.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad(format!("truncated in {what}")),
        _ => Error::io("reading the stream", e),
    })
}

/// Fills `buf`; false at a clean end of input (nothing read).
fn read_or_eof<R: Read>(inp: &mut R, buf: &mut [u8]) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match inp.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(bad("truncated in a command header".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading the stream", e)),
        }
    }
    Ok(true)
}

/// The attributes of one command, by type (a repeated type keeps the last).
pub(super) type Parsed<'a> = Vec<Option<&'a [u8]>>;

fn parse_attrs(mut b: &[u8], version: u32) -> std::result::Result<Parsed<'_>, String> {
    let mut out: Parsed<'_> = vec![None; usize::from(attr::MAX) + 1];
    while !b.is_empty() {
        if b.len() < 2 {
            return Err("attribute header cut short".into());
        }
        let ty = u16::from_le_bytes([b[0], b[1]]);
        if ty == 0 || ty > attr::MAX {
            return Err(format!("unknown attribute {ty}"));
        }
        b = &b[2..];
        let value;
        if version >= 2 && ty == attr::DATA {
            (value, b) = (b, &[][..]);
        } else {
            if b.len() < 2 {
                return Err("attribute header cut short".into());
            }
            let len = usize::from(u16::from_le_bytes([b[0], b[1]]));
            b = &b[2..];
            if b.len() < len {
                return Err(format!("attribute {ty} runs past the command"));
            }
            (value, b) = b.split_at(len);
        }
        out[usize::from(ty)] = Some(value);
    }
    Ok(out)
}
