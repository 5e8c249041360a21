//! Tree blocks in two copies (`mkfs -m dup`, the default with separate
//! block groups): a bad first copy is read from the second and repaired,
//! scrub repairs every bad copy it finds (or only reports with `-r`), and
//! a block whose copies are both bad is reported lost, never served.

mod common;

use canopy::dev::{Device, FileDevice};
use canopy::format::superblock::Profile;
use canopy::fs::{Fs, Owner};
use canopy::volume::{Chunk, Stripe};
use canopy::{Engine, OpenOptions};
use common::mounted::{canopy, canopy_ok};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const ME: Owner = Owner { uid: 0, gid: 0 };
const ROOT_DIR: u64 = 256;

fn mkfs(dir: &Path, args: &[&str]) -> PathBuf {
    let img = dir.join("fs.img");
    common::mounted::mkfs_ok(&[&["-s", "1G"], args].concat(), &[&img]);
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
    common::noise(
        if i.is_multiple_of(3) {
            300
        } else {
            9000 + i * 17
        },
        i as u64,
    )
}

/// 600 files in 12 directories, committed.
fn populate(img: &Path) {
    let fs = Fs::new(Arc::new(open(img, false))).unwrap();
    for d in 0..12 {
        let name = format!("dir{d}");
        let dir = fs
            .create(
                ROOT_DIR,
                name.as_bytes(),
                libc::S_IFDIR | 0o755,
                0,
                ME,
                None,
            )
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
    let errors = engine.device_errors();
    assert_eq!(errors.len(), 1, "one device: {errors:?}");
    errors[0].1
}

/// Where a dup group's second copy starts.
fn mirror_at(c: &Chunk) -> u64 {
    assert_eq!(c.extra.len(), 1, "{c:?}");
    assert_eq!(c.extra[0].devid, 1, "{c:?}");
    c.extra[0].offset
}

fn mirrors(img: &Path) -> Vec<Chunk> {
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
        let at = mirror_at(m);
        assert!(at >= m.start + m.len || at + m.len <= m.start);
        for s in canopy::format::SUPER_OFFSETS {
            assert!(
                s + 4096 <= at || s >= at + m.len,
                "{m:?} holds a superblock copy"
            );
        }
    }
    drop(e);
    let single = tempfile::tempdir().unwrap();
    let img = mkfs(single.path(), &["-m", "single"]);
    assert_eq!(
        open(&img, true).profiles(),
        (Profile::Single, Profile::Single)
    );
    assert!(mirrors(&img).is_empty());
    let out = canopy()
        .args(["mkfs", "-f", "-m", "raid7"])
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown profile is a usage error"
    );
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
    let out = canopy().arg("check").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("scrub` repairs"),
        "{text}"
    );
    let [_, corrupt, corrected, _] = read_all(&img);
    assert!(
        corrupt > 0 && corrected == corrupt,
        "{corrupt} bad, {corrected} repaired"
    );
    // Scrub repairs the blocks the reads did not reach.
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(v["bad_tree_blocks"].as_array().unwrap().is_empty(), "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(
        copies
            .iter()
            .all(|c| c["repaired"] == true && c["copy"] == 0),
        "{v}"
    );
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(
        v["bad_copies"].as_array().unwrap().is_empty(),
        "repaired for good: {v}"
    );

    // Now every second copy: the repaired first copies carry it alone.
    for m in &ms {
        scribble(&img, mirror_at(m), m.len);
    }
    read_all(&img);
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(
        !copies.is_empty() && copies.iter().all(|c| c["copy"] == 1),
        "{v}"
    );
    check_clean(&img);
}

#[test]
fn a_read_only_scrub_reports_bad_copies_and_leaves_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    populate(&img);
    let m = mirrors(&img)[0].clone();
    scribble(&img, mirror_at(&m), m.len);
    let img_s = img.to_str().unwrap();
    // check reads the first copies; with data checks it reads them all.
    check_clean(&img);
    let out = canopy()
        .args(["check", "--check-data-csum", img_s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && text.contains("copy 1"), "{text}");
    let (code, v) = scrub_json(&["-r", img_s]);
    assert_eq!(code, 3, "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(
        !copies.is_empty() && copies.iter().all(|c| c["repaired"] == false),
        "{v}"
    );
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
    scribble(&img, mirror_at(&mirror) + (leaf - mirror.start), 16384);
    let (code, v) = scrub_json(&[img.to_str().unwrap()]);
    assert_eq!(code, 3, "{v}");
    let lost = v["bad_tree_blocks"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{v}");
    assert_eq!(lost[0]["bytenr"], leaf);
    let fs = Fs::new(Arc::new(open(&img, true)));
    assert!(fs.is_err(), "the top-level file tree cannot be read");
}

#[test]
fn file_data_in_two_copies_survives_the_loss_of_either() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &["-d", "dup"]);
    assert_eq!(open(&img, true).profiles(), (Profile::Dup, Profile::Dup));
    populate(&img);
    let ms = mirrors(&img);
    let img_s = img.to_str().unwrap();
    for m in &ms {
        scribble(&img, m.start, m.len);
    }
    let [_, corrupt, corrected, _] = read_all(&img);
    assert!(
        corrupt > 0 && corrected == corrupt,
        "{corrupt} bad, {corrected} repaired"
    );
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(v["bad_data_sectors"].as_array().unwrap().is_empty(), "{v}");
    for m in &ms {
        scribble(&img, mirror_at(m), m.len);
    }
    read_all(&img);
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    let copies = v["bad_copies"].as_array().unwrap();
    assert!(
        copies.iter().any(|c| c["data"] == true && c["copy"] == 1),
        "{v}"
    );
    // The files whose data had a bad copy, by path.
    let files = v["repaired_files"].as_array().unwrap();
    assert!(files.iter().any(|f| f["path"] == "/dir0/file1"), "{v}");
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert!(v["bad_copies"].as_array().unwrap().is_empty(), "{v}");
    check_clean(&img);
}

fn device_stats(m: &common::mounted::Mounted, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = canopy()
        .args(["device", "stats", "--json"])
        .args(extra)
        .arg(&m.mnt)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), v)
}

/// Through a real mount: a bad first copy of every tree block is read
/// from the second while files are read, counted in `canopy device
/// stats` (kept across mounts, zeroed by `-z`), and an online scrub
/// repairs the rest.
#[test]
fn a_mount_reads_through_bad_copies_and_counts_them() {
    if !common::mounted::can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let mut m = common::mounted::Mounted::with_size("1G");
    for d in 0..4 {
        std::fs::create_dir(m.p(&format!("d{d}"))).unwrap();
        for f in 0..100 {
            std::fs::write(m.p(&format!("d{d}/f{f}")), content(d * 100 + f)).unwrap();
        }
    }
    canopy_ok(&["sync", "."], &m.mnt);
    let (code, v) = device_stats(&m, &["-c"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v[0]["corrected_errs"], 0, "{v}");
    m.unmount();
    for mirror in mirrors(&m.img) {
        scribble(&m.img, mirror.start, mirror.len);
    }
    m.mount("");
    for d in 0..4 {
        for f in 0..100 {
            let got = std::fs::read(m.p(&format!("d{d}/f{f}"))).unwrap();
            assert!(got == content(d * 100 + f), "d{d}/f{f}");
        }
    }
    let (code, v) = device_stats(&m, &["-c"]);
    assert_eq!(code, 64, "-c: errors were counted: {v}");
    let corrected = v[0]["corrected_errs"].as_u64().unwrap();
    assert!(
        corrected > 0 && v[0]["corruption_errs"].as_u64().unwrap() >= corrected,
        "{v}"
    );
    let scrub = canopy().args(["scrub", "-q"]).arg(&m.mnt).output().unwrap();
    assert!(
        scrub.status.success(),
        "{}",
        String::from_utf8_lossy(&scrub.stdout)
    );
    canopy_ok(&["sync", "."], &m.mnt);
    m.unmount();
    m.mount("");
    let (_, v) = device_stats(&m, &["-z"]);
    assert!(
        v[0]["corrected_errs"].as_u64().unwrap() >= corrected,
        "kept across mounts: {v}"
    );
    let (_, v) = device_stats(&m, &[]);
    assert_eq!(v[0]["corrected_errs"], 0, "zeroed: {v}");
    let text = canopy_ok(&["device", "stats", "."], &m.mnt);
    assert!(text.contains("].corrected_errs"), "{text}");
    let online: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", "."], &m.mnt)).unwrap();
    let dev = &online["devices"][0];
    assert_eq!(dev["size"], 1u64 << 30, "{online}");
    assert_eq!(dev["path"], m.img.to_str().unwrap(), "{online}");
    m.unmount();
    m.check();
    let img = m.img.to_str().unwrap();
    let offline: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", img], &m.mnt)).unwrap();
    assert_eq!(offline["uuid"], online["uuid"], "{offline}");
    assert_eq!(
        offline["devices"][0]["allocated"], dev["allocated"],
        "{offline}"
    );
    let text = canopy_ok(&["filesystem", "show", img], &m.mnt);
    assert!(
        text.contains("Total devices 1") && text.contains("devid    1"),
        "{text}"
    );
}

/// Kinds of group and the profiles they have, from `filesystem usage`'s
/// numbers.
fn profiles_in_use(e: &Engine) -> Vec<(String, String)> {
    e.usage()
        .kinds
        .into_iter()
        .map(|k| (k.kind, k.profile))
        .collect()
}

/// `balance start -mconvert=dup` gives an image made with one copy a
/// second copy of every tree block, online, and `-mconvert=single` takes
/// it away again; files and quotas stay as they were.
#[test]
fn balance_converts_tree_blocks_between_one_and_two_copies() {
    use canopy::balance::{BalanceArgs, Filter};
    use canopy::dev::MemDevice;
    use canopy::fs::BalanceState;
    let dev = Arc::new(MemDevice::new(256 << 20));
    let opts = canopy::FormatOptions {
        mixed: Some(false),
        metadata_profile: Some(Profile::Single),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    let dir = fs
        .create(ROOT_DIR, b"d", libc::S_IFDIR | 0o755, 0, ME, None)
        .unwrap();
    let mut files = Vec::new();
    for i in 0..400 {
        let a = fs
            .create(
                dir.ino,
                format!("f{i}").as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                ME,
                None,
            )
            .unwrap();
        fs.write(a.ino, 0, &content(i)).unwrap();
        files.push(a.ino);
    }
    fs.sync().unwrap();
    assert!(fs.engine().mirrors().is_empty());
    let to = |p| BalanceArgs {
        data: Filter::Skip,
        metadata: Filter::Skip,
        data_convert: None,
        metadata_convert: Some(p),
        devid: None,
    };
    fs.balance_start(to(Profile::Dup)).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.sync().unwrap();
    assert_eq!(fs.engine().profiles().0, Profile::Dup);
    for (kind, profile) in profiles_in_use(fs.engine()) {
        let want = if kind == "data" { "single" } else { "dup" };
        assert_eq!(profile, want, "{kind} groups");
    }
    // The second copies are real: every first copy can go.
    let mirrors = fs.engine().mirrors();
    drop(fs);
    for m in &mirrors {
        let mut at = m.start;
        while at < m.start + m.len {
            if !canopy::format::SUPER_OFFSETS.contains(&at) {
                dev.write_at(&[0xa5; 4096], at).unwrap();
            }
            at += 4096;
        }
    }
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    for (i, &ino) in files.iter().enumerate() {
        let want = content(i);
        assert!(fs.read(ino, 0, want.len() as u32).unwrap() == want, "f{i}");
    }
    fs.balance_start(to(Profile::Single)).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.sync().unwrap();
    assert!(
        fs.engine().mirrors().is_empty(),
        "{:?}",
        fs.engine().mirrors()
    );
    assert!(profiles_in_use(fs.engine())
        .iter()
        .all(|(_, p)| p == "single"));
    drop(fs);
    common::assert_fs_clean(&dev);
}

/// `rescue super-recover`: a bad primary superblock copy is rewritten
/// from the good ones, only with -y, and the image checks clean after.
#[test]
fn super_recover_rewrites_a_bad_primary_superblock() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    populate(&img);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&[0x5a; 512], 64 << 10).unwrap();
    drop(f);
    let out = canopy().arg("check").arg(&img).output().unwrap();
    assert!(!out.status.success(), "check sees the bad copy");
    let run = |extra: &[&str]| {
        canopy()
            .args(["rescue", "super-recover", "--json"])
            .args(extra)
            .arg(&img)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "without -y nothing is written");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["written"], false, "{v}");
    assert_eq!(v["copies"][0]["rewrite"], true, "{v}");
    assert_eq!(v["copies"][1]["rewrite"], false, "{v}");
    let out = run(&["-y"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["written"], true, "{v}");
    check_clean(&img);
    let out = run(&[]);
    assert!(out.status.success(), "nothing left to do");
    read_all(&img);
}

/// A superblock whose system array names a "second copy" no block group
/// item confirms (a stale or hostile image): the array serves only to
/// read the root and block group trees, so writes are never mirrored
/// over space the filesystem does not give that copy.
#[test]
fn a_system_array_entry_no_group_confirms_is_never_written() {
    use canopy::dev::MemDevice;
    use canopy::format::superblock::SystemChunk;
    const MIB: u64 = 1 << 20;
    let dev = Arc::new(MemDevice::new(256 * MIB));
    let opts = canopy::FormatOptions {
        mixed: Some(false),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    let a = fs
        .create(ROOT_DIR, b"a", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap();
    fs.write(a.ino, 0, &content(1)).unwrap();
    fs.sync().unwrap();
    drop(fs);
    // Unallocated space, filled with a pattern, named as the mirror of
    // everything the filesystem writes to.
    // Not a group's start, so no item's entry replaces it by chance.
    let (start, len, mirror) = (MIB + 512 * 1024, 100 * MIB, 150 * MIB);
    let pattern = vec![0x77u8; MIB as usize];
    for i in 0..len / MIB {
        dev.write_at(&pattern, mirror + i * MIB).unwrap();
    }
    let mut sb = canopy::txn::read_best_superblock(dev.as_ref()).unwrap();
    sb.system_chunks.push(SystemChunk {
        start,
        len,
        first: None,
        extra: vec![Stripe {
            devid: 1,
            offset: mirror,
        }],
    });
    for &off in canopy::format::SUPER_OFFSETS.iter() {
        if off + 4096 <= dev.size() {
            dev.write_at(&sb.encode(off), off).unwrap();
        }
    }
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    let b = fs
        .create(ROOT_DIR, b"b", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap();
    fs.write(b.ino, 0, &vec![9u8; 4 << 20]).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let mut got = vec![0u8; MIB as usize];
    for i in 0..len / MIB {
        dev.read_at(&mut got, mirror + i * MIB).unwrap();
        assert!(got == pattern, "MiB {} of the named mirror was written", i);
    }
}
