//! `canopy filesystem resize` on image files: a mounted filesystem grows
//! into a longer image, across a superblock copy's place (64 MiB), keeps
//! its size through a crash, and refuses what it cannot do (issue 42; on
//! RBD images, tests/rbd.rs); `DEVID:SIZE` grows another device of a
//! filesystem over several (issue 55).

mod common;

use common::mounted::{
    can_mount, canopy, canopy_ok, fill_until_full, mounted_pair, statfs_total, Mounted,
};
use std::path::Path;

/// `canopy filesystem resize ARG` of the mount fails for each ARG, with
/// an error saying what its pair says.
fn refused(m: &Mounted, cases: &[(&str, &str)]) {
    for &(arg, says) in cases {
        let out = canopy()
            .args(["filesystem", "resize", "--json", arg])
            .arg(&m.mnt)
            .output()
            .unwrap();
        assert!(!out.status.success(), "resize {arg} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "resize {arg}: {err}");
    }
}

/// `canopy filesystem resize --json ARG` of the mount, which must
/// succeed: its report.
fn grown(m: &Mounted, arg: &str) -> serde_json::Value {
    let args = ["filesystem", "resize", "--json", arg, "."];
    serde_json::from_str(&canopy_ok(&args, &m.mnt)).unwrap()
}

/// Fills the filesystem with 1 MiB files PREFIX0..; how many.
fn fill(m: &Mounted, prefix: &str) -> usize {
    fill_until_full(&m.mnt, prefix, &common::noise(1 << 20, 9)).len()
}

fn total_bytes(img: &Path) -> u64 {
    let out = canopy()
        .args(["inspect", "super", "--json"])
        .arg(img)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["total_bytes"].as_u64().unwrap()
}

fn set_len(img: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_full_filesystem_grows_into_a_longer_image() {
    if !can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let mut m = Mounted::with_size("40M");
    let before = statfs_total(&m.mnt);
    let first = fill(&m, "a");
    assert!(first > 0);
    set_len(&m.img, 160 << 20);
    let g = grown(&m, "max");
    assert_eq!(g["old_bytes"], 40u64 << 20);
    assert_eq!(g["new_bytes"], 160u64 << 20);
    assert!(statfs_total(&m.mnt) >= before + (100 << 20));
    let second = fill(&m, "b");
    assert!(second > 80, "only {second} MiB more");
    m.unmount();
    m.check();
    assert_eq!(total_bytes(&m.img), 160 << 20);
    // The new space held the superblock copy at 64 MiB: it is written and
    // current.
    let mut sb = vec![0u8; 4096];
    let f = std::fs::File::open(&m.img).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut sb, 64 << 20).unwrap();
    assert_eq!(&sb[64..72], &canopy::format::MAGIC);
    m.mount("");
    let data = common::noise(1 << 20, 9);
    for i in 0..second {
        assert!(std::fs::read(m.p(&format!("b{i}"))).unwrap() == data);
    }
    m.unmount();
}

#[test]
fn a_grown_size_survives_a_crash_and_bad_sizes_are_refused() {
    if !can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let mut m = Mounted::with_size("64M");
    set_len(&m.img, 96 << 20);
    grown(&m, "+16M");
    refused(
        &m,
        &[
            ("-8M", "not supported"),
            ("70M", "not supported"),
            ("+1G", "holds only"),
            ("lots", ""),
        ],
    );
    let g = grown(&m, "80M");
    assert_eq!(g["new_bytes"], g["old_bytes"], "already that size");
    m.kill9();
    assert_eq!(total_bytes(&m.img), 80 << 20);
    m.mount("");
    grown(&m, "max");
    m.unmount();
    m.check();
    assert_eq!(total_bytes(&m.img), 96 << 20);
}

fn super_json(img: &Path) -> serde_json::Value {
    let out = canopy()
        .args(["inspect", "super", "--json"])
        .arg(img)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Two 1 GiB devices (the mapped layout, data `single`, metadata `dup`,
/// which needs room on one device only) filled up; device
/// 2's image made longer and grown with `2:+256M`: the logical space and
/// `df` grow by as much, files written into the new room read back after
/// a remount, and the device table records the new size. Ids that are
/// not the filesystem's are refused.
#[test]
fn device_2_of_several_grows_by_its_id() {
    if !can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let (mut m, b) = mounted_pair(&["-s", "1G", "-m", "dup"]);
    let (a, opts) = (m.img.clone(), format!("device={}", b.display()));
    let before = statfs_total(&m.mnt);
    let first = fill(&m, "a");
    assert!(first > 1500, "only {first} MiB on two 1 GiB devices");
    set_len(&b, (1 << 30) + (256 << 20));
    refused(
        &m,
        &[
            ("3:max", "not one of this filesystem's present devices"),
            ("0:max", "a number from 1 up"),
            ("x:max", "a number from 1 up"),
            ("2:-1M", "not supported"),
            ("2:+1G", "holds only"),
        ],
    );
    let g = grown(&m, "2:+256M");
    assert_eq!(g["devid"], 2);
    assert_eq!(g["old_bytes"], 1u64 << 30);
    assert_eq!(g["new_bytes"], (1u64 << 30) + (256 << 20));
    assert!(statfs_total(&m.mnt) >= before + (200 << 20));
    let second = fill(&m, "b");
    assert!(second > 200, "only {second} MiB more");
    let again = grown(&m, "2:max");
    assert_eq!(again["new_bytes"], again["old_bytes"], "already that size");
    m.unmount();
    let sb = super_json(&a);
    assert_eq!(sb["total_bytes"], (2u64 << 30) + (256 << 20));
    let sizes: Vec<(u64, u64)> = sb["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["devid"].as_u64().unwrap(), d["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(sizes, [(1, 1 << 30), (2, (1 << 30) + (256 << 20))]);
    common::mounted::check_devices(&a, &[&b]);
    m.mount(&opts);
    let data = common::noise(1 << 20, 9);
    for i in 0..second {
        assert!(std::fs::read(m.p(&format!("b{i}"))).unwrap() == data);
    }
    m.unmount();
}
