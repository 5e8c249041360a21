//! POSIX-level checks of every fs tree, run once the structure is sound:
//! each directory entry names an existing inode, DIR_ITEM and DIR_INDEX agree,
//! link counts equal the entries found (directories: 2 + subdirectories),
//! every name has the child's back-reference (INODE_REF or INODE_EXTREF) and every
//! back-reference a name, and inodes without links are orphans awaiting
//! deletion, and `nbytes` equals what its file extent items account
//! for. Subvolume links: every entry naming a subvolume has its
//! ROOT_REF and ROOT_BACKREF with the same directory, name and index, and
//! every subvolume has exactly one link.
//!
//! And what a read will rely on, as the mount would meet it: inode
//! numbers a node id can carry (`fs::LAST_LOCAL_INO`), in items and in
//! entries; a symlink's data read as readlink reads it (filling its
//! size, no NUL); compressed inline extents that decode with their codec; every
//! regular data extent covered exactly by one checksum item, and no
//! checksum item for anything else.

use super::Report;
use crate::dev::Device;
use crate::format::inode::{extref_hash, DirEntry, InodeItem, ROOT_DIR_INO};
use crate::format::items::{
    ExtentItem, FileExtentItem, COMPRESS_NONE, FILE_EXTENT_INLINE, FILE_EXTENT_REG,
};
use crate::format::key_type::{
    DIR_INDEX, DIR_ITEM, EXTENT_CSUM, EXTENT_DATA, EXTENT_ITEM, INODE_EXTREF, INODE_ITEM,
    INODE_REF, ORPHAN_ITEM, ROOT_BACKREF, ROOT_REF, XATTR_ITEM,
};
use crate::format::{tree_id, Key, CSUM_OBJECTID, SECTORSIZE};
use crate::fs::LAST_LOCAL_INO;
use crate::tree::Cursor;
use crate::Engine;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Default)]
struct Inode {
    item: Option<InodeItem>,
    /// File types its names (entries and back-references) carry.
    kinds: BTreeSet<u8>,
    /// Names pointing at it (DIR_ITEM entries).
    names: u32,
    subdirs: u32,
    entries: u64,
    indexes: u64,
    /// Bytes its file extent items account for (what `nbytes` records).
    accounted: u64,
}

/// Reads every fs tree through a read-only engine.
pub(super) fn check_trees(
    dev: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    report: &mut Report,
) {
    let engine = match super::open_read_only(dev, space) {
        Ok(e) => e,
        Err(e) => return report.problem("filesystem", format!("cannot open: {e}")),
    };
    let ids = engine.read(|r| Ok(r.tree_ids())).unwrap_or_default();
    let mut links = Links::new();
    let mut summed = Summed::new();
    for id in ids.iter().copied().filter(|&i| tree_id::is_shareable(i)) {
        if let Err(e) = check_tree(&engine, id, (&mut links, &mut summed), report) {
            report.problem(format!("tree {id}"), e.to_string());
        }
    }
    if let Err(e) = check_links(&engine, &ids, &links, report) {
        report.problem("root tree", e.to_string());
    }
    if let Err(e) = check_sums(&engine, &summed, report) {
        report.problem("checksum tree", e.to_string());
    }
}

/// Data extents reads verify against checksums: address → (length, one
/// holder as `tree {t} inode {i}`).
type Summed = BTreeMap<u64, (u64, String)>;

/// Whether the extent tree records a data extent at `bytenr`.
fn is_data_extent(r: &crate::txn::Reader<'_>, bytenr: u64) -> crate::Result<bool> {
    let c = Cursor::seek(
        r,
        &r.root(tree_id::EXTENT)?,
        &Key::new(bytenr, EXTENT_ITEM, 0),
    )?;
    let Some(it) = c
        .item()
        .filter(|i| i.key.objectid == bytenr && i.key.ty == EXTENT_ITEM)
    else {
        return Ok(false);
    };
    Ok(ExtentItem::decode(it.data).is_ok_and(|e| !e.is_tree_block()))
}

/// Every regular data extent has exactly one checksum item, keyed at its
/// address, with one sum per sector (a read of a sector without one is
/// EIO); every checksum item belongs to such an extent.
fn check_sums(engine: &Engine, summed: &Summed, report: &mut Report) -> crate::Result<()> {
    let mut seen = BTreeSet::new();
    engine.read(|r| {
        let mut c = Cursor::seek(r, &r.root(tree_id::CSUM)?, &Key::MIN)?;
        while let Some(it) = c.item() {
            let k = it.key;
            if k.objectid == CSUM_OBJECTID && k.ty == EXTENT_CSUM {
                let sectors = (it.data.len() / 4) as u64;
                match summed.get(&k.offset) {
                    Some((len, holder)) if sectors * u64::from(SECTORSIZE) != *len => {
                        report.problem(
                            format!("data extent {} of {holder}", k.offset),
                            format!("{sectors} sector checksums for an extent of {len} bytes"),
                        );
                    }
                    Some(_) => {}
                    // A data extent only a deleted subvolume still holds
                    // (the cleaner has yet to drop it) keeps its sums.
                    None if is_data_extent(r, k.offset)? => {}
                    None => {
                        report.problem(format!("checksum item {k}"), "checksums of no data extent")
                    }
                }
                seen.insert(k.offset);
            }
            c.next(r)?;
        }
        Ok(())
    })?;
    for (bytenr, (len, holder)) in summed.iter().filter(|(b, _)| !seen.contains(*b)) {
        report.problem(
            format!("data extent {bytenr} of {holder}"),
            format!("{len} bytes without checksums (reads of it fail)"),
        );
    }
    Ok(())
}

/// Subvolume links: (parent tree, subvolume, directory, name, index).
type Links = BTreeSet<(u64, u64, u64, Vec<u8>, u64)>;

/// Compares the subvolume entries found in fs trees with the root tree's
/// ROOT_REF and ROOT_BACKREF items.
fn check_links(
    engine: &Engine,
    ids: &[u64],
    found: &Links,
    report: &mut Report,
) -> crate::Result<()> {
    let (refs, backrefs) = engine.read(|r| {
        let mut refs = Links::new();
        let mut backrefs = Links::new();
        let mut c = Cursor::seek(r, &r.root(tree_id::ROOT)?, &Key::MIN)?;
        while let Some(it) = c.item() {
            let k = it.key;
            if k.ty == ROOT_REF || k.ty == ROOT_BACKREF {
                match DirEntry::decode_all(it.data).map_err(|e| e.to_string()) {
                    Ok(v) if v.len() == 1 => {
                        let e = &v[0];
                        let (parent, sub, set) = if k.ty == ROOT_REF {
                            (k.objectid, k.offset, &mut refs)
                        } else {
                            (k.offset, k.objectid, &mut backrefs)
                        };
                        set.insert((parent, sub, e.ino, e.name.clone(), e.index));
                    }
                    _ => report.problem(format!("root tree item {k}"), "bad root reference"),
                }
            }
            c.next(r)?;
        }
        Ok((refs, backrefs))
    })?;
    let show = |l: &(u64, u64, u64, Vec<u8>, u64)| {
        format!(
            "subvolume {} as '{}' in directory {} of tree {}",
            l.1,
            String::from_utf8_lossy(&l.3),
            l.2,
            l.0
        )
    };
    for l in found.difference(&refs) {
        report.problem(show(l), "directory entry without its ROOT_REF");
    }
    for l in refs.difference(found) {
        report.problem(show(l), "ROOT_REF without its directory entry");
    }
    for l in refs.symmetric_difference(&backrefs) {
        report.problem(show(l), "ROOT_REF and ROOT_BACKREF disagree");
    }
    for &id in ids.iter().filter(|&&i| tree_id::is_subvolume(i)) {
        let n = backrefs.iter().filter(|l| l.1 == id).count();
        if n != 1 {
            report.problem(
                format!("subvolume {id}"),
                format!("{n} links instead of one"),
            );
        }
    }
    for l in refs.iter().chain(&backrefs) {
        if !ids.contains(&l.1) {
            report.problem(show(l), "links a subvolume that does not exist");
        }
    }
    Ok(())
}

fn check_tree(
    engine: &Engine,
    tree: u64,
    (links, summed): (&mut Links, &mut Summed),
    report: &mut Report,
) -> crate::Result<()> {
    let mut scan = TreeScan::new(tree);
    engine.read(|r| {
        let root = r.root(tree)?;
        let mut c = Cursor::seek(r, &root, &Key::MIN)?;
        while let Some(it) = c.item() {
            scan.note(it.key, it.data, links, report);
            if it.key.ty == EXTENT_DATA {
                scan.note_extent(it.key, it.data, summed, report);
            }
            c.next(r)?;
        }
        Ok(())
    })?;
    let reindexed = scan.report_names(report);
    scan.report_inodes(&reindexed, report);
    scan.check_symlinks(engine, report);
    Ok(())
}

/// What one fs tree's items say about its inodes and names, gathered in
/// one pass and compared afterwards.
struct TreeScan {
    tree: u64,
    inodes: BTreeMap<u64, Inode>,
    orphans: BTreeSet<u64>,
    /// (child, directory, name) as the directory lists it and as the
    /// child's back-references do.
    named: BTreeSet<(u64, u64, Vec<u8>)>,
    referenced: BTreeSet<(u64, u64, Vec<u8>)>,
    /// Every entry as its DIR_ITEM and as its DIR_INDEX record it:
    /// (directory, name, inode, type, index). A listing reads the index, a
    /// lookup the name: the two must say the same.
    by_name: BTreeSet<Entry>,
    by_index: BTreeSet<Entry>,
}

type Entry = (u64, Vec<u8>, u64, u8, u64);

impl TreeScan {
    fn new(tree: u64) -> TreeScan {
        TreeScan {
            tree,
            inodes: BTreeMap::new(),
            orphans: BTreeSet::new(),
            named: BTreeSet::new(),
            referenced: BTreeSet::new(),
            by_name: BTreeSet::new(),
            by_index: BTreeSet::new(),
        }
    }

    fn note(&mut self, k: Key, data: &[u8], links: &mut Links, report: &mut Report) {
        let loc = || format!("tree {} item {k}", self.tree);
        let of_inode = [
            INODE_ITEM,
            INODE_REF,
            INODE_EXTREF,
            DIR_ITEM,
            DIR_INDEX,
            XATTR_ITEM,
            EXTENT_DATA,
        ];
        if of_inode.contains(&k.ty) && k.objectid > LAST_LOCAL_INO {
            report.problem(
                loc(),
                format!("inode number above {LAST_LOCAL_INO}, the last a subvolume has"),
            );
        }
        match k.ty {
            INODE_ITEM => match InodeItem::decode(data) {
                Ok(i) => self.inodes.entry(k.objectid).or_default().item = Some(i),
                Err(e) => report.problem(loc(), e),
            },
            DIR_ITEM | DIR_INDEX => match DirEntry::decode_all(data) {
                Ok(entries) => {
                    let dir = self.inodes.entry(k.objectid).or_default();
                    if k.ty == DIR_ITEM {
                        dir.entries += entries.len() as u64;
                    } else {
                        dir.indexes += entries.len() as u64;
                    }
                    let set = match k.ty {
                        DIR_ITEM => &mut self.by_name,
                        _ => &mut self.by_index,
                    };
                    for e in &entries {
                        set.insert((k.objectid, e.name.clone(), e.ino, e.kind, e.index));
                    }
                    for e in entries.iter().filter(|_| k.ty == DIR_ITEM) {
                        if u32::from(e.d_type()) << 12 == libc::S_IFDIR {
                            self.inodes.entry(k.objectid).or_default().subdirs += 1;
                        }
                        if e.is_subvolume() {
                            links.insert((self.tree, e.ino, k.objectid, e.name.clone(), e.index));
                            continue;
                        }
                        if e.ino > LAST_LOCAL_INO {
                            report.problem(
                                loc(),
                                format!("entry names inode {}, above {LAST_LOCAL_INO}", e.ino),
                            );
                        }
                        let child = self.inodes.entry(e.ino).or_default();
                        child.names += 1;
                        child.kinds.insert(e.kind);
                        self.named.insert((e.ino, k.objectid, e.name.clone()));
                    }
                }
                Err(e) => report.problem(loc(), e),
            },
            INODE_REF => match DirEntry::decode_all(data) {
                Ok(refs) => {
                    let kinds = &mut self.inodes.entry(k.objectid).or_default().kinds;
                    kinds.extend(refs.iter().map(|e| e.kind));
                    for e in refs {
                        self.referenced.insert((k.objectid, k.offset, e.name));
                    }
                }
                Err(e) => report.problem(loc(), e),
            },
            INODE_EXTREF => match DirEntry::decode_all(data) {
                Ok(refs) => {
                    for e in refs {
                        if extref_hash(e.ino, &e.name) != k.offset {
                            report.problem(loc(), "extended back-reference under the wrong hash");
                        }
                        self.referenced.insert((k.objectid, e.ino, e.name));
                    }
                }
                Err(e) => report.problem(loc(), e),
            },
            ORPHAN_ITEM => {
                self.orphans.insert(k.offset);
            }
            _ => {}
        }
    }

    /// A file extent item: what a read of it will need (checksums, and a
    /// codec that decodes inline data).
    fn note_extent(&mut self, k: Key, data: &[u8], summed: &mut Summed, report: &mut Report) {
        let loc = || format!("tree {} item {k}", self.tree);
        let Ok(fe) = FileExtentItem::decode(data) else {
            // The item checker reports it.
            return;
        };
        self.inodes.entry(k.objectid).or_default().accounted += crate::fs::accounted_bytes(&fe);
        let holder = || format!("tree {} inode {}", self.tree, k.objectid);
        if fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0 {
            summed
                .entry(fe.disk_bytenr)
                .or_insert_with(|| (fe.disk_num_bytes, holder()));
        }
        let inline = fe.kind == FILE_EXTENT_INLINE;
        if inline && fe.compression != COMPRESS_NONE {
            if let Err(e) = crate::compress::decode(fe.compression, &fe.inline_data, fe.ram_bytes) {
                report.problem(loc(), format!("inline extent does not decode: {e}"));
            }
        }
    }

    /// Every symlink read as readlink reads it: its data must fill its
    /// size exactly, without a NUL.
    fn check_symlinks(&self, engine: &Engine, report: &mut Report) {
        for (&ino, i) in &self.inodes {
            let Some(item) = i.item.as_ref() else {
                continue;
            };
            if item.mode & libc::S_IFMT != libc::S_IFLNK {
                continue;
            }
            if let Err(e) = crate::fs::committed_symlink(engine, self.tree, ino, item.size) {
                report.problem(format!("tree {} inode {ino}", self.tree), e.to_string());
            }
        }
    }

    /// Reports entries the two indexes disagree on; returns the
    /// directories whose only disagreement is entries missing from the
    /// index by position, which `--repair` puts back (an entry listed by
    /// name is what lookups, link counts and back-references already
    /// follow; the reverse, or an entry listed differently in each,
    /// it leaves alone).
    fn report_names(&self, report: &mut Report) -> BTreeSet<u64> {
        let only_by_name: Vec<&Entry> = self.by_name.difference(&self.by_index).collect();
        let only_by_index: Vec<&Entry> = self.by_index.difference(&self.by_name).collect();
        let unfixable: BTreeSet<u64> = only_by_index.iter().map(|e| e.0).collect();
        let reindexed: BTreeSet<u64> = only_by_name
            .iter()
            .map(|e| e.0)
            .filter(|d| !unfixable.contains(d))
            .collect();
        let sides = [
            (only_by_name, "by name", "by index"),
            (only_by_index, "by index", "by name"),
        ];
        for (entries, is, isnt) in sides {
            for (dir, name, ino, kind, index) in entries {
                let loc = format!("tree {} directory {dir}", self.tree);
                let why = format!(
                    "entry '{}' (inode {ino}, type {kind}, index {index}) is listed {is} \
                     but not {isnt}",
                    String::from_utf8_lossy(name)
                );
                match reindexed.contains(dir) {
                    true => {
                        let entry = DirEntry {
                            ino: *ino,
                            kind: *kind,
                            index: *index,
                            name: name.clone(),
                        };
                        let fix = super::Fix::DirIndex {
                            tree: self.tree,
                            dir: *dir,
                            entry: Box::new(entry),
                        };
                        report.fixable(loc, why, fix);
                    }
                    false => report.problem(loc, why),
                }
            }
        }
        for (ino, dir, name) in self.named.difference(&self.referenced) {
            let name = String::from_utf8_lossy(name);
            report.problem(
                format!("tree {} inode {ino}", self.tree),
                format!("named '{name}' in directory {dir} without a back-reference"),
            );
        }
        for (ino, dir, name) in self.referenced.difference(&self.named) {
            let name = String::from_utf8_lossy(name);
            report.problem(
                format!("tree {} inode {ino}", self.tree),
                format!("back-reference to '{name}' in directory {dir}, which has no such entry"),
            );
        }
        reindexed
    }

    fn report_inodes(&self, reindexed: &BTreeSet<u64>, report: &mut Report) {
        for (&ino, i) in &self.inodes {
            let loc = format!("tree {} inode {ino}", self.tree);
            let Some(item) = &i.item else {
                if i.names > 0 {
                    report.problem(loc, "directory entries name a missing inode");
                } else {
                    report.problem(loc, "items of an inode that does not exist");
                }
                continue;
            };
            if i.entries != i.indexes {
                let why = format!("{} entries by name but {} by index", i.entries, i.indexes);
                match reindexed.contains(&ino) {
                    true => report.fixable(&loc, why, super::Fix::Counted),
                    false => report.problem(&loc, why),
                }
            }
            let kind = crate::fs::dtype(item.mode);
            if let Some(other) = i.kinds.iter().find(|&&k| k != kind) {
                report.problem(
                    &loc,
                    format!("named with file type {other}, but its mode says {kind}"),
                );
            }
            let is_dir = item.mode & libc::S_IFMT == libc::S_IFDIR;
            let expected = if is_dir { 2 + i.subdirs } else { i.names };
            if item.nlink != expected {
                let fix = super::Fix::LinkCount {
                    tree: self.tree,
                    ino,
                    nlink: expected,
                };
                let why = format!("link count {} but {expected} found", item.nlink);
                report.fixable(&loc, why, fix);
            }
            if item.nbytes != i.accounted {
                let fix = super::Fix::Nbytes {
                    tree: self.tree,
                    ino,
                    nbytes: i.accounted,
                };
                let why = format!(
                    "records {} bytes in use (nbytes), its extents account for {}",
                    item.nbytes, i.accounted
                );
                report.fixable(&loc, why, fix);
            }
            let unreachable = i.names == 0 && ino != ROOT_DIR_INO;
            if unreachable && !self.orphans.contains(&ino) {
                let fix = super::Fix::Orphan {
                    tree: self.tree,
                    ino,
                };
                let why = "inode with no name and no orphan item (leaked)";
                report.fixable(&loc, why, fix);
            }
            if is_dir && i.names > 1 {
                report.problem(&loc, "directory with more than one name");
            }
        }
    }
}
