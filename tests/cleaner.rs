//! The cleaner that frees deleted subvolumes: deletion returns after one
//! short commit, the blocks come back over several bounded commits, the
//! queue survives unmount and crash (at every prefix of the writes), and
//! `check` understands a half-cleaned image.

mod common;

use canopy::dev::Device;
use canopy::format::superblock::INCOMPAT_DROP_QUEUE;
use canopy::fs::Fs;
use canopy::{Engine, OpenOptions};
use common::paths::{at, file, read_all, ME};
use std::sync::Arc;

const ROOT: u64 = 256;
/// Tree blocks the other trees (extent, checksum, free space, root) may
/// end up larger than before the subvolume existed.
const SLACK_BYTES: u64 = 32 * 4096;

fn used(fs: &Fs) -> u64 {
    fs.engine().space().0
}

fn content(i: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 4096 + (i % 3) * 4096];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// A subvolume `name` of `files` small files in a few directories, each
/// with its own data extent: enough that dropping it is many times one
/// cleaner step's budget.
fn populate(fs: &Fs, name: &str, files: usize) {
    let sv = fs
        .create_subvolume(ROOT, name.as_bytes(), ME)
        .expect("subvolume");
    let mut dirs = Vec::new();
    for d in 0..8 {
        let a = fs
            .create(
                sv.ino,
                format!("d{d}").as_bytes(),
                libc::S_IFDIR | 0o755,
                0,
                ME,
                None,
            )
            .expect("mkdir");
        dirs.push(a.ino);
    }
    for i in 0..files {
        file(fs, dirs[i % dirs.len()], &format!("f{i}"), &content(i));
    }
    fs.sync().expect("sync");
}

fn verify_files(fs: &Fs, name: &str, files: usize) {
    for i in (0..files).step_by(37) {
        let node = at(fs, &format!("{name}/d{}/f{i}", i % 8)).expect("file");
        assert_eq!(read_all(fs, node), content(i), "{name} file {i}");
    }
}

fn open(dev: Arc<dyn Device>) -> Fs {
    let e = Engine::open(dev, &OpenOptions::default()).expect("open");
    Fs::new(Arc::new(e)).expect("fs")
}

fn incompat(dev: &dyn Device) -> u64 {
    canopy::txn::read_best_superblock(dev)
        .expect("superblock")
        .incompat
}

#[test]
fn a_deleted_subvolume_is_freed_in_bounded_steps() {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    populate(&fs, "keep", 300);
    let before = used(&fs);
    populate(&fs, "big", 3000);
    let full = used(&fs);
    fs.delete_subvolume(ROOT, b"big").expect("delete");
    assert!(at(&fs, "big").is_err(), "gone from the namespace at once");
    assert!(fs.queued_drops() > 0, "the tree waits for the cleaner");
    assert!(
        used(&fs) + (full - before) / 2 > full,
        "deleting did not free the tree in its own commit"
    );
    assert_ne!(incompat(dev.as_ref()) & INCOMPAT_DROP_QUEUE, 0);
    common::assert_fs_clean(&dev);
    let mut steps = 0;
    let mut last = used(&fs);
    while fs.clean_step().expect("step") > 0 {
        steps += 1;
        let now = used(&fs);
        assert!(
            now <= last + 4 * 4096,
            "a step gave space back: {last} -> {now}"
        );
        last = now;
        if steps % 4 == 0 {
            common::assert_fs_clean(&dev);
        }
    }
    assert!(
        steps >= 2,
        "freed in several bounded steps, not one: {steps}"
    );
    assert_eq!(fs.queued_drops(), 0);
    assert!(
        used(&fs) <= before + SLACK_BYTES,
        "all space back: {} used, {before} before",
        used(&fs)
    );
    assert_eq!(incompat(dev.as_ref()) & INCOMPAT_DROP_QUEUE, 0);
    verify_files(&fs, "keep", 300);
    drop(fs);
    common::assert_fs_clean(&dev);
}

/// A snapshot shares its source's blocks: deleting it frees only what it
/// changed, and the source stays whole.
#[test]
fn deleting_a_snapshot_frees_only_what_it_owned() {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    populate(&fs, "src", 1500);
    let sv = at(&fs, "src").expect("src");
    fs.snapshot(sv, ROOT, b"snap", false).expect("snapshot");
    let shared = used(&fs);
    for i in (0..1500).step_by(50) {
        let node = at(&fs, &format!("snap/d{}/f{i}", i % 8)).expect("file");
        fs.write(node, 0, b"changed in the snapshot")
            .expect("write");
    }
    fs.sync().expect("sync");
    fs.delete_subvolume(ROOT, b"snap").expect("delete");
    fs.clean_deleted().expect("clean");
    assert_eq!(fs.queued_drops(), 0);
    assert!(
        used(&fs) <= shared + SLACK_BYTES,
        "what the snapshot owned came back: {} used, {shared} with it unchanged",
        used(&fs)
    );
    verify_files(&fs, "src", 1500);
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn an_interrupted_cleaner_carries_on_after_remount() {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let before = used(&fs);
    populate(&fs, "big", 2000);
    fs.delete_subvolume(ROOT, b"big").expect("delete");
    fs.clean_step().expect("one step");
    fs.clean_step().expect("two steps");
    let left = fs.queued_drops();
    assert!(left > 0);
    drop(fs);
    common::assert_fs_clean(&dev);
    assert_ne!(incompat(dev.as_ref()) & INCOMPAT_DROP_QUEUE, 0);
    let fs = open(dev.clone() as Arc<dyn Device>);
    assert_eq!(fs.queued_drops(), left, "the queue is durable");
    fs.clean_deleted().expect("clean");
    assert_eq!(fs.queued_drops(), 0);
    assert!(used(&fs) <= before + SLACK_BYTES);
    drop(fs);
    common::assert_fs_clean(&dev);
    assert_eq!(incompat(dev.as_ref()) & INCOMPAT_DROP_QUEUE, 0);
}

/// A crash at any write of a deletion and of the cleaner's steps: every
/// image mounts, checks clean, keeps the other subvolume and the
/// snapshot whole, and the next cleaner gives all the space back.
#[test]
fn the_cleaner_survives_a_crash_at_any_point() {
    use canopy::dev::crash::{RecordingDevice, Replayer};
    let (base_dev, e) = common::mem_engine(96 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    populate(&fs, "keep", 40);
    let baseline = used(&fs);
    populate(&fs, "big", 700);
    let big = at(&fs, "big").expect("big");
    fs.snapshot(big, ROOT, b"snap", true).expect("snapshot");
    for i in (0..700).step_by(7) {
        let node = at(&fs, &format!("big/d{}/f{i}", i % 8)).expect("file");
        fs.write(node, 0, b"changed after the snapshot")
            .expect("write");
    }
    fs.sync().expect("sync");
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let fs = open(rec.clone() as Arc<dyn Device>);
    fs.delete_subvolume(ROOT, b"big").expect("delete big");
    let deleted = rec.op_count();
    fs.clean_deleted().expect("clean big");
    fs.delete_subvolume(ROOT, b"snap").expect("delete snap");
    fs.clean_deleted().expect("clean snap");
    let done = rec.op_count();
    assert!(used(&fs) <= baseline + SLACK_BYTES);
    let ops = rec.ops();
    drop(fs);
    let mut rp = Replayer::new(base, ops);
    // Many crash points (408 writes when copied tree blocks went near
    // their old place; about 230 since they go near their parent, where
    // the commit joins more of them into one write).
    assert!(done > 150, "the cleaning took many steps: {done} writes");
    for prefix in 0..=done {
        let dev: Arc<dyn Device> = Arc::new(rp.at(prefix, &|_| prefix % 2 == 0));
        let fs = open(dev.clone());
        verify_files(&fs, "keep", 40);
        if let Ok(snap) = at(&fs, "snap") {
            for i in (0..700).step_by(29) {
                let node = fs
                    .lookup(
                        fs.lookup(snap, format!("d{}", i % 8).as_bytes())
                            .expect("dir")
                            .ino,
                        format!("f{i}").as_bytes(),
                    )
                    .expect("file")
                    .ino;
                assert_eq!(
                    read_all(&fs, node),
                    content(i),
                    "prefix {prefix}: snapshot file {i}"
                );
            }
        }
        if prefix >= deleted {
            assert!(
                at(&fs, "big").is_err(),
                "prefix {prefix}: the deletion was durable"
            );
        }
        drop(fs);
        let r = canopy::check::check_all(dev.clone(), &|_, _| {}).expect("check ran");
        assert!(r.is_clean(), "prefix {prefix}: {:#?}", r.problems);
        let fs = open(dev.clone());
        let _ = fs.delete_subvolume(ROOT, b"big");
        let _ = fs.delete_subvolume(ROOT, b"snap");
        fs.clean_deleted().expect("clean after the crash");
        assert!(
            used(&fs) <= baseline + SLACK_BYTES,
            "prefix {prefix}: {} used, {baseline} at the start",
            used(&fs)
        );
        drop(fs);
        let r = canopy::check::check_all(dev, &|_, _| {}).expect("check ran");
        assert!(
            r.is_clean(),
            "prefix {prefix} after cleaning: {:#?}",
            r.problems
        );
    }
}

/// A crafted queue item naming a block a tree still uses: the cleaner
/// refuses it before changing anything (the engine stays up, nothing is
/// freed), and `check` names the damage.
#[test]
fn a_queue_item_naming_a_live_block_is_refused() {
    use canopy::format::items::DroppedBlock;
    use canopy::format::key_type::DROPPED_BLOCK;
    use canopy::format::{tree_id, Key, DROP_QUEUE_OBJECTID};
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    populate(&fs, "sv", 50);
    let e = fs.engine().clone();
    let root = e.read(|r| r.root(tree_id::FS)).expect("root of tree 5");
    e.write(|tx| {
        let item = DroppedBlock {
            generation: root.generation,
            owner: tree_id::FS,
            level: root.level,
            next: 0,
        };
        tx.insert(
            tree_id::ROOT,
            Key::new(DROP_QUEUE_OBJECTID, DROPPED_BLOCK, root.bytenr),
            item.encode(),
        )
    })
    .expect("craft");
    drop(e);
    fs.sync().expect("sync");
    drop(fs);
    let r = canopy::check::check_all(dev.clone(), &|_, _| {}).expect("check ran");
    assert!(
        r.problems.iter().any(|p| p.message.contains("queued")),
        "{:#?}",
        r.problems
    );
    let fs = open(dev.clone() as Arc<dyn Device>);
    assert_eq!(fs.queued_drops(), 1);
    let err = fs.clean_step().expect_err("refused");
    assert!(err.to_string().contains("still in use"), "{err}");
    assert!(fs.engine().shutdown_reason().is_none());
    verify_files(&fs, "sv", 50);
    assert!(fs.readdir(fs.root_node(), 0, usize::MAX).is_ok());
}
