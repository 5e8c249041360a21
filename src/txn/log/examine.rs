//! A log found at open, examined whole before anything trusts it: its
//! blocks as their parents name them, every item through the checker, the
//! space it names free in the last commit, the data under its checksums.
//! A root that fails is passed over for an older one, or for the
//! last commit; an inode whose items fail is left out while the rest
//! replays. `canopy check` reads the verdict (`Engine::log_found`).

use super::{name_log, DroppedRoot, LogVerdict, PendingLog, SkippedInode};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::key_type::{EXTENT_CSUM, EXTENT_DATA, EXTENT_ITEM, LOG_INODE};
use crate::format::loglink::{walk_chain, ChainStart, LogLink, LINK_BYTES};
use crate::format::node::Body;
use crate::format::superblock::{Superblock, INCOMPAT_LOG_CHECKED, LOG_WRITES_IN_FLIGHT_MAX};
use crate::format::{tree_id, Key, CSUM_OBJECTID};
use crate::tree::RootPtr;
use crate::txn::{Reader, Shared, State};
use std::collections::{BTreeMap, HashSet};

/// The log roots a superblock leads to, newest first: the last one
/// written, then those before it that replay falls back to.
struct FoundRoots {
    roots: Vec<RootPtr>,
    /// In the header flags of each of its blocks (None: a log written
    /// before the nonce existed).
    nonce: Option<u64>,
    /// Its chain links' blocks, kept out of the allocator with the log's
    /// until the replay commits: the durable superblock reaches the log
    /// through them.
    links: Vec<u64>,
}

/// How many roots of a chain replay tries, newest first: a log write may
/// be sent while the barriers of [`LOG_WRITES_IN_FLIGHT_MAX`] - 1 writes
/// before it are out, so the newest root whose barrier surely returned
/// before the last link was sent is that many back, and the roots
/// between may lack blocks of the writes still out.
const CHAIN_ROOTS_TRIED: usize = LOG_WRITES_IN_FLIGHT_MAX + 1;

/// The log the superblock names: through its chain (`format::loglink`),
/// or named in it directly (images of older code, and a log found at
/// open that commits carry on until replay). None when there is none:
/// no chain link was written since the last commit.
fn found_roots(st: &State, sh: &Shared) -> Option<FoundRoots> {
    let sb = &st.sb;
    if sb.log_chain != 0 {
        let links = chain_links(sh, sb);
        let root = |l: &LogLink| RootPtr {
            bytenr: l.root,
            generation: l.root_generation,
            level: l.root_level,
        };
        if links.is_empty() {
            return None;
        }
        return Some(FoundRoots {
            roots: links
                .iter()
                .rev()
                .take(CHAIN_ROOTS_TRIED)
                .map(root)
                .collect(),
            nonce: Some(sb.log_nonce),
            links: links.iter().map(|l| l.bytenr).collect(),
        });
    }
    if sb.log_root == 0 {
        return None;
    }
    // Logs written before the nonce and the previous root existed carry
    // neither (no feature bit).
    let checked = sb.incompat & INCOMPAT_LOG_CHECKED != 0;
    let last = RootPtr {
        bytenr: sb.log_root,
        generation: sb.log_root_generation,
        level: sb.log_root_level,
    };
    let prev = (checked && sb.log_prev_root != 0).then_some(RootPtr {
        bytenr: sb.log_prev_root,
        generation: sb.log_prev_generation,
        level: sb.log_prev_level,
    });
    Some(FoundRoots {
        roots: std::iter::once(last).chain(prev).collect(),
        nonce: checked.then_some(sb.log_nonce),
        links: Vec::new(),
    })
}

/// Where the chain `sb` names begins and what its links must carry.
fn chain_start(sb: &Superblock) -> ChainStart {
    ChainStart {
        first: sb.log_chain,
        nonce: sb.log_nonce,
        // The log of the transaction after this commit.
        generation: sb.generation.saturating_add(1),
        total_bytes: sb.total_bytes,
        // Tree blocks start at sector boundaries, not nodesize ones.
        align: u64::from(sb.sectorsize),
    }
}

/// The links of the chain the superblock names, each read from the first
/// copy that holds it whole. The block after the last link holds anything
/// at all (it was never written), so a block that is not a link is the
/// chain's end, not damage, and says nothing.
fn chain_links(sh: &Shared, sb: &Superblock) -> Vec<LogLink> {
    let start = chain_start(sb);
    let len = LINK_BYTES as u64;
    let mut buf = vec![0u8; LINK_BYTES];
    walk_chain(&start, |at| {
        (0..sh.dev.copies(at, len))
            .filter(|&copy| sh.dev.copy_present(at, len, copy))
            .find_map(|copy| {
                sh.dev.read_copy(&mut buf, at, copy).ok()?;
                LogLink::decode(&buf, at, &sh.fsid)
            })
    })
}

/// The links of the log chain `sb` names, in order, read from `dev` at
/// their logical addresses (an image of one device and one copy): for
/// tests and tools that look at a crashed image's log.
pub fn read_chain(dev: &dyn Device, sb: &Superblock) -> Vec<LogLink> {
    let start = chain_start(sb);
    let mut buf = vec![0u8; LINK_BYTES];
    walk_chain(&start, |at| {
        dev.read_at(&mut buf, at).ok()?;
        LogLink::decode(&buf, at, &sb.fsid)
    })
}

/// Reads the log a superblock names and keeps its blocks, and the new data
/// extents it names, out of the allocator (see [`PendingLog`]).
pub(crate) fn load_pending(st: &mut State, sh: &Shared) -> Result<()> {
    let Some(found) = found_roots(st, sh) else {
        return Ok(());
    };
    let (chosen, mut verdict) = choose_root(st, sh, &found)?;
    // What is chosen is whole: commits carry it on as it is.
    st.sb.clear_log();
    let Some(log) = chosen else {
        st.log_found = Some(verdict);
        return Ok(());
    };
    verdict.inodes = log.inodes;
    verdict.new_extents = log.extents.len() as u64;
    verdict.blocks = log.blocks.len() as u64;
    verdict.skipped = log
        .skipped
        .iter()
        .map(|(&node, reason)| SkippedInode {
            node,
            reason: reason.clone(),
        })
        .collect();
    for s in &verdict.skipped {
        tracing::error!(
            node = s.node,
            "the fsync log's items of this inode are refused, so replay leaves it \
             as the last commit has it: {}",
            s.reason
        );
    }
    st.log_found = Some(verdict);
    name_log(&mut st.sb, &log.ptr);
    // `examine` found all of it free in the last commit, without overlaps.
    let ns = sh.nodesize as u64;
    for &b in &log.blocks {
        st.alloc.exclude(b, ns)?;
    }
    for &(b, l) in &log.extents {
        st.alloc.exclude(b, l)?;
    }
    tracing::info!(
        blocks = log.blocks.len(),
        extents = log.extents.len(),
        "found a log tree to replay"
    );
    st.pending_log = Some(log);
    Ok(())
}

/// Opens at the last commit as if the superblock named no log; the next
/// commit (if the engine writes) drops it for good.
pub(crate) fn ignore_pending(st: &mut State, sh: &Shared) {
    let Some(found) = found_roots(st, sh) else {
        return;
    };
    tracing::warn!(
        root = found.roots.first().map_or(0, |r| r.bytenr),
        "not replaying the fsync log: what was fsynced after the last commit is not shown"
    );
    st.sb.clear_log();
    st.log_replayed = true;
}

/// The log root to replay, examined whole ([`examine`]): the newest one
/// written that is whole, back to one whose barrier returned before the
/// last write was sent ([`CHAIN_ROOTS_TRIED`]), else none: the
/// filesystem opens at its last commit. Each root passed over is named in
/// an ERROR line.
fn choose_root(
    st: &State,
    sh: &Shared,
    found: &FoundRoots,
) -> Result<(Option<PendingLog>, LogVerdict)> {
    let r = Reader::new(st, sh);
    let mut verdict = LogVerdict {
        last_root: found.roots.first().map_or(0, |p| p.bytenr),
        ..LogVerdict::default()
    };
    for (i, ptr) in found.roots.iter().enumerate() {
        let which = match i {
            0 => "last",
            1 => "previous",
            _ => "older",
        };
        match examine(&r, st, sh, ptr, found.nonce, &found.links)? {
            Ok(log) => {
                verdict.chosen = Some(which.into());
                return Ok((Some(log), verdict));
            }
            Err(why) => {
                tracing::error!(
                    root = ptr.bytenr,
                    generation = ptr.generation,
                    "dropping the {which} root of the fsync log: {}",
                    why.reason
                );
                verdict.dropped.push(DroppedRoot {
                    which: which.into(),
                    root: ptr.bytenr,
                    reason: why.reason,
                    torn: why.torn,
                });
            }
        }
    }
    tracing::error!(
        generation = st.sb.generation,
        "no root of the fsync log can be replayed: opening at the last commit; \
         what was fsynced after it is lost"
    );
    Ok((None, verdict))
}

/// Why a log root cannot be replayed.
struct Rejection {
    reason: String,
    /// Blocks or data not as written: a write that did not reach the
    /// disk whole. Otherwise what was written is wrong (damage or a bug).
    torn: bool,
}

impl Rejection {
    fn torn(reason: String) -> Rejection {
        Rejection { reason, torn: true }
    }

    fn invalid(reason: String) -> Rejection {
        Rejection {
            reason,
            torn: false,
        }
    }
}

/// Whether the log block at `bytenr`, refused by the walk, can be a log
/// write a crash cut short (see [`crate::format::node::Node::could_be_lost_write`]);
/// a block that cannot be read at all counts as one.
fn could_be_lost_write(sh: &Shared, bytenr: u64) -> bool {
    let mut buf = vec![0u8; sh.nodesize];
    if sh.dev.read_at(&mut buf, bytenr).is_err() {
        return true;
    }
    crate::format::node::Node::could_be_lost_write(&buf, bytenr, &sh.fsid)
}

/// Reads every block of the log at `ptr` and everything it names, and
/// says whether replaying it is safe:
/// - every block is the one its parent names (checksum, address,
///   generation, level) and belongs to this log (owner, `nonce`);
/// - every item passes the item checker;
/// - its blocks, and the data extents it names that the extent tree does
///   not hold, lie in block groups of the last commit, in space free there
///   and apart from each other (a log never names a group or space its
///   own transaction created or reused; see `sync_log`);
/// - the data under every checksum item it holds matches the item.
fn examine(
    r: &Reader<'_>,
    st: &State,
    sh: &Shared,
    ptr: &RootPtr,
    nonce: Option<u64>,
    links: &[u64],
) -> Result<std::result::Result<PendingLog, Rejection>> {
    let mut seen = Vec::new();
    let walked = walk_log(r, sh, ptr, nonce, &mut seen);
    let found = match walked {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => return Ok(Err(Rejection::invalid(why))),
        Err(Error::Corrupt { bytenr, reason }) => {
            // What was read of a write that never landed must not be
            // taken for the blocks later written there.
            seen.into_iter().for_each(|b| sh.cache.remove(b));
            let why = format!("block {bytenr}: {reason}");
            return Ok(Err(match could_be_lost_write(sh, bytenr) {
                true => Rejection::torn(why),
                false => Rejection::invalid(why),
            }));
        }
        Err(e) => return Err(e),
    };
    let ns = sh.nodesize as u64;
    let mut claimed = Claimed::default();
    seen.extend_from_slice(links);
    let blocks: Vec<(u64, u64)> = seen.iter().map(|&b| (b, ns)).collect();
    if let Err(why) = claimed.add(st, &blocks) {
        return Ok(Err(Rejection::invalid(why)));
    }
    let mut skipped = found.skipped;
    let mut extents = Vec::new();
    // The same extents, to look up: a log names thousands of them.
    let mut accepted = HashSet::new();
    let mut inodes = 0;
    for (node, notes) in found.inodes {
        // Space one inode names wrongly costs that inode only.
        let mut new = match new_extents(r, st, &notes.data_refs, &accepted, &mut claimed)? {
            Ok(new) => new,
            Err(why) => {
                skipped.insert(node, why);
                continue;
            }
        };
        accepted.extend(new.iter().copied());
        extents.append(&mut new);
        inodes += u64::from(notes.log_inode);
    }
    if let Err(why) = sums_cover_extents(&found.sums, &extents) {
        return Ok(Err(Rejection::invalid(why)));
    }
    if let Some(at) = first_bad_data(r, &found.sums)? {
        let why = format!("logged data at {at} does not match its checksum");
        return Ok(Err(Rejection::torn(why)));
    }
    Ok(Ok(PendingLog {
        ptr: *ptr,
        blocks: seen,
        extents,
        inodes,
        skipped,
    }))
}

/// The data extents of `refs` (one inode's) the last commit lacks and no
/// inode examined before named (`accepted`), claimed in `claimed`; or why
/// the inode's refs cannot be replayed.
fn new_extents(
    r: &Reader<'_>,
    st: &State,
    refs: &[(u64, u64)],
    accepted: &HashSet<(u64, u64)>,
    claimed: &mut Claimed,
) -> Result<std::result::Result<Vec<(u64, u64)>, String>> {
    let mut new = Vec::new();
    let mut named_here = HashSet::new();
    for &e in refs {
        match r.extent_at(e)? {
            ExtentAt::Data => {}
            ExtentAt::Absent if !accepted.contains(&e) && named_here.insert(e) => new.push(e),
            ExtentAt::Absent => {}
            ExtentAt::Other => {
                let (bytenr, len) = e;
                return Ok(Err(format!(
                    "it names {bytenr}+{len}, which is not a data extent of the last commit"
                )));
            }
        }
    }
    Ok(claimed.add(st, &new).map(|()| new))
}

/// Whether each new extent's checksum item, if the log has one, covers
/// exactly its sectors: replay gives the extent that item (and nothing
/// else), so a short one would leave sectors unchecked or misread.
fn sums_cover_extents(
    sums: &[(u64, Vec<u8>)],
    extents: &[(u64, u64)],
) -> std::result::Result<(), String> {
    let by_start: std::collections::HashMap<u64, usize> =
        sums.iter().map(|(b, s)| (*b, s.len())).collect();
    for &(bytenr, len) in extents {
        let want = len / u64::from(crate::format::SECTORSIZE) * 4;
        match by_start.get(&bytenr) {
            Some(&have) if have as u64 != want => {
                return Err(format!(
                    "its checksum item at {bytenr} holds {have} bytes, \
                     the {len}-byte extent there needs {want}"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Space a log names, accepted so far: in block groups of the last
/// commit, free there, and each range apart from every other.
#[derive(Default)]
struct Claimed {
    /// start → end.
    ranges: BTreeMap<u64, u64>,
}

impl Claimed {
    /// Accepts all of `ranges`, or none of them and says why.
    fn add(&mut self, st: &State, ranges: &[(u64, u64)]) -> std::result::Result<(), String> {
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        let mut end = 0;
        for &(start, len) in &sorted {
            if start < end || self.overlaps(start, start.saturating_add(len)) {
                return Err(format!("it names {start} twice"));
            }
            end = start.saturating_add(len);
            let Some(g) = st.alloc.group_containing(start) else {
                return Err(format!("it names {start}, outside any block group"));
            };
            if !g.free.contains(start, len) {
                return Err(format!(
                    "it names {start}+{len}, not free in the last commit"
                ));
            }
        }
        for (start, len) in sorted {
            self.ranges.insert(start, start.saturating_add(len));
        }
        Ok(())
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        let before = self.ranges.range(..=start).next_back();
        let after = self.ranges.range(start..end).next();
        before.is_some_and(|(_, &e)| e > start) || after.is_some()
    }
}

/// What a walk of a log found in its leaves.
#[derive(Default)]
struct LogContents {
    /// Checksum items: (data extent address, its sector sums).
    sums: Vec<(u64, Vec<u8>)>,
    /// Each inode with no refused item.
    inodes: BTreeMap<u64, InodeNotes>,
    /// Inodes with an item the checker refuses, and why (see
    /// [`PendingLog::skipped`]).
    skipped: BTreeMap<u64, String>,
}

/// What one inode's items in a log add up to, while the walk goes on: an
/// inode's items may span leaves, and one refused item drops them all.
#[derive(Default)]
struct InodeNotes {
    log_inode: bool,
    data_refs: Vec<(u64, u64)>,
}

#[derive(Default)]
struct LogWalk {
    sums: Vec<(u64, Vec<u8>)>,
    inodes: BTreeMap<u64, InodeNotes>,
    skipped: BTreeMap<u64, String>,
}

impl LogWalk {
    fn note(&mut self, key: &Key, data: &[u8]) {
        if key.objectid == CSUM_OBJECTID && key.ty == EXTENT_CSUM {
            self.sums.push((key.offset, data.to_vec()));
            return;
        }
        let notes = self.inodes.entry(key.objectid).or_default();
        if key.ty == LOG_INODE {
            notes.log_inode = true;
        } else if let Some(e) = crate::format::items::data_ref_of(key, data) {
            if key.ty == EXTENT_DATA {
                notes.data_refs.push(e);
            }
        }
    }

    /// What replay would use: every inode with no refused item.
    fn contents(mut self) -> LogContents {
        self.inodes
            .retain(|node, _| !self.skipped.contains_key(node));
        LogContents {
            sums: self.sums,
            inodes: self.inodes,
            skipped: self.skipped,
        }
    }
}

/// Walks the log at `ptr`, noting every block address in `seen`. A block
/// that is not as its parent names it is `Error::Corrupt` (a write that
/// never reached the disk, or damage); a block of another log, or a
/// checksum item the checker refuses, is a rejection. An inode's item the
/// checker refuses leaves that inode out (`LogContents::skipped`): one
/// damaged inode does not cost every other fsync.
fn walk_log(
    r: &Reader<'_>,
    sh: &Shared,
    ptr: &RootPtr,
    nonce: Option<u64>,
    seen: &mut Vec<u64>,
) -> Result<std::result::Result<LogContents, String>> {
    use crate::tree::BlockRead;
    seen.push(ptr.bytenr);
    let root = r.read_node(ptr.bytenr, ptr.generation)?;
    if root.level != ptr.level {
        return Err(Error::corrupt(ptr.bytenr, "log root at another level"));
    }
    let limits = sh.item_limits();
    let mut found = LogWalk::default();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if node.owner != tree_id::LOG || nonce.is_some_and(|n| node.flags != n) {
            return Err(Error::corrupt(node.bytenr, "not a block of this log"));
        }
        match &node.body {
            Body::Internal(ptrs) => {
                for p in ptrs {
                    seen.push(p.bytenr);
                    stack.push(crate::tree::read_child(r, p, node.level)?);
                }
            }
            Body::Leaf(leaf) => {
                for it in leaf {
                    if let Err(why) = crate::format::checker::check_item(&it.key, it.data, &limits)
                    {
                        let why = format!("item {} in block {}: {why}", it.key, node.bytenr);
                        if it.key.objectid == CSUM_OBJECTID {
                            return Ok(Err(why));
                        }
                        found.skipped.entry(it.key.objectid).or_insert(why);
                        continue;
                    }
                    found.note(&it.key, it.data);
                }
            }
        }
    }
    Ok(Ok(found.contents()))
}

/// The first device address under a checksum item in `sums` whose data
/// does not match it.
fn first_bad_data(r: &Reader<'_>, sums: &[(u64, Vec<u8>)]) -> Result<Option<u64>> {
    const SECTOR: usize = crate::format::SECTORSIZE as usize;
    const CHUNK_SECTORS: usize = 256;
    let mut buf = vec![0u8; SECTOR * CHUNK_SECTORS];
    for (bytenr, item) in sums {
        for (i, want) in item.chunks(4 * CHUNK_SECTORS).enumerate() {
            let sectors = want.len() / 4;
            let at = bytenr + (i * CHUNK_SECTORS * SECTOR) as u64;
            let data = &mut buf[..sectors * SECTOR];
            r.read_data(at, data)?;
            if let Some(bad) = crate::format::first_bad_sector(data, want) {
                return Ok(Some(at + (bad * SECTOR) as u64));
            }
        }
    }
    Ok(None)
}

/// What the extent tree of the last commit holds where a log names a
/// data extent.
enum ExtentAt {
    /// Nothing: an extent written after the last commit.
    Absent,
    /// A data extent of exactly that length.
    Data,
    /// A tree block, or an extent of another length.
    Other,
}

impl Reader<'_> {
    /// What the extent tree records at `(bytenr, len)` (extents are keyed
    /// `(bytenr, EXTENT_ITEM, len)`).
    fn extent_at(&self, (bytenr, len): (u64, u64)) -> Result<ExtentAt> {
        let c = self.cursor(tree_id::EXTENT, &Key::new(bytenr, EXTENT_ITEM, 0))?;
        let Some(it) = c
            .item()
            .filter(|i| i.key.objectid == bytenr && i.key.ty == EXTENT_ITEM)
        else {
            return Ok(ExtentAt::Absent);
        };
        let data = crate::format::items::ExtentItem::decode(it.data)
            .is_ok_and(|e| !e.is_tree_block() && it.key.offset == len);
        Ok(if data {
            ExtentAt::Data
        } else {
            ExtentAt::Other
        })
    }
}
