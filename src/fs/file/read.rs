//! Reading file data: a read is planned under the engine lock (which
//! device bytes fill which part of the result, with their checksums, and
//! which compressed extents to decode) and executed after it is gone.

use super::{is_compressed, item_len, items_in, FileExtentItem, SECTOR};
use crate::error::{Error, Result};
use crate::format::items::{FILE_EXTENT_INLINE, FILE_EXTENT_REG};
use crate::format::key_type::EXTENT_CSUM;
use crate::format::{Key, CSUM_OBJECTID};
use crate::tree::{BlockRead, RootPtr};
use crate::txn::DataCopies;
/// Reads `[offset, offset+len)` of the file (already clamped to its size)
/// through `b` itself: for inline data and the engine's tests. File reads
/// of extents go through [`plan_read`] and the device outside the lock.
pub(crate) fn read<B: BlockRead + DataCopies + ?Sized>(
    b: &B,
    root: &RootPtr,
    csum_root: Option<&RootPtr>,
    ino: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>> {
    plan_read(b, root, csum_root, ino, offset, len)?.execute(b)
}

/// Where one piece of a planned read comes from.
enum Source {
    /// Inline bytes, copied from the leaf.
    Bytes(Vec<u8>),
    /// Whole sectors of a data extent with their checksums (none for a
    /// file that keeps none); the piece starts `skip` bytes in.
    Extent {
        bytenr: u64,
        len: u64,
        skip: usize,
        sums: Option<Vec<u8>>,
    },
    /// A whole compressed extent, decoded once; the piece starts `skip`
    /// bytes into the decoded data.
    Compressed {
        bytenr: u64,
        disk_len: u64,
        kind: u8,
        ram_bytes: u64,
        skip: usize,
        sums: Option<Vec<u8>>,
    },
}

/// A file read found under the engine lock: which device bytes fill which
/// part of the result, and the checksums to verify them with. Executed
/// after the lock is gone (`Engine::read_unlocked`).
pub(crate) struct ReadPlan {
    /// The file read (named when a bad copy is repaired).
    ino: u64,
    len: usize,
    /// (offset in the result, length, source); the rest reads as zeros.
    parts: Vec<(usize, usize, Source)>,
}

/// Plans the read of `[offset, offset+len)` of the file: holes and
/// preallocated ranges read as zeros. `csum_root` is None for a file
/// that keeps no checksums (`chattr +C`, see [`super::csum_root_for`]):
/// its data is read as the device holds it.
pub(crate) fn plan_read<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    csum_root: Option<&RootPtr>,
    ino: u64,
    offset: u64,
    len: u64,
) -> Result<ReadPlan> {
    let end = offset + len;
    let mut parts = Vec::new();
    for (k, fe) in items_in(b, root, ino, offset, end)? {
        let from = k.max(offset);
        let to = (k + item_len(&fe)).min(end);
        if from >= to {
            continue;
        }
        let (at, n) = ((from - offset) as usize, (to - from) as usize);
        if fe.kind == FILE_EXTENT_INLINE {
            let bytes = super::inline_plain(&fe)?[(from - k) as usize..(to - k) as usize].to_vec();
            parts.push((at, n, Source::Bytes(bytes)));
        } else if is_compressed(&fe) && fe.disk_bytenr != 0 {
            parts.push((at, n, plan_compressed(b, csum_root, &fe, from - k)?));
        } else if fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0 {
            parts.push((at, n, plan_extent(b, csum_root, &fe, from - k, n as u64)?));
        }
    }
    Ok(ReadPlan {
        ino,
        len: len as usize,
        parts,
    })
}

/// The sectors of an extent holding `len` bytes from `skip` bytes into
/// the part the item uses, with their checksums.
fn plan_extent<B: BlockRead + ?Sized>(
    b: &B,
    csum_root: Option<&RootPtr>,
    fe: &FileExtentItem,
    skip: u64,
    len: u64,
) -> Result<Source> {
    // The item checker keeps the used part inside the extent; checked
    // anyway, as every sum of disk values is.
    let end = fe
        .offset
        .checked_add(skip)
        .and_then(|pos| Some((pos, pos.checked_add(len)?)))
        .filter(|&(_, end)| end <= fe.disk_num_bytes);
    let Some((pos, end)) = end else {
        return Err(Error::corrupt(
            fe.disk_bytenr,
            "file extent reads past its data extent",
        ));
    };
    let first = pos / SECTOR * SECTOR;
    let last = end.div_ceil(SECTOR) * SECTOR;
    let sums = extent_sums(b, csum_root, fe.disk_bytenr, first, last)?;
    Ok(Source::Extent {
        bytenr: fe.disk_bytenr + first,
        len: last - first,
        skip: (pos - first) as usize,
        sums,
    })
}

/// The checksums of sectors `[first, last)` (byte offsets) of the data
/// extent at `bytenr`. A short checksum item fails the sectors it lacks
/// when they are read.
fn extent_sums<B: BlockRead + ?Sized>(
    b: &B,
    csum_root: Option<&RootPtr>,
    bytenr: u64,
    first: u64,
    last: u64,
) -> Result<Option<Vec<u8>>> {
    let Some(csum_root) = csum_root else {
        return Ok(None);
    };
    let sums = crate::tree::get(b, csum_root, &Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr))?
        .ok_or_else(|| Error::corrupt(bytenr, "data extent without checksums"))?;
    let (s0, s1) = ((first / SECTOR * 4) as usize, (last / SECTOR * 4) as usize);
    Ok(Some(sums[s0.min(sums.len())..s1.min(sums.len())].to_vec()))
}

/// Reads `buf.len()` bytes at `bytenr` checked against `sums`, or as the
/// device holds them when there are none to check.
fn read_data<D: DataCopies + ?Sized>(
    d: &D,
    bytenr: u64,
    buf: &mut [u8],
    sums: &Option<Vec<u8>>,
    ino: u64,
) -> Result<()> {
    match sums {
        Some(sums) => d.read_good_data(bytenr, buf, sums, Some(ino)),
        None => d.read_unchecked_data(bytenr, buf, Some(ino)),
    }
}

/// A compressed extent, read whole; the piece starts `skip` bytes into
/// the part the item uses.
fn plan_compressed<B: BlockRead + ?Sized>(
    b: &B,
    csum_root: Option<&RootPtr>,
    fe: &FileExtentItem,
    skip: u64,
) -> Result<Source> {
    let skip = fe
        .offset
        .checked_add(skip)
        .filter(|&s| s < fe.ram_bytes.min(crate::compress::CHUNK))
        .ok_or_else(|| Error::corrupt(fe.disk_bytenr, "file extent reads past its data extent"))?;
    Ok(Source::Compressed {
        bytenr: fe.disk_bytenr,
        disk_len: fe.disk_num_bytes,
        kind: fe.compression,
        ram_bytes: fe.ram_bytes,
        skip: skip as usize,
        sums: extent_sums(b, csum_root, fe.disk_bytenr, 0, fe.disk_num_bytes)?,
    })
}

/// Reads, checks and decodes a compressed extent. A frame that does not
/// decode is EIO, with one log line.
/// `out` is as long as the extent decodes to (at most a chunk), or, with
/// `ram_bytes` given, the part of it from the start a read needs.
fn read_compressed<D: DataCopies + ?Sized>(
    d: &D,
    ino: u64,
    (bytenr, disk_len, kind): (u64, u64, u8),
    (sums, ram_bytes): (&Option<Vec<u8>>, Option<u64>),
    out: &mut [u8],
) -> Result<()> {
    if disk_len > crate::compress::CHUNK {
        return Err(Error::corrupt(
            bytenr,
            "compressed extent larger than a chunk",
        ));
    }
    let mut frame = vec![0u8; disk_len as usize];
    read_data(d, bytenr, &mut frame, sums, ino)?;
    let decoded = match ram_bytes {
        Some(ram) => crate::compress::decode_prefix(kind, &frame, ram, out),
        None => crate::compress::decode_into(kind, &frame, out),
    };
    decoded.map_err(|why| {
        tracing::error!(bytenr, %why, "compressed extent does not decode");
        Error::corrupt(bytenr, why)
    })
}

impl ReadPlan {
    /// Reads the planned bytes; a sector whose checksum does not match
    /// gives EIO.
    pub(crate) fn execute<D: DataCopies + ?Sized>(&self, d: &D) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.execute_into(d, &mut out)?;
        Ok(out)
    }

    /// Bytes the plan reads.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// [`ReadPlan::execute`] into `out` (its first [`ReadPlan::len`]
    /// bytes), which may hold anything: what no part covers (holes) is
    /// zeroed.
    pub(crate) fn execute_into<D: DataCopies + ?Sized>(&self, d: &D, out: &mut [u8]) -> Result<()> {
        let out = &mut out[..self.len];
        let covered: usize = self.parts.iter().map(|(_, n, _)| *n).sum();
        if covered < self.len {
            out.fill(0);
        }
        for (at, n, src) in &self.parts {
            let dst = &mut out[*at..*at + *n];
            match src {
                Source::Bytes(b) => dst.copy_from_slice(b),
                // Whole sectors wanted whole (a sequential reader's
                // aligned requests): read and checked in place, without a
                // buffer of their own and a copy.
                Source::Extent {
                    bytenr,
                    len,
                    skip: 0,
                    sums,
                } if *len as usize == *n => {
                    read_data(d, *bytenr, dst, sums, self.ino)?;
                }
                Source::Extent {
                    bytenr,
                    len,
                    skip,
                    sums,
                } => {
                    let mut buf = vec![0u8; *len as usize];
                    read_data(d, *bytenr, &mut buf, sums, self.ino)?;
                    dst.copy_from_slice(&buf[*skip..*skip + *n]);
                }
                Source::Compressed {
                    bytenr,
                    disk_len,
                    kind,
                    ram_bytes,
                    skip,
                    sums,
                } => {
                    let at = (*bytenr, *disk_len, *kind);
                    // The whole extent wanted (an aligned reader's): decoded
                    // in place.
                    if *skip == 0 && *n as u64 == *ram_bytes {
                        read_compressed(d, self.ino, at, (sums, None), dst)?;
                        continue;
                    }
                    // Decoded as far as the read needs.
                    let upto = *skip + *n;
                    if upto as u64 > *ram_bytes.min(&crate::compress::CHUNK) {
                        return Err(Error::corrupt(
                            *bytenr,
                            "file extent reads past its data extent",
                        ));
                    }
                    let mut plain = vec![0u8; upto];
                    read_compressed(d, self.ino, at, (sums, Some(*ram_bytes)), &mut plain)?;
                    dst.copy_from_slice(&plain[*skip..]);
                }
            }
        }
        Ok(())
    }
}

/// The device ranges holding the data of `[start, end)` of the file, for
/// read-ahead.
pub(crate) fn device_ranges<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for (k, fe) in items_in(b, root, ino, start, end)? {
        if fe.kind != FILE_EXTENT_REG || fe.disk_bytenr == 0 {
            continue;
        }
        let from = k.max(start);
        let to = (k + item_len(&fe)).min(end);
        if is_compressed(&fe) {
            push_merged(&mut out, fe.disk_bytenr, fe.disk_num_bytes);
        } else if from < to {
            push_merged(&mut out, fe.disk_bytenr + fe.offset + (from - k), to - from);
        }
    }
    Ok(out)
}

/// Appends `[at, at + len)`, joined to the last range when it follows it
/// on the device: a file written in order lies in extents end to end, and
/// one large prefetch lets the device read in its own units (RBD: whole
/// 4 MiB objects) rather than an extent's.
fn push_merged(out: &mut Vec<(u64, u64)>, at: u64, len: u64) {
    match out.last_mut() {
        Some((start, l)) if *start + *l == at => *l += len,
        _ => out.push((at, len)),
    }
}

/// Leaves of checksums one read-ahead window may start reading.
const SUM_LEAVES_AHEAD: usize = 32;

/// Starts reading the checksum leaves of the device ranges a read-ahead
/// window covers ([`device_ranges`]): each read of the window looks its
/// checksums up, and without this every leaf it reaches is a wait for the
/// disk of its own (on RBD, a round trip per 16 KiB leaf). Only a hint: a
/// node it cannot read fails the read that needs it, not this one.
pub(crate) fn prefetch_sums<B: BlockRead + ?Sized>(
    b: &B,
    csum_root: &RootPtr,
    ranges: &[(u64, u64)],
) {
    for &(at, len) in ranges {
        let first = Key::new(CSUM_OBJECTID, EXTENT_CSUM, at);
        let last = Key::new(CSUM_OBJECTID, EXTENT_CSUM, at + len.saturating_sub(1));
        if let Err(e) = crate::tree::prefetch_leaves(b, csum_root, &first, &last, SUM_LEAVES_AHEAD)
        {
            tracing::debug!("no read-ahead of checksums at {at}: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::push_merged;

    #[test]
    fn ranges_end_to_end_on_the_device_merge() {
        let mut out = Vec::new();
        for (at, len) in [(0, 10), (10, 5), (20, 5), (25, 5), (15, 1)] {
            push_merged(&mut out, at, len);
        }
        assert_eq!(out, [(0, 15), (20, 10), (15, 1)]);
    }
}
