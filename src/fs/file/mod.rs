//! File data: inline items for small files, copy-on-write extents with a
//! crc32c per sector otherwise.
//!
//! A write covering part of a sector rewrites the whole sector (read, patch,
//! write elsewhere), so every extent is sector-aligned and checksummed as a
//! unit. Overwritten ranges are cut out of the existing extent items
//! (trimming or splitting them; the data extent stays referenced while any
//! item uses part of it). Reads are planned and executed in `read.rs`.

use crate::error::{Error, Result};
use crate::format::items::{
    FileExtentItem, COMPRESS_NONE, FILE_EXTENT_INLINE, FILE_EXTENT_PREALLOC, FILE_EXTENT_REG,
};
use crate::format::key_type::{EXTENT_CSUM, EXTENT_DATA};
use crate::format::tree_id::CSUM;
use crate::format::{Key, CSUM_OBJECTID, SECTORSIZE};
use crate::tree::{BlockRead, Cursor, RootPtr};
use crate::txn::Txn;

pub(crate) const SECTOR: u64 = SECTORSIZE as u64;

mod read;
pub(crate) use read::{device_ranges, plan_read, prefetch_sums, read, ReadPlan};

/// Whether a file with inode flags `flags` keeps checksums of its data
/// (all but `chattr +C` files do).
pub(crate) fn keeps_sums(flags: u64) -> bool {
    flags & crate::format::inode::INODE_NODATASUM == 0
}

/// The checksum tree (`csum_root()`) that reads of a file with inode
/// flags `flags` check against, None for a file that keeps none.
pub(crate) fn csum_root_for(
    flags: u64,
    csum_root: impl FnOnce() -> Result<RootPtr>,
) -> Result<Option<RootPtr>> {
    keeps_sums(flags).then(csum_root).transpose()
}

/// Files up to this size written from offset 0 live inline in the tree;
/// so do compressed files whose frame fits in as many bytes.
pub(crate) const INLINE_MAX: u64 = 2048;
/// The largest file that may have its data inline: a sector, compressed
/// (btrfs's rule too).
pub(crate) const INLINE_FILE_MAX: u64 = crate::format::items::COMPRESSED_INLINE_MAX;
/// Largest data extent one write allocates (its checksums fit one item).
pub(crate) const EXTENT_MAX: u64 = 512 * SECTOR;

fn data_key(ino: u64, offset: u64) -> Key {
    Key::new(ino, EXTENT_DATA, offset)
}

fn decode<B: BlockRead + ?Sized>(b: &B, key: &Key, data: &[u8]) -> Result<FileExtentItem> {
    FileExtentItem::decode(super::checked(b, key, data)?).map_err(|reason| key.bad(reason))
}

/// The first `max` extent items of `ino`, in order.
pub(crate) fn first_items<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    max: usize,
) -> Result<Vec<(u64, FileExtentItem)>> {
    items_from(b, root, ino, 0, max)
}

/// The first `max` extent items of `ino` that start at or after `at`,
/// in order.
pub(crate) fn items_from<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    at: u64,
    max: usize,
) -> Result<Vec<(u64, FileExtentItem)>> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, &data_key(ino, at))?;
    while let Some(it) = c.item() {
        if out.len() >= max || it.key.objectid != ino || it.key.ty != EXTENT_DATA {
            break;
        }
        out.push((it.key.offset, decode(b, &it.key, it.data)?));
        c.next(b)?;
    }
    Ok(out)
}

/// The last `max` extent items of `ino` that start before `before` and
/// end past `from`, in order.
pub(crate) fn last_items<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    (from, before): (u64, u64),
    max: usize,
) -> Result<Vec<(u64, FileExtentItem)>> {
    let mut out = Vec::new();
    let Some(last) = before.checked_sub(1) else {
        return Ok(out);
    };
    let Some(mut c) = Cursor::seek_le(b, root, &data_key(ino, last))? else {
        return Ok(out);
    };
    while let Some(it) = c.item() {
        if out.len() >= max || it.key.objectid != ino || it.key.ty != EXTENT_DATA {
            break;
        }
        let fe = decode(b, &it.key, it.data)?;
        if it.key.offset + item_len(&fe) <= from {
            break;
        }
        out.push((it.key.offset, fe));
        if c.prev(b)?.is_none() {
            break;
        }
    }
    out.reverse();
    Ok(out)
}

/// Cuts `items` (the file's first, from [`first_items`]) out of the file.
pub(crate) fn punch_first(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    items: &[(u64, FileExtentItem)],
) -> Result<()> {
    match items.last() {
        Some((k, fe)) => punch(tx, tree, ino, 0, k + item_len(fe)).map(drop),
        None => Ok(()),
    }
}

/// Length of file data an extent item covers.
pub(crate) fn item_len(fe: &FileExtentItem) -> u64 {
    match (fe.kind, fe.compression) {
        (FILE_EXTENT_INLINE, COMPRESS_NONE) => fe.inline_data.len() as u64,
        (FILE_EXTENT_INLINE, _) => fe.ram_bytes,
        _ => fe.num_bytes,
    }
}

/// The file bytes an inline item holds: its data, decoded when it is
/// compressed (at most a sector; a frame that does not decode is EIO
/// with one log line).
pub(crate) fn inline_plain(fe: &FileExtentItem) -> Result<std::borrow::Cow<'_, [u8]>> {
    if fe.compression == COMPRESS_NONE {
        return Ok(std::borrow::Cow::Borrowed(&fe.inline_data));
    }
    if fe.ram_bytes > INLINE_FILE_MAX {
        return Err(Error::corrupt(
            0,
            "compressed inline extent larger than a sector",
        ));
    }
    crate::compress::decode(fe.compression, &fe.inline_data, fe.ram_bytes)
        .map(std::borrow::Cow::Owned)
        .map_err(|why| {
            tracing::error!(%why, "compressed inline extent does not decode");
            Error::corrupt(0, why)
        })
}

/// Bytes of the device an item accounts for in the inode's `nbytes` (so in
/// st_blocks): what it covers, or for compressed data its share of the
/// bytes stored.
pub(crate) fn accounted(fe: &FileExtentItem) -> u64 {
    if fe.kind == FILE_EXTENT_INLINE {
        fe.inline_data.len() as u64
    } else if is_compressed(fe) && fe.ram_bytes > 0 {
        let share = u128::from(fe.num_bytes) * u128::from(fe.disk_num_bytes);
        share.div_ceil(u128::from(fe.ram_bytes)) as u64
    } else {
        item_len(fe)
    }
}

/// Whether the item points into a compressed data extent.
pub(crate) fn is_compressed(fe: &FileExtentItem) -> bool {
    fe.kind == FILE_EXTENT_REG && fe.compression != COMPRESS_NONE
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
            let fe = decode(b, &it.key, it.data)?;
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
/// allocation hint that keeps a file's extents end to end. 0 (none, as
/// for a file's first extent): the allocator places by size, the tightest
/// hole that fits (see `alloc`).
pub(crate) fn hint_before<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    offset: u64,
) -> Result<u64> {
    let Some(c) = Cursor::seek_le(b, root, &data_key(ino, offset))? else {
        return Ok(0);
    };
    let Some(it) = c.item() else { return Ok(0) };
    if it.key.objectid != ino || it.key.ty != EXTENT_DATA {
        return Ok(0);
    }
    let fe = decode(b, &it.key, it.data)?;
    Ok(on_device(&fe).map_or(0, |(_, end)| end))
}

/// The device bytes `[start, end)` a file extent item's data occupies: the
/// range the file uses, or for a compressed extent (which is decoded
/// whole) all of it. None for inline data and holes.
pub(crate) fn on_device(fe: &FileExtentItem) -> Option<(u64, u64)> {
    if fe.kind == FILE_EXTENT_INLINE || fe.disk_bytenr == 0 {
        return None;
    }
    Some(match is_compressed(fe) {
        true => (fe.disk_bytenr, fe.disk_bytenr + fe.disk_num_bytes),
        false => {
            let start = fe.disk_bytenr + fe.offset;
            (start, start + fe.num_bytes)
        }
    })
}

/// Cuts `[start, end)` out of the file's extent items. Returns the bytes of
/// data the removed ranges accounted for (for `nbytes`): negative when a
/// compressed inline item is cut down to a plain part larger than it.
pub(crate) fn punch(tx: &mut Txn<'_>, tree: u64, ino: u64, start: u64, end: u64) -> Result<i64> {
    let root = tx.root_of(tree)?;
    let mut removed = 0i64;
    for (k, fe) in items_in(tx, &root, ino, start, end)? {
        let len = item_len(&fe);
        removed += accounted(&fe) as i64;
        tx.delete(tree, &data_key(ino, k))?;
        if k < start {
            let left = slice(&fe, 0, start - k)?;
            removed -= accounted(&left) as i64;
            tx.insert(tree, data_key(ino, k), left.encode())?;
        }
        if k + len > end {
            let right = slice(&fe, end - k, k + len - end)?;
            removed -= accounted(&right) as i64;
            tx.insert(tree, data_key(ino, end), right.encode())?;
        }
    }
    Ok(removed)
}

/// The part `[from, from+len)` of an item's range as an item of its own.
/// Part of compressed inline data is kept plain (a truncate's; the next
/// flush compresses it again).
pub(crate) fn slice(fe: &FileExtentItem, from: u64, len: u64) -> Result<FileExtentItem> {
    let mut out = fe.clone();
    if from == 0 && len == item_len(fe) {
        return Ok(out);
    }
    if fe.kind == FILE_EXTENT_INLINE {
        out.inline_data = inline_plain(fe)?[from as usize..(from + len) as usize].to_vec();
        out.ram_bytes = len;
        out.compression = COMPRESS_NONE;
    } else {
        out.offset += from;
        out.num_bytes = len;
    }
    Ok(out)
}

/// Whether a file of `new_size` bytes can keep (or get) its data inline:
/// it is small and has no extents.
pub(crate) fn stays_inline<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    new_size: u64,
) -> Result<bool> {
    // Only a small file can be (or become) inline: look at its items then.
    Ok(new_size <= INLINE_MAX && only_inline(b, root, ino)?)
}

/// Whether a file of `size` bytes may get its data inline compressed: it
/// holds data, at most a sector, and has no extents.
pub(crate) fn may_inline_compressed<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    size: u64,
) -> Result<bool> {
    Ok(size > 0 && size <= INLINE_FILE_MAX && only_inline(b, root, ino)?)
}

/// Whether the file has no extent items but inline ones.
fn only_inline<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, ino: u64) -> Result<bool> {
    Ok(items_in(b, root, ino, 0, u64::MAX)?
        .iter()
        .all(|(_, fe)| fe.kind == FILE_EXTENT_INLINE))
}

/// Writes `data` at `offset` of a file of `size` bytes that
/// [`stays_inline`] (which the caller has checked): its inline item is
/// rewritten, with no device I/O. Returns the change of `nbytes`.
pub(crate) fn write_inline(
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
    if !stays_inline(tx, &root, ino, new_size)? {
        return Err(Error::Invalid(format!(
            "inline write of {new_size} bytes to a file that cannot stay inline"
        )));
    }
    let csum_root = tx.root_of(CSUM)?;
    let mut content = read(tx, &root, Some(&csum_root), ino, 0, size)?;
    content.resize(new_size as usize, 0);
    content[offset as usize..end as usize].copy_from_slice(data);
    put_inline(tx, tree, ino, (new_size, COMPRESS_NONE), content)
}

/// Replaces the file's data (of `ram` bytes, at most a sector) by one
/// inline item storing `stored`: the bytes themselves, or their frame
/// encoded as `compression` says. Returns the change of `nbytes`.
pub(crate) fn put_inline(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    (ram, compression): (u64, u8),
    stored: Vec<u8>,
) -> Result<i64> {
    let removed = punch(tx, tree, ino, 0, u64::MAX)?;
    let fe = FileExtentItem {
        generation: tx.transid(),
        ram_bytes: ram,
        compression,
        kind: FILE_EXTENT_INLINE,
        disk_bytenr: 0,
        disk_num_bytes: 0,
        offset: 0,
        num_bytes: 0,
        inline_data: stored,
    };
    if compression != COMPRESS_NONE {
        set_compressed_features(tx, &fe);
    }
    let added = accounted(&fe) as i64;
    tx.insert(tree, data_key(ino, 0), fe.encode())?;
    Ok(added - removed)
}

/// The inline bytes of a file whose data is inline, decoded.
pub(crate) fn inline_bytes<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
) -> Result<Option<Vec<u8>>> {
    let found = items_in(b, root, ino, 0, 1)?
        .into_iter()
        .find(|(k, fe)| *k == 0 && fe.kind == FILE_EXTENT_INLINE);
    match found {
        Some((_, fe)) => Ok(Some(inline_plain(&fe)?.into_owned())),
        None => Ok(None),
    }
}

/// A data extent a flush writes: where it lies, its bytes on disk, the
/// file bytes it holds, and how they are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub bytenr: u64,
    pub disk_len: u64,
    pub ram_len: u64,
    pub compression: u8,
}

impl Piece {
    /// `len` bytes stored as they are.
    pub(crate) fn plain(bytenr: u64, len: u64) -> Piece {
        Piece {
            bytenr,
            disk_len: len,
            ram_len: len,
            compression: COMPRESS_NONE,
        }
    }
}

/// Records a data extent written by a flush at `file_off` of the file:
/// its checksums and its file extent item. Returns the bytes it adds to
/// `nbytes`.
pub(crate) fn insert_extent(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    file_off: u64,
    piece: &Piece,
    sums: Vec<u8>,
) -> Result<u64> {
    // None for a file that keeps no checksums.
    if !sums.is_empty() {
        tx.put(
            CSUM,
            Key::new(CSUM_OBJECTID, EXTENT_CSUM, piece.bytenr),
            sums,
        )?;
    }
    let mut fe = new_extent_item(tx, FILE_EXTENT_REG, piece.bytenr, piece.disk_len);
    fe.ram_bytes = piece.ram_len;
    fe.num_bytes = piece.ram_len;
    fe.compression = piece.compression;
    if piece.compression != COMPRESS_NONE {
        set_compressed_features(tx, &fe);
    }
    tx.insert(tree, data_key(ino, file_off), fe.encode())?;
    Ok(accounted(&fe))
}

/// Marks the image as holding compressed data of `fe`'s kind, so older
/// code refuses it instead of failing on the items.
pub(crate) fn set_compressed_features(tx: &mut Txn<'_>, fe: &FileExtentItem) {
    use crate::format::superblock::{INCOMPAT_COMPRESSED_INLINE, INCOMPAT_COMPRESSION};
    tx.set_incompat(INCOMPAT_COMPRESSION);
    if fe.kind == FILE_EXTENT_INLINE {
        tx.set_incompat(INCOMPAT_COMPRESSED_INLINE);
    }
}

/// crc32c of every sector of `data`, as a checksum item holds them.
pub(crate) fn sector_sums(data: &[u8]) -> Vec<u8> {
    data.chunks(SECTOR as usize)
        .flat_map(|s| crate::format::crc(s).to_le_bytes())
        .collect()
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
    start: u64,
    end: u64,
) -> Result<i64> {
    let mut delta = 0;
    let root = tx.root_of(tree)?;
    if is_inline(tx, &root, ino)? {
        return Err(Error::Invalid(
            "preallocation in a file whose data is inline".into(),
        ));
    }
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

/// Shares the extents of `[src_off, src_off+len)` of file `src` (of
/// subvolume `src_tree`) into `[dst_off, ...)` of `dst` (a reflink): both then point at the same data
/// extents. Offsets and length must be sector-aligned and both files
/// non-inline. Returns the change of the destination's nbytes.
pub(crate) fn clone_range(
    tx: &mut Txn<'_>,
    (src_tree, src, src_off): (u64, u64, u64),
    (tree, dst, dst_off): (u64, u64, u64),
    len: u64,
) -> Result<i64> {
    let root = tx.root_of(src_tree)?;
    let parts = parts_over(tx, &root, src, src_off, src_off + len)?;
    let removed = punch(tx, tree, dst, dst_off, dst_off + len)?;
    let mut added = 0i64;
    for (from, part) in parts {
        added += accounted(&part) as i64;
        tx.insert(
            tree,
            data_key(dst, dst_off + (from - src_off)),
            part.encode(),
        )?;
    }
    Ok(added - removed)
}

/// The items of `ino` over `[start, end)` (`items_in`: each overlaps
/// it), each cut to the range: (file offset, the item's part there).
fn parts_over<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, FileExtentItem)>> {
    let mut out = Vec::new();
    for (k, fe) in items_in(b, root, ino, start, end)? {
        let from = k.max(start);
        let to = (k + item_len(&fe)).min(end);
        out.push((from, slice(&fe, from - k, to - from)?));
    }
    Ok(out)
}

/// Makes the preallocated items over `[start, end)` regular: a `chattr
/// +C` file's flush wrote its data into that space in place. Returns the
/// change of nbytes (none: both kinds count the same).
pub(crate) fn mark_written(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<i64> {
    let root = tx.root_of(tree)?;
    let parts = parts_over(tx, &root, ino, start, end)?;
    let removed = punch(tx, tree, ino, start, end)?;
    let mut added = 0i64;
    for (from, mut part) in parts {
        if part.kind == FILE_EXTENT_PREALLOC {
            part.kind = FILE_EXTENT_REG;
        }
        added += accounted(&part) as i64;
        tx.insert(tree, data_key(ino, from), part.encode())?;
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

/// Shrinks the file's extents to `new_size`: data past it is dropped.
/// Returns the change of nbytes, and whether the bytes of the last partial
/// sector past the new end must be zeroed (the caller buffers zeros there,
/// so that a later extension reads zeros; the flush rewrites the sector).
pub(crate) fn truncate(
    tx: &mut Txn<'_>,
    tree: u64,
    ino: u64,
    size: u64,
    new_size: u64,
) -> Result<(i64, bool)> {
    if new_size >= size {
        return Ok((0, false));
    }
    let root = tx.root_of(tree)?;
    if is_inline(tx, &root, ino)? {
        let removed = punch(tx, tree, ino, new_size, u64::MAX)?;
        return Ok((-removed, false));
    }
    let aligned = new_size.div_ceil(SECTOR) * SECTOR;
    let delta = -punch(tx, tree, ino, aligned, u64::MAX)?;
    let root = tx.root_of(tree)?;
    let partial = aligned > new_size && !items_in(tx, &root, ino, new_size, aligned)?.is_empty();
    Ok((delta, partial))
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
            let fe = decode(b, &it.key, it.data)?;
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
