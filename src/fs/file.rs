//! File data: inline items for small files, copy-on-write extents with a
//! crc32c per sector otherwise.
//!
//! A write covering part of a sector rewrites the whole sector (read, patch,
//! write elsewhere), so every extent is sector-aligned and checksummed as a
//! unit. Overwritten ranges are cut out of the existing extent items
//! (trimming or splitting them; the data extent stays referenced while any
//! item uses part of it).

use crate::error::{Error, Result};
use crate::format::items::{
    FileExtentItem, COMPRESS_NONE, FILE_EXTENT_INLINE, FILE_EXTENT_PREALLOC, FILE_EXTENT_REG,
};
use crate::format::key_type::{EXTENT_CSUM, EXTENT_DATA};
use crate::format::tree_id::CSUM;
use crate::format::{Key, CSUM_OBJECTID, SECTORSIZE};
use crate::tree::{BlockRead, Cursor, RootPtr};
use crate::txn::Txn;

const SECTOR: u64 = SECTORSIZE as u64;
/// Files up to this size written from offset 0 live inline in the tree.
pub(crate) const INLINE_MAX: u64 = 2048;
/// Largest data extent one write allocates (its checksums fit one item).
pub(crate) const EXTENT_MAX: u64 = 512 * SECTOR;

fn data_key(ino: u64, offset: u64) -> Key {
    Key::new(ino, EXTENT_DATA, offset)
}

fn decode<B: BlockRead + ?Sized>(b: &B, key: &Key, data: &[u8]) -> Result<FileExtentItem> {
    FileExtentItem::decode(super::checked(b, key, data)?)
        .map_err(|reason| Error::BadItem { key: *key, reason })
}

/// Length of file data an extent item covers.
pub(crate) fn item_len(fe: &FileExtentItem) -> u64 {
    if fe.kind == FILE_EXTENT_INLINE {
        fe.inline_data.len() as u64
    } else {
        fe.num_bytes
    }
}

/// The extent items of `ino` that overlap `[start, end)`, in order.
pub(crate) fn items_in<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, FileExtentItem)>> {
    let mut out = Vec::new();
    let mut c = match Cursor::seek_le(b, root, &data_key(ino, start))? {
        Some(c) => c,
        None => Cursor::seek(b, root, &data_key(ino, start))?,
    };
    while let Some(it) = c.item() {
        if it.key.objectid > ino || (it.key.objectid == ino && it.key.ty > EXTENT_DATA) {
            break;
        }
        if it.key.objectid == ino && it.key.ty == EXTENT_DATA {
            if it.key.offset >= end {
                break;
            }
            let fe = decode(b, &it.key, &it.data)?;
            if it.key.offset + item_len(&fe) > start {
                out.push((it.key.offset, fe));
            }
        }
        c.next(b)?;
    }
    Ok(out)
}

/// Bytes of `[0, end)` that extent items cover (the rest is holes).
pub(crate) fn covered<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    end: u64,
) -> Result<u64> {
    Ok(items_in(b, root, ino, 0, end)?
        .iter()
        .map(|(k, fe)| (k + item_len(fe)).min(end).saturating_sub(*k))
        .sum())
}

/// Number of extent items of `ino` overlapping `[start, end)`.
pub(crate) fn count_items<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<u64> {
    Ok(items_in(b, root, ino, start, end)?.len() as u64)
}

/// The sector-aligned holes of `[start, end)` (rounded outward): where a
/// preallocation would allocate.
fn holes_in<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, u64)>> {
    let first = start / SECTOR * SECTOR;
    let last = end.div_ceil(SECTOR) * SECTOR;
    let mut holes = Vec::new();
    let mut pos = first;
    for (k, fe) in items_in(b, root, ino, first, last)? {
        if k > pos {
            holes.push((pos, k.min(last)));
        }
        pos = pos.max(k + item_len(&fe));
    }
    if pos < last {
        holes.push((pos, last));
    }
    // Item boundaries are sector-aligned except after a short inline
    // item; align inward.
    Ok(holes
        .into_iter()
        .map(|(s, e)| (s.div_ceil(SECTOR) * SECTOR, e / SECTOR * SECTOR))
        .filter(|(s, e)| s < e)
        .collect())
}

/// Bytes a preallocation of `[start, end)` would allocate.
pub(crate) fn hole_bytes<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<u64> {
    Ok(holes_in(b, root, ino, start, end)?
        .iter()
        .map(|(s, e)| e - s)
        .sum())
}

/// Where the data of the file just before `offset` ends on the device: the
/// allocation hint that keeps a file's extents end to end (0: none).
fn hint_before<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64, offset: u64) -> Result<u64> {
    let Some(c) = Cursor::seek_le(b, root, &data_key(ino, offset))? else {
        return Ok(0);
    };
    let Some(it) = c.item() else { return Ok(0) };
    if it.key.objectid != ino || it.key.ty != EXTENT_DATA {
        return Ok(0);
    }
    let fe = decode(b, &it.key, &it.data)?;
    Ok(if fe.kind == FILE_EXTENT_INLINE || fe.disk_bytenr == 0 {
        0
    } else {
        fe.disk_bytenr + fe.offset + fe.num_bytes
    })
}

/// Reads `[offset, offset+len)` of the file (already clamped to its size);
/// holes read as zeros. Sectors whose checksum does not match give EIO.
pub(crate) fn read<B: BlockRead + DataRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    csum_root: &RootPtr,
    ino: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len as usize];
    let end = offset + len;
    for (k, fe) in items_in(b, root, ino, offset, end)? {
        let from = k.max(offset);
        let to = (k + item_len(&fe)).min(end);
        if from >= to {
            continue;
        }
        let dst = &mut out[(from - offset) as usize..(to - offset) as usize];
        if fe.kind == FILE_EXTENT_INLINE {
            dst.copy_from_slice(&fe.inline_data[(from - k) as usize..(to - k) as usize]);
        } else if fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0 {
            read_extent(b, csum_root, &fe, from - k, dst)?;
        }
    }
    Ok(out)
}

/// Starts reading from the device the data of `[start, end)` of the file,
/// so the reads that follow find it in memory.
pub(crate) fn prefetch(
    r: &crate::txn::Reader<'_>,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<()> {
    for (k, fe) in items_in(r, root, ino, start, end)? {
        if fe.kind != FILE_EXTENT_REG || fe.disk_bytenr == 0 {
            continue;
        }
        let from = k.max(start);
        let to = (k + item_len(&fe)).min(end);
        if from < to {
            r.prefetch_data(fe.disk_bytenr + fe.offset + (from - k), to - from);
        }
    }
    Ok(())
}

/// Reads data bytes of an extent (the engine's device access).
pub(crate) trait DataRead {
    fn read_bytes(&self, bytenr: u64, buf: &mut [u8]) -> Result<()>;
}

impl DataRead for Txn<'_> {
    fn read_bytes(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.read_data(bytenr, buf)
    }
}

impl DataRead for crate::txn::Reader<'_> {
    fn read_bytes(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.read_data(bytenr, buf)
    }
}

/// Fills `dst` from the extent's data starting `skip` bytes into the part
/// the item uses, verifying the checksum of every sector read.
fn read_extent<B: BlockRead + DataRead + ?Sized>(
    b: &B,
    csum_root: &RootPtr,
    fe: &FileExtentItem,
    skip: u64,
    dst: &mut [u8],
) -> Result<()> {
    // The item checker keeps the used part inside the extent; checked
    // anyway, as every sum of disk values is.
    let end = fe
        .offset
        .checked_add(skip)
        .and_then(|pos| Some((pos, pos.checked_add(dst.len() as u64)?)))
        .filter(|&(_, end)| end <= fe.disk_num_bytes);
    let Some((pos, end)) = end else {
        return Err(Error::corrupt(
            fe.disk_bytenr,
            "file extent reads past its data extent",
        ));
    };
    let first = pos / SECTOR * SECTOR;
    let last = end.div_ceil(SECTOR) * SECTOR;
    let mut buf = vec![0u8; (last - first) as usize];
    b.read_bytes(fe.disk_bytenr + first, &mut buf)?;
    let sums = crate::tree::get(
        b,
        csum_root,
        &Key::new(CSUM_OBJECTID, EXTENT_CSUM, fe.disk_bytenr),
    )?
    .ok_or_else(|| Error::corrupt(fe.disk_bytenr, "data extent without checksums"))?;
    for (i, sector) in buf.chunks(SECTOR as usize).enumerate() {
        let n = (first / SECTOR) as usize + i;
        let want = sums
            .get(n * 4..n * 4 + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
        if want != Some(crate::format::crc(sector)) {
            let at = fe.disk_bytenr + first + (i as u64) * SECTOR;
            tracing::error!(bytenr = at, "data checksum mismatch");
            return Err(Error::corrupt(at, "data checksum mismatch"));
        }
    }
    let s = (pos - first) as usize;
    dst.copy_from_slice(&buf[s..s + dst.len()]);
    Ok(())
}

/// Cuts `[start, end)` out of the file's extent items. Returns the bytes of
/// data the removed ranges accounted for (for `nbytes`).
pub(crate) fn punch(tx: &mut Txn<'_>, tree: u64, ino: u64, start: u64, end: u64) -> Result<u64> {
    let root = tx.root_of(tree)?;
    let mut removed = 0;
    for (k, fe) in items_in(tx, &root, ino, start, end)? {
        let len = item_len(&fe);
        let (from, to) = (k.max(start), (k + len).min(end));
        removed += to - from;
        tx.delete(tree, &data_key(ino, k))?;
        if k < start {
            tx.insert(tree, data_key(ino, k), slice(&fe, 0, start - k).encode())?;
        }
        if k + len > end {
            tx.insert(
                tree,
                data_key(ino, end),
                slice(&fe, end - k, k + len - end).encode(),
            )?;
        }
    }
    Ok(removed)
}

/// The part `[from, from+len)` of an item's range as an item of its own.
pub(crate) fn slice(fe: &FileExtentItem, from: u64, len: u64) -> FileExtentItem {
    let mut out = fe.clone();
    if fe.kind == FILE_EXTENT_INLINE {
        out.inline_data = fe.inline_data[from as usize..(from + len) as usize].to_vec();
        out.ram_bytes = len;
    } else {
        out.offset += from;
        out.num_bytes = len;
    }
    out
}

/// Writes `data` at `offset` of a file of `size` bytes; returns the change
/// of `nbytes`.
pub(crate) fn write(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    size: u64,
    offset: u64,
    data: &[u8],
) -> Result<i64> {
    let end = offset + data.len() as u64;
    let new_size = size.max(end);
    let root = tx.root_of(tree)?;
    let csum_root = tx.root_of(CSUM)?;
    // Only a small file can be (or become) inline: look at its items then.
    let stays_inline = new_size <= INLINE_MAX && {
        let items = items_in(tx, &root, ino, 0, u64::MAX)?;
        items.iter().all(|(_, fe)| fe.kind == FILE_EXTENT_INLINE)
    };
    if stays_inline {
        let mut content = read(tx, &root, &csum_root, ino, 0, size)?;
        content.resize(new_size as usize, 0);
        content[offset as usize..end as usize].copy_from_slice(data);
        let removed = punch(tx, tree, ino, 0, u64::MAX)?;
        let fe = FileExtentItem {
            generation: tx.transid(),
            ram_bytes: new_size,
            compression: COMPRESS_NONE,
            kind: FILE_EXTENT_INLINE,
            disk_bytenr: 0,
            disk_num_bytes: 0,
            offset: 0,
            num_bytes: 0,
            inline_data: content,
        };
        tx.insert(tree, data_key(ino, 0), fe.encode())?;
        return Ok(new_size as i64 - removed as i64);
    }
    let mut delta = uninline(tx, tree, ino, size)?;
    delta += write_extents(tx, tree, ino, size, offset, data)?;
    Ok(delta)
}

/// Moves an inline file's bytes into an extent (before it grows past
/// inline size or gets preallocated space). Returns the change of nbytes.
fn uninline(tx: &mut Txn<'_>, tree: u64, ino: u64, size: u64) -> Result<i64> {
    let root = tx.root_of(tree)?;
    // An inline item is the file's only item, at offset 0.
    if !is_inline(tx, &root, ino)? {
        return Ok(0);
    }
    let items = items_in(tx, &root, ino, 0, u64::MAX)?;
    let Some((_, fe)) = items.iter().find(|(_, fe)| fe.kind == FILE_EXTENT_INLINE) else {
        return Ok(0);
    };
    let content = fe.inline_data.clone();
    let removed = punch(tx, tree, ino, 0, content.len() as u64)? as i64;
    Ok(write_extents(tx, tree, ino, size, 0, &content)? - removed)
}

fn new_extent_item(tx: &Txn<'_>, kind: u8, bytenr: u64, len: u64) -> FileExtentItem {
    FileExtentItem {
        generation: tx.transid(),
        ram_bytes: len,
        compression: COMPRESS_NONE,
        kind,
        disk_bytenr: bytenr,
        disk_num_bytes: len,
        offset: 0,
        num_bytes: len,
        inline_data: Vec::new(),
    }
}

/// Preallocates the holes of `[start, end)` (sector-aligned outward):
/// prealloc extents read as zeros until written. Returns bytes allocated.
pub(crate) fn preallocate(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    size: u64,
    start: u64,
    end: u64,
) -> Result<i64> {
    let mut delta = uninline(tx, tree, ino, size)?;
    let root = tx.root_of(tree)?;
    for (mut at, he) in holes_in(tx, &root, ino, start, end)? {
        let mut hint = hint_before(tx, &root, ino, at)?;
        while at < he {
            let (bytenr, len) = tx.alloc_data_range(SECTOR, (he - at).min(EXTENT_MAX), hint)?;
            hint = bytenr + len;
            let fe = new_extent_item(tx, FILE_EXTENT_PREALLOC, bytenr, len);
            tx.insert(tree, data_key(ino, at), fe.encode())?;
            delta += len as i64;
            at += len;
        }
    }
    Ok(delta)
}

/// Shares the extents of `[src_off, src_off+len)` of file `src` into
/// `[dst_off, ...)` of `dst` (a reflink): both then point at the same data
/// extents. Offsets and length must be sector-aligned and both files
/// non-inline. Returns the change of the destination's nbytes.
pub(crate) fn clone_range(
    tx: &mut Txn<'_>,
    tree: u64,
    src: u64,
    src_off: u64,
    dst: u64,
    dst_off: u64,
    len: u64,
) -> Result<i64> {
    let root = tx.root_of(tree)?;
    let items = items_in(tx, &root, src, src_off, src_off + len)?;
    let removed = punch(tx, tree, dst, dst_off, dst_off + len)? as i64;
    let mut added = 0i64;
    for (k, fe) in items {
        let from = k.max(src_off);
        let to = (k + item_len(&fe)).min(src_off + len);
        let part = slice(&fe, from - k, to - from);
        tx.insert(
            tree,
            data_key(dst, dst_off + (from - src_off)),
            part.encode(),
        )?;
        added += (to - from) as i64;
    }
    Ok(added - removed)
}

/// True when the file's data is inline.
pub(crate) fn is_inline<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64) -> Result<bool> {
    Ok(match crate::tree::get(b, root, &data_key(ino, 0))? {
        Some(d) => decode(b, &data_key(ino, 0), &d)?.kind == FILE_EXTENT_INLINE,
        None => false,
    })
}

/// Writes sector-aligned copy-on-write extents covering `[offset, end)`.
/// The extent content is the partial head sector (file bytes before
/// `offset`), `data`, and the partial tail sector; it is written piece by
/// piece straight from `data`, copying only the pieces that straddle a
/// partial sector.
fn write_extents(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    size: u64,
    offset: u64,
    data: &[u8],
) -> Result<i64> {
    let end = offset + data.len() as u64;
    let first = offset / SECTOR * SECTOR;
    let last = end.div_ceil(SECTOR) * SECTOR;
    let root = tx.root_of(tree)?;
    let csum_root = tx.root_of(CSUM)?;
    // Sectors partly written keep their other bytes (up to the file size).
    let mut head = vec![0u8; (offset - first) as usize];
    if first < offset {
        let have = offset.min(size).saturating_sub(first);
        let got = read(tx, &root, &csum_root, ino, first, have)?;
        head[..got.len()].copy_from_slice(&got);
    }
    let mut tail = vec![0u8; (last - end) as usize];
    if end < last && end < size {
        let got = read(tx, &root, &csum_root, ino, end, last.min(size) - end)?;
        tail[..got.len()].copy_from_slice(&got);
    }
    let removed = punch(tx, tree, ino, first, last)?;
    let content = [head.as_slice(), data, tail.as_slice()];
    let total = last - first;
    let mut hint = hint_before(tx, &tx.root_of(tree)?, ino, first)?;
    let mut at = 0;
    while at < total {
        // Any length down to a sector: fragmented free space still takes
        // the write.
        let (bytenr, len) = tx.alloc_data_range(SECTOR, (total - at).min(EXTENT_MAX), hint)?;
        let piece = gather(&content, at, len);
        hint = bytenr + len;
        tx.write_data(bytenr, &piece)?;
        let sums: Vec<u8> = piece
            .chunks(SECTOR as usize)
            .flat_map(|s| crate::format::crc(s).to_le_bytes())
            .collect();
        tx.put(CSUM, Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr), sums)?;
        let fe = new_extent_item(tx, FILE_EXTENT_REG, bytenr, len);
        tx.insert(tree, data_key(ino, first + at), fe.encode())?;
        at += len;
    }
    Ok(total as i64 - removed as i64)
}

/// Bytes `[at, at+len)` of the concatenation of `parts`: borrowed when they
/// lie in one part, copied together otherwise.
fn gather<'a>(parts: &[&'a [u8]], at: u64, len: u64) -> std::borrow::Cow<'a, [u8]> {
    let (at, len) = (at as usize, len as usize);
    let mut base = 0;
    for p in parts {
        if at >= base && at + len <= base + p.len() {
            return std::borrow::Cow::Borrowed(&p[at - base..at - base + len]);
        }
        base += p.len();
    }
    // Copy the overlap of [at, at+len) with each part, slice by slice.
    let mut all = Vec::with_capacity(len);
    let mut base = 0;
    for p in parts {
        let from = at.max(base);
        let to = (at + len).min(base + p.len());
        if from < to {
            all.extend_from_slice(&p[from - base..to - base]);
        }
        base += p.len();
    }
    std::borrow::Cow::Owned(all)
}

/// Changes the file size; data past a shrunk end is dropped, and the bytes of
/// the last partial sector past the new end are zeroed so that a later
/// extension reads zeros.
pub(crate) fn truncate(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    size: u64,
    new_size: u64,
) -> Result<i64> {
    if new_size >= size {
        return Ok(0);
    }
    let root = tx.root_of(tree)?;
    if is_inline(tx, &root, ino)? {
        let removed = punch(tx, tree, ino, new_size, u64::MAX)?;
        return Ok(-(removed as i64));
    }
    let aligned = new_size.div_ceil(SECTOR) * SECTOR;
    let mut delta = -(punch(tx, tree, ino, aligned, u64::MAX)? as i64);
    if aligned > new_size {
        let zeros = vec![0u8; (aligned - new_size) as usize];
        let root = tx.root_of(tree)?;
        let has_data = !items_in(tx, &root, ino, new_size, aligned)?.is_empty();
        if has_data {
            delta += write_extents(tx, tree, ino, new_size, new_size, &zeros)?;
        }
    }
    Ok(delta)
}

/// SEEK_DATA / SEEK_HOLE over the extent items, visiting each leaf once
/// (the cursor moves item by item within a leaf and steps to the next leaf
/// only at its end). Prealloc extents and absent ranges are holes. Returns
/// None when SEEK_DATA finds no data before `size`.
pub(crate) fn seek<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    offset: u64,
    size: u64,
    want_data: bool,
) -> Result<Option<u64>> {
    let mut c = match Cursor::seek_le(b, root, &data_key(ino, offset))? {
        Some(c) => c,
        None => Cursor::seek(b, root, &data_key(ino, offset))?,
    };
    let mut pos = offset;
    while let Some(it) = c.item() {
        if it.key.objectid > ino || (it.key.objectid == ino && it.key.ty > EXTENT_DATA) {
            break;
        }
        if it.key.objectid == ino && it.key.ty == EXTENT_DATA {
            let k = it.key.offset;
            if k >= size {
                break;
            }
            let fe = decode(b, &it.key, &it.data)?;
            let end = k + item_len(&fe);
            let is_data = fe.kind == FILE_EXTENT_INLINE
                || (fe.kind == FILE_EXTENT_REG && fe.disk_bytenr != 0);
            if end > pos {
                if want_data && is_data {
                    return Ok(Some(k.max(pos)));
                }
                if !want_data {
                    if k > pos {
                        return Ok(Some(pos));
                    }
                    if !is_data {
                        return Ok(Some(k.max(pos)));
                    }
                    pos = end;
                }
            }
        }
        c.next(b)?;
    }
    Ok(if want_data { None } else { Some(pos.min(size)) })
}
