//! A full disk at the POSIX layer, without a mount: every change either
//! succeeds and survives a remount, or fails with ENOSPC having changed
//! nothing. Never another error, never a shut-down engine, `check` clean
//! after every step, deleting always works, and a refill after deleting
//! everything gets as far as the first fill.

mod common;

use canopy::balance::{BalanceArgs, Filter};
use canopy::dev::{Device, MemDevice};
use canopy::format::superblock::Profile;
use canopy::fs::{BalanceState, Fs, Owner, QuotaChange};
use canopy::{Engine, FormatOptions, OpenOptions};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };
const MIB: u64 = 1 << 20;

/// What the filesystem must hold: file name → (contents, xattr value).
type Model = BTreeMap<Vec<u8>, (Vec<u8>, Option<Vec<u8>>)>;

fn format(size: u64, nodesize: u32, mixed: bool, metadata: Profile) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(size));
    let opts = FormatOptions {
        nodesize,
        fsid: Some([0x42; 16]),
        mixed: Some(mixed),
        metadata_profile: Some(metadata),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

/// What mkfs chooses: two copies of tree blocks with separate groups.
fn default_profile(mixed: bool) -> Profile {
    match mixed {
        true => Profile::Single,
        false => Profile::Dup,
    }
}

/// Commits, checks, and opens again; the tree sizes the reservations
/// tracked while running must equal a count from scratch.
fn reopen(dev: &Arc<MemDevice>, fs: Fs) -> Fs {
    fs.sync().expect("the commit of a full filesystem");
    let tracked = fs.engine().tree_block_counts();
    drop(fs);
    common::assert_fs_clean(dev);
    // Counted before the writable open's own commit changes anything.
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &ro).expect("open read-only");
    assert_eq!(e.tree_block_counts(), tracked, "tree sizes drifted");
    drop(e);
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    Fs::new(Arc::new(e)).expect("fs")
}

/// Ok(true) on success, Ok(false) on ENOSPC; anything else fails the test.
fn ok_or_full<T>(what: &str, r: canopy::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.errno() == libc::ENOSPC => None,
        Err(e) => panic!("{what}: {e} (only ENOSPC may fail a change)"),
    }
}

fn file_ino(fs: &Fs, dir: u64, name: &[u8]) -> u64 {
    fs.lookup(dir, name).expect("lookup").ino
}

/// The root directory's files against the model.
fn verify(fs: &Fs, model: &Model) {
    verify_dir(fs, ROOT, model);
}

/// A directory's files against the model.
fn verify_dir(fs: &Fs, dir: u64, model: &Model) {
    let mut names = Vec::new();
    let mut off = 0;
    loop {
        let batch = fs.readdir(dir, off, 512).expect("readdir");
        let Some(last) = batch.last() else { break };
        off = last.0;
        names.extend(
            batch
                .into_iter()
                .map(|e| e.3)
                .filter(|n| n != b"." && n != b".."),
        );
    }
    let want: Vec<&Vec<u8>> = model.keys().collect();
    let got: Vec<&Vec<u8>> = names
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(got, want, "names after remount");
    for (name, (data, xattr)) in model {
        let ino = file_ino(fs, dir, name);
        let a = fs.getattr(ino).expect("getattr");
        assert_eq!(
            a.size,
            data.len() as u64,
            "size of {}",
            String::from_utf8_lossy(name)
        );
        let mut read = Vec::new();
        while (read.len() as u64) < a.size {
            let n = (a.size - read.len() as u64).min(8 * MIB) as u32;
            read.extend(fs.read(ino, read.len() as u64, n).expect("read"));
        }
        assert!(
            read == *data,
            "contents of {}",
            String::from_utf8_lossy(name)
        );
        if let Some(v) = xattr {
            assert_eq!(&fs.getxattr(ino, b"user.fill").expect("getxattr"), v);
        }
    }
}

/// One way to fill a disk. Returns the file data bytes it got in.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// One file, 1 MiB writes.
    OneBig,
    /// Files of 6 KB.
    Small,
    /// A file of most of the space, then files of 6 KB.
    BigThenSmall,
    /// fallocate just above what statfs offers (must fail, changing
    /// nothing), then just below (must work).
    Fallocate,
    /// Data to nearly full, then reflink copies of a 1 MiB file.
    Reflinks,
    /// Data to nearly full, then files with 1 KiB xattrs.
    Xattrs,
    /// Data to nearly full, then hard links to one file.
    Links,
}

struct Filler<'a> {
    fs: &'a Fs,
    /// Where the files go.
    dir: u64,
    model: &'a mut Model,
    next: u32,
    bytes: u64,
}

impl Filler<'_> {
    fn new_file(&mut self) -> Option<(Vec<u8>, u64)> {
        let name = format!("f{:06}", self.next).into_bytes();
        self.next += 1;
        let r = self
            .fs
            .create(self.dir, &name, libc::S_IFREG | 0o644, 0, ME, None);
        let a = ok_or_full("create", r)?;
        self.model.insert(name.clone(), (Vec::new(), None));
        Some((name, a.ino))
    }

    /// Appends `len` bytes to `name`; false on ENOSPC.
    fn append(&mut self, name: &[u8], ino: u64, len: usize) -> bool {
        let entry = self.model.get_mut(name).expect("in the model");
        let byte = (entry.0.len() / 4096 % 251) as u8 ^ name[name.len() - 1];
        let data = vec![byte; len];
        match ok_or_full("write", self.fs.write(ino, entry.0.len() as u64, &data)) {
            Some(n) => {
                assert_eq!(n as usize, len);
                entry.0.extend_from_slice(&data);
                // Data takes whole sectors.
                self.bytes += (len as u64).next_multiple_of(4096);
                true
            }
            None => false,
        }
    }

    fn one_big(&mut self, limit: u64) {
        let Some((name, ino)) = self.new_file() else {
            return;
        };
        while self.bytes < limit && self.append(&name, ino, MIB as usize) {}
    }

    fn small_files(&mut self, limit: u64) {
        while self.bytes < limit {
            let Some((name, ino)) = self.new_file() else {
                return;
            };
            if !self.append(&name, ino, 6000) {
                return;
            }
        }
    }

    /// Data until under `left` bytes remain for writers.
    fn data_until(&mut self, left: u64) {
        let Some((name, ino)) = self.new_file() else {
            return;
        };
        while self.fs.statfs().avail * 4096 > left + MIB {
            if !self.append(&name, ino, MIB as usize) {
                return;
            }
        }
    }

    fn fallocate(&mut self) {
        let Some((name, ino)) = self.new_file() else {
            return;
        };
        let avail = self.fs.statfs().avail * 4096;
        let over = self.fs.fallocate(ino, 0, avail + 8 * MIB, 0);
        assert_eq!(
            over.map_err(|e| e.errno()),
            Err(libc::ENOSPC),
            "fallocate past the free space"
        );
        assert_eq!(
            self.fs.getattr(ino).expect("getattr").size,
            0,
            "a failed fallocate changed the size"
        );
        let below = avail.saturating_sub(2 * MIB) / 4096 * 4096;
        self.fs
            .fallocate(ino, 0, below, 0)
            .expect("fallocate of what statfs offered");
        self.model.get_mut(&name).expect("model").0 = vec![0; below as usize];
        self.bytes += below;
    }

    fn reflinks(&mut self) {
        self.data_until(4 * MIB);
        let Some((src_name, src)) = self.new_file() else {
            return;
        };
        if !self.append(&src_name, src, MIB as usize) {
            return;
        }
        let content = self.model[&src_name].0.clone();
        for _ in 0..300 {
            let Some((name, ino)) = self.new_file() else {
                return;
            };
            match ok_or_full("copy_file_range", self.fs.copy_range(src, 0, ino, 0, MIB)) {
                Some(n) => {
                    assert_eq!(n, MIB);
                    self.model.get_mut(&name).expect("model").0 = content.clone();
                }
                None => return,
            }
        }
    }

    fn xattrs(&mut self) {
        self.data_until(3 * MIB);
        for i in 0..3000u32 {
            let Some((name, ino)) = self.new_file() else {
                return;
            };
            let value = vec![(i % 250) as u8; 1024];
            if ok_or_full("setxattr", self.fs.setxattr(ino, b"user.fill", &value, 0)).is_none() {
                return;
            }
            self.model.get_mut(&name).expect("model").1 = Some(value);
        }
    }

    fn links(&mut self) {
        self.data_until(2 * MIB);
        let Some((name, ino)) = self.new_file() else {
            return;
        };
        if !self.append(&name, ino, 5000) {
            return;
        }
        let content = self.model[&name].0.clone();
        for _ in 0..3000 {
            let link = format!("f{:06}", self.next).into_bytes();
            self.next += 1;
            if ok_or_full("link", self.fs.link(ino, self.dir, &link)).is_none() {
                return;
            }
            self.model.insert(link, (content.clone(), None));
        }
    }

    fn run(&mut self, fill: Fill) {
        let forever = u64::MAX;
        match fill {
            Fill::OneBig => self.one_big(forever),
            Fill::Small => self.small_files(forever),
            Fill::BigThenSmall => {
                let avail = self.fs.statfs().avail * 4096;
                self.one_big(avail * 9 / 10);
                self.small_files(forever);
            }
            Fill::Fallocate => self.fallocate(),
            Fill::Reflinks => self.reflinks(),
            Fill::Xattrs => self.xattrs(),
            Fill::Links => self.links(),
        }
    }
}

/// Deletes every file; each delete must work, however full the disk.
fn delete_all(fs: &Fs, model: &mut Model) {
    delete_all_in(fs, ROOT, model);
}

fn delete_all_in(fs: &Fs, dir: u64, model: &mut Model) {
    for name in std::mem::take(model).into_keys() {
        fs.remove(dir, &name, false)
            .unwrap_or_else(|e| panic!("deleting on a full disk: {e}"));
    }
}

fn torture(size: u64, nodesize: u32, mixed: bool, fill: Fill) {
    torture_with(size, nodesize, mixed, Profile::Single, fill);
}

fn torture_with(size: u64, nodesize: u32, mixed: bool, metadata: Profile, fill: Fill) {
    let what = format!(
        "{fill:?} on {} MiB, nodesize {nodesize}, mixed {mixed}, metadata {}",
        size >> 20,
        metadata.name()
    );
    let (dev, mut fs) = format(size, nodesize, mixed, metadata);
    let mut model = Model::new();
    let mut first = 0;
    for round in 0..2 {
        let mut f = Filler {
            fs: &fs,
            dir: ROOT,
            model: &mut model,
            next: round * 100_000,
            bytes: 0,
        };
        f.run(fill);
        let got = f.bytes;
        fs = reopen(&dev, fs);
        verify(&fs, &model);
        if round == 0 {
            first = got;
            if matches!(fill, Fill::OneBig | Fill::Small | Fill::BigThenSmall) {
                let share = got as f64 / size as f64;
                // Two copies of small files' inline data and items cost
                // more of a small image.
                let least = match (metadata, fill) {
                    (Profile::Dup, Fill::Small) => 0.70,
                    _ => 0.80,
                };
                assert!(
                    share > least,
                    "{what}: only {:.1}% of the image took data",
                    share * 100.0
                );
            }
        } else {
            // With separate groups, metadata groups that a metadata-heavy
            // fill grew keep their last live blocks after the deletes
            // (only empty groups go back; moving the rest is balance's
            // job), so data gets less of the device the second time.
            let metadata_fill = matches!(fill, Fill::Xattrs | Fill::Links | Fill::Reflinks);
            let share = if !mixed && metadata_fill { 0.85 } else { 0.98 };
            assert!(
                got as f64 >= first as f64 * share,
                "{what}: the refill got {got} bytes, the first fill {first}"
            );
        }
        delete_all(&fs, &mut model);
        fs = reopen(&dev, fs);
        verify(&fs, &model);
    }
    // An emptied filesystem takes new files.
    let a = fs
        .create(ROOT, b"after", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("touch after emptying");
    fs.write(a.ino, 0, &vec![1u8; 100_000])
        .expect("a write after emptying");
    let _ = reopen(&dev, fs);
}

#[test]
fn every_fill_pattern_on_small_mixed_images() {
    for fill in [
        Fill::OneBig,
        Fill::Small,
        Fill::BigThenSmall,
        Fill::Fallocate,
        Fill::Reflinks,
        Fill::Xattrs,
        Fill::Links,
    ] {
        torture(32 * MIB, 4096, true, fill);
    }
    torture(64 * MIB, 16384, true, Fill::BigThenSmall);
}

/// Separate data and metadata groups on a small device: the case where
/// data used to take the last unallocated space and leave an empty
/// filesystem that refused `touch`.
#[test]
fn every_fill_pattern_with_separate_groups() {
    for fill in [
        Fill::OneBig,
        Fill::Small,
        Fill::BigThenSmall,
        Fill::Fallocate,
        Fill::Xattrs,
    ] {
        torture(64 * MIB, 4096, false, fill);
    }
    torture(96 * MIB, 16384, false, Fill::BigThenSmall);
}

/// The same with two copies of every tree block: a new metadata group
/// takes twice its size of unallocated space, which the claims the other
/// kinds hold must count.
#[test]
fn every_fill_pattern_with_dup_metadata() {
    for fill in [
        Fill::OneBig,
        Fill::Small,
        Fill::BigThenSmall,
        Fill::Fallocate,
        Fill::Xattrs,
    ] {
        torture_with(64 * MIB, 4096, false, Profile::Dup, fill);
    }
    torture_with(96 * MIB, 16384, false, Profile::Dup, Fill::BigThenSmall);
}

/// Thousands of deletes in one transaction at 4 KiB nodes, on a full disk.
#[test]
fn mass_delete_in_one_transaction() {
    let (dev, fs) = format(48 * MIB, 4096, true, default_profile(true));
    let mut model = Model::new();
    let mut f = Filler {
        fs: &fs,
        dir: ROOT,
        model: &mut model,
        next: 0,
        bytes: 0,
    };
    f.small_files(u64::MAX);
    let fs = reopen(&dev, fs);
    assert!(model.len() > 2400, "only {} files fitted", model.len());
    delete_all(&fs, &mut model);
    let fs = reopen(&dev, fs);
    verify(&fs, &model);
}

/// Balance on a full disk, with a snapshot sharing most of the metadata
/// and quotas on. Each step reserves its worst case and folds its own
/// reference changes, so a step either moves its extents or fails with
/// ENOSPC before changing anything: the balance finishes or stops as
/// Failed with a space error, never shuts the engine down, and leaves
/// every file, snapshot and quota number as it was. Once files are
/// deleted, a balance finishes.
fn balance_when_full(size: u64, mixed: bool, fill: u64) {
    let what = format!("{} MiB, mixed {mixed}, filled to {fill}%", size >> 20);
    let (dev, fs) = format(size, 4096, mixed, default_profile(mixed));
    fs.quota(QuotaChange::Enable).expect("quota enable");
    let data = fs.create_subvolume(ROOT, b"data", ME).expect("subvolume");
    let mut model = Model::new();
    let mut f = Filler {
        fs: &fs,
        dir: data.ino,
        model: &mut model,
        next: 0,
        bytes: 0,
    };
    f.small_files(size / 3);
    let snap = ok_or_full("snapshot", fs.snapshot(data.ino, ROOT, b"snap", false))
        .expect("a snapshot of a third-full disk");
    let snapshotted = f.model.clone();
    f.small_files(size * fill / 100);
    // Changes in both, so the trees share some blocks and not others.
    for name in snapshotted.keys().step_by(7) {
        let ino = file_ino(&fs, data.ino, name);
        if ok_or_full("overwrite", fs.write(ino, 0, b"changed")).is_some() {
            model.get_mut(name).expect("in the model").0[..7].copy_from_slice(b"changed");
        }
    }
    let fs = reopen(&dev, fs);
    let quotas = fs.qgroup_show().expect("qgroup show");
    let used = fs.engine().space().0;
    let blocks = fs.engine().tree_block_counts();

    match ok_or_full("balance start", fs.balance_start(BalanceArgs::all())) {
        None => eprintln!("{what}: no room to record a balance"),
        Some(_) => {
            let st = fs.balance_wait();
            eprintln!("{what}: balance {st:?}");
            match st.state {
                BalanceState::Finished => {}
                BalanceState::Failed => {
                    let error = st.error.unwrap_or_default();
                    assert!(
                        error.contains("space"),
                        "{what}: balance failed with {error:?}, not for space"
                    );
                    // Groups without room are skipped, so the balance
                    // ends; cancel in case one stayed recorded.
                    match fs.balance_cancel() {
                        Err(e) if e.errno() != libc::ENOTCONN => {
                            panic!("{what}: cancel after a failed balance: {e}")
                        }
                        _ => {}
                    }
                }
                other => panic!("{what}: balance ended {other:?}: {st:?}"),
            }
        }
    }
    fs.sync().expect("the engine is still up");
    common::assert_quota_exact(&fs, &what);
    assert_eq!(fs.qgroup_show().expect("qgroup show"), quotas, "{what}");
    // Nothing is unshared (that would be MiBs of data and subvolume
    // blocks); a balance that skipped groups half-moved leaves their free
    // space in more pieces, so the free-space and extent trees may hold a
    // few blocks more.
    let after = fs.engine().space().0;
    assert!(
        after <= used + 16 * 4096,
        "{what}: balance grew used space from {used} to {after}; trees {blocks:?} -> {:?}",
        fs.engine().tree_block_counts()
    );
    let fs = reopen(&dev, fs);
    verify_dir(&fs, data.ino, &model);
    verify_dir(&fs, snap.ino, &snapshotted);

    // Deleting works, and then a data balance has room to finish. (Not
    // necessarily a metadata one: the fill may have left no unallocated
    // space for a new system group, and the only one cannot empty.)
    delete_all_in(&fs, data.ino, &mut model);
    let fs = reopen(&dev, fs);
    let data_only = BalanceArgs {
        data: Filter::All,
        metadata: Filter::Skip,
        ..Default::default()
    };
    fs.balance_start(data_only)
        .unwrap_or_else(|e| panic!("{what}: balance after deleting: {e}"));
    let st = fs.balance_wait();
    assert_eq!(st.state, BalanceState::Finished, "{what}: {st:?}");
    common::assert_quota_exact(&fs, &what);
    let fs = reopen(&dev, fs);
    verify_dir(&fs, data.ino, &model);
    verify_dir(&fs, snap.ino, &snapshotted);
}

#[test]
fn balance_on_a_full_disk_finishes_or_stops_cleanly() {
    for fill in [100, 90, 80, 70] {
        balance_when_full(32 * MIB, true, fill);
        balance_when_full(64 * MIB, false, fill);
    }
}

/// Space freed by a delete is usable at once: the reservation commits and
/// asks again before it answers ENOSPC.
#[test]
fn freed_space_is_usable_before_the_next_commit() {
    let (dev, fs) = format(64 * MIB, 16384, true, default_profile(true));
    let a = fs
        .create(ROOT, b"a", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    let avail = fs.statfs().avail * 4096 - 2 * MIB;
    fs.fallocate(a.ino, 0, avail, 0).expect("fallocate");
    fs.sync().expect("sync");
    fs.remove(ROOT, b"a", false).expect("rm");
    eprintln!("avail after rm {} want {avail}", fs.statfs().avail * 4096);
    let b = fs
        .create(ROOT, b"b", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    fs.sync().unwrap();
    eprintln!("avail after sync {} want {avail}", fs.statfs().avail * 4096);
    fs.sync().unwrap();
    eprintln!(
        "avail after sync2 {} want {avail}",
        fs.statfs().avail * 4096
    );
    fs.fallocate(b.ino, 0, avail, 0)
        .expect("fallocate right after rm");
    let _ = reopen(&dev, fs);
}

/// Free space only in small holes still takes a large write: the flush
/// allocates extents of any length.
#[test]
fn fragmented_free_space_takes_large_writes() {
    let (dev, fs) = free_space_in_12k_holes(4096);
    let big = fs
        .create(ROOT, b"big", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    let data = vec![9u8; 4 * MIB as usize];
    fs.write(big.ino, 0, &data)
        .expect("a 4 MiB write into holes");
    let fs = reopen(&dev, fs);
    let ino = file_ino(&fs, ROOT, b"big");
    assert!(fs.read(ino, 0, 4 * MIB as u32).expect("read") == data);
}

#[derive(Clone, Debug)]
enum Op {
    Create(u8),
    Write { file: u8, off: u32, len: u32 },
    Truncate { file: u8, size: u32 },
    Fallocate { file: u8, off: u32, len: u32 },
    Remove(u8),
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..12).prop_map(Op::Create),
        4 => (0u8..12, 0u32..(8 << 20), 1u32..(3 << 20)).prop_map(|(file, off, len)| Op::Write { file, off, len }),
        1 => (0u8..12, 0u32..(8 << 20)).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (0u8..12, 0u32..(8 << 20), 1u32..(6 << 20)).prop_map(|(file, off, len)| Op::Fallocate { file, off, len }),
        1 => (0u8..12).prop_map(Op::Remove),
        1 => Just(Op::Sync),
    ]
}

fn apply(fs: &Fs, model: &mut Model, op: &Op, step: usize) {
    let name = |n: u8| format!("p{n}").into_bytes();
    match *op {
        Op::Create(n) => {
            if !model.contains_key(&name(n))
                && ok_or_full(
                    "create",
                    fs.create(ROOT, &name(n), libc::S_IFREG | 0o644, 0, ME, None),
                )
                .is_some()
            {
                model.insert(name(n), (Vec::new(), None));
            }
        }
        Op::Write { file, off, len } => {
            let Some(entry) = model.get_mut(&name(file)) else {
                return;
            };
            let data = vec![(step % 251) as u8 | 1; len as usize];
            if ok_or_full(
                "write",
                fs.write(file_ino(fs, ROOT, &name(file)), u64::from(off), &data),
            )
            .is_some()
            {
                let end = off as usize + data.len();
                if entry.0.len() < end {
                    entry.0.resize(end, 0);
                }
                entry.0[off as usize..end].copy_from_slice(&data);
            }
        }
        Op::Truncate { file, size } => {
            let Some(entry) = model.get_mut(&name(file)) else {
                return;
            };
            let set = canopy::fs::SetAttr {
                size: Some(u64::from(size)),
                ..Default::default()
            };
            if ok_or_full(
                "truncate",
                fs.setattr(file_ino(fs, ROOT, &name(file)), &set),
            )
            .is_some()
            {
                entry.0.resize(size as usize, 0);
            }
        }
        Op::Fallocate { file, off, len } => {
            let Some(entry) = model.get_mut(&name(file)) else {
                return;
            };
            let ino = file_ino(fs, ROOT, &name(file));
            if ok_or_full(
                "fallocate",
                fs.fallocate(ino, u64::from(off), u64::from(len), 0),
            )
            .is_some()
            {
                let end = (off + len) as usize;
                if entry.0.len() < end {
                    entry.0.resize(end, 0);
                }
            }
        }
        Op::Remove(n) => {
            if model.remove(&name(n)).is_some() {
                fs.remove(ROOT, &name(n), false).expect("remove");
            }
        }
        Op::Sync => fs.sync().expect("sync"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]

    /// Random changes on a tiny device: only ENOSPC may fail one, and
    /// what succeeded is there after a remount.
    #[test]
    fn random_ops_on_a_tiny_device(ops in prop::collection::vec(op(), 1..60), mixed in any::<bool>()) {
        let (dev, mut fs) = format(if mixed { 32 * MIB } else { 64 * MIB }, 4096, mixed, default_profile(mixed));
        let mut model = Model::new();
        for (i, op) in ops.iter().enumerate() {
            apply(&fs, &mut model, op, i);
            if i % 20 == 19 {
                fs = reopen(&dev, fs);
                verify(&fs, &model);
            }
        }
        let fs = reopen(&dev, fs);
        verify(&fs, &model);
    }
}

/// A 48 MiB mixed image of `nodesize` tree blocks whose free space is
/// only 12 KiB holes: files of 12 KiB fill it and every other one is
/// deleted.
fn free_space_in_12k_holes(nodesize: u32) -> (Arc<MemDevice>, Fs) {
    let (dev, fs) = format(48 * MIB, nodesize, true, default_profile(true));
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("s{i}").into_bytes();
        let mode = libc::S_IFREG | 0o644;
        let Some(a) = ok_or_full("create", fs.create(ROOT, &name, mode, 0, ME, None)) else {
            break;
        };
        if ok_or_full("write", fs.write(a.ino, 0, &[7u8; 12288])).is_none() {
            break;
        }
        names.push(name);
    }
    fs.sync().expect("sync");
    for name in names.iter().step_by(2) {
        fs.remove(ROOT, name, false).expect("rm");
    }
    fs.sync().expect("sync");
    (dev, fs)
}

/// [`free_space_in_12k_holes`] with 16 KiB tree blocks: no hole holds
/// one. (`canopy mkfs` makes mixed images of 4 KiB tree blocks, where
/// every hole holds one; images made before, and library users, may not.)
fn holes_smaller_than_a_tree_block() -> (Arc<MemDevice>, Fs) {
    free_space_in_12k_holes(16384)
}

/// The campaign's "the commit ran out of space" (issue 36): free bytes
/// in holes smaller than a tree block counted as room for tree blocks, so
/// reservations passed and the allocator then failed, shutting the
/// engine down. Every change must succeed or fail with ENOSPC.
#[test]
fn holes_smaller_than_a_tree_block_are_no_room_for_tree_blocks() {
    let (_dev, fs) = holes_smaller_than_a_tree_block();
    for i in 0..2000u32 {
        let name = format!("n{i}").into_bytes();
        let mode = libc::S_IFREG | 0o644;
        let Some(a) = ok_or_full("create", fs.create(ROOT, &name, mode, 0, ME, None)) else {
            break;
        };
        if ok_or_full("write", fs.write(a.ino, 0, &[9u8; 4096])).is_none() {
            break;
        }
        if ok_or_full("fsync", fs.fsync(a.ino)).is_none() {
            break;
        }
    }
    ok_or_full("final sync", fs.sync());
    let down = fs.engine().shutdown_reason();
    assert!(down.is_none(), "engine shut down: {down:?}");
}

/// The commit's side of it: data allocations that each passed their
/// reservation cut 4 KiB pieces out of holes a tree block fitted in, and
/// the commit after them found free bytes but no room for a tree block.
#[test]
fn data_allocations_leave_the_commit_room_for_its_tree_blocks() {
    use canopy::txn::Need;
    let (dev, fs) = holes_smaller_than_a_tree_block();
    drop(fs);
    // Early settling off, so only the commit folds.
    let opts = OpenOptions {
        settle_early_at: usize::MAX,
        ..Default::default()
    };
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &opts).expect("open");
    for i in 0..20000u64 {
        // Near addresses all over the device, as files' hints are.
        let hint = (i * 20480) % (48 * MIB);
        let r = e.write(|tx| {
            tx.reserve(&Need::items(canopy::format::tree_id::FS, 0).data(4096))?;
            tx.alloc_data(4096, hint)
        });
        match r {
            Ok(_) => {}
            Err(err) if err.errno() == libc::ENOSPC => break,
            Err(err) => panic!("allocation {i}: {err}"),
        }
    }
    e.commit()
        .expect("the commit after allocations that all passed their reservation");
}

/// A fresh filesystem for a file of many extents, and the empty file
/// "many": 256 MiB compressing every chunk (zstd:1, forced: one extent per
/// 128 KiB) or 64 MiB plain.
fn for_many_extents(compressed: bool) -> (Arc<MemDevice>, Fs, u64) {
    let size = if compressed { 256 * MIB } else { 64 * MIB };
    // One copy of tree blocks: the metadata groups the file's items
    // needed stay after it goes, and a second copy of each would keep
    // its mirror's space from coming back (`every_fill_pattern_with_dup_metadata`
    // fills and empties dup images).
    let (dev, fs) = format(size, 4096, false, Profile::Single);
    if compressed {
        fs.set_compression(canopy::compress::Policy {
            codec: Some(canopy::compress::Codec::Zstd(1)),
            force: true,
        });
    }
    let f = fs
        .create(ROOT, b"many", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create")
        .ino;
    (dev, fs, f)
}

/// A file of thousands of extents (compressed chunks, or sparse 4 KiB
/// writes) written until the disk is full: unlinking it, and releasing
/// the last handle of such a file unlinked while open, work on the full
/// disk (the extents go in bounded steps), the image checks clean, and the
/// space comes back.
#[test]
fn files_of_many_extents_are_deleted_on_a_full_disk() {
    for (compressed, open) in [(true, false), (false, false), (false, true)] {
        let (dev, fs, f) = for_many_extents(compressed);
        let free_before = fs.statfs().free;
        let page = vec![0x5au8; 4096];
        let mut extents = 0u64;
        for i in 0.. {
            // Compressed: 128 KiB chunks of one byte, a sector each on
            // disk; plain: every other sector, an extent each.
            let r = if compressed {
                fs.write(f, i * MIB, &vec![i as u8; MIB as usize])
            } else {
                fs.write(f, i * 8192, &page)
            };
            match r {
                Ok(_) => extents += 1,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    break;
                }
            }
            if i % 64 == 63 {
                if let Err(e) = fs.sync() {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    break;
                }
            }
        }
        assert!(extents > 2000, "{extents} extents");
        let _ = fs.sync();
        if open {
            fs.open(f);
        }
        if compressed {
            let cut = canopy::fs::SetAttr {
                size: Some(4096),
                ..Default::default()
            };
            fs.setattr(f, &cut).expect("truncate on a full disk");
        }
        fs.remove(ROOT, b"many", false)
            .expect("unlink on a full disk");
        if open {
            fs.release(f).expect("last release on a full disk");
        }
        let fs = reopen(&dev, fs);
        assert!(
            fs.statfs().free + 64 >= free_before,
            "space came back: {} of {free_before}",
            fs.statfs().free
        );
        drop(fs);
    }
}

/// A file of thousands of extents (compressed chunks, or every other
/// sector) written until the disk is full: punching a hole over almost all
/// of it works on the full disk (the extents go in bounded steps), the
/// hole reads as zeros and the bytes around it are kept, the image checks
/// clean, and the space comes back.
#[test]
fn holes_are_punched_on_a_full_disk() {
    for compressed in [true, false] {
        let (dev, fs, f) = for_many_extents(compressed);
        let free_before = fs.statfs().free;
        let (step, piece) = if compressed { (MIB, MIB) } else { (8192, 4096) };
        let mut written = 0u64;
        for i in 0.. {
            let data = vec![(i % 251 + 1) as u8; piece as usize];
            if ok_or_full("write", fs.write(f, i * step, &data)).is_none() {
                break;
            }
            written = i + 1;
            if i % 64 == 63 && ok_or_full("sync", fs.sync()).is_none() {
                break;
            }
        }
        assert!(written > 2000, "{written} pieces");
        let _ = fs.sync();
        let end = (written - 1) * step + piece;
        // From the middle of the first piece to the middle of the last.
        let (from, to) = (piece / 2 + 100, end - piece / 2 - 100);
        fs.fallocate(
            f,
            from,
            to - from,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .expect("punch on a full disk");
        let fs = reopen(&dev, fs);
        assert!(
            fs.statfs().free + 64 >= free_before,
            "space came back: {} of {free_before}",
            fs.statfs().free
        );
        let head = fs.read(f, 0, (from + 8) as u32).expect("read head");
        assert!(head[..from as usize].iter().all(|&b| b == 1));
        assert_eq!(&head[from as usize..], &[0u8; 8]);
        let mid = fs.read(f, end / 2, 1 << 16).expect("read middle");
        assert!(mid.iter().all(|&b| b == 0), "the hole reads as zeros");
        let tail = fs
            .read(f, to - 8, (end - to + 8) as u32)
            .expect("read tail");
        assert_eq!(&tail[..8], &[0u8; 8]);
        let last = ((written - 1) % 251 + 1) as u8;
        assert!(
            tail[8..].iter().all(|&b| b == last),
            "bytes after the hole kept"
        );
    }
}
