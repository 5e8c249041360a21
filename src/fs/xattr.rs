//! Extended attributes: `(ino, XATTR_ITEM, crc32c(name))`, each item a list
//! of (name length u16, value length u32, name, value) so that names whose
//! hashes collide share an item.

use super::{acl, errno, inode_key, is_dir};
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::format::key_type::XATTR_ITEM;
use crate::format::Key;
use crate::tree::{BlockRead, Cursor, RootPtr};
use crate::txn::{Need, Txn};

pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn key(ino: u64, name: &[u8]) -> Key {
    Key::new(ino, XATTR_ITEM, crate::format::inode::name_hash(name))
}

fn encode(pairs: &Pairs) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in pairs {
        out.extend_from_slice(&(n.len() as u16).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(n);
        out.extend_from_slice(v);
    }
    out
}

fn decode<B: BlockRead + ?Sized>(r: &B, key: &Key, data: &[u8]) -> Result<Pairs> {
    let ino = key.objectid;
    let mut b = super::checked(r, key, data)?;
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 6 {
            return Err(Error::corrupt(ino, "truncated xattr"));
        }
        let nl = usize::from(u16::from_le_bytes([b[0], b[1]]));
        let vl = u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as usize;
        if b.len() < 6 + nl + vl {
            return Err(Error::corrupt(ino, "xattr past its item"));
        }
        out.push((b[6..6 + nl].to_vec(), b[6 + nl..6 + nl + vl].to_vec()));
        b = &b[6 + nl + vl..];
    }
    Ok(out)
}

/// Namespaces Linux defines that Canopy stores.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(errno(libc::ERANGE, "xattr name length"));
    }
    const OK: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
    let acl = name == b"system.posix_acl_access" || name == b"system.posix_acl_default";
    let property = super::compression::is_property(name);
    if acl || property || OK.iter().any(|p| name.starts_with(p)) {
        Ok(())
    } else {
        Err(errno(libc::EOPNOTSUPP, "xattr namespace not supported"))
    }
}

fn load<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64, name: &[u8]) -> Result<Pairs> {
    match crate::tree::get(b, root, &key(ino, name))? {
        Some(d) => decode(b, &key(ino, name), &d),
        None => Ok(Vec::new()),
    }
}

pub(crate) fn set(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> Result<()> {
    if tx.get(tree, &inode_key(ino))?.is_none() {
        return Err(Error::NotFound);
    }
    let mut pairs = load(tx, &tx.root_of(tree)?, ino, name)?;
    let at = pairs.iter().position(|(n, _)| n == name);
    match (at, flags & (XATTR_CREATE | XATTR_REPLACE)) {
        (Some(_), XATTR_CREATE) => return Err(Error::Exists),
        (None, XATTR_REPLACE) => return Err(errno(libc::ENODATA, "no such attribute")),
        (Some(i), _) => pairs[i].1 = value.to_vec(),
        (None, _) => pairs.push((name.to_vec(), value.to_vec())),
    }
    let data = encode(&pairs);
    if data.len() > crate::tree::max_item_size(tx.nodesize_bytes()) {
        return Err(errno(libc::E2BIG, "attribute too large"));
    }
    tx.put(tree, key(ino, name), data).map(|_| ())
}

pub(crate) fn get<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    name: &[u8],
) -> Result<Vec<u8>> {
    find(b, root, ino, name)?.ok_or(errno(libc::ENODATA, "no such attribute"))
}

/// The value of `name` if the inode has it.
pub(crate) fn find<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    name: &[u8],
) -> Result<Option<Vec<u8>>> {
    Ok(load(b, root, ino, name)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v))
}

/// Every attribute of the inode, as (name, value).
pub(crate) fn all<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64) -> Result<Pairs> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, &Key::new(ino, XATTR_ITEM, 0))?;
    while let Some(it) = c.item() {
        if it.key.objectid != ino || it.key.ty != XATTR_ITEM {
            break;
        }
        out.extend(decode(b, &it.key, it.data)?);
        c.next(b)?;
    }
    Ok(out)
}

/// Names, each followed by a NUL, as listxattr(2) returns them.
pub(crate) fn list<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (n, _) in all(b, root, ino)? {
        out.extend_from_slice(&n);
        out.push(0);
    }
    Ok(out)
}

pub(crate) fn remove(tx: &mut Txn<'_>, tree: u64, ino: u64, name: &[u8]) -> Result<()> {
    let mut pairs = load(tx, &tx.root_of(tree)?, ino, name)?;
    let at = pairs
        .iter()
        .position(|(n, _)| n == name)
        .ok_or(errno(libc::ENODATA, "no such attribute"))?;
    pairs.remove(at);
    if pairs.is_empty() {
        tx.delete(tree, &key(ino, name)).map(|_| ())
    } else {
        tx.put(tree, key(ino, name), encode(&pairs)).map(|_| ())
    }
}

/// xattr(7) calls of a subvolume.
impl super::Subvol {
    /// setxattr(2); an ACL is checked, and an access ACL sets the mode
    /// (see `acl`).
    pub fn setxattr(
        &self,
        ino: u64,
        (name, value): (&[u8], &[u8]),
        flags: i32,
        may_keep_sgid: &dyn Fn(u32) -> bool,
    ) -> Result<()> {
        super::xattr::check_name(name)?;
        let is_acl = name == acl::ACCESS || name == acl::DEFAULT;
        let acl = if is_acl {
            Some(acl::Acl::decode(value)?)
        } else {
            None
        };
        let tree = self.tree;
        let need = Need::items(tree, 3).payload((name.len() + value.len()) as u64);
        self.core.write_reserved(|tx| {
            tx.reserve(&need)?;
            let mut i = self.inode_tx(tx, ino)?;
            super::attrs::refuse_if_fixed(&i)?;
            match &acl {
                Some(a) if name == acl::ACCESS => {
                    let (bits, plain) = a.mode_bits();
                    i.mode = (i.mode & !0o777) | bits;
                    if i.mode & libc::S_ISGID != 0 && !may_keep_sgid(i.gid) {
                        i.mode &= !libc::S_ISGID;
                    }
                    // The mode says it all: nothing to keep beside it.
                    if plain {
                        match super::xattr::remove(tx, tree, ino, name) {
                            Err(e) if e.errno() == libc::ENODATA => {}
                            r => r?,
                        }
                    } else {
                        super::xattr::set(tx, tree, ino, name, &a.encode(), flags)?;
                    }
                }
                Some(_) if !is_dir(i.mode) => {
                    return Err(errno(libc::EACCES, "a default ACL is for directories"))
                }
                None if super::compression::is_property(name) => {
                    super::compression::check_value(i.mode, value)?;
                    i.flags = super::compression::forget_giving_up(i.flags);
                    if value.is_empty() {
                        match super::xattr::remove(tx, tree, ino, name) {
                            Err(e) if e.errno() == libc::ENODATA => {}
                            r => r?,
                        }
                    } else {
                        super::xattr::set(tx, tree, ino, name, value, flags)?;
                    }
                }
                _ => super::xattr::set(tx, tree, ino, name, value, flags)?,
            }
            i.ctime = Timespec::now();
            self.save_inode(tx, ino, i)
        })
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.core.engine.read(|r| {
            self.inode_r(r, ino)?;
            super::xattr::get(r, &r.root(self.tree)?, ino, name)
        })
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        self.core.engine.read(|r| {
            self.inode_r(r, ino)?;
            super::xattr::list(r, &r.root(self.tree)?, ino)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let tree = self.tree;
        self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree, 3).deleting())?;
            super::attrs::refuse_if_fixed(&self.inode_tx(tx, ino)?)?;
            super::xattr::remove(tx, tree, ino, name)?;
            self.touch_ctime(tx, ino, Timespec::now())
        })
    }
}
