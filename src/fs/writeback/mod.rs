//! Delayed allocation and the writeback pipeline.
//!
//! File data written through the mount is buffered in memory, in the
//! file's entry of the inode table, as merged byte ranges, and only given
//! extents when it is flushed (by a commit, fsync, an operation that needs
//! the file's data in the tree, or when the buffered total passes the
//! dirty limit). Flushing whole merged ranges at once lets the allocator
//! hand out large contiguous extents (a 1 GiB sequential write becomes
//! 2 MiB extents laid end to end) instead of one small extent per write
//! request, and lets many small writes to one region cost one
//! copy-on-write of it.
//!
//! **A flush** holds the file's flush lock throughout and works in four
//! steps, so the engine's state lock is never held across device I/O:
//!
//! 1. a short transaction takes the file's ranges (they stay visible to
//!    readers as *in flight*) and finds the old bytes the partial sectors
//!    at their edges keep;
//! 2. in the same transaction, the allocator hands out the extents and a
//!    [`Flight`] opens (a commit waits for it, see `txn::flight`);
//! 3. with no engine lock, the old edge bytes are read, the data is
//!    checksummed and written;
//! 4. short transactions insert the extent and checksum items, a batch
//!    of segments at a time, and end the flight.
//!
//! **Space:** buffered data holds a reservation of its *footprint*, the
//! sectors its ranges touch (partial sectors are rewritten whole), in the
//! engine (`txn::space`), and each file's credit (below) is held there
//! too: the engine's data reservation is the sum of every footprint and
//! every credit. A change of the buffers under a running `Txn` moves the
//! reservation by the footprint's change; a write paid from a credit
//! moves the footprint's growth from the credit to the buffer. A flush
//! turns the footprint into allocated extents in step 2, and the flight
//! holds the tree items until step 4; a flush gives the credit back.
//!
//! **Writes without the state lock.** A write whose sectors the file's
//! *credit* covers (data space the engine already holds for it) is
//! buffered under the inode entry's lock alone, and the size and times it
//! sets are kept in the entry ([`PendingAttrs`]), laid over the inode
//! item whenever it is loaded, until a store of the item includes them.
//! Only a write the credit does not cover joins a transaction, to reserve
//! its footprint and a new credit. So writers to different files share
//! no lock, and a flush holding the state lock holds no writer up.
//!
//! **Order:** the state lock, when taken, comes before an entry's. A
//! buffer and the pending size it implies change together under the
//! entry's lock; a truncate cuts the buffer and clears the pending size
//! under it too.

use super::file::{self, ReadPlan};
use super::inodes::{Budget, Inode, InodeState, PendingAttrs};
use super::rangeset::RangeSet;
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::format::tree_id::CSUM;
use crate::format::SECTORSIZE;
use crate::txn::{Flight, Flusher, Need, Txn};
use std::collections::BTreeMap;
use std::sync::Arc;

mod flush;

const SECTOR: u64 = SECTORSIZE as u64;

/// Default limit of buffered bytes before writers flush.
pub const DEFAULT_DIRTY_LIMIT: u64 = 64 << 20;

/// Most data space a write that must reserve takes beyond its own, so
/// that the next writes of the file need no state lock (see "Writes
/// without the state lock" above).
const CREDIT: u64 = 8 << 20;

/// A file's credit is at most this fraction of the device: on a small
/// image, large credits would tilt new block groups toward data.
const CREDIT_SHARE: u64 = 512;

/// Length past which appends start a new range.
const RANGE_MAX: u64 = 4 << 20;

/// Length up to which a sequential writer's writes, each starting on a
/// sector where the range before it ends, grow that range in place (see
/// [`append_in_place`]): as long as a flush takes at a time, so that a
/// flush of a sequential writer's data is one range, written to the
/// device as it is, with no copy into a segment.
const APPEND_MAX: u64 = 8 << 20;

/// Length from which a range an append grows gets room for all it may
/// grow to (see [`append_in_place`]).
const APPEND_RESERVE_FROM: u64 = 1 << 20;

/// Non-overlapping buffered ranges of one file: start → bytes. A range
/// stops growing by appends at [`RANGE_MAX`] (at [`APPEND_MAX`] for a
/// sequential writer's), and the next append starts a new, adjacent range,
/// so a flush can take whole ranges without splitting.
pub(crate) type Ranges = BTreeMap<u64, Vec<u8>>;

/// Bytes of the sectors `[start, start+len)` touches.
pub(crate) fn span(start: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    (start + len).div_ceil(SECTOR) * SECTOR - start / SECTOR * SECTOR
}

fn ranges_footprint<'a>(it: impl Iterator<Item = (&'a u64, &'a Vec<u8>)>) -> u64 {
    it.map(|(&s, d)| span(s, d.len() as u64)).sum()
}

/// Moves the engine's data reservation (the sum of every file's
/// footprint) from `before` to `after` bytes.
fn adjust(tx: &mut Txn<'_>, tree: u64, before: u64, after: u64) {
    if after > before {
        tx.hold_data(tree, after - before);
    } else {
        tx.release_data(tree, before - after);
    }
}

impl super::Subvol {
    /// Buffers `data` at `offset` of `ino`, merging with ranges it overlaps
    /// or touches. The caller has reserved [`span`] of it.
    pub(crate) fn buffer(&self, tx: &mut Txn<'_>, ino: u64, offset: u64, data: &[u8]) {
        self.buffer_owned(tx, ino, offset, data.to_vec());
    }

    /// [`Fs::buffer`] of bytes the caller copied before taking the state
    /// lock: a write that shares no sector with buffered data (a
    /// sequential writer's) is kept as it is, with no copy under the lock.
    pub(crate) fn buffer_owned(&self, tx: &mut Txn<'_>, ino: u64, offset: u64, data: Vec<u8>) {
        let merged = self.inodes.with(ino, |s| {
            let merged = insert_owned(&mut s.buffered, offset, data);
            s.held_bytes += merged.grown;
            self.inodes.add_buffered(merged.grown as i64);
            merged
        });
        self.inodes.mark_dirty(ino);
        adjust(tx, self.tree, merged.span_before, merged.span_after);
    }

    /// Buffers a write of `data` at `offset` of `ino` against the file's
    /// credit, with no state lock. False when the credit does not cover
    /// the write's [`span`] (the caller then reserves,
    /// [`Subvol::buffer_with_credit`]).
    pub(crate) fn buffer_on_credit(&self, ino: u64, offset: u64, data: &[u8]) -> bool {
        let Some(inode) = self.inodes.get(ino) else {
            return false;
        };
        let mut s = crate::sync::lock(&inode.state);
        if s.credit < span(offset, data.len() as u64) {
            return false;
        }
        let end = offset + data.len() as u64;
        // Appended in place with no copy first; else copied and merged.
        let merged = match append_in_place(&mut s.buffered, offset, data, self.append_max()) {
            Some(merged) => merged,
            None => insert_owned(&mut s.buffered, offset, data.to_vec()),
        };
        let grown = note_buffered(&mut s, merged, end);
        // Counted under the entry's lock, so a flush that takes the bytes
        // at once cannot subtract them first.
        self.inodes.add_buffered(grown as i64);
        drop(s);
        self.inodes.mark_dirty(ino);
        true
    }

    /// The longest a sequential writer's range grows by appends in place:
    /// [`APPEND_MAX`], or the dirty limit where that is lower (a flush
    /// takes the range before it would grow past it, and room reserved
    /// beyond would only be held).
    fn append_max(&self) -> u64 {
        APPEND_MAX.min(self.core.budget.limit()).max(SECTOR)
    }

    /// Reserves data space for a write of `len` bytes at `offset` of
    /// `ino` and credit for its next writes, or, when that much is not
    /// available (a nearly full disk or quota), exactly the write's
    /// [`span`]. Returns the bytes now held, for
    /// [`Subvol::buffer_with_credit`].
    ///
    /// The credit is as large as the file's buffered bytes, up to
    /// [`CREDIT`] or a [`CREDIT_SHARE`]th of the device: a file written
    /// once (most small files) gets none, so credits never hold much more
    /// space than the buffers do. (Held space counts as claimed when the
    /// allocator decides between data and metadata groups.)
    pub(crate) fn reserve_credit(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        let need = span(offset, len);
        let buffered = self.buffered_bytes_of(ino);
        let most = (crate::tree::BlockRead::item_limits(&*tx).device_size / CREDIT_SHARE)
            .clamp(SECTOR, CREDIT);
        let credit = (buffered / SECTOR * SECTOR).min(most);
        let items = Need::items(self.tree, 1);
        let held = match tx.reserve(&items.buffer(need + credit)) {
            Ok(()) => need + credit,
            Err(Error::NoSpace | Error::Posix(libc::EDQUOT, _)) => {
                tx.reserve(&items.buffer(need))?;
                need
            }
            Err(e) => return Err(e),
        };
        tx.hold_data(self.tree, held);
        Ok(held)
    }

    /// Adds `credit` (held by [`Subvol::reserve_credit`]) to `ino`'s and
    /// buffers the write against it.
    pub(crate) fn buffer_with_credit(&self, ino: u64, offset: u64, data: Vec<u8>, credit: u64) {
        self.inodes.with(ino, |s| {
            s.credit += credit;
            let grown = buffer_in(s, offset, data, self.append_max());
            self.inodes.add_buffered(grown as i64);
        });
        self.inodes.mark_dirty(ino);
    }

    /// Puts bytes replay found in the fsync log back into `ino`'s buffer,
    /// as the fsync that logged them left them, with no change to its
    /// attributes (the logged inode item has them): the commit that ends
    /// the replay writes them to extents. A read-only engine holds no
    /// space for them; its reads find them over the file's extents.
    pub(crate) fn restore_logged_bytes(&self, ino: u64, offset: u64, data: Vec<u8>) -> Result<()> {
        let len = data.len() as u64;
        let credit = match self.core.engine.is_read_only() {
            true => 0,
            false => self
                .core
                .engine
                .write(|tx| self.reserve_credit(tx, ino, offset, len))?,
        };
        self.inodes.with(ino, |s| {
            s.credit += credit;
            let merged = insert_owned(&mut s.buffered, offset, data);
            s.credit = (s.credit + merged.span_before).saturating_sub(merged.span_after);
            s.held_bytes += merged.grown;
            self.inodes.add_buffered(merged.grown as i64);
        });
        self.inodes.mark_dirty(ino);
        Ok(())
    }

    /// Gives `ino`'s unused credit back to the engine.
    fn release_credit(&self, tx: &mut Txn<'_>, s: &mut InodeState) {
        let credit = std::mem::take(&mut s.credit);
        if credit > 0 {
            tx.release_data(self.tree, credit);
        }
    }

    /// Buffered and in-flight bytes of `ino` over `[start, end)`, oldest
    /// first, to lay over what the tree holds.
    pub(crate) fn overlay_of(&self, ino: u64, start: u64, end: u64) -> Vec<(u64, Vec<u8>)> {
        self.inodes
            .peek(ino, |s| {
                let mut out = Vec::new();
                for (&r, d) in overlapping(&s.in_flight, start, end) {
                    out.push(clip(r, d, start, end));
                }
                for (&r, d) in overlapping(&s.buffered, start, end) {
                    out.push(clip(r, d, start, end));
                }
                out
            })
            .unwrap_or_default()
    }

    /// Bytes of `ino` in memory (buffered or in flight).
    pub(crate) fn buffered_bytes_of(&self, ino: u64) -> u64 {
        self.inodes
            .peek(ino, |s| {
                debug_assert_eq!(
                    s.held_bytes,
                    ranges_len(&s.buffered) + ranges_len(&s.in_flight)
                );
                s.held_bytes
            })
            .unwrap_or(0)
    }

    /// The sectors `ino`'s in-memory ranges (buffered or in flight) touch,
    /// merged, in order; None when there are more than `max` ranges
    /// (the caller then estimates instead of walking them all).
    pub(crate) fn memory_sectors(&self, ino: u64, max: usize) -> Option<Vec<(u64, u64)>> {
        self.inodes
            .peek(ino, |s| {
                if s.buffered.len() + s.in_flight.len() > max {
                    return None;
                }
                let mut set = RangeSet::default();
                let b = s.buffered.iter().map(|(&at, d)| (at, d.len()));
                let f = s.in_flight.iter().map(|(&at, d)| (at, d.len()));
                for (at, len) in b.chain(f) {
                    let end = (at + len as u64).div_ceil(SECTOR) * SECTOR;
                    set.insert(at / SECTOR * SECTOR, end);
                }
                Some(set.to_vec())
            })
            .unwrap_or(Some(Vec::new()))
    }

    /// The in-memory range containing `pos`, or else the first one after
    /// it: (start, end).
    pub(crate) fn buffered_at_or_after(&self, ino: u64, pos: u64) -> Option<(u64, u64)> {
        self.inodes
            .peek(ino, |s| {
                let a = at_or_after(&s.buffered, pos);
                let b = at_or_after(&s.in_flight, pos);
                match (a, b) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            })
            .flatten()
    }

    /// Drops `ino`'s buffered bytes at and past `size` (a truncate, under
    /// the file's flush lock: nothing is in flight).
    pub(crate) fn truncate_buffered(&self, tx: &mut Txn<'_>, ino: u64, size: u64) {
        self.cut_buffered_then(tx, ino, (size, u64::MAX), |_, s| {
            if let Some(p) = &mut s.pending {
                // Writes that extended the file did so before the
                // truncate: the cut took their bytes past `size` under
                // the same lock.
                p.size = 0;
            }
        });
    }

    /// Drops `ino`'s buffered bytes in `[start, end)` (a punch, a zeroed
    /// range, a reflink's destination).
    pub(crate) fn cut_buffered(&self, tx: &mut Txn<'_>, ino: u64, start: u64, end: u64) {
        self.cut_buffered_then(tx, ino, (start, end), |_, _| {});
    }

    /// Forgets `ino`'s buffered bytes (the inode is gone), its pending
    /// attributes (nothing will settle them) and its credit. A flush in
    /// flight finds the inode gone and drops its own.
    pub(crate) fn discard_buffered(&self, tx: &mut Txn<'_>, ino: u64) {
        self.cut_buffered_then(tx, ino, (0, u64::MAX), |tx, s| {
            s.pending = None;
            self.release_credit(tx, s);
        });
    }

    /// Drops `ino`'s buffered bytes in `[start, end)`, then runs `then` on
    /// its state under the same lock (so no write slips in between).
    fn cut_buffered_then(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        (start, end): (u64, u64),
        then: impl FnOnce(&mut Txn<'_>, &mut InodeState),
    ) {
        if start >= end || self.inodes.get(ino).is_none() {
            return;
        }
        let (_, before, after) = self.inodes.with(ino, |s| {
            let cut = cut(&mut s.buffered, start, end);
            s.held_bytes -= cut.0;
            self.inodes.add_buffered(-(cut.0 as i64));
            then(tx, s);
            cut
        });
        adjust(tx, self.tree, before, after);
    }
}

/// Lays `parts` (file offset, bytes), in order, over `buf`, which holds
/// the file from `offset`.
pub(crate) fn lay_over(buf: &mut [u8], offset: u64, parts: &[(u64, Vec<u8>)]) {
    for (at, d) in parts {
        let from = (at - offset) as usize;
        buf[from..from + d.len()].copy_from_slice(d);
    }
}

/// Removes `[start, end)` from `ranges`: (bytes dropped, footprint of the
/// ranges touched before and after).
fn cut(ranges: &mut Ranges, start: u64, end: u64) -> (u64, u64, u64) {
    let hit: Vec<u64> = overlapping(ranges, start, end).map(|(&s, _)| s).collect();
    let (mut dropped, mut before, mut after) = (0, 0, 0);
    for s in hit {
        let Some(d) = ranges.remove(&s) else { continue };
        let e = s + d.len() as u64;
        before += span(s, d.len() as u64);
        if s < start {
            let head = d[..(start - s) as usize].to_vec();
            after += span(s, head.len() as u64);
            ranges.insert(s, head);
        }
        if e > end {
            let tail = d[(end - s) as usize..].to_vec();
            after += span(end, tail.len() as u64);
            ranges.insert(end, tail);
        }
        dropped += e.min(end) - s.max(start);
    }
    (dropped, before, after)
}

/// The range of `ranges` containing `pos`, or else the first one after.
fn at_or_after<D: Bytes>(ranges: &BTreeMap<u64, D>, pos: u64) -> Option<(u64, u64)> {
    let from = start_of_range_containing(ranges, pos).unwrap_or(pos);
    ranges
        .range(from..)
        .next()
        .map(|(&s, d)| (s, s + d.bytes().len() as u64))
}

/// A buffered range's bytes, owned (buffered) or shared (in flight).
pub(crate) trait Bytes {
    fn bytes(&self) -> &[u8];
}

impl Bytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Bytes for Arc<Vec<u8>> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Bytes held in `r`.
pub(crate) fn ranges_len<D: Bytes>(r: &BTreeMap<u64, D>) -> u64 {
    r.values().map(|v| v.bytes().len() as u64).sum()
}

/// Start of the range holding byte `pos`, if one does.
fn start_of_range_containing<D: Bytes>(ranges: &BTreeMap<u64, D>, pos: u64) -> Option<u64> {
    ranges
        .range(..=pos)
        .next_back()
        .filter(|(&s, d)| s + d.bytes().len() as u64 > pos)
        .map(|(&s, _)| s)
}

/// Ranges overlapping `[start, end)`.
fn overlapping<D: Bytes>(
    ranges: &BTreeMap<u64, D>,
    start: u64,
    end: u64,
) -> impl Iterator<Item = (&u64, &D)> {
    let first = start_of_range_containing(ranges, start).unwrap_or(start);
    ranges.range(first..end)
}

/// Whether no range of `ranges` touches a sector of `[offset, end)`.
fn shares_no_sector(ranges: &Ranges, offset: u64, end: u64) -> bool {
    let (first, last) = (offset / SECTOR * SECTOR, end.div_ceil(SECTOR) * SECTOR);
    let before_clear = ranges
        .range(..last)
        .next_back()
        .is_none_or(|(&s, d)| (s + d.len() as u64).div_ceil(SECTOR) * SECTOR <= first);
    let after_clear = ranges
        .range(offset..)
        .next()
        .is_none_or(|(&s, _)| s / SECTOR * SECTOR >= last);
    before_clear && after_clear
}

/// [`insert_range`] of owned bytes: kept as a range of its own when it
/// shares no sector with another (its footprint then adds exactly), merged
/// otherwise.
fn insert_owned(ranges: &mut Ranges, offset: u64, data: Vec<u8>) -> Merged {
    let end = offset + data.len() as u64;
    if data.is_empty() || !shares_no_sector(ranges, offset, end) {
        return insert_range(ranges, offset, &data);
    }
    let n = data.len() as u64;
    ranges.insert(offset, data);
    Merged {
        grown: n,
        span_before: 0,
        span_after: span(offset, n),
    }
}

/// Appends `data` to the range that ends exactly at `offset`, in place,
/// when `offset` starts a sector, no range lies in the sectors `data`
/// covers, and the range stays within `most` bytes (see
/// [`Subvol::append_max`]); None otherwise (nothing changed). A range of
/// [`APPEND_RESERVE_FROM`] or more that grows so gets room for all of
/// `most` at once, so its bytes
/// are copied once more at most (pages of it never written are never
/// touched); a shorter one doubles its room, so the many small files a
/// copy writes, each in a few appends, take no 8 MiB allocation each.
fn append_in_place(ranges: &mut Ranges, offset: u64, data: &[u8], most: u64) -> Option<Merged> {
    let n = data.len() as u64;
    let end = offset.checked_add(n)?;
    if n == 0 || !offset.is_multiple_of(SECTOR) {
        return None;
    }
    if ranges
        .range(offset..)
        .next()
        .is_some_and(|(&s, _)| s < end.div_ceil(SECTOR) * SECTOR)
    {
        return None;
    }
    let (&start, range) = ranges.range_mut(..offset).next_back()?;
    let len = range.len() as u64;
    if start + len != offset || len + n > most {
        return None;
    }
    if range.capacity() < (len + n) as usize {
        match len >= APPEND_RESERVE_FROM {
            true => range.reserve_exact((most - len) as usize),
            // A small file's few appends: room doubles as usual.
            false => range.reserve(n as usize),
        }
    }
    range.extend_from_slice(data);
    Some(Merged {
        grown: n,
        span_before: span(start, len),
        span_after: span(start, len + n),
    })
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

/// Merges a write into `s`'s buffer, paid from its credit (which the
/// caller made cover the write's [`span`]), and notes the size and times
/// it sets. Returns the bytes the buffer grew by.
fn buffer_in(s: &mut InodeState, offset: u64, data: Vec<u8>, most: u64) -> u64 {
    let end = offset + data.len() as u64;
    let merged = match append_in_place(&mut s.buffered, offset, &data, most) {
        Some(merged) => merged,
        None => insert_owned(&mut s.buffered, offset, data),
    };
    note_buffered(s, merged, end)
}

/// Pays a write merged into `s`'s buffer (ending at `end`) from its
/// credit, and notes the size and times it sets. Returns the bytes the
/// buffer grew by.
fn note_buffered(s: &mut InodeState, merged: Merged, end: u64) -> u64 {
    debug_assert!(merged.span_after <= s.credit + merged.span_before);
    s.credit = (s.credit + merged.span_before).saturating_sub(merged.span_after);
    s.held_bytes += merged.grown;
    s.pending = Some(PendingAttrs::wrote(s.pending, end, Timespec::now()));
    merged.grown
}

/// The part of a range inside `[start, end)`.
fn clip<D: Bytes>(at: u64, d: &D, start: u64, end: u64) -> (u64, Vec<u8>) {
    let d = d.bytes();
    let from = at.max(start);
    let to = (at + d.len() as u64).min(end);
    (from, d[(from - at) as usize..(to - at) as usize].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies random writes and cuts to a flat model and to the ranges;
    /// both must read the same, the ranges must not overlap, and the
    /// footprint changes each step reports must add up to the footprint
    /// of what is left (the engine's reservation follows them).
    #[test]
    fn merging_and_cutting_match_a_flat_model() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let mut ranges = Ranges::new();
            let mut model = vec![None::<u8>; 40960];
            let mut reserved = 0i64;
            for step in 0..30u8 {
                // Every third write starts where a range ends (a
                // sequential writer's next write).
                let ends: Vec<u64> = ranges.iter().map(|(&s, d)| s + d.len() as u64).collect();
                let off = match (step % 3, ends.is_empty()) {
                    (2, false) => ends[rnd(ends.len() as u64) as usize].min(40000),
                    _ => rnd(40000),
                };
                let len = 1 + rnd(5000.min(40960 - off));
                let data: Vec<u8> = (0..len).map(|i| step.wrapping_add(i as u8)).collect();
                let m = match step % 3 {
                    0 => insert_range(&mut ranges, off, &data),
                    1 => insert_owned(&mut ranges, off, data.clone()),
                    _ => append_in_place(&mut ranges, off, &data, APPEND_MAX)
                        .unwrap_or_else(|| insert_owned(&mut ranges, off, data.clone())),
                };
                reserved += m.span_after as i64 - m.span_before as i64;
                for (i, b) in data.iter().enumerate() {
                    model[off as usize + i] = Some(*b);
                }
                if rnd(5) == 0 {
                    let s = rnd(40960);
                    let e = s + rnd(40960 - s);
                    let (dropped, before, after) = cut(&mut ranges, s, e);
                    reserved += after as i64 - before as i64;
                    let had = model[s as usize..e as usize]
                        .iter()
                        .filter(|b| b.is_some())
                        .count();
                    assert_eq!(dropped, had as u64, "bytes cut");
                    model[s as usize..e as usize]
                        .iter_mut()
                        .for_each(|b| *b = None);
                }
            }
            let mut prev_end = None;
            for (&s, v) in &ranges {
                assert!(prev_end.is_none_or(|e| e <= s), "ranges overlap");
                prev_end = Some(s + v.len() as u64);
            }
            assert_eq!(
                reserved,
                ranges_footprint(ranges.iter()) as i64,
                "reservation"
            );
            let mut buf = vec![0xAAu8; 40960];
            let parts: Vec<(u64, Vec<u8>)> = overlapping(&ranges, 0, 40960)
                .map(|(&r, d)| clip(r, d, 0, 40960))
                .collect();
            lay_over(&mut buf, 0, &parts);
            for (i, m) in model.iter().enumerate() {
                match m {
                    Some(b) => assert_eq!(buf[i], *b, "byte {i}"),
                    None => assert_eq!(buf[i], 0xAA, "byte {i} should not be buffered"),
                }
            }
            let buffered = model.iter().filter(|b| b.is_some()).count() as u64;
            assert_eq!(ranges_len(&ranges), buffered);
        }
    }

    /// A sequential writer's writes grow one range in place up to
    /// [`APPEND_MAX`], each paying exactly its own sectors, and the next
    /// starts a new range; a write off a sector, or into the sectors of a
    /// range after it, is left to the merging paths.
    #[test]
    fn appends_grow_one_range_up_to_the_limit() {
        const MIB: u64 = 1 << 20;
        let mut ranges = Ranges::new();
        let write = vec![7u8; MIB as usize];
        let m = insert_owned(&mut ranges, 0, write.clone());
        assert_eq!(m.span_after, MIB);
        for i in 1..APPEND_MAX / MIB {
            let m = append_in_place(&mut ranges, i * MIB, &write, APPEND_MAX).expect("appended");
            assert_eq!((m.grown, m.span_after - m.span_before), (MIB, MIB));
        }
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[&0].len() as u64, APPEND_MAX);
        assert_eq!(ranges[&0].capacity() as u64, APPEND_MAX, "room taken once");
        assert!(append_in_place(&mut ranges, APPEND_MAX, &write, APPEND_MAX).is_none());
        insert_owned(&mut ranges, APPEND_MAX, write.clone());
        assert_eq!(ranges.len(), 2);
        // Off a sector: not in place.
        let end = APPEND_MAX + MIB;
        assert!(append_in_place(&mut ranges, end, &[1; 100], APPEND_MAX).is_some());
        assert!(append_in_place(&mut ranges, end + 100, &[1; 100], APPEND_MAX).is_none());
        // A small file's appends take room as they need it.
        let mut ranges = Ranges::new();
        insert_owned(&mut ranges, 0, vec![1; 64 << 10]);
        append_in_place(&mut ranges, 64 << 10, &[2; 64 << 10], APPEND_MAX).expect("appended");
        assert!(ranges[&0].capacity() < (1 << 20));
        // Into a later range's sector: not in place.
        let mut ranges = Ranges::new();
        insert_owned(&mut ranges, 0, vec![1; 4096]);
        insert_owned(&mut ranges, 3 * 4096 + 10, vec![2; 10]);
        assert!(append_in_place(&mut ranges, 4096, &[3; 2 * 4096 + 1], APPEND_MAX).is_none());
        assert!(append_in_place(&mut ranges, 4096, &[3; 2 * 4096], APPEND_MAX).is_some());
    }
}
