//! One stream command carried out on the subvolume being received,
//! through the filesystem's own operations (no FUSE request in between).

use super::paths::{shown, Tree};
use super::KernelCache;
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::fs::{Fs, Owner, SetAttr};
use crate::stream::{Command, Time};
use std::collections::HashSet;

/// Where a clone's source lies: the root node of the subvolume of a uuid.
pub type FindSource<'a> = dyn FnMut(&[u8; 16]) -> Result<u64> + 'a;

/// The subvolume being received and what the commands left in flight.
pub struct Target<'a> {
    fs: &'a Fs,
    kernel: &'a dyn KernelCache,
    tree: Tree,
    /// The stream's uuid for this subvolume (clones from itself).
    uuid: [u8; 16],
    /// The file written last and its node: a file's writes come in a row.
    file: Option<(Vec<u8>, u64)>,
    /// The entry made last and its owner as made: a chown to that owner
    /// changes nothing and is skipped (one tree update less per file of
    /// a tree owned by root).
    made: Option<(Vec<u8>, Owner)>,
    /// Nodes whose data or attributes changed: the kernel's copies of
    /// them are dropped at the end.
    touched: HashSet<u64>,
    pub files: u64,
}

/// An error of the command `what` on `path`.
fn failed(what: &str, path: &[u8], e: Error) -> Error {
    Error::Invalid(format!("{what} {}: {e}", shown(path)))
}

fn time(t: Time) -> Timespec {
    Timespec {
        sec: t.sec,
        nsec: t.nsec,
    }
}

/// What a new entry is made as before the stream's chown and chmod: the
/// receiving root's, with room for nobody else.
const MADE_BY: Owner = Owner { uid: 0, gid: 0 };

impl<'a> Target<'a> {
    pub fn new(fs: &'a Fs, kernel: &'a dyn KernelCache, root: u64, uuid: [u8; 16]) -> Target<'a> {
        Target {
            fs,
            kernel,
            tree: Tree::new(root),
            uuid,
            file: None,
            made: None,
            touched: HashSet::new(),
            files: 0,
        }
    }

    /// Drops the kernel's cached attributes and pages of everything the
    /// receive changed (names were dropped as they changed).
    pub fn tell_kernel(&mut self) {
        for node in self.touched.drain() {
            self.kernel.node_changed(node);
        }
    }

    /// Forgets the file and entry in flight (before names change).
    fn settle(&mut self) {
        self.file = None;
        self.made = None;
    }

    /// The node of regular file `path`, written in a row.
    fn file(&mut self, path: &[u8]) -> Result<u64> {
        if let Some((p, node)) = &self.file {
            if p == path {
                return Ok(*node);
            }
        }
        let a = self.tree.attr(self.fs, path)?;
        if a.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::Invalid(format!(
                "opening {}: not a regular file",
                shown(path)
            )));
        }
        self.file = Some((path.to_vec(), a.ino));
        self.touched.insert(a.ino);
        Ok(a.ino)
    }

    pub fn apply(&mut self, c: Command, find: &mut FindSource<'_>) -> Result<()> {
        match c {
            Command::Mkfile { path, .. } => {
                let node = self.make(&path, libc::S_IFREG | 0o600, 0, None)?;
                self.file = Some((path, node));
                Ok(())
            }
            Command::Mkdir { path, .. } => {
                self.make(&path, libc::S_IFDIR | 0o700, 0, None).map(drop)
            }
            Command::Mknod {
                path, mode, rdev, ..
            } => {
                let mode = (mode as u32 & libc::S_IFMT) | 0o600;
                self.make(&path, mode, rdev, None).map(drop)
            }
            Command::Mkfifo { path, .. } => {
                self.make(&path, libc::S_IFIFO | 0o600, 0, None).map(drop)
            }
            Command::Mksock { path, .. } => {
                self.make(&path, libc::S_IFSOCK | 0o600, 0, None).map(drop)
            }
            Command::Symlink { path, target, .. } => self
                .make(&path, libc::S_IFLNK | 0o777, 0, Some(&target))
                .map(drop),
            Command::Rename { from, to } => self.rename(&from, &to),
            Command::Link { path, target } => self.link(&path, &target),
            Command::Unlink { path } => self.remove(&path, false),
            Command::Rmdir { path } => self.remove(&path, true),
            c => self.apply_data(c, find),
        }
    }

    /// A new entry at `path`: its node.
    fn make(&mut self, path: &[u8], mode: u32, rdev: u64, target: Option<&[u8]>) -> Result<u64> {
        self.settle();
        let at = self.tree.entry(self.fs, path)?;
        let what = match mode & libc::S_IFMT {
            libc::S_IFDIR => "mkdir",
            libc::S_IFLNK => "symlink",
            libc::S_IFREG => "mkfile",
            _ => "mknod",
        };
        let a = self
            .fs
            .create(at.dir, at.name, mode, rdev, MADE_BY, target)
            .map_err(|e| failed(what, path, e))?;
        self.kernel.entry_changed(at.dir, at.name);
        self.touched.insert(at.dir);
        // Not always MADE_BY's: a set-group-ID directory gives its group.
        let owner = Owner {
            uid: a.uid,
            gid: a.gid,
        };
        self.made = Some((path.to_vec(), owner));
        self.files += 1;
        Ok(a.ino)
    }

    fn rename(&mut self, from: &[u8], to: &[u8]) -> Result<()> {
        self.settle();
        let a = self.tree.entry(self.fs, from)?;
        let (dir, name) = (a.dir, a.name.to_vec());
        let b = self.tree.entry(self.fs, to)?;
        let r = self.fs.rename(dir, &name, b.dir, b.name, false, false);
        self.kernel.entry_changed(dir, &name);
        self.kernel.entry_changed(b.dir, b.name);
        self.touched.extend([dir, b.dir]);
        self.tree.forget();
        r.map_err(|e| failed("rename", from, e))
    }

    fn link(&mut self, path: &[u8], target: &[u8]) -> Result<()> {
        self.settle();
        let node = self.tree.node(self.fs, target)?;
        let at = self.tree.entry(self.fs, path)?;
        self.fs
            .link(node, at.dir, at.name)
            .map_err(|e| failed("link", path, e))?;
        self.kernel.entry_changed(at.dir, at.name);
        self.touched.extend([node, at.dir]);
        Ok(())
    }

    fn remove(&mut self, path: &[u8], rmdir: bool) -> Result<()> {
        self.settle();
        let at = self.tree.entry(self.fs, path)?;
        let r = self.fs.remove(at.dir, at.name, rmdir);
        self.kernel.entry_changed(at.dir, at.name);
        self.touched.insert(at.dir);
        self.tree.forget();
        r.map_err(|e| failed("remove", path, e))
    }

    fn apply_data(&mut self, c: Command, find: &mut FindSource<'_>) -> Result<()> {
        match c {
            Command::Write { path, offset, data } => self.write(&path, offset, &data),
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_path,
                clone_offset,
                ..
            } => {
                let root = match clone_uuid == self.uuid {
                    true => self.tree.root(),
                    false => find(&clone_uuid)?,
                };
                let src = clone_source(self.fs, root, &clone_path)?;
                let dst = self.file(&path)?;
                self.copy(src, clone_offset, dst, offset, len)
                    .map_err(|e| failed("clone", &path, e))
            }
            Command::Truncate { path, size } => {
                let node = self.file(&path)?;
                let s = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                self.setattr(node, &s, ("truncate", &path))
            }
            Command::Fallocate {
                path,
                mode,
                offset,
                size,
            } => {
                let node = self.file(&path)?;
                self.fs
                    .fallocate(node, offset, size, mode as i32)
                    .map_err(|e| failed("fallocate", &path, e))
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
                    return Err(Error::Invalid(
                        "encrypted data in the stream is not supported".into(),
                    ));
                }
                let plain = decode_encoded(compression, &data, unencoded_len)?;
                let from = usize::try_from(unencoded_offset)
                    .unwrap_or(usize::MAX)
                    .min(plain.len());
                let to = from
                    .saturating_add(usize::try_from(unencoded_file_len).unwrap_or(usize::MAX))
                    .min(plain.len());
                self.write(&path, offset, &plain[from..to])
            }
            c => self.apply_attr(c),
        }
    }

    fn write(&mut self, path: &[u8], mut offset: u64, mut data: &[u8]) -> Result<()> {
        let node = self.file(path)?;
        while !data.is_empty() {
            let n = self
                .fs
                .write(node, offset, data)
                .map_err(|e| failed("write", path, e))?;
            if n == 0 {
                return Err(Error::Invalid(format!(
                    "write {}: wrote nothing",
                    shown(path)
                )));
            }
            data = &data[(n as usize).min(data.len())..];
            offset += u64::from(n);
        }
        Ok(())
    }

    /// Shares (or copies) `len` bytes of `src` into `dst`, as
    /// copy_file_range does through the mount.
    fn copy(&self, src: u64, mut from: u64, dst: u64, mut to: u64, mut len: u64) -> Result<()> {
        while len > 0 {
            let n = self.fs.copy_range(src, from, dst, to, len)?;
            if n == 0 {
                return Err(Error::Invalid("the source ends before the range".into()));
            }
            from += n;
            to += n;
            len = len.saturating_sub(n);
        }
        Ok(())
    }

    fn apply_attr(&mut self, c: Command) -> Result<()> {
        match c {
            Command::SetXattr { path, name, data } => {
                let (node, _) = self.attr_node(&path)?;
                self.fs
                    .setxattr(node, &name, &data, 0)
                    .map_err(|e| failed("setxattr", &path, e))
            }
            Command::RemoveXattr { path, name } => {
                let (node, _) = self.attr_node(&path)?;
                self.fs
                    .removexattr(node, &name)
                    .map_err(|e| failed("removexattr", &path, e))
            }
            Command::Chown { path, uid, gid } => {
                let owner = Owner {
                    uid: u32::try_from(uid).map_err(|_| bad_id(&path))?,
                    gid: u32::try_from(gid).map_err(|_| bad_id(&path))?,
                };
                if self
                    .made
                    .as_ref()
                    .is_some_and(|(p, o)| p == &path && *o == owner)
                {
                    return Ok(());
                }
                let s = SetAttr {
                    uid: Some(owner.uid),
                    gid: Some(owner.gid),
                    ..SetAttr::default()
                };
                self.set(&path, &s, "chown")
            }
            Command::Chmod { path, mode } => {
                let (node, kind) = self.attr_node(&path)?;
                // A symlink has no mode of its own to change.
                if kind == libc::S_IFLNK {
                    return Ok(());
                }
                let s = SetAttr {
                    mode: Some(mode as u32 & 0o7777),
                    ..SetAttr::default()
                };
                self.setattr(node, &s, ("chmod", &path))
            }
            Command::Utimes {
                path, atime, mtime, ..
            } => {
                let s = SetAttr {
                    atime: Some(time(atime)),
                    mtime: Some(time(mtime)),
                    ..SetAttr::default()
                };
                self.set(&path, &s, "utimes")
            }
            // Ranges a --no-data stream changed, and inode flags: nothing
            // to do with them here (btrfs receive ignores them too).
            Command::UpdateExtent { .. } | Command::Fileattr { .. } | Command::End => Ok(()),
            Command::Subvol { .. } | Command::Snapshot { .. } => Err(Error::Invalid(
                "a subvolume command inside a stream's subvolume".into(),
            )),
            c => Err(Error::Invalid(format!("unexpected {} command", c.name()))),
        }
    }

    /// The node of `path` for an attribute change and its file type,
    /// noted as changed.
    fn attr_node(&mut self, path: &[u8]) -> Result<(u64, u32)> {
        let (node, kind) = match &self.file {
            Some((p, node)) if p == path => (*node, libc::S_IFREG),
            _ => {
                let a = self.tree.attr(self.fs, path)?;
                (a.ino, a.mode & libc::S_IFMT)
            }
        };
        self.touched.insert(node);
        Ok((node, kind))
    }

    fn set(&mut self, path: &[u8], s: &SetAttr, what: &str) -> Result<()> {
        let (node, _) = self.attr_node(path)?;
        self.setattr(node, s, (what, path))
    }

    /// `s` onto `node`; an error names the command and its path.
    fn setattr(&self, node: u64, s: &SetAttr, (what, path): (&str, &[u8])) -> Result<()> {
        self.fs
            .setattr(node, s)
            .map(drop)
            .map_err(|e| failed(what, path, e))
    }
}

fn bad_id(path: &[u8]) -> Error {
    Error::Invalid(format!("chown {}: an owner past 2^32", shown(path)))
}

/// The regular file `path` beneath the subvolume root `root`.
fn clone_source(fs: &Fs, root: u64, path: &[u8]) -> Result<u64> {
    let a = Tree::new(root)
        .attr(fs, path)
        .map_err(|e| Error::Invalid(format!("the source of a clone: {e}")))?;
    match a.mode & libc::S_IFMT {
        libc::S_IFREG => Ok(a.ino),
        _ => Err(Error::Invalid(format!(
            "the source of a clone, {}, is not a regular file",
            shown(path)
        ))),
    }
}

/// Data `btrfs send --compressed-data` sent as it lies on disk.
fn decode_encoded(compression: u32, data: &[u8], unencoded_len: u64) -> Result<Vec<u8>> {
    const NONE: u32 = 0;
    const ZSTD: u32 = 2;
    let cap = usize::try_from(unencoded_len)
        .unwrap_or(usize::MAX)
        .min(crate::stream::MAX_COMMAND * 4);
    match compression {
        NONE => Ok(data.to_vec()),
        ZSTD => {
            let mut out = Vec::with_capacity(cap);
            let d = zstd::stream::read::Decoder::new(data)
                .map_err(|e| Error::Invalid(format!("encoded data: {e}")))?;
            std::io::Read::read_to_end(&mut std::io::Read::take(d, cap as u64), &mut out)
                .map_err(|e| Error::Invalid(format!("encoded data: {e}")))?;
            Ok(out)
        }
        c => Err(Error::Invalid(format!(
            "encoded data compressed with type {c} (zlib or lzo) is not supported; send without --compressed-data"
        ))),
    }
}
