//! Scrub: read every tree block and every data extent from the device and
//! verify every checksum, then name the files the damage reaches.
//!
//! The extent tree lists every allocated extent, tree blocks and data
//! alike, so scrub walks it in key order rather than walking each tree:
//! one pass, in disk order (sequential reads), each extent once however
//! many trees share it. It works in short batches, each under the engine's
//! read lock, so on a mounted filesystem writers wait at most one batch:
//! a block reachable from the current state cannot be freed and reused
//! while the lock is held, so what scrub reads is what the state points
//! at. Tree blocks not yet on disk (dirty, or being written) are skipped.
//! Between batches an online scrub sleeps a quarter of the time the batch
//! took while the mount is busy (the engine saw transactions or data
//! reads of its own meanwhile), so it leaves at least a fifth of the
//! device's time (and every gap between batches) to the mount's reads
//! and writes; on an idle mount it runs at full speed, as btrfs's scrub
//! does at its idle I/O priority.
//!
//! Damaged data sectors, and data extents without checksums, are mapped
//! back to files through the file extent items of every file tree (the
//! top level, subvolumes and snapshots), and files to paths through their
//! back-references and each subvolume's link.

use crate::error::{Error, Result};
use crate::format::inode::DirEntry;
use crate::format::items::{ExtentItem, FileExtentItem, FILE_EXTENT_INLINE, FILE_EXTENT_PREALLOC};
use crate::format::key_type::{EXTENT_CSUM, EXTENT_DATA, EXTENT_ITEM, INODE_REF, ROOT_BACKREF};
use crate::format::tree_id::{is_shareable, EXTENT, FS, ROOT};
use crate::format::{Key, CSUM_OBJECTID, SECTORSIZE};
use crate::txn::{DataCopies, Engine, Reader};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SECTOR: u64 = SECTORSIZE as u64;
/// Most data one batch reads while holding the read lock.
const BATCH_BYTES: u64 = 4 << 20;
/// Most extents one batch visits.
const BATCH_EXTENTS: usize = 256;
/// Largest single read.
const READ_CHUNK: u64 = 1 << 20;
/// How far past the chunk being read a data extent is read ahead.
const PREFETCH_AHEAD: u64 = 4 << 20;

/// How far a scrub has come; shared with whoever shows progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Bytes of tree blocks and data read so far.
    pub bytes_done: u64,
    /// Bytes in use when the scrub started (an estimate of the total).
    pub bytes_total: u64,
    pub finished: bool,
}

/// A running scrub's shared state: progress out, cancellation in.
#[derive(Default)]
pub struct Control {
    progress: Mutex<Progress>,
    cancel: AtomicBool,
}

impl Control {
    pub fn progress(&self) -> Progress {
        crate::sync::lock(&self.progress).clone()
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Sets the estimate of the total (at the start).
    pub(crate) fn set_total(&self, bytes: u64) {
        crate::sync::lock(&self.progress).bytes_total = bytes;
    }

    /// Marks the work finished.
    pub(crate) fn finish(&self) {
        crate::sync::lock(&self.progress).finished = true;
    }

    fn advance(&self, bytes: u64) {
        crate::sync::lock(&self.progress).bytes_done += bytes;
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BadBlock {
    pub bytenr: u64,
    /// The tree that allocated it.
    pub tree: u64,
    pub error: String,
}

/// A bad copy of a block that has a good one: repaired, unless the scrub
/// was read-only.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BadCopy {
    pub bytenr: u64,
    /// Which copy (0: the one at `bytenr` itself).
    pub copy: usize,
    /// The tree that allocated the block.
    pub tree: u64,
    pub error: String,
    pub repaired: bool,
    /// A data sector (`bytenr` is its address), not a tree block.
    #[serde(default)]
    pub data: bool,
}

impl BadCopy {
    /// What the copy is of, as reports name it.
    pub fn what(&self) -> String {
        match self.data {
            true => format!("data sector {}", self.bytenr),
            false => format!("tree block {} (tree {})", self.bytenr, self.tree),
        }
    }
}

/// A file with damaged data: its byte ranges `[start, end)`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DamagedFile {
    pub ino: u64,
    /// The file tree holding it: 5, or a subvolume's or snapshot's id.
    #[serde(default = "top_level")]
    pub tree: u64,
    /// None when no name leads to it (its metadata is damaged too).
    pub path: Option<String>,
    pub ranges: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub tree_blocks: u64,
    pub data_extents: u64,
    pub data_bytes: u64,
    /// Data extents with no checksums to compare: preallocated space,
    /// which holds no data yet, and the data of `chattr +C` files.
    pub unchecked_extents: u64,
    /// Tree blocks every copy of which is bad: lost.
    pub bad_tree_blocks: Vec<BadBlock>,
    /// Bad copies of blocks with a good copy (`dup`).
    #[serde(default)]
    pub bad_copies: Vec<BadCopy>,
    /// Damaged data sectors, by device address.
    pub bad_data_sectors: Vec<u64>,
    pub damaged_files: Vec<DamagedFile>,
    /// The files whose data had a bad copy that another copy repaired
    /// (or, with `-r`, could repair), with the byte ranges.
    #[serde(default)]
    pub repaired_files: Vec<DamagedFile>,
    /// Data extents files read that have no checksum item (reads of them
    /// fail), by device address: damage of the checksum tree, not of the
    /// data, reported apart from mismatches.
    #[serde(default)]
    pub unsummed_extents: Vec<u64>,
    /// The files those extents belong to.
    #[serde(default)]
    pub unsummed_files: Vec<DamagedFile>,
    /// Why parts could not be scrubbed at all (the extent tree unreadable).
    pub errors: Vec<String>,
    pub cancelled: bool,
    pub seconds: f64,
}

impl Report {
    /// Nothing is lost and nothing is left bad: copies that were
    /// repaired do not count.
    pub fn is_clean(&self) -> bool {
        self.bad_copies.iter().all(|c| c.repaired)
            && self.bad_tree_blocks.is_empty()
            && self.bad_data_sectors.is_empty()
            && self.unsummed_extents.is_empty()
            && self.errors.is_empty()
    }
}

fn top_level() -> u64 {
    FS
}

/// How to pace the work.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Sleep a quarter of each batch's time between batches while the
    /// mount is busy (online).
    pub throttle: bool,
}

/// Scrubs everything the engine's state reaches.
pub fn run(engine: &Engine, ctl: &Control, pace: Pace) -> Result<Report> {
    let started = Instant::now();
    ctl.set_total(engine.space().0);
    let report = std::cell::RefCell::new(Report::default());
    let pending = std::cell::RefCell::new(Vec::new());
    let walked = walk_extents_batched(
        engine,
        ctl,
        pace,
        |r, key, item| {
            let report = &mut report.borrow_mut();
            match item.is_tree_block() {
                true => scrub_tree_block(r, key, item, report),
                false => gather_data(
                    r,
                    key.objectid,
                    key.offset,
                    report,
                    &mut pending.borrow_mut(),
                ),
            }
        },
        |r| {
            let extents = std::mem::take(&mut *pending.borrow_mut());
            scrub_data(r, &extents, &mut report.borrow_mut());
            Ok(())
        },
    );
    let mut report = report.into_inner();
    report.errors.extend(walked.errors);
    report.cancelled = walked.cancelled;
    if !report.bad_data_sectors.is_empty() {
        report.damaged_files = engine.read(|r| damaged_files(r, &report.bad_data_sectors))?;
    }
    let copies: Vec<u64> = report
        .bad_copies
        .iter()
        .filter(|c| c.data)
        .map(|c| c.bytenr)
        .collect();
    if !copies.is_empty() {
        report.repaired_files = engine.read(|r| damaged_files(r, &copies))?;
    }
    if !report.unsummed_extents.is_empty() {
        let starts = report.unsummed_extents.clone();
        report.unsummed_files = engine.read(|r| files_of_extents(r, &starts))?;
    }
    report.seconds = started.elapsed().as_secs_f64();
    ctl.finish();
    Ok(report)
}

/// How a walk over the extent tree ended.
pub(crate) struct Walked {
    pub cancelled: bool,
    /// Why parts could not be walked (the extent tree unreadable).
    pub errors: Vec<String>,
}

/// Calls `visit` on every extent item (tree block or data extent), in
/// key order, in short batches under the engine's read lock (see the
/// module's doc), pacing as `pace` says and stopping when `ctl` is
/// cancelled; `visit` returns the bytes it covered, for the progress.
pub(crate) fn walk_extents(
    engine: &Engine,
    ctl: &Control,
    pace: Pace,
    visit: impl FnMut(&Reader<'_>, Key, &ExtentItem) -> Result<u64>,
) -> Walked {
    walk_extents_batched(engine, ctl, pace, visit, |_| Ok(()))
}

/// [`walk_extents`], with `end_batch` called at the end of each batch,
/// still under the batch's read lock: work gathered by `visit` is done
/// there, on extents that cannot be freed meanwhile.
fn walk_extents_batched(
    engine: &Engine,
    ctl: &Control,
    pace: Pace,
    mut visit: impl FnMut(&Reader<'_>, Key, &ExtentItem) -> Result<u64>,
    mut end_batch: impl FnMut(&Reader<'_>) -> Result<()>,
) -> Walked {
    let mut walked = Walked {
        cancelled: false,
        errors: Vec::new(),
    };
    let mut next = Some(Key::MIN);
    while let Some(from) = next {
        if ctl.cancelled() {
            walked.cancelled = true;
            break;
        }
        let t = Instant::now();
        let busy_before = engine.foreground_work();
        let batch = |r: &Reader<'_>| {
            let next = walk_batch(r, from, ctl, &mut visit);
            end_batch(r)?;
            next
        };
        next = match engine.read(batch) {
            Ok(n) => n,
            Err(e) => {
                walked
                    .errors
                    .push(format!("extent tree unreadable at or after {from}: {e}"));
                None
            }
        };
        if pace.throttle && engine.foreground_work() != busy_before {
            std::thread::sleep((t.elapsed() / 4).min(Duration::from_secs(1)));
        }
    }
    walked
}

/// Visits extents from `from` on until the batch is full; returns where
/// the next batch starts.
fn walk_batch(
    r: &Reader<'_>,
    from: Key,
    ctl: &Control,
    visit: &mut impl FnMut(&Reader<'_>, Key, &ExtentItem) -> Result<u64>,
) -> Result<Option<Key>> {
    let mut c = r.cursor(EXTENT, &from)?;
    let (mut extents, mut bytes) = (0, 0);
    loop {
        let Some(it) = c.item() else { return Ok(None) };
        let (key, data) = (it.key, it.data.to_vec());
        if extents >= BATCH_EXTENTS || bytes >= BATCH_BYTES {
            return Ok(Some(key));
        }
        if key.ty == EXTENT_ITEM {
            let item = ExtentItem::decode(&data).map_err(|e| Error::corrupt(key.objectid, e))?;
            let len = visit(r, key, &item)?;
            ctl.advance(len);
            extents += 1;
            bytes += len;
        }
        c.next(r)?;
    }
}

fn scrub_tree_block(
    r: &Reader<'_>,
    key: Key,
    item: &ExtentItem,
    report: &mut Report,
) -> Result<u64> {
    let Some(verdict) = r.verify_block_on_disk(key.objectid, item.generation) else {
        return Ok(key.offset);
    };
    report.tree_blocks += 1;
    if verdict.lost() {
        let e = &verdict.bad[0].1;
        tracing::error!(bytenr = key.objectid, error = %e, "scrub: damaged tree block");
        report.bad_tree_blocks.push(BadBlock {
            bytenr: key.objectid,
            tree: item.owner,
            error: e.to_string(),
        });
        return Ok(key.offset);
    }
    for (copy, e) in &verdict.bad {
        report.bad_copies.push(BadCopy {
            bytenr: key.objectid,
            copy: *copy,
            tree: item.owner,
            error: e.to_string(),
            repaired: verdict.repaired,
            data: false,
        });
    }
    Ok(key.offset)
}

/// A data extent a batch scrubs once its walk is done.
struct DataExtent {
    bytenr: u64,
    len: u64,
    /// One crc32c per sector.
    sums: Vec<u8>,
}

/// Counts a data extent and queues it for [`scrub_data`]; one without
/// checksums is counted or reported here instead.
fn gather_data(
    r: &Reader<'_>,
    bytenr: u64,
    len: u64,
    report: &mut Report,
    pending: &mut Vec<DataExtent>,
) -> Result<u64> {
    report.data_extents += 1;
    report.data_bytes += len;
    let sums = r.get(
        crate::format::tree_id::CSUM,
        &Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr),
    )?;
    match sums {
        Some(sums) => pending.push(DataExtent { bytenr, len, sums }),
        None if has_no_sums(r, bytenr)? => report.unchecked_extents += 1,
        None => {
            tracing::error!(bytenr, "scrub: data extent without checksums");
            report.unsummed_extents.push(bytenr);
        }
    }
    Ok(len)
}

/// Verifies every copy of a batch's data extents and rewrites bad
/// sectors from a good copy. Each copy is read and checked on a thread
/// of its own (the copies lie on other devices, or apart on one), in
/// large reads with the next ones read ahead: the devices see several
/// requests at once and the checksums use both cores. A sector some copy
/// fails is then read again from each copy before anything is written,
/// so a repair is decided on what the copies hold now.
fn scrub_data(r: &Reader<'_>, extents: &[DataExtent], report: &mut Report) {
    let Some(last) = extents.last() else { return };
    let ahead_from = last.bytenr + last.len;
    let copies = extents
        .iter()
        .map(|e| r.data_copies(e.bytenr, e.len))
        .max()
        .unwrap_or(1);
    let check = |copy: usize| failed_sectors(r, extents, copy, ahead_from);
    let failed: Vec<Vec<u64>> = match copies {
        0 | 1 => vec![check(0)],
        _ => std::thread::scope(|s| {
            let threads: Vec<_> = (0..copies).map(|c| s.spawn(move || check(c))).collect();
            threads
                .into_iter()
                .enumerate()
                .map(|(c, t)| t.join().unwrap_or_else(|_| every_sector_of(extents, c, r)))
                .collect()
        }),
    };
    let mut suspects: Vec<u64> = failed.into_iter().flatten().collect();
    suspects.sort_unstable();
    suspects.dedup();
    for addr in suspects {
        if let Some(e) = extents
            .iter()
            .find(|e| (e.bytenr..e.bytenr + e.len).contains(&addr))
        {
            settle_sector(r, e, addr, report);
        }
    }
}

/// Every sector of the extents copy `copy` holds: what a checking thread
/// that died would have had to vouch for.
fn every_sector_of(extents: &[DataExtent], copy: usize, r: &Reader<'_>) -> Vec<u64> {
    extents
        .iter()
        .filter(|e| copy < r.data_copies(e.bytenr, e.len).max(1))
        .flat_map(|e| (e.bytenr..e.bytenr + e.len).step_by(SECTOR as usize))
        .collect()
}

/// The sectors of `extents` whose copy `copy` does not read or does not
/// match its checksum. Reads go chunk by chunk, with the range up to
/// `PREFETCH_AHEAD` past the chunk asked for ahead (past the batch's
/// last extent too, at `ahead_from`: the next batch's data most likely
/// lies there).
fn failed_sectors(
    r: &Reader<'_>,
    extents: &[DataExtent],
    copy: usize,
    ahead_from: u64,
) -> Vec<u64> {
    let mut failed = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK as usize];
    let mut prefetched = 0u64;
    let mut prefetch_to = |r: &Reader<'_>, from: u64, to: u64| {
        let from = from.max(prefetched);
        if to > from {
            r.prefetch_data_copy(from, to - from, copy);
            prefetched = to;
        }
    };
    for (i, e) in extents.iter().enumerate() {
        // An extent with no copy at all fails on copy 0, and is reported.
        if copy >= r.data_copies(e.bytenr, e.len).max(1) {
            continue;
        }
        let mut at = 0;
        while at < e.len {
            let n = (e.len - at).min(READ_CHUNK) as usize;
            let want_to = e.bytenr + at + n as u64 + PREFETCH_AHEAD;
            prefetch_to(r, e.bytenr + at + n as u64, want_to.min(e.bytenr + e.len));
            for next in &extents[i + 1..] {
                if next.bytenr >= want_to {
                    break;
                }
                prefetch_to(r, next.bytenr, (next.bytenr + next.len).min(want_to));
            }
            if i + 1 == extents.len() {
                prefetch_to(r, ahead_from, want_to.max(ahead_from + PREFETCH_AHEAD));
            }
            let read = r.read_data_copy(e.bytenr + at, &mut buf[..n], copy).is_ok();
            for (s, sector) in buf[..n].chunks(SECTOR as usize).enumerate() {
                let index = (at / SECTOR) as usize + s;
                if !read || !crate::format::sector_matches(&e.sums, index, sector) {
                    failed.push(e.bytenr + at + (s as u64) * SECTOR);
                }
            }
            at += n as u64;
        }
    }
    failed
}

/// Reads the sector at `addr` of extent `e` from every copy again and
/// rewrites the bad copies from a good one; with no good copy the sector
/// is damaged.
fn settle_sector(r: &Reader<'_>, e: &DataExtent, addr: u64, report: &mut Report) {
    let index = ((addr - e.bytenr) / SECTOR) as usize;
    let n = SECTOR.min(e.bytenr + e.len - addr) as usize;
    let copies = r.data_copies(addr, n as u64);
    let mut bufs = vec![vec![0u8; n]; copies];
    let good: Vec<bool> = bufs
        .iter_mut()
        .enumerate()
        .map(|(c, b)| {
            r.read_data_copy(addr, b, c).is_ok() && crate::format::sector_matches(&e.sums, index, b)
        })
        .collect();
    let Some(source) = good.iter().position(|&g| g) else {
        tracing::error!(bytenr = addr, "scrub: data checksum mismatch");
        report.bad_data_sectors.push(addr);
        return;
    };
    for copy in (0..copies).filter(|&c| !good[c]) {
        let repaired = r.repair_data_copy(addr, &bufs[source], (copy, source), None);
        report.bad_copies.push(BadCopy {
            bytenr: addr,
            copy,
            tree: 0,
            error: "data checksum mismatch".into(),
            repaired,
            data: true,
        });
    }
}

/// Whether the data extent at `bytenr` is meant to have no checksums:
/// preallocated space, or data of a `chattr +C` file. What one holder
/// says holds for all: writes into preallocated space go elsewhere
/// (except a `+C` file's), and `+C` files share data only with each
/// other. Anything unreadable on the way answers no, and the extent is
/// reported.
fn has_no_sums(r: &Reader<'_>, bytenr: u64) -> Result<bool> {
    let extents = r.root(EXTENT)?;
    let mut leaf = None;
    crate::extent::for_each_backref(r, &extents, bytenr, |holder, _| {
        if let crate::txn::RefHolder::DataLeaf(at) = holder {
            leaf = Some(at);
            return Ok(std::ops::ControlFlow::Break(()));
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    let Some(leaf) = leaf else { return Ok(false) };
    let Ok(Some(item)) = r.get(
        EXTENT,
        &Key::new(
            leaf,
            EXTENT_ITEM,
            crate::tree::BlockRead::nodesize(r) as u64,
        ),
    ) else {
        return Ok(false);
    };
    let Ok(generation) = ExtentItem::decode(&item).map(|e| e.generation) else {
        return Ok(false);
    };
    let Ok(node) = crate::tree::BlockRead::read_node(r, leaf, generation) else {
        return Ok(false);
    };
    let crate::format::node::Body::Leaf(items) = &node.body else {
        return Ok(false);
    };
    let holder = items
        .iter()
        .filter(|it| it.key.ty == EXTENT_DATA)
        .filter_map(|it| Some((it.key.objectid, FileExtentItem::decode(it.data).ok()?)))
        .find(|(_, fe)| fe.disk_extent().is_some_and(|(b, _)| b == bytenr));
    let Some((ino, fe)) = holder else {
        return Ok(false);
    };
    if fe.kind == FILE_EXTENT_PREALLOC {
        return Ok(true);
    }
    // The leaf's tree has the file's inode item (a snapshot sharing the
    // leaf has the same one).
    let inode = r.get(
        node.owner,
        &Key::new(ino, crate::format::key_type::INODE_ITEM, 0),
    );
    Ok(match inode {
        Ok(Some(i)) => crate::format::inode::InodeItem::decode(&i)
            .is_ok_and(|i| i.flags & crate::format::inode::INODE_NODATASUM != 0),
        _ => false,
    })
}

/// The files whose extents start at `starts`, with the byte ranges of
/// each that the extent holds.
fn files_of_extents(r: &Reader<'_>, starts: &[u64]) -> Result<Vec<DamagedFile>> {
    let starts: std::collections::BTreeSet<u64> = starts.iter().copied().collect();
    files_touching(r, |at, fe| match fe.disk_extent() {
        Some((b, _)) if starts.contains(&b) => vec![(at, at.saturating_add(fe.num_bytes))],
        _ => vec![],
    })
}

/// Every file of every file tree (the top level and each subvolume or
/// snapshot: a shared extent damages every file holding it) for which
/// `ranges` finds file byte ranges in one of its extent items (given the
/// item's file offset), with those ranges merged and a path.
fn files_touching(
    r: &Reader<'_>,
    ranges: impl Fn(u64, &FileExtentItem) -> Vec<(u64, u64)>,
) -> Result<Vec<DamagedFile>> {
    let mut out = Vec::new();
    for tree in r.tree_ids().into_iter().filter(|&t| is_shareable(t)) {
        let mut found: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        let mut c = r.cursor(tree, &Key::MIN)?;
        while let Some(it) = c.item() {
            if it.key.ty == EXTENT_DATA {
                if let Ok(fe) = FileExtentItem::decode(it.data) {
                    let rs = ranges(it.key.offset, &fe);
                    if !rs.is_empty() {
                        found.entry(it.key.objectid).or_default().extend(rs);
                    }
                }
            }
            c.next(r)?;
        }
        out.extend(found.into_iter().map(|(ino, rs)| DamagedFile {
            ino,
            tree,
            path: path_of(r, tree, ino),
            ranges: merge(rs),
        }));
    }
    Ok(out)
}

/// Sorted, overlapping and touching ranges joined.
fn merge(mut rs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    rs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in rs {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// The files whose extents cover the bad sectors, with the byte ranges.
fn damaged_files(r: &Reader<'_>, bad: &[u64]) -> Result<Vec<DamagedFile>> {
    let bad: std::collections::BTreeSet<u64> = bad.iter().copied().collect();
    files_touching(r, |at, fe| {
        if fe.kind == FILE_EXTENT_INLINE || fe.disk_bytenr == 0 {
            return vec![];
        }
        if fe.compression != 0 {
            // A bad sector of a compressed extent loses all the file
            // bytes the extent decodes to.
            let end = fe.disk_bytenr.saturating_add(fe.disk_num_bytes);
            return match bad.range(fe.disk_bytenr..end).next() {
                Some(_) => vec![(at, at.saturating_add(fe.num_bytes))],
                None => vec![],
            };
        }
        let used = fe.disk_bytenr.saturating_add(fe.offset);
        let end = used.saturating_add(fe.num_bytes);
        bad.range(used / SECTOR * SECTOR..end)
            .map(|&s| {
                let (from, to) = (s.max(used) - used, (s + SECTOR).min(end) - used);
                (at + from, at + to)
            })
            .collect()
    })
}

/// The first name the item at or after `key` (of its object and type)
/// in tree `in_tree` holds, and (its key's offset, the entry's inode):
/// for a back-reference (parent directory, parent directory), for a
/// subvolume's link (parent tree, directory in it).
fn first_name(r: &Reader<'_>, in_tree: u64, key: Key) -> Option<(String, (u64, u64))> {
    let c = r.cursor(in_tree, &key).ok()?;
    let it = c
        .item()
        .filter(|i| i.key.objectid == key.objectid && i.key.ty == key.ty)?;
    let e = DirEntry::decode_all(it.data).ok()?.into_iter().next()?;
    let name = String::from_utf8_lossy(&e.name).into_owned();
    Some((name, (it.key.offset, e.ino)))
}

/// A path from the top to `ino` of file tree `tree` through its first
/// name at each level, and through each subvolume's link (its
/// ROOT_BACKREF) up to the top level; None if a link is missing or loops.
fn path_of(r: &Reader<'_>, tree: u64, ino: u64) -> Option<String> {
    let root = crate::format::inode::ROOT_DIR_INO;
    let mut parts = Vec::new();
    let mut seen = HashSet::new();
    let (mut tree, mut at) = (tree, ino);
    loop {
        if !seen.insert((tree, at)) {
            return None;
        }
        if at == root && tree == FS {
            break;
        }
        // A subvolume's root is named by its link in the parent tree
        // (keyed by the subvolume, naming the parent tree and the
        // directory there), anything else by its first back-reference in
        // its own tree (keyed by the inode, naming the parent directory).
        let at_root = at == root;
        let (in_tree, key) = match at_root {
            true => (ROOT, Key::new(tree, ROOT_BACKREF, 0)),
            false => (tree, Key::new(at, INODE_REF, 0)),
        };
        let (name, (offset, ino)) = first_name(r, in_tree, key)?;
        parts.push(name);
        (tree, at) = if at_root {
            (offset, ino)
        } else {
            (tree, offset)
        };
    }
    parts.reverse();
    Some(format!("/{}", parts.join("/")))
}
