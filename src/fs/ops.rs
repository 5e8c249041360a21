//! The POSIX operations of a subvolume on inodes: attributes, lookup,
//! create (every file type, with inherited ACLs), readlink, open,
//! setattr, readdir and statfs (release and orphans are in `orphan.rs`). The namespace changes are in `names.rs`, file data
//! in `data.rs`, extended attributes in `xattr.rs`.

use super::{acl, dir, dtype, errno, file, is_dir, load_inode_r, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::{InodeItem, Timespec, INODE_NODATACOW, INODE_NODATASUM, ROOT_DIR_INO};
use crate::format::tree_id::CSUM;
use crate::txn::{Need, Txn};

pub(super) const SECTOR: u64 = crate::format::SECTORSIZE as u64;

/// Items a create, link or rename changes at most: the inode, its
/// reference, the two directory items, the parent; a rename twice over.
pub(super) const CREATE_ITEMS: u64 = 6;
pub(super) const RENAME_ITEMS: u64 = 14;

pub(crate) fn orphan_key(ino: u64) -> crate::format::Key {
    crate::format::Key::new(
        super::ORPHAN_OBJECTID,
        crate::format::key_type::ORPHAN_ITEM,
        ino,
    )
}

/// Extra items an operation reserves for updating the log's copy of the
/// names it changes (seed 003: only when a log exists at all).
pub(super) fn log_items(tx: &Txn<'_>) -> u64 {
    if tx.has_log() {
        super::log::NAME_LOG_ITEMS
    } else {
        0
    }
}

/// Reads (and so checks) every item deleting `ino` will decode, before the
/// operation changes anything: a corrupt file is then EIO for the unlink,
/// not a failure half-way that shuts the filesystem down.
pub(super) fn check_deletable(tx: &Txn<'_>, tree: u64, ino: u64) -> Result<()> {
    let root = tx.root_of(tree)?;
    file::count_items(tx, &root, ino, 0, u64::MAX).map(drop)
}

/// Removes an inode: its data, xattrs and inode item (every item keyed by
/// its number).
pub(crate) fn delete_inode(tx: &mut Txn<'_>, tree: u64, ino: u64) -> Result<()> {
    file::punch(tx, tree, ino, 0, u64::MAX)?;
    let rest = tx.range(
        tree,
        &crate::format::Key::new(ino, 0, 0),
        &crate::format::Key::new(ino + 1, 0, 0),
    )?;
    if rest.is_empty() {
        return Err(Error::NotFound);
    }
    for (k, _) in rest {
        tx.delete(tree, &k)?;
    }
    Ok(())
}

/// Attributes as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
}

impl Attr {
    /// The generation a file handle carries with the node id: derived
    /// from the birth time, so that an inode number used again (a new
    /// file after the last one was deleted and the filesystem remounted)
    /// gives stale handles of the old file ESTALE. 32 bits, as FUSE's
    /// handles hold; never 0 (which means "any").
    pub fn generation(&self) -> u64 {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&self.crtime.sec.to_le_bytes());
        b[8..].copy_from_slice(&self.crtime.nsec.to_le_bytes());
        u64::from(crate::format::crc(&b).max(1))
    }
}

/// Attributes of the inode whose node id is `node`.
pub(crate) fn attr_of(node: u64, i: &InodeItem) -> Attr {
    Attr {
        ino: node,
        size: i.size,
        blocks: i.nbytes.div_ceil(512),
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.otime,
        mode: i.mode,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
    }
}

/// One readdir entry: (next offset, ino, d_type, name).
pub type DirListing = (u64, u64, u8, Vec<u8>);

/// One READDIRPLUS entry: (next offset, attributes (none for an entry
/// deleted since it was listed), name).
pub type DirListingPlus = (u64, Option<Attr>, Vec<u8>);

/// What `setattr` may change.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    pub ctime: Option<Timespec>,
    /// The times given are the present moment (utimes with no times,
    /// `touch`): what an append-only file still allows.
    pub times_now: bool,
}

impl SetAttr {
    /// Everything but the size (which moves data) onto `i`; the ctime is
    /// the one given (the kernel's, under the writeback cache) or `now`.
    fn apply_to(&self, i: &mut InodeItem, now: Timespec) {
        if let Some(m) = self.mode {
            i.mode = (i.mode & libc::S_IFMT) | (m & !libc::S_IFMT);
        }
        if let Some(u) = self.uid {
            i.uid = u;
        }
        if let Some(g) = self.gid {
            i.gid = g;
        }
        if let Some(t) = self.atime {
            i.atime = t;
        }
        if let Some(t) = self.mtime {
            i.mtime = t;
        }
        i.ctime = self.ctime.unwrap_or(now);
    }
}

/// statfs figures, in 4 KiB blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    /// Not in use by anything (buffered data counts as used).
    pub free: u64,
    /// What writes can still get: free space less what the commit, buffered
    /// data and deletions are promised (`txn::space`).
    pub avail: u64,
    pub files: u64,
}

/// Who creates a new inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// What a new inode is to be.
pub struct NewNode<'a> {
    /// Type and permission bits asked for.
    pub mode: u32,
    pub rdev: u64,
    pub owner: Owner,
    /// A symlink's target.
    pub target: Option<&'a [u8]>,
    /// The caller's umask: applied unless the parent has a default ACL.
    pub umask: u32,
}

/// The xattrs a new inode gets from its parent: ACLs from its default ACL,
/// and its compression property.
#[derive(Default)]
struct Inherited {
    access: Option<Vec<u8>>,
    /// A directory's: its parent's default ACL, as it is.
    default: Option<Vec<u8>>,
    /// The parent's compression property.
    compression: Option<Vec<u8>>,
}

impl Inherited {
    fn bytes(&self) -> u64 {
        let len = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, |v| v.len() as u64 + 32);
        len(&self.access) + len(&self.default) + len(&self.compression)
    }

    fn store(&self, tx: &mut Txn<'_>, tree: u64, ino: u64) -> Result<()> {
        if let Some(a) = &self.access {
            super::xattr::set(tx, tree, ino, acl::ACCESS, a, 0)?;
        }
        if let Some(d) = &self.default {
            super::xattr::set(tx, tree, ino, acl::DEFAULT, d, 0)?;
        }
        if let Some(c) = &self.compression {
            super::xattr::set(tx, tree, ino, crate::compress::PROPERTY, c, 0)?;
        }
        Ok(())
    }
}

/// The inode of a new file made by `owner` in directory `p`: a
/// set-group-ID directory passes its group on (and, to directories, the
/// bit itself), a no-copy-on-write one its flags.
fn new_inode(p: &InodeItem, mode: u32, rdev: u64, owner: Owner, now: Timespec) -> InodeItem {
    let sgid_dir = p.mode & libc::S_ISGID != 0;
    let mut inode = InodeItem {
        nlink: if is_dir(mode) { 2 } else { 1 },
        uid: owner.uid,
        gid: if sgid_dir { p.gid } else { owner.gid },
        mode,
        rdev,
        atime: now,
        mtime: now,
        ctime: now,
        otime: now,
        ..Default::default()
    };
    if is_dir(mode) && sgid_dir {
        inode.mode |= libc::S_ISGID;
    }
    // `chattr +C` on a directory reaches the files and directories made
    // in it, as on btrfs.
    if is_dir(mode) || mode & libc::S_IFMT == libc::S_IFREG {
        inode.flags |= p.flags & (INODE_NODATACOW | INODE_NODATASUM);
    }
    inode
}

impl Subvol {
    /// Attributes of local inode `ino`, under its node id.
    pub(super) fn attr(&self, ino: u64, i: &InodeItem) -> Attr {
        attr_of(super::node_id(self.tree, ino), i)
    }

    pub(super) fn root_ptr_tx(&self, tx: &Txn<'_>) -> Result<crate::tree::RootPtr> {
        tx.root_of(self.tree)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let found = self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            self.full_attr(r, ino, &i)
        });
        match found {
            Err(Error::NotFound) => self.ghost_attr(ino, |_| {}),
            found => found,
        }
    }

    /// The attributes of `ino`, whose item is `i`. Buffered data will
    /// take space when flushed; st_blocks counts it now, as `du` right
    /// after a write expects.
    fn full_attr(&self, r: &crate::txn::Reader<'_>, ino: u64, i: &InodeItem) -> Result<Attr> {
        let mut a = self.attr(ino, i);
        a.blocks = (i.nbytes + self.pending_allocation(r, ino, i)?).div_ceil(512);
        Ok(a)
    }

    /// [`Subvol::readdir`] with each entry's attributes (READDIRPLUS), so
    /// that `ls -l`, find and du need no lookup per entry. An entry
    /// deleted since it was listed has none (the listing goes on past
    /// it).
    pub fn readdir_plus(
        &self,
        ino: u64,
        offset: u64,
        max: usize,
        last: u64,
    ) -> Result<Vec<DirListingPlus>> {
        let listing = self.readdir(ino, offset, max, last)?;
        self.core.engine.read(|r| {
            let own = self.own_inodes(r, listing.iter().map(|e| e.1))?;
            let mut out = Vec::with_capacity(listing.len());
            for (next, node, _, name) in listing {
                let found = match own.get(&node) {
                    Some(Some(i)) => self.full_attr(r, super::split_node(node).1, i),
                    Some(None) => Err(Error::NotFound),
                    None => self.node_attr(r, node),
                };
                match found {
                    Ok(a) => out.push((next, Some(a), name)),
                    Err(Error::NotFound) => out.push((next, None, name)),
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// The inode items of those of `nodes` in this subvolume, by node id
    /// (`None`: deleted), read in inode order in one walk of the tree:
    /// neighbours in a directory are mostly neighbours in the tree, and
    /// a listing's batch then costs a descent per leaf, not per entry.
    fn own_inodes(
        &self,
        r: &crate::txn::Reader<'_>,
        nodes: impl Iterator<Item = u64>,
    ) -> Result<crate::cache::BlockMap<Option<InodeItem>>> {
        let mut inos: Vec<u64> = nodes
            .map(super::split_node)
            .filter(|&(tree, _)| tree == self.tree)
            .map(|(_, ino)| ino)
            .collect();
        inos.sort_unstable();
        inos.dedup();
        let keys: Vec<crate::Key> = inos.iter().map(|&ino| super::inode_key(ino)).collect();
        let found = r.get_many_with(self.tree, &keys, |key, data| {
            super::decode_inode(r, key.objectid, data)
        })?;
        let mut out = crate::cache::BlockMap::default();
        for (ino, item) in inos.into_iter().zip(found) {
            let item = item.transpose()?.map(|mut i| {
                self.lay_pending(ino, &mut i);
                i
            });
            out.insert(super::node_id(self.tree, ino), item);
        }
        Ok(out)
    }

    /// The attributes of node `node`: an inode of this subvolume, or of
    /// another one (a subvolume's root, or the directory holding this
    /// subvolume's link), which holds no buffered data of ours.
    fn node_attr(&self, r: &crate::txn::Reader<'_>, node: u64) -> Result<Attr> {
        let (tree, ino) = super::split_node(node);
        match tree == self.tree {
            true => self.full_attr(r, ino, &self.inode_r(r, ino)?),
            false => Ok(attr_of(node, &load_inode_r(r, tree, ino)?)),
        }
    }

    /// What a flush of `ino`'s in-memory data will add to its nbytes, so
    /// that st_blocks is the same before and after it: the sectors it
    /// touches that are holes on disk (a write over data or preallocated
    /// space takes none the file does not count already); the growth of
    /// a file that stays inline.
    fn pending_allocation(
        &self,
        r: &crate::txn::Reader<'_>,
        ino: u64,
        i: &InodeItem,
    ) -> Result<u64> {
        /// Past this many ranges (a random writer), the bytes held stand
        /// in for the walk over them.
        const MAX_RANGES: usize = 256;
        let held = self.buffered_bytes_of(ino);
        if held == 0 {
            return Ok(0);
        }
        let root = r.root(self.tree)?;
        if file::stays_inline(r, &root, ino, i.size)? {
            return Ok(i.size.saturating_sub(i.nbytes));
        }
        let Some(sectors) = self.memory_sectors(ino, MAX_RANGES) else {
            return Ok(held);
        };
        let end = i.size.next_multiple_of(SECTOR);
        let mut bytes = 0;
        for (s, e) in sectors {
            if s < e.min(end) {
                bytes += file::hole_bytes(r, &root, ino, s, e.min(end))?;
            }
        }
        Ok(bytes)
    }

    /// Attributes of the ghost of a deleted inode after `change`; NotFound
    /// if the inode never existed or the kernel has forgotten it.
    fn ghost_attr(&self, ino: u64, change: impl FnOnce(&mut InodeItem)) -> Result<Attr> {
        self.inodes
            .haunt(ino, change)
            .map(|i| self.attr(ino, &i))
            .ok_or(Error::NotFound)
    }

    /// The entry `name` of directory `parent`. "." and ".." are answered
    /// too (of any inode, for "."): the kernel asks for them to open a
    /// file handle whose inode it no longer holds. A handle of a file
    /// whose last name is gone is stale, even while the daemon still
    /// keeps it for a FORGET the kernel has yet to send.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > super::NAME_MAX {
            return Err(errno(libc::ENAMETOOLONG, "name longer than 255 bytes"));
        }
        match name {
            b"." => {
                let a = self.getattr(parent)?;
                return if a.nlink == 0 {
                    Err(Error::NotFound)
                } else {
                    Ok(a)
                };
            }
            b".." => return self.lookup_parent(parent),
            _ => {}
        }
        self.core.engine.read(|r| {
            let root = r.root(self.tree)?;
            // Only a directory holds entries: its own item is read only
            // to tell ENOTDIR from ENOENT when the name is not there.
            let Some(e) = dir::lookup(r, &root, parent, name)? else {
                return match is_dir(self.inode_r(r, parent)?.mode) {
                    true => Err(Error::NotFound),
                    false => Err(errno(libc::ENOTDIR, "not a directory")),
                };
            };
            if e.is_subvolume() {
                let i = load_inode_r(r, e.ino, ROOT_DIR_INO)?;
                return Ok(attr_of(super::node_id(e.ino, ROOT_DIR_INO), &i));
            }
            // st_blocks counts buffered data here too: a file an fsync
            // logged keeps its bytes buffered until the commit, and a
            // stat after the kernel forgot the inode comes as a lookup.
            self.node(e.ino)?;
            self.full_attr(r, e.ino, &self.inode_r(r, e.ino)?)
        })
    }

    /// The parent directory of directory `dir` (of a subvolume's root:
    /// the directory holding its link; the top level's root is its own).
    fn lookup_parent(&self, dir: u64) -> Result<Attr> {
        self.core.engine.read(|r| {
            let i = self.inode_r(r, dir)?;
            if !is_dir(i.mode) {
                return Err(errno(libc::ENOTDIR, "not a directory"));
            }
            let parent = match dir {
                ROOT_DIR_INO => self.parent_of_root(r)?,
                _ => self.node(dir::parent_of(r, &r.root(self.tree)?, dir)?)?,
            };
            self.node_attr(r, parent)
        })
    }

    /// Creates a file, directory, device node, FIFO, socket or symlink
    /// (`target` for symlinks) named `name` in `parent`.
    pub fn create(&self, parent: u64, name: &[u8], how: &NewNode<'_>) -> Result<Attr> {
        let NewNode {
            rdev,
            owner,
            target,
            umask,
            ..
        } = *how;
        dir::check_name(name)?;
        let target_len = target.map_or(0, |t| t.len() as u64);
        // A symlink target too long to live inline goes to a data extent,
        // written by a flush like file data.
        let long = target_len > file::INLINE_MAX;
        let need = if long {
            Need::items(self.tree, CREATE_ITEMS).buffer(super::writeback::span(0, target_len))
        } else {
            Need::items(self.tree, CREATE_ITEMS).payload(target_len)
        };
        let ino = self.alloc_ino()?;
        let tree = self.tree;
        let created = self.core.write_reserved(|tx| {
            tx.reserve(&need)?;
            let mut p = self.parent_dir(tx, parent)?;
            super::attrs::refuse_if_immutable(&p)?;
            let root = self.root_ptr_tx(tx)?;
            if dir::lookup(tx, &root, parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            let (mode, mut acls) = self.inherit_acls(tx, parent, how.mode, umask)?;
            acls.compression = super::compression::inherited(tx, tree, parent, mode)?;
            if acls.bytes() > 0 {
                tx.reserve(&Need {
                    items: need.items + 3,
                    payload: need.payload + acls.bytes(),
                    ..need
                })?;
            }
            // Planned first, so a name that does not fit leaves no inode.
            let entry = dir::plan_add(tx, tree, parent, name, ino, dtype(mode))?;
            let parent_links = if is_dir(mode) {
                p.nlink
                    .checked_add(1)
                    .ok_or(errno(libc::EMLINK, "too many links"))?
            } else {
                p.nlink
            };
            let now = Timespec::now();
            let inode = new_inode(&p, mode, rdev, owner, now);
            self.save_inode(tx, ino, inode.clone())?;
            acls.store(tx, tree, ino)?;
            let inode = match target {
                Some(t) => self.store_target(tx, ino, inode, t, long)?,
                None => inode,
            };
            dir::apply(tx, tree, entry)?;
            self.note_name(tx, parent, ino);
            p.nlink = parent_links;
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, parent, p)?;
            Ok(self.attr(ino, &inode))
        })?;
        if long {
            self.flush_file(ino)?;
            return self.getattr(ino);
        }
        Ok(created)
    }

    /// A regular file with no name, made in `parent` (O_TMPFILE) and open
    /// once: it inherits what a file made there would (group, ACLs,
    /// compression) and is an orphan from its first transaction, so its
    /// last release, or the next mount after a crash, deletes it unless
    /// `link` names it first.
    pub fn create_unnamed(&self, parent: u64, how: &NewNode<'_>) -> Result<Attr> {
        let ino = self.alloc_ino()?;
        let tree = self.tree;
        let need = Need::items(tree, CREATE_ITEMS);
        // Open before the orphan item exists: no release may delete it.
        self.open(ino);
        let created = self.core.write_reserved(|tx| {
            tx.reserve(&need)?;
            let p = self.parent_dir(tx, parent)?;
            super::attrs::refuse_if_immutable(&p)?;
            let (mode, mut acls) = self.inherit_acls(tx, parent, how.mode, how.umask)?;
            acls.compression = super::compression::inherited(tx, tree, parent, mode)?;
            if acls.bytes() > 0 {
                tx.reserve(&Need {
                    items: need.items + 3,
                    payload: acls.bytes(),
                    ..need
                })?;
            }
            let mut inode = new_inode(&p, mode, 0, how.owner, Timespec::now());
            inode.nlink = 0;
            acls.store(tx, tree, ino)?;
            self.make_orphan(tx, ino, inode.clone())?;
            Ok(self.attr(ino, &inode))
        });
        if created.is_err() {
            self.inodes.release(ino);
        }
        created
    }

    /// Stores a new symlink's target: inline, or buffered for a flush
    /// when `long`. Returns the inode as saved.
    fn store_target(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        mut inode: InodeItem,
        target: &[u8],
        long: bool,
    ) -> Result<InodeItem> {
        if long {
            self.buffer(tx, ino, 0, target);
        } else {
            inode.nbytes = file::write_inline(tx, self.tree, ino, 0, 0, target)? as u64;
        }
        inode.size = target.len() as u64;
        self.save_inode(tx, ino, inode.clone())?;
        Ok(inode)
    }

    /// Leaves a whiteout (a character device 0/0, as overlayfs reads it)
    /// named `name` in `parent`, in the transaction that renamed the name's
    /// inode away.
    pub(super) fn add_whiteout(
        &self,
        tx: &mut Txn<'_>,
        (parent, name): (u64, &[u8]),
        (ino, owner): (u64, Owner),
        now: Timespec,
    ) -> Result<()> {
        let p = self.parent_dir(tx, parent)?;
        let inode = new_inode(&p, libc::S_IFCHR, 0, owner, now);
        self.save_inode(tx, ino, inode)?;
        dir::add(tx, self.tree, parent, name, ino, dtype(libc::S_IFCHR))?;
        self.note_name(tx, parent, ino);
        Ok(())
    }

    /// The mode of a new inode asked for with `mode` in `parent`, and the
    /// ACLs it gets: from the parent's default ACL if it has one (then the
    /// umask does not apply), else none.
    fn inherit_acls(
        &self,
        tx: &Txn<'_>,
        parent: u64,
        mode: u32,
        umask: u32,
    ) -> Result<(u32, Inherited)> {
        let masked = mode & !(umask & 0o777);
        if mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok((masked, Inherited::default()));
        }
        let root = tx.root_of(self.tree)?;
        let Some(default) = super::xattr::find(tx, &root, parent, acl::DEFAULT)? else {
            return Ok((masked, Inherited::default()));
        };
        let Ok(parsed) = acl::Acl::decode(&default) else {
            tracing::warn!(
                parent,
                "a directory's default ACL does not parse; not inherited"
            );
            return Ok((masked, Inherited::default()));
        };
        let (mode, access) = parsed.inherit(mode);
        Ok((
            mode,
            Inherited {
                access: access.map(|a| a.encode()),
                default: is_dir(mode).then_some(default),
                compression: None,
            },
        ))
    }

    /// chmod of an inode with an access ACL: the ACL follows the mode.
    fn chmod_acl(&self, tx: &mut Txn<'_>, ino: u64, mode: u32) -> Result<()> {
        let root = tx.root_of(self.tree)?;
        let Some(v) = super::xattr::find(tx, &root, ino, acl::ACCESS)? else {
            return Ok(());
        };
        let Ok(mut a) = acl::Acl::decode(&v) else {
            tracing::warn!(ino, "an access ACL does not parse; chmod leaves it");
            return Ok(());
        };
        a.chmod(mode);
        super::xattr::set(tx, self.tree, ino, acl::ACCESS, &a.encode(), 0)
    }

    pub(super) fn parent_dir(&self, tx: &Txn<'_>, parent: u64) -> Result<InodeItem> {
        let p = self.inode_tx(tx, parent)?;
        if !is_dir(p.mode) {
            return Err(errno(libc::ENOTDIR, "not a directory"));
        }
        Ok(p)
    }

    /// The highest entry index of directory `ino` (see `dir::last_index`).
    pub fn dir_last_index(&self, ino: u64) -> Result<u64> {
        self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            if !is_dir(i.mode) {
                return Err(errno(libc::ENOTDIR, "not a directory"));
            }
            dir::last_index(r, &r.root(self.tree)?, ino)
        })
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.core.engine.read_unlocked(
            |r| {
                let i = self.inode_r(r, ino)?;
                if i.mode & libc::S_IFMT != libc::S_IFLNK {
                    return Err(errno(libc::EINVAL, "not a symlink"));
                }
                plan_link(r, self.tree, ino, i.size)
            },
            |plan, dev| read_link(ino, plan, dev),
        )
    }

    /// Whether dropping one link of `ino` deletes it now.
    pub(super) fn last_link(&self, ino: u64, inode: &InodeItem) -> bool {
        (is_dir(inode.mode) || inode.nlink <= 1) && !self.is_open(ino)
    }

    pub(super) fn is_open(&self, ino: u64) -> bool {
        self.inodes.is_open(ino)
    }

    /// Notes an open handle of `ino`.
    pub fn open(&self, ino: u64) {
        self.inodes.open(ino);
    }

    /// Moves directory link counts when directories change parents and
    /// updates both parents' times.
    pub(super) fn adjust_parents(
        &self,
        tx: &mut Txn<'_>,
        from: u64,
        to: u64,
        dirs: (bool, bool),
        now: Timespec,
    ) -> Result<()> {
        let moved_out = i64::from(dirs.0) - i64::from(dirs.1);
        for (ino, delta) in [(from, -moved_out), (to, moved_out)] {
            let mut p = self.inode_tx(tx, ino)?;
            if from != to {
                p.nlink = (i64::from(p.nlink) + delta).clamp(0, i64::from(u32::MAX)) as u32;
            }
            p.mtime = now;
            p.ctime = now;
            self.save_inode(tx, ino, p)?;
            if from == to {
                break;
            }
        }
        Ok(())
    }

    pub fn setattr(&self, ino: u64, s: &SetAttr) -> Result<Attr> {
        if s.size.is_some_and(|size| size > super::MAX_FILE_SIZE) {
            return Err(errno(libc::EFBIG, "file too large"));
        }
        // A deleted inode's attributes (the kernel flushing its times)
        // are the ghost's, below.
        if let Ok(i) = self.core.engine.read(|r| self.inode_r(r, ino)) {
            super::attrs::refuse_setattr(&i, s)?;
        }
        let tree = self.tree;
        let now = Timespec::now();
        // A size change rewrites the file's extents: no flush of it may
        // run meanwhile, and its buffered data goes first.
        let _held = match s.size {
            Some(size) => {
                let held = self.inodes.lock_flush(ino);
                self.flush_held(ino, &held.inode)?;
                self.shrink_in_steps(ino, size)?;
                Some(held)
            }
            None => None,
        };
        let done = self.core.write_reserved(|tx| {
            let mut i = self.inode_tx(tx, ino)?;
            tx.reserve(&match s.size {
                // Shrinking is a deletion; only a partial last sector is
                // rewritten (zeroed past the new end).
                Some(size) if size < i.size => {
                    let partial = if size % SECTOR != 0 { SECTOR } else { 0 };
                    Need::items(tree, 4).buffer(partial).deleting()
                }
                // A chmod may rewrite the access ACL.
                _ => Need::items(tree, 2),
            })?;
            if let Some(size) = s.size {
                if is_dir(i.mode) {
                    return Err(errno(libc::EISDIR, "is a directory"));
                }
                self.truncate_buffered(tx, ino, size);
                self.note_extents(tx, ino, i.size, size.min(i.size), u64::MAX);
                let (delta, partial) = file::truncate(tx, tree, ino, i.size, size)?;
                if partial {
                    // Zeros past the end, so a later extension reads zeros;
                    // the flush rewrites the sector.
                    let zeros = vec![0u8; (size.next_multiple_of(SECTOR) - size) as usize];
                    self.buffer(tx, ino, size, &zeros);
                }
                i.nbytes = (i.nbytes as i64 + delta).max(0) as u64;
                i.size = size;
                i.mtime = now;
            }
            s.apply_to(&mut i, now);
            if s.mode.is_some() {
                self.chmod_acl(tx, ino, i.mode)?;
            }
            self.save_inode(tx, ino, i.clone())?;
            if s.mtime.is_some() || s.ctime.is_some() {
                // Times set explicitly win over those of earlier writes.
                self.inodes
                    .forget_pending_times(ino, s.mtime.is_some(), s.ctime.is_some());
            }
            Ok(self.attr(ino, &i))
        });
        match done {
            // The kernel flushing the times of a file deleted meanwhile.
            Err(Error::NotFound) => self.ghost_attr(ino, |i| {
                if let Some(size) = s.size {
                    i.size = size;
                }
                s.apply_to(i, now);
            }),
            done => done,
        }
    }

    /// Directory entries after readdir offset `offset`, none past index
    /// `last`: (next offset, ino, d_type, name). Offsets 1 and 2 are "."
    /// and "..".
    pub fn readdir(&self, ino: u64, offset: u64, max: usize, last: u64) -> Result<Vec<DirListing>> {
        let (listing, seen) = self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            if !is_dir(i.mode) {
                return Err(errno(libc::ENOTDIR, "not a directory"));
            }
            let mut out = Vec::new();
            let dt_dir = dtype(libc::S_IFDIR);
            if offset < 1 {
                out.push((1, self.node(ino)?, dt_dir, b".".to_vec()));
            }
            let root = r.root(self.tree)?;
            if offset < 2 {
                let parent = match ino {
                    ROOT_DIR_INO => self.parent_of_root(r)?,
                    _ => self.node(dir::parent_of(r, &root, ino)?)?,
                };
                out.push((2, parent, dt_dir, b"..".to_vec()));
            }
            for e in dir::list(r, &root, ino, (offset.max(2), last), max)? {
                let node = match e.is_subvolume() {
                    true => super::node_id(e.ino, ROOT_DIR_INO),
                    false => self.node(e.ino)?,
                };
                out.push((e.index + 1, node, e.d_type(), e.name));
            }
            Ok((out, i))
        })?;
        // Once per listing, at its start.
        if offset == 0 && self.core.dir_atime() {
            self.accessed(ino, &seen);
        }
        Ok(listing)
    }

    /// Space and inodes as statfs reports them, in 4 KiB blocks.
    pub fn statfs(&self) -> StatFs {
        let (total, free, avail) = self.core.engine.space_for_statfs();
        StatFs {
            blocks: total / SECTOR,
            free: free / SECTOR,
            avail: avail / SECTOR,
            files: self.next_ino.load(std::sync::atomic::Ordering::Relaxed) - ROOT_DIR_INO,
        }
    }
}

/// How to read the target of symlink `ino` (`size` bytes) in `tree`:
/// the plan, and whether its data covers the whole size.
/// [`committed_symlink`] for a caller already reading the trees through
/// `r` (the checker's ordered pass).
pub fn committed_symlink_in(
    engine: &crate::Engine,
    r: &crate::txn::Reader<'_>,
    tree: u64,
    ino: u64,
    size: u64,
) -> Result<Vec<u8>> {
    let plan = plan_link(r, tree, ino, size)?;
    engine.with_data_device(|dev| read_link(ino, plan, dev))
}

fn plan_link(
    r: &crate::txn::Reader<'_>,
    tree: u64,
    ino: u64,
    size: u64,
) -> Result<(file::ReadPlan, bool, u64)> {
    // The checker bounds a symlink's size by 4095 bytes; its data must
    // fill exactly that, with no hole and no NUL.
    let root = r.root(tree)?;
    let whole = file::covered(r, &root, ino, size)? == size;
    let plan = file::plan_read(r, &root, Some(&r.root(CSUM)?), ino, 0, size)?;
    Ok((plan, whole, size))
}

fn read_link(
    ino: u64,
    (plan, whole, size): (file::ReadPlan, bool, u64),
    dev: &crate::txn::DataDevice<'_>,
) -> Result<Vec<u8>> {
    let target = plan.execute(dev)?;
    if !whole || target.contains(&0) {
        return Err(
            super::inode_key(ino).bad(format!("symlink of {size} bytes whose data does not match"))
        );
    }
    Ok(target)
}

/// The target of symlink `ino` of `size` bytes in subvolume `tree` as
/// the last commit has it, checked as readlink checks it (`canopy
/// check` reads every symlink this way).
pub fn committed_symlink(
    engine: &crate::Engine,
    tree: u64,
    ino: u64,
    size: u64,
) -> Result<Vec<u8>> {
    engine.read_unlocked(
        |r| plan_link(r, tree, ino, size),
        |p, dev| read_link(ino, p, dev),
    )
}
