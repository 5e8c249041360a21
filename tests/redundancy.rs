//! Tree blocks in two copies (`mkfs -m dup`, the default with separate
//! block groups): a bad first copy is read from the second and repaired,
//! scrub repairs every bad copy it finds (or only reports with `-r`), and
//! a block whose copies are both bad is reported lost, never served.

mod common;

use canopy::dev::{Device, FileDevice};
use canopy::format::superblock::Profile;
use canopy::fs::{Fs, Owner};
use canopy::volume::Mirror;
use canopy::{Engine, OpenOptions};
use common::mounted::canopy;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const ME: Owner = Owner { uid: 0, gid: 0 };
const ROOT_DIR: u64 = 256;

fn mkfs(dir: &Path, args: &[&str]) -> PathBuf {
    let img = dir.join("fs.img");
    let out = canopy()
        .args(["mkfs", "-s", "1G"])
        .args(args)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    img
}

fn open(img: &Path, read_only: bool) -> Engine {
    let dev = Arc::new(FileDevice::open(img, read_only, !read_only).unwrap());
    let opts = OpenOptions {
        read_only,
        ..Default::default()
    };
    Engine::open(dev as Arc<dyn Device>, &opts).unwrap()
}

/// Contents of file `i`: some inline, some in extents.
fn content(i: usize) -> Vec<u8> {
    common::noise(if i % 3 == 0 { 300 } else { 9000 + i * 17 }, i as u64)
}

/// 600 files in 12 directories, committed.
fn populate(img: &Path) {
    let fs = Fs::new(Arc::new(open(img, false))).unwrap();
    for d in 0..12 {
        let name = format!("dir{d}");
        let dir = fs
            .create(ROOT_DIR, name.as_bytes(), libc::S_IFDIR | 0o755, 0, ME, None)
            .unwrap();
        for f in 0..50 {
            let i = d * 50 + f;
            let name = format!("file{i}");
            let a = fs
                .create(dir.ino, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)
                .unwrap();
            fs.write(a.ino, 0, &content(i)).unwrap();
        }
    }
    fs.sync().unwrap();
}

/// Reads every file back through a writable open (which repairs what it
/// reads) and returns the device's error counters.
fn read_all(img: &Path) -> [u64; 4] {
    let engine = Arc::new(open(img, false));
    let fs = Fs::new(engine.clone()).unwrap();
    for d in 0..12 {
        let dir = fs.lookup(ROOT_DIR, format!("dir{d}").as_bytes()).unwrap();
        for f in 0..50 {
            let i = d * 50 + f;
            let a = fs.lookup(dir.ino, format!("file{i}").as_bytes()).unwrap();
            let want = content(i);
            let got = fs.read(a.ino, 0, want.len() as u32 + 10).unwrap();
            assert!(got == want, "file{i} reads back different bytes");
        }
    }
    fs.sync().unwrap();
    engine.device_errors()
}

fn mirrors(img: &Path) -> Vec<Mirror> {
    open(img, true).mirrors()
}

/// Overwrites `[start, start + len)` of the image with garbage, leaving
/// superblock copies alone.
fn scribble(img: &Path, start: u64, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    let garbage = vec![0xa5u8; 4096];
    let mut at = start;
    while at < start + len {
        if !canopy::format::SUPER_OFFSETS.contains(&at) {
            f.write_all_at(&garbage, at).unwrap();
        }
        at += 4096;
    }
    f.sync_all().unwrap();
}

fn scrub_json(args: &[&str]) -> (i32, serde_json::Value) {
    let out = canopy()
        .args(["scrub", "--json", "-q"])
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), v)
}

fn check_clean(img: &Path) {
    let out = canopy().arg("check").arg(img).output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mkfs_keeps_two_copies_of_tree_blocks_by_default_from_a_gib() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    let e = open(&img, true);
    assert_eq!(e.profiles(), (Profile::Dup, Profile::Single));
    let ms = e.mirrors();
    assert!(ms.len() >= 2, "a system and a metadata group: {ms:?}");
    for m in &ms {
        assert!(m.mirror >= m.start + m.len || m.mirror + m.len <= m.start);
        for s in canopy::format::SUPER_OFFSETS {
            assert!(s + 4096 <= m.mirror || s >= m.mirror + m.len, "{m:?} holds a superblock copy");
        }
    }
    drop(e);
    let single = tempfile::tempdir().unwrap();
    let img = mkfs(single.path(), &["-m", "single"]);
    assert_eq!(open(&img, true).profiles(), (Profile::Single, Profile::Single));
    assert!(mirrors(&img).is_empty());
    let out = canopy()
        .args(["mkfs", "-f", "-m", "raid7"])
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown profile is a usage error");
}

#[test]
fn every_tree_block_survives_the_loss_of_either_copy() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    populate(&img);
    let ms = mirrors(&img);
    let img_s = img.to_str().unwrap();

    // Every first copy gone: the files still read, and the reads repair.
    for m in &ms {
        scribble(&img, m.start, m.len);
    }
    let [_, corrupt, corrected, _] = read_all(&img);
    assert!(corrupt > 0 && corrected == corrupt, "{corrupt} bad, {corrected} repaired");
    // Scrub repairs the blocks the reads did not reach.
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(v["bad_tree_blocks"].as_array().unwrap().is_empty(), "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(copies.iter().all(|c| c["repaired"] == true && c["copy"] == 0), "{v}");
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(v["bad_copies"].as_array().unwrap().is_empty(), "repaired for good: {v}");

    // Now every second copy: the repaired first copies carry it alone.
    for m in &ms {
        scribble(&img, m.mirror, m.len);
    }
    read_all(&img);
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(!copies.is_empty() && copies.iter().all(|c| c["copy"] == 1), "{v}");
    check_clean(&img);
}

#[test]
fn a_read_only_scrub_reports_bad_copies_and_leaves_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    populate(&img);
    let m = mirrors(&img)[0];
    scribble(&img, m.mirror, m.len);
    let img_s = img.to_str().unwrap();
    let (code, v) = scrub_json(&["-r", img_s]);
    assert_eq!(code, 3, "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(!copies.is_empty() && copies.iter().all(|c| c["repaired"] == false), "{v}");
    let (code, _) = scrub_json(&["-r", img_s]);
    assert_eq!(code, 3, "still bad: nothing was written");
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    let (code, v) = scrub_json(&["-r", img_s]);
    assert_eq!(code, 0, "{v}");
}

#[test]
fn a_block_bad_in_both_copies_is_lost_and_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    populate(&img);
    let e = open(&img, true);
    let leaf = e
        .read(|r| r.root(canopy::format::tree_id::FS))
        .unwrap()
        .bytenr;
    let mirror = e
        .mirrors()
        .into_iter()
        .find(|m| m.start <= leaf && leaf < m.start + m.len)
        .expect("the file tree's root lies in a dup group");
    drop(e);
    scribble(&img, leaf, 16384);
    scribble(&img, mirror.mirror + (leaf - mirror.start), 16384);
    let (code, v) = scrub_json(&[img.to_str().unwrap()]);
    assert_eq!(code, 3, "{v}");
    let lost = v["bad_tree_blocks"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{v}");
    assert_eq!(lost[0]["bytenr"], leaf);
    let fs = Fs::new(Arc::new(open(&img, true)));
    assert!(fs.is_err(), "the top-level file tree cannot be read");
}
