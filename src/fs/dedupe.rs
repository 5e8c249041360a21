//! Deduplication (`canopy dedupe`): files whose blocks hold the same bytes
//! are made to share one extent, as duperemove does on btrfs through
//! FIDEDUPERANGE (which never reaches a FUSE daemon).
//!
//! Candidates are found by hashing every whole block of [`BLOCK`] bytes
//! of the files given; runs of matching blocks at the same distance in
//! two files are joined, so a duplicated file becomes a few ranges. A
//! range is shared only after its bytes are compared, as the extents hold
//! them, with both files' flushes held off: an extent never changes once
//! written (copy-on-write), so if the file extent items over both ranges
//! are still the ones read when the transaction runs, the bytes compared
//! are the bytes replaced. A write that lands meanwhile sits in the
//! file's buffer and is flushed over the shared extent later: nothing
//! written is lost. Times do not change (the contents do not); nbytes,
//! quotas and `filesystem du` follow through the ordinary reference
//! counting of `file::clone_range`.

use super::{file, Fs, Subvol};
use crate::error::Result;
use crate::format::items::{FileExtentItem, FILE_EXTENT_INLINE};
use crate::format::tree_id::CSUM;
use crate::txn::Need;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The unit of comparison (duperemove's default block size).
pub const BLOCK: u64 = 128 << 10;
/// The longest range shared in one transaction.
const RUN_MAX: u64 = 16 << 20;

/// What a dedupe found and did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DedupeReport {
    pub files: u64,
    /// Bytes read and hashed.
    pub scanned: u64,
    /// Bytes of blocks whose hash matches another block's.
    pub duplicate: u64,
    /// Bytes now shared that were not (0 with --dry-run).
    pub deduped: u64,
    /// Bytes whose hash matched but whose contents did not, or that
    /// changed before they could be shared.
    pub skipped: u64,
}

/// Where a block lies: (node, offset).
type Place = (u64, u64);
/// File extent items by file offset.
type Items = Vec<(u64, FileExtentItem)>;

impl Fs {
    /// Deduplicates the regular files `nodes` against each other (each
    /// once, however often given); with `dry_run`, only reports what
    /// matches.
    pub fn dedupe(&self, nodes: &[u64], dry_run: bool) -> Result<DedupeReport> {
        let mut report = DedupeReport::default();
        let mut seen = std::collections::HashSet::new();
        let mut by_hash: HashMap<u64, Vec<Place>> = HashMap::new();
        for &node in nodes {
            if !seen.insert(node) {
                continue;
            }
            let (sv, ino) = self.at(node)?;
            // A `chattr +C` file keeps no checksums to share data under
            // and rewrites its data in place: left alone, as btrfs's
            // dedupe refuses files whose checksum flags differ.
            let i = sv.core.engine.read(|r| sv.inode_r(r, ino))?;
            if i.mode & libc::S_IFMT != libc::S_IFREG || !super::file::keeps_sums(i.flags) {
                continue;
            }
            report.files += 1;
            sv.hash_blocks(ino, |off, hash| {
                by_hash.entry(hash).or_default().push((node, off));
                report.scanned += BLOCK;
            })?;
        }
        let runs = runs_of(&by_hash);
        report.duplicate = runs.iter().map(|r| r.2).sum();
        if dry_run {
            return Ok(report);
        }
        for (src, dst, len) in runs {
            let (from, src_ino) = self.at(src.0)?;
            let (to, dst_ino) = self.at_writable(dst.0)?;
            match to.dedupe_range(&from, (src_ino, src.1), (dst_ino, dst.1), len)? {
                0 => report.skipped += len,
                n => report.deduped += n,
            }
        }
        Ok(report)
    }
}

/// The ranges to share, (source, target, length): matching blocks of a
/// hash group each follow the group's first, and blocks that follow one
/// another in both files join into one run (up to [`RUN_MAX`]).
fn runs_of(by_hash: &HashMap<u64, Vec<Place>>) -> Vec<(Place, Place, u64)> {
    let mut pairs: Vec<(Place, Place)> = by_hash
        .values()
        .filter(|places| places.len() > 1)
        .flat_map(|places| places[1..].iter().map(move |&dst| (places[0], dst)))
        .collect();
    // Ordered by target, so runs come out in order of the target file.
    pairs.sort_by_key(|&(src, dst)| (dst, src));
    let mut runs: Vec<(Place, Place, u64)> = Vec::new();
    for (src, dst) in pairs {
        if let Some(last) = runs.last_mut() {
            let follows = last.0 .0 == src.0
                && last.1 .0 == dst.0
                && last.0 .1 + last.2 == src.1
                && last.1 .1 + last.2 == dst.1
                && last.2 < RUN_MAX;
            if follows {
                last.2 += BLOCK;
                continue;
            }
        }
        runs.push((src, dst, BLOCK));
    }
    // A block shared with itself (the same place twice) is no saving.
    runs.retain(|(src, dst, _)| src != dst);
    runs
}

impl Subvol {
    /// Calls `found(offset, hash)` for every whole [`BLOCK`] of `ino`.
    fn hash_blocks(&self, ino: u64, mut found: impl FnMut(u64, u64)) -> Result<()> {
        let size = self.getattr(ino)?.size;
        let mut off = 0;
        while off + BLOCK <= size {
            let data = self.read(ino, off, BLOCK as u32)?;
            if data.len() as u64 == BLOCK {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                data.hash(&mut h);
                found(off, h.finish());
            }
            off += BLOCK;
        }
        Ok(())
    }

    /// Makes `len` bytes of `dst` at `dst_off` (of this subvolume) share
    /// the extents of `src` at `src_off` (of `from`) if their extents
    /// hold the same bytes: the bytes now shared (0: they differ, they
    /// changed meanwhile, or they are shared already).
    fn dedupe_range(
        &self,
        from: &Subvol,
        (src, src_off): (u64, u64),
        (dst, dst_off): (u64, u64),
        len: u64,
    ) -> Result<u64> {
        let tree = self.tree;
        let _held = super::data::lock_flushed(from, src, self, dst)?;
        let (src_seen, src_bytes) = from.extent_bytes(src, src_off, len)?;
        let (dst_seen, dst_bytes) = self.extent_bytes(dst, dst_off, len)?;
        let shareable = |items: &[(u64, FileExtentItem)]| {
            !items.is_empty() && items.iter().all(|(_, fe)| fe.kind != FILE_EXTENT_INLINE)
        };
        let already = same_extents(&src_seen, src_off, &dst_seen, dst_off);
        if src_bytes != dst_bytes || !shareable(&src_seen) || !shareable(&dst_seen) || already {
            return Ok(0);
        }
        self.core.write_reserved(|tx| {
            let src_root = tx.root_of(from.tree)?;
            let root = tx.root_of(tree)?;
            // Still the extents compared: no flush could move them, but a
            // crash-free guarantee is cheaper than an argument.
            if file::items_in(tx, &src_root, src, src_off, src_off + len)? != src_seen
                || file::items_in(tx, &root, dst, dst_off, dst_off + len)? != dst_seen
            {
                return Ok(0);
            }
            let items = (src_seen.len() + dst_seen.len()) as u64;
            tx.reserve(&Need::items(tree, items + 4).shared(len))?;
            let mut d = self.inode_tx(tx, dst)?;
            // Both files still reach past the range (a truncate since the
            // hashing would leave extents past the end).
            let src_size = from.inode_tx(tx, src)?.size;
            if d.size < dst_off + len || src_size < src_off + len {
                return Ok(0);
            }
            // An immutable or append-only file keeps its extents.
            if super::attrs::refuse_if_fixed(&d).is_err() {
                return Ok(0);
            }
            self.note_extents(tx, dst, d.size, dst_off, dst_off + len);
            let delta =
                file::clone_range(tx, (from.tree, src, src_off), (tree, dst, dst_off), len)?;
            d.nbytes = (d.nbytes as i64 + delta).max(0) as u64;
            self.save_inode(tx, dst, d)?;
            Ok(len)
        })
    }

    /// The file extent items over `[off, off + len)` of `ino` and the
    /// bytes they hold there (holes as zeros), leaving out what the
    /// file's buffer holds on top.
    fn extent_bytes(&self, ino: u64, off: u64, len: u64) -> Result<(Items, Vec<u8>)> {
        self.core.engine.read_unlocked(
            |r| {
                let root = r.root(self.tree)?;
                let items = file::items_in(r, &root, ino, off, off + len)?;
                let plan = file::plan_read(r, &root, Some(&r.root(CSUM)?), ino, off, len)?;
                Ok((items, plan))
            },
            |(items, plan), dev| Ok((items, plan.execute(dev)?)),
        )
    }
}

/// Whether both ranges are one extent's same bytes already.
fn same_extents(
    a: &[(u64, FileExtentItem)],
    a_off: u64,
    b: &[(u64, FileExtentItem)],
    b_off: u64,
) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, fa), (kb, fb))| {
            fa.disk_bytenr == fb.disk_bytenr
                && fa.disk_bytenr != 0
                && ka.wrapping_sub(a_off).wrapping_sub(fa.offset)
                    == kb.wrapping_sub(b_off).wrapping_sub(fb.offset)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_blocks_join_into_runs() {
        let mut by_hash: HashMap<u64, Vec<Place>> = HashMap::new();
        // File 1's four blocks repeat in file 2 from block 1 on, and its
        // block 0 once more inside file 1.
        for b in 0..4u64 {
            by_hash.entry(b).or_default().push((1, b * BLOCK));
            by_hash.entry(b).or_default().push((2, (b + 1) * BLOCK));
        }
        by_hash.entry(0).or_default().push((1, 9 * BLOCK));
        by_hash.insert(77, vec![(3, 0)]);
        let mut runs = runs_of(&by_hash);
        runs.sort();
        assert_eq!(
            runs,
            vec![
                ((1, 0), (1, 9 * BLOCK), BLOCK),
                ((1, 0), (2, BLOCK), 4 * BLOCK),
            ]
        );
    }
}
