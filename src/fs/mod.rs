//! POSIX semantics on top of the engine: inodes, directories, files.
//!
//! This layer knows no FUSE types: the `fuse` front translates requests into
//! these calls, so the semantics can be tested without a mount. Every call
//! runs in one engine transaction (joined, not committed); durability comes
//! from [`Fs::sync`] (fsync, unmount) and the periodic commit the daemon
//! runs (the kernel does not pass syncfs on to FUSE daemons).
//!
//! Items of an fs tree (see docs/architecture.md):
//! - `(ino, INODE_ITEM, 0)`: attributes;
//! - `(dir, DIR_ITEM, crc32c(name))`: entries by name, for O(log n) lookup;
//! - `(dir, DIR_INDEX, index)`: the same entries by creation order, for
//!   readdir with stable offsets (an entry's offset is its index + 1);
//! - `(ino, EXTENT_DATA, file offset)`: file data, inline or in extents;
//! - `(CSUM_OBJECTID, EXTENT_CSUM, disk bytenr)` in the checksum tree:
//!   crc32c of every data sector.
//!
//! Symlink targets are stored as the inline data of the link.

mod atime;
pub mod delalloc;
mod dir;
mod file;
mod ghost;
mod inodes;
pub(crate) mod log;
pub(crate) mod ops;
mod rangeset;
mod readahead;
pub mod setid;
pub mod xattr;

pub use atime::AtimePolicy;
pub use ops::{Attr, DirListing, Owner, SetAttr, StatFs};

use crate::error::{Error, Result};
use crate::format::inode::{InodeItem, ROOT_DIR_INO};
use crate::format::key_type::INODE_ITEM;
use crate::format::tree_id::FS;
use crate::format::Key;
use crate::txn::{Reader, Txn};
use crate::Engine;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest file size (2^62 bytes).
pub const MAX_FILE_SIZE: u64 = 1 << 62;

/// Longest name a directory entry may have.
pub const NAME_MAX: usize = 255;

pub(crate) fn errno(code: i32, what: &'static str) -> Error {
    Error::Posix(code, what)
}

/// A mounted subvolume.
pub struct Fs {
    engine: Arc<Engine>,
    tree: u64,
    next_ino: AtomicU64,
    /// Live inodes: buffered data, open handles, ghosts, read streams.
    inodes: inodes::InodeTable,
    /// An [`AtimePolicy`] as a number.
    atime_policy: std::sync::atomic::AtomicU8,
    /// Remounted read-only: the kernel refuses changes, and reads must not
    /// record access times either.
    remounted_ro: std::sync::atomic::AtomicBool,
    /// What the running transaction changed, for fsync's log.
    tracking: log::Tracking,
    /// fsync writes the log tree (false: it commits, `-o notreelog`).
    log_enabled: std::sync::atomic::AtomicBool,
}

/// Objectid of orphan items: `(ORPHAN_OBJECTID, ORPHAN_ITEM, ino)` marks an
/// inode with no links kept for open handles; mount deletes leftovers.
pub const ORPHAN_OBJECTID: u64 = u64::MAX - 5;

impl Fs {
    /// Opens the default subvolume, creating its root directory on a
    /// freshly formatted image.
    pub fn new(engine: Arc<Engine>) -> Result<Fs> {
        let tree = FS;
        // Before anything reads the tree: the log may hold fsynced
        // changes the last commit lacks.
        log::replay(&engine, tree)?;
        let last = engine.read(|r| {
            let root = r.root(tree)?;
            let c = crate::tree::Cursor::seek_le(
                r,
                &root,
                &Key::new(crate::format::checker::LAST_INO, u8::MAX, u64::MAX),
            )?;
            Ok(c.and_then(|c| c.item().map(|i| i.key.objectid)))
        })?;
        let fs = Fs {
            engine,
            tree,
            next_ino: AtomicU64::new(last.map_or(ROOT_DIR_INO, |l| l.max(ROOT_DIR_INO)) + 1),
            inodes: inodes::InodeTable::new(),
            atime_policy: std::sync::atomic::AtomicU8::new(1),
            remounted_ro: std::sync::atomic::AtomicBool::new(false),
            tracking: log::Tracking::default(),
            log_enabled: std::sync::atomic::AtomicBool::new(true),
        };
        fs.delete_orphans()?;
        if last.is_none() {
            fs.engine.write(|tx| {
                let now = crate::format::inode::Timespec::now();
                let root = InodeItem {
                    nlink: 2,
                    mode: libc::S_IFDIR | 0o755,
                    transid: tx.transid(),
                    atime: now,
                    mtime: now,
                    ctime: now,
                    otime: now,
                    ..Default::default()
                };
                tx.insert(tree, inode_key(ROOT_DIR_INO), root.encode())
            })?;
            fs.engine.commit()?;
        }
        Ok(fs)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Makes everything done so far durable: buffered file data gets its
    /// extents, then the transaction commits.
    pub fn sync(&self) -> Result<()> {
        self.flush_all()?;
        self.engine.commit().map(|_| ())
    }

    /// Chooses whether fsync writes the log tree (the default) or commits
    /// the whole filesystem.
    pub fn set_log_enabled(&self, on: bool) {
        self.log_enabled.store(on, Ordering::Relaxed);
    }

    pub(crate) fn log_enabled(&self) -> bool {
        self.log_enabled.load(Ordering::Relaxed)
    }

    /// Sets how many bytes of written file data may wait in memory for
    /// their extents before writers flush some.
    pub fn set_dirty_limit(&self, bytes: u64) {
        self.inodes.set_limit(bytes);
    }

    /// Follows a remount: read-only commits everything first, then stops
    /// recording access times (the kernel already refuses every change).
    pub fn set_remounted_read_only(&self, ro: bool) -> Result<()> {
        if ro {
            self.sync()?;
        }
        self.remounted_ro.store(ro, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the mount was remounted read-only.
    pub fn is_remounted_read_only(&self) -> bool {
        self.remounted_ro.load(Ordering::Relaxed)
    }

    /// Bytes of file data waiting in memory for extents.
    pub fn dirty_bytes(&self) -> u64 {
        self.inodes.buffered()
    }

    /// The kernel dropped its last reference to `ino` (FUSE's FORGET).
    pub fn forget(&self, ino: u64) {
        self.inodes.forget(ino);
    }

    /// Runs `f` in the running transaction. `f` reserves what it needs
    /// (`Txn::reserve`) before changing anything; when that fails,
    /// buffered data (which holds worst-case reservations) is flushed and
    /// the transaction committed (which makes freed space reusable), and
    /// `f` runs once more. Only then is ENOSPC the answer, as in btrfs.
    pub(crate) fn write_reserved<R>(
        &self,
        mut f: impl FnMut(&mut Txn<'_>) -> Result<R>,
    ) -> Result<R> {
        // Asked again even when this transaction holds nothing to free: a
        // commit another thread prepared may still be writing, and its
        // freed space comes back once it is durable (the commit waits).
        match self.engine.write(&mut f) {
            Err(Error::NoSpace) => {
                // The caller may hold a file's flush lock: flush the rest.
                self.flush_all_available()?;
                self.engine.commit()?;
                self.engine.wait_for_freed_space();
                self.engine.write(f)
            }
            r => r,
        }
    }

    /// A fresh inode number; ENOSPC once every legal one is used.
    fn alloc_ino(&self) -> Result<u64> {
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        if ino > crate::format::checker::LAST_INO {
            return Err(Error::NoSpace);
        }
        Ok(ino)
    }
}

impl Drop for Fs {
    /// Buffered data reaches the tree before the engine's final commit.
    fn drop(&mut self) {
        if self.inodes.buffered() > 0 {
            if let Err(e) = self.flush_all() {
                tracing::error!(error = %e, "flushing buffered data failed");
            }
        }
    }
}

pub(crate) fn inode_key(ino: u64) -> Key {
    Key::new(ino, INODE_ITEM, 0)
}

/// Passes an item read from a tree through the item checker before the
/// caller decodes it: a bad item is EIO for the inode it belongs to.
pub(crate) fn checked<'d, B: crate::tree::BlockRead + ?Sized>(
    b: &B,
    key: &Key,
    data: &'d [u8],
) -> Result<&'d [u8]> {
    match crate::format::checker::check_item(key, data, &b.item_limits()) {
        Ok(()) => Ok(data),
        Err(reason) => Err(Error::BadItem { key: *key, reason }),
    }
}

fn decode_inode<B: crate::tree::BlockRead + ?Sized>(
    b: &B,
    ino: u64,
    data: &[u8],
) -> Result<InodeItem> {
    let key = inode_key(ino);
    InodeItem::decode(checked(b, &key, data)?).map_err(|reason| Error::BadItem { key, reason })
}

pub(crate) fn load_inode_tx(tx: &Txn<'_>, tree: u64, ino: u64) -> Result<InodeItem> {
    let data = tx.get(tree, &inode_key(ino))?.ok_or(Error::NotFound)?;
    decode_inode(tx, ino, &data)
}

pub(crate) fn load_inode_r(r: &Reader<'_>, tree: u64, ino: u64) -> Result<InodeItem> {
    let data = r.get(tree, &inode_key(ino))?.ok_or(Error::NotFound)?;
    decode_inode(r, ino, &data)
}

pub(crate) fn store_inode(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    mut inode: InodeItem,
) -> Result<()> {
    inode.transid = tx.transid();
    tx.put(tree, inode_key(ino), inode.encode()).map(|_| ())
}

pub(crate) fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

pub(crate) fn dtype(mode: u32) -> u8 {
    ((mode & libc::S_IFMT) >> 12) as u8
}
