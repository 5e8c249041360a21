//! Subvolumes and snapshots at the Fs layer: one Fs serving many trees,
//! node ids unique across them, snapshots that hold exactly what was
//! written before them, read-only snapshots, links between subvolumes,
//! and `check` clean after each step and after a remount.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::fs::{split_node, Fs, Shown};
use canopy::{Engine, OpenOptions};
use common::paths::{at, file, read_all, ME};
use std::sync::Arc;

const ROOT: u64 = 256;

fn errno(e: canopy::Error) -> i32 {
    e.errno()
}

fn names(fs: &Fs, dir: u64) -> Vec<(String, u64)> {
    fs.readdir(dir, 0, usize::MAX)
        .expect("readdir")
        .into_iter()
        .map(|(_, ino, _, n)| (String::from_utf8_lossy(&n).into_owned(), ino))
        .collect()
}

fn new_fs() -> (Arc<MemDevice>, Fs) {
    let (dev, e) = common::mem_engine(128 << 20, 4096);
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

#[test]
fn a_snapshot_holds_what_was_written_before_it_and_nothing_after() {
    let (dev, fs) = new_fs();
    let sv = fs.create_subvolume(ROOT, b"sv", ME).expect("create");
    assert_eq!(split_node(sv.ino).1, ROOT, "a subvolume shows its root");
    let f = file(&fs, sv.ino, "f", &vec![1u8; 300_000]);
    // Buffered, not flushed: the snapshot must still hold it.
    fs.write(f, 0, b"before").expect("write");
    let snap = fs.snapshot(sv.ino, ROOT, b"snap", false).expect("snapshot");
    fs.write(f, 0, b"AFTER!").expect("write after");
    let g = file(&fs, sv.ino, "g", b"new");
    let sf = fs.lookup(snap.ino, b"f").expect("f in snapshot").ino;
    assert_ne!(sf, f, "a file and its snapshot copy have distinct numbers");
    assert_eq!(&read_all(&fs, sf)[..6], b"before");
    assert_eq!(&read_all(&fs, f)[..6], b"AFTER!");
    assert_eq!(read_all(&fs, g), b"new");
    assert!(fs.lookup(snap.ino, b"g").is_err(), "g came after");
    // Changing the snapshot leaves the source alone.
    fs.write(sf, 100, b"snapwrite")
        .expect("write to a writable snapshot");
    assert_eq!(&read_all(&fs, f)[100..109], &[1u8; 9]);

    let fs = common::reopen(&dev, fs);
    let (sf, f) = (
        at(&fs, "snap/f").expect("snap/f"),
        at(&fs, "sv/f").expect("sv/f"),
    );
    assert_eq!(&read_all(&fs, sf)[..6], b"before");
    assert_eq!(&read_all(&fs, sf)[100..109], b"snapwrite");
    assert_eq!(&read_all(&fs, f)[..6], b"AFTER!");
    let list = fs.list_subvolumes().expect("list");
    let paths: Vec<(&str, u64, Option<u64>)> = list
        .iter()
        .map(|s| (s.path.as_str(), s.parent, s.snapshot_of))
        .collect();
    assert_eq!(paths, vec![("sv", 5, None), ("snap", 5, Some(256))]);
}

#[test]
fn a_read_only_snapshot_refuses_every_change() {
    let (dev, fs) = new_fs();
    let d = fs
        .create(ROOT, b"d", libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("mkdir");
    let f = file(&fs, d.ino, "f", b"data");
    let snap = fs
        .snapshot(fs.root_node(), ROOT, b"ro", true)
        .expect("snap");
    let sd = fs.lookup(snap.ino, b"d").expect("d").ino;
    let sf = fs.lookup(sd, b"f").expect("f").ino;
    let rofs = libc::EROFS;
    assert_eq!(errno(fs.write(sf, 0, b"x").unwrap_err()), rofs);
    let mk = fs.create(sd, b"n", libc::S_IFREG | 0o644, 0, ME, None);
    assert_eq!(errno(mk.unwrap_err()), rofs);
    assert_eq!(errno(fs.remove(sd, b"f", false).unwrap_err()), rofs);
    assert_eq!(
        errno(fs.setxattr(sf, b"user.a", b"1", 0).unwrap_err()),
        rofs
    );
    assert_eq!(errno(fs.check_writable(sf).unwrap_err()), rofs);
    assert_eq!(read_all(&fs, sf), b"data");
    // The source stays writable; switching the flag makes the snapshot so.
    fs.write(f, 0, b"DATA").expect("source write");
    fs.set_subvolume_read_only(snap.ino, false)
        .expect("ro false");
    fs.write(sf, 0, b"snap").expect("now writable");
    fs.set_subvolume_read_only(snap.ino, true).expect("ro true");
    let fs = common::reopen(&dev, fs);
    let sf = at(&fs, "ro/d/f").expect("ro/d/f");
    assert_eq!(
        errno(fs.write(sf, 0, b"x").unwrap_err()),
        rofs,
        "kept across mounts"
    );
    assert_eq!(read_all(&fs, sf), b"snap");
    assert_eq!(read_all(&fs, at(&fs, "d/f").expect("d/f")), b"DATA");
}

#[test]
fn links_between_subvolumes_and_their_limits() {
    let (dev, fs) = new_fs();
    let a = fs.create_subvolume(ROOT, b"a", ME).expect("a");
    let b = fs.create_subvolume(ROOT, b"b", ME).expect("b");
    let f = file(&fs, a.ino, "f", &vec![7u8; 64 << 10]);
    let xdev = libc::EXDEV;
    assert_eq!(errno(fs.link(f, b.ino, b"f").unwrap_err()), xdev);
    let mv = fs.rename(a.ino, b"f", b.ino, b"f", false, false);
    assert_eq!(errno(mv.unwrap_err()), xdev);
    // Reflink across subvolumes: one pool.
    let g = fs
        .create(b.ino, b"g", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("g")
        .ino;
    let before = fs.statfs().free;
    assert_eq!(
        fs.copy_range(f, 0, g, 0, 64 << 10).expect("reflink"),
        64 << 10
    );
    fs.sync().expect("sync");
    assert_eq!(read_all(&fs, g), vec![7u8; 64 << 10]);
    assert!(
        fs.statfs().free + 4 >= before,
        "the extent is shared, not copied"
    );
    // A subvolume is renamed within its parent, and into a directory.
    fs.rename(ROOT, b"a", ROOT, b"a2", false, false)
        .expect("rename");
    let d = fs
        .create(ROOT, b"d", libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("d");
    fs.rename(ROOT, b"b", d.ino, b"b", false, false)
        .expect("move");
    assert_eq!(
        fs.getattr(d.ino).expect("d").nlink,
        3,
        "a subvolume counts as a subdirectory"
    );
    let over = fs.rename(ROOT, b"a2", d.ino, b"b", false, false);
    assert_eq!(errno(over.unwrap_err()), libc::EEXIST, "never replaced");
    let ls = names(&fs, d.ino);
    assert_eq!(ls[2], ("b".into(), b.ino));
    assert_eq!(ls[1].1, ROOT, "..");
    assert_eq!(
        names(&fs, b.ino)[1].1,
        d.ino,
        ".. of a subvolume is its directory"
    );
    // unlink and rmdir of a subvolume link.
    assert_eq!(
        errno(fs.remove(ROOT, b"a2", false).unwrap_err()),
        libc::EISDIR
    );
    let full = fs.remove(ROOT, b"a2", true);
    assert_eq!(errno(full.unwrap_err()), libc::ENOTEMPTY);
    let fs = common::reopen(&dev, fs);
    let d = at(&fs, "d").expect("d");
    fs.remove(d, b"b", true).expect_err("b holds g");
    fs.remove(at(&fs, "d/b").expect("b"), b"g", false)
        .expect("rm g");
    fs.remove(d, b"b", true)
        .expect("rmdir of an empty subvolume");
    assert!(at(&fs, "d/b").is_err());
    fs.delete_subvolume(fs.root_node(), b"a2")
        .expect("delete a full one");
    assert!(fs.list_subvolumes().expect("list").is_empty());
    drop(common::reopen(&dev, fs));
}

#[test]
fn nested_subvolumes_default_and_mounting_one() {
    let (dev, fs) = new_fs();
    let outer = fs.create_subvolume(ROOT, b"outer", ME).expect("outer");
    let d = fs
        .create(outer.ino, b"d", libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("d");
    let inner = fs.create_subvolume(d.ino, b"inner", ME).expect("inner");
    file(&fs, inner.ino, "f", b"deep");
    let info = fs
        .list_subvolumes()
        .expect("list")
        .into_iter()
        .find(|s| s.path == "outer/d/inner")
        .expect("inner listed with its path");
    let outer_id = split_node(outer.ino).0;
    assert_eq!(info.parent, outer_id);
    let refused = fs.delete_subvolume(ROOT, b"outer");
    assert_eq!(
        errno(refused.unwrap_err()),
        libc::ENOTEMPTY,
        "it holds inner"
    );
    fs.set_default_subvolume(outer_id).expect("set-default");
    let refused = fs.delete_subvolume(ROOT, b"outer");
    assert!(refused.is_err(), "the default cannot go");
    fs.sync().expect("sync");
    drop(fs);
    common::assert_fs_clean(&dev);
    let open = |shown: Shown| {
        let e =
            Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
        Fs::with_root(Arc::new(e), &shown).expect("fs")
    };
    let fs = open(Shown::Default);
    assert_eq!(read_all(&fs, at(&fs, "d/inner/f").expect("f")), b"deep");
    drop(fs);
    let fs = open(Shown::Path(b"outer/d/inner".to_vec()));
    assert_eq!(read_all(&fs, at(&fs, "f").expect("f")), b"deep");
    drop(fs);
    let fs = open(Shown::Id(split_node(inner.ino).0));
    assert_eq!(read_all(&fs, at(&fs, "f").expect("f")), b"deep");
    fs.set_default_subvolume(5).expect("back to the top");
    drop(fs);
    let fs = open(Shown::Default);
    assert!(at(&fs, "outer/d/inner/f").is_ok());
}

/// Crash at every prefix of the writes of a snapshot, a write to its
/// source, and the snapshot's deletion: each image opens to a state a
/// commit left (no snapshot; the snapshot with the source's old content;
/// or no snapshot again), with check (links included) clean.
#[test]
fn snapshot_and_delete_survive_a_crash_at_any_point() {
    use canopy::dev::crash::{RecordingDevice, Replayer};
    let (base_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let sv = fs.create_subvolume(ROOT, b"sv", ME).expect("sv");
    file(&fs, sv.ino, "f", &vec![1u8; 100_000]);
    fs.sync().expect("sync");
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let sv = at(&fs, "sv").expect("sv");
    let f = at(&fs, "sv/f").expect("f");
    fs.write(f, 0, &vec![2u8; 100_000])
        .expect("buffered before");
    fs.snapshot(sv, ROOT, b"snap", true).expect("snapshot");
    let snapped = rec.op_count();
    fs.write(f, 0, &vec![3u8; 100_000]).expect("write after");
    fs.sync().expect("sync");
    let before_delete = rec.op_count();
    fs.delete_subvolume(ROOT, b"snap").expect("delete");
    let deleted = rec.op_count();
    let ops = rec.ops();
    drop(fs);
    assert!(snapped > 3 && deleted > snapped + 3, "{snapped} {deleted}");
    let mut rp = Replayer::new(base, ops);
    for prefix in 0..=deleted {
        for keep in [&(|_| true) as &dyn Fn(usize) -> bool, &|_| false] {
            let dev: Arc<dyn Device> = Arc::new(rp.at(prefix, keep));
            let e = Engine::open(dev.clone(), &OpenOptions::default())
                .unwrap_or_else(|err| panic!("prefix {prefix}: open failed: {err}"));
            let fs = Fs::new(Arc::new(e)).expect("fs");
            let live = read_all(&fs, at(&fs, "sv/f").expect("sv/f"));
            assert!(
                [1u8, 2, 3].iter().any(|&b| live == vec![b; 100_000]),
                "prefix {prefix}: the source is torn"
            );
            match at(&fs, "snap") {
                Ok(snap) => {
                    let sf = fs.lookup(snap, b"f").expect("snap/f").ino;
                    assert_eq!(read_all(&fs, sf), vec![2u8; 100_000], "prefix {prefix}");
                    assert_eq!(fs.write(sf, 0, b"x").unwrap_err().errno(), libc::EROFS);
                }
                Err(_) => assert!(
                    !(snapped..=before_delete).contains(&prefix),
                    "prefix {prefix}: the snapshot was durable"
                ),
            }
            if prefix == deleted {
                assert!(at(&fs, "snap").is_err(), "the deletion was durable");
            }
            drop(fs);
            let r = canopy::check::check_all(dev, &|_, _| {}).expect("check ran");
            assert!(r.is_clean(), "prefix {prefix}: {:#?}", r.problems);
        }
    }
}

/// Deleting a subvolume with buffered data and open files: nothing stays
/// buffered or reserved for it, its files give ENOENT, and its space
/// comes back.
#[test]
fn deleting_a_busy_subvolume_gives_everything_back() {
    let (dev, fs) = new_fs();
    let avail = fs.statfs().avail;
    let sv = fs.create_subvolume(ROOT, b"sv", ME).expect("sv");
    let f = file(&fs, sv.ino, "f", &vec![9u8; 8 << 20]);
    fs.open(f);
    assert!(fs.dirty_bytes() > 0, "buffered");
    fs.delete_subvolume(ROOT, b"sv").expect("delete");
    assert_eq!(fs.dirty_bytes(), 0);
    assert_eq!(fs.write(f, 0, b"x").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(fs.getattr(f).unwrap_err().errno(), libc::ENOENT);
    let _ = fs.release(f);
    let again = fs.create_subvolume(ROOT, b"sv", ME).expect("again");
    assert_ne!(
        split_node(again.ino).0,
        split_node(sv.ino).0,
        "a deleted subvolume's id is not reused while mounted: the kernel may hold its nodes"
    );
    assert_eq!(fs.getattr(f).unwrap_err().errno(), libc::ENOENT);
    fs.delete_subvolume(ROOT, b"sv").expect("delete again");
    fs.sync().expect("sync");
    let back = fs.statfs().avail;
    assert!(back + 64 >= avail, "space back: {back} of {avail} blocks");
    drop(common::reopen(&dev, fs));
}

/// A listing with attributes gives a subvolume's entry the attributes of
/// that subvolume's root directory, and ".." of a subvolume's root those
/// of the directory holding its link (both live in other trees than the
/// listed directory).
#[test]
fn listing_with_attributes_reads_other_trees_inodes_from_their_trees() {
    let (_dev, fs) = new_fs();
    let sv = fs.create_subvolume(ROOT, b"sv", ME).expect("create");
    for i in 0..3 {
        let name = format!("d{i}");
        fs.create(sv.ino, name.as_bytes(), libc::S_IFDIR | 0o755, 0, ME, None)
            .expect("mkdir in the subvolume");
    }
    let plus = |dir: u64| -> Vec<(Vec<u8>, canopy::fs::Attr)> {
        fs.readdir_plus(dir, 0, 100, u64::MAX)
            .expect("readdir_plus")
            .into_iter()
            .filter_map(|(_, a, name)| a.map(|a| (name, a)))
            .collect()
    };
    let top = plus(ROOT);
    let (_, listed) = top.iter().find(|(n, _)| n == b"sv").expect("sv listed");
    let real = fs.getattr(sv.ino).expect("getattr of the subvolume");
    assert_eq!(
        (listed.ino, listed.nlink, listed.mtime),
        (real.ino, real.nlink, real.mtime)
    );
    assert_eq!(real.nlink, 5, "the subvolume root holds three directories");
    let inside = plus(sv.ino);
    let (_, up) = inside.iter().find(|(n, _)| n == b"..").expect(".. listed");
    let top_attr = fs.getattr(ROOT).expect("getattr of the top");
    assert_eq!((up.ino, up.nlink), (top_attr.ino, top_attr.nlink));
}
