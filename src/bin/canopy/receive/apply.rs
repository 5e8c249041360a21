//! One stream command carried out on the subvolume being received.

use super::paths::{open_file, open_source, Tree};
use anyhow::{bail, Context, Result};
use canopy::stream::{Command, Time};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Where a clone's source lies: the subvolume of that uuid, opened.
pub type FindSource<'a> = dyn FnMut(&[u8; 16]) -> Result<OwnedFd> + 'a;

/// The subvolume being received and what is open in it.
pub struct Target {
    pub tree: Tree,
    /// The stream's uuid for this subvolume (clones from itself).
    pub uuid: [u8; 16],
    /// The file written last, kept open for the next write.
    open: Option<(Vec<u8>, OwnedFd)>,
    /// The entry made last and its owner as made: a chown to that owner
    /// is skipped (one request less per file of a tree owned by the
    /// receiving user; the entry has no set-id bits to clear yet).
    made: Option<(Vec<u8>, u32, u32)>,
    pub files: u64,
}

/// The owner of what `fd` (or `name` in directory `fd`) names, from the
/// kernel's attribute cache of a just-made entry.
fn owner(fd: RawFd, name: Option<&CString>) -> Option<(u32, u32)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let (path, flags) = match name {
        Some(n) => (n.as_ptr(), libc::AT_SYMLINK_NOFOLLOW),
        None => (c"".as_ptr(), libc::AT_EMPTY_PATH),
    };
    // SAFETY: a descriptor we hold, a valid name and stat buffer.
    let rc = unsafe { libc::fstatat(fd, path, &mut st, flags) };
    (rc == 0).then_some((st.st_uid, st.st_gid))
}

fn last_error(what: &str, path: &[u8]) -> anyhow::Error {
    let e = std::io::Error::last_os_error();
    anyhow::anyhow!("{what} {}: {e}", String::from_utf8_lossy(path))
}

fn ok(rc: libc::c_int, what: &str, path: &[u8]) -> Result<()> {
    match rc < 0 {
        true => Err(last_error(what, path)),
        false => Ok(()),
    }
}

fn timespec(t: Time) -> libc::timespec {
    libc::timespec {
        tv_sec: t.sec as libc::time_t,
        tv_nsec: libc::c_long::from(t.nsec as i32),
    }
}

impl Target {
    pub fn new(tree: Tree, uuid: [u8; 16]) -> Target {
        Target {
            tree,
            uuid,
            open: None,
            made: None,
            files: 0,
        }
    }

    /// Closes the open file (before anything changes names).
    fn settle(&mut self) {
        self.open = None;
        self.made = None;
    }

    /// Whether `path` was made last and already has this owner.
    fn owned_by(&self, path: &[u8], uid: u64, gid: u64) -> bool {
        self.made
            .as_ref()
            .is_some_and(|(p, u, g)| p == path && u64::from(*u) == uid && u64::from(*g) == gid)
    }

    /// Whether the file at `path` is the one open for writing (a regular
    /// file: owner and mode go through its descriptor).
    fn is_open(&self, path: &[u8]) -> bool {
        self.open.as_ref().is_some_and(|(p, _)| p == path)
    }

    /// The file at `path`, open for writing.
    fn file(&mut self, path: &[u8]) -> Result<RawFd> {
        if self.open.as_ref().is_none_or(|(p, _)| p != path) {
            let fd = open_file(&mut self.tree, path, libc::O_WRONLY)?;
            self.open = Some((path.to_vec(), fd));
        }
        Ok(self.open.as_ref().map_or(-1, |(_, fd)| fd.as_raw_fd()))
    }

    pub fn apply(&mut self, c: Command, find: &mut FindSource<'_>) -> Result<()> {
        match c {
            Command::Mkfile { path, .. } => {
                self.settle();
                let fd = open_file(
                    &mut self.tree,
                    &path,
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                )?;
                // Kept for the writes, owner and mode that follow.
                self.made = owner(fd.as_raw_fd(), None).map(|(u, g)| (path.clone(), u, g));
                self.open = Some((path, fd));
                self.files += 1;
                Ok(())
            }
            Command::Mkdir { path, .. } => {
                let at = self.tree.new_entry(&path)?;
                self.files += 1;
                // SAFETY: valid directory descriptor and name.
                let rc = unsafe { libc::mkdirat(at.fd(), at.name.as_ptr(), 0o700) };
                ok(rc, "mkdir", &path)?;
                self.made = owner(at.fd(), Some(&at.name)).map(|(u, g)| (path.clone(), u, g));
                Ok(())
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => self.mknod(&path, mode as u32, rdev),
            Command::Mkfifo { path, .. } => self.mknod(&path, libc::S_IFIFO, 0),
            Command::Mksock { path, .. } => self.mknod(&path, libc::S_IFSOCK, 0),
            Command::Symlink { path, target, .. } => {
                let at = self.tree.new_entry(&path)?;
                let target = CString::new(target)?;
                self.files += 1;
                // SAFETY: valid strings and descriptor.
                ok(
                    unsafe { libc::symlinkat(target.as_ptr(), at.fd(), at.name.as_ptr()) },
                    "symlink",
                    &path,
                )
            }
            Command::Rename { from, to } => {
                self.settle();
                let (a, b) = (self.tree.new_entry(&from)?, self.tree.new_entry(&to)?);
                // SAFETY: valid descriptors and names.
                let rc =
                    unsafe { libc::renameat(a.fd(), a.name.as_ptr(), b.fd(), b.name.as_ptr()) };
                self.tree.forget();
                ok(rc, "rename", &from)
            }
            Command::Link { path, target } => {
                self.settle();
                let (old, new) = (self.tree.new_entry(&target)?, self.tree.new_entry(&path)?);
                // SAFETY: valid descriptors and names.
                let rc = unsafe {
                    libc::linkat(old.fd(), old.name.as_ptr(), new.fd(), new.name.as_ptr(), 0)
                };
                ok(rc, "link", &path)
            }
            Command::Unlink { path } => self.remove(&path, 0),
            Command::Rmdir { path } => self.remove(&path, libc::AT_REMOVEDIR),
            c => self.apply_data(c, find),
        }
    }

    fn mknod(&mut self, path: &[u8], mode: u32, rdev: u64) -> Result<()> {
        let at = self.tree.new_entry(path)?;
        self.files += 1;
        let mode = (mode & libc::S_IFMT) | 0o600;
        // SAFETY: valid directory descriptor and name.
        ok(
            unsafe { libc::mknodat(at.fd(), at.name.as_ptr(), mode, rdev as libc::dev_t) },
            "mknod",
            path,
        )
    }

    fn remove(&mut self, path: &[u8], flags: i32) -> Result<()> {
        self.settle();
        let at = self.tree.new_entry(path)?;
        // SAFETY: valid directory descriptor and name.
        let rc = unsafe { libc::unlinkat(at.fd(), at.name.as_ptr(), flags) };
        self.tree.forget();
        ok(rc, "remove", path)
    }

    fn apply_data(&mut self, c: Command, find: &mut FindSource<'_>) -> Result<()> {
        match c {
            Command::Write { path, offset, data } => self.pwrite(&path, offset, &data),
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_path,
                clone_offset,
                ..
            } => {
                let src_root = match clone_uuid == self.uuid {
                    true => None,
                    false => Some(find(&clone_uuid)?),
                };
                let root = src_root
                    .as_ref()
                    .map_or(self.tree.root_fd(), |f| f.as_raw_fd());
                let src = open_source(root, &clone_path)
                    .with_context(|| "the source of a clone".to_string())?;
                let dst = self.file(&path)?;
                copy_range(src.as_raw_fd(), clone_offset, dst, offset, len, &path)
            }
            Command::Truncate { path, size } => {
                let fd = self.file(&path)?;
                // SAFETY: a descriptor we hold.
                ok(
                    unsafe { libc::ftruncate(fd, size as libc::off_t) },
                    "truncate",
                    &path,
                )
            }
            Command::Fallocate {
                path,
                mode,
                offset,
                size,
            } => {
                let fd = self.file(&path)?;
                // SAFETY: a descriptor we hold.
                let rc = unsafe {
                    libc::fallocate(fd, mode as i32, offset as libc::off_t, size as libc::off_t)
                };
                ok(rc, "fallocate", &path)
            }
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => {
                if encryption != 0 {
                    bail!("encrypted data in the stream is not supported");
                }
                let plain = decode_encoded(compression, &data, unencoded_len)?;
                let from = usize::try_from(unencoded_offset)?.min(plain.len());
                let to = from
                    .saturating_add(usize::try_from(unencoded_file_len)?)
                    .min(plain.len());
                self.pwrite(&path, offset, &plain[from..to])
            }
            c => self.apply_attr(c),
        }
    }

    fn pwrite(&mut self, path: &[u8], mut offset: u64, mut data: &[u8]) -> Result<()> {
        let fd = self.file(path)?;
        while !data.is_empty() {
            // SAFETY: a descriptor we hold and a valid buffer.
            let n = unsafe {
                libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset as libc::off_t)
            };
            if n <= 0 {
                return Err(last_error("write", path));
            }
            data = &data[n as usize..];
            offset += n as u64;
        }
        Ok(())
    }

    fn apply_attr(&mut self, c: Command) -> Result<()> {
        match c {
            Command::SetXattr { path, name, data } => {
                let ((p, _held), n) = (self.proc_path(&path)?, CString::new(name)?);
                // SAFETY: valid strings and buffer.
                let rc = unsafe {
                    libc::lsetxattr(p.as_ptr(), n.as_ptr(), data.as_ptr().cast(), data.len(), 0)
                };
                ok(rc, "setxattr", &path)
            }
            Command::RemoveXattr { path, name } => {
                let ((p, _held), n) = (self.proc_path(&path)?, CString::new(name)?);
                // SAFETY: valid strings.
                ok(
                    unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) },
                    "removexattr",
                    &path,
                )
            }
            Command::Chown { path, uid, gid } if self.owned_by(&path, uid, gid) => Ok(()),
            Command::Chown { path, uid, gid } if self.is_open(&path) => {
                let fd = self.file(&path)?;
                // SAFETY: a descriptor we hold.
                ok(
                    unsafe { libc::fchown(fd, uid as u32, gid as u32) },
                    "chown",
                    &path,
                )
            }
            Command::Chmod { path, mode } if self.is_open(&path) => {
                let fd = self.file(&path)?;
                // SAFETY: a descriptor we hold.
                ok(
                    unsafe { libc::fchmod(fd, (mode & 0o7777) as u32) },
                    "chmod",
                    &path,
                )
            }
            Command::Chown { path, uid, gid } => {
                let at = self.tree.at(&path)?;
                // SAFETY: valid directory descriptor and name.
                let rc = unsafe {
                    libc::fchownat(
                        at.fd(),
                        at.name.as_ptr(),
                        uid as u32,
                        gid as u32,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                ok(rc, "chown", &path)
            }
            Command::Chmod { path, mode } => self.chmod(&path, mode as u32),
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                self.settle();
                let at = self.tree.at(&path)?;
                let ts = [timespec(atime), timespec(mtime)];
                // SAFETY: valid descriptor, name and two timespecs.
                let rc = unsafe {
                    libc::utimensat(
                        at.fd(),
                        at.name.as_ptr(),
                        ts.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                ok(rc, "utimes", &path)
            }
            // Ranges a --no-data stream changed, and inode flags: nothing
            // to do with them here (btrfs receive ignores them too).
            Command::UpdateExtent { .. } | Command::Fileattr { .. } => Ok(()),
            Command::Subvol { .. } | Command::Snapshot { .. } => {
                bail!("a subvolume command inside a stream's subvolume")
            }
            Command::End => Ok(()),
            c => bail!("unexpected {} command", c.name()),
        }
    }

    /// `/proc/self/fd/DIR/NAME`: the entry itself to the l*xattr calls,
    /// through a directory resolved safely (held open by the `At`
    /// returned with it).
    fn proc_path(&mut self, path: &[u8]) -> Result<(CString, super::paths::At)> {
        let at = self.tree.at(path)?;
        let mut p = format!("/proc/self/fd/{}/", at.fd()).into_bytes();
        p.extend_from_slice(at.name.as_bytes());
        Ok((CString::new(p)?, at))
    }

    /// chmod follows symlinks, so the entry is opened (O_PATH, not
    /// followed) and changed through its descriptor; a symlink has no
    /// mode to change.
    fn chmod(&mut self, path: &[u8], mode: u32) -> Result<()> {
        let at = self.tree.at(path)?;
        // SAFETY: valid directory descriptor and name.
        let fd = unsafe {
            libc::openat(
                at.fd(),
                at.name.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(last_error("chmod", path));
        }
        // SAFETY: a new descriptor we own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and stat buffer.
        ok(
            unsafe { libc::fstat(fd.as_raw_fd(), &mut st) },
            "chmod",
            path,
        )?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok(());
        }
        let p = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        // SAFETY: a valid path.
        ok(
            unsafe { libc::chmod(p.as_ptr(), mode & 0o7777) },
            "chmod",
            path,
        )
    }
}

/// Shares (or copies) `len` bytes from `src` to `dst`: copy_file_range,
/// which Canopy answers by sharing extents.
fn copy_range(
    src: RawFd,
    mut from: u64,
    dst: RawFd,
    mut to: u64,
    mut len: u64,
    path: &[u8],
) -> Result<()> {
    while len > 0 {
        let mut a = from as libc::loff_t;
        let mut b = to as libc::loff_t;
        // SAFETY: descriptors we hold; offsets are ours.
        let n = unsafe { libc::copy_file_range(src, &mut a, dst, &mut b, len as usize, 0) };
        if n < 0 {
            return Err(last_error("clone", path));
        }
        if n == 0 {
            bail!(
                "clone {}: the source ends before the range",
                String::from_utf8_lossy(path)
            );
        }
        from += n as u64;
        to += n as u64;
        len -= n as u64;
    }
    Ok(())
}

/// Data `btrfs send --compressed-data` sent as it lies on disk.
fn decode_encoded(compression: u32, data: &[u8], unencoded_len: u64) -> Result<Vec<u8>> {
    const NONE: u32 = 0;
    const ZSTD: u32 = 2;
    let cap = usize::try_from(unencoded_len)?.min(canopy::stream::MAX_COMMAND * 4);
    match compression {
        NONE => Ok(data.to_vec()),
        ZSTD => {
            let mut out = Vec::with_capacity(cap);
            let d = zstd::stream::read::Decoder::new(data)?;
            std::io::Read::read_to_end(&mut std::io::Read::take(d, cap as u64), &mut out)?;
            Ok(out)
        }
        c => bail!("encoded data compressed with type {c} (zlib or lzo) is not supported; send without --compressed-data"),
    }
}
