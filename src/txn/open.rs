//! Creating a new image (mkfs) and opening an existing one.

use super::refs::DelayedRefs;
use super::{Engine, Failure, Mechanisms, RootState, Shared, Slots, State};
use crate::alloc::Allocator;
use crate::cache::{BlockCache, BlockMap, BlockSet};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::items::{BlockGroupItem, RootItem};
use crate::format::key_type::{BLOCK_GROUP_ITEM, FREE_EXTENT, ROOT_ITEM};
use crate::format::superblock::{
    Profile, Superblock, INCOMPAT_DEVICES, INCOMPAT_DUP, INCOMPAT_MAPPED, INCOMPAT_MIXED_GROUPS,
};
use crate::format::{self, tree_id, Key, SUPER_OFFSETS, SUPER_SIZE};
use crate::tree::{BlockRead, Cursor, RootPtr};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Condvar, Mutex, RwLock};

#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub nodesize: u32,
    pub label: String,
    /// Filesystem id; random when None.
    pub fsid: Option<[u8; 16]>,
    /// Mixed block groups (data and tree blocks together); None chooses
    /// them for devices under [`MIXED_BELOW_BYTES`].
    pub mixed: Option<bool>,
    /// Profile of tree block groups; None: `dup` on split groups (two
    /// copies, as mkfs.btrfs does on one device), `single` on mixed ones
    /// (where a second copy would double the data too).
    pub metadata_profile: Option<Profile>,
    /// Profile of data groups.
    pub data_profile: Profile,
    /// The mapped layout (every group names its first copy, so copies
    /// lie on any devices); None chooses it for several devices without
    /// mixed groups (see `volume`).
    pub mapped: Option<bool>,
}

/// Devices smaller than this get mixed block groups by default: split
/// groups would strand too large a share of a small device in a group of
/// the wrong kind (btrfs makes the same choice).
pub const MIXED_BELOW_BYTES: u64 = 1 << 30;

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            nodesize: format::DEFAULT_NODESIZE,
            label: String::new(),
            fsid: None,
            mixed: None,
            metadata_profile: None,
            data_profile: Profile::Single,
            mapped: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Memory the clean block cache may hold, in bytes (decoded blocks,
    /// see `Node::memory_bytes`).
    pub cache_bytes: usize,
    /// Pending reference changes (or free-space changes) past which an
    /// operation applies them before the commit (see `Engine::write`).
    pub settle_early_at: usize,
    /// Whether a log a crash left is examined and replayed. Without,
    /// the engine opens at the last commit as if there were no log
    /// (`-o ro,nologreplay`), and a writable one drops the log at its
    /// first commit (`canopy rescue zero-log`).
    pub replay_log: bool,
    /// Rewrite bad copies of `dup` blocks from good ones even though the
    /// open is read-only (an offline scrub); a writable open always does.
    pub repair_when_read_only: bool,
    /// Open although devices the filesystem names are missing, reading
    /// the copies left (`-o degraded`; read-only without device 1 in the
    /// bound layout).
    pub degraded: bool,
    /// What to call the devices given, in the order given (paths, for
    /// messages and `filesystem show`); "device N given" where absent.
    pub device_names: Vec<String>,
    /// Block group usage and free space to take instead of what the
    /// image records (`canopy check --repair`, which counted them from
    /// the extent tree and the drop queue).
    pub space: Option<SpaceOverride>,
    /// How many log writes may be out at once (`-o log_writes=N`, 1 to
    /// `LOG_WRITES_IN_FLIGHT_MAX`): with 2, an fsync's log write is sent
    /// while the barrier of the one before is out. That shortens the wait
    /// where the barrier is long, but concurrent fsyncs then share fewer
    /// writes, so it costs the device more of them (docs/benchmarks.md:
    /// no faster on a one-node Ceph cluster).
    pub log_writes_in_flight: usize,
}

/// Usage per block group (by start; a group not named holds nothing) and
/// the free ranges, both counted from what the extent tree holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceOverride {
    pub used: BTreeMap<u64, u64>,
    pub free: Vec<(u64, u64)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            cache_bytes: crate::cache::DEFAULT_BYTES,
            settle_early_at: super::SETTLE_EARLY_AT,
            log_writes_in_flight: 1,
            replay_log: true,
            repair_when_read_only: false,
            degraded: false,
            device_names: Vec::new(),
            space: None,
        }
    }
}

/// Trees every image has from the start.
const INITIAL_TREES: [u64; 7] = [
    tree_id::EXTENT,
    tree_id::BLOCK_GROUP,
    tree_id::FS,
    tree_id::CSUM,
    tree_id::QUOTA,
    tree_id::FREE_BY_START,
    tree_id::FREE_BY_LEN,
];

/// Minimum device size: room for the reserved start and a few groups.
pub const MIN_DEVICE_BYTES: u64 = 32 << 20;

/// 16 random bytes for a filesystem id, from the kernel's generator.
pub fn random_fsid() -> [u8; 16] {
    use std::io::Read;
    let mut id = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(&mut id).is_ok() {
            return id;
        }
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    id.copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    id
}

fn new_engine(
    devices: BTreeMap<u64, Arc<dyn Device>>,
    st: State,
    fsid: [u8; 16],
    nodesize: usize,
    opts: &OpenOptions,
) -> Engine {
    let sizes: BTreeMap<u64, u64> = st.sb.devices.iter().map(|d| (d.devid, d.bytes)).collect();
    let dev = Arc::new(crate::volume::Volume::with_devices(
        devices,
        &sizes,
        st.alloc.chunk_map(),
    ));
    dev.set_repairs(!opts.read_only || opts.repair_when_read_only);
    if st.sb.is_mapped() {
        dev.set_logical_bytes(st.sb.total_bytes);
    }
    Engine {
        shared: Shared {
            dev,
            cache: BlockCache::new(opts.cache_bytes),
            inflight: Mutex::new(BlockMap::default()),
            fsid,
            nodesize,
            reported: Mutex::new(HashSet::new()),
            flights: Default::default(),
            reads: Default::default(),
        },
        commit_io: Mutex::new(super::log::IoState {
            generation: st.transid - 1,
            log: None,
            log_takes_written: 0,
            log_takes_sent: 0,
            log_writes_in_flight: 0,
            gather: Default::default(),
        }),
        commit_turn: Condvar::new(),
        state: RwLock::new(st),
        failed: Failure::default(),
        cleaner_turn: Mutex::new(()),
        commit_wanted: Default::default(),
        read_only: opts.read_only,
        settle_early_at: opts.settle_early_at.max(1),
        log_writes_in_flight: opts
            .log_writes_in_flight
            .clamp(1, crate::format::superblock::LOG_WRITES_IN_FLIGHT_MAX),
        device_names: RwLock::new(BTreeMap::new()),
        foreground: Default::default(),
        discards: Default::default(),
        logged_bytes: Mutex::new(None),
    }
}

fn empty_state(sb: Superblock, transid: u64, device_bytes: u64, mechanisms: Mechanisms) -> State {
    let mixed = sb.incompat & INCOMPAT_MIXED_GROUPS != 0;
    let mut alloc = Allocator::new(device_bytes, mixed);
    alloc.set_profiles(sb.metadata_profile, sb.data_profile);
    let others = sb.devices.iter().map(|d| (d.devid, d.bytes)).collect();
    alloc.set_devices(others, sb.has_device_table());
    if sb.is_mapped() {
        alloc.set_mapped(sb.total_bytes);
    }
    // The system groups' copies, so the root tree and the block group
    // tree read from any before the block group items are loaded.
    let map = alloc.chunk_map();
    for c in &sb.system_chunks {
        map.insert(crate::volume::Chunk::new(
            c.start,
            c.len,
            c.first,
            c.extra.clone(),
        ));
    }
    State {
        transid,
        sb,
        dirty: BlockMap::default(),
        frozen: BlockSet::default(),
        roots: BTreeMap::new(),
        dropped: Vec::new(),
        refs: DelayedRefs::default(),
        slots: Slots::default(),
        mechanisms,
        alloc,
        data_reserved: 0,
        flushing: 0,
        tree_blocks: Default::default(),
        changes: 0,
        log: None,
        pending_log: None,
        log_found: None,
        log_durable: false,
        log_replayed: false,
        log_bytes_closed: false,
        log_takes: 0,
        log_chain: None,
        superblock_changed: false,
        retired: Vec::new(),
        committed: BTreeMap::new(),
        moved: BTreeSet::new(),
        relocated: BlockSet::default(),
        relocate_cursor: 0,
        relocations: Vec::new(),
    }
}

impl Engine {
    /// Writes a new empty filesystem to `dev` (generation 1) and returns it
    /// open, with `mechanisms` called at the transaction's fixed points
    /// (`Engine::format` in engine.rs passes Canopy's).
    pub(crate) fn format_with(
        devs: Vec<Arc<dyn Device>>,
        opts: &FormatOptions,
        mechanisms: Mechanisms,
    ) -> Result<Engine> {
        let table = super::devices::new_table(&devs)?;
        let ns = opts.nodesize;
        if !ns.is_power_of_two() || !(format::MIN_NODESIZE..=format::MAX_NODESIZE).contains(&ns) {
            return Err(Error::Invalid(format!(
                "nodesize {ns} must be a power of two from 4096 to 65536"
            )));
        }
        if opts.label.len() > format::superblock::LABEL_MAX {
            return Err(Error::Invalid("label longer than 255 bytes".into()));
        }
        let size = table[0].bytes;
        let fsid = opts.fsid.unwrap_or_else(random_fsid);
        let mixed = opts.mixed.unwrap_or(size < MIXED_BELOW_BYTES);
        let metadata_profile = opts.metadata_profile.unwrap_or(match (mixed, devs.len()) {
            (true, _) => Profile::Single,
            (false, 1) => Profile::Dup,
            (false, _) => Profile::Raid1,
        });
        for p in [metadata_profile, opts.data_profile] {
            if p.min_devices() > devs.len() {
                return Err(Error::Invalid(format!(
                    "the {} profile needs {} devices, {} given",
                    p.name(),
                    p.min_devices(),
                    devs.len()
                )));
            }
        }
        let striped = [metadata_profile, opts.data_profile].contains(&Profile::Raid10);
        if striped && !opts.mapped.unwrap_or(devs.len() > 1 && !mixed) {
            return Err(Error::Invalid(
                "raid10 stripes groups over devices: it needs several devices without mixed groups (the mapped layout)".into(),
            ));
        }
        if mixed && metadata_profile != opts.data_profile {
            return Err(Error::Invalid(format!(
                "mixed block groups hold data and metadata together: their profiles must match (metadata {}, data {})",
                metadata_profile.name(),
                opts.data_profile.name()
            )));
        }
        let dup = metadata_profile != Profile::Single || opts.data_profile != Profile::Single;
        let mapped = opts.mapped.unwrap_or(devs.len() > 1 && !mixed);
        if mapped && mixed {
            return Err(Error::Invalid(
                "mixed block groups keep the bound layout (the superblock could not name every group holding the root tree)".into(),
            ));
        }
        let spans = devs.len() > 1 || metadata_profile.min_devices() > 1 || mapped;
        // The mapped layout's logical addresses are its groups' alone: as
        // many as the devices hold.
        let total_bytes = match mapped {
            true => table.iter().map(|d| d.bytes).sum(),
            false => size,
        };
        let sb = Superblock {
            fsid,
            flags: 0,
            generation: 0,
            root: 0,
            root_generation: 0,
            root_level: 0,
            log_root: 0,
            log_root_generation: 0,
            log_root_level: 0,
            log_prev_root: 0,
            log_prev_generation: 0,
            log_prev_level: 0,
            log_nonce: 0,
            log_chain: 0,
            total_bytes,
            bytes_used: 0,
            nodesize: ns,
            sectorsize: format::SECTORSIZE,
            compat: 0,
            compat_ro: 0,
            incompat: if mixed { INCOMPAT_MIXED_GROUPS } else { 0 }
                | if dup { INCOMPAT_DUP } else { 0 }
                | if spans { INCOMPAT_DEVICES } else { 0 }
                | if mapped { INCOMPAT_MAPPED } else { 0 },
            label: opts.label.clone(),
            metadata_profile,
            data_profile: opts.data_profile,
            system_chunks: Vec::new(),
            devid: 1,
            devices: table,
        };
        let st = empty_state(sb, 1, size, mechanisms);
        let devices = devs
            .into_iter()
            .enumerate()
            .map(|(i, d)| (i as u64 + 1, d))
            .collect();
        let engine = new_engine(devices, st, fsid, ns as usize, &OpenOptions::default());
        engine.write(|tx| {
            tx.create_tree(tree_id::ROOT, b"")?;
            for id in INITIAL_TREES {
                tx.create_tree(id, b"")?;
            }
            Ok(())
        })?;
        engine.commit()?;
        Ok(engine)
    }

    /// Opens the filesystem on `dev` at its newest valid superblock, with
    /// `mechanisms` called at the transaction's fixed points
    /// (`Engine::open` in engine.rs passes Canopy's).
    pub(crate) fn open_with(
        devs: Vec<Arc<dyn Device>>,
        opts: &OpenOptions,
        mechanisms: Mechanisms,
    ) -> Result<Engine> {
        let super::devices::Assembled { sb, devices, names } =
            super::devices::assemble(devs, opts)?;
        for (devid, dev) in &devices {
            let want = sb.device_bytes(*devid).unwrap_or(0);
            if want > dev.size() {
                return Err(Error::corrupt(
                    0,
                    format!(
                        "device {devid} of the filesystem holds {want} bytes, but is {} bytes long",
                        dev.size()
                    ),
                ));
            }
        }
        let unknown_ro = sb.compat_ro & !crate::format::superblock::COMPAT_RO_SUPPORTED;
        if unknown_ro != 0 && !opts.read_only {
            return Err(Error::Invalid(format!(
                "the image uses features {unknown_ro:#x} this version can only read; open it read-only"
            )));
        }
        let fsid = sb.fsid;
        let ns = sb.nodesize as usize;
        let root = RootPtr {
            bytenr: sb.root,
            generation: sb.root_generation,
            level: sb.root_level,
        };
        // Device 1's size: the bound layout's logical address space.
        let primary = match sb.is_mapped() {
            true => sb.device_bytes(crate::volume::PRIMARY_DEVID).unwrap_or(0),
            false => sb.total_bytes,
        };
        let st = empty_state(sb.clone(), sb.generation + 1, primary, mechanisms);
        let engine = new_engine(devices, st, fsid, ns, opts);
        *crate::sync::write(&engine.device_names) = names;
        if !opts.read_only {
            let mut st = crate::sync::write(&engine.state);
            let missing = super::devices::missing_devids(&st.sb, &engine.shared.dev);
            st.alloc.set_missing(&missing);
        }
        {
            let mut st = crate::sync::write(&engine.state);
            load_roots(&mut st, &engine.shared, root)?;
            load_device_stats(&st, &engine.shared)?;
            load_space(&mut st, &engine.shared, opts.space.as_ref())?;
            count_tree_blocks(&mut st, &engine.shared)?;
            open_mechanisms(&mut st, &engine.shared)?;
            st.remember_committed_roots();
            match opts.replay_log {
                true => super::log::load_pending(&mut st, &engine.shared)?,
                false => super::log::ignore_pending(&mut st, &engine.shared),
            }
        }
        if !opts.read_only {
            engine.start_own_log_chain()?;
        }
        Ok(engine)
    }

    /// Commits at a writable open, so that this run's fsyncs have a log
    /// chain of their own: the superblock found names the chain of a run
    /// that may have crashed, whose nonce this run must not reuse (its
    /// blocks may lie where this run's would). A log found at open waits
    /// for its replay, whose commit starts the chain instead.
    fn start_own_log_chain(&self) -> Result<()> {
        {
            let mut st = crate::sync::write(&self.state);
            if st.pending_log.is_some() {
                return Ok(());
            }
            st.superblock_changed = true;
        }
        self.commit().map(drop)
    }

    /// Drops the engine without the final commit, as a crash would.
    pub fn crash(self) {
        self.failed.set("simulated crash".into());
    }
}

/// Every superblock copy inside the device: its offset and what it holds.
pub fn read_super_copies(dev: &dyn Device) -> Vec<(u64, Result<Superblock>)> {
    SUPER_OFFSETS
        .iter()
        .filter(|&&o| o + SUPER_SIZE <= dev.size())
        .map(|&off| {
            let mut buf = vec![0u8; SUPER_SIZE as usize];
            let r = dev
                .read_at(&mut buf, off)
                .and_then(|_| Superblock::decode(&buf, off));
            (off, r)
        })
        .collect()
}

/// The valid superblock copy with the highest generation.
pub fn read_best_superblock(dev: &dyn Device) -> Result<Superblock> {
    let mut best: Option<Superblock> = None;
    let mut first_err = None;
    for (off, r) in read_super_copies(dev) {
        match r {
            Ok(sb) if best.as_ref().is_none_or(|b| sb.generation > b.generation) => {
                if best.as_ref().is_some_and(|b| b.fsid != sb.fsid) {
                    return Err(Error::corrupt(
                        off,
                        "superblock copies of different filesystems",
                    ));
                }
                best = Some(sb);
            }
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    best.ok_or_else(|| {
        first_err.unwrap_or_else(|| Error::NotCanopy("device too small for a superblock".into()))
    })
}

struct Loader<'a> {
    st: &'a State,
    sh: &'a Shared,
}

impl BlockRead for Loader<'_> {
    fn read_node(&self, bytenr: u64, generation: u64) -> Result<Arc<crate::format::node::Node>> {
        super::Reader::new(self.st, self.sh).read_node(bytenr, generation)
    }

    fn nodesize(&self) -> usize {
        self.sh.nodesize
    }

    fn item_limits(&self) -> crate::format::checker::Limits {
        self.sh.item_limits()
    }
}

/// Every item of a tree whose key type is `ty`.
fn items_of_type(st: &State, sh: &Shared, root: &RootPtr, ty: u8) -> Result<Vec<(Key, Vec<u8>)>> {
    let l = Loader { st, sh };
    let mut c = Cursor::seek(&l, root, &Key::MIN)?;
    let mut out = Vec::new();
    let mut cur = c.item().map(|i| (i.key, i.data.to_vec()));
    while let Some((k, d)) = cur {
        if k.ty == ty {
            out.push((k, d));
        }
        cur = c.next(&l)?.map(|i| (i.key, i.data.to_vec()));
    }
    Ok(out)
}

fn load_roots(st: &mut State, sh: &Shared, root: RootPtr) -> Result<()> {
    let root_item = RootItem {
        bytenr: root.bytenr,
        generation: root.generation,
        level: root.level,
        last_snapshot: 0,
        parent_id: 0,
        flags: 0,
        created: 1,
        name: Vec::new(),
        ident: None,
    };
    st.roots.insert(
        tree_id::ROOT,
        RootState {
            ptr: root,
            item: root_item,
            dirty: false,
        },
    );
    let limits = sh.item_limits();
    for (k, d) in items_of_type(st, sh, &root, ROOT_ITEM)? {
        // The item checker's rules (a key offset of 0 among them: a second
        // item for one tree would give it a second root, and the next
        // commit would write both).
        format::checker::check_item(&k, &d, &limits).map_err(|e| Error::corrupt(root.bytenr, e))?;
        let item = RootItem::decode(&d).map_err(|e| Error::corrupt(root.bytenr, e))?;
        if item.generation > st.sb.generation || item.level > format::node::MAX_LEVEL {
            return Err(Error::corrupt(
                item.bytenr,
                format!("root item of tree {}", k.objectid),
            ));
        }
        let ptr = RootPtr {
            bytenr: item.bytenr,
            generation: item.generation,
            level: item.level,
        };
        st.roots.insert(
            k.objectid,
            RootState {
                ptr,
                item,
                dirty: false,
            },
        );
    }
    for id in INITIAL_TREES {
        if !st.roots.contains_key(&id) {
            return Err(Error::corrupt(
                root.bytenr,
                format!("tree {id} missing from the root tree"),
            ));
        }
    }
    Ok(())
}

fn load_space(st: &mut State, sh: &Shared, space: Option<&SpaceOverride>) -> Result<()> {
    let bg_root = st.roots[&tree_id::BLOCK_GROUP].ptr;
    let groups = items_of_type(st, sh, &bg_root, BLOCK_GROUP_ITEM)?;
    // The block group items name every copy: what the superblock's
    // system array said served to read this far and goes, so that a
    // stale or hostile entry no item confirms never has writes mirrored
    // over other groups' space.
    sh.dev.map().clear();
    for (k, d) in groups {
        let g = BlockGroupItem::decode(&d).map_err(|e| Error::corrupt(k.objectid, e))?;
        let used = match space {
            Some(s) => s.used.get(&k.objectid).copied().unwrap_or(0),
            None => g.used,
        };
        st.alloc.load_group(k.objectid, k.offset, used, &g)?;
    }
    match space {
        Some(s) => {
            for &(start, len) in &s.free {
                st.alloc.load_free(start, len)?;
            }
        }
        None => {
            // Read after the groups, whose second copies it may need.
            let free_root = st.roots[&tree_id::FREE_BY_START].ptr;
            let free = items_of_type(st, sh, &free_root, FREE_EXTENT)?;
            for (k, _) in free {
                st.alloc.load_free(k.objectid, k.offset)?;
            }
        }
    }
    // Free space that disagrees with usage would let us overwrite live data.
    for g in st.alloc.groups() {
        let accounted = g.used + g.free.total() + g.super_bytes();
        if accounted != g.len {
            return Err(Error::corrupt(
                g.start,
                format!(
                    "block group of {} bytes has {} used and {} free; run `canopy check`",
                    g.len,
                    g.used,
                    g.free.total()
                ),
            ));
        }
    }
    Ok(())
}

/// The devices' error counters as the last commit recorded them.
fn load_device_stats(st: &State, sh: &Shared) -> Result<()> {
    let devids: Vec<u64> = sh.dev.all_errors().into_iter().map(|(d, _)| d).collect();
    for devid in devids {
        let key = super::persist::device_stats_key(devid);
        let Some(data) = super::Reader::new(st, sh).get(tree_id::ROOT, &key)? else {
            continue;
        };
        let s =
            crate::format::items::DeviceStats::decode(&data).map_err(|e| Error::corrupt(0, e))?;
        sh.dev.errors(devid).set([
            s.read_errors,
            s.corruption_errors,
            s.corrected,
            s.write_errors,
        ]);
    }
    Ok(())
}

/// Lets each mechanism load its state from the committed trees.
fn open_mechanisms(st: &mut State, sh: &Shared) -> Result<()> {
    let mut slots = std::mem::take(&mut st.slots);
    for m in st.mechanisms {
        m.open(&super::Reader::new(st, sh), &mut slots)?;
    }
    st.slots = slots;
    Ok(())
}

/// Counts the blocks of every tree that shares none (the space
/// reservations size the commit's need from them). Reads only internal
/// nodes: a level-1 node's pointers count its leaves.
fn count_tree_blocks(st: &mut State, sh: &Shared) -> Result<()> {
    let mut counts = super::space::TreeBlocks::new();
    for (&id, rs) in &st.roots {
        if tree_id::is_shareable(id) {
            continue;
        }
        let n = crate::tree::count_blocks(&Loader { st, sh }, &rs.ptr)?;
        counts.insert(id, n);
    }
    st.tree_blocks = counts;
    Ok(())
}
