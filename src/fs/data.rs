//! File data operations of a subvolume: read and write (through the
//! writeback pipeline, `writeback`), SEEK_DATA/SEEK_HOLE, fallocate and
//! its modes, and copy_file_range (shared extents or copies).

use super::ops::*;
use super::{errno, file, is_dir, Subvol};
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::format::items::FILE_EXTENT_INLINE;
use crate::format::tree_id::CSUM;
use crate::txn::{Need, Txn};

impl Subvol {
    /// Reads file data: what to read is found under the engine lock (with
    /// the buffered and in-flight bytes that lie over it), the device is
    /// read after letting go.
    pub fn read(&self, ino: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let mut data = Vec::new();
        // Sized to what the file holds there, not to the request (a
        // small file asked for 1 MiB).
        self.read_to(ino, offset, len, |n| {
            data.resize(n, 0);
            &mut data[..]
        })?;
        Ok(data)
    }

    /// [`Subvol::read`] into `out` (up to its length, which must not pass
    /// the largest read, `fuse::MAX_WRITE`): the number of bytes read. A
    /// transport hands its own reply buffer, so the data is not copied
    /// once more.
    pub fn read_into(&self, ino: u64, offset: u64, out: &mut [u8]) -> Result<usize> {
        let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
        self.read_to(ino, offset, len, |n| &mut out[..n])
    }

    /// Reads up to `len` bytes at `offset` into the buffer `room(n)`
    /// gives once the number of bytes `n` is known; returns `n`.
    fn read_to<'b>(
        &self,
        ino: u64,
        offset: u64,
        len: u32,
        room: impl FnOnce(usize) -> &'b mut [u8],
    ) -> Result<usize> {
        let (n, seen) = self.core.engine.read_unlocked(
            |r| {
                let i = self.inode_r(r, ino)?;
                if is_dir(i.mode) {
                    return Err(errno(libc::EISDIR, "is a directory"));
                }
                let end = offset.saturating_add(u64::from(len)).min(i.size);
                if offset >= end {
                    return Ok((None, Vec::new(), Vec::new(), i));
                }
                let root = r.root(self.tree)?;
                let sums = file::csum_root_for(i.flags, || r.root(CSUM))?;
                let plan = file::plan_read(r, &root, sums.as_ref(), ino, offset, end - offset)?;
                let over = self.overlay_of(ino, offset, end);
                // A read to the end of a file nobody follows yet starts no
                // stream (a small file read whole, as tar and cp do).
                let follow = end < i.size || self.inodes.get(ino).is_some();
                let ahead = if follow {
                    self.inodes
                        .with(ino, |s| s.stream.plan(offset, end - offset, i.size))
                } else {
                    None
                };
                let prefetch = match ahead {
                    Some((from, to)) => file::device_ranges(r, &root, ino, from, to)?,
                    None => Vec::new(),
                };
                if let Some(sums) = sums.as_ref() {
                    file::prefetch_sums(r, sums, &prefetch);
                }
                Ok((Some(plan), over, prefetch, i))
            },
            |(plan, over, prefetch, i), dev| {
                for (at, n) in prefetch {
                    dev.prefetch_data(at, n, ino);
                }
                let Some(plan) = plan else {
                    return Ok((0, i));
                };
                let n = plan.len();
                let out = room(n);
                plan.execute_into(dev, out)?;
                super::writeback::lay_over(out, offset, &over);
                Ok((n, i))
            },
        )?;
        self.accessed(ino, &seen);
        self.inodes.note_cached(ino);
        Ok(n)
    }

    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_enforcing(ino, offset, data, true)
    }

    /// A write the kernel sends back from its page cache (`-o
    /// writeback_cache`): it accepted those bytes at write(2), possibly
    /// before `chattr +i` or `+a`, so they are kept like a kernel
    /// filesystem keeps its dirty pages; its opens still obey the flags.
    pub fn write_back(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_enforcing(ino, offset, data, false)
    }

    /// [`Subvol::write`], refusing what file attributes forbid when
    /// `enforce`.
    fn write_enforcing(&self, ino: u64, offset: u64, data: &[u8], enforce: bool) -> Result<u32> {
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > crate::fs::MAX_FILE_SIZE)
        {
            return Err(errno(libc::EFBIG, "file too large"));
        }
        if self.core.budget.over_limit() {
            self.core.flush_to_limit()?;
        }
        self.core.engine.check_alive()?;
        self.inodes.note_cached(ino);
        let attr_flags = self.inodes.peek(ino, |s| s.attr_flags).unwrap_or(0);
        if enforce && attr_flags & crate::format::inode::INODE_IMMUTABLE != 0 {
            return Err(errno(libc::EPERM, "immutable"));
        }
        if enforce && attr_flags & crate::format::inode::INODE_APPEND != 0 {
            self.refuse_rewrite(ino, offset, data)?;
        }
        let written = self.write_buffered(ino, offset, data, enforce)?;
        if super::attrs::synchronous(attr_flags) {
            self.fsync(ino)?;
        }
        Ok(written)
    }

    /// EPERM if writing `data` at `offset` would change bytes `ino`
    /// holds already: an append-only file takes only appends. A write that
    /// repeats what is there passes (the kernel's writeback cache sends
    /// a partial last page again with the bytes appended to it).
    fn refuse_rewrite(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        let size = self.getattr(ino)?.size;
        if offset >= size {
            return Ok(());
        }
        let overlap = (size - offset).min(data.len() as u64) as usize;
        let held = self.read(ino, offset, overlap as u32)?;
        match held.as_slice() == &data[..overlap] {
            true => Ok(()),
            false => Err(errno(libc::EPERM, "append-only")),
        }
    }

    /// [`Subvol::write`] into the file's buffer.
    fn write_buffered(&self, ino: u64, offset: u64, data: &[u8], enforce: bool) -> Result<u32> {
        if self.buffer_on_credit(ino, offset, data) {
            return Ok(data.len() as u32);
        }
        // Copied before the state lock is taken (again on a retry).
        let mut owned = Some(data.to_vec());
        let done = self.core.write_reserved(|tx| {
            let i = self.inode_tx(tx, ino)?;
            if is_dir(i.mode) {
                return Err(errno(libc::EISDIR, "is a directory"));
            }
            if enforce {
                super::attrs::refuse_if_immutable(&i)?;
            }
            let credit = self.reserve_credit(tx, ino, offset, data.len() as u64)?;
            let bytes = owned.take().unwrap_or_else(|| data.to_vec());
            self.buffer_with_credit(ino, offset, bytes, credit);
            Ok(data.len() as u32)
        });
        match done {
            // Cached pages of a file deleted meanwhile: nobody can read
            // them back, so they are dropped as written.
            Err(Error::NotFound) if self.inodes.haunt(ino, |_| {}).is_some() => {
                Ok(data.len() as u32)
            }
            done => done,
        }
    }

    /// SEEK_DATA (`data` true) or SEEK_HOLE from `offset`: walks the file's
    /// extent items leaf by leaf, each leaf once, allocating nothing per
    /// extent. ENXIO past the end (and for SEEK_DATA when only holes follow).
    pub fn seek(&self, ino: u64, offset: u64, data: bool) -> Result<u64> {
        self.core.engine.read(|r| {
            let i = self.inode_r(r, ino)?;
            if offset >= i.size {
                return Err(errno(libc::ENXIO, "offset past the end of the file"));
            }
            let root = r.root(self.tree)?;
            let found = if data {
                self.seek_data(r, &root, ino, offset, i.size)?
            } else {
                Some(self.seek_hole(r, &root, ino, offset, i.size)?)
            };
            found.ok_or(errno(libc::ENXIO, "no data past the offset"))
        })
    }

    /// First data at or after `offset`: on disk or buffered.
    fn seek_data(
        &self,
        r: &crate::txn::Reader<'_>,
        root: &crate::tree::RootPtr,
        ino: u64,
        offset: u64,
        size: u64,
    ) -> Result<Option<u64>> {
        let on_disk = file::seek(r, root, ino, offset, size, true)?;
        // Buffered data counts whole sectors, as it will on disk.
        let buffered = self
            .buffered_at_or_after(ino, offset / SECTOR * SECTOR)
            .map(|(s, _)| (s / SECTOR * SECTOR).max(offset))
            .filter(|&p| p < size);
        Ok(match (on_disk, buffered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// First hole at or after `offset` (the end of the file counts as one):
    /// a place that is neither data on disk nor buffered.
    fn seek_hole(
        &self,
        r: &crate::txn::Reader<'_>,
        root: &crate::tree::RootPtr,
        ino: u64,
        offset: u64,
        size: u64,
    ) -> Result<u64> {
        let mut pos = offset;
        while pos < size {
            let hole = file::seek(r, root, ino, pos, size, false)?.unwrap_or(size);
            // Buffered data counts whole sectors, as it will on disk.
            let sectors = self
                .buffered_at_or_after(ino, hole)
                .map(|(s, e)| (s / SECTOR * SECTOR, e.next_multiple_of(SECTOR)));
            match sectors {
                Some((s, e)) if s <= hole && hole < size => pos = e,
                _ => return Ok(hole.min(size)),
            }
        }
        Ok(size)
    }

    /// fallocate(2): mode 0 and FALLOC_FL_KEEP_SIZE preallocate,
    /// PUNCH_HOLE (with KEEP_SIZE) deallocates, ZERO_RANGE zeroes.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        if mode
            & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE)
            != 0
        {
            return Err(errno(libc::EOPNOTSUPP, "fallocate mode not supported"));
        }
        if len == 0 || (punch && !keep) || (punch && zero) {
            return Err(errno(libc::EINVAL, "invalid fallocate arguments"));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= super::MAX_FILE_SIZE);
        let end = end.ok_or(errno(libc::EFBIG, "file too large"))?;
        let i = self.core.engine.read(|r| self.inode_r(r, ino))?;
        super::attrs::refuse_fallocate(&i, mode)?;
        let tree = self.tree;
        // It rewrites the file's extents: no flush of it may run meanwhile,
        // and its buffered data goes first.
        let held = self.inodes.lock_flush(ino);
        self.flush_held(ino, &held.inode)?;
        if punch {
            let i = self.core.engine.read(|r| self.inode_r(r, ino))?;
            if i.mode & libc::S_IFMT == libc::S_IFREG {
                self.punch_in_steps(ino, i.size, (offset, end))?;
            }
        }
        self.core.write_reserved(|tx| {
            let mut i = self.inode_tx(tx, ino)?;
            if i.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(errno(libc::ENODEV, "not a regular file"));
            }
            // Everything up front: fallocate either gets its whole range
            // or changes nothing.
            tx.reserve(&self.fallocate_need(tx, ino, (offset, end), punch, zero)?)?;
            self.note_extents(tx, ino, i.size, offset, end);
            let delta = if punch {
                self.zero_range(tx, ino, i.size, offset, end)?
            } else if zero {
                // As on ext4 and btrfs: zeros, then preallocated (unwritten)
                // space where whole sectors were, and past the end.
                // Inline data moves first, so the zeros land on top of it.
                self.out_of_line(tx, ino)?
                    + self.zero_range(tx, ino, i.size, offset, end)?
                    + file::preallocate(tx, tree, ino, offset, end)?
            } else {
                self.preallocate(tx, ino, offset, end)?
            };
            i.nbytes = (i.nbytes as i64 + delta).max(0) as u64;
            if !keep {
                i.size = i.size.max(end);
            }
            let now = Timespec::now();
            i.mtime = now;
            i.ctime = now;
            self.save_inode(tx, ino, i)
        })
    }

    /// What a fallocate of `[offset, end)` of `ino` may need: `punch`
    /// deallocates, `zero` zeroes, neither preallocates.
    fn fallocate_need(
        &self,
        tx: &Txn<'_>,
        ino: u64,
        (offset, end): (u64, u64),
        punch: bool,
        zero: bool,
    ) -> Result<Need> {
        let tree = self.tree;
        let root = tx.root_of(tree)?;
        let items = file::count_items(tx, &root, ino, offset, end)?;
        // Partial sectors at both edges of a punch or a zeroed range are
        // rewritten.
        let edges = 2 * SECTOR;
        if punch {
            return Ok(Need::items(tree, items + 4).buffer(edges).deleting());
        }
        // Inline data moves to the buffer, its sector to a hole.
        let inline = if file::is_inline(tx, &root, ino)? {
            SECTOR
        } else {
            0
        };
        // A zeroed range is preallocated whole once its data is dropped:
        // later writes there cannot run out of space.
        let holes = match zero {
            true => super::writeback::span(offset, end - offset),
            false => file::hole_bytes(tx, &root, ino, offset, end)?,
        } + inline;
        // The new extent items lie side by side in the file's key range:
        // they fill leaves rather than each copying a path.
        let pieces = tx.data_pieces_bound(holes, file::EXTENT_MAX);
        Ok(Need::items(tree, items + 4)
            .payload(pieces * crate::txn::EXTENT_ITEMS_BYTES)
            .data(holes)
            .buffer(inline + if zero { edges } else { 0 }))
    }

    /// Preallocates the holes of `[start, end)`, after [`Subvol::out_of_line`].
    fn preallocate(&self, tx: &mut Txn<'_>, ino: u64, start: u64, end: u64) -> Result<i64> {
        let delta = self.out_of_line(tx, ino)?;
        Ok(delta + file::preallocate(tx, self.tree, ino, start, end)?)
    }

    /// Moves inline data to the buffer, so that its flush writes it into
    /// an extent and extents can be added beside it. Returns the change
    /// of nbytes.
    fn out_of_line(&self, tx: &mut Txn<'_>, ino: u64) -> Result<i64> {
        let tree = self.tree;
        let root = tx.root_of(tree)?;
        let Some(bytes) = file::inline_bytes(tx, &root, ino)? else {
            return Ok(0);
        };
        let delta = -file::punch(tx, tree, ino, 0, bytes.len() as u64)?;
        self.buffer(tx, ino, 0, &bytes);
        Ok(delta)
    }

    /// Makes `[start, end)` read as zeros: whole sectors become holes, the
    /// partial sectors at the edges get buffered zeros (their flush
    /// rewrites them). Returns the change of nbytes.
    fn zero_range(
        &self,
        tx: &mut Txn<'_>,
        ino: u64,
        size: u64,
        start: u64,
        end: u64,
    ) -> Result<i64> {
        // As btrfs: up to the end of the last sector, so a range reaching
        // the end of the file frees its last block rather than zeroing it.
        let end = end.min(size.next_multiple_of(SECTOR));
        if start >= end {
            return Ok(0);
        }
        // Bytes buffered there were written before the zeros.
        self.cut_buffered(tx, ino, start, end);
        let zeros = |from: u64, to: u64| vec![0u8; (to - from) as usize];
        let (a, b) = (start.next_multiple_of(SECTOR), end / SECTOR * SECTOR);
        if a >= b {
            self.buffer(tx, ino, start, &zeros(start, end));
            return Ok(0);
        }
        if start < a {
            self.buffer(tx, ino, start, &zeros(start, a));
        }
        if b < end {
            self.buffer(tx, ino, b, &zeros(b, end));
        }
        Ok(-file::punch(tx, self.tree, ino, a, b)?)
    }

    /// copy_file_range(2) from file `src` of subvolume `from` (this one or
    /// another: the pool is one) to file `dst` of this one: shares extents
    /// where the ranges are sector-aligned (a reflink), copies bytes
    /// otherwise. Returns bytes copied.
    pub fn copy_range(
        &self,
        from: &Subvol,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        let tree = self.tree;
        // Sharing extents needs the data in the tree.
        from.flush_file(src)?;
        self.flush_file(dst)?;
        let src_size = from.getattr(src)?.size;
        let len = len.min(src_size.saturating_sub(src_off));
        if len == 0 {
            return Ok(0);
        }
        if dst_off
            .checked_add(len)
            .is_none_or(|e| e > super::MAX_FILE_SIZE)
        {
            return Err(errno(libc::EFBIG, "file too large"));
        }
        let d = self.core.engine.read(|r| self.inode_r(r, dst))?;
        super::attrs::refuse_if_fixed(&d)?;
        // Shared data would be read with checksums by one file and without
        // by the other (`chattr +C`): such files copy bytes, as btrfs
        // refuses to clone between them.
        let s_flags = from.core.engine.read(|r| from.inode_r(r, src))?.flags;
        let sums_differ = file::keeps_sums(s_flags) != file::keeps_sums(d.flags);
        const S: u64 = crate::format::SECTORSIZE as u64;
        let whole_tail = src_off + len == src_size;
        let aligned =
            src_off.is_multiple_of(S) && dst_off.is_multiple_of(S) && (len % S == 0 || whole_tail);
        let inline = self.core.engine.read(|r| {
            Ok(file::is_inline(r, &r.root(from.tree)?, src)?
                || file::is_inline(r, &r.root(tree)?, dst)?)
        })?;
        let dst_size = self.getattr(dst)?.size;
        let same = from.tree == tree && src == dst;
        let overlap = same && src_off < dst_off + len && dst_off < src_off + len;
        // The destination's bytes past a copied tail up to its old size must
        // survive, so a partial last sector is shared only at its EOF too.
        let tail_ok = len % S == 0 || dst_off + len >= dst_size;
        if !aligned || inline || overlap || !tail_ok || sums_differ {
            // A byte copy, in bounded pieces (a short count is allowed).
            let data = from.read(src, src_off, len.min(64 << 20) as u32)?;
            return self.write(dst, dst_off, &data).map(u64::from);
        }
        // Both files' extents change or are shared: no flush of either may
        // run meanwhile (locks taken in node order), and what was written
        // since the flushes above goes first.
        let _held = lock_flushed(from, src, self, dst)?;
        self.core.write_reserved(|tx| {
            let src_root = tx.root_of(from.tree)?;
            let root = tx.root_of(tree)?;
            let items = file::count_items(tx, &src_root, src, src_off, src_off + len)?
                + file::count_items(tx, &root, dst, dst_off, dst_off + len)?;
            // The shared extents count against the destination's quota.
            tx.reserve(&Need::items(tree, items + 4).shared(len))?;
            let mut d = self.inode_tx(tx, dst)?;
            if d.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(errno(libc::EINVAL, "not a regular file"));
            }
            let span = len.div_ceil(S) * S;
            self.note_extents(tx, dst, d.size, dst_off, dst_off + span);
            let delta =
                file::clone_range(tx, (from.tree, src, src_off), (tree, dst, dst_off), span)?;
            d.nbytes = (d.nbytes as i64 + delta).max(0) as u64;
            d.size = d.size.max(dst_off + len);
            let now = Timespec::now();
            d.mtime = now;
            d.ctime = now;
            self.save_inode(tx, dst, d)?;
            Ok(len)
        })
    }

    /// Whether the file's data is inline (for tests and inspection).
    pub fn is_inline(&self, ino: u64) -> Result<bool> {
        self.core.engine.read(|r| {
            let key = crate::format::Key::new(ino, crate::format::key_type::EXTENT_DATA, 0);
            Ok(r.get(self.tree, &key)?
                .and_then(|d| crate::format::items::FileExtentItem::decode(&d).ok())
                .is_some_and(|fe| fe.kind == FILE_EXTENT_INLINE))
        })
    }
}

/// Takes the flush locks of file `a` of `sa` and file `b` of `sb` (in
/// node order, so two callers cannot deadlock) and flushes both files.
pub(super) fn lock_flushed<'s>(
    sa: &'s Subvol,
    a: u64,
    sb: &'s Subvol,
    b: u64,
) -> Result<Vec<super::inodes::FlushLock<'s>>> {
    let mut files = vec![(sa.node(a)?, sa, a), (sb.node(b)?, sb, b)];
    files.sort_by_key(|f| f.0);
    files.dedup_by_key(|f| f.0);
    files
        .into_iter()
        .map(|(_, sv, ino)| {
            let held = sv.inodes.lock_flush(ino);
            sv.flush_held(ino, &held.inode).map(|()| held)
        })
        .collect()
}
