//! Reference counts and space accounting against what the walk found.

use super::sorted::{Sorted, Sorter};
use super::walk::{holder_of, Found, QUEUE_HOLDER, RECORD_ITEM, UNDECODED};
use super::{Fix, Report};
use crate::alloc::{free_ranges_excluding_supers, GroupKind};
use crate::format::items::{BlockGroupItem, ExtentItem};
use crate::format::key_type::{BLOCK_GROUP_ITEM, EXTENT_ITEM};
use crate::format::superblock::Superblock;
use crate::format::{tree_id, RESERVED_START};
use crate::txn::RefHolder;
use std::collections::BTreeMap;

/// An extent as the extent tree records it.
struct Recorded {
    len: u64,
    item: Option<ExtentItem>,
    backrefs: BTreeMap<RefHolder, u32>,
}

/// The extent tree's records of the extent at `at` (see
/// [`ExtentRecord`]), if it has any.
fn take_recorded(
    records: &mut Sorted<6>,
    at: u64,
    report: &mut Report,
) -> std::io::Result<Option<Recorded>> {
    let mut rec: Option<Recorded> = None;
    while let Some(r) = records.peek()?.filter(|r| r[0] == at) {
        records.next()?;
        let rec = rec.get_or_insert_with(|| Recorded {
            len: 0,
            item: None,
            backrefs: BTreeMap::new(),
        });
        if r[1] == RECORD_ITEM {
            rec.len = r[2];
            if r[5] == UNDECODED {
                let loc = format!("extent tree item ({at}, {EXTENT_ITEM}, {})", r[2]);
                report.problem(loc, "extent item does not decode");
                continue;
            }
            rec.item = Some(ExtentItem {
                refs: r[3],
                generation: r[4],
                flags: r[5] >> 8,
                owner: 0,
                level: r[5] as u8,
            });
        } else {
            if rec.item.is_none() {
                report.problem(
                    format!("extent {at}"),
                    "back-reference without an extent item before it",
                );
            }
            let count = u32::try_from(r[4]).unwrap_or(u32::MAX);
            rec.backrefs.insert(holder_of(r[2], r[3]), count);
        }
    }
    Ok(rec)
}

/// What file extent items say of the data extent at `at`: its length and
/// the leaves that point at it, with how many items each.
fn take_data(
    data: &mut Sorted<3>,
    at: u64,
    report: &mut Report,
) -> std::io::Result<Option<(u64, BTreeMap<RefHolder, u32>)>> {
    let mut found: Option<(u64, BTreeMap<RefHolder, u32>)> = None;
    while let Some([_, len, leaf]) = data.peek()?.filter(|r| r[0] == at) {
        data.next()?;
        let (first_len, holders) = found.get_or_insert_with(|| (len, BTreeMap::new()));
        if *first_len != len {
            report.problem(
                format!("tree leaf {leaf}"),
                format!("data extent {at} referenced with length {len} and {first_len}"),
            );
        }
        *holders.entry(RefHolder::DataLeaf(leaf)).or_insert(0) += 1;
    }
    Ok(found)
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

/// The reference problems of a data extent from `first` on are mended
/// by setting its count and back-references to the holders found (data
/// extents only: no repair's own copy-on-write touches them before the
/// fix, as it would a tree block's).
fn mend_refs(
    report: &mut Report,
    first: usize,
    (bytenr, len): (u64, u64),
    holders: &BTreeMap<RefHolder, u32>,
) {
    let mut fix = Some(Fix::ExtentRefs {
        bytenr,
        len,
        holders: data_leaves(holders),
    });
    for p in &mut report.problems[first..] {
        p.fix = Some(fix.take().unwrap_or(Fix::Counted));
    }
}

/// The leaves among `holders`, with how many items each.
fn data_leaves(holders: &BTreeMap<RefHolder, u32>) -> Vec<(u64, u32)> {
    holders
        .iter()
        .filter_map(|(h, &c)| match h {
            RefHolder::DataLeaf(l) => Some((*l, c)),
            _ => None,
        })
        .collect()
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

fn check_block(
    report: &mut Report,
    ns: u64,
    (bytenr, b): (u64, &super::walk::FoundBlock),
    recorded: Option<&Recorded>,
    queued: bool,
) {
    let loc = format!("tree block {bytenr}");
    if queued {
        return check_queued(report, &loc, b, recorded.is_some());
    }
    let problems_before = report.problems.len();
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
    let Some(rec) = recorded else {
        return report.problem(loc, "no extent item (block is not accounted)");
    };
    if rec.item.is_some_and(|i| !i.is_tree_block()) || rec.len != ns {
        report.problem(&loc, "extent item is not a tree block of nodesize");
    }
    if let Some(i) = rec.item.filter(|i| i.level != b.level) {
        report.problem(
            &loc,
            format!("level {}, its extent item says {}", b.level, i.level),
        );
    }
    // As scrub reads it: a block older than its allocation is a write
    // that never reached the disk, whatever the parent (patched along
    // with it) says.
    if let Some(i) = rec.item.filter(|i| b.generation < i.generation) {
        report.problem(
            &loc,
            format!(
                "generation {}, older than its allocation in {} (a lost write)",
                b.generation, i.generation
            ),
        );
    }
    // Only counts and back-references wrong: they are set to what points
    // at the block (a block whose other records are wrong is refused).
    let only_refs = report.problems.len() == problems_before;
    let before = report.problems.len();
    compare_refs(report, &loc, rec, &actual);
    if only_refs && rec.item.is_some() {
        mend_block_refs(report, before, bytenr, &actual);
    }
}

/// The reference problems of a tree block from `first` on are mended by
/// setting its count and back-references to its holders.
fn mend_block_refs(
    report: &mut Report,
    first: usize,
    bytenr: u64,
    holders: &BTreeMap<RefHolder, u32>,
) {
    if holders.values().any(|&c| c > 1) {
        // A node that points at it twice: damage of another kind.
        return;
    }
    let (mut parents, mut roots) = (Vec::new(), Vec::new());
    for h in holders.keys() {
        match *h {
            RefHolder::TreeParent(p) => parents.push(p),
            RefHolder::TreeRoot(t) => roots.push(t),
            RefHolder::DataLeaf(_) => return,
        }
    }
    let mut fix = Some(Fix::BlockRefs {
        bytenr,
        parents,
        roots,
    });
    for p in &mut report.problems[first..] {
        p.fix = Some(fix.take().unwrap_or(Fix::Counted));
    }
}

/// Reference counts and space, in one pass over every address something
/// is at, in order: the extent tree's records, the tree blocks the walk
/// reached, the data extents file extent items point at, and the drop
/// queue. Each address's extent item is compared with its holders, and
/// every used extent goes to the space sweep.
fn check_extents(
    sb: &Superblock,
    (extents, data, found): (Sorter<6>, Sorter<3>, &Found),
    sweep: &mut Sweep<'_>,
    report: &mut Report,
) -> std::io::Result<()> {
    let ns = u64::from(sb.nodesize);
    let mut records = extents.sorted()?;
    let mut data = data.sorted()?;
    let mut blocks = found.blocks.iter().peekable();
    let mut queued = found.queued.iter().copied().peekable();
    loop {
        let heads = [
            records.peek()?.map(|r| r[0]),
            data.peek()?.map(|r| r[0]),
            blocks.peek().map(|(&b, _)| b),
            queued.peek().copied(),
        ];
        let Some(at) = heads.into_iter().flatten().min() else {
            break;
        };
        let rec = take_recorded(&mut records, at, report)?;
        let block = blocks.next_if(|(&b, _)| b == at);
        let is_queued = queued.next_if_eq(&at).is_some();
        let held = take_data(&mut data, at, report)?;
        if let Some((&bytenr, b)) = block {
            check_block(report, ns, (bytenr, b), rec.as_ref(), is_queued);
        }
        if let Some((len, holders)) = &held {
            report.data_extents += 1;
            let loc = format!("data extent {at}");
            match &rec {
                Some(rec) => {
                    let kind_ok = rec.item.is_some_and(|i| !i.is_tree_block()) && rec.len == *len;
                    if rec.item.is_some() && !kind_ok {
                        report.problem(&loc, "extent item disagrees on kind or length");
                    }
                    let before = report.problems.len();
                    compare_refs(report, &loc, rec, holders);
                    if kind_ok {
                        mend_refs(report, before, (at, *len), holders);
                    }
                }
                None => {
                    let fix = Fix::MissingData {
                        bytenr: at,
                        len: *len,
                        holders: data_leaves(holders),
                    };
                    report.fixable(loc, "no extent item", fix);
                }
            }
        }
        if is_queued {
            sweep.extent(at, ns, true, report);
        }
        if let Some(rec) = &rec {
            if block.is_none() && held.is_none() {
                report_leak(report, at, rec, is_queued);
            }
            if let Some(item) = rec.item {
                sweep.extent(at, rec.len, item.is_tree_block(), report);
            }
        }
    }
    Ok(())
}

/// An extent recorded that nothing reaches is mended by freeing it:
/// nothing can read it. What a leaked tree block points at holds a
/// reference from it the walk did not count; those extents' own fixes
/// set their counts to what the walk found.
fn report_leak(report: &mut Report, at: u64, rec: &Recorded, queued: bool) {
    let (loc, why) = (
        format!("extent {at}"),
        "recorded but nothing reaches it (leak)",
    );
    let (bytenr, len) = (at, rec.len);
    match rec.item {
        _ if queued => report.problem(loc, why),
        Some(item) if item.is_tree_block() => {
            report.fixable(loc, why, Fix::LeakedBlock { bytenr, len })
        }
        Some(_) => report.fixable(loc, why, Fix::LeakedData { bytenr, len }),
        None => report.problem(loc, why),
    }
}

struct Group {
    start: u64,
    len: u64,
    item: BlockGroupItem,
}

fn groups(found: &Found, total: u64, mapped: bool, report: &mut Report) -> Vec<Group> {
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
        if item.first.is_some() != mapped {
            report.problem(
                &loc,
                "names its first copy in the bound layout, or not in the mapped one",
            );
        }
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

/// Copies beyond the first (dup, raid1, raid1c3), and in the mapped
/// layout every copy: each lies inside its device (one the superblock
/// names) apart from every group and every other copy there, holds no
/// superblock copy, and the superblock names exactly the copies of the
/// groups that hold the root and block group trees (read through them
/// before the block groups are loaded): the system groups, and on a mixed
/// image of several devices the mixed groups, as many as fit (in the
/// mapped layout every system group, whatever its copies).
fn check_mirrors(groups: &[Group], sb: &Superblock, report: &mut Report) {
    let mut ranges: BTreeMap<u64, Vec<(u64, u64, String)>> = BTreeMap::new();
    if !sb.is_mapped() {
        ranges.entry(1).or_default().extend(
            groups
                .iter()
                .map(|g| (g.start, g.start + g.len, format!("block group {}", g.start))),
        );
    }
    let mut system = Vec::new();
    for g in groups {
        if g.item.extra.is_empty() && g.item.first.is_none() {
            continue;
        }
        let skip = usize::from(g.item.first.is_none());
        let copies = g.item.first.iter().chain(&g.item.extra);
        let len = crate::volume::stripe_len(g.len, 1 + g.item.extra.len(), g.item.striped);
        for (i, st) in copies.enumerate() {
            let (m, devid) = (st.offset, st.devid);
            let loc = format!("copy {} of block group {}", i + skip, g.start);
            let Some(size) = sb.device_bytes(devid) else {
                report.problem(
                    &loc,
                    format!("on device {devid}, which the superblock lacks"),
                );
                continue;
            };
            if m < RESERVED_START || m.checked_add(len).is_none_or(|e| e > size) {
                report.problem(&loc, format!("at {m}: outside device {devid}"));
                continue;
            }
            if crate::alloc::super_bytes_in(m, len) != 0 {
                report.problem(&loc, format!("at {m}: holds a superblock copy"));
            }
            ranges.entry(devid).or_default().push((m, m + len, loc));
        }
        let kind = GroupKind::from_flags(g.item.flags);
        let named = kind == Some(GroupKind::System)
            || kind == Some(GroupKind::Mixed) && sb.has_device_table();
        if named && system.len() < sb.system_chunks_max() {
            system.push(crate::format::superblock::SystemChunk {
                start: g.start,
                len: g.len,
                first: g.item.first,
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

/// The used extents in address order, as the space checks see them:
/// each within the filesystem, in a group of its kind, apart from the
/// others and from superblock copies; counted per group; and the free
/// ranges each group must list (the rest of it), found on the way.
struct Sweep<'g> {
    groups: &'g [Group],
    total: u64,
    /// The mapped layout: superblock copies lie outside the logical
    /// address space.
    mapped: bool,
    prev_end: u64,
    used_by_group: BTreeMap<u64, u64>,
    /// The group whose free ranges are being found, and how far.
    group: usize,
    at: u64,
    expected: Vec<(u64, u64)>,
}

impl<'g> Sweep<'g> {
    fn new(groups: &'g [Group], total: u64, mapped: bool) -> Sweep<'g> {
        Sweep {
            groups,
            total,
            mapped,
            prev_end: 0,
            used_by_group: BTreeMap::new(),
            group: 0,
            at: groups.first().map_or(0, |g| g.start),
            expected: Vec::new(),
        }
    }

    fn extent(&mut self, start: u64, len: u64, tree_block: bool, report: &mut Report) {
        let loc = format!("extent {start}+{len}");
        if start.checked_add(len).is_none_or(|e| e > self.total) || len == 0 {
            report.problem(&loc, "outside the filesystem or empty");
            return;
        }
        if start < self.prev_end {
            report.problem(&loc, "overlaps the previous extent");
        }
        self.prev_end = self.prev_end.max(start + len);
        match group_of(self.groups, start) {
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
                *self.used_by_group.entry(g.start).or_default() += len;
            }
        }
        if !self.mapped && free_ranges_excluding_supers(start, len) != vec![(start, len)] {
            report.problem(&loc, "overlaps a superblock copy");
        }
        self.occupy(start, len);
    }

    /// Groups that end before `start` are done; an extent starting in the
    /// current group leaves free what lies between it and the last.
    fn occupy(&mut self, start: u64, len: u64) {
        while let Some(g) = self.groups.get(self.group) {
            if start < g.start + g.len {
                break;
            }
            self.close_group();
        }
        let Some(g) = self.groups.get(self.group) else {
            return;
        };
        if start >= g.start {
            self.free_between(self.at, start);
            self.at = self.at.max(start + len);
        }
    }

    /// The rest of the current group is free; the sweep moves to the next.
    fn close_group(&mut self) {
        if let Some(g) = self.groups.get(self.group) {
            self.free_between(self.at, g.start + g.len);
        }
        self.group += 1;
        if let Some(g) = self.groups.get(self.group) {
            self.at = g.start;
        }
    }

    /// `[from, to)` without the superblock copies in it.
    fn free_between(&mut self, from: u64, to: u64) {
        let mut at = from;
        let supers = match self.mapped {
            true => &[][..],
            false => &crate::format::SUPER_OFFSETS[..],
        };
        for &o in supers {
            let end = o + crate::format::SUPER_SIZE;
            if end <= at || o >= to {
                continue;
            }
            if o > at {
                self.expected.push((at, o - at));
            }
            at = at.max(end);
        }
        if at < to {
            self.expected.push((at, to - at));
        }
    }

    /// Used bytes by group, and the free ranges the trees must list.
    fn finish(mut self) -> (BTreeMap<u64, u64>, Vec<(u64, u64)>) {
        while self.group < self.groups.len() {
            self.close_group();
        }
        (self.used_by_group, self.expected)
    }
}

/// Reference counts and space accounting against what the walk found
/// (`device_bytes`: the first device's size).
pub(super) fn check(device_bytes: u64, sb: &Superblock, mut found: Found, report: &mut Report) {
    // The records are read once, by value; the rest stays borrowed.
    let extents = std::mem::take(&mut found.extents);
    let data = std::mem::take(&mut found.data);
    let free = (
        std::mem::take(&mut found.free_by_start),
        std::mem::take(&mut found.free_by_len),
    );
    if sb.total_bytes > device_bytes && !sb.is_mapped() {
        report.problem("superblock", "filesystem larger than the device");
    }
    let groups = groups(&found, sb.total_bytes, sb.is_mapped(), report);
    check_mirrors(&groups, sb, report);
    let mut sweep = Sweep::new(&groups, sb.total_bytes, sb.is_mapped());
    if let Err(e) = check_extents(sb, (extents, data, &found), &mut sweep, report) {
        report.problem("check", format!("cannot read a temporary file: {e}"));
        return;
    }
    let (used_by_group, expected) = sweep.finish();
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
    if let Err(e) = check_free(free, &expected, report) {
        report.problem("check", format!("cannot read a temporary file: {e}"));
    }
    if report.problems.len() > before {
        report.space_plan = Some(crate::txn::SpaceOverride {
            used: used_by_group,
            free: expected,
        });
    }
}

/// The next range of `s` other than `last` (the trees' ranges as sets).
fn next_range(s: &mut Sorted<2>, last: Option<[u64; 2]>) -> std::io::Result<Option<[u64; 2]>> {
    while let Some(r) = s.next()? {
        if Some(r) != last {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// The free-space trees must list exactly `expected` (the complement of
/// the used extents and superblock copies in every group, merged), in
/// both indexes: the three lists are walked side by side in start order.
fn check_free(
    (by_start, by_len): (Sorter<2>, Sorter<2>),
    expected: &[(u64, u64)],
    report: &mut Report,
) -> std::io::Result<()> {
    let mut by_start = by_start.sorted()?;
    let mut by_len = by_len.sorted()?;
    let mut want = expected.iter().map(|&(s, l)| [s, l]).peekable();
    let mut s = next_range(&mut by_start, None)?;
    let mut l = next_range(&mut by_len, None)?;
    loop {
        let Some(m) = [want.peek().copied(), s, l].into_iter().flatten().min() else {
            return Ok(());
        };
        let (in_want, in_start, in_len) = (want.peek() == Some(&m), s == Some(m), l == Some(m));
        let loc = format!("free space {}+{}", m[0], m[1]);
        if in_want && !in_start {
            report.fixable(&loc, "free but not in the by-start tree", Fix::Space);
        }
        if in_start && !in_want {
            let why = "listed free by start but not free (in use, overlapping, or not merged)";
            report.fixable(&loc, why, Fix::Space);
        }
        if in_start != in_len {
            report.fixable(&loc, "by-start and by-length trees disagree", Fix::Space);
        }
        while want.next_if_eq(&m).is_some() {}
        if in_start {
            s = next_range(&mut by_start, s)?;
        }
        if in_len {
            l = next_range(&mut by_len, l)?;
        }
    }
}
