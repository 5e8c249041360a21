//! Balance below the mount: every chosen group is emptied while
//! snapshots keep sharing (used bytes, quota numbers and every file's
//! bytes identical before and after), under concurrent writes, resumed
//! after an unmount, paused and cancelled, and after a crash at any
//! point of its writes.

mod common;

use canopy::balance::{BalanceArgs, Filter, Step};
use canopy::dev::{Device, MemDevice};
use canopy::format::items::FileExtentItem;
use canopy::format::{key_type, tree_id};
use canopy::fs::{BalanceState, Fs, QgroupRow, QuotaChange};
use canopy::{Engine, FormatOptions, Key, OpenOptions};
use common::paths::{at, file, read_all, ME};
use std::collections::BTreeMap;
use std::sync::Arc;

const ROOT: u64 = 256;

fn content(i: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 4096 * (1 + i % 5)];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// An image of `mib` MiB, mixed groups or not.
fn fresh(mib: u64, mixed: bool) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(mib << 20));
    let opts = FormatOptions {
        nodesize: 4096,
        mixed: Some(mixed),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

fn open(dev: Arc<dyn Device>) -> Fs {
    let e = Engine::open(dev, &OpenOptions::default()).expect("open");
    Fs::new(Arc::new(e)).expect("fs")
}

/// A subvolume of `files` files, two snapshots of it with a few files
/// changed in each, quotas on.
fn populate(fs: &Fs, files: usize) {
    fs.quota(QuotaChange::Enable).expect("quota");
    let sv = fs.create_subvolume(ROOT, b"data", ME).expect("subvolume");
    for i in 0..files {
        file(fs, sv.ino, &format!("f{i}"), &content(i));
    }
    for s in 0..2 {
        let name = format!("snap{s}");
        fs.snapshot(sv.ino, ROOT, name.as_bytes(), false)
            .expect("snapshot");
        let snap = at(fs, &name).expect("snapshot");
        for i in (s..files).step_by(40) {
            let node = fs.lookup(snap, format!("f{i}").as_bytes()).expect("f").ino;
            fs.write(node, 0, b"changed in the snapshot")
                .expect("write");
        }
    }
    fs.sync().expect("sync");
}

/// Every file of every subvolume, by path.
fn contents(fs: &Fs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for dir in ["data", "snap0", "snap1"] {
        let d = at(fs, dir).expect("dir");
        for (_, ino, _, name) in fs.readdir(d, 0, usize::MAX).expect("readdir") {
            let name = String::from_utf8_lossy(&name).into_owned();
            if name == "." || name == ".." {
                continue;
            }
            out.insert(format!("{dir}/{name}"), read_all(fs, ino));
        }
    }
    out
}

fn qgroups(fs: &Fs) -> Vec<QgroupRow> {
    fs.qgroup_show().expect("qgroups")
}

fn used(fs: &Fs) -> u64 {
    fs.engine().space().0
}

fn assert_quota_exact(fs: &Fs) {
    common::assert_quota_exact(fs, "after the balance");
}

fn balance_everything(mixed: bool) {
    balance_everything_with(mixed, canopy::compress::Policy::default());
}

fn balance_everything_with(mixed: bool, compression: canopy::compress::Policy) {
    let (dev, fs) = fresh(256, mixed);
    fs.set_compression(compression);
    populate(&fs, 300);
    let compressed = compressed_bytes(&fs);
    if compression.codec.is_some() {
        assert!(compressed > 0, "the files compressed");
    }
    let (files, groups, before) = (contents(&fs), qgroups(&fs), used(&fs));
    let n = fs.balance_start(BalanceArgs::all()).expect("start");
    assert!(n > 0);
    let st = fs.balance_wait();
    assert_eq!(st.state, BalanceState::Finished, "{st:?}");
    assert_eq!(st.groups_left, 0);
    assert!(st.bytes_moved > 0 && st.extents_moved > 0, "{st:?}");
    fs.sync().expect("sync");
    assert_eq!(contents(&fs), files, "file contents moved intact");
    assert_quota_exact(&fs);
    assert_eq!(qgroups(&fs), groups, "quota numbers did not move");
    assert_eq!(
        compressed_bytes(&fs),
        compressed,
        "compressed extents moved as they are"
    );
    // Nothing unshared, and the extent and checksum trees repacked after
    // the moves' back-references and checksums were rewritten: used bytes
    // do not grow, but for one block per repacked tree (the commit after
    // the last repack step may split a leaf the repack filled to the
    // brim). Unsharing any of the 300 files would cost far more.
    let after = used(&fs);
    let slack = canopy::balance::REPACKED.len() as u64 * 4096;
    assert!(
        after <= before + slack,
        "used {before} before, {after} after: something was unshared"
    );
    drop(fs);
    common::assert_fs_clean(&dev);
}

/// Bytes on disk of compressed extents in the whole pool.
fn compressed_bytes(fs: &Fs) -> u64 {
    let report = fs.compsize(fs.root_node()).expect("compsize");
    report
        .kinds
        .iter()
        .filter(|r| r.kind == "zstd" || r.kind == "lz4")
        .map(|r| r.disk)
        .sum()
}

/// Compressed extents move whole, keep their checksums and sharing, and
/// quota groups (counting bytes on disk) stay exact.
#[test]
fn balance_keeps_compressed_extents_and_quotas() {
    let zstd = canopy::compress::Policy {
        codec: Some(canopy::compress::Codec::Zstd(3)),
        force: false,
    };
    balance_everything_with(false, zstd);
}

#[test]
fn balance_empties_groups_and_keeps_sharing_mixed() {
    balance_everything(true);
}

#[test]
fn balance_empties_groups_and_keeps_sharing_split() {
    balance_everything(false);
}

/// Relocation changes no ownership, so subvolumes at their quota limits
/// do not stop a balance (each step reserves its data rewrites, which
/// must not count against limits); writes to them still fail.
#[test]
fn subvolumes_at_their_limits_do_not_stop_a_balance() {
    let (dev, fs) = fresh(256, false);
    populate(&fs, 300);
    for name in ["data", "snap0", "snap1"] {
        let qgroupid = fs
            .qgroup_of_node(at(&fs, name).expect("subvolume"))
            .expect("qgroup");
        let row = qgroups(&fs)
            .into_iter()
            .find(|r| r.path.as_deref() == Some(name))
            .expect("its group");
        for (exclusive, bytes) in [(false, row.referenced), (true, row.exclusive)] {
            fs.quota(QuotaChange::Limit {
                qgroupid,
                bytes: Some(bytes),
                exclusive,
            })
            .expect("limit");
        }
    }
    let data = at(&fs, "data").expect("data");
    fs.sync().expect("sync");
    let (files, groups) = (contents(&fs), qgroups(&fs));
    fs.balance_start(BalanceArgs::all()).expect("start");
    let st = fs.balance_wait();
    assert_eq!(st.state, BalanceState::Finished, "{st:?}");
    assert!(st.bytes_moved > 0, "{st:?}");
    assert_eq!(contents(&fs), files);
    assert_eq!(qgroups(&fs), groups, "quota numbers did not move");
    assert_quota_exact(&fs);
    let f = file(&fs, data, "small", b"");
    assert_eq!(
        fs.write(f, 0, &[1u8; 65536]).map_err(|e| e.errno()),
        Err(libc::EDQUOT),
        "the limit still holds"
    );
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn balance_under_concurrent_writes() {
    let (dev, fs) = fresh(256, false);
    populate(&fs, 200);
    let fs = Arc::new(fs);
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let d = at(&fs, "data").expect("data");
            for i in 0..300 {
                file(&fs, d, &format!("new{i}"), &content(i + 7));
                if i % 50 == 0 {
                    fs.sync().expect("sync");
                }
            }
        })
    };
    fs.balance_start(BalanceArgs::all()).expect("start");
    let st = fs.balance_wait();
    writer.join().expect("writer");
    assert_eq!(st.state, BalanceState::Finished, "{st:?}");
    fs.sync().expect("sync");
    let d = at(&fs, "data").expect("data");
    for i in 0..300 {
        let node = fs.lookup(d, format!("new{i}").as_bytes()).expect("new").ino;
        assert_eq!(read_all(&fs, node), content(i + 7));
    }
    assert_quota_exact(&fs);
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn a_paused_balance_survives_remount_and_cancel_forgets_it() {
    let (dev, fs) = fresh(256, false);
    populate(&fs, 300);
    let files = contents(&fs);
    // Only data groups under 100% use: data and metadata filters apart.
    let args = BalanceArgs {
        data: Filter::UsageBelow(100),
        metadata: Filter::Skip,
        ..Default::default()
    };
    fs.balance_start(args).expect("start");
    fs.balance_pause().expect("pause");
    assert_eq!(fs.balance_status().state, BalanceState::Paused);
    fs.sync().expect("sync");
    drop(fs);
    let fs = open(dev.clone() as Arc<dyn Device>);
    let st = fs.balance_status();
    assert_eq!(st.state, BalanceState::Paused, "{st:?}");
    assert_eq!(st.args, Some(args));
    // A second balance is refused while one is recorded.
    assert_eq!(
        fs.balance_start(BalanceArgs::all()).unwrap_err().errno(),
        libc::EINPROGRESS
    );
    fs.balance_resume().expect("resume");
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    assert_eq!(contents(&fs), files);
    // Start and cancel: nothing recorded any more, writes go anywhere.
    fs.balance_start(BalanceArgs::all()).expect("start again");
    fs.balance_cancel().expect("cancel");
    assert_eq!(fs.balance_status().state, BalanceState::Cancelled);
    file(&fs, at(&fs, "data").expect("data"), "after", &content(3));
    drop(fs);
    let fs = open(dev.clone() as Arc<dyn Device>);
    assert_eq!(fs.balance_status().state, BalanceState::Idle);
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn an_unmounted_balance_carries_on_at_mount() {
    let (dev, fs) = fresh(256, true);
    populate(&fs, 300);
    let files = contents(&fs);
    fs.balance_start(BalanceArgs::all()).expect("start");
    // Unmount at once: the thread stops, the balance stays recorded.
    drop(fs);
    let fs = open(dev.clone() as Arc<dyn Device>);
    fs.balance_resume_if_recorded().expect("resume at mount");
    let st = fs.balance_wait();
    assert!(matches!(st.state, BalanceState::Finished), "{st:?}");
    assert_eq!(contents(&fs), files);
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn balance_survives_a_crash_at_any_point() {
    use canopy::dev::crash::{RecordingDevice, Replayer};
    let (base_dev, fs) = fresh(128, true);
    populate(&fs, 120);
    let files = contents(&fs);
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let fs = open(rec.clone() as Arc<dyn Device>);
    fs.balance_start(BalanceArgs::all()).expect("start");
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.sync().expect("sync");
    let done = rec.op_count();
    let ops = rec.ops();
    drop(fs);
    let mut rp = Replayer::new(base, ops);
    assert!(done > 20, "balance wrote in several commits: {done} writes");
    for prefix in (0..=done).step_by(3) {
        let dev: Arc<dyn Device> = Arc::new(rp.at(prefix, &|_| prefix % 2 == 0));
        let r = canopy::check::check_all(dev.clone(), &|_, _| {}).expect("check ran");
        assert!(r.is_clean(), "prefix {prefix}: {:#?}", r.problems);
        let fs = open(dev.clone());
        assert_eq!(contents(&fs), files, "prefix {prefix}");
        // Whatever was left carries on and ends.
        fs.balance_resume_if_recorded().expect("resume");
        let st = fs.balance_wait();
        assert!(
            matches!(st.state, BalanceState::Finished | BalanceState::Idle),
            "prefix {prefix}: {st:?}"
        );
        assert_eq!(contents(&fs), files, "prefix {prefix} after the balance");
        drop(fs);
        let r = canopy::check::check_all(dev, &|_, _| {}).expect("check ran");
        assert!(r.is_clean(), "prefix {prefix} after: {:#?}", r.problems);
    }
}

/// Moving tree blocks rewrites their back-references all over the extent
/// tree (seed 000's 16 snapshots of many small files, 3 changed in each):
/// without the repack after the moves, its leaves end part-empty and used
/// bytes grow by a few dozen blocks.
#[test]
fn metadata_balance_does_not_grow_used_space() {
    let (dev, fs) = fresh(256, false);
    fs.quota(QuotaChange::Enable).expect("quota");
    let sv = fs.create_subvolume(ROOT, b"data", ME).expect("subvolume");
    const FILES: usize = 20000;
    for i in 0..FILES {
        file(&fs, sv.ino, &format!("f{i}"), b"x");
    }
    fs.sync().expect("sync");
    for s in 0..16 {
        fs.snapshot(sv.ino, ROOT, format!("snap{s}").as_bytes(), false)
            .expect("snapshot");
        for i in [s * 7, s * 13 + FILES / 3, s * 17 + FILES * 2 / 3] {
            let node = fs.lookup(sv.ino, format!("f{i}").as_bytes()).expect("f");
            fs.write(node.ino, 0, b"changed").expect("write");
        }
        fs.sync().expect("sync");
    }
    let (groups, before) = (qgroups(&fs), used(&fs));
    let metadata = BalanceArgs {
        data: Filter::Skip,
        metadata: Filter::All,
        ..Default::default()
    };
    fs.balance_start(metadata).expect("start");
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.sync().expect("sync");
    let after = used(&fs);
    assert!(after <= before, "used {before} before, {after} after");
    assert_eq!(qgroups(&fs), groups, "quota numbers did not move");
    drop(fs);
    common::assert_fs_clean(&dev);
}

/// A balance step folds its own reference changes, but not while a flush
/// has a flight open: the fold frees extents allocated and not yet
/// referenced, and the flight references its extents after the step.
/// (Without the check the commit meets a reference change for an extent
/// the step freed.)
#[test]
fn a_balance_step_leaves_an_open_flights_extents_alone() {
    let (_dev, fs) = fresh(256, false);
    populate(&fs, 100);
    fs.sync().expect("sync");
    let engine = fs.engine();
    engine
        .write(|tx| {
            let data = BalanceArgs {
                data: Filter::All,
                metadata: Filter::Skip,
                ..Default::default()
            };
            canopy::balance::start(tx, data).map(drop)
        })
        .expect("start");
    let (flight, (bytenr, len)) = engine
        .write(|tx| {
            let mut f = tx.start_flight(0);
            let got = tx.alloc_flight_data(&mut f, 4096, 4096, 0)?;
            Ok((f, got))
        })
        .expect("flight");
    let step = engine.write(canopy::balance::step).expect("step");
    assert!(matches!(step, Step::Moved { .. }), "{step:?}");
    engine
        .write(|tx| {
            let item = FileExtentItem::whole(bytenr, len, tx.transid());
            let key = Key::new(1 << 40, key_type::EXTENT_DATA, 0);
            tx.insert(tree_id::FS, key, item.encode())?;
            tx.end_flight(flight)
        })
        .expect("reference the flight's extent");
    engine
        .commit()
        .expect("the commit finds the flight's extent referenced");
}

/// Converting tree blocks between one and two copies moves every
/// metadata block (snapshots' shared ones once): files, quota numbers and
/// the accounting stay exact, and each step leaves the image clean.
#[test]
fn converting_profiles_keeps_snapshots_and_quotas_exact() {
    use canopy::format::superblock::Profile;
    let (dev, fs) = fresh(256, false);
    populate(&fs, 300);
    let (files, groups) = (contents(&fs), qgroups(&fs));
    for target in [Profile::Single, Profile::Dup] {
        let args = BalanceArgs {
            data: Filter::Skip,
            metadata: Filter::Skip,
            metadata_convert: Some(target),
            devid: None,
            ..Default::default()
        };
        fs.balance_start(args).expect("start");
        let st = fs.balance_wait();
        assert_eq!(st.state, BalanceState::Finished, "{st:?}");
        fs.sync().expect("sync");
        let mirrored = !fs.engine().mirrors().is_empty();
        assert_eq!(mirrored, target == Profile::Dup, "to {target:?}");
        assert_eq!(contents(&fs), files, "to {target:?}");
        assert_quota_exact(&fs);
        assert_eq!(
            qgroups(&fs),
            groups,
            "to {target:?}: quota numbers did not move"
        );
    }
    drop(fs);
    common::assert_fs_clean(&dev);
}
