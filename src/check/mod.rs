//! `canopy check`: a read-only consistency check of an unmounted image.
//!
//! It trusts nothing: its structural pass reads blocks straight from the
//! device without an [`crate::Engine`]; only once that pass is clean do the
//! log, POSIX and quota passes ([`check_all`]) open one read-only. Every
//! inconsistency becomes a [`Problem`] with its location instead of
//! stopping. What it verifies:
//!
//! - every superblock copy, and the tree blocks reachable from the newest:
//!   checksum, fsid, address, key order, levels, parent keys and key ranges,
//!   generations (child as recorded by the parent, none newer than the
//!   superblock);
//! - reference counts: for every tree block and data extent, the extent
//!   item's count equals the number of holders actually found, and its
//!   back-references name exactly those holders; no extent item for
//!   something unreachable; blocks of unshareable trees have one holder;
//! - space: no two extents overlap, each lies in a block group of its kind,
//!   block group usage equals the extents inside, the free-space trees list
//!   exactly the rest (merged), by start and by length alike, and the
//!   superblock's byte count matches;
//! - then ([`check_all`]) every fs tree: directory entries name existing
//!   inodes, both directory indexes agree, link counts match, unnamed
//!   inodes are orphans, each inode's `nbytes` is what its extents
//!   account for;
//! - the drop queue (`extent::drop`): each queued block is a sound tree
//!   block that nothing else holds and that has no extent item; what it
//!   points at counts it as a holder; its space counts as used;
//! - every item of every leaf, by the item checker ([`crate::format::checker`]);
//! - with quotas on, every quota group's numbers against a count made
//!   from scratch, and memberships recorded both ways;
//! - a pending fsync log, replayed in memory exactly as a mount would
//!   (`log`): what it would replay, which inodes it would leave out and
//!   why, or why a root cannot be replayed;
//! - only with [`check_data_sums`] (`--check-data-csum`): file data
//!   itself, every sector read and compared with its checksum, as scrub
//!   does. Without it the data is never read: check proves each data
//!   extent has its checksums, and a flipped data sector is scrub's to
//!   find.
//!
//! Its memory does not grow with the number of files or extents: what
//! relates items far apart in the trees is sorted as records
//! (`sorted`), within a budget and past it in temporary files, and
//! compared in one ordered pass (`space`, `posix`).

mod log;
mod posix;
mod quota;
pub mod repair;
mod sorted;
mod space;
mod walk;

use crate::dev::Device;
use crate::error::Result;
use serde::Serialize;
use std::sync::Arc;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// Where: a byte address, a tree, a key.
    pub location: String,
    pub message: String,
    /// How `canopy check --repair` mends it; None when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<Fix>,
}

/// A repair `canopy check --repair` knows for a kind of damage a crash or
/// a bug leaves.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fix {
    /// Block group usage, the superblock's byte count and the free-space
    /// trees, counted again from the extent tree and the drop queue.
    Space,
    /// An inode's link count set to the names found for it.
    LinkCount { tree: u64, ino: u64, nlink: u32 },
    /// An inode's `nbytes` set to what its file extent items account for.
    Nbytes { tree: u64, ino: u64, nbytes: u64 },
    /// An inode no name reaches gets an orphan item: the next writable
    /// mount deletes it and frees its space, as if its last unlink had
    /// finished.
    Orphan { tree: u64, ino: u64 },
    /// A directory entry listed by name but missing from the index by
    /// position (what a listing reads) gets its index item back.
    DirIndex {
        tree: u64,
        dir: u64,
        #[serde(serialize_with = "shown_entry")]
        entry: Box<crate::format::inode::DirEntry>,
    },
    /// A data extent's reference count and back-references set to the
    /// leaves whose file extent items point at it: `holders` are
    /// `(leaf, items)`.
    ExtentRefs {
        bytenr: u64,
        len: u64,
        holders: Vec<(u64, u32)>,
    },
    /// A data extent file extent items point at that has no extent item
    /// (lost by a bug): the item comes back, counting `holders` (`(leaf,
    /// items)`) with their back-references, and its space is taken out
    /// of the free space first, so nothing the repair writes lands on it.
    MissingData {
        bytenr: u64,
        len: u64,
        holders: Vec<(u64, u32)>,
    },
    /// A tree block's reference count and back-references set to what
    /// points at it: the nodes (`parents`) and the root items (`roots`)
    /// the walk found.
    BlockRefs {
        bytenr: u64,
        parents: Vec<u64>,
        roots: Vec<u64>,
    },
    /// A data extent recorded in the extent tree that no file extent
    /// item points at (leaked by a bug that dropped an item without its
    /// reference): its extent item, back-references and checksums go and
    /// its space is freed, as its last holder's release would have done.
    LeakedData { bytenr: u64, len: u64 },
    /// A tree block recorded in the extent tree that no node or root
    /// points at: its extent item and back-references go and its space
    /// is freed. What it points at keeps no reference from it (the
    /// walk counts only blocks it reaches; their own fixes set that).
    LeakedBlock { bytenr: u64, len: u64 },
    /// A count the other fixes of the same place make right (nothing to
    /// do on its own).
    Counted,
}

/// An entry as reports show it: its name as text (bytes that are not
/// UTF-8 replaced).
fn shown_entry<S: serde::Serializer>(
    e: &crate::format::inode::DirEntry,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("entry", 4)?;
    st.serialize_field("ino", &e.ino)?;
    st.serialize_field("kind", &e.kind)?;
    st.serialize_field("index", &e.index)?;
    st.serialize_field("name", &String::from_utf8_lossy(&e.name))?;
    st.end()
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub generation: u64,
    pub trees: usize,
    pub tree_blocks: u64,
    pub data_extents: u64,
    pub bytes_used: u64,
    /// Blocks of deleted subvolumes the cleaner has still to free.
    pub queued_blocks: u64,
    pub problems: Vec<Problem>,
    /// Not damage, but worth knowing (e.g. an older superblock copy).
    pub warnings: Vec<Problem>,
    /// The fsync log a crash left, and what replay would do with it.
    pub log: Option<crate::txn::LogVerdict>,
    /// Usage and free space as the extent tree has them, when the
    /// image's own records disagree (what [`Fix::Space`] writes).
    #[serde(skip)]
    pub space_plan: Option<crate::txn::SpaceOverride>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    pub(crate) fn problem(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            location: location.into(),
            message: message.into(),
            fix: None,
        });
    }

    /// A problem `--repair` mends with `fix`.
    pub(crate) fn fixable(
        &mut self,
        location: impl Into<String>,
        message: impl Into<String>,
        fix: Fix,
    ) {
        self.problems.push(Problem {
            location: location.into(),
            message: message.into(),
            fix: Some(fix),
        });
    }

    pub(crate) fn warning(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            location: location.into(),
            message: message.into(),
            fix: None,
        });
    }
}

/// Checks the image on `dev`. `progress` is called with the number of tree
/// blocks read so far and an estimate of the total. Fails only when no
/// superblock can be read at all.
pub fn check(dev: &dyn Device, progress: &dyn Fn(u64, u64)) -> Result<Report> {
    check_devices(&[dev], progress)
}

/// [`check`] of a filesystem over several devices, given in any order.
/// A device the filesystem names but that is not given is a problem, and
/// the copies it holds go unchecked.
pub fn check_devices(devs: &[&dyn Device], progress: &dyn Fn(u64, u64)) -> Result<Report> {
    check_devices_within(devs, progress, DEFAULT_MEMORY)
}

/// [`check_devices`] holding the records that grow with the number of
/// extents within about `memory` bytes (past it, in temporary files).
pub fn check_devices_within(
    devs: &[&dyn Device],
    progress: &dyn Fn(u64, u64),
    memory: u64,
) -> Result<Report> {
    let mut report = Report::default();
    let (sb, by_id) = assemble(devs, &mut report)?;
    report.generation = sb.generation;
    report.bytes_used = sb.bytes_used;
    for (&devid, dev) in &by_id {
        walk::check_super_copies(devid, *dev, &sb, &mut report);
    }
    let found = walk::walk_all(&by_id, &sb, &mut report, progress, memory / 2);
    let primary = by_id.get(&1).map_or(sb.total_bytes, |d| d.size());
    space::check(primary, &sb, found, &mut report);
    Ok(report)
}

/// The newest superblock among `devs` and the devices by the devid their
/// copies name; devices of another filesystem, named twice or missing are
/// problems. Fails when the first device has no superblock.
fn assemble<'a>(
    devs: &[&'a dyn Device],
    report: &mut Report,
) -> Result<(crate::format::superblock::Superblock, walk::Devices<'a>)> {
    let mut found = Vec::new();
    for (i, &dev) in devs.iter().enumerate() {
        match crate::txn::read_best_superblock(dev) {
            Ok(sb) => found.push((sb, dev)),
            Err(e) if i == 0 => return Err(e),
            Err(e) => report.problem(format!("device given as number {}", i + 1), e.to_string()),
        }
    }
    let best = found
        .iter()
        .map(|(sb, _)| sb)
        .max_by_key(|sb| sb.generation)
        .cloned()
        .ok_or_else(|| crate::Error::NotCanopy("no device given".into()))?;
    let mut by_id = walk::Devices::new();
    for (sb, dev) in found {
        let known = best
            .devices
            .iter()
            .find(|d| d.devid == sb.devid)
            .zip(sb.devices.iter().find(|d| d.devid == sb.devid))
            .is_some_and(|(a, b)| a.uuid == b.uuid);
        if sb.fsid != best.fsid || !known {
            report.problem(
                format!("device {}", sb.devid),
                "belongs to another filesystem, or is no longer one of this one's devices",
            );
        } else if by_id.insert(sb.devid, dev).is_some() {
            report.problem(format!("device {}", sb.devid), "given twice");
        }
    }
    for d in best
        .devices
        .iter()
        .filter(|d| !by_id.contains_key(&d.devid))
    {
        report.problem(
            format!("device {}", d.devid),
            format!(
                "missing ({} bytes, uuid {}): the copies it holds were not checked",
                d.bytes,
                crate::format::uuid::shown(&d.uuid)
            ),
        );
    }
    Ok((best, by_id))
}

/// The image opened read-only, for the checks that read trees through
/// the engine once the structure is known to be sound (but for the
/// counters `space` replaces, when `--repair` looks past them).
/// Its block cache fits a check held within `memory` bytes (an eighth of
/// it, at most the engine's default).
fn open_read_only(
    devs: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    memory: u64,
) -> Result<crate::Engine> {
    let eighth = usize::try_from(memory / 8).unwrap_or(usize::MAX);
    let opts = crate::OpenOptions {
        read_only: true,
        space: space.cloned(),
        cache_bytes: eighth.clamp(1 << 20, crate::cache::DEFAULT_BYTES),
        ..Default::default()
    };
    crate::Engine::open_devices(devs, &opts)
}

/// The passes that read through the engine: the log a crash left, every
/// fs tree, quota groups.
fn engine_passes(
    devs: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    memory: u64,
    report: &mut Report,
) {
    log::check_log(devs.clone(), space, memory, report);
    // Damage `--repair` mends (counters, a data extent's references)
    // does not mislead reads through the engine.
    if report.problems.iter().all(|p| p.fix.is_some()) {
        posix::check_trees(devs.clone(), space, memory / 2, report);
        quota::check_quota(devs, space, memory, report);
    }
}

/// [`check`], then, when the structure is sound, the POSIX-level checks of
/// every fs tree (entries, link counts, orphans).
pub fn check_all(dev: Arc<dyn Device>, progress: &dyn Fn(u64, u64)) -> Result<Report> {
    check_all_devices(vec![dev], progress)
}

/// [`check_all`] of a filesystem over several devices.
pub fn check_all_devices(
    devs: Vec<Arc<dyn Device>>,
    progress: &dyn Fn(u64, u64),
) -> Result<Report> {
    check_all_devices_within(devs, progress, DEFAULT_MEMORY)
}

/// What [`check_all_devices`] lets the records it relates take in memory
/// by default (`canopy check --max-memory`).
pub const DEFAULT_MEMORY: u64 = 512 << 20;

/// [`check_all_devices`] holding what it relates across the trees within
/// about `memory` bytes: half of it for the fs trees' records (the rest
/// is for the read-only engine's cache and what the structural pass
/// holds); past it, sorted runs go to temporary files ($TMPDIR).
pub fn check_all_devices_within(
    devs: Vec<Arc<dyn Device>>,
    progress: &dyn Fn(u64, u64),
    memory: u64,
) -> Result<Report> {
    let borrowed: Vec<&dyn Device> = devs.iter().map(|d| d.as_ref()).collect();
    let mut report = check_devices_within(&borrowed, progress, memory)?;
    if report.is_clean() {
        engine_passes(devs, None, memory, &mut report);
    }
    Ok(report)
}

/// Reads every data extent (and tree block) of a structurally sound image
/// and compares it with its checksums (`canopy::scrub`, offline and
/// unthrottled), adding a problem for each bad sector, each file it
/// reaches, and each extent without checksums.
pub fn check_data_sums(dev: Arc<dyn Device>, report: &mut Report) {
    check_data_sums_devices(vec![dev], report)
}

/// [`check_data_sums`] of a filesystem over several devices.
pub fn check_data_sums_devices(devs: Vec<Arc<dyn Device>>, report: &mut Report) {
    let engine = match open_read_only(devs, None, DEFAULT_MEMORY) {
        Ok(e) => e,
        Err(e) => return report.problem("filesystem", format!("cannot open: {e}")),
    };
    let pace = crate::scrub::Pace { throttle: false };
    let scrubbed = match crate::scrub::run(&engine, &crate::scrub::Control::default(), pace) {
        Ok(r) => r,
        Err(e) => return report.problem("data", format!("cannot read: {e}")),
    };
    for b in &scrubbed.bad_tree_blocks {
        report.problem(
            format!("tree block {} (tree {})", b.bytenr, b.tree),
            &b.error,
        );
    }
    for c in &scrubbed.bad_copies {
        report.problem(
            format!("{} copy {}", c.what(), c.copy),
            format!(
                "{}; another copy is good: `canopy scrub` repairs it",
                c.error
            ),
        );
    }
    for s in &scrubbed.bad_data_sectors {
        report.problem(format!("data sector {s}"), "checksum mismatch");
    }
    let files = scrubbed.damaged_files.iter().map(|f| (f, "damaged data"));
    let unsummed = scrubbed
        .unsummed_files
        .iter()
        .map(|f| (f, "data without checksums"));
    for (f, what) in files.chain(unsummed) {
        let ranges: Vec<String> = f.ranges.iter().map(|(s, e)| format!("{s}..{e}")).collect();
        report.problem(
            format!(
                "file {} (inode {})",
                f.path.as_deref().unwrap_or("(no path)"),
                f.ino
            ),
            format!("{what} at bytes {}", ranges.join(", ")),
        );
    }
    for e in &scrubbed.errors {
        report.problem("data", e);
    }
}
