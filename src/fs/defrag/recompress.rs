//! Recompression (`canopy filesystem defragment -c`): a file's data
//! extents are rewritten compressed with the codec asked for, and every
//! holder (the file, snapshots and reflinked files alike) is pointed at
//! the new ones, so nothing shared is unshared.
//!
//! A compressed extent decodes to at most [`compress::CHUNK`] bytes, so
//! an extent becomes one new extent per chunk of it that some item
//! uses (at multiples of the chunk in the old extent): a chunk that
//! saves a sector is written compressed, one that does not is written
//! plain. An extent none of whose chunks saves anything, or one already
//! compressed whose new form is no smaller, is left as it is, so running
//! the command twice does nothing the second time. Each item that
//! referenced the old extent is cut into one item per chunk it covers;
//! that changes leaves of every tree that reaches it, so the work is
//! done with ordinary tree changes in each of those trees (their leaves
//! are copied; the data stays shared), and the commit's accounting
//! counts what each tree now references (quotas stay exact; they fall).
//!
//! The costly part, reading, verifying and compressing, happens before
//! the state lock is taken for writing: a request first reads a batch of
//! extents under a reader's lock and compresses them with no lock at
//! all. Then one transaction puts the ones that are still what was read
//! in place: the extent item's generation says an extent was not freed
//! and its place used again meanwhile, and its data never changes while
//! it lives (a `chattr +C` file's, which can, is never recompressed, as
//! btrfs never compresses such a file).
//!
//! An extent the fsync log also references, or one allocated in the
//! running transaction (no extent item yet), is done after a commit: the
//! step stops there and asks for one.
//!
//! A rewrite changes the `nbytes` of every inode it touches, so the item
//! ranges it rewrites are noted for the next fsync in the subvolume's
//! table of changes: a log that carried the new `nbytes` without those
//! items would not add up after replay. A holder tree whose subvolume is
//! not open yet is opened first, outside the write lock.

use super::{DefragReport, Subvol};
use crate::balance::relocate::{csum_key, load, Climb};
use crate::compress::{self, Codec};
use crate::error::{Error, Result};
use crate::extent::apply::find_extent_item;
use crate::format::items::{data_ref_of, FileExtentItem, COMPRESS_NONE, FILE_EXTENT_REG};
use crate::format::node::Body;
use crate::format::tree_id::{self, CSUM, EXTENT, FS};
use crate::format::{Key, SECTORSIZE};
use crate::fs::file;
use crate::txn::{DataCopies, Reader, RefHolder, Txn};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

const SECTOR: u64 = SECTORSIZE as u64;
/// Decoded bytes one request reads and compresses before it writes.
const BATCH_BYTES: u64 = 4 << 20;
/// Bytes of the file one batch looks at for extents.
const WINDOW: u64 = 16 << 20;

/// One extent read, verified and compressed, waiting to replace `old`.
struct Prepared {
    /// Where in the file it is first used.
    at: u64,
    old: u64,
    old_len: u64,
    /// Its extent item's generation when it was read.
    generation: u64,
    /// Its decoded length (what items' offsets count in).
    decoded: u64,
    /// One per [`compress::CHUNK`] of the decoded bytes.
    chunks: Vec<Chunk>,
}

/// One chunk of a [`Prepared`] extent as it will be on the device.
struct Chunk {
    /// Whole sectors: a compressed frame, or the plain bytes.
    bytes: Vec<u8>,
    /// Decoded length (whole sectors).
    ram: u64,
    compression: u8,
}

impl Chunk {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// An extent read from the device, not compressed yet.
struct Read {
    at: u64,
    old: u64,
    old_len: u64,
    generation: u64,
    old_compression: u8,
    /// Decoded bytes.
    data: Vec<u8>,
}

/// What [`Subvol::recompress_batch`] found, before any compression.
struct Batch {
    reads: Vec<Read>,
    /// Where the next batch starts; None at the end of the file.
    next: Option<u64>,
    /// The batch stopped at an extent that needs a commit first.
    wants_commit: bool,
}

/// What one turn of recompression did, and what comes next.
pub(super) struct Turn {
    pub report: DefragReport,
    /// Nothing more can be done before a commit (the log or the running
    /// transaction holds the next extent).
    pub wants_commit: bool,
}

impl Subvol {
    /// Recompresses the extents of `ino` from `from` on, a batch of them:
    /// read and compress without the lock, then one transaction.
    pub(super) fn recompress_turn(
        &self,
        ino: u64,
        from: u64,
        codec: Codec,
        made: &mut HashSet<u64>,
    ) -> Result<Turn> {
        let batch = self
            .core
            .engine
            .read(|r| self.recompress_batch(r, ino, from, codec, made))?;
        let mut report = DefragReport {
            next: batch.next,
            ..Default::default()
        };
        let reads = batch.reads.len() as u64;
        let ready = prepare_all(batch.reads, codec);
        report.incompressible += reads - ready.len() as u64;
        let mut wants_commit = batch.wants_commit;
        let mut left = &ready[..];
        while !left.is_empty() {
            let (done, taken, stop) = self
                .core
                .write_reserved(|tx| self.put_in_place(tx, left, made))?;
            report.add(&done);
            left = &left[taken..];
            match stop {
                None => break,
                Some(Stop::Commit(at)) => {
                    report.next = Some(at);
                    wants_commit = true;
                    break;
                }
                // Opened outside the lock (opening reads the tree), then
                // the same extent again.
                Some(Stop::Open(trees)) => {
                    for tree in trees {
                        self.core.subvol(tree)?;
                    }
                }
            }
        }
        Ok(Turn {
            report,
            wants_commit,
        })
    }

    /// Reads and verifies the extents of `ino` from `from` on that are
    /// not compressed with `codec` yet, up to [`BATCH_BYTES`] decoded.
    fn recompress_batch(
        &self,
        r: &Reader<'_>,
        ino: u64,
        from: u64,
        codec: Codec,
        made: &HashSet<u64>,
    ) -> Result<Batch> {
        let size = self.inode_r(r, ino)?.size;
        let root = r.root(self.tree)?;
        let extents = r.root(EXTENT)?;
        let window_end = from.saturating_add(WINDOW);
        let mut batch = Batch {
            reads: Vec::new(),
            next: None,
            wants_commit: false,
        };
        let mut seen = HashSet::new();
        let mut bytes = 0;
        for (at, fe) in file::items_in(r, &root, ino, from, window_end)? {
            if at < from || !wants_recompressing(&fe, codec) {
                continue;
            }
            let (old, old_len) = (fe.disk_bytenr, fe.disk_num_bytes);
            if made.contains(&old) || !seen.insert(old) {
                continue;
            }
            if bytes >= BATCH_BYTES {
                batch.next = Some(at);
                return Ok(batch);
            }
            let Some((_, item)) = find_extent_item(r, &extents, old)? else {
                // Written in the running transaction.
                batch.next = Some(at);
                batch.wants_commit = true;
                return Ok(batch);
            };
            let Some(data) = read_decoded(r, &fe)? else {
                continue;
            };
            bytes += data.len() as u64;
            batch.reads.push(Read {
                at,
                old,
                old_len,
                generation: item.generation,
                old_compression: fe.compression,
                data,
            });
        }
        if window_end < size {
            batch.next = file::items_from(r, &root, ino, window_end, 1)?
                .first()
                .map(|(k, _)| *k);
        }
        Ok(batch)
    }

    /// Puts each prepared extent in place of its old one, if it is still
    /// what was read. Returns what was done, how many of `ready` were
    /// taken, and why the work stopped before the end, if it did.
    fn put_in_place(
        &self,
        tx: &mut Txn<'_>,
        ready: &[Prepared],
        made: &mut HashSet<u64>,
    ) -> Result<(DefragReport, usize, Option<Stop>)> {
        let mut done = DefragReport::default();
        let mut hint = ready.first().map_or(0, |p| p.old);
        let mut stop = None;
        let mut taken = 0;
        for p in ready {
            let holders = match holders_of(tx, p)? {
                Holders::Gone => {
                    taken += 1;
                    continue;
                }
                Holders::AfterCommit => {
                    stop = Some(Stop::Commit(p.at));
                    break;
                }
                Holders::Items(items) => items,
            };
            // Every tree's changes are noted for its next fsync, in its
            // subvolume's table of inodes.
            let subvols = match self.open_subvols(holders.keys()) {
                Ok(s) => s,
                Err(trees) => {
                    stop = Some(Stop::Open(trees));
                    break;
                }
            };
            let used = used_chunks(p, &holders)?;
            let data: u64 = used.iter().map(|&c| p.chunks[c].len()).sum();
            let paths =
                2 + used.len() as u64 + holders.values().map(|i| 2 * i.len() as u64).sum::<u64>();
            let places = match reserve_and_allocate(tx, p, &used, paths, data, hint) {
                Ok(places) => places,
                // The rest waits for the next turn (after a commit).
                Err(Error::NoSpace) if done.recompressed > 0 => {
                    stop = Some(Stop::Commit(p.at));
                    break;
                }
                Err(e) => return Err(e),
            };
            hint = places.values().max().map_or(hint, |&b| b + SECTOR);
            for (&c, &at) in &places {
                let chunk = &p.chunks[c];
                tx.write_data(at, &chunk.bytes)?;
                tx.insert(CSUM, csum_key(at), file::sector_sums(&chunk.bytes))?;
                made.insert(at);
            }
            for (sv, items) in subvols.iter().zip(holders.values()) {
                repoint_items(tx, sv, p, items, &places, &mut done.changed)?;
            }
            taken += 1;
            done.recompressed += 1;
            done.written += places.len() as u64;
            done.bytes += p.decoded;
            done.stored_before += p.old_len;
            done.stored_after += data;
        }
        if !tx.flights_open() {
            crate::extent::apply::run(tx)?;
        }
        tx.note_change();
        Ok((done, taken, stop))
    }

    /// The subvolumes of `trees`, each open already; else the ones not
    /// open (opening one reads its tree, which cannot be done under the
    /// write lock).
    fn open_subvols<'a>(
        &self,
        trees: impl Iterator<Item = &'a u64>,
    ) -> std::result::Result<Vec<Arc<Subvol>>, Vec<u64>> {
        let open = crate::sync::read(&self.core.subvols);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for tree in trees {
            match open.get(tree) {
                Some(sv) => found.push(sv.clone()),
                None => missing.push(*tree),
            }
        }
        match missing.is_empty() {
            true => Ok(found),
            false => Err(missing),
        }
    }
}

/// Why [`Subvol::put_in_place`] stopped before the end.
enum Stop {
    /// The extent first used at this offset waits for a commit.
    Commit(u64),
    /// These trees' subvolumes must be opened first.
    Open(Vec<u64>),
}

/// Whether `fe` points at an extent recompression with `codec` would
/// rewrite: a regular one (not preallocated, not inline, not a hole)
/// not compressed with that codec already.
fn wants_recompressing(fe: &FileExtentItem, codec: Codec) -> bool {
    fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0 && fe.compression != codec.kind()
}

/// The decoded bytes of the extent `fe` points at, verified against its
/// checksums; None for an extent without any (its file keeps none).
fn read_decoded(r: &Reader<'_>, fe: &FileExtentItem) -> Result<Option<Vec<u8>>> {
    let (old, old_len) = (fe.disk_bytenr, fe.disk_num_bytes);
    let Some(sums) = r.get(CSUM, &csum_key(old))? else {
        return Ok(None);
    };
    let len = usize::try_from(old_len).map_err(|_| Error::corrupt(old, "huge data extent"))?;
    let mut buf = vec![0u8; len];
    r.read_good_data(old, &mut buf, &sums, None)?;
    if fe.compression == COMPRESS_NONE {
        return Ok(Some(buf));
    }
    compress::decode(fe.compression, &buf, fe.ram_bytes)
        .map(Some)
        .map_err(|why| Error::corrupt(old, why))
}

/// [`prepare`]s every extent read, on as many threads as there are
/// cores (btrfs compresses on its worker threads too); the ones that
/// save something, in their order.
fn prepare_all(reads: Vec<Read>, codec: Codec) -> Vec<Prepared> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 || reads.len() < 2 {
        return reads
            .into_iter()
            .filter_map(|r| prepare(r, codec))
            .collect();
    }
    // Round-robin, so each thread gets a share of large and small.
    let mut shares: Vec<Vec<(usize, Read)>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, r) in reads.into_iter().enumerate() {
        shares[i % threads].push((i, r));
    }
    let mut done: Vec<(usize, Prepared)> = std::thread::scope(|s| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| {
                s.spawn(move || {
                    share
                        .into_iter()
                        .filter_map(|(i, r)| Some((i, prepare(r, codec)?)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        // A worker that panicked (a codec's bug) leaves its share as it
        // was: those extents are simply not rewritten.
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    done.sort_unstable_by_key(|d| d.0);
    done.into_iter().map(|d| d.1).collect()
}

/// Cuts `read`'s decoded bytes into chunks and compresses each; None
/// when that saves nothing.
fn prepare(read: Read, codec: Codec) -> Option<Prepared> {
    let chunk = usize::try_from(compress::CHUNK).unwrap_or(usize::MAX);
    let mut chunks = Vec::new();
    let mut saved = false;
    for part in read.data.chunks(chunk) {
        let mut plain = part.to_vec();
        plain.resize(part.len().next_multiple_of(SECTOR as usize), 0);
        let ram = plain.len() as u64;
        chunks.push(match compress::encode(codec, &plain) {
            Some(frame) => {
                saved = true;
                Chunk {
                    bytes: frame,
                    ram,
                    compression: codec.kind(),
                }
            }
            None => Chunk {
                bytes: plain,
                ram,
                compression: COMPRESS_NONE,
            },
        });
    }
    let stored: u64 = chunks.iter().map(Chunk::len).sum();
    let smaller = read.old_compression == COMPRESS_NONE || stored < read.old_len;
    (saved && smaller).then_some(Prepared {
        at: read.at,
        old: read.old,
        old_len: read.old_len,
        generation: read.generation,
        decoded: read.data.len() as u64,
        chunks,
    })
}

/// Who holds an extent about to be replaced.
enum Holders {
    /// Freed (or freed and its place used again) since it was read.
    Gone,
    /// The fsync log holds it too: after the next commit.
    AfterCommit,
    /// The items that reference it, by tree (every tree that reaches
    /// the leaves holding them).
    Items(BTreeMap<u64, BTreeMap<Key, FileExtentItem>>),
}

/// The items of every tree that reference `p.old`, if it is still the
/// extent that was read.
fn holders_of(tx: &Txn<'_>, p: &Prepared) -> Result<Holders> {
    match find_extent_item(tx, &tx.root_of(EXTENT)?, p.old)? {
        Some((_, item)) if item.generation == p.generation => {}
        _ => return Ok(Holders::Gone),
    }
    let mut climb = Climb::default();
    let mut out: BTreeMap<u64, BTreeMap<Key, FileExtentItem>> = BTreeMap::new();
    for (holder, _) in climb.holders(tx, p.old)? {
        let RefHolder::DataLeaf(leaf) = holder else {
            continue;
        };
        let roots = climb.roots(tx, leaf)?;
        if roots.is_empty() {
            // Only the log reaches it.
            return Ok(Holders::AfterCommit);
        }
        if roots.iter().any(|&t| t != FS && !tree_id::is_subvolume(t)) {
            return Ok(Holders::Gone);
        }
        let node = load(tx, leaf)?;
        let Body::Leaf(items) = &node.body else {
            return Err(Error::corrupt(leaf, "a data extent's holder is not a leaf"));
        };
        let mut found = BTreeMap::new();
        for i in 0..items.len() {
            let key = items.key(i);
            if data_ref_of(&key, items.data(i)) == Some((p.old, p.old_len)) {
                let fe = FileExtentItem::decode(items.data(i)).map_err(|e| key.bad(e))?;
                found.insert(key, fe);
            }
        }
        for &tree in roots.iter() {
            out.entry(tree).or_default().extend(found.clone());
        }
    }
    if out.is_empty() {
        return Ok(Holders::Gone);
    }
    Ok(Holders::Items(out))
}

/// The chunks of `p` some item uses, checking every item fits the
/// extent as read.
fn used_chunks(
    p: &Prepared,
    holders: &BTreeMap<u64, BTreeMap<Key, FileExtentItem>>,
) -> Result<BTreeSet<usize>> {
    let mut used = BTreeSet::new();
    for (key, fe) in holders.values().flatten() {
        let end = fe.offset.checked_add(fe.num_bytes);
        if fe.num_bytes == 0 || end.is_none_or(|e| e > p.decoded) {
            return Err(key.bad("file extent item reaches past its extent"));
        }
        let first = fe.offset / compress::CHUNK;
        let last = (fe.offset + fe.num_bytes - 1) / compress::CHUNK;
        used.extend(first as usize..=last as usize);
    }
    Ok(used)
}

/// Reserves space for the change (the paths to the leaves it copies,
/// the checksum items, the data) and allocates each used chunk's place.
fn reserve_and_allocate(
    tx: &mut Txn<'_>,
    p: &Prepared,
    used: &BTreeSet<usize>,
    paths: u64,
    data: u64,
    hint: u64,
) -> Result<BTreeMap<usize, u64>> {
    crate::balance::reserve_moves(tx, paths, data)?;
    let mut places = BTreeMap::new();
    let mut hint = hint;
    for &c in used {
        let len = p.chunks[c].len();
        let at = tx.alloc_data(len, hint)?;
        hint = at + len;
        places.insert(c, at);
    }
    Ok(places)
}

/// Replaces each item of `items` (in `tree`) with one item per chunk of
/// `p` it covers, pointing at the chunk's new place, and keeps each
/// inode's `nbytes` right (it counts compressed data as stored); the
/// node ids of the files changed go to `changed`.
fn repoint_items(
    tx: &mut Txn<'_>,
    sv: &Subvol,
    p: &Prepared,
    items: &BTreeMap<Key, FileExtentItem>,
    places: &BTreeMap<usize, u64>,
    changed: &mut BTreeSet<u64>,
) -> Result<()> {
    let tree = sv.tree;
    // Per inode: the change of nbytes and the file ranges rewritten.
    let mut inodes: BTreeMap<u64, (i64, Vec<(u64, u64)>)> = BTreeMap::new();
    for (key, fe) in items {
        tx.delete(tree, key)?;
        let mut delta = -(file::accounted(fe) as i64);
        let (start, end) = (fe.offset, fe.offset + fe.num_bytes);
        let mut pos = start;
        while pos < end {
            let c = (pos / compress::CHUNK) as usize;
            let chunk_start = c as u64 * compress::CHUNK;
            let piece_end = end.min(chunk_start + compress::CHUNK);
            let chunk = &p.chunks[c];
            let &place = places
                .get(&c)
                .ok_or_else(|| Error::corrupt(p.old, "a used chunk has no place"))?;
            let piece = FileExtentItem {
                generation: fe.generation,
                ram_bytes: chunk.ram,
                compression: chunk.compression,
                kind: FILE_EXTENT_REG,
                disk_bytenr: place,
                disk_num_bytes: chunk.len(),
                offset: pos - chunk_start,
                num_bytes: piece_end - pos,
                inline_data: Vec::new(),
            };
            if piece.compression != COMPRESS_NONE {
                file::set_compressed_features(tx, &piece);
            }
            delta += file::accounted(&piece) as i64;
            let file_at = key.offset + (pos - start);
            tx.insert(
                tree,
                Key::new(key.objectid, key.ty, file_at),
                piece.encode(),
            )?;
            pos = piece_end;
        }
        let entry = inodes.entry(key.objectid).or_default();
        entry.0 += delta;
        entry.1.push((key.offset, key.offset + fe.num_bytes));
        changed.insert(crate::fs::node::node_id(tree, key.objectid));
    }
    for (ino, (delta, ranges)) in inodes {
        let mut inode = crate::fs::load_inode_tx(tx, tree, ino)?;
        // The next fsync logs these ranges with the inode's new nbytes:
        // a log with one and not the others would not add up on replay.
        for (start, end) in ranges {
            sv.note_extents(tx, ino, inode.size, start, end);
        }
        if delta != 0 {
            inode.nbytes = inode.nbytes.saturating_add_signed(delta);
            crate::fs::store_inode(tx, tree, ino, inode)?;
        }
    }
    Ok(())
}
