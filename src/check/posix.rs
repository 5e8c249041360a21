//! POSIX-level checks of every fs tree, run once the structure is sound:
//! each directory entry names an existing inode, DIR_ITEM and DIR_INDEX agree,
//! link counts equal the entries found (directories: 2 + subdirectories),
//! every name has the child's back-reference (INODE_REF or INODE_EXTREF) and every
//! back-reference a name, and inodes without links are orphans awaiting
//! deletion. Subvolume links: every entry naming a subvolume has its
//! ROOT_REF and ROOT_BACKREF with the same directory, name and index, and
//! every subvolume has exactly one link.

use super::Report;
use crate::dev::Device;
use crate::format::inode::{extref_hash, DirEntry, InodeItem, ROOT_DIR_INO};
use crate::format::key_type::{
    DIR_INDEX, DIR_ITEM, INODE_EXTREF, INODE_ITEM, INODE_REF, ORPHAN_ITEM, ROOT_BACKREF, ROOT_REF,
};
use crate::format::{tree_id, Key};
use crate::tree::Cursor;
use crate::Engine;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Default)]
struct Inode {
    item: Option<InodeItem>,
    /// Names pointing at it (DIR_ITEM entries).
    names: u32,
    subdirs: u32,
    entries: u64,
    indexes: u64,
}

/// Reads every fs tree through a read-only engine.
pub(super) fn check_trees(dev: Arc<dyn Device>, report: &mut Report) {
    let engine = match super::open_read_only(dev) {
        Ok(e) => e,
        Err(e) => return report.problem("filesystem", format!("cannot open: {e}")),
    };
    let ids = engine.read(|r| Ok(r.tree_ids())).unwrap_or_default();
    let mut links = Links::new();
    for id in ids.iter().copied().filter(|&i| tree_id::is_shareable(i)) {
        if let Err(e) = check_tree(&engine, id, &mut links, report) {
            report.problem(format!("tree {id}"), e.to_string());
        }
    }
    if let Err(e) = check_links(&engine, &ids, &links, report) {
        report.problem("root tree", e.to_string());
    }
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
                match DirEntry::decode_all(&it.data).map_err(|e| e.to_string()) {
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
    links: &mut Links,
    report: &mut Report,
) -> crate::Result<()> {
    let mut scan = TreeScan::new(tree);
    engine.read(|r| {
        let root = r.root(tree)?;
        let mut c = Cursor::seek(r, &root, &Key::MIN)?;
        while let Some(it) = c.item() {
            scan.note(it.key, &it.data, links, report);
            c.next(r)?;
        }
        Ok(())
    })?;
    scan.report_names(report);
    scan.report_inodes(report);
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
}

impl TreeScan {
    fn new(tree: u64) -> TreeScan {
        TreeScan {
            tree,
            inodes: BTreeMap::new(),
            orphans: BTreeSet::new(),
            named: BTreeSet::new(),
            referenced: BTreeSet::new(),
        }
    }

    fn note(&mut self, k: Key, data: &[u8], links: &mut Links, report: &mut Report) {
        let loc = || format!("tree {} item {k}", self.tree);
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
                    for e in entries.iter().filter(|_| k.ty == DIR_ITEM) {
                        if u32::from(e.d_type()) << 12 == libc::S_IFDIR {
                            self.inodes.entry(k.objectid).or_default().subdirs += 1;
                        }
                        if e.is_subvolume() {
                            links.insert((self.tree, e.ino, k.objectid, e.name.clone(), e.index));
                            continue;
                        }
                        self.inodes.entry(e.ino).or_default().names += 1;
                        self.named.insert((e.ino, k.objectid, e.name.clone()));
                    }
                }
                Err(e) => report.problem(loc(), e),
            },
            INODE_REF => match DirEntry::decode_all(data) {
                Ok(refs) => {
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

    fn report_names(&self, report: &mut Report) {
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
    }

    fn report_inodes(&self, report: &mut Report) {
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
                report.problem(
                    &loc,
                    format!("{} entries by name but {} by index", i.entries, i.indexes),
                );
            }
            let is_dir = item.mode & libc::S_IFMT == libc::S_IFDIR;
            let expected = if is_dir { 2 + i.subdirs } else { i.names };
            if item.nlink != expected {
                report.problem(
                    &loc,
                    format!("link count {} but {expected} found", item.nlink),
                );
            }
            let unreachable = i.names == 0 && ino != ROOT_DIR_INO;
            if unreachable && !self.orphans.contains(&ino) {
                report.problem(&loc, "inode with no name and no orphan item (leaked)");
            }
            if is_dir && i.names > 1 {
                report.problem(&loc, "directory with more than one name");
            }
        }
    }
}
