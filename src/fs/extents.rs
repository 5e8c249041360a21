//! Where files lie on the device, for people: a file's extent map
//! (`canopy filesystem extents`, after `filefrag -v` and `xfs_bmap -v`;
//! FUSE passes no FIEMAP, so `filefrag` cannot look) and the whole
//! image's fragmentation (`canopy inspect frag`, after `xfs_db frag`,
//! with the locality histogram of seed mail 004: how far each extent
//! landed from where the allocator was asked to put it).

use super::file::{self, EXTENT_MAX};
use crate::error::Result;
use crate::format::items::{
    BlockGroupItem, FileExtentItem, RootItem, FILE_EXTENT_INLINE, FILE_EXTENT_PREALLOC,
};
use crate::format::key_type::{BLOCK_GROUP_ITEM, EXTENT_DATA, ROOT_ITEM};
use crate::format::{tree_id, Key};
use crate::txn::{Engine, Reader};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// One range of a file: data somewhere on the device, or a hole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedExtent {
    /// Offset in the file and bytes from there.
    pub logical: u64,
    pub length: u64,
    /// Where `logical` lies on the device (for a compressed extent, where
    /// the whole encoded extent starts); None for holes and inline data.
    pub physical: Option<u64>,
    /// Bytes the extent takes on the device (all of it, however little
    /// the file uses).
    pub disk_bytes: u64,
    /// `hole`, `inline`, `prealloc` (allocated, reads as zeros),
    /// `zstd`/`lz4` (compressed), `shared` (more than one reference: a
    /// reflink, or snapshots whose leaves went apart).
    pub flags: Vec<String>,
}

/// A file's extent map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMap {
    pub size: u64,
    pub extents: Vec<MappedExtent>,
}

impl super::Fs {
    /// The extent map of regular file `node`: its extent items in file
    /// order, with the holes between them up to its size. Everything is
    /// committed first (as FIEMAP's sync flag writes data back): a clone
    /// made a moment ago shows as shared only once its references are in
    /// the extent tree.
    pub fn extent_map(&self, node: u64) -> Result<FileMap> {
        let (sv, ino) = self.at(node)?;
        self.sync()?;
        self.core.engine.read(|r| {
            let i = sv.inode_r(r, ino)?;
            if i.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(crate::error::Error::Invalid(
                    "extents are listed for regular files only".into(),
                ));
            }
            let root = r.root(sv.tree)?;
            let items = file::items_in(r, &root, ino, 0, u64::MAX)?;
            let extent_root = r.root(tree_id::EXTENT)?;
            let shared = |bytenr: u64| more_than_one_ref(r, &extent_root, bytenr);
            Ok(FileMap {
                size: i.size,
                extents: map_items(i.size, &items, shared)?,
            })
        })
    }
}

/// Whether the extent at `bytenr` has more than one reference.
fn more_than_one_ref(
    r: &Reader<'_>,
    extent_root: &crate::tree::RootPtr,
    bytenr: u64,
) -> Result<bool> {
    let mut refs = 0;
    crate::extent::for_each_backref(r, extent_root, bytenr, |_, count| {
        refs += count;
        Ok(match refs > 1 {
            true => ControlFlow::Break(()),
            false => ControlFlow::Continue(()),
        })
    })?;
    Ok(refs > 1)
}

/// The map of a file of `size` bytes with extent `items` (file offset,
/// item) in order; `shared` tells whether a device extent has more than
/// one reference.
pub fn map_items(
    size: u64,
    items: &[(u64, FileExtentItem)],
    mut shared: impl FnMut(u64) -> Result<bool>,
) -> Result<Vec<MappedExtent>> {
    let mut out = Vec::new();
    let mut at = 0;
    for (offset, fe) in items {
        if *offset > at {
            out.push(hole(at, offset - at));
        }
        let mut e = mapped(*offset, fe);
        if fe.disk_bytenr != 0 && fe.kind != FILE_EXTENT_INLINE && shared(fe.disk_bytenr)? {
            e.flags.push("shared".into());
        }
        at = offset + e.length;
        out.push(e);
    }
    if size > at {
        out.push(hole(at, size - at));
    }
    Ok(out)
}

fn hole(logical: u64, length: u64) -> MappedExtent {
    MappedExtent {
        logical,
        length,
        physical: None,
        disk_bytes: 0,
        flags: vec!["hole".into()],
    }
}

fn mapped(offset: u64, fe: &FileExtentItem) -> MappedExtent {
    if fe.kind == FILE_EXTENT_INLINE {
        let mut flags = vec!["inline".to_string()];
        if fe.compression != crate::format::items::COMPRESS_NONE {
            flags.push(crate::compress::Codec::name_of(fe.compression).into());
        }
        return MappedExtent {
            logical: offset,
            length: fe.ram_bytes,
            physical: None,
            disk_bytes: 0,
            flags,
        };
    }
    let Some((physical, _)) = file::on_device(fe) else {
        return hole(offset, fe.num_bytes);
    };
    let mut flags = Vec::new();
    if fe.kind == FILE_EXTENT_PREALLOC {
        flags.push("prealloc".into());
    }
    if file::is_compressed(fe) {
        flags.push(crate::compress::Codec::name_of(fe.compression).to_string());
    }
    MappedExtent {
        logical: offset,
        length: fe.num_bytes,
        physical: Some(physical),
        disk_bytes: fe.disk_num_bytes,
        flags,
    }
}

/// `canopy inspect frag`: how fragmented the files of every subvolume
/// are, and how far their extents landed from the allocator's hint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FragReport {
    /// Regular files with data on the device.
    pub files: u64,
    /// Extents, counting physically contiguous neighbours as one.
    pub actual_extents: u64,
    /// Extents if every file were in as few as its size allows.
    pub ideal_extents: u64,
    /// (actual - ideal) / actual, in percent (as `xfs_db frag`).
    pub fragmentation_percent: f64,
    /// Files per extent count: `[from, to]` extents (powers of two).
    pub extents_per_file: Vec<Bucket>,
    /// Extents per distance from their hint: `[from, to]` bytes (powers
    /// of two), and last the extents in another block group than their
    /// hint (`to` 0).
    pub locality: Vec<Bucket>,
    /// The median distance from the hint, extents in another group
    /// counted as farthest; None with no hinted extent.
    pub median_distance: Option<u64>,
    /// Extents in another block group than their hint.
    pub switched_group: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub from: u64,
    pub to: u64,
    pub count: u64,
}

/// Walks every subvolume's file extents (in key order: each file's
/// extents in order, files by inode number) into a [`FragReport`].
///
/// The hint of an extent is where the allocator was pointed when it
/// placed it (see `fs::file::hint_before`): the device end of the file's
/// previous extent. A file's first extent has none (it is placed by
/// size); it is measured from the end of the data of the inode before it,
/// where XFS measures from the inode itself. Reflinked and snapshot-shared extents are counted
/// in every file that holds them, as the tools Canopy follows do.
pub fn frag(engine: &Engine) -> Result<FragReport> {
    engine.read(|r| {
        let groups = block_groups(r)?;
        let mut tally = FragTally::new(groups);
        for tree in subvolume_trees(r)? {
            tally.next_tree();
            for (key, data) in r.range(tree, &Key::MIN, &Key::MAX)? {
                if key.ty == EXTENT_DATA {
                    if let Ok(fe) = FileExtentItem::decode(&data) {
                        tally.extent(key.objectid, key.offset, &fe);
                    }
                }
            }
        }
        Ok(tally.report())
    })
}

fn block_groups(r: &Reader<'_>) -> Result<BTreeMap<u64, u64>> {
    let items = r.range(tree_id::BLOCK_GROUP, &Key::MIN, &Key::MAX)?;
    Ok(items
        .into_iter()
        .filter(|(k, d)| k.ty == BLOCK_GROUP_ITEM && BlockGroupItem::decode(d).is_ok())
        .map(|(k, _)| (k.objectid, k.offset))
        .collect())
}

fn subvolume_trees(r: &Reader<'_>) -> Result<Vec<u64>> {
    let items = r.range(tree_id::ROOT, &Key::MIN, &Key::MAX)?;
    Ok(items
        .into_iter()
        .filter(|(k, d)| {
            let subvolume = k.objectid == tree_id::FS || tree_id::is_subvolume(k.objectid);
            k.ty == ROOT_ITEM && subvolume && RootItem::decode(d).is_ok()
        })
        .map(|(k, _)| k.objectid)
        .collect())
}

/// The running counts of [`frag`].
struct FragTally {
    groups: BTreeMap<u64, u64>,
    /// Per file: extents (merged) and data bytes.
    files: BTreeMap<(u64, u64), (u64, u64)>,
    tree: u64,
    /// Device end of the last extent seen, whose it was, and where it
    /// ended in the file.
    last_end: Option<(u64, u64, u64)>,
    distances: Vec<u64>,
    switched: u64,
}

impl FragTally {
    fn new(groups: BTreeMap<u64, u64>) -> FragTally {
        FragTally {
            groups,
            files: BTreeMap::new(),
            tree: 0,
            last_end: None,
            distances: Vec::new(),
            switched: 0,
        }
    }

    fn next_tree(&mut self) {
        self.tree += 1;
        self.last_end = None;
    }

    fn group_of(&self, bytenr: u64) -> Option<u64> {
        let (&start, &len) = self.groups.range(..=bytenr).next_back()?;
        (bytenr < start + len).then_some(start)
    }

    fn extent(&mut self, ino: u64, offset: u64, fe: &FileExtentItem) {
        let Some((start, end)) = file::on_device(fe) else {
            return;
        };
        // One extent to XFS too: the same file, on in the file and on the
        // device.
        let continues = self
            .last_end
            .is_some_and(|(e, i, o)| i == ino && e == start && o == offset);
        match self.last_end {
            _ if continues => self.distances.push(0),
            Some((hint, _, _)) if self.group_of(hint) == self.group_of(start) => {
                self.distances.push(start.abs_diff(hint))
            }
            Some(_) => self.switched += 1,
            None => {}
        }
        let file = self.files.entry((self.tree, ino)).or_default();
        file.0 += u64::from(!continues);
        file.1 += fe.num_bytes;
        self.last_end = Some((end, ino, offset + fe.num_bytes));
    }

    fn report(self) -> FragReport {
        let actual: u64 = self.files.values().map(|f| f.0).sum();
        let ideal: u64 = self
            .files
            .values()
            .map(|f| f.1.div_ceil(EXTENT_MAX).max(1))
            .sum();
        let percent = match actual {
            0 => 0.0,
            a => (a.saturating_sub(ideal)) as f64 * 100.0 / a as f64,
        };
        let mut sorted = self.distances.clone();
        sorted.extend(std::iter::repeat_n(u64::MAX, self.switched as usize));
        sorted.sort_unstable();
        let mut locality = power_buckets(self.distances.iter().copied());
        locality.push(Bucket {
            from: self.groups.values().copied().min().unwrap_or(0),
            to: 0,
            count: self.switched,
        });
        FragReport {
            files: self.files.len() as u64,
            actual_extents: actual,
            ideal_extents: ideal,
            fragmentation_percent: percent,
            extents_per_file: power_buckets(self.files.values().map(|f| f.0)),
            locality,
            median_distance: sorted.get(sorted.len() / 2).copied(),
            switched_group: self.switched,
        }
    }
}

/// Counts of `values` in buckets `[0, 0]`, `[1, 1]`, `[2, 3]`, `[4, 7]`...
/// up to the largest value's.
fn power_buckets(values: impl Iterator<Item = u64>) -> Vec<Bucket> {
    let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
    for v in values {
        let b = if v == 0 { 0 } else { 64 - v.leading_zeros() };
        *counts.entry(b).or_default() += 1;
    }
    let Some(&top) = counts.keys().next_back() else {
        return Vec::new();
    };
    (0..=top)
        .map(|b| {
            let (from, to) = match b {
                0 => (0, 0),
                b => (1u64 << (b - 1), (1u64 << (b - 1)).saturating_mul(2) - 1),
            };
            Bucket {
                from,
                to,
                count: counts.get(&b).copied().unwrap_or(0),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double() {
        let b = power_buckets([0, 1, 2, 3, 4, 9].into_iter());
        let got: Vec<_> = b.iter().map(|b| (b.from, b.to, b.count)).collect();
        assert_eq!(
            got,
            vec![(0, 0, 1), (1, 1, 1), (2, 3, 2), (4, 7, 1), (8, 15, 1)]
        );
    }

    #[test]
    fn the_map_shows_holes_between_and_after_extents() {
        let items = vec![(8192, FileExtentItem::whole(1 << 20, 4096, 1))];
        let map = map_items(16384, &items, |_| Ok(false)).unwrap();
        let got: Vec<_> = map
            .iter()
            .map(|e| (e.logical, e.length, e.physical, e.flags.join(",")))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 8192, None, "hole".into()),
                (8192, 4096, Some(1 << 20), String::new()),
                (12288, 4096, None, "hole".into()),
            ]
        );
    }
}
