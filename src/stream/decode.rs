//! Commands from their parsed attributes.

use super::codec::Parsed;
use super::{attr, cmd, Command, Time};

type R<T> = std::result::Result<T, String>;

struct Get<'a>(&'a Parsed<'a>);

impl Get<'_> {
    fn raw(&self, ty: u16, name: &str) -> R<&[u8]> {
        self.0[usize::from(ty)].ok_or_else(|| format!("no {name} attribute"))
    }

    fn bytes(&self, ty: u16, name: &str) -> R<Vec<u8>> {
        self.raw(ty, name).map(<[u8]>::to_vec)
    }

    fn u64(&self, ty: u16, name: &str) -> R<u64> {
        let b = self.raw(ty, name)?;
        let a: [u8; 8] = b.try_into().map_err(|_| format!("{name} is not 8 bytes"))?;
        Ok(u64::from_le_bytes(a))
    }

    fn u32(&self, ty: u16, name: &str) -> R<u32> {
        let b = self.raw(ty, name)?;
        let a: [u8; 4] = b.try_into().map_err(|_| format!("{name} is not 4 bytes"))?;
        Ok(u32::from_le_bytes(a))
    }

    /// An optional u32 that defaults to 0 (compression, encryption).
    fn u32_or_zero(&self, ty: u16, name: &str) -> R<u32> {
        match self.0[usize::from(ty)] {
            None => Ok(0),
            Some(_) => self.u32(ty, name),
        }
    }

    fn uuid(&self, ty: u16, name: &str) -> R<[u8; 16]> {
        let b = self.raw(ty, name)?;
        b.try_into().map_err(|_| format!("{name} is not 16 bytes"))
    }

    fn time(&self, ty: u16, name: &str) -> R<Time> {
        let b = self.raw(ty, name)?;
        if b.len() != 12 {
            return Err(format!("{name} is not 12 bytes"));
        }
        let sec = u64::from_le_bytes(b[..8].try_into().unwrap_or_default()) as i64;
        let nsec = u32::from_le_bytes(b[8..].try_into().unwrap_or_default());
        if nsec >= 1_000_000_000 {
            return Err(format!("{name} has {nsec} nanoseconds"));
        }
        Ok(Time { sec, nsec })
    }

    fn path(&self) -> R<Vec<u8>> {
        self.bytes(attr::PATH, "path")
    }
}

/// Decodes command `number` from its attributes.
pub(super) fn command(number: u16, p: &Parsed<'_>) -> R<Command> {
    let g = Get(p);
    Ok(match number {
        cmd::SUBVOL => Command::Subvol {
            path: g.path()?,
            uuid: g.uuid(attr::UUID, "uuid")?,
            ctransid: g.u64(attr::CTRANSID, "ctransid")?,
        },
        cmd::SNAPSHOT => Command::Snapshot {
            path: g.path()?,
            uuid: g.uuid(attr::UUID, "uuid")?,
            ctransid: g.u64(attr::CTRANSID, "ctransid")?,
            clone_uuid: g.uuid(attr::CLONE_UUID, "clone_uuid")?,
            clone_ctransid: g.u64(attr::CLONE_CTRANSID, "clone_ctransid")?,
        },
        cmd::MKFILE => Command::Mkfile {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
        },
        cmd::MKDIR => Command::Mkdir {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
        },
        cmd::MKFIFO => Command::Mkfifo {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
        },
        cmd::MKSOCK => Command::Mksock {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
        },
        cmd::MKNOD => Command::Mknod {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
            mode: g.u64(attr::MODE, "mode")?,
            rdev: g.u64(attr::RDEV, "rdev")?,
        },
        cmd::SYMLINK => Command::Symlink {
            path: g.path()?,
            ino: g.u64(attr::INO, "ino")?,
            target: g.bytes(attr::PATH_LINK, "path_link")?,
        },
        cmd::RENAME => Command::Rename {
            from: g.path()?,
            to: g.bytes(attr::PATH_TO, "path_to")?,
        },
        cmd::LINK => Command::Link {
            path: g.path()?,
            target: g.bytes(attr::PATH_LINK, "path_link")?,
        },
        cmd::UNLINK => Command::Unlink { path: g.path()? },
        cmd::RMDIR => Command::Rmdir { path: g.path()? },
        cmd::SET_XATTR => Command::SetXattr {
            path: g.path()?,
            name: g.bytes(attr::XATTR_NAME, "xattr_name")?,
            data: g.bytes(attr::XATTR_DATA, "xattr_data")?,
        },
        cmd::REMOVE_XATTR => Command::RemoveXattr {
            path: g.path()?,
            name: g.bytes(attr::XATTR_NAME, "xattr_name")?,
        },
        cmd::WRITE => Command::Write {
            path: g.path()?,
            offset: g.u64(attr::FILE_OFFSET, "file_offset")?,
            data: g.bytes(attr::DATA, "data")?,
        },
        _ => more(number, &g)?,
    })
}

fn more(number: u16, g: &Get<'_>) -> R<Command> {
    Ok(match number {
        cmd::CLONE => Command::Clone {
            path: g.path()?,
            offset: g.u64(attr::FILE_OFFSET, "file_offset")?,
            len: g.u64(attr::CLONE_LEN, "clone_len")?,
            clone_uuid: g.uuid(attr::CLONE_UUID, "clone_uuid")?,
            clone_ctransid: g.u64(attr::CLONE_CTRANSID, "clone_ctransid")?,
            clone_path: g.bytes(attr::CLONE_PATH, "clone_path")?,
            clone_offset: g.u64(attr::CLONE_OFFSET, "clone_offset")?,
        },
        cmd::TRUNCATE => Command::Truncate {
            path: g.path()?,
            size: g.u64(attr::SIZE, "size")?,
        },
        cmd::CHMOD => Command::Chmod {
            path: g.path()?,
            mode: g.u64(attr::MODE, "mode")?,
        },
        cmd::CHOWN => Command::Chown {
            path: g.path()?,
            uid: g.u64(attr::UID, "uid")?,
            gid: g.u64(attr::GID, "gid")?,
        },
        cmd::UTIMES => Command::Utimes {
            path: g.path()?,
            atime: g.time(attr::ATIME, "atime")?,
            mtime: g.time(attr::MTIME, "mtime")?,
            ctime: g.time(attr::CTIME, "ctime")?,
        },
        cmd::UPDATE_EXTENT => Command::UpdateExtent {
            path: g.path()?,
            offset: g.u64(attr::FILE_OFFSET, "file_offset")?,
            size: g.u64(attr::SIZE, "size")?,
        },
        cmd::FALLOCATE => Command::Fallocate {
            path: g.path()?,
            mode: g.u32(attr::FALLOCATE_MODE, "fallocate_mode")?,
            offset: g.u64(attr::FILE_OFFSET, "file_offset")?,
            size: g.u64(attr::SIZE, "size")?,
        },
        cmd::FILEATTR => Command::Fileattr {
            path: g.path()?,
            attr: g.u64(attr::FILEATTR, "fileattr")?,
        },
        cmd::ENCODED_WRITE => Command::EncodedWrite {
            path: g.path()?,
            offset: g.u64(attr::FILE_OFFSET, "file_offset")?,
            unencoded_file_len: g.u64(attr::UNENCODED_FILE_LEN, "unencoded_file_len")?,
            unencoded_len: g.u64(attr::UNENCODED_LEN, "unencoded_len")?,
            unencoded_offset: g.u64(attr::UNENCODED_OFFSET, "unencoded_offset")?,
            compression: g.u32_or_zero(attr::COMPRESSION, "compression")?,
            encryption: g.u32_or_zero(attr::ENCRYPTION, "encryption")?,
            data: g.bytes(attr::DATA, "data")?,
        },
        cmd::END => Command::End,
        cmd::ENABLE_VERITY => return Err("enable_verity (fs-verity) is not supported".into()),
        n => return Err(format!("unknown command {n}")),
    })
}
