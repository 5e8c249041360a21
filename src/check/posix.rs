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

use super::sorted::{Sorted, Sorter};
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

/// Reads every fs tree through a read-only engine, holding at most about
/// `budget` bytes of what it relates (past it, sorted runs go to
/// temporary files).
pub(super) fn check_trees(
    dev: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    budget: u64,
    report: &mut Report,
) {
    let engine = match super::open_read_only(dev, space, budget * 2) {
        Ok(e) => e,
        Err(e) => return report.problem("filesystem", format!("cannot open: {e}")),
    };
    let ids = engine.read(|r| Ok(r.tree_ids())).unwrap_or_default();
    let mut links = Links::new();
    let mut summed = Sorter::new(budget / 4);
    for id in ids.iter().copied().filter(|&i| tree_id::is_shareable(i)) {
        let scan = TreeScan::new(id, budget / 2);
        if let Err(e) = scan.check(&engine, (&mut links, &mut summed), report) {
            report.problem(format!("tree {id}"), e.to_string());
        }
    }
    if let Err(e) = check_links(&engine, &ids, &links, report) {
        report.problem("root tree", e.to_string());
    }
    let sums = summed.sorted().map_err(spill_error);
    if let Err(e) = sums.and_then(|s| check_sums(&engine, s, report)) {
        report.problem("checksum tree", e.to_string());
    }
}

fn spill_error(e: std::io::Error) -> crate::Error {
    crate::Error::io("check's temporary file", e)
}

/// A 64-bit digest of bytes, the same in every run (std's SipHash with
/// fixed keys): what records carry in place of names.
fn digest(parts: &[&[u8]]) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    for p in parts {
        h.write(p);
    }
    h.finish()
}

/// Regular data extents as file extent items point at them, for the
/// checksum pass: `[address, length, tree, inode]`.
type Summed = Sorter<4>;

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

/// The next data extent of `summed` at another address than `last`.
fn next_extent(summed: &mut Sorted<4>, last: Option<u64>) -> crate::Result<Option<[u64; 4]>> {
    while let Some(s) = summed.next().map_err(spill_error)? {
        if Some(s[0]) != last {
            return Ok(Some(s));
        }
    }
    Ok(None)
}

fn without_sums(report: &mut Report, [bytenr, len, tree, ino]: [u64; 4]) {
    report.problem(
        format!("data extent {bytenr} of tree {tree} inode {ino}"),
        format!("{len} bytes without checksums (reads of it fail)"),
    );
}

/// Every regular data extent has exactly one checksum item, keyed at its
/// address, with one sum per sector (a read of a sector without one is
/// EIO); every checksum item belongs to such an extent. Both sides come
/// in address order and are walked side by side.
fn check_sums(engine: &Engine, mut summed: Sorted<4>, report: &mut Report) -> crate::Result<()> {
    let mut pending = next_extent(&mut summed, None)?;
    engine.read(|r| {
        let mut c = Cursor::seek(r, &r.root(tree_id::CSUM)?, &Key::MIN)?;
        while let Some(it) = c.item() {
            let k = it.key;
            if k.objectid == CSUM_OBJECTID && k.ty == EXTENT_CSUM {
                while let Some(s) = pending.filter(|s| s[0] < k.offset) {
                    without_sums(report, s);
                    pending = next_extent(&mut summed, Some(s[0]))?;
                }
                let sectors = (it.data.len() / 4) as u64;
                match pending.filter(|s| s[0] == k.offset) {
                    Some([_, len, tree, ino]) => {
                        if sectors * u64::from(SECTORSIZE) != len {
                            report.problem(
                                format!("data extent {} of tree {tree} inode {ino}", k.offset),
                                format!("{sectors} sector checksums for an extent of {len} bytes"),
                            );
                        }
                        pending = next_extent(&mut summed, Some(k.offset))?;
                    }
                    // A data extent only a deleted subvolume still holds
                    // (the cleaner has yet to drop it) keeps its sums.
                    None if is_data_extent(r, k.offset)? => {}
                    None => {
                        report.problem(format!("checksum item {k}"), "checksums of no data extent")
                    }
                }
            }
            c.next(r)?;
        }
        Ok(())
    })?;
    while let Some(s) = pending {
        without_sums(report, s);
        pending = next_extent(&mut summed, Some(s[0]))?;
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

/// Kinds of the records one fs tree's scan sorts by inode (the second
/// word, shifted left by 8; the low byte carries a file type or a flag).
const FACT_INODE: u64 = 0;
const FACT_ORPHAN: u64 = 1;
const FACT_NAME: u64 = 2;
const FACT_BACKREF: u64 = 3;

/// A record about inode `[0]`, of kind `[1] >> 8`:
/// - inode: `[_, _, has item, nlink << 32 | mode, 0]`;
/// - orphan item: `[_, _, 0, 0, 0]`;
/// - a name (a DIR_ITEM entry), file type in the low byte:
///   `[_, _, directory, name digest, DIR_ITEM key offset]`;
/// - a back-reference, 1 in the low byte for an INODE_EXTREF:
///   `[_, _, directory, name digest, key offset]`.
type Fact = [u64; 5];

fn fact(ino: u64, kind: u64, low: u8, rest: [u64; 3]) -> Fact {
    [ino, kind << 8 | u64::from(low), rest[0], rest[1], rest[2]]
}

/// What one inode's own items say, gathered while the scan is on them
/// (an inode's items are adjacent in its tree).
#[derive(Default)]
struct Object {
    ino: u64,
    item: Option<InodeItem>,
    /// File types its back-references carry.
    ref_kinds: Vec<u8>,
    subdirs: u32,
    entries: u64,
    indexes: u64,
    /// Bytes its file extent items account for (what `nbytes` records).
    accounted: u64,
    /// Digests of its entries as DIR_ITEM and as DIR_INDEX record them.
    by_name: Vec<u64>,
    by_index: Vec<u64>,
}

/// An entry's digest, the same whichever index holds it.
fn entry_digest(e: &DirEntry) -> u64 {
    digest(&[
        &e.name,
        &e.ino.to_le_bytes(),
        &[e.kind],
        &e.index.to_le_bytes(),
    ])
}

/// The multiset difference `a - b` of two sorted vectors.
fn minus(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() {
        if j == b.len() || a[i] < b[j] {
            out.push(a[i]);
            i += 1;
        } else if a[i] > b[j] {
            j += 1;
        } else {
            i += 1;
            j += 1;
        }
    }
    out
}

/// A multiset of digests, as counts.
fn counted<T: Ord>(items: impl IntoIterator<Item = T>) -> BTreeMap<T, usize> {
    let mut out = BTreeMap::new();
    for i in items {
        *out.entry(i).or_insert(0) += 1;
    }
    out
}

/// Takes one occurrence of `d` out of `set`, saying whether it was there.
fn take<T: Ord>(set: &mut BTreeMap<T, usize>, d: &T) -> bool {
    match set.get_mut(d) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    }
}

/// One fs tree checked in one ordered pass: what an inode's own items
/// must agree on is checked when the pass leaves the inode; what relates
/// inodes to each other (names and back-references, link counts, orphan
/// items) becomes [`Fact`]s, sorted by inode and compared afterwards.
struct TreeScan {
    tree: u64,
    object: Option<Object>,
    facts: Sorter<5>,
}

impl TreeScan {
    fn new(tree: u64, budget: u64) -> TreeScan {
        TreeScan {
            tree,
            object: None,
            facts: Sorter::new(budget),
        }
    }

    fn check(
        mut self,
        engine: &Engine,
        (links, summed): (&mut Links, &mut Summed),
        report: &mut Report,
    ) -> crate::Result<()> {
        let tree = self.tree;
        engine.read(|r| {
            let root = r.root(tree)?;
            let mut c = Cursor::seek(r, &root, &Key::MIN)?;
            while let Some(it) = c.item() {
                if self
                    .object
                    .as_ref()
                    .is_some_and(|o| o.ino != it.key.objectid)
                {
                    self.leave_object(engine, r, report)?;
                }
                self.note(it.key, it.data, links, report)?;
                if it.key.ty == EXTENT_DATA {
                    self.note_extent(it.key, it.data, summed, report)?;
                }
                c.next(r)?;
            }
            self.leave_object(engine, r, report)
        })?;
        self.relate(engine, report)
    }

    fn push(&mut self, f: Fact) -> crate::Result<()> {
        self.facts.push(f).map_err(spill_error)
    }

    /// The inode the scan is on, begun at its first item.
    fn object(&mut self, ino: u64) -> &mut Object {
        self.object.get_or_insert_with(|| Object {
            ino,
            ..Object::default()
        })
    }

    fn note(
        &mut self,
        k: Key,
        data: &[u8],
        links: &mut Links,
        report: &mut Report,
    ) -> crate::Result<()> {
        let tree = self.tree;
        let loc = || format!("tree {tree} item {k}");
        let of_inode = [
            INODE_ITEM,
            INODE_REF,
            INODE_EXTREF,
            DIR_ITEM,
            DIR_INDEX,
            XATTR_ITEM,
            EXTENT_DATA,
        ];
        if of_inode.contains(&k.ty) {
            if k.objectid > LAST_LOCAL_INO {
                report.problem(
                    loc(),
                    format!("inode number above {LAST_LOCAL_INO}, the last a subvolume has"),
                );
            }
            self.object(k.objectid);
        }
        match k.ty {
            INODE_ITEM => match InodeItem::decode(data) {
                Ok(i) => self.object(k.objectid).item = Some(i),
                Err(e) => report.problem(loc(), e),
            },
            DIR_ITEM | DIR_INDEX => match DirEntry::decode_all(data) {
                Ok(entries) => self.note_entries(k, &entries, links, report)?,
                Err(e) => report.problem(loc(), e),
            },
            INODE_REF => match DirEntry::decode_all(data) {
                Ok(refs) => {
                    for e in refs {
                        self.object(k.objectid).ref_kinds.push(e.kind);
                        let d = digest(&[&e.name]);
                        self.push(fact(k.objectid, FACT_BACKREF, 0, [k.offset, d, k.offset]))?;
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
                        let d = digest(&[&e.name]);
                        self.push(fact(k.objectid, FACT_BACKREF, 1, [e.ino, d, k.offset]))?;
                    }
                }
                Err(e) => report.problem(loc(), e),
            },
            ORPHAN_ITEM => self.push(fact(k.offset, FACT_ORPHAN, 0, [0; 3]))?,
            _ => {}
        }
        Ok(())
    }

    /// A directory's DIR_ITEM or DIR_INDEX item.
    fn note_entries(
        &mut self,
        k: Key,
        entries: &[DirEntry],
        links: &mut Links,
        report: &mut Report,
    ) -> crate::Result<()> {
        let tree = self.tree;
        let dir = self.object(k.objectid);
        let digests = entries.iter().map(entry_digest);
        if k.ty == DIR_INDEX {
            dir.indexes += entries.len() as u64;
            dir.by_index.extend(digests);
            return Ok(());
        }
        dir.entries += entries.len() as u64;
        dir.by_name.extend(digests);
        for e in entries {
            if u32::from(e.d_type()) << 12 == libc::S_IFDIR {
                self.object(k.objectid).subdirs += 1;
            }
            if e.is_subvolume() {
                links.insert((tree, e.ino, k.objectid, e.name.clone(), e.index));
                continue;
            }
            if e.ino > LAST_LOCAL_INO {
                report.problem(
                    format!("tree {tree} item {k}"),
                    format!("entry names inode {}, above {LAST_LOCAL_INO}", e.ino),
                );
            }
            let d = digest(&[&e.name]);
            self.push(fact(e.ino, FACT_NAME, e.kind, [k.objectid, d, k.offset]))?;
        }
        Ok(())
    }

    /// A file extent item: what a read of it will need (checksums, and a
    /// codec that decodes inline data).
    fn note_extent(
        &mut self,
        k: Key,
        data: &[u8],
        summed: &mut Summed,
        report: &mut Report,
    ) -> crate::Result<()> {
        let tree = self.tree;
        let loc = || format!("tree {tree} item {k}");
        let Ok(fe) = FileExtentItem::decode(data) else {
            // The item checker reports it.
            return Ok(());
        };
        let object = self.object(k.objectid);
        object.accounted += crate::fs::accounted_bytes(&fe);
        // A `chattr +C` file's data has no checksums (its inode item comes
        // before its extent items).
        let keeps_sums = object
            .item
            .as_ref()
            .is_none_or(|i| i.flags & crate::format::inode::INODE_NODATASUM == 0);
        if fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0 && keeps_sums {
            let record = [fe.disk_bytenr, fe.disk_num_bytes, self.tree, k.objectid];
            summed.push(record).map_err(spill_error)?;
        }
        let inline = fe.kind == FILE_EXTENT_INLINE;
        if inline && fe.compression != COMPRESS_NONE {
            if let Err(e) = crate::compress::decode(fe.compression, &fe.inline_data, fe.ram_bytes) {
                report.problem(loc(), format!("inline extent does not decode: {e}"));
            }
        }
        Ok(())
    }

    /// The scan leaves an inode: checks what its own items must agree on
    /// and records it for [`TreeScan::relate`].
    fn leave_object(
        &mut self,
        engine: &Engine,
        r: &crate::txn::Reader<'_>,
        report: &mut Report,
    ) -> crate::Result<()> {
        let Some(mut o) = self.object.take() else {
            return Ok(());
        };
        let Some(item) = o.item.take() else {
            return self.push(fact(o.ino, FACT_INODE, 0, [0; 3]));
        };
        let mode_nlink = u64::from(item.nlink) << 32 | u64::from(item.mode);
        self.push(fact(o.ino, FACT_INODE, 0, [1, mode_nlink, 0]))?;
        let loc = format!("tree {} inode {}", self.tree, o.ino);
        o.by_name.sort_unstable();
        o.by_index.sort_unstable();
        let reindexed = o.by_name != o.by_index && self.report_names(r, &mut o, report)?;
        if o.entries != o.indexes {
            let why = format!("{} entries by name but {} by index", o.entries, o.indexes);
            match reindexed {
                true => report.fixable(&loc, why, super::Fix::Counted),
                false => report.problem(&loc, why),
            }
        }
        let kind = crate::fs::dtype(item.mode);
        if let Some(other) = o.ref_kinds.iter().find(|&&k| k != kind) {
            report.problem(
                &loc,
                format!("named with file type {other}, but its mode says {kind}"),
            );
        }
        if item.mode & libc::S_IFMT == libc::S_IFDIR && item.nlink != 2 + o.subdirs {
            self.wrong_link_count(o.ino, item.nlink, 2 + o.subdirs, report);
        }
        if item.nbytes != o.accounted {
            let fix = super::Fix::Nbytes {
                tree: self.tree,
                ino: o.ino,
                nbytes: o.accounted,
            };
            let why = format!(
                "records {} bytes in use (nbytes), its extents account for {}",
                item.nbytes, o.accounted
            );
            report.fixable(&loc, why, fix);
        }
        if item.mode & libc::S_IFMT == libc::S_IFLNK {
            // As readlink reads it: its data must fill its size exactly,
            // without a NUL.
            if let Err(e) = crate::fs::committed_symlink_in(engine, r, self.tree, o.ino, item.size)
            {
                report.problem(&loc, e.to_string());
            }
        }
        Ok(())
    }

    fn wrong_link_count(&self, ino: u64, nlink: u32, expected: u32, report: &mut Report) {
        let fix = super::Fix::LinkCount {
            tree: self.tree,
            ino,
            nlink: expected,
        };
        let why = format!("link count {nlink} but {expected} found");
        report.fixable(format!("tree {} inode {ino}", self.tree), why, fix);
    }

    /// Reports the entries of directory `o` its two indexes disagree on
    /// (read again, now that the digests say which); returns whether its
    /// only disagreement is entries missing from the index by position,
    /// which `--repair` puts back (an entry listed by name is what
    /// lookups, link counts and back-references already follow; the
    /// reverse, or an entry listed differently in each, it leaves alone).
    fn report_names(
        &self,
        r: &crate::txn::Reader<'_>,
        o: &mut Object,
        report: &mut Report,
    ) -> crate::Result<bool> {
        let mut only_by_name = counted(minus(&o.by_name, &o.by_index));
        let mut only_by_index = counted(minus(&o.by_index, &o.by_name));
        let reindexed = only_by_index.is_empty();
        let dir = o.ino;
        let loc = format!("tree {} directory {dir}", self.tree);
        let mut c = Cursor::seek(r, &r.root(self.tree)?, &Key::new(dir, DIR_ITEM, 0))?;
        while let Some(it) = c.item().filter(|i| i.key.objectid == dir) {
            let (set, is, isnt) = match it.key.ty {
                DIR_ITEM => (&mut only_by_name, "by name", "by index"),
                DIR_INDEX => (&mut only_by_index, "by index", "by name"),
                _ => break,
            };
            for e in DirEntry::decode_all(it.data).unwrap_or_default() {
                if !take(set, &entry_digest(&e)) {
                    continue;
                }
                let why = format!(
                    "entry '{}' (inode {}, type {}, index {}) is listed {is} but not {isnt}",
                    String::from_utf8_lossy(&e.name),
                    e.ino,
                    e.kind,
                    e.index
                );
                match reindexed {
                    true => {
                        let fix = super::Fix::DirIndex {
                            tree: self.tree,
                            dir,
                            entry: Box::new(e),
                        };
                        report.fixable(&loc, why, fix);
                    }
                    false => report.problem(&loc, why),
                }
            }
            c.next(r)?;
        }
        Ok(reindexed)
    }

    /// Compares, inode by inode, the names that point at it with its
    /// back-references, its link count and its orphan item.
    fn relate(self, engine: &Engine, report: &mut Report) -> crate::Result<()> {
        let tree = self.tree;
        let mut facts = self.facts.sorted().map_err(spill_error)?;
        let mut group = Vec::new();
        while let Some(first) = facts.next().map_err(spill_error)? {
            group.clear();
            group.push(first);
            while let Some(f) = facts.peek().map_err(spill_error)? {
                if f[0] != first[0] {
                    break;
                }
                group.push(f);
                facts.next().map_err(spill_error)?;
            }
            self::relate_inode(engine, tree, first[0], &group, report)?;
        }
        Ok(())
    }
}

/// What the facts say of one inode.
fn relate_inode(
    engine: &Engine,
    tree: u64,
    ino: u64,
    facts: &[Fact],
    report: &mut Report,
) -> crate::Result<()> {
    let of = |kind: u64| facts.iter().filter(move |f| f[1] >> 8 == kind);
    let names: Vec<&Fact> = of(FACT_NAME).collect();
    let backrefs: Vec<&Fact> = of(FACT_BACKREF).collect();
    let orphan = of(FACT_ORPHAN).next().is_some();
    let loc = format!("tree {tree} inode {ino}");
    report_unmatched(engine, tree, ino, (&names, &backrefs), report)?;
    let inode = of(FACT_INODE).next();
    let Some(&[_, _, 1, mode_nlink, _]) = inode else {
        if !names.is_empty() {
            report.problem(loc, "directory entries name a missing inode");
        } else if inode.is_some() {
            report.problem(loc, "items of an inode that does not exist");
        }
        return Ok(());
    };
    let (mode, nlink) = (mode_nlink as u32, (mode_nlink >> 32) as u32);
    let kind = crate::fs::dtype(mode);
    if let Some(other) = names.iter().map(|f| f[1] as u8).find(|&k| k != kind) {
        report.problem(
            &loc,
            format!("named with file type {other}, but its mode says {kind}"),
        );
    }
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let found = names.len() as u32;
    if !is_dir && nlink != found {
        let fix = super::Fix::LinkCount {
            tree,
            ino,
            nlink: found,
        };
        report.fixable(&loc, format!("link count {nlink} but {found} found"), fix);
    }
    if names.is_empty() && ino != ROOT_DIR_INO && !orphan {
        let why = "inode with no name and no orphan item (leaked)";
        report.fixable(&loc, why, super::Fix::Orphan { tree, ino });
    }
    if is_dir && names.len() > 1 {
        report.problem(&loc, "directory with more than one name");
    }
    Ok(())
}

/// Names without the child's back-reference and back-references without
/// their name, each shown with the name read back from its item.
fn report_unmatched(
    engine: &Engine,
    tree: u64,
    ino: u64,
    (names, backrefs): (&[&Fact], &[&Fact]),
    report: &mut Report,
) -> crate::Result<()> {
    let pair = |f: &&Fact| (f[2], f[3]);
    let mut unmatched = counted(backrefs.iter().map(pair));
    let loc = format!("tree {tree} inode {ino}");
    for n in names {
        if take(&mut unmatched, &pair(n)) {
            continue;
        }
        let name = name_of(
            engine,
            tree,
            Key::new(n[2], DIR_ITEM, n[4]),
            n[3],
            Some(ino),
        )?;
        report.problem(
            &loc,
            format!(
                "named '{name}' in directory {} without a back-reference",
                n[2]
            ),
        );
    }
    let mut named = counted(names.iter().map(pair));
    for b in backrefs {
        if take(&mut named, &pair(b)) {
            continue;
        }
        let ty = if b[1] & 1 == 1 {
            INODE_EXTREF
        } else {
            INODE_REF
        };
        let name = name_of(engine, tree, Key::new(ino, ty, b[4]), b[3], None)?;
        report.problem(
            &loc,
            format!(
                "back-reference to '{name}' in directory {}, which has no such entry",
                b[2]
            ),
        );
    }
    Ok(())
}

/// The name in item `key` whose digest is `d` (and, for a directory's
/// entries, that names `child`), as text.
fn name_of(
    engine: &Engine,
    tree: u64,
    key: Key,
    d: u64,
    child: Option<u64>,
) -> crate::Result<String> {
    let data = engine.read(|r| r.get(tree, &key))?;
    let entries = data
        .as_deref()
        .map(DirEntry::decode_all)
        .and_then(|r| r.ok())
        .unwrap_or_default();
    Ok(entries
        .iter()
        .find(|e| digest(&[&e.name]) == d && child.is_none_or(|c| c == e.ino))
        .map_or("(unreadable)".into(), |e| {
            String::from_utf8_lossy(&e.name).into_owned()
        }))
}
