//! Reference counts and space accounting against what the walk found.

use super::walk::{Found, QUEUE_HOLDER};
use super::{Fix, Report};
use crate::alloc::{free_ranges_excluding_supers, GroupKind};
use crate::format::items::{decode_ref_count, BlockGroupItem, ExtentItem};
use crate::format::key_type::{
    BLOCK_GROUP_ITEM, EXTENT_ITEM, FREE_EXTENT, SHARED_BLOCK_REF, SHARED_DATA_REF, TREE_BLOCK_REF,
};
use crate::format::superblock::Superblock;
use crate::format::{tree_id, RESERVED_START};
use crate::txn::RefHolder;
use std::collections::{BTreeMap, BTreeSet};

/// An extent as the extent tree records it.
struct Recorded {
    len: u64,
    item: Option<ExtentItem>,
    backrefs: BTreeMap<RefHolder, u32>,
}

fn recorded_extents(found: &Found, report: &mut Report) -> BTreeMap<u64, Recorded> {
    let mut out: BTreeMap<u64, Recorded> = BTreeMap::new();
    for it in found.items.get(&tree_id::EXTENT).into_iter().flatten() {
        let k = it.key;
        let loc = format!("extent tree item {k}");
        let rec = out.entry(k.objectid).or_insert(Recorded {
            len: 0,
            item: None,
            backrefs: BTreeMap::new(),
        });
        let holder = match k.ty {
            EXTENT_ITEM => {
                match ExtentItem::decode(&it.data) {
                    Ok(e) => {
                        rec.item = Some(e);
                        rec.len = k.offset;
                    }
                    Err(e) => report.problem(loc, e),
                }
                continue;
            }
            SHARED_BLOCK_REF => RefHolder::TreeParent(k.offset),
            TREE_BLOCK_REF => RefHolder::TreeRoot(k.offset),
            SHARED_DATA_REF => RefHolder::DataLeaf(k.offset),
            t => {
                report.problem(loc, format!("unexpected key type {t} in the extent tree"));
                continue;
            }
        };
        let count = if k.ty == SHARED_DATA_REF {
            match decode_ref_count(&it.data) {
                Ok(c) => c,
                Err(e) => {
                    report.problem(loc, e);
                    continue;
                }
            }
        } else {
            1
        };
        if rec.item.is_none() {
            report.problem(loc, "back-reference without an extent item before it");
        }
        rec.backrefs.insert(holder, count);
    }
    out
}

fn compare_refs(report: &mut Report, loc: &str, rec: &Recorded, actual: &BTreeMap<RefHolder, u32>) {
    let Some(item) = rec.item else {
        report.problem(loc, "no extent item");
        return;
    };
    let total: u64 = actual.values().map(|&c| u64::from(c)).sum();
    if item.refs != total {
        report.problem(
            loc,
            format!("extent item counts {} references, found {total}", item.refs),
        );
    }
    let recorded_sum: u64 = rec.backrefs.values().map(|&c| u64::from(c)).sum();
    if recorded_sum != item.refs {
        report.problem(
            loc,
            format!(
                "back-references sum to {recorded_sum}, extent item says {}",
                item.refs
            ),
        );
    }
    for (h, c) in actual {
        if rec.backrefs.get(h) != Some(c) {
            report.problem(
                loc,
                format!("holder {h:?} ({c}) missing from back-references"),
            );
        }
    }
    for h in rec.backrefs.keys().filter(|h| !actual.contains_key(h)) {
        report.problem(
            loc,
            format!("back-reference to {h:?} which does not point here"),
        );
    }
}

/// A queued block is held by the queue alone and has no extent item.
fn check_queued(report: &mut Report, loc: &str, b: &super::walk::FoundBlock, recorded: bool) {
    if b.holders.iter().any(|h| *h != QUEUE_HOLDER) {
        report.problem(loc, "queued for release but still referenced");
    }
    if recorded {
        report.problem(loc, "queued for release but has an extent item");
    }
}

pub(super) fn check_extents(sb: &Superblock, found: &Found, report: &mut Report) {
    let recorded = recorded_extents(found, report);
    let ns = u64::from(sb.nodesize);
    for (&bytenr, b) in &found.blocks {
        let loc = format!("tree block {bytenr}");
        if found.queued.contains(&bytenr) {
            check_queued(report, &loc, b, recorded.contains_key(&bytenr));
            continue;
        }
        let mut actual = BTreeMap::new();
        for h in &b.holders {
            *actual.entry(*h).or_insert(0u32) += 1;
        }
        if b.holders.len() > 1 && !tree_id::is_shareable(b.owner) {
            report.problem(
                &loc,
                format!("block of tree {} has {} holders", b.owner, b.holders.len()),
            );
        }
        match recorded.get(&bytenr) {
            Some(rec) => {
                if rec.item.is_some_and(|i| !i.is_tree_block()) || rec.len != ns {
                    report.problem(&loc, "extent item is not a tree block of nodesize");
                }
                if let Some(i) = rec.item.filter(|i| i.level != b.level) {
                    report.problem(
                        &loc,
                        format!("level {}, its extent item says {}", b.level, i.level),
                    );
                }
                // As scrub reads it: a block older than its allocation is
                // a write that never reached the disk, whatever the parent
                // (patched along with it) says.
                if let Some(i) = rec.item.filter(|i| b.generation < i.generation) {
                    report.problem(
                        &loc,
                        format!(
                            "generation {}, older than its allocation in {} (a lost write)",
                            b.generation, i.generation
                        ),
                    );
                }
                compare_refs(report, &loc, rec, &actual);
            }
            None => report.problem(loc, "no extent item (block is not accounted)"),
        }
    }
    for (&bytenr, d) in &found.data {
        let loc = format!("data extent {bytenr}");
        match recorded.get(&bytenr) {
            Some(rec) => {
                if rec.item.is_some_and(|i| i.is_tree_block()) || rec.len != d.len {
                    report.problem(&loc, "extent item disagrees on kind or length");
                }
                compare_refs(report, &loc, rec, &d.holders);
            }
            None => report.problem(loc, "no extent item"),
        }
    }
    for &bytenr in recorded.keys() {
        if !found.blocks.contains_key(&bytenr) && !found.data.contains_key(&bytenr) {
            report.problem(
                format!("extent {bytenr}"),
                "recorded but nothing reaches it (leak)",
            );
        }
    }
}

struct Group {
    start: u64,
    len: u64,
    item: BlockGroupItem,
}

fn groups(found: &Found, total: u64, report: &mut Report) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for it in found.items.get(&tree_id::BLOCK_GROUP).into_iter().flatten() {
        let loc = format!("block group item {}", it.key);
        if it.key.ty != BLOCK_GROUP_ITEM {
            report.problem(loc, "unexpected key type in the block group tree");
            continue;
        }
        let item = match BlockGroupItem::decode(&it.data) {
            Ok(i) => i,
            Err(e) => {
                report.problem(loc, e);
                continue;
            }
        };
        let (start, len) = (it.key.objectid, it.key.offset);
        if start < RESERVED_START || start.checked_add(len).is_none_or(|e| e > total) {
            report.problem(&loc, "outside the filesystem");
            continue;
        }
        if out.last().is_some_and(|p| p.start + p.len > start) {
            report.problem(&loc, "overlaps the previous block group");
        }
        out.push(Group { start, len, item });
    }
    out
}

/// Copies beyond the first (dup, raid1, raid1c3): each lies inside its
/// device (one the superblock names) apart from every group and every
/// other copy there, holds no superblock copy, and the superblock names
/// exactly the copies of the groups that hold the root and block group
/// trees (read through them before the block groups are loaded): the
/// system groups, and on a mixed image of several devices the mixed
/// groups, as many as fit.
fn check_mirrors(groups: &[Group], sb: &Superblock, report: &mut Report) {
    let mut ranges: BTreeMap<u64, Vec<(u64, u64, String)>> = BTreeMap::new();
    ranges.entry(1).or_default().extend(
        groups
            .iter()
            .map(|g| (g.start, g.start + g.len, format!("block group {}", g.start))),
    );
    let mut system = Vec::new();
    for g in groups {
        if g.item.extra.is_empty() {
            continue;
        }
        for (i, st) in g.item.extra.iter().enumerate() {
            let (m, devid) = (st.offset, st.devid);
            let loc = format!("copy {} of block group {}", i + 1, g.start);
            let Some(size) = sb.device_bytes(devid) else {
                report.problem(
                    &loc,
                    format!("on device {devid}, which the superblock lacks"),
                );
                continue;
            };
            if m < RESERVED_START || m.checked_add(g.len).is_none_or(|e| e > size) {
                report.problem(&loc, format!("at {m}: outside device {devid}"));
                continue;
            }
            if crate::alloc::super_bytes_in(m, g.len) != 0 {
                report.problem(&loc, format!("at {m}: holds a superblock copy"));
            }
            ranges.entry(devid).or_default().push((m, m + g.len, loc));
        }
        let kind = GroupKind::from_flags(g.item.flags);
        let named = kind == Some(GroupKind::System)
            || kind == Some(GroupKind::Mixed) && sb.has_device_table();
        if named && system.len() < sb.system_chunks_max() {
            system.push(crate::format::superblock::SystemChunk {
                start: g.start,
                len: g.len,
                extra: g.item.extra.clone(),
            });
        }
    }
    for (devid, mut on) in ranges {
        on.sort_unstable_by_key(|r| (r.0, r.1));
        for pair in on.windows(2) {
            if pair[1].0 < pair[0].1 {
                report.problem(
                    &pair[1].2,
                    format!("overlaps {} on device {devid}", pair[0].2),
                );
            }
        }
    }
    if system != sb.system_chunks {
        report.problem(
            "superblock",
            format!(
                "names the system groups' copies {:?}, the block group tree {:?}",
                sb.system_chunks, system
            ),
        );
    }
    let any = groups.iter().any(|g| !g.item.extra.is_empty());
    if any && sb.incompat & crate::format::superblock::INCOMPAT_DUP == 0 {
        report.problem(
            "superblock",
            "block groups with second copies but no dup feature bit",
        );
    }
}

fn group_of(groups: &[Group], at: u64) -> Option<&Group> {
    let i = groups.partition_point(|g| g.start <= at);
    groups[..i].last().filter(|g| at < g.start + g.len)
}

/// Used extents from the extent tree and the drop queue, in address
/// order: (start, len, kind wanted).
fn used_extents(found: &Found, nodesize: u64) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> =
        found.queued.iter().map(|&b| (b, nodesize, true)).collect();
    for it in found.items.get(&tree_id::EXTENT).into_iter().flatten() {
        if it.key.ty == EXTENT_ITEM {
            if let Ok(e) = ExtentItem::decode(&it.data) {
                out.push((it.key.objectid, it.key.offset, e.is_tree_block()));
            }
        }
    }
    out.sort_unstable();
    out
}

pub(super) fn check_space(device_bytes: u64, sb: &Superblock, found: &Found, report: &mut Report) {
    if sb.total_bytes > device_bytes {
        report.problem("superblock", "filesystem larger than the device");
    }
    let groups = groups(found, sb.total_bytes, report);
    check_mirrors(&groups, sb, report);
    let mut used_by_group: BTreeMap<u64, u64> = BTreeMap::new();
    let mut occupied: Vec<(u64, u64)> = Vec::new();
    let mut prev_end = 0;
    for (start, len, tree_block) in used_extents(found, u64::from(sb.nodesize)) {
        let loc = format!("extent {start}+{len}");
        if start.checked_add(len).is_none_or(|e| e > sb.total_bytes) || len == 0 {
            report.problem(&loc, "outside the filesystem or empty");
            continue;
        }
        if start < prev_end {
            report.problem(&loc, "overlaps the previous extent");
        }
        prev_end = prev_end.max(start + len);
        match group_of(&groups, start) {
            None => report.problem(&loc, "not inside any block group"),
            Some(g) => {
                let kind = GroupKind::from_flags(g.item.flags);
                let ok_kind = if tree_block {
                    matches!(
                        kind,
                        Some(GroupKind::Metadata | GroupKind::System | GroupKind::Mixed)
                    )
                } else {
                    matches!(kind, Some(GroupKind::Data | GroupKind::Mixed))
                };
                if !ok_kind || start + len > g.start + g.len {
                    report.problem(
                        &loc,
                        "in a block group of the wrong kind or crossing its end",
                    );
                }
                *used_by_group.entry(g.start).or_default() += len;
            }
        }
        if free_ranges_excluding_supers(start, len) != vec![(start, len)] {
            report.problem(&loc, "overlaps a superblock copy");
        }
        occupied.push((start, len));
    }
    let before = report.problems.len();
    let used_total: u64 = groups.iter().map(|g| g.item.used).sum();
    if used_total != sb.bytes_used {
        report.fixable(
            "superblock",
            format!(
                "bytes used {} but block groups hold {used_total}",
                sb.bytes_used
            ),
            Fix::Space,
        );
    }
    for g in &groups {
        let actual = used_by_group.get(&g.start).copied().unwrap_or(0);
        if g.item.used != actual {
            report.fixable(
                format!("block group {}", g.start),
                format!(
                    "records {} bytes used, extents inside total {actual}",
                    g.item.used
                ),
                Fix::Space,
            );
        }
    }
    let free = check_free(found, &groups, &occupied, report);
    if report.problems.len() > before {
        report.space_plan = Some(crate::txn::SpaceOverride {
            used: used_by_group,
            free: free.into_iter().collect(),
        });
    }
}

/// The free-space trees must list exactly the complement of the used
/// extents and superblock copies in every group, merged, in both indexes.
/// Returns the free ranges the trees should list.
fn check_free(
    found: &Found,
    groups: &[Group],
    occupied: &[(u64, u64)],
    report: &mut Report,
) -> BTreeSet<(u64, u64)> {
    let mut expected: BTreeSet<(u64, u64)> = BTreeSet::new();
    for g in groups {
        let end = g.start + g.len;
        // Occupied ranges of this group in address order: superblock copies
        // and extents (both sorted), swept once to find the gaps.
        let first = occupied.partition_point(|&(s, _)| s < g.start);
        let last = occupied.partition_point(|&(s, _)| s < end);
        let mut taken: Vec<(u64, u64)> = occupied[first..last].to_vec();
        let supers = crate::format::SUPER_OFFSETS
            .iter()
            .map(|&o| (o, crate::format::SUPER_SIZE))
            .filter(|&(o, l)| o + l > g.start && o < end);
        taken.extend(supers);
        taken.sort_unstable();
        let mut at = g.start;
        for (s, l) in taken {
            if s > at {
                expected.insert((at, s - at));
            }
            at = at.max(s + l);
        }
        if at < end {
            expected.insert((at, end - at));
        }
    }
    let by_start: BTreeSet<(u64, u64)> = found
        .items
        .get(&tree_id::FREE_BY_START)
        .into_iter()
        .flatten()
        .filter(|it| it.key.ty == FREE_EXTENT)
        .map(|it| (it.key.objectid, it.key.offset))
        .collect();
    let by_len: BTreeSet<(u64, u64)> = found
        .items
        .get(&tree_id::FREE_BY_LEN)
        .into_iter()
        .flatten()
        .filter(|it| it.key.ty == FREE_EXTENT)
        .map(|it| (it.key.offset, it.key.objectid))
        .collect();
    let free_space = |e: &(u64, u64)| format!("free space {}+{}", e.0, e.1);
    for e in expected.difference(&by_start) {
        report.fixable(
            free_space(e),
            "free but not in the by-start tree",
            Fix::Space,
        );
    }
    for e in by_start.difference(&expected) {
        report.fixable(
            free_space(e),
            "listed free by start but not free (in use, overlapping, or not merged)",
            Fix::Space,
        );
    }
    for e in by_start.symmetric_difference(&by_len) {
        report.fixable(
            free_space(e),
            "by-start and by-length trees disagree",
            Fix::Space,
        );
    }
    expected
}
