//! Device replace: copy everything one device holds to a new device,
//! with the filesystem mounted, so that the new one can take its place.
//!
//! The target is laid out as the source is (see `txn::replace`): the
//! copy the source holds at physical offset X goes to X on the target.
//! Once `Engine::replace_begin` has made every new write to the source
//! reach the target too, this pass walks the extent tree as scrub does
//! (in disk order, in short batches under the engine's read lock, so an
//! extent cannot be freed and its space reused while it is copied) and,
//! for every tree block and data extent with a copy on the source,
//! writes the bytes of a good copy to the target. A good copy is one
//! that passes a first read's checks (tree blocks) or its checksums
//! (data, sector by sector): the source's own copy first, unless the
//! source is missing or `avoid_source` asks for the others first (as
//! btrfs's `replace start -r`, for a source that is failing or slow). A
//! sector no copy holds right is copied as the source holds it and
//! reported, so the target is never worse than the source was.
//!
//! What the walk finds not yet on disk (dirty tree blocks, data in
//! flight) reaches the target through its own write. Data extents
//! without checksums (preallocated space, a `chattr +C` file's data) are
//! copied as the first copy that reads holds them, once no write in
//! place into them is under way (`Reader::wait_in_place`): such a write
//! reaches the target too, and the copy must not overwrite it with
//! older bytes.

use crate::error::{Error, Result};
use crate::format::items::ExtentItem;
use crate::format::key_type::EXTENT_CSUM;
use crate::format::tree_id::CSUM;
use crate::format::{Key, CSUM_OBJECTID, SECTORSIZE};
use crate::scrub::{walk_extents, Control, Pace};
use crate::txn::{DataCopies, Engine, Reader};
use serde::{Deserialize, Serialize};
use std::time::Instant;

const SECTOR: u64 = SECTORSIZE as u64;
/// Largest single read of a data extent, and write to the target. Under
/// the file device's smallest direct write (1 MiB), so that the target's
/// writes go through the host's page cache, which writes them back while
/// the next chunks are read (a direct write waits for the device); the
/// commit that swaps the target in barriers it first, as it would direct
/// writes.
const READ_CHUNK: u64 = 512 << 10;
/// How far past the chunk being copied the copy read first is read
/// ahead (the next extents most likely lie there): reads of the source
/// then overlap the writes to the target.
const READ_AHEAD: u64 = 4 << 20;

/// What a replace copied.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Source device.
    pub source: u64,
    /// Tree blocks and data extents with a copy on the source, copied.
    pub tree_blocks: u64,
    pub data_extents: u64,
    /// Bytes written to the target by the copy (writes made meanwhile
    /// reach it on their own and are not counted).
    pub bytes_copied: u64,
    /// Tree blocks and data sectors read from another copy, because the
    /// source's was bad or missing, or `-r` asked for the others first.
    pub from_other_copies: u64,
    /// Logical addresses of tree blocks and data sectors no copy held
    /// right: copied as the source held them.
    pub uncorrectable: Vec<u64>,
    /// Why parts could not be copied at all.
    pub errors: Vec<String>,
    pub cancelled: bool,
    pub seconds: f64,
}

/// How to copy.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Options {
    /// Read the source only when no other copy is good (`-r`).
    pub avoid_source: bool,
}

/// Copies everything device `source` holds to the replace target the
/// volume has (set by `Engine::replace_begin`). The caller finishes or
/// abandons the replace by what the report says.
pub fn run(engine: &Engine, source: u64, ctl: &Control, opts: Options) -> Result<Report> {
    let started = Instant::now();
    ctl.set_total(engine.space().0);
    let avoid_source = opts.avoid_source || !engine.device_present(source);
    let mut report = Report {
        source,
        ..Report::default()
    };
    // Unthrottled: a batch holds writers back no longer than a scrub's,
    // and a replace is what a failing device waits on.
    let pace = Pace { throttle: false };
    let walked = walk_extents(engine, ctl, pace, |r, key, item| {
        // Pieces lie whole on their devices (a RAID10 extent crosses
        // pairs of devices unit by unit).
        let pieces: Vec<((u64, u64), Copies)> = r
            .data_pieces(key.objectid, key.offset)
            .into_iter()
            .map(|(o, l)| ((o, l), Copies::of(r, o, l, source, avoid_source)))
            .collect();
        if pieces.iter().all(|(_, on)| on.source_stripes.is_empty()) {
            return Ok(key.offset);
        }
        match item.is_tree_block() {
            true => copy_tree_block(r, key, item, &pieces[0].1, &mut report),
            false => copy_data(r, key.objectid, &pieces, &mut report),
        }
    });
    report.errors.extend(walked.errors);
    report.cancelled = walked.cancelled;
    report.seconds = started.elapsed().as_secs_f64();
    ctl.finish();
    Ok(report)
}

/// An extent's copies: which lie on the source (and where), and the
/// order to read them in.
struct Copies {
    /// (copy, physical offset on the source).
    source_stripes: Vec<(usize, u64)>,
    /// Copies to try, the preferred first.
    order: Vec<usize>,
}

impl Copies {
    fn of(r: &Reader<'_>, bytenr: u64, len: u64, source: u64, avoid_source: bool) -> Copies {
        let copies = r.data_copies(bytenr, len);
        let stripes: Vec<_> = (0..copies)
            .map(|c| (c, r.copy_stripe(bytenr, len, c)))
            .collect();
        let source_stripes: Vec<(usize, u64)> = stripes
            .iter()
            .filter_map(|&(c, s)| s.filter(|s| s.devid == source).map(|s| (c, s.offset)))
            .collect();
        let on_source = |c: &usize| source_stripes.iter().any(|(s, _)| s == c);
        let (mut first, mut then): (Vec<usize>, Vec<usize>) = (0..copies).partition(on_source);
        if avoid_source {
            std::mem::swap(&mut first, &mut then);
        }
        first.extend(then);
        Copies {
            source_stripes,
            order: first,
        }
    }

    fn is_source(&self, copy: usize) -> bool {
        self.source_stripes.iter().any(|&(c, _)| c == copy)
    }

    /// Writes `buf`, the bytes `at` bytes into the extent, over every
    /// source copy's place on the target.
    fn write(&self, r: &Reader<'_>, buf: &[u8], at: u64) -> Result<u64> {
        for &(_, physical) in &self.source_stripes {
            r.write_replace_target(buf, physical + at)?;
        }
        Ok(buf.len() as u64 * self.source_stripes.len() as u64)
    }
}

fn copy_tree_block(
    r: &Reader<'_>,
    key: Key,
    item: &ExtentItem,
    on: &Copies,
    report: &mut Report,
) -> Result<u64> {
    let bytenr = key.objectid;
    let Some(found) = r.good_block_on_disk(bytenr, item.generation, &on.order) else {
        return Ok(key.offset);
    };
    report.tree_blocks += 1;
    let bytes = match found {
        Ok((copy, bytes)) => {
            if !on.is_source(copy) {
                report.from_other_copies += 1;
            }
            bytes
        }
        Err(e) => {
            tracing::error!(bytenr, error = %e, "device replace: no good copy of a tree block");
            report.uncorrectable.push(bytenr);
            match source_bytes(r, bytenr, key.offset as usize, on) {
                Some(b) => b,
                None => return Ok(key.offset),
            }
        }
    };
    report.bytes_copied += on.write(r, &bytes, 0)?;
    Ok(key.offset)
}

/// The bytes a source copy holds, bad as they may be; None if none
/// reads.
fn source_bytes(r: &Reader<'_>, bytenr: u64, len: usize, on: &Copies) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    on.source_stripes
        .iter()
        .any(|&(c, _)| r.read_data_copy(bytenr, &mut buf, c).is_ok())
        .then_some(buf)
}

/// Copies a data extent chunk by chunk: each chunk is read from the
/// preferred copy, and each sector failing its checksum from the next
/// copies until one matches. An extent without checksums (a `chattr +C`
/// file's, or preallocated space) is copied once no write in place into
/// it is under way, each chunk as the first copy that reads holds it.
/// `pieces` are the extent's parts that lie whole on their devices, with
/// their copies.
fn copy_data(
    r: &Reader<'_>,
    bytenr: u64,
    pieces: &[((u64, u64), Copies)],
    report: &mut Report,
) -> Result<u64> {
    let sums = r.get(CSUM, &Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr))?;
    if sums.is_none() {
        r.wait_in_place(Some(bytenr));
    }
    report.data_extents += 1;
    let mut len = 0;
    for &((start, piece_len), ref on) in pieces {
        len += piece_len;
        if on.source_stripes.is_empty() {
            continue;
        }
        let mut done = 0;
        while done < piece_len {
            let n = (piece_len - done).min(READ_CHUNK) as usize;
            let mut buf = vec![0u8; n];
            let addr = start + done;
            if let Some(&first) = on.order.first() {
                r.prefetch_data_copy(addr + n as u64, READ_AHEAD, first);
            }
            let read = match &sums {
                Some(sums) => {
                    copy_chunk(r, addr, &mut buf, (addr - bytenr, sums), on, report);
                    true
                }
                None => copy_unsummed_chunk(r, addr, &mut buf, on, report),
            };
            if read {
                report.bytes_copied += on.write(r, &buf, done)?;
            }
            done += n as u64;
        }
    }
    Ok(len)
}

/// Fills `buf` with the chunk at `addr` of an extent without checksums,
/// from the first copy that reads; false (reported) when none does.
fn copy_unsummed_chunk(
    r: &Reader<'_>,
    addr: u64,
    buf: &mut [u8],
    on: &Copies,
    report: &mut Report,
) -> bool {
    match on
        .order
        .iter()
        .find(|&&copy| r.read_data_copy(addr, buf, copy).is_ok())
    {
        Some(&copy) => {
            if !on.is_source(copy) {
                report.from_other_copies += 1;
            }
            true
        }
        None => {
            tracing::error!(bytenr = addr, "device replace: no copy of data reads");
            report.uncorrectable.push(addr);
            false
        }
    }
}

/// Fills `buf` with the good bytes of the chunk at `addr`, `at` bytes
/// into an extent whose sector checksums are `sums`.
fn copy_chunk(
    r: &Reader<'_>,
    addr: u64,
    buf: &mut [u8],
    (at, sums): (u64, &[u8]),
    on: &Copies,
    report: &mut Report,
) {
    let sector_ok =
        |b: &[u8], i: usize| crate::format::sector_matches(sums, (at / SECTOR) as usize + i, b);
    let sectors = buf.len().div_ceil(SECTOR as usize);
    let span = |i: usize, n: usize| i * SECTOR as usize..((i + 1) * SECTOR as usize).min(n);
    let mut good = vec![false; sectors];
    let mut fallback = vec![false; sectors];
    let mut from = vec![0; sectors];
    let mut scratch = vec![0u8; buf.len()];
    for &copy in &on.order {
        if good.iter().all(|&g| g) {
            break;
        }
        if r.read_data_copy(addr, &mut scratch, copy).is_err() {
            continue;
        }
        for i in 0..sectors {
            if good[i] {
                continue;
            }
            let s = span(i, buf.len());
            if sector_ok(&scratch[s.clone()], i) {
                buf[s.clone()].copy_from_slice(&scratch[s]);
                (good[i], from[i]) = (true, copy);
            } else if !fallback[i] && on.is_source(copy) {
                // Until a good copy turns up, the source's own bytes.
                buf[s.clone()].copy_from_slice(&scratch[s]);
                fallback[i] = true;
            }
        }
    }
    for i in 0..sectors {
        let addr = addr + i as u64 * SECTOR;
        if !good[i] {
            tracing::error!(
                bytenr = addr,
                "device replace: no copy of a data sector matches its checksum"
            );
            report.uncorrectable.push(addr);
        } else if !on.is_source(from[i]) {
            report.from_other_copies += 1;
        }
    }
}

/// Refuses a report whose copy could not finish.
pub fn check_complete(report: &Report) -> Result<()> {
    if report.cancelled {
        return Err(Error::Posix(libc::ECANCELED, "the replace was cancelled"));
    }
    if let Some(e) = report.errors.first() {
        return Err(Error::Invalid(format!(
            "the replace could not copy everything: {e}"
        )));
    }
    Ok(())
}
