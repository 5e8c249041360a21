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

pub mod acl;
mod atime;
pub mod attrs;
pub mod balance;
pub mod compression;
mod daemon;
mod data;
pub mod dedupe;
pub mod defrag;
mod devices;
mod dir;
pub mod extents;
mod file;
mod ghost;
mod ident;
mod inodes;
pub(crate) mod log;
mod names;
mod node;
pub(crate) mod ops;
pub mod quota;
mod rangeset;
mod readahead;
mod reclaim;
pub mod replace;
pub mod setid;
pub(crate) mod subvol;
mod view;
pub mod writeback;
pub mod xattr;

pub use atime::{AccessAtOpen, AtimePolicy};
pub use balance::{BalanceState, BalanceStatus};
pub use daemon::Cleaner;
pub use node::{node_id, split_node, INO_BITS, LAST_LOCAL_INO};
pub use ops::{
    committed_symlink, committed_symlink_in, Attr, DirListing, DirListingPlus, NewNode, Owner,
    SetAttr, StatFs,
};
pub use quota::{QgroupRow, QuotaChange, RescanStatus};
pub use subvol::SubvolInfo;
pub use view::SubvolView;

use crate::error::{Error, Result};
use crate::format::inode::{InodeItem, ROOT_DIR_INO};
use crate::format::key_type::INODE_ITEM;
use crate::format::tree_id::FS;
use crate::format::Key;
use crate::txn::{Reader, Txn};
use crate::Engine;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest file size: 2^63-1 bytes, what `loff_t` can address (as
/// btrfs). Sizes, writes, fallocate and copy_file_range past it get EFBIG.
pub const MAX_FILE_SIZE: u64 = crate::format::checker::MAX_FILE_SIZE;

/// Longest name a directory entry may have.
pub const NAME_MAX: usize = 255;

pub(crate) fn errno(code: i32, what: &'static str) -> Error {
    Error::Posix(code, what)
}

/// What every subvolume of one mount shares: the engine, the settings,
/// the log's state, the budget of buffered bytes, and the open
/// subvolumes themselves.
pub(crate) struct Core {
    engine: Arc<Engine>,
    /// An [`AtimePolicy`] as a number.
    atime_policy: std::sync::atomic::AtomicU8,
    /// Listing a directory records an access (off with `nodiratime`).
    dir_atime: std::sync::atomic::AtomicBool,
    /// When writeback compresses (`-o compress=`, `compress-force=`).
    compression: std::sync::RwLock<crate::compress::Policy>,
    /// Remounted read-only: the kernel refuses changes, and reads must not
    /// record access times either.
    remounted_ro: std::sync::atomic::AtomicBool,
    /// What the running transaction changed, for fsync's log.
    tracking: log::Tracking,
    /// fsync writes the log tree (false: it commits, `-o notreelog`).
    log_enabled: std::sync::atomic::AtomicBool,
    /// Buffered bytes of all subvolumes, and their limit.
    budget: Arc<inodes::Budget>,
    /// Subvolumes in use, by tree id. Each holds the core (to flush the
    /// others when space runs short); [`Fs`]'s drop breaks the cycle.
    subvols: std::sync::RwLock<std::collections::BTreeMap<u64, Arc<Subvol>>>,
    /// Serialises subvolume creation and deletion (ids, root refs), and
    /// holds the highest subvolume id this mount handed out.
    subvol_lock: std::sync::Mutex<u64>,
    /// The subvolume the mount shows as its root (it cannot be deleted).
    shown: AtomicU64,
    /// Wakes the daemon's cleaner thread, if one runs.
    cleaner_wake: std::sync::Mutex<Option<std::sync::Weak<daemon::Wake>>>,
    /// The balance thread, if one runs, and what it reports.
    balance_thread: daemon::Worker,
    balance_status: Arc<std::sync::Mutex<balance::BalanceStatus>>,
    rescan_thread: daemon::Worker,
    /// The device replace thread, if one runs, and what it reports.
    replace_thread: daemon::Worker,
    replace_job: replace::SharedJob,
}

/// One subvolume (fs tree) of a mount: the POSIX operations on its local
/// inode numbers. [`Fs`] maps node ids onto these.
pub(crate) struct Subvol {
    core: Arc<Core>,
    tree: u64,
    next_ino: AtomicU64,
    /// Live inodes: buffered data, open handles, ghosts, read streams.
    inodes: inodes::InodeTable,
    /// A read-only subvolume (snapshot): every change is EROFS.
    readonly: std::sync::atomic::AtomicBool,
    /// Being deleted: changes are refused (ENOENT), so nothing is
    /// buffered for a tree about to go.
    deleting: std::sync::atomic::AtomicBool,
    /// Files whose last link went in the running operation and that are
    /// too large to delete in it (see `orphan`).
    emptying: std::sync::Mutex<Vec<u64>>,
}

/// A mounted filesystem: every subvolume of the pool, reached through node
/// ids (see [`node_id`]); the mount shows one of them as its root.
pub struct Fs {
    core: Arc<Core>,
    root_tree: u64,
}

/// Objectid of orphan items: `(ORPHAN_OBJECTID, ORPHAN_ITEM, ino)` marks an
/// inode with no links kept for open handles; mount deletes leftovers.
pub const ORPHAN_OBJECTID: u64 = u64::MAX - 5;

/// Bytes a file extent item accounts for in its inode's `nbytes` (for
/// `check`, which compares).
pub(crate) fn accounted_bytes(fe: &crate::format::items::FileExtentItem) -> u64 {
    file::accounted(fe)
}

/// Which subvolume a mount shows as its root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Shown {
    /// The default subvolume (`canopy subvolume set-default`).
    #[default]
    Default,
    /// `subvolid=ID`.
    Id(u64),
    /// `subvol=PATH`, from the top of the pool (tree 5).
    Path(Vec<u8>),
}

impl Fs {
    /// Opens the default subvolume, creating its root directory on a
    /// freshly formatted image.
    pub fn new(engine: Arc<Engine>) -> Result<Fs> {
        Fs::with_root(engine, &Shown::Default)
    }

    /// Opens the pool with `shown` as the mount's root.
    pub fn with_root(engine: Arc<Engine>, shown: &Shown) -> Result<Fs> {
        // Before anything allocates: the groups of a running balance are
        // kept from new allocations (the allocator does not keep that on
        // disk).
        if !engine.is_read_only() {
            engine.write(crate::balance::restore_pending)?;
        }
        // Before anything reads a tree: the log may hold fsynced changes
        // the last commit lacks.
        let logged_bytes = log::replay(&engine)?;
        let core = Arc::new(Core {
            engine,
            atime_policy: std::sync::atomic::AtomicU8::new(1),
            dir_atime: std::sync::atomic::AtomicBool::new(true),
            compression: Default::default(),
            remounted_ro: std::sync::atomic::AtomicBool::new(false),
            tracking: log::Tracking::default(),
            log_enabled: std::sync::atomic::AtomicBool::new(true),
            budget: Arc::new(inodes::Budget::default()),
            subvols: Default::default(),
            subvol_lock: std::sync::Mutex::new(0),
            shown: AtomicU64::new(FS),
            cleaner_wake: std::sync::Mutex::new(None),
            balance_thread: daemon::Worker::default(),
            balance_status: Default::default(),
            rescan_thread: daemon::Worker::default(),
            replace_thread: daemon::Worker::default(),
            replace_job: Default::default(),
        });
        core.engine
            .set_logged_bytes(Arc::new(log::BytesHook(Arc::downgrade(&core))));
        core.restore_logged_bytes(logged_bytes)?;
        let top = core.subvol(FS)?;
        if top.is_empty_tree()? {
            top.make_root_dir()?;
        }
        let mut fs = Fs {
            root_tree: FS,
            core,
        };
        fs.root_tree = fs.resolve_shown(shown)?;
        fs.core.shown.store(fs.root_tree, Ordering::Relaxed);
        Ok(fs)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.core.engine
    }

    /// Node id of the mount's root directory.
    pub fn root_node(&self) -> u64 {
        node_id(self.root_tree, ROOT_DIR_INO)
    }

    /// Makes everything done so far durable: buffered file data gets its
    /// extents, then the transaction commits.
    pub fn sync(&self) -> Result<()> {
        self.core.sync()
    }

    /// `canopy filesystem freeze`: flushes every file's buffered data,
    /// commits, and holds every later write for at most `timeout` (see
    /// `Engine::freeze`).
    pub fn freeze(&self, timeout: std::time::Duration) -> Result<()> {
        if self.engine().frozen_for().is_some() {
            // Not a sync first: that would wait for the thaw.
            return Err(crate::Error::Posix(
                libc::EBUSY,
                "the filesystem is frozen already",
            ));
        }
        self.sync()?;
        self.engine().freeze(timeout)
    }

    /// Chooses whether fsync writes the log tree (the default) or commits
    /// the whole filesystem.
    pub fn set_log_enabled(&self, on: bool) {
        self.core.log_enabled.store(on, Ordering::Relaxed);
    }

    /// Sets how many bytes of written file data may wait in memory for
    /// their extents before writers flush some.
    pub fn set_dirty_limit(&self, bytes: u64) {
        self.core.budget.set_limit(bytes);
    }

    /// Sets the bytes of changed tree blocks past which the running
    /// transaction asks to be committed (`dirty_metadata=`).
    pub fn set_dirty_metadata_limit(&self, bytes: u64) {
        self.core.engine.set_dirty_metadata_limit(bytes);
    }

    /// Waits at most `timeout` for the running transaction to ask to be
    /// committed; true if it did.
    pub fn wait_commit_wanted(&self, timeout: std::time::Duration) -> bool {
        self.core.engine.wait_commit_wanted(timeout)
    }

    /// Bytes of written data buffered before writers flush.
    pub fn dirty_limit(&self) -> u64 {
        self.core.budget.limit()
    }

    /// Follows a remount: read-only commits everything first, then stops
    /// recording access times (the kernel already refuses every change).
    pub fn set_remounted_read_only(&self, ro: bool) -> Result<()> {
        if ro {
            self.sync()?;
        }
        self.core.remounted_ro.store(ro, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the mount was remounted read-only.
    pub fn is_remounted_read_only(&self) -> bool {
        self.core.is_remounted_read_only()
    }

    /// Bytes of file data waiting in memory for extents.
    pub fn dirty_bytes(&self) -> u64 {
        self.core.budget.buffered()
    }

    /// The kernel dropped its last reference to `node` (FUSE's FORGET).
    pub fn forget(&self, node: u64) {
        if let Ok((sv, ino)) = self.at(node) {
            sv.inodes.forget(ino);
        }
    }
}

impl Core {
    pub(crate) fn log_enabled(&self) -> bool {
        self.log_enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn is_remounted_read_only(&self) -> bool {
        self.remounted_ro.load(Ordering::Relaxed)
    }

    pub(crate) fn atime_policy(&self) -> AtimePolicy {
        AtimePolicy::from_u8(self.atime_policy.load(Ordering::Relaxed))
    }

    pub(crate) fn compression(&self) -> crate::compress::Policy {
        *self
            .compression
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn dir_atime(&self) -> bool {
        self.dir_atime.load(Ordering::Relaxed)
    }

    /// See [`Fs::sync`].
    pub(crate) fn sync(&self) -> Result<()> {
        self.flush_all()?;
        self.engine.commit().map(|_| ())
    }

    /// Subvolume `tree`, opened on first use (its orphans deleted then).
    pub(crate) fn subvol(self: &Arc<Self>, tree: u64) -> Result<Arc<Subvol>> {
        if let Some(sv) = crate::sync::read(&self.subvols).get(&tree) {
            return Ok(sv.clone());
        }
        if tree != FS && !crate::format::tree_id::is_subvolume(tree) {
            return Err(Error::NotFound);
        }
        let item = self.engine.read(|r| r.root_item(tree))?;
        let sv = Arc::new(Subvol {
            core: self.clone(),
            tree,
            next_ino: AtomicU64::new(0),
            inodes: inodes::InodeTable::with_budget(self.budget.clone()),
            readonly: std::sync::atomic::AtomicBool::new(item.flags & subvol::ROOT_READONLY != 0),
            deleting: std::sync::atomic::AtomicBool::new(false),
            emptying: Default::default(),
        });
        let last = self.engine.read(|r| last_ino(r, &r.root(tree)?))?;
        sv.next_ino
            .store(last.max(ROOT_DIR_INO) + 1, Ordering::Relaxed);
        let opened = {
            let mut map = crate::sync::write(&self.subvols);
            map.entry(tree).or_insert_with(|| sv.clone()).clone()
        };
        // Only the thread whose subvolume went in cleans up its orphans.
        let first = Arc::ptr_eq(&opened, &sv);
        if first && !sv.is_read_only() && !self.engine.is_read_only() {
            sv.delete_orphans()?;
        }
        Ok(opened)
    }

    /// The subvolumes in use.
    fn open_subvols(&self) -> Vec<Arc<Subvol>> {
        crate::sync::read(&self.subvols).values().cloned().collect()
    }

    /// Files with buffered data in every subvolume, most bytes first.
    fn dirty_files(&self) -> Vec<(Arc<Subvol>, u64)> {
        let mut all: Vec<(u64, Arc<Subvol>, u64)> = Vec::new();
        for sv in self.open_subvols() {
            for (bytes, ino) in sv.inodes.dirty_inodes() {
                all.push((bytes, sv.clone(), ino));
            }
        }
        all.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        all.into_iter().map(|(_, sv, ino)| (sv, ino)).collect()
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
            // A quota counts flushed data until a commit accounts it, and
            // what an overwrite replaced until the commit frees it.
            Err(Error::NoSpace | Error::Posix(libc::EDQUOT, _)) => {
                // The caller may hold a file's flush lock: flush the rest.
                self.flush_all_available()?;
                self.engine.commit()?;
                self.engine.wait_for_freed_space();
                self.engine.write(f)
            }
            r => r,
        }
    }
}

impl Subvol {
    /// The item of `ino` as the file is now: what the tree holds, with
    /// the size and times buffered writes set laid over it (see
    /// `writeback`, "Writes without the state lock").
    pub(crate) fn inode_tx(&self, tx: &Txn<'_>, ino: u64) -> Result<InodeItem> {
        let mut i = load_inode_tx(tx, self.tree, ino)?;
        self.lay_pending(ino, &mut i);
        Ok(i)
    }

    /// [`Subvol::inode_tx`] for a reader.
    pub(crate) fn inode_r(&self, r: &Reader<'_>, ino: u64) -> Result<InodeItem> {
        let mut i = load_inode_r(r, self.tree, ino)?;
        self.lay_pending(ino, &mut i);
        Ok(i)
    }

    fn lay_pending(&self, ino: u64, i: &mut InodeItem) {
        if let Some(Some(p)) = self.inodes.peek(ino, |s| s.pending) {
            p.lay_over(i);
        }
    }

    /// Stores `i` as the item of `ino`. Attributes buffered writes set
    /// that it includes are then settled: the tree has them.
    pub(crate) fn save_inode(&self, tx: &mut Txn<'_>, ino: u64, i: InodeItem) -> Result<()> {
        store_inode(tx, self.tree, ino, i.clone())?;
        self.inodes.note_saved(ino, &i);
        Ok(())
    }

    /// Whether the tree holds no item at all (a freshly formatted image).
    fn is_empty_tree(&self) -> Result<bool> {
        self.core.engine.read(|r| {
            let root = r.root(self.tree)?;
            Ok(crate::tree::Cursor::seek(r, &root, &Key::MIN)?
                .item()
                .is_none())
        })
    }

    /// Creates the root directory of an empty tree and commits.
    fn make_root_dir(&self) -> Result<()> {
        let tree = self.tree;
        self.core.engine.write(|tx| {
            tx.insert(
                tree,
                inode_key(ROOT_DIR_INO),
                root_dir_item(tx.transid()).encode(),
            )
        })?;
        self.core.engine.commit().map(drop)
    }

    /// The node id of local inode `ino`; a number too large for one (only
    /// a damaged tree has it) is a bad item.
    pub(crate) fn node(&self, ino: u64) -> Result<u64> {
        if ino > LAST_LOCAL_INO {
            return Err(inode_key(ino).bad(format!("inode number above {LAST_LOCAL_INO}")));
        }
        Ok(node_id(self.tree, ino))
    }

    pub(crate) fn is_read_only(&self) -> bool {
        self.readonly.load(Ordering::Relaxed)
    }

    /// EROFS in a read-only subvolume.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.deleting.load(Ordering::Relaxed) {
            return Err(Error::NotFound);
        }
        if self.is_read_only() {
            return Err(errno(libc::EROFS, "read-only subvolume"));
        }
        Ok(())
    }

    /// A fresh inode number; ENOSPC once every legal one is used.
    fn alloc_ino(&self) -> Result<u64> {
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        if ino > LAST_LOCAL_INO {
            return Err(Error::NoSpace);
        }
        Ok(ino)
    }
}

/// The highest inode number in use in the tree at `root` (0 if none).
pub(crate) fn last_ino<B: crate::tree::BlockRead + ?Sized>(
    b: &B,
    root: &crate::tree::RootPtr,
) -> Result<u64> {
    let at = Key::new(LAST_LOCAL_INO, u8::MAX, u64::MAX);
    Ok(crate::tree::Cursor::seek_le(b, root, &at)?
        .and_then(|c| c.item().map(|i| i.key.objectid))
        .unwrap_or(0))
}

/// The inode item of a new subvolume's root directory.
pub(crate) fn root_dir_item(transid: u64) -> InodeItem {
    let now = crate::format::inode::Timespec::now();
    InodeItem {
        nlink: 2,
        mode: libc::S_IFDIR | 0o755,
        transid,
        atime: now,
        mtime: now,
        ctime: now,
        otime: now,
        ..Default::default()
    }
}

impl Drop for Fs {
    /// Buffered data reaches the tree before the engine's final commit.
    fn drop(&mut self) {
        // The balance thread holds the core; it carries on at next mount.
        self.core.balance_thread.stop();
        self.core.rescan_thread.stop();
        // A replace not finished is given up (nothing of it is on disk).
        self.core.stop_replace();
        // A read-only mount's buffers hold only bytes replayed from the
        // log, which it cannot write.
        let flushed = match self.core.budget.buffered() {
            _ if self.core.engine.is_read_only() => Ok(()),
            0 => Ok(()),
            _ => self.core.flush_all(),
        };
        match flushed {
            // Nothing is buffered now, so whatever bytes the log holds are
            // in the trees: the final commit may drop it.
            Ok(()) => self.core.engine.forget_logged_bytes(),
            // The final commit keeps the log (it would drop the only copy
            // of fsynced bytes), and the next mount replays it.
            Err(e) => tracing::error!(error = %e, "flushing buffered data failed"),
        }
        // Each subvolume holds the core: let them go.
        crate::sync::write(&self.core.subvols).clear();
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
        Err(reason) => Err(key.bad(reason)),
    }
}

fn decode_inode<B: crate::tree::BlockRead + ?Sized>(
    b: &B,
    ino: u64,
    data: &[u8],
) -> Result<InodeItem> {
    let key = inode_key(ino);
    InodeItem::decode(checked(b, &key, data)?).map_err(|reason| key.bad(reason))
}

pub(crate) fn load_inode_tx(tx: &Txn<'_>, tree: u64, ino: u64) -> Result<InodeItem> {
    tx.get_with(tree, &inode_key(ino), |data| decode_inode(tx, ino, data))?
        .ok_or(Error::NotFound)?
}

pub(crate) fn load_inode_r(r: &Reader<'_>, tree: u64, ino: u64) -> Result<InodeItem> {
    r.get_with(tree, &inode_key(ino), |data| decode_inode(r, ino, data))?
        .ok_or(Error::NotFound)?
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
