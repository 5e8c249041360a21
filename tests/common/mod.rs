//! Helpers shared by the integration tests.
#![allow(dead_code)]

use canopy::dev::{Device, MemDevice};
use canopy::{Engine, FormatOptions, OpenOptions};
use std::sync::Arc;

pub fn mem_engine(size: u64, nodesize: u32) -> (Arc<MemDevice>, Engine) {
    let dev = Arc::new(MemDevice::new(size));
    let opts = FormatOptions {
        nodesize,
        fsid: Some([0x42; 16]),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, e)
}

/// Damages the image with `f` in one committed transaction, as a bug in
/// the engine would.
pub fn damage(dev: &Arc<MemDevice>, f: impl FnOnce(&mut canopy::txn::Txn<'_>)) {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    e.write(|tx| {
        f(tx);
        Ok(())
    })
    .unwrap();
    e.commit().unwrap();
}

/// Runs `canopy::check`'s structural passes (trees, references, space)
/// and panics with the problems if any. For engine-level workloads,
/// whose items have no inodes; images made through `fs` take
/// [`assert_posix_clean`].
pub fn assert_clean(dev: &dyn Device) {
    let r = canopy::check::check(dev, &|_, _| {}).expect("check ran");
    assert!(r.is_clean(), "check found problems: {:#?}", r.problems);
}

/// [`assert_clean`] with every pass `canopy check` runs: besides the
/// trees and references, what the filesystem layer keeps (link counts,
/// nbytes, names, checksum coverage, quotas), through the engine. For
/// images made through `fs`; a workload that writes tree items through
/// the engine alone has no inodes for its items. Checks a copy, so the
/// device stays as it is.
pub fn assert_posix_clean(dev: &dyn Device) {
    let mut bytes = vec![0u8; dev.size() as usize];
    dev.read_at(&mut bytes, 0).expect("read the image");
    assert_posix_clean_in_place(Arc::new(MemDevice::from_bytes(bytes)));
}

/// [`assert_posix_clean`] of a device the caller holds an `Arc` of,
/// checked where it is: crash tests check hundreds of replayed images of
/// 256 MiB, and copying each first was most of their time. Check opens
/// the image read-only; the view refuses writes, so a check that tried
/// one would fail instead of changing the caller's device.
pub fn assert_posix_clean_in_place(dev: Arc<dyn Device>) {
    let r = canopy::check::check_all(read_only(dev), &|_, _| {}).expect("check ran");
    assert!(r.is_clean(), "check found problems: {:#?}", r.problems);
}

/// `dev` seen through reads alone: writes and barriers fail. For checks
/// of an image the test goes on using, without copying it first.
pub fn read_only(dev: Arc<dyn Device>) -> Arc<dyn Device> {
    Arc::new(ReadOnlyView(dev))
}

struct ReadOnlyView(Arc<dyn Device>);

impl Device for ReadOnlyView {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&self, _buf: &[u8], offset: u64) -> canopy::Result<()> {
        Err(canopy::Error::Invalid(format!(
            "check wrote at {offset} of an image it should only read"
        )))
    }

    fn barrier(&self) -> canopy::Result<()> {
        Err(canopy::Error::Invalid(
            "check asked a read-only image for a barrier".into(),
        ))
    }

    fn size(&self) -> u64 {
        self.0.size()
    }
}

/// Requires every quota group's recorded numbers to equal a count from
/// scratch; `context` says where in the test.
pub fn assert_quota_exact(fs: &canopy::fs::Fs, context: &str) {
    let diff = fs
        .engine()
        .read(canopy::qgroup::differences)
        .expect("quota count from scratch");
    assert!(diff.is_empty(), "{context}: accounting differs: {diff:#?}");
}

/// [`assert_posix_clean`] for an image in memory.
pub fn assert_fs_clean(dev: &canopy::dev::MemDevice) {
    assert_posix_clean(dev);
}
/// Commits, checks the image, and opens it again.
pub fn reopen(dev: &Arc<MemDevice>, fs: canopy::fs::Fs) -> canopy::fs::Fs {
    fs.sync().expect("sync");
    drop(fs);
    assert_fs_clean(dev);
    let e = Engine::open(
        dev.clone() as Arc<dyn Device>,
        &canopy::OpenOptions::default(),
    )
    .expect("open");
    canopy::fs::Fs::new(Arc::new(e)).expect("fs")
}

pub mod guard;
pub mod images;
pub mod model;
pub mod mounted;
pub mod multi;
pub mod paths;
pub mod tree;

/// Decides whether a test that needs something from the machine runs.
/// If `available`, it does. If not, the test is recorded as skipped in
/// `target/tmp/skipped-tests.txt` (scripts/test.sh lists those in its
/// summary) and passes without running, unless `CANOPY_REQUIRE_ALL=1`
/// (set by CI, which is root with /dev/fuse) demands that it run: then it
/// fails.
pub fn require(available: bool, why: &str) -> bool {
    if available {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    if std::env::var("CANOPY_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{test} cannot run here and CANOPY_REQUIRE_ALL=1: {why}");
    }
    let bin = std::env::args().next().unwrap_or_default();
    let bin = std::path::Path::new(&bin)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let line = format!("{bin}: {test}: {why}\n");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = f.write_all(line.as_bytes());
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// A small deterministic xorshift generator for workloads.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Bytes that do not compress (tests that count space write these, so
/// they hold under `compress=` too).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The roots of the fsync log a crashed image's superblock leads to,
/// newest last: through its chain, or named in it directly (older
/// images, and a log commits carry on until replay).
#[allow(dead_code)]
pub fn log_roots(dev: &dyn Device) -> Vec<u64> {
    let sb = canopy::txn::read_best_superblock(dev).expect("superblock");
    if sb.log_root != 0 {
        return [sb.log_prev_root, sb.log_root]
            .into_iter()
            .filter(|&r| r != 0)
            .collect();
    }
    canopy::txn::read_chain(dev, &sb)
        .iter()
        .map(|l| l.root)
        .collect()
}

/// The newest root of the fsync log a crashed image leads to (see
/// [`log_roots`]); 0 for none.
#[allow(dead_code)]
pub fn last_log_root(dev: &dyn Device) -> u64 {
    log_roots(dev).last().copied().unwrap_or(0)
}
