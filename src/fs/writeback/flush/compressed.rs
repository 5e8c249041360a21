//! The flush of a file whose data is compressed (see `crate::compress`).
//!
//! It differs from a plain flush in step 2 and 3: the extents cannot be
//! allocated before the data is compressed, since their lengths are the
//! compressed ones. So step 2 keeps the segments' data reservation
//! instead of allocating; step 3 builds the segments' bytes, cuts them
//! into chunks of at most [`compress::CHUNK`] (at multiples of it in the
//! file, so the kernel's aligned reads never straddle two extents),
//! compresses the chunks on up to [`MAX_THREADS`] threads, then a short
//! transaction trades the reservation for extents of the compressed
//! lengths, laid end to end after the file's previous data, and the
//! extents are written. A chunk that did not compress, or whose
//! compressed extent finds no contiguous free space, is written plain.

use super::*;
use crate::compress::{self, Codec, Property};
use crate::format::inode::{InodeItem, INODE_NOCOMPRESS, INODE_NODATACOW};

/// Most threads one flush compresses on.
const MAX_THREADS: usize = 4;
/// Fewer chunks than this are compressed on the flushing thread alone.
const PARALLEL_FROM: usize = 8;

/// A chunk of a segment's bytes, and its compressed frame if it saved a
/// sector.
struct Chunk {
    seg: usize,
    from: usize,
    to: usize,
    frame: Option<Vec<u8>>,
    tried: bool,
}

impl crate::fs::Subvol {
    /// The codec the next flush of `ino` compresses with, if any: the
    /// file's property over the mount's policy.
    pub(super) fn codec_for(&self, tx: &Txn<'_>, ino: u64, i: &InodeItem) -> Result<Option<Codec>> {
        // Compressed data is always written anew: a `chattr +C` file,
        // which writes in place, stays uncompressed (as on btrfs).
        if i.flags & INODE_NODATACOW != 0 {
            return Ok(None);
        }
        let policy = self.core.compression();
        let root = tx.root_of(self.tree)?;
        let value = crate::fs::xattr::find(tx, &root, ino, compress::PROPERTY)?;
        let gave_up = i.flags & INODE_NOCOMPRESS != 0;
        Ok(compress::choose(
            policy,
            Property::from_xattr(value.as_deref()),
            gave_up,
        ))
    }

    /// A file of at most a sector with no extents is stored as one
    /// compressed inline item when its frame fits in [`file::INLINE_MAX`]
    /// bytes (btrfs's rule). False, with nothing changed, when it does
    /// not: the flush then goes on as for any file. Compressing a sector
    /// under the engine lock costs microseconds, less than the item's
    /// insertion.
    pub(super) fn try_inline_compressed(
        &self,
        tx: &mut Txn<'_>,
        (ino, mut i): (u64, InodeItem),
        taken: &[(u64, Arc<Vec<u8>>)],
        codec: Codec,
    ) -> Result<bool> {
        let root = tx.root_of(self.tree)?;
        if !file::may_inline_compressed(tx, &root, ino, i.size)? {
            return Ok(false);
        }
        let csum_root = tx.root_of(CSUM)?;
        let mut content = file::read(tx, &root, Some(&csum_root), ino, 0, i.size)?;
        for (offset, data) in taken {
            // Zeros buffered past the end (a truncate's) are not data.
            let keep = i.size.saturating_sub(*offset).min(data.len() as u64) as usize;
            let at = *offset as usize;
            if keep > 0 {
                content[at..at + keep].copy_from_slice(&data[..keep]);
            }
        }
        let Some(frame) = compress::encode_inline(codec, &content, file::INLINE_MAX as usize)
        else {
            return Ok(false);
        };
        self.note_extents(tx, ino, i.size, 0, i.size);
        let delta = file::put_inline(tx, self.tree, ino, (i.size, codec.kind()), frame)?;
        i.nbytes = (i.nbytes as i64 + delta).max(0) as u64;
        self.save_inode(tx, ino, i)?;
        Ok(true)
    }

    /// Marks `ino` as not compressing (unless it is gone).
    pub(super) fn mark_nocompress(&self, tx: &mut Txn<'_>, ino: u64) -> Result<()> {
        match self.inode_tx(tx, ino) {
            Ok(mut i) => {
                i.flags |= INODE_NOCOMPRESS;
                self.save_inode(tx, ino, i)
            }
            Err(Error::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Step 3 of a compressing flush: compresses, allocates and writes
    /// the segments' extents. Returns the checksums of each segment's
    /// pieces.
    pub(super) fn write_compressed(
        &self,
        ino: u64,
        job: &mut FlushJob,
        codec: Codec,
    ) -> Result<Vec<Vec<Vec<u8>>>> {
        let contents = job
            .segments
            .iter()
            .map(|seg| self.segment_content(job, seg))
            .collect::<Result<Vec<_>>>()?;
        let force = self.core.compression().force;
        let mut chunks = chunks_of(&job.segments);
        compress_chunks(codec, force, &contents, &mut chunks);
        job.gave_up =
            !force && chunks.iter().any(|c| c.tried) && chunks.iter().all(|c| c.frame.is_none());
        self.core
            .engine
            .write(|tx| self.allocate_chunks(tx, ino, job, (&chunks, codec)))?;
        let mut bytes = Vec::new();
        let mut next = vec![0usize; job.segments.len()];
        for c in &chunks {
            let seg = &job.segments[c.seg];
            let mut at = c.from;
            while at < c.to {
                let piece = seg.pieces[next[c.seg]];
                next[c.seg] += 1;
                let data = match &c.frame {
                    Some(f) if piece.compression != 0 => f.as_slice(),
                    _ => &contents[c.seg][at..at + piece.ram_len as usize],
                };
                bytes.push((c.seg, piece.bytenr, data));
                at += piece.ram_len as usize;
            }
        }
        self.write_pieces(&job.flight, &bytes)?;
        let mut sums = vec![Vec::new(); job.segments.len()];
        for (seg, _, data) in &bytes {
            sums[*seg].push(file::sector_sums(data));
        }
        Ok(sums)
    }

    /// Trades the job's data reservation for extents: each compressed
    /// chunk gets one of its frame's length, each other chunk plain
    /// pieces, laid end to end after the file's data before them.
    fn allocate_chunks(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        job: &mut FlushJob,
        (chunks, codec): (&[Chunk], Codec),
    ) -> Result<()> {
        tx.release_data(self.tree, std::mem::take(&mut job.held_data));
        let root = tx.root_of(self.tree)?;
        let mut hint = match job.segments.first() {
            Some(seg) => file::hint_before(tx, &root, ino, seg.first)?,
            None => return Ok(()),
        };
        for c in chunks {
            let pieces = &mut job.segments[c.seg].pieces;
            if let Some(f) = &c.frame {
                let len = f.len() as u64;
                match tx.alloc_flight_data(&mut job.flight, len, len, hint) {
                    Ok((bytenr, _)) => {
                        pieces.push(file::Piece {
                            bytenr,
                            disk_len: len,
                            ram_len: (c.to - c.from) as u64,
                            compression: codec.kind(),
                        });
                        hint = bytenr + len;
                        continue;
                    }
                    // Free space too broken up for the frame: plain.
                    Err(Error::NoSpace) => {}
                    Err(e) => return Err(e),
                }
            }
            let mut left = (c.to - c.from) as u64;
            while left > 0 {
                let (bytenr, len) = tx.alloc_flight_data(&mut job.flight, SECTOR, left, hint)?;
                pieces.push(file::Piece::plain(bytenr, len));
                hint = bytenr + len;
                left -= len;
            }
        }
        Ok(())
    }

    /// Writes each piece's bytes at its place, one device write per run
    /// of pieces laid end to end.
    fn write_pieces(&self, flight: &Flight, pieces: &[(usize, u64, &[u8])]) -> Result<()> {
        let mut i = 0;
        while i < pieces.len() {
            let start = pieces[i].1;
            let mut end = start + pieces[i].2.len() as u64;
            let mut j = i + 1;
            while j < pieces.len() && pieces[j].1 == end {
                end += pieces[j].2.len() as u64;
                j += 1;
            }
            if j == i + 1 {
                self.core.engine.write_flight(flight, start, pieces[i].2)?;
            } else {
                let mut buf = Vec::with_capacity((end - start) as usize);
                for (_, _, data) in &pieces[i..j] {
                    buf.extend_from_slice(data);
                }
                self.core
                    .engine
                    .write_flight_owned(flight, start, buf.into())?;
            }
            i = j;
        }
        Ok(())
    }
}

/// The segments cut into chunks that end at multiples of
/// [`compress::CHUNK`] in the file (or at their segment's end).
fn chunks_of(segments: &[Segment]) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (index, seg) in segments.iter().enumerate() {
        let mut pos = seg.first;
        while pos < seg.last {
            let end = seg.last.min((pos / compress::CHUNK + 1) * compress::CHUNK);
            out.push(Chunk {
                seg: index,
                from: (pos - seg.first) as usize,
                to: (end - seg.first) as usize,
                frame: None,
                tried: false,
            });
            pos = end;
        }
    }
    out
}

/// Compresses the chunks worth trying, side by side on several threads
/// when there are many. A one-sector chunk cannot save a sector.
/// Threads a large flush compresses on: the CPUs this process may use,
/// up to [`MAX_THREADS`]. Asked once: the answer reads cgroup files, which
/// cost a small flush (an fsync's) more than compressing it.
fn compress_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
    })
}

fn compress_chunks(codec: Codec, force: bool, contents: &[Bytes], chunks: &mut [Chunk]) {
    let work = |c: &mut Chunk| {
        let data = &contents[c.seg][c.from..c.to];
        if data.len() <= SECTOR as usize {
            return;
        }
        c.tried = true;
        if force || compress::looks_compressible(data) {
            c.frame = compress::encode(codec, data);
        }
    };
    if chunks.len() < PARALLEL_FROM {
        chunks.iter_mut().for_each(work);
        return;
    }
    let threads = compress_threads();
    if threads < 2 {
        chunks.iter_mut().for_each(work);
        return;
    }
    let per = chunks.len().div_ceil(threads);
    std::thread::scope(|s| {
        for part in chunks.chunks_mut(per) {
            s.spawn(move || part.iter_mut().for_each(work));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_end_at_chunk_multiples_of_the_file() {
        let seg = |first: u64, last: u64| Segment {
            first,
            last,
            place: Place::New,
            old: Vec::new(),
            pieces: Vec::new(),
        };
        let c = compress::CHUNK;
        let chunks = chunks_of(&[seg(4096, c + 8192), seg(3 * c, 3 * c + 4096)]);
        let spans: Vec<_> = chunks.iter().map(|c| (c.seg, c.from, c.to)).collect();
        let c = c as usize;
        assert_eq!(
            spans,
            vec![(0, 0, c - 4096), (0, c - 4096, c + 4096), (1, 0, 4096)]
        );
    }
}
