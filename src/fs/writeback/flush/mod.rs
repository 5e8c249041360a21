//! The flush: buffered ranges of a file become extents, in the four
//! steps the module above describes (take and allocate under the state
//! lock, write outside it, insert the items), and the policy that starts
//! flushes (commit, fsync, the dirty limit).

use super::*;

mod compressed;
mod in_place;

use crate::format::inode::INODE_NODATACOW;
use bytes::Bytes;
use in_place::Place;

/// Most bytes one flush takes at a time: the data a commit may wait for.
const FLUSH_CHUNK: u64 = 8 << 20;

/// Segments one step-4 transaction records, so that a flush of many small
/// ranges (random writes) holds the state lock briefly at a time.
const INSERT_BATCH: usize = 32;

/// Part of a flush: a run of whole sectors written as new extents, or
/// in place (see `in_place`).
struct Segment {
    first: u64,
    last: u64,
    place: Place,
    /// Old bytes of the file the sectors keep (where no taken range
    /// covers them): (file offset, plan).
    old: Vec<(u64, ReadPlan)>,
    /// Extents allocated for it, in file order.
    pieces: Vec<file::Piece>,
}

/// Ranges a flush took: (file offset, bytes).
type Taken = Vec<(u64, Arc<Vec<u8>>)>;

/// A flush between its two transactions.
struct FlushJob {
    flight: Flight,
    ranges: Vec<(u64, Arc<Vec<u8>>)>,
    segments: Vec<Segment>,
    /// The file's data is compressed with it: the extents are allocated
    /// only once the chunks are compressed (see `compressed`).
    codec: Option<crate::compress::Codec>,
    /// Data space still held for the segments (a compressing flush keeps
    /// its footprint reserved until it allocates).
    held_data: u64,
    /// No chunk compressed: the file is marked to stop trying.
    gave_up: bool,
    /// The file keeps checksums of its data (all but `chattr +C` ones).
    sums: bool,
}

/// Extents laid end to end on the device, written with one call: where
/// they start, their total length, and their bytes as (segment index,
/// from, to) in the segments' contents, touching slices merged.
#[derive(Default)]
struct Run {
    start: u64,
    len: u64,
    parts: Vec<(usize, usize, usize)>,
}

impl Run {
    fn starting(bytenr: u64, part: (usize, usize, usize)) -> Run {
        Run {
            start: bytenr,
            len: (part.2 - part.1) as u64,
            parts: vec![part],
        }
    }

    /// Adds `part`, to be written at `bytenr`, if that is where the run
    /// ends; false otherwise (and for an empty run).
    fn extend(&mut self, bytenr: u64, part: (usize, usize, usize)) -> bool {
        let Some(last) = self.parts.last_mut() else {
            return false;
        };
        if self.start + self.len != bytenr {
            return false;
        }
        self.len += (part.2 - part.1) as u64;
        if last.0 == part.0 && last.2 == part.1 {
            last.2 = part.2;
        } else {
            self.parts.push(part);
        }
        true
    }
}

/// What the first transaction of a flush did.
enum Started {
    /// Nothing was buffered.
    Nothing,
    /// Done already: inline data, or an inode deleted meanwhile.
    Done,
    /// Data to write outside the lock.
    Job(FlushJob),
}

impl super::super::Subvol {
    /// Flushes all of `ino`'s buffered data.
    pub(crate) fn flush_file(&self, ino: u64) -> Result<()> {
        self.flush_file_for(ino, Flusher::Writeback)
    }

    /// [`Subvol::flush_file`] for fsync(2): it goes ahead of a commit
    /// waiting for other files' flushes, so it waits for its own data
    /// only.
    pub(crate) fn flush_file_for_fsync(&self, ino: u64) -> Result<()> {
        self.flush_file_for(ino, Flusher::Fsync)
    }

    fn flush_file_for(&self, ino: u64, who: Flusher) -> Result<()> {
        if self.inodes.get(ino).is_none() {
            return Ok(());
        }
        let held = self.inodes.lock_flush(ino);
        self.flush_swept(ino, &held.inode, false, who)
    }

    /// Flushes all of `ino`'s buffered data; the caller holds its flush
    /// lock. The file's unused credit goes back to the engine too, so
    /// after a sync or a commit no space stays held for writes not made.
    pub(crate) fn flush_held(&self, ino: u64, inode: &Inode) -> Result<()> {
        self.flush_swept(ino, inode, false, Flusher::Writeback)
    }

    /// [`Subvol::flush_held`] for a writer past the dirty limit: the file
    /// keeps its credit, so its writer's next writes do not wait for the
    /// state lock to reserve again (with 4 random writers, about a tenth
    /// more throughput). The next commit's flush gives it back.
    fn flush_keeping_credit(&self, ino: u64, inode: &Inode) -> Result<()> {
        self.flush_swept(ino, inode, true, Flusher::Writeback)
    }

    fn flush_swept(&self, ino: u64, inode: &Inode, keep_credit: bool, who: Flusher) -> Result<()> {
        let mut sweep = Sweep::default();
        loop {
            self.core.engine.wait_for_commits(who);
            let started = self
                .core
                .engine
                .write(|tx| self.start_flush(tx, (ino, inode), &mut sweep, keep_credit))?;
            match started {
                Started::Nothing => return Ok(()),
                Started::Done => {}
                Started::Job(job) => self.finish_job(ino, inode, job)?,
            }
        }
    }

    /// Steps 1 and 2: takes up to about [`FLUSH_CHUNK`] bytes of `ino`'s
    /// ranges and allocates their extents, giving the file's credit back
    /// unless `keep_credit`. An inline file is written here whole
    /// (it needs no device I/O).
    fn start_flush(
        &self,
        tx: &mut Txn<'_>,
        (ino, inode): (u64, &Inode),
        sweep: &mut Sweep,
        keep_credit: bool,
    ) -> Result<Started> {
        let (taken, pending) = {
            let mut s = crate::sync::lock(&inode.state);
            if !keep_credit {
                self.release_credit(tx, &mut s);
            }
            let taken = take(tx, self.tree, &mut s, FLUSH_CHUNK, sweep);
            let bytes: u64 = taken.iter().map(|(_, d)| d.len() as u64).sum();
            self.inodes.add_buffered(-(bytes as i64));
            self.core.budget.add_in_flight(bytes as i64);
            (taken, s.pending.is_some())
        };
        if taken.is_empty() {
            if pending {
                self.settle_attrs(tx, ino)?;
            }
            return Ok(Started::Nothing);
        }
        match self.plan_flush(tx, ino, taken.clone()) {
            Ok(Some(job)) => Ok(Started::Job(job)),
            Ok(None) => {
                landed(
                    &self.core.budget,
                    &mut crate::sync::lock(&inode.state),
                    &taken,
                );
                Ok(Started::Done)
            }
            Err(e) => {
                self.restore(tx, (ino, inode), taken);
                Err(e)
            }
        }
    }

    /// Stores the attributes buffered writes set into the tree (for a file
    /// whose buffered bytes went some other way, a punch for instance).
    fn settle_attrs(&self, tx: &mut Txn<'_>, ino: u64) -> Result<()> {
        match self.inode_tx(tx, ino) {
            Ok(i) => self.save_inode(tx, ino, i),
            Err(Error::NotFound) => {
                self.inodes.with(ino, |s| s.pending = None);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Writes an inline file's ranges now, or plans and allocates the
    /// segments of a file with extents. None: nothing left to do.
    fn plan_flush(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        taken: Vec<(u64, Arc<Vec<u8>>)>,
    ) -> Result<Option<FlushJob>> {
        let tree = self.tree;
        let i = match self.inode_tx(tx, ino) {
            // Deleted while its data waited: nothing to write.
            Err(Error::NotFound) => return Ok(None),
            r => r?,
        };
        let codec = self.codec_for(tx, ino, &i)?;
        if let Some(c) = codec {
            if self.try_inline_compressed(tx, (ino, i.clone()), &taken, c)? {
                return Ok(None);
            }
        }
        let root = tx.root_of(tree)?;
        if file::stays_inline(tx, &root, ino, i.size)? {
            self.write_inline_ranges(tx, ino, i, &taken)?;
            return Ok(None);
        }
        let csum_root = file::csum_root_for(i.flags, || tx.root_of(CSUM))?;
        let inline = file::is_inline(tx, &root, ino)?;
        let no_cow = i.flags & INODE_NODATACOW != 0;
        let mut alone = in_place::Alone::default();
        let mut segments = Vec::new();
        for span in segment_spans(&taken, inline) {
            let parts = match no_cow {
                true => in_place::places(tx, (tree, ino), span, &mut alone)?,
                false => vec![(span.0, span.1, Place::New)],
            };
            for (first, last, place) in parts {
                let mut old = Vec::new();
                for (s, e) in uncovered(&taken, first, last) {
                    old.push((
                        s,
                        file::plan_read(tx, &root, csum_root.as_ref(), ino, s, e - s)?,
                    ));
                }
                segments.push(Segment {
                    first,
                    last,
                    place,
                    old,
                    pieces: Vec::new(),
                });
            }
        }
        let footprint: u64 = taken.iter().map(|(s, d)| span(*s, d.len() as u64)).sum();

        let mut flight = tx.start_flight(footprint);
        let held_data = match codec {
            // Allocated once compressed: the reservation stays till then.
            Some(_) => {
                let spans: u64 = segments.iter().map(|s| s.last - s.first).sum();
                tx.hold_data(tree, spans);
                spans
            }
            None => {
                if let Err(e) = allocate(tx, tree, ino, &mut segments, &mut flight) {
                    tx.end_flight(flight)?;
                    return Err(e);
                }
                0
            }
        };
        Ok(Some(FlushJob {
            flight,
            ranges: taken,
            segments,
            codec,
            held_data,
            gave_up: false,
            sums: file::keeps_sums(i.flags),
        }))
    }

    /// A file that stays inline: its ranges go into its inline item.
    fn write_inline_ranges(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        mut i: crate::format::inode::InodeItem,
        taken: &[(u64, Arc<Vec<u8>>)],
    ) -> Result<()> {
        let mut delta = 0i64;
        for (offset, data) in taken {
            // Zeros buffered past the end (a truncate's) are not data.
            let keep = i.size.saturating_sub(*offset).min(data.len() as u64) as usize;
            if keep == 0 {
                continue;
            }
            self.note_extents(tx, ino, i.size, *offset, offset + keep as u64);
            delta += file::write_inline(tx, self.tree, ino, i.size, *offset, &data[..keep])?;
        }
        i.nbytes = (i.nbytes as i64 + delta).max(0) as u64;
        self.save_inode(tx, ino, i)
    }

    /// Steps 3 and 4, then the end of the flight whatever happened.
    fn finish_job(&self, ino: u64, inode: &Inode, mut job: FlushJob) -> Result<()> {
        let written = match job.codec {
            Some(codec) => self.write_compressed(ino, &mut job, codec),
            None => self.write_job(&job),
        };
        // Before the state lock: relocation may wait for these under it.
        self.core.engine.in_place_done(&mut job.flight);
        let FlushJob {
            flight,
            ranges,
            segments,
            held_data,
            gave_up,
            ..
        } = job;
        let sums = match written {
            Ok(sums) => sums,
            Err(e) => return self.give_up((ino, inode), (ranges, held_data), flight, e),
        };
        // Step 4 in batches, each a short hold of the state lock. The
        // commit waits for the flight, so all of them join the
        // transaction that allocated the extents.
        let mut sums = sums.into_iter();
        for batch in segments.chunks(INSERT_BATCH) {
            let batch_sums: Vec<_> = sums.by_ref().take(batch.len()).collect();
            match self
                .core
                .engine
                .write(|tx| self.insert_segments(tx, ino, batch, batch_sums))
            {
                Ok(true) => {}
                // Deleted meanwhile: its extents go at the commit.
                Ok(false) => break,
                Err(e) => return self.give_up((ino, inode), (ranges, 0), flight, e),
            }
        }
        self.core.engine.write(|tx| {
            landed(
                &self.core.budget,
                &mut crate::sync::lock(&inode.state),
                &ranges,
            );
            if gave_up {
                self.mark_nocompress(tx, ino)?;
            }
            tx.end_flight(flight)
        })
    }

    /// A flush failed with `e`: its ranges go back to the buffer (if the
    /// engine still runs), so the data is not lost to a retry; what was
    /// recorded already is written again then. `held_data` is data space
    /// the flush still held (the restored buffer holds its own).
    fn give_up(
        &self,
        (ino, inode): (u64, &Inode),
        (ranges, held_data): (Taken, u64),
        flight: Flight,
        e: Error,
    ) -> Result<()> {
        let _ = self.core.engine.write(|tx| {
            tx.release_data(self.tree, held_data);
            self.restore(tx, (ino, inode), ranges);
            tx.end_flight(flight)
        });
        Err(e)
    }

    /// Step 3, with no engine lock: reads the old edge bytes, lays the
    /// ranges over them, checksums each extent and writes them, one
    /// device write per run of extents laid end to end (see [`allocate`]).
    /// Returns the checksums of each segment's pieces.
    fn write_job(&self, job: &FlushJob) -> Result<Vec<Vec<Vec<u8>>>> {
        let contents = job
            .segments
            .iter()
            .map(|seg| self.segment_content(job, seg))
            .collect::<Result<Vec<_>>>()?;
        let mut all = Vec::with_capacity(job.segments.len());
        let mut run = Run::default();
        for (index, (seg, content)) in job.segments.iter().zip(&contents).enumerate() {
            let mut sums = Vec::with_capacity(seg.pieces.len());
            let mut at = 0usize;
            for &file::Piece {
                bytenr,
                disk_len: len,
                ..
            } in &seg.pieces
            {
                let part = (index, at, at + len as usize);
                sums.push(match job.sums {
                    true => file::sector_sums(&content[part.1..part.2]),
                    false => Vec::new(),
                });
                if !run.extend(bytenr, part) {
                    self.write_run(job, &contents, &run)?;
                    run = Run::starting(bytenr, part);
                }
                at += len as usize;
            }
            all.push(sums);
        }
        self.write_run(job, &contents, &run)?;
        Ok(all)
    }

    /// The sectors of `seg`: the old bytes it keeps, the taken ranges
    /// laid over them. A segment that is exactly one range (a sequential
    /// writer's, see `append_in_place`) is that range's bytes, not a copy.
    fn segment_content(&self, job: &FlushJob, seg: &Segment) -> Result<Bytes> {
        if seg.old.is_empty() {
            if let Some(range) = sole_range(&job.ranges, seg.first, seg.last) {
                return Ok(Bytes::from_owner(SharedRange(range.clone())));
            }
            return Ok(laid_end_to_end(&job.ranges, seg.first, seg.last).into());
        }
        let mut content = vec![0u8; (seg.last - seg.first) as usize];
        for (at, plan) in &seg.old {
            // The file's flush lock keeps these extents in place.
            let bytes = self.core.engine.with_data_device(|dev| plan.execute(dev))?;
            let from = (at - seg.first) as usize;
            content[from..from + bytes.len()].copy_from_slice(&bytes);
        }
        // A range may reach past the segment: a `chattr +C` file's
        // segments end where its extents do (see `in_place`).
        for (s, d) in overlapping_vec(&job.ranges, seg.first, seg.last) {
            let lo = s.max(seg.first);
            let hi = (s + d.len() as u64).min(seg.last);
            content[(lo - seg.first) as usize..(hi - seg.first) as usize]
                .copy_from_slice(&d[(lo - s) as usize..(hi - s) as usize]);
        }
        Ok(content.into())
    }

    /// Writes `run` with one device write: straight from its segment's
    /// bytes when it is one slice of them, else gathered into one buffer.
    fn write_run(&self, job: &FlushJob, contents: &[Bytes], run: &Run) -> Result<()> {
        match run.parts.as_slice() {
            [] => Ok(()),
            [(index, from, to)] => self.core.engine.write_flight_owned(
                &job.flight,
                run.start,
                contents[*index].slice(*from..*to),
            ),
            parts => {
                let mut buf = Vec::with_capacity(run.len as usize);
                for &(index, from, to) in parts {
                    buf.extend_from_slice(&contents[index][from..to]);
                }
                self.core
                    .engine
                    .write_flight_owned(&job.flight, run.start, buf.into())
            }
        }
    }

    /// Step 4 for some segments: the extents written replace what the
    /// file had there. False when the inode is gone.
    fn insert_segments(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        segments: &[Segment],
        sums: Vec<Vec<Vec<u8>>>,
    ) -> Result<bool> {
        let tree = self.tree;
        let mut i = match self.inode_tx(tx, ino) {
            Err(Error::NotFound) => return Ok(false),
            r => r?,
        };
        let mut delta = 0i64;
        for (seg, sums) in segments.iter().zip(sums) {
            match seg.place {
                Place::New => {}
                // Written where the file's items already point.
                Place::Over { .. } => continue,
                Place::Prealloc { .. } => {
                    self.note_extents(tx, ino, i.size, seg.first, seg.last);
                    delta += file::mark_written(tx, tree, ino, seg.first, seg.last)?;
                    continue;
                }
            }
            self.note_extents(tx, ino, i.size, seg.first, seg.last);
            delta -= file::punch(tx, tree, ino, seg.first, seg.last)?;
            let mut at = seg.first;
            for (piece, s) in seg.pieces.iter().zip(sums) {
                delta += file::insert_extent(tx, tree, ino, at, piece, s)? as i64;
                at += piece.ram_len;
            }
        }
        i.nbytes = (i.nbytes as i64 + delta).max(0) as u64;
        self.save_inode(tx, ino, i)?;
        Ok(true)
    }

    /// Puts back ranges a failed flush took, under anything buffered since.
    fn restore(
        &self,
        tx: &mut Txn<'_>,
        (ino, inode): (u64, &Inode),
        taken: Vec<(u64, Arc<Vec<u8>>)>,
    ) {
        self.inodes.mark_dirty(ino);
        let mut s = crate::sync::lock(&inode.state);
        landed(&self.core.budget, &mut s, &taken);
        let before_len = ranges_len(&s.buffered);
        let before = ranges_footprint(s.buffered.iter());
        let newer = std::mem::take(&mut s.buffered);
        let mut merged = Ranges::new();
        for (at, d) in &taken {
            insert_range(&mut merged, *at, d);
        }
        for (at, d) in &newer {
            insert_range(&mut merged, *at, d);
        }
        let after = ranges_footprint(merged.iter());
        let grown = ranges_len(&merged) as i64 - before_len as i64;
        s.buffered = merged;
        s.held_bytes = s.held_bytes.saturating_add_signed(grown);
        // The taken bytes left the count when they were taken.
        self.inodes.add_buffered(grown);
        drop(s);
        adjust(tx, self.tree, before, after);
    }
}

/// How far one flush of a file has come. It takes the ranges in the
/// order of their offsets, and only those that began below the end of the
/// last range buffered when it started: writes go on while a file is
/// flushed (they need only the file's own lock), and a flush that took
/// whatever was there would never end on a file written all along (and
/// a commit waiting for its flush lock would never come). A range written
/// meanwhile behind the sweep is left for the next flush; one that merged
/// into a range still ahead is taken with it, so all that was buffered
/// when the flush began is flushed (as fsync and the commit need).
#[derive(Default)]
struct Sweep {
    /// Ranges that end at or below it were taken (or written later).
    from: u64,
    /// Ranges starting at or past it were written after the flush began.
    until: Option<u64>,
}

/// The first range of `ranges` that ends past `at`: its start.
fn first_ending_past(ranges: &Ranges, at: u64) -> Option<u64> {
    let before = ranges
        .range(..at)
        .next_back()
        .filter(|(&s, d)| s + d.len() as u64 > at);
    before
        .or_else(|| ranges.range(at..).next())
        .map(|(&s, _)| s)
}

/// Takes whole ranges, in order from where `sweep` stands, up to
/// `budget` bytes (at least one range), into the in-flight set, and gives
/// back their space reservation for the flush that allocates them.
fn take(
    tx: &mut Txn<'_>,
    tree: u64,
    s: &mut InodeState,
    budget: u64,
    sweep: &mut Sweep,
) -> Vec<(u64, Arc<Vec<u8>>)> {
    let until = *sweep.until.get_or_insert_with(|| {
        s.buffered
            .last_key_value()
            .map_or(0, |(&at, d)| at + d.len() as u64)
    });
    let mut out = Vec::new();
    let mut taken = 0u64;
    let mut footprint = 0u64;
    while taken < budget {
        let Some(at) = first_ending_past(&s.buffered, sweep.from).filter(|&at| at < until) else {
            break;
        };
        // Whole ranges, and no more than `budget` unless the first is
        // longer: a sequential writer's flushes are its ranges, each
        // written as it is (see `segment_content`).
        if taken > 0
            && s.buffered
                .get(&at)
                .is_some_and(|d| taken + d.len() as u64 > budget)
        {
            break;
        }
        let Some(data) = s.buffered.remove(&at) else {
            break;
        };
        sweep.from = at + data.len() as u64;
        taken += data.len() as u64;
        footprint += span(at, data.len() as u64);
        let data = Arc::new(data);
        // The flush lock admits one flush of a file at a time, and it
        // lands what it took before it lets go: a range is never taken
        // while an earlier flush of it is still in flight.
        let earlier = s.in_flight.insert(at, data.clone());
        debug_assert!(earlier.is_none(), "range at {at} taken twice for flushing");
        out.push((at, data));
    }
    adjust(tx, tree, footprint, 0);
    out
}

/// The flush of `ranges` ended: readers find their bytes in the tree now
/// (or the inode is gone, or they are buffered again).
fn landed(budget: &Budget, s: &mut InodeState, ranges: &[(u64, Arc<Vec<u8>>)]) {
    let mut bytes = 0;
    for (at, _) in ranges {
        if let Some(d) = s.in_flight.remove(at) {
            bytes += d.len() as u64;
            s.changes.landed(*at, at + d.len() as u64);
        }
    }
    debug_assert!(bytes <= s.held_bytes, "landed more bytes than were held");
    s.held_bytes -= bytes;
    budget.add_in_flight(-(bytes as i64));
}

/// The sector-aligned spans the taken ranges cover, merged where they
/// share or touch a sector, with the first sector added for a file whose
/// inline data must move into an extent.
fn segment_spans(taken: &[(u64, Arc<Vec<u8>>)], inline: bool) -> Vec<(u64, u64)> {
    let mut spans = RangeSet::default();
    for (s, d) in taken {
        spans.insert(
            s / SECTOR * SECTOR,
            (s + d.len() as u64).div_ceil(SECTOR) * SECTOR,
        );
    }
    if inline {
        spans.insert(0, SECTOR);
    }
    spans.to_vec()
}

/// The parts of `[first, last)` no taken range covers.
fn uncovered(taken: &[(u64, Arc<Vec<u8>>)], first: u64, last: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = first;
    for (s, d) in overlapping_vec(taken, first, last) {
        if s > pos {
            out.push((pos, s));
        }
        pos = pos.max(s + d.len() as u64);
    }
    if pos < last {
        out.push((pos, last));
    }
    out
}

/// The taken ranges (sorted) that overlap `[first, last)`.
fn overlapping_vec(
    taken: &[(u64, Arc<Vec<u8>>)],
    first: u64,
    last: u64,
) -> impl Iterator<Item = (u64, &[u8])> {
    // Sorted and disjoint, so their ends are sorted too: skip to the
    // first that ends past `first` (a flush of many small ranges asks this
    // once per segment).
    let from = taken.partition_point(|(s, d)| s + d.len() as u64 <= first);
    taken[from..]
        .iter()
        .take_while(move |(s, _)| *s < last)
        .map(|(s, d)| (*s, d.as_slice()))
}

/// The bytes of `[first, last)`: the taken ranges' where they lie, zeros
/// between. Appended in order (the ranges are sorted and disjoint), not
/// zeroed first and overwritten: in a sequential write on RBD, zeroing
/// the segments took a fifth of the daemon's time.
fn laid_end_to_end(taken: &[(u64, Arc<Vec<u8>>)], first: u64, last: u64) -> Vec<u8> {
    let mut content = Vec::with_capacity((last - first) as usize);
    for (s, d) in overlapping_vec(taken, first, last) {
        let lo = s.max(first);
        let hi = (s + d.len() as u64).min(last);
        content.resize((lo - first) as usize, 0);
        content.extend_from_slice(&d[(lo - s) as usize..(hi - s) as usize]);
    }
    content.resize((last - first) as usize, 0);
    content
}

/// The taken range that is all of `[first, last)`, if one is.
fn sole_range(taken: &[(u64, Arc<Vec<u8>>)], first: u64, last: u64) -> Option<&Arc<Vec<u8>>> {
    let at = taken.partition_point(|(s, _)| *s < first);
    let (s, d) = taken.get(at)?;
    (*s == first && s + d.len() as u64 == last).then_some(d)
}

/// A taken range's bytes as the device write's buffer: the write keeps
/// them alive until it is done (RBD writes from them in flight).
struct SharedRange(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedRange {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Allocates each segment's extents (those written in place get their
/// place): the first laid after the file's data
/// before it, each next one after the one before. So the segments of one
/// flush lie end to end on the device whatever their offsets in the file
/// (random writes become one sequential write, as on a log-structured
/// device), and a sequential writer's extents still follow each other.
///
/// On a device that writes in units (RBD objects, `Device::write_unit`),
/// a segment of a unit or more starts on a unit boundary, leaving free
/// the few bytes before it: a write that ends inside an object and the
/// next one that starts there cost the OSDs an operation each for that
/// object, about what a whole object's write costs. A sequential
/// writer's flushes, each a multiple of the unit, then touch whole
/// objects only.
fn allocate(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    segments: &mut [Segment],
    flight: &mut Flight,
) -> Result<()> {
    let root = tx.root_of(tree)?;
    let unit = tx.data_write_unit();
    let mut hint = match segments.first() {
        Some(seg) => file::hint_before(tx, &root, ino, seg.first)?,
        None => return Ok(()),
    };
    for seg in segments {
        let total = seg.last - seg.first;
        if let Some((extent, bytenr)) = seg.place.target() {
            tx.write_in_place(flight, extent, bytenr, total);
            seg.pieces.push(file::Piece::plain(bytenr, total));
            continue;
        }
        let mut at = 0;
        while at < total {
            let max = (total - at).min(file::EXTENT_MAX);
            // A segment of a whole unit of the device's writing or more
            // starts on one (the rest follow it end to end), so that its
            // write covers whole RBD objects.
            let aligned = match at == 0 && unit > 0 && total >= unit {
                true => tx.alloc_flight_data_aligned(flight, (max, total), hint, unit),
                false => None,
            };
            // Else any length down to a sector: fragmented free space
            // still takes the write.
            let (bytenr, len) = match aligned {
                Some(got) => got,
                None => tx.alloc_flight_data(flight, SECTOR, max, hint)?,
            };
            seg.pieces.push(file::Piece::plain(bytenr, len));
            hint = bytenr + len;
            at += len;
        }
    }
    Ok(())
}

impl super::super::Core {
    /// Flushes every file's buffered data, in every subvolume.
    pub(crate) fn flush_all(&self) -> Result<()> {
        for (sv, ino) in self.dirty_files() {
            sv.flush_file(ino)?;
        }
        Ok(())
    }

    /// Flushes the buffered data of every file whose flush lock is free
    /// (to free space: the caller may hold one).
    pub(crate) fn flush_all_available(&self) -> Result<()> {
        for (sv, ino) in self.dirty_files() {
            if let Some(held) = sv.inodes.try_lock_flush(ino) {
                sv.flush_held(ino, &held.inode)?;
            }
        }
        Ok(())
    }

    /// Called by writers past the dirty limit (buffered and in-flight
    /// bytes): flushes the largest files until half the limit is left
    /// buffered. Files another writer is flushing are passed over, so
    /// writers past the limit flush different files side by side; when
    /// it flushed nothing and the limit is still passed (every dirty file
    /// is being flushed, or the bytes are in flight), a writer waits for
    /// a flush to end (that is the back-pressure).
    pub(crate) fn flush_to_limit(&self) -> Result<()> {
        let target = self.budget.limit() / 2;
        let dirty = self.dirty_files();
        let mut flushed = false;
        for (sv, ino) in &dirty {
            if self.budget.buffered() <= target {
                break;
            }
            if let Some(held) = sv.inodes.try_lock_flush(*ino) {
                sv.flush_keeping_credit(*ino, &held.inode)?;
                flushed = true;
            }
        }
        match dirty.first() {
            Some((sv, ino)) if !flushed && self.budget.over_limit() => sv.flush_file(*ino),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments merge ranges that share a sector, and what they leave
    /// uncovered is exactly the old bytes the sectors keep.
    #[test]
    fn segments_cover_whole_sectors() {
        let r = |at: u64, len: usize| (at, Arc::new(vec![1u8; len]));
        let taken = vec![r(100, 200), r(1000, 5000), r(20480, 4096)];
        let spans = segment_spans(&taken, false);
        assert_eq!(spans, vec![(0, 8192), (20480, 24576)]);
        assert_eq!(
            uncovered(&taken, 0, 8192),
            vec![(0, 100), (300, 1000), (6000, 8192)]
        );
        assert!(uncovered(&taken, 20480, 24576).is_empty());
        assert_eq!(
            segment_spans(&[r(9000, 10)], true),
            vec![(0, 4096), (8192, 12288)]
        );
    }

    proptest::proptest! {
        /// A segment built in order holds what zeroed bytes overwritten by
        /// each range would: the ranges' bytes where they lie, zeros
        /// between, cut to the window.
        #[test]
        fn segment_bytes_are_the_ranges_over_zeros(
            gaps_and_lens in proptest::collection::vec((0u64..50, 1usize..40), 0..12),
            first in 0u64..300,
            width in 0u64..300,
        ) {
            let mut taken = Vec::new();
            let mut at = 0u64;
            for (i, (gap, len)) in gaps_and_lens.into_iter().enumerate() {
                at += gap;
                taken.push((at, Arc::new(vec![i as u8 + 1; len])));
                at += len as u64;
            }
            let last = first + width;
            let mut model = vec![0u8; width as usize];
            for (s, d) in &taken {
                for (k, b) in d.iter().enumerate() {
                    let p = s + k as u64;
                    if p >= first && p < last {
                        model[(p - first) as usize] = *b;
                    }
                }
            }
            proptest::prop_assert_eq!(laid_end_to_end(&taken, first, last), model);
        }
    }

    /// A segment that is exactly one taken range is written from that
    /// range's own bytes; any other is laid out anew.
    #[test]
    fn a_segment_of_one_whole_range_is_that_range() {
        let range = Arc::new(vec![3u8; 2 * SECTOR as usize]);
        let taken = vec![
            (0, Arc::new(vec![1u8; 100])),
            (SECTOR, range.clone()),
            (3 * SECTOR, Arc::new(vec![2u8; 10])),
        ];
        let sole = sole_range(&taken, SECTOR, 3 * SECTOR).expect("one range");
        assert!(Arc::ptr_eq(sole, &range));
        let bytes = Bytes::from_owner(SharedRange(sole.clone()));
        assert_eq!(bytes.as_ptr(), range.as_ptr());
        assert!(
            sole_range(&taken, 0, SECTOR).is_none(),
            "range shorter than its sector"
        );
        assert!(sole_range(&taken, SECTOR, 4 * SECTOR).is_none());
        assert!(sole_range(&taken, 2 * SECTOR, 3 * SECTOR).is_none());
    }

    /// A run grows only by a part written where it ends, and merges parts
    /// that continue each other in one segment's bytes.
    #[test]
    fn runs_gather_extents_laid_end_to_end() {
        let mut run = Run::default();
        assert!(!run.extend(0, (0, 0, 4096)), "an empty run takes nothing");
        let mut run = Run::starting(8192, (0, 0, 4096));
        assert!(run.extend(12288, (0, 4096, 8192)));
        assert!(run.extend(16384, (1, 0, 4096)));
        assert!(!run.extend(24576, (2, 0, 4096)), "a gap ends the run");
        assert_eq!((run.start, run.len), (8192, 12288));
        assert_eq!(run.parts, vec![(0, 0, 8192), (1, 0, 4096)]);
    }
}
