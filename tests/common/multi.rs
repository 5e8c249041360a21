//! Filesystems over several in-memory devices, for the tests of
//! devices, replace and redundancy: format, open, a populated tree to
//! read back, and damage to every copy on one device.

use canopy::balance::{BalanceArgs, Filter};
use canopy::dev::{Device, MemDevice};
use canopy::format::superblock::Profile;
use canopy::fs::{BalanceState, Fs, Owner};
use canopy::volume::Chunk;
use canopy::{Engine, FormatOptions, OpenOptions};
use std::sync::Arc;

pub const ME: Owner = Owner { uid: 0, gid: 0 };
pub const ROOT_DIR: u64 = 256;
pub const MIB: u64 = 1 << 20;

pub fn content(i: usize) -> Vec<u8> {
    super::noise(
        if i.is_multiple_of(4) {
            200
        } else {
            7000 + i * 31
        },
        i as u64,
    )
}

pub fn mem_devices(n: usize, size: u64) -> Vec<Arc<MemDevice>> {
    (0..n).map(|_| Arc::new(MemDevice::new(size))).collect()
}

pub fn as_devices(devs: &[Arc<MemDevice>]) -> Vec<Arc<dyn Device>> {
    devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect()
}

pub fn format(devs: &[Arc<MemDevice>], metadata: Profile, data: Profile) -> Engine {
    format_with(devs, metadata, data, false)
}

/// [`format`], with data and tree blocks in mixed groups or not.
pub fn format_with(
    devs: &[Arc<MemDevice>],
    metadata: Profile,
    data: Profile,
    mixed: bool,
) -> Engine {
    let opts = FormatOptions {
        mixed: Some(mixed),
        metadata_profile: Some(metadata),
        data_profile: data,
        ..Default::default()
    };
    Engine::format_devices(as_devices(devs), &opts).unwrap()
}

pub fn open(devs: Vec<Arc<dyn Device>>, read_only: bool, degraded: bool) -> canopy::Result<Engine> {
    let opts = OpenOptions {
        read_only,
        degraded,
        ..Default::default()
    };
    Engine::open_devices(devs, &opts)
}

/// Creates regular file `name` in directory `dir` holding `bytes`;
/// returns its inode.
pub fn write_file(fs: &Fs, dir: u64, name: &str, bytes: &[u8]) -> u64 {
    let mode = libc::S_IFREG | 0o644;
    let a = fs.create(dir, name.as_bytes(), mode, 0, ME, None).unwrap();
    fs.write(a.ino, 0, bytes).unwrap();
    a.ino
}

/// 300 files in 6 directories, committed.
pub fn populate(fs: &Fs) {
    for d in 0..6 {
        let name = format!("d{d}");
        let mode = libc::S_IFDIR | 0o755;
        let dir = fs
            .create(ROOT_DIR, name.as_bytes(), mode, 0, ME, None)
            .unwrap();
        for f in 0..50 {
            let i = d * 50 + f;
            write_file(fs, dir.ino, &format!("f{i}"), &content(i));
        }
    }
    fs.sync().unwrap();
}

/// Reads every file `populate` wrote and compares it.
pub fn verify(fs: &Fs) {
    for d in 0..6 {
        let dir = fs.lookup(ROOT_DIR, format!("d{d}").as_bytes()).unwrap();
        for f in 0..50 {
            let i = d * 50 + f;
            let a = fs.lookup(dir.ino, format!("f{i}").as_bytes()).unwrap();
            let want = content(i);
            let got = fs.read(a.ino, 0, want.len() as u32 + 10).unwrap();
            assert!(got == want, "f{i} reads back different bytes");
        }
    }
}

/// Overwrites every copy that lies on `devid` with garbage (superblock
/// copies, which lie outside every copy, stay).
pub fn wipe_copies_on(devs: &[Arc<MemDevice>], chunks: &[Chunk], devid: u64) {
    let dev = &devs[devid as usize - 1];
    let garbage = vec![0x5au8; MIB as usize];
    for c in chunks {
        for s in c.stripes().filter(|s| s.devid == devid) {
            let mut at = s.offset;
            while at < s.offset + c.stripe_len() {
                let n = (s.offset + c.stripe_len() - at).min(MIB);
                dev.write_at(&garbage[..n as usize], at).unwrap();
                at += n;
            }
        }
    }
}

pub fn check_clean(devs: &[Arc<MemDevice>]) {
    let r = canopy::check::check_all_devices(as_devices(devs), &|_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Converts data and tree blocks to raid1 with a balance, committed,
/// and requires every kind of group to be raid1 after it.
pub fn convert_to_raid1(fs: &Fs) {
    fs.balance_start(BalanceArgs {
        data: Filter::All,
        metadata: Filter::All,
        data_convert: Some(Profile::Raid1),
        metadata_convert: Some(Profile::Raid1),
        devid: None,
    })
    .unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.sync().unwrap();
    for k in fs.engine().usage().kinds {
        assert_eq!(k.profile, "raid1", "{k:?}");
    }
}

/// Big file `i`: noise a little short of 4 MiB, so its extents span many
/// raid10 units and end inside one.
pub fn big(i: usize) -> Vec<u8> {
    super::noise((4 << 20) - 12345, i as u64)
}

/// Writes files `big0` .. under the root (see [`big`]), committed.
pub fn write_big(fs: &Fs, n: usize) {
    for i in 0..n {
        write_file(fs, ROOT_DIR, &format!("big{i}"), &big(i));
    }
    fs.sync().unwrap();
}

/// Reads back the files [`write_big`] wrote.
pub fn verify_big(fs: &Fs, n: usize) {
    for i in 0..n {
        let a = fs.lookup(ROOT_DIR, format!("big{i}").as_bytes()).unwrap();
        let want = big(i);
        let got = fs.read(a.ino, 0, want.len() as u32 + 10).unwrap();
        assert!(got == want, "big{i} reads back different bytes");
    }
}

/// Runs a scrub of the engine to its end and requires it to find
/// nothing it could not mend.
pub fn scrub_finds_nothing_lost(fs: &Fs) {
    let ctl = canopy::scrub::Control::default();
    let pace = canopy::scrub::Pace { throttle: false };
    let r = canopy::scrub::run(fs.engine(), &ctl, pace).unwrap();
    assert!(r.bad_tree_blocks.is_empty() && r.bad_data_sectors.is_empty());
}
