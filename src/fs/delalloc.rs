//! Delayed allocation: file data written through the mount is buffered in
//! memory, per inode, as merged byte ranges, and only given extents when it
//! is flushed (by a commit, fsync, an operation that needs the file's data
//! in the tree, or when the buffered total passes the dirty limit).
//!
//! Flushing whole merged ranges at once lets the allocator hand out large
//! contiguous extents (a 1 GiB sequential write becomes 2 MiB extents laid
//! end to end) instead of one small extent per write request, and lets many
//! small writes to one region cost one copy-on-write of it.
//!
//! Locking: the buffers are changed only inside an engine write closure (so
//! a buffer and the inode size it implies change together) or read inside
//! an engine read closure; the engine's state lock is always taken first.
//!
//! Space: buffered data holds a reservation of its *footprint*, the sectors
//! its ranges touch (partial sectors are rewritten whole), in the engine
//! (`txn::space`). Every change of the buffers passes the running `Txn`
//! and moves the reservation by the footprint's change, so the two never
//! drift apart; a flush gives back the footprint of what it takes just
//! before it allocates the extents.

use crate::error::{Error, Result};
use crate::format::SECTORSIZE;
use crate::txn::Txn;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Length past which appends start a new range.
const RANGE_MAX: u64 = 4 << 20;

/// Default limit of buffered bytes before writers flush.
pub const DEFAULT_DIRTY_LIMIT: u64 = 64 << 20;

/// Non-overlapping buffered ranges of one file: start → bytes. A range
/// stops growing by appends at [`RANGE_MAX`] (the next append starts a new,
/// adjacent range), so a flush can take whole ranges without splitting.
pub(crate) type Ranges = BTreeMap<u64, Vec<u8>>;

/// The buffered data of every file.
pub(crate) struct Delalloc {
    files: Mutex<HashMap<u64, Ranges>>,
    bytes: AtomicU64,
    limit: AtomicU64,
}

/// Bytes of the sectors `[start, start+len)` touches.
pub(crate) fn span(start: u64, len: u64) -> u64 {
    let s = u64::from(SECTORSIZE);
    if len == 0 {
        return 0;
    }
    (start + len).div_ceil(s) * s - start / s * s
}

fn ranges_footprint<'a>(it: impl Iterator<Item = (&'a u64, &'a Vec<u8>)>) -> u64 {
    it.map(|(&s, d)| span(s, d.len() as u64)).sum()
}

/// Moves the engine's data reservation (the sum of every file's
/// footprint) from `before` to `after` bytes.
fn adjust(tx: &mut Txn<'_>, before: u64, after: u64) {
    if after > before {
        tx.hold_data(after - before);
    } else {
        tx.release_data(before - after);
    }
}

impl Delalloc {
    pub fn new() -> Delalloc {
        Delalloc {
            files: Mutex::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            limit: AtomicU64::new(DEFAULT_DIRTY_LIMIT),
        }
    }

    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Bytes buffered in all files.
    pub fn total(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn over_limit(&self) -> bool {
        self.total() > self.limit.load(Ordering::Relaxed)
    }

    /// Bytes buffered for `ino`.
    pub fn bytes_of(&self, ino: u64) -> u64 {
        crate::sync::lock(&self.files)
            .get(&ino)
            .map_or(0, ranges_len)
    }

    /// Buffers `data` at `offset` of `ino`, merging with ranges it overlaps
    /// or touches. The caller has checked that [`span`] of it fits.
    pub fn insert(&self, tx: &mut Txn<'_>, ino: u64, offset: u64, data: &[u8]) {
        let mut files = crate::sync::lock(&self.files);
        let merged = insert_range(files.entry(ino).or_default(), offset, data);
        self.bytes.fetch_add(merged.grown, Ordering::Relaxed);
        adjust(tx, merged.span_before, merged.span_after);
    }

    /// Copies buffered bytes over `buf`, which holds `[offset, offset+len)`.
    pub fn overlay(&self, ino: u64, offset: u64, buf: &mut [u8]) {
        let files = crate::sync::lock(&self.files);
        let Some(ranges) = files.get(&ino) else {
            return;
        };
        let end = offset + buf.len() as u64;
        for (&s, data) in overlapping(ranges, offset, end) {
            let from = s.max(offset);
            let to = (s + data.len() as u64).min(end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - s) as usize..(to - s) as usize]);
        }
    }

    /// The buffered range containing `pos`, or else the first one after it:
    /// (start, end).
    pub fn range_at_or_after(&self, ino: u64, pos: u64) -> Option<(u64, u64)> {
        let files = crate::sync::lock(&self.files);
        let ranges = files.get(&ino)?;
        let from = start_of_range_containing(ranges, pos).unwrap_or(pos);
        ranges
            .range(from..)
            .next()
            .map(|(&s, d)| (s, s + d.len() as u64))
    }

    /// Takes whole ranges of `ino`, lowest offsets first, until about
    /// `budget` bytes (at least one range), and gives back their space
    /// reservation for the flush that allocates them.
    pub fn take(&self, tx: &mut Txn<'_>, ino: u64, budget: u64) -> Ranges {
        let mut files = crate::sync::lock(&self.files);
        let Some(ranges) = files.get_mut(&ino) else {
            return Ranges::new();
        };
        let mut out = Ranges::new();
        let mut taken = 0u64;
        while taken < budget {
            let Some((s, data)) = ranges.pop_first() else {
                break;
            };
            taken += data.len() as u64;
            out.insert(s, data);
        }
        if ranges.is_empty() {
            files.remove(&ino);
        }
        self.bytes.fetch_sub(taken, Ordering::Relaxed);
        adjust(tx, ranges_footprint(out.iter()), 0);
        out
    }

    /// Puts back ranges a failed flush took, under anything buffered since.
    pub fn restore(&self, tx: &mut Txn<'_>, ino: u64, taken: Ranges) {
        let mut files = crate::sync::lock(&self.files);
        let before = files.get(&ino).map_or(0, |r| ranges_footprint(r.iter()));
        let newer = files.remove(&ino).unwrap_or_default();
        let mut merged = Ranges::new();
        for (s, d) in taken.into_iter().chain(newer) {
            insert_range(&mut merged, s, &d);
        }
        let after = ranges_footprint(merged.iter());
        files.insert(ino, merged);
        // Restored and newer bytes may overlap: count afresh (rare path).
        self.recount(&files);
        adjust(tx, before, after);
    }

    /// Drops `ino`'s buffered bytes at and past `size` (a truncate).
    pub fn truncate(&self, tx: &mut Txn<'_>, ino: u64, size: u64) {
        let mut files = crate::sync::lock(&self.files);
        let Some(ranges) = files.get_mut(&ino) else {
            return;
        };
        // The range holding `size` (cut short) and every one after it.
        let from = start_of_range_containing(ranges, size).unwrap_or(size);
        let touched = |r: &Ranges| ranges_footprint(r.range(from..));
        let before = touched(ranges);
        let mut dropped = 0u64;
        let past: Vec<u64> = ranges.range(size..).map(|(&s, _)| s).collect();
        for s in past {
            dropped += ranges.remove(&s).map_or(0, |d| d.len() as u64);
        }
        if let Some((&s, d)) = ranges.range_mut(..size).next_back() {
            let keep = (size - s) as usize;
            if d.len() > keep {
                dropped += (d.len() - keep) as u64;
                d.truncate(keep);
            }
        }
        let after = touched(ranges);
        if ranges.is_empty() {
            files.remove(&ino);
        }
        self.bytes.fetch_sub(dropped, Ordering::Relaxed);
        adjust(tx, before, after);
    }

    /// Forgets `ino`'s buffered bytes (the inode is gone).
    pub fn discard(&self, tx: &mut Txn<'_>, ino: u64) {
        let mut files = crate::sync::lock(&self.files);
        if let Some(r) = files.remove(&ino) {
            self.bytes.fetch_sub(ranges_len(&r), Ordering::Relaxed);
            adjust(tx, ranges_footprint(r.iter()), 0);
        }
    }

    /// Inodes with buffered data, largest first.
    pub fn dirty_inodes(&self) -> Vec<u64> {
        let files = crate::sync::lock(&self.files);
        let mut v: Vec<(u64, u64)> = files.iter().map(|(&i, r)| (ranges_len(r), i)).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.into_iter().map(|(_, i)| i).collect()
    }

    fn recount(&self, files: &HashMap<u64, Ranges>) {
        let total = files.values().map(ranges_len).sum();
        self.bytes.store(total, Ordering::Relaxed);
    }
}

/// Most bytes one flush transaction writes, so that a large flush does not
/// hold the state lock (and stall `stat`/`ls`) for long at a time.
const FLUSH_CHUNK: u64 = 4 << 20;

impl super::Fs {
    /// Gives extents to up to `budget` buffered bytes of `ino`, inside the
    /// caller's transaction. Returns whether anything was buffered. On error
    /// the bytes go back to the buffer.
    pub(crate) fn flush_in(&self, tx: &mut Txn<'_>, ino: u64, budget: u64) -> Result<bool> {
        let taken = self.delalloc.take(tx, ino, budget);
        if taken.is_empty() {
            return Ok(false);
        }
        match self.write_ranges(tx, ino, &taken) {
            Ok(()) => Ok(true),
            Err(e) => {
                self.delalloc.restore(tx, ino, taken);
                Err(e)
            }
        }
    }

    fn write_ranges(&self, tx: &mut Txn<'_>, ino: u64, ranges: &Ranges) -> Result<()> {
        let tree = self.tree;
        let mut inode = match super::load_inode_tx(tx, tree, ino) {
            // Deleted while its data waited: nothing to write.
            Err(Error::NotFound) => return Ok(()),
            r => r?,
        };
        let mut delta = 0i64;
        for (&offset, data) in ranges {
            self.note_extents(tx, ino, inode.size, offset, offset + data.len() as u64);
            delta += super::file::write(tx, tree, ino, inode.size, offset, data)?;
            inode.size = inode.size.max(offset + data.len() as u64);
        }
        inode.nbytes = (inode.nbytes as i64 + delta).max(0) as u64;
        super::store_inode(tx, tree, ino, inode)
    }

    /// Flushes all of `ino`'s buffered data, a chunk per transaction.
    pub(crate) fn flush_file(&self, ino: u64) -> Result<()> {
        while self
            .engine
            .write(|tx| self.flush_in(tx, ino, FLUSH_CHUNK))?
        {
            self.engine.let_readers_in();
        }
        Ok(())
    }

    /// Flushes every file's buffered data.
    pub(crate) fn flush_all(&self) -> Result<()> {
        for ino in self.delalloc.dirty_inodes() {
            self.flush_file(ino)?;
        }
        Ok(())
    }

    /// Called by writers past the dirty limit: flushes the largest files
    /// until half the limit is left.
    pub(crate) fn flush_to_limit(&self) -> Result<()> {
        let target = self.delalloc.limit.load(Ordering::Relaxed) / 2;
        for ino in self.delalloc.dirty_inodes() {
            if self.delalloc.total() <= target {
                break;
            }
            self.flush_file(ino)?;
        }
        Ok(())
    }
}

fn ranges_len(r: &Ranges) -> u64 {
    r.values().map(|v| v.len() as u64).sum()
}

/// Start of the range holding byte `pos`, if one does.
fn start_of_range_containing(ranges: &Ranges, pos: u64) -> Option<u64> {
    ranges
        .range(..=pos)
        .next_back()
        .filter(|(&s, d)| s + d.len() as u64 > pos)
        .map(|(&s, _)| s)
}

/// Ranges overlapping `[start, end)`.
fn overlapping(ranges: &Ranges, start: u64, end: u64) -> impl Iterator<Item = (&u64, &Vec<u8>)> {
    let first = start_of_range_containing(ranges, start).unwrap_or(start);
    ranges.range(first..end)
}

/// What merging a write into the ranges changed.
struct Merged {
    /// Bytes the ranges grew by.
    grown: u64,
    /// Footprint ([`span`]) of the ranges the write touched, before and
    /// after.
    span_before: u64,
    span_after: u64,
}

/// Merges `data` at `offset` into `ranges`: the result covers the union,
/// with `data` on top. Appending to the end of a range shorter than
/// [`RANGE_MAX`] extends it in place. Only the ranges it touches are
/// measured: a file may hold thousands of ranges.
fn insert_range(ranges: &mut Ranges, offset: u64, data: &[u8]) -> Merged {
    if data.is_empty() {
        return Merged {
            grown: 0,
            span_before: 0,
            span_after: 0,
        };
    }
    let end = offset + data.len() as u64;
    // Ranges that overlap [offset, end), and one it appends to.
    let first = ranges
        .range(..=offset)
        .next_back()
        .filter(|(&s, d)| {
            let e = s + d.len() as u64;
            e > offset || (e == offset && (d.len() as u64) < RANGE_MAX)
        })
        .map(|(&s, _)| s)
        .unwrap_or(offset);
    let touched: Vec<u64> = ranges.range(first..end).map(|(&s, _)| s).collect();
    let span_before = ranges_footprint(ranges.range(first..end));
    let start = touched
        .first()
        .copied()
        .filter(|&s| s <= offset)
        .unwrap_or(offset);
    // The merged range: from `start`, every touched range, then `data`.
    let mut buf = ranges.remove(&start).unwrap_or_default();
    let mut removed = buf.len() as u64;
    for &s in touched.iter().filter(|&&s| s != start) {
        if let Some(d) = ranges.remove(&s) {
            removed += d.len() as u64;
            let at = (s - start) as usize;
            if buf.len() < at + d.len() {
                buf.resize(at + d.len(), 0);
            }
            buf[at..at + d.len()].copy_from_slice(&d);
        }
    }
    let at = (offset - start) as usize;
    if buf.len() < at + data.len() {
        buf.resize(at + data.len(), 0);
    }
    buf[at..at + data.len()].copy_from_slice(data);
    let grown = buf.len() as u64 - removed;
    let span_after = span(start, buf.len() as u64);
    ranges.insert(start, buf);
    Merged {
        grown,
        span_before,
        span_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> crate::Engine {
        let dev = std::sync::Arc::new(crate::dev::MemDevice::new(64 << 20));
        crate::Engine::format(dev, &crate::FormatOptions::default()).expect("format")
    }

    /// Applies random writes to a flat model and to the ranges; both must
    /// read the same, the ranges must not overlap, the byte count must
    /// match, and the engine's data reservation must equal the sectors
    /// the ranges touch.
    #[test]
    fn merging_matches_a_flat_model() {
        let engine = engine();
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let d = Delalloc::new();
            let mut model = vec![None::<u8>; 40960];
            engine
                .write(|tx| {
                    for step in 0..30u8 {
                        let off = rnd(40000);
                        let len = 1 + rnd(5000.min(40960 - off));
                        let data: Vec<u8> = (0..len).map(|i| step.wrapping_add(i as u8)).collect();
                        d.insert(tx, 7, off, &data);
                        for (i, b) in data.iter().enumerate() {
                            model[off as usize + i] = Some(*b);
                        }
                        if rnd(10) == 0 {
                            let size = rnd(40960);
                            d.truncate(tx, 7, size);
                            model[size as usize..].iter_mut().for_each(|b| *b = None);
                        }
                    }
                    Ok(())
                })
                .expect("buffering");
            let files = crate::sync::lock(&d.files);
            let ranges = files.get(&7).cloned().unwrap_or_default();
            drop(files);
            let mut prev_end = None;
            for (&s, v) in &ranges {
                assert!(prev_end.is_none_or(|e| e <= s), "ranges overlap");
                prev_end = Some(s + v.len() as u64);
            }
            let footprint = ranges_footprint(ranges.iter());
            assert_eq!(engine.data_reserved(), footprint, "reservation");
            let mut buf = vec![0xAAu8; 40960];
            d.overlay(7, 0, &mut buf);
            for (i, m) in model.iter().enumerate() {
                match m {
                    Some(b) => assert_eq!(buf[i], *b, "byte {i}"),
                    None => assert_eq!(buf[i], 0xAA, "byte {i} should not be buffered"),
                }
            }
            let buffered = model.iter().filter(|b| b.is_some()).count() as u64;
            assert_eq!(d.total(), buffered);
            engine
                .write(|tx| {
                    let before = d.total();
                    let taken = d.take(tx, 7, 1000);
                    assert_eq!(taken.is_empty(), before == 0, "take takes a range");
                    assert_eq!(d.total() + ranges_len(&taken), before);
                    d.restore(tx, 7, taken);
                    assert_eq!(d.total(), buffered);
                    d.discard(tx, 7);
                    Ok(())
                })
                .expect("flushing");
            assert_eq!(engine.data_reserved(), 0, "reservation after discard");
        }
    }
}
