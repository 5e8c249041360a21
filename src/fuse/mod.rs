//! The FUSE front: translates kernel requests into [`crate::fs::Fs`] calls.
//!
//! Thin by design: no on-disk knowledge here. Node ids map one to one
//! (see `fs::node`), except that FUSE's root (1) is the root directory of
//! the subvolume the mount shows.
//! Requests are served on several threads (`fuser`'s `n_threads` with one
//! cloned fd each), so a long read or fsync does not stall a `stat`.

mod caller;
pub mod control;
mod convert;
mod dircookie;
mod listing;
pub mod mount;
mod options;

use crate::fs::{setid, Attr, Fs, SetAttr};
use caller::Caller;
use convert::{
    absent_entry, err, kind, new_node, owner, reply_empty, reply_xattr, time, time_or_now, timespec,
};
use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

/// Canopy is the only writer of its image, so the kernel may cache long.
const TTL: Duration = Duration::from_secs(60);
/// How opened files are cached. Every change to file data passes through
/// the kernel (write, truncate, fallocate and copy_file_range all drop or
/// update the pages they touch), so the page cache of a file stays valid
/// from one open to the next; without KEEP_CACHE each open would throw it
/// away and read everything again through the daemon.
const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;
/// Entries read per directory listing request (the kernel's buffer
/// takes a getdents' worth; what does not fit is read again next time).
const CHUNK: usize = 512;
/// Entries with attributes read at a time while filling a READDIRPLUS
/// reply.
const PLUS_CHUNK: usize = 48;
/// Largest write the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;

pub struct FuseFs {
    fs: Arc<Fs>,
    /// Node id of the mount's root directory (FUSE's node 1).
    root: u64,
    /// The kernel's writeback cache: asked for at init, and on if the
    /// kernel agreed.
    writeback_cache: bool,
    /// Set-id bits are Canopy's to clear (`HANDLE_KILLPRIV_V2`, see
    /// `fs::setid`), if the kernel agreed at init.
    killpriv: bool,
    /// Tells the kernel of changes it did not ask for (set after the
    /// session starts).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// The kernel opens directories without asking, once told ENOSYS
    /// (if it can).
    zero_opendir: bool,
}

impl FuseFs {
    pub fn new(fs: Arc<Fs>, writeback_cache: bool) -> FuseFs {
        FuseFs {
            root: fs.root_node(),
            fs,
            writeback_cache,
            killpriv: false,
            notifier: Arc::default(),
            zero_opendir: false,
        }
    }

    /// Where the session's notifier goes once the session exists.
    pub fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
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
            if let Some(n) = self.notifier.get() {
                if let Err(e) = n.inval_inode(self.kernel_node(ino), -1, 0) {
                    tracing::warn!(ino, error = %e, "could not tell the kernel of a mode change");
                }
            }
        }
        Ok(())
    }

    /// The node id `fs` knows for kernel node `i`: FUSE's root (1) is the
    /// root directory of the subvolume the mount shows.
    fn to_ino(&self, i: INodeNo) -> u64 {
        if i.0 == 1 {
            self.root
        } else {
            i.0
        }
    }

    fn kernel_node(&self, i: u64) -> INodeNo {
        INodeNo(if i == self.root { 1 } else { i })
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.kernel_node(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: time(a.crtime),
            kind: kind(a.mode),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            flags: 0,
            blksize: 4096,
        }
    }

    fn reply_entry(&self, r: crate::Result<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &self.file_attr(&a), Generation(a.generation())),
            Err(e) => reply.error(err(e)),
        }
    }

    /// How an open file is cached. Under `strictatime` every read must
    /// reach the daemon, which records the access (the kernel does not
    /// for FUSE, and serves cached pages itself): such files bypass the
    /// page cache (shared mmap still works where the kernel allows it,
    /// `FUSE_DIRECT_IO_ALLOW_MMAP`). Under `relatime` an open whose
    /// access is due drops the cached pages instead (see `open`).
    fn open_flags(&self) -> FopenFlags {
        match self.fs.atime_policy() {
            crate::fs::AtimePolicy::Strict => FopenFlags::FOPEN_DIRECT_IO,
            _ => OPEN_FLAGS,
        }
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
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        if self.writeback_cache
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            tracing::warn!("the kernel has no FUSE writeback cache; writes go through");
            self.writeback_cache = false;
        }
        // strictatime opens bypass the page cache (`open_flags`); this
        // keeps shared mmap of such files working (Linux 6.6 and later).
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // Without it the kernel asks for security.capability before every
        // write: one more round trip per write.
        self.killpriv = config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_ok();
        // The kernel enforces and caches POSIX ACLs; Canopy keeps them in
        // step with the mode (`fs::acl`). The umask comes with each create
        // unapplied, since a default ACL replaces it.
        if config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_err() {
            tracing::warn!("the kernel does not enforce POSIX ACLs on FUSE; they are kept only");
        }
        let _ = config.add_capabilities(InitFlags::FUSE_DONT_MASK);
        // File handles (open_by_handle_at, NFS export): node ids stay valid
        // after the kernel forgets them, and "." and ".." are looked up.
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        self.zero_opendir = config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        // Listings always carry attributes: find, du, tar and rm -rf then
        // look nothing up, where the kernel's automatic choice would list
        // all but the first chunk plainly and look up each subdirectory.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn destroy(&mut self) {
        match self.fs.sync() {
            Ok(()) | Err(crate::Error::ReadOnly) => {}
            Err(e) => tracing::error!(error = %e, "final commit failed"),
        }
    }

    /// A name that is not there is answered as an entry with inode 0, which
    /// the kernel caches (a negative dentry) for the TTL like a positive
    /// one, instead of asking again on every open or stat of it. Safe for
    /// the same reason positive entries are: every change comes through
    /// this mount, and the kernel drops the negative entry when it creates
    /// the name.
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.to_ino(parent);
        // Nothing above the mount's root is shown (a subvolume mounted
        // with subvol=).
        if parent == self.root && name.as_bytes() == b".." {
            return self.reply_entry(self.fs.getattr(parent), reply);
        }
        match self.fs.lookup(parent, name.as_bytes()) {
            Err(e) if e.errno() == libc::ENOENT => {
                reply.entry(&TTL, &absent_entry(), Generation(0));
            }
            r => self.reply_entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.fs.forget(self.to_ino(ino));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(self.to_ino(ino)) {
            Ok(a) => reply.attr(&TTL, &self.file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_or_now(atime),
            mtime: time_or_now(mtime),
            ctime: ctime.map(timespec),
        };
        let caller = Caller::of(req);
        let cleared = if s.uid.is_some() || s.gid.is_some() {
            self.chowned_by(&caller, self.to_ino(ino))
        } else if s.size.is_some() {
            self.changed_by(&caller, self.to_ino(ino), true)
        } else {
            Ok(())
        };
        match cleared.and_then(|()| self.fs.setattr(self.to_ino(ino), &s)) {
            Ok(a) => reply.attr(&TTL, &self.file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(self.to_ino(ino)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let how = new_node(req, mode, u64::from(rdev), umask);
        self.reply_entry(
            self.fs.make(self.to_ino(parent), name.as_bytes(), &how),
            reply,
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let how = new_node(req, libc::S_IFDIR | (mode & 0o7777), 0, umask);
        self.reply_entry(
            self.fs.make(self.to_ino(parent), name.as_bytes(), &how),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            self.fs.remove(self.to_ino(parent), name.as_bytes(), false),
            reply,
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            self.fs.remove(self.to_ino(parent), name.as_bytes(), true),
            reply,
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let t = target.as_os_str().as_bytes();
        let mode = libc::S_IFLNK | 0o777;
        self.reply_entry(
            self.fs.create(
                self.to_ino(parent),
                link_name.as_bytes(),
                mode,
                0,
                owner(req),
                Some(t),
            ),
            reply,
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let known = RenameFlags::RENAME_NOREPLACE
            | RenameFlags::RENAME_EXCHANGE
            | RenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) || (exchange && noreplace) {
            return reply.error(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            let r = self.fs.rename_whiteout(
                (self.to_ino(parent), name.as_bytes()),
                (self.to_ino(newparent), newname.as_bytes()),
                noreplace,
                owner(req),
            );
            return reply_empty(r, reply);
        }
        let r = self.fs.rename(
            self.to_ino(parent),
            name.as_bytes(),
            self.to_ino(newparent),
            newname.as_bytes(),
            noreplace,
            exchange,
        );
        reply_empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(
            self.fs
                .link(self.to_ino(ino), self.to_ino(newparent), newname.as_bytes()),
            reply,
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.to_ino(ino);
        // A file of a read-only subvolume cannot be opened for writing
        // (or truncated by open), as on btrfs.
        let writing = flags.0 & (libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC) != 0;
        if writing {
            if let Err(e) = self.fs.check_writable(ino) {
                return reply.error(err(e));
            }
        }
        self.fs.open(ino);
        let reading = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
        let flags = match self.open_flags() {
            // The kernel would serve the read from its cached pages and
            // the access that is due would go unrecorded: drop them (the
            // read that comes here records it).
            OPEN_FLAGS if reading && self.fs.access_due_at_open(ino) => FopenFlags::empty(),
            f => f,
        };
        reply.opened(FileHandle(0), flags);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.fs.release(self.to_ino(ino)), reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(self.to_ino(ino), offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel flags writes by callers without CAP_FSETID.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.changed(&Caller::of(req), self.to_ino(ino), false, true) {
                return reply.error(err(e));
            }
        }
        match self.fs.write(self.to_ino(ino), offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Nothing to do at close: data reaches the tree at fsync, commit or
    /// under memory pressure, and locks are the kernel's. ENOSYS tells the
    /// kernel so once, and it sends no FLUSH again (a round trip saved on
    /// every close; under the writeback cache it still writes dirty pages
    /// back first).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.fs.fsync(self.to_ino(ino)), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.fs.fsync(self.to_ino(ino)), reply);
    }

    /// Nothing is kept per open directory (see `dircookie`): ENOSYS tells
    /// the kernel so, and it opens and releases directories without
    /// asking again.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.zero_opendir {
            return reply.error(Errno::ENOSYS);
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.list(self.to_ino(ino), offset, reply);
    }

    /// Entries with their attributes: the kernel caches both, so `ls -l`,
    /// find and du make no lookup per entry.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list_plus(self.to_ino(ino), offset, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.fs.statfs();
        reply.statfs(
            st.blocks,
            st.free,
            st.avail,
            st.files + st.avail,
            st.avail,
            4096,
            crate::fs::NAME_MAX as u32,
            4096,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let how = new_node(req, libc::S_IFREG | (mode & 0o7777), 0, umask);
        match self.fs.make(self.to_ino(parent), name.as_bytes(), &how) {
            Ok(a) => {
                self.fs.open(a.ino);
                let attr = self.file_attr(&a);
                let generation = Generation(a.generation());
                reply.created(&TTL, &attr, generation, FileHandle(0), self.open_flags())
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let caller = Caller::of(req);
        // An access ACL sets the mode; set-group-ID stays only for a
        // caller in the file's group or holding CAP_FSETID.
        let may_keep_sgid = |gid| caller.in_group(gid) || caller.may_keep_set_id();
        reply_empty(
            self.fs.setxattr_by(
                self.to_ino(ino),
                (name.as_bytes(), value),
                flags,
                &may_keep_sgid,
            ),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(
            self.fs.getxattr(self.to_ino(ino), name.as_bytes()),
            size,
            reply,
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(self.fs.listxattr(self.to_ino(ino)), size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            self.fs.removexattr(self.to_ino(ino), name.as_bytes()),
            reply,
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if self.writeback_cache {
            // The kernel sends lseek without writing its dirty pages back
            // first, so Canopy cannot see all the data; ENOSYS makes the
            // kernel answer itself, treating the whole file as data.
            return reply.error(Errno::ENOSYS);
        }
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(self.to_ino(ino), offset, data) {
            Ok(at) => reply.offset(at as i64),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Inode flags (`lsattr`/`chattr`, and the fsxattr form the kernel
    /// reads before changing them): Canopy keeps none, so it reports none
    /// and accepts only clearing them all. Other ioctls are not ours
    /// (ENOTTY, as a kernel filesystem answers them), quietly: programs
    /// probe for them all the time.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
        const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
        // struct fsxattr: xflags, extsize, nextents, projid, cowextsize
        // (u32 each), 8 bytes of padding.
        const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
        const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
        let u32_at = |at: usize| in_data.get(at..at + 4).map(|b| [b[0], b[1], b[2], b[3]]);
        match cmd {
            FS_IOC_GETFLAGS => reply.ioctl(0, &0u32.to_ne_bytes()),
            FS_IOC_FSGETXATTR => reply.ioctl(0, &[0; 28]),
            FS_IOC_FSSETXATTR if u32_at(0) == Some([0; 4]) && u32_at(12) == Some([0; 4]) => {
                reply.ioctl(0, &[])
            }
            FS_IOC_FSSETXATTR => reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
            // The flags are an int, though the command's size says long.
            FS_IOC_SETFLAGS if u32_at(0) == Some([0; 4]) => reply.ioctl(0, &[]),
            FS_IOC_SETFLAGS => reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
            _ => reply.error(Errno::from_i32(libc::ENOTTY)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = self
            .changed_by(&Caller::of(req), self.to_ino(ino), false)
            .and_then(|()| self.fs.fallocate(self.to_ino(ino), offset, length, mode));
        reply_empty(done, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let done = self
            .changed_by(&Caller::of(req), self.to_ino(ino_out), false)
            .and_then(|()| {
                self.fs.copy_range(
                    self.to_ino(ino_in),
                    offset_in,
                    self.to_ino(ino_out),
                    offset_out,
                    len,
                )
            });
        match done {
            Ok(n) => reply.written(n.min(u64::from(u32::MAX)) as u32),
            Err(e) => reply.error(err(e)),
        }
    }
}
