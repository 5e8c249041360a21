//! Answers the kernel's requests with [`crate::fs::Fs`] calls. Requests
//! are served on several threads (or rings), so a long read or fsync
//! does not stall a `stat`.

use super::caller::Caller;
use super::convert::{err, file_attr, new_node, owner, reply_empty, reply_xattr, setattr};
use super::notify::Notifier;
use super::proto::{fopen, init};
use super::reply::{self, Reply};
use super::request::{self, Header, Op};
use super::session::Handler;
use crate::fs::{attrs, setid, AccessAtOpen, Attr, Fs};
use std::sync::Arc;
use std::time::Duration;

/// Canopy is the only writer of its image, so the kernel may cache long.
pub(super) const TTL: Duration = Duration::from_secs(60);
/// How opened files are cached. Every change to file data passes through
/// the kernel (write, truncate, fallocate and copy_file_range all drop or
/// update the pages they touch), so the page cache of a file stays valid
/// from one open to the next; without KEEP_CACHE each open would throw it
/// away and read everything again through the daemon.
const OPEN_FLAGS: u32 = fopen::KEEP_CACHE;
/// Entries read per directory listing request (the kernel's buffer
/// takes a getdents' worth; what does not fit is read again next time).
pub(super) const CHUNK: usize = 512;
/// Entries with attributes read at a time while filling a READDIRPLUS
/// reply.
pub(super) const PLUS_CHUNK: usize = 48;

pub struct FuseFs {
    pub(super) fs: Arc<Fs>,
    /// Node id of the mount's root directory (FUSE's node 1).
    root: u64,
    /// The kernel's writeback cache: asked for at init, and on if the
    /// kernel agreed.
    writeback_cache: bool,
    /// Set-id bits are Canopy's to clear (`HANDLE_KILLPRIV_V2`, see
    /// `fs::setid`), if the kernel agreed at init.
    killpriv: bool,
    /// Tells the kernel of changes it did not ask for.
    notifier: Notifier,
    /// The kernel opens directories without asking, once told ENOSYS
    /// (if it can).
    zero_opendir: bool,
    /// Where the agreed writeback cache is reported (`fuse::bdi`).
    kernel: Arc<super::bdi::KernelSide>,
}

impl FuseFs {
    pub fn new(
        fs: Arc<Fs>,
        writeback_cache: bool,
        notifier: Notifier,
        kernel: Arc<super::bdi::KernelSide>,
    ) -> FuseFs {
        FuseFs {
            root: fs.root_node(),
            fs,
            writeback_cache,
            killpriv: false,
            notifier,
            zero_opendir: false,
            kernel,
        }
    }

    /// The INIT flags Canopy asks for among those the kernel `offered`;
    /// settles what depends on the answer.
    fn init_flags(&mut self, offered: u64) -> u64 {
        let mut want = init::DONT_MASK | init::EXPORT_SUPPORT | init::DO_READDIRPLUS;
        // strictatime opens bypass the page cache (`open_flags`); this
        // keeps shared mmap of such files working (Linux 6.6 and later).
        want |= init::DIRECT_IO_ALLOW_MMAP;
        // Without it the kernel asks for security.capability before every
        // write: one more round trip per write.
        want |= init::HANDLE_KILLPRIV_V2;
        // The kernel enforces and caches POSIX ACLs; Canopy keeps them in
        // step with the mode (`fs::acl`). The umask comes with each create
        // unapplied (DONT_MASK), since a default ACL replaces it.
        want |= init::POSIX_ACL;
        // Directories are opened without asking once told ENOSYS.
        want |= init::NO_OPENDIR_SUPPORT;
        // Symlink targets stay in the page cache: a target never changes
        // in place, and every replacement comes through this mount.
        want |= init::CACHE_SYMLINKS;
        if self.writeback_cache {
            want |= init::WRITEBACK_CACHE;
        }
        let agreed = want & offered;
        if self.writeback_cache && agreed & init::WRITEBACK_CACHE == 0 {
            tracing::warn!("the kernel has no FUSE writeback cache; writes go through");
            self.writeback_cache = false;
        }
        if agreed & init::POSIX_ACL == 0 {
            tracing::warn!("the kernel does not enforce POSIX ACLs on FUSE; they are kept only");
        }
        self.kernel
            .writeback_cache
            .store(self.writeback_cache, std::sync::atomic::Ordering::Relaxed);
        self.killpriv = agreed & init::HANDLE_KILLPRIV_V2 != 0;
        self.zero_opendir = agreed & init::NO_OPENDIR_SUPPORT != 0;
        // Listings always carry attributes (DO_READDIRPLUS): find, du,
        // tar and rm -rf then look nothing up, where the kernel's
        // automatic choice would list all but the first chunk plainly and
        // look up each subdirectory. File handles (EXPORT_SUPPORT): node
        // ids stay valid after the kernel forgets them.
        agreed
    }

    /// The filesystem's last commit when the kernel ends the session.
    fn destroy(&self) -> Reply {
        // Unmounted while frozen: the last commit must not wait for a
        // thaw nobody will send.
        if self.fs.engine().frozen_for().is_some() && self.fs.engine().thaw().is_ok() {
            tracing::warn!("unmounted while frozen: thawed");
        }
        match self.fs.sync() {
            Ok(()) | Err(crate::Error::ReadOnly) => {}
            Err(e) => tracing::error!(error = %e, "final commit failed"),
        }
        Reply::empty()
    }

    /// File data or size of `ino` changed by `caller`: its set-id bits go
    /// unless the caller holds CAP_FSETID. `replied_attrs`: the reply
    /// carries the new mode to the kernel; otherwise the kernel is told
    /// its cached attributes are stale.
    fn changed_by(&self, caller: &Caller, ino: u64, replied_attrs: bool) -> crate::Result<()> {
        self.changed(caller, ino, replied_attrs, false)
    }

    /// [`FuseFs::changed_by`]; `flagged`: the kernel said the caller
    /// lacks CAP_FSETID (a write it flagged), so it is not asked again.
    fn changed(
        &self,
        caller: &Caller,
        ino: u64,
        replied_attrs: bool,
        flagged: bool,
    ) -> crate::Result<()> {
        if !self.killpriv {
            return Ok(());
        }
        let cleared = self.fs.clear_set_id(ino, |mode, gid| {
            if !flagged && caller.may_keep_set_id() {
                return 0;
            }
            setid::bits_to_clear(mode, || caller.in_group(gid))
        })?;
        if cleared && !replied_attrs {
            // Attributes only (offset -1): no page is touched, so this
            // cannot wait on the pages the request itself holds.
            if let Err(e) = self.notifier.inval_inode(self.kernel_node(ino), -1, 0) {
                tracing::warn!(ino, error = %e, "could not tell the kernel of a mode change");
            }
        }
        Ok(())
    }

    /// `ino` was given a new owner or group by `caller`: its set-user-ID
    /// bit goes whoever the caller is.
    fn chowned_by(&self, caller: &Caller, ino: u64) -> crate::Result<()> {
        if !self.killpriv {
            return Ok(());
        }
        self.fs
            .clear_set_id(ino, |mode, gid| {
                setid::bits_to_clear(mode, || caller.may_keep_set_id() || caller.in_group(gid))
            })
            .map(|_| ())
    }

    /// The node id `fs` knows for kernel node `i`: FUSE's root (1) is the
    /// root directory of the subvolume the mount shows.
    pub(super) fn to_ino(&self, i: u64) -> u64 {
        if i == 1 {
            self.root
        } else {
            i
        }
    }

    pub(super) fn kernel_node(&self, i: u64) -> u64 {
        if i == self.root {
            1
        } else {
            i
        }
    }

    pub(super) fn attr(&self, a: &Attr) -> reply::FileAttr {
        file_attr(a, self.kernel_node(a.ino))
    }

    fn entry(&self, r: crate::Result<Attr>) -> Reply {
        match r {
            Ok(a) => reply::entry(&self.attr(&a), a.generation(), TTL),
            Err(e) => Reply::Error(err(e)),
        }
    }

    fn attr_reply(&self, r: crate::Result<Attr>) -> Reply {
        match r {
            Ok(a) => reply::attr_reply(&self.attr(&a), TTL),
            Err(e) => Reply::Error(err(e)),
        }
    }

    /// How an open file is cached. Under `strictatime` every read must
    /// reach the daemon, which records the access (the kernel does not
    /// for FUSE, and serves cached pages itself): such files bypass the
    /// page cache (shared mmap still works where the kernel allows it,
    /// `FUSE_DIRECT_IO_ALLOW_MMAP`). Under `relatime` an open whose
    /// access is due drops the cached pages instead (see `open`).
    fn open_flags(&self) -> u32 {
        match self.fs.atime_policy() {
            crate::fs::AtimePolicy::Strict => fopen::DIRECT_IO,
            _ => OPEN_FLAGS,
        }
    }
}

impl Handler for FuseFs {
    fn init(&mut self, offered: u64) -> u64 {
        self.init_flags(offered)
    }

    fn panicked(&self) {
        // The last commit is safe; what the request was changing may be
        // half done, so nothing more is committed.
        self.fs
            .engine()
            .shut_down("a request's handler panicked (see the log)");
    }

    fn handle_into(&self, h: &Header, op: Op<'_>, buf: &mut [u8]) -> Reply {
        match op {
            Op::Read { offset, size } if size as usize <= buf.len() => {
                let out = &mut buf[..size as usize];
                match self.fs.read_into(self.to_ino(h.nodeid), offset, out) {
                    Ok(n) => Reply::Placed(n),
                    Err(e) => Reply::Error(err(e)),
                }
            }
            op => self.handle(h, op),
        }
    }

    fn handle(&self, h: &Header, op: Op<'_>) -> Reply {
        let ino = self.to_ino(h.nodeid);
        match op {
            Op::Lookup { name } => self.lookup(ino, name),
            Op::Forget { .. } => {
                self.fs.forget(ino);
                Reply::Nothing
            }
            Op::BatchForget { nodes } => {
                for (node, _) in request::forgotten(nodes) {
                    self.fs.forget(self.to_ino(node));
                }
                Reply::Nothing
            }
            Op::Getattr => self.attr_reply(self.fs.getattr(ino)),
            Op::Setattr(s) => self.setattr(h, ino, &s),
            Op::Readlink => match self.fs.readlink(ino) {
                Ok(d) => Reply::Data(d),
                Err(e) => Reply::Error(err(e)),
            },
            Op::Mknod {
                mode,
                rdev,
                umask,
                name,
            } => self.entry(
                self.fs
                    .make(ino, name, &new_node(h, mode, rdev.into(), umask)),
            ),
            Op::Mkdir { mode, umask, name } => {
                let how = new_node(h, libc::S_IFDIR | (mode & 0o7777), 0, umask);
                self.entry(self.fs.make(ino, name, &how))
            }
            Op::Unlink { name } => reply_empty(self.fs.remove(ino, name, false)),
            Op::Rmdir { name } => reply_empty(self.fs.remove(ino, name, true)),
            Op::Symlink { name, target } => {
                let mode = libc::S_IFLNK | 0o777;
                self.entry(self.fs.create(ino, name, mode, 0, owner(h), Some(target)))
            }
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => self.rename(h, (ino, name), (self.to_ino(newdir), newname), flags),
            Op::Link { oldnode, newname } => {
                self.entry(self.fs.link(self.to_ino(oldnode), ino, newname))
            }
            Op::Statfs => self.statfs(),
            Op::Destroy => self.destroy(),
            op => self.handle_file(h, ino, op),
        }
    }
}

impl FuseFs {
    /// The requests on open files, directories' contents and xattrs.
    fn handle_file(&self, h: &Header, ino: u64, op: Op<'_>) -> Reply {
        match op {
            Op::Open { flags } => self.open(ino, flags),
            Op::Create {
                mode, umask, name, ..
            } => self.create(h, ino, mode, umask, name),
            Op::Tmpfile { mode, umask } => self.tmpfile(h, ino, mode, umask),
            Op::Release | Op::Releasedir => reply_empty(self.fs.release(ino)),
            Op::Read { offset, size } => match self.fs.read(ino, offset, size) {
                Ok(d) => Reply::Data(d),
                Err(e) => Reply::Error(err(e)),
            },
            Op::Write {
                offset,
                write_flags,
                data,
            } => self.write(h, ino, offset, write_flags, data),
            // Nothing to do at close: data reaches the tree at fsync,
            // commit or under memory pressure, and locks are the kernel's.
            // ENOSYS tells the kernel so once, and it sends no FLUSH again
            // (a round trip saved on every close; under the writeback
            // cache it still writes dirty pages back first).
            Op::Flush => Reply::Error(libc::ENOSYS),
            Op::Fsync { datasync } => reply_empty(self.fs.fsync_as(ino, datasync, h.pid)),
            Op::Fsyncdir => reply_empty(self.fs.fsync_as(ino, false, h.pid)),
            // Nothing is kept per open directory (see `dircookie`):
            // ENOSYS tells the kernel so, and it opens and releases
            // directories without asking again.
            Op::Opendir if self.zero_opendir => Reply::Error(libc::ENOSYS),
            Op::Opendir => reply::open(0, 0),
            Op::Readdir {
                offset,
                size,
                plus: false,
            } => self.list(ino, offset, size),
            Op::Readdir { offset, size, .. } => self.list_plus(ino, offset, size),
            Op::Setxattr { flags, name, value } => self.setxattr(h, ino, name, value, flags),
            Op::Getxattr { size, name } => reply_xattr(self.fs.getxattr(ino, name), size),
            Op::Listxattr { size } => reply_xattr(self.fs.listxattr(ino), size),
            Op::Removexattr { name } => reply_empty(self.fs.removexattr(ino, name)),
            Op::Lseek { offset, whence } => self.lseek(ino, offset, whence),
            Op::Ioctl {
                cmd,
                in_data,
                out_size: _,
            } => self.ioctl(ino, cmd, in_data),
            Op::Fallocate {
                offset,
                length,
                mode,
            } => self.fallocate(h, ino, (offset, length), mode),
            Op::CopyFileRange {
                off_in,
                node_out,
                off_out,
                len,
                wide,
            } => self.copy_range(
                h,
                (ino, off_in),
                (self.to_ino(node_out), off_out),
                len,
                wide,
            ),
            // Interrupts are not honoured: every request runs to its end,
            // and ENOSYS tells the kernel not to send them again.
            _ => Reply::Error(libc::ENOSYS),
        }
    }

    /// A name that is not there is answered as an entry with inode 0,
    /// which the kernel caches (a negative dentry) for the TTL like a
    /// positive one, instead of asking again on every open or stat of it.
    /// Safe for the same reason positive entries are: every change comes
    /// through this mount, and the kernel drops the negative entry when
    /// it creates the name.
    fn lookup(&self, parent: u64, name: &[u8]) -> Reply {
        // Nothing above the mount's root is shown (a subvolume mounted
        // with subvol=).
        if parent == self.root && name == b".." {
            return self.entry(self.fs.getattr(parent));
        }
        match self.fs.lookup(parent, name) {
            Err(e) if e.errno() == libc::ENOENT => {
                reply::entry(&reply::FileAttr::default(), 0, TTL)
            }
            r => self.entry(r),
        }
    }

    fn setattr(&self, h: &Header, ino: u64, s: &request::SetattrIn) -> Reply {
        let s = setattr(s);
        let caller = Caller::of(h);
        let cleared = if s.uid.is_some() || s.gid.is_some() {
            self.chowned_by(&caller, ino)
        } else if s.size.is_some() {
            self.changed_by(&caller, ino, true)
        } else {
            Ok(())
        };
        self.attr_reply(cleared.and_then(|()| self.fs.setattr(ino, &s)))
    }

    fn rename(&self, h: &Header, from: (u64, &[u8]), to: (u64, &[u8]), flags: u32) -> Reply {
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 || (exchange && noreplace) {
            return Reply::Error(libc::EINVAL);
        }
        if flags & libc::RENAME_WHITEOUT != 0 {
            return reply_empty(self.fs.rename_whiteout(from, to, noreplace, owner(h)));
        }
        reply_empty(
            self.fs
                .rename(from.0, from.1, to.0, to.1, noreplace, exchange),
        )
    }

    fn open(&self, ino: u64, flags: u32) -> Reply {
        let flags = flags as i32;
        // A file of a read-only subvolume cannot be opened for writing
        // (or truncated by open), as on btrfs.
        let writing = flags & (libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC) != 0;
        let opened = match writing {
            true => self.fs.open_for_writing(ino, flags),
            false => {
                self.fs.open(ino);
                Ok(())
            }
        };
        if let Err(e) = opened {
            return Reply::Error(err(e));
        }
        let reading = flags & libc::O_ACCMODE != libc::O_WRONLY;
        let how = match self.open_flags() {
            // The kernel would serve the read from its cached pages and
            // the access that is due would go unrecorded.
            OPEN_FLAGS if reading => match self.fs.access_at_open(ino) {
                AccessAtOpen::NotDue => OPEN_FLAGS,
                // Recorded: the kernel's cached atime is stale
                // (attributes only: offset -1 touches no page).
                AccessAtOpen::Recorded => {
                    let node = self.kernel_node(ino);
                    if let Err(e) = self.notifier.inval_inode(node, -1, 0) {
                        tracing::debug!(ino, error = %e, "atime invalidation");
                    }
                    OPEN_FLAGS
                }
                // Nothing cached to keep: the read comes here.
                AccessAtOpen::LeftToRead => 0,
            },
            f => f,
        };
        reply::open(0, how)
    }

    fn create(&self, h: &Header, parent: u64, mode: u32, umask: u32, name: &[u8]) -> Reply {
        let how = new_node(h, libc::S_IFREG | (mode & 0o7777), 0, umask);
        match self.fs.make(parent, name, &how) {
            Ok(a) => {
                self.fs.open(a.ino);
                reply::create(&self.attr(&a), a.generation(), TTL, 0, self.open_flags())
            }
            Err(e) => Reply::Error(err(e)),
        }
    }

    /// O_TMPFILE: an open file with no name, deleted at its last close
    /// unless `linkat` names it first.
    fn tmpfile(&self, h: &Header, parent: u64, mode: u32, umask: u32) -> Reply {
        let how = new_node(h, libc::S_IFREG | (mode & 0o7777), 0, umask);
        match self.fs.make_unnamed(parent, &how) {
            Ok(a) => reply::create(&self.attr(&a), a.generation(), TTL, 0, self.open_flags()),
            Err(e) => Reply::Error(err(e)),
        }
    }

    fn write(&self, h: &Header, ino: u64, offset: u64, flags: u32, data: &[u8]) -> Reply {
        // The kernel flags writes by callers without CAP_FSETID.
        if flags & super::proto::WRITE_KILL_SUIDGID != 0 {
            if let Err(e) = self.changed(&Caller::of(h), ino, false, true) {
                return Reply::Error(err(e));
            }
        }
        let written = match flags & super::proto::WRITE_CACHE != 0 {
            true => self.fs.write_back(ino, offset, data),
            false => self.fs.write(ino, offset, data),
        };
        match written {
            Ok(n) => reply::written(n),
            Err(e) => Reply::Error(err(e)),
        }
    }

    fn statfs(&self) -> Reply {
        let st = self.fs.statfs();
        reply::statfs(&reply::Statfs {
            blocks: st.blocks,
            bfree: st.free,
            bavail: st.avail,
            files: st.files + st.avail,
            ffree: st.avail,
            bsize: 4096,
            namelen: crate::fs::NAME_MAX as u32,
            frsize: 4096,
        })
    }

    fn setxattr(&self, h: &Header, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Reply {
        let caller = Caller::of(h);
        // An access ACL sets the mode; set-group-ID stays only for a
        // caller in the file's group or holding CAP_FSETID.
        let may_keep_sgid = |gid| caller.in_group(gid) || caller.may_keep_set_id();
        reply_empty(
            self.fs
                .setxattr_by(ino, (name, value), flags as i32, &may_keep_sgid),
        )
    }

    fn lseek(&self, ino: u64, offset: i64, whence: u32) -> Reply {
        if self.writeback_cache {
            // The kernel sends lseek without writing its dirty pages back
            // first, so Canopy cannot see all the data; ENOSYS makes the
            // kernel answer itself, treating the whole file as data.
            return Reply::Error(libc::ENOSYS);
        }
        let data = match whence as i32 {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Reply::Error(libc::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return Reply::Error(libc::ENXIO);
        };
        match self.fs.seek(ino, offset, data) {
            Ok(at) => reply::lseek(at),
            Err(e) => Reply::Error(err(e)),
        }
    }

    fn fallocate(&self, h: &Header, ino: u64, (offset, length): (u64, u64), mode: u32) -> Reply {
        let done = self
            .changed_by(&Caller::of(h), ino, false)
            .and_then(|()| self.fs.fallocate(ino, offset, length, mode as i32));
        reply_empty(done)
    }

    fn copy_range(
        &self,
        h: &Header,
        from: (u64, u64),
        to: (u64, u64),
        len: u64,
        wide: bool,
    ) -> Reply {
        let done = self
            .changed_by(&Caller::of(h), to.0, false)
            .and_then(|()| self.fs.copy_range(from.0, from.1, to.0, to.1, len));
        match done {
            Ok(n) if wide => reply::copied(n),
            Ok(n) => reply::written(n.min(u64::from(u32::MAX)) as u32),
            Err(e) => Reply::Error(err(e)),
        }
    }
}

impl FuseFs {
    /// File attributes (`lsattr`/`chattr`, and the fsxattr form `xfs_io`
    /// and the kernel use: see `fs::attrs`). Other ioctls are not ours
    /// (ENOTTY, as a kernel filesystem answers them), quietly: programs
    /// probe for them all the time.
    fn ioctl(&self, ino: u64, cmd: u32, in_data: &[u8]) -> Reply {
        const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
        const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
        // struct fsxattr: xflags, extsize, nextents, projid, cowextsize
        // (u32 each), 8 bytes of padding.
        const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
        const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
        let u32_at = |at: usize| {
            in_data
                .get(at..at + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        let done = match cmd {
            FS_IOC_GETFLAGS => self.fs.file_flags(ino).map(|f| f.to_ne_bytes().to_vec()),
            FS_IOC_FSGETXATTR => self.fs.file_flags(ino).map(|f| {
                let mut out = vec![0u8; 28];
                out[..4].copy_from_slice(&attrs::to_xflags(f).to_ne_bytes());
                out
            }),
            // No project quotas: a project id is refused.
            FS_IOC_FSSETXATTR => match (u32_at(0), u32_at(12)) {
                (Some(x), Some(0)) => self
                    .fs
                    .file_flags(ino)
                    .and_then(|f| attrs::from_xflags(f, x))
                    .and_then(|f| self.fs.set_file_flags(ino, f))
                    .map(|()| Vec::new()),
                _ => return Reply::Error(libc::EOPNOTSUPP),
            },
            // The flags are an int, though the command's size says long.
            FS_IOC_SETFLAGS => match u32_at(0) {
                Some(f) => self.fs.set_file_flags(ino, f).map(|()| Vec::new()),
                None => return Reply::Error(libc::EINVAL),
            },
            _ => return Reply::Error(libc::ENOTTY),
        };
        match done {
            Ok(out) => reply::ioctl(0, &out),
            Err(e) => Reply::Error(err(e)),
        }
    }
}
