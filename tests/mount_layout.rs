//! Where data lies, through a real FUSE mount (issue 40): `canopy
//! filesystem extents` against a file's known layout (data, holes,
//! prealloc, reflinks), `canopy inspect frag` on the image afterwards, and
//! the writeback limits `canopy filesystem usage` shows.

mod common;

use common::mounted::{can_mount, canopy_ok, clone_range, Mounted};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// (logical, length, physical, flags) of each range of `path`'s map.
fn extents(mnt: &Path, path: &str) -> Vec<(u64, u64, Option<u64>, String)> {
    let json = canopy_ok(&["filesystem", "extents", "--json", path], mnt);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let flags: Vec<&str> = e["flags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect();
            (
                e["logical"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["physical"].as_u64(),
                flags.join(","),
            )
        })
        .collect()
}

/// The map's ranges of one kind (flags without `shared`), neighbours
/// merged, as `(start, end)` in the file.
fn ranges(map: &[(u64, u64, Option<u64>, String)], kind: &str) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (logical, length, _, flags) in map {
        let own: Vec<&str> = flags
            .split(',')
            .filter(|f| *f != "shared" && !f.is_empty())
            .collect();
        if own.join(",") != kind {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == *logical => last.1 += length,
            _ => out.push((*logical, logical + length)),
        }
    }
    out
}

#[test]
fn extents_show_data_holes_prealloc_and_reflinks() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    let data = common::noise(256 * KIB as usize, 7);
    let f = fs::File::create(m.p("a")).unwrap();
    f.write_all_at(&data, 0).unwrap();
    f.write_all_at(&data[..128 * KIB as usize], 640 * KIB)
        .unwrap();
    let r = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            2 * MIB as i64,
            MIB as i64,
        )
    };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    f.set_len(4 * MIB).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let map = extents(&m.mnt, "a");
    assert_eq!(
        ranges(&map, ""),
        vec![(0, 256 * KIB), (640 * KIB, 768 * KIB)],
        "{map:?}"
    );
    assert_eq!(
        ranges(&map, "prealloc"),
        vec![(2 * MIB, 3 * MIB)],
        "{map:?}"
    );
    assert_eq!(
        ranges(&map, "hole"),
        vec![
            (256 * KIB, 640 * KIB),
            (768 * KIB, 2 * MIB),
            (3 * MIB, 4 * MIB)
        ],
        "{map:?}"
    );
    assert!(
        map.iter().all(|e| (e.3 == "hole") == e.2.is_none()),
        "{map:?}"
    );
    assert!(
        !map.iter().any(|e| e.3.contains("shared")),
        "nothing shared yet: {map:?}"
    );

    // A clone of the first 256 KiB: those extents are shared by both files.
    let src = fs::File::open(m.p("a")).unwrap();
    let dst = fs::File::create(m.p("b")).unwrap();
    let cloned = clone_range(&src, &dst, 256 * KIB);
    assert_eq!(
        cloned,
        256 * KIB as isize,
        "{}",
        std::io::Error::last_os_error()
    );
    let a = extents(&m.mnt, "a");
    let b = extents(&m.mnt, "b");
    for (logical, length, physical, flags) in a.iter().filter(|e| e.0 < 256 * KIB) {
        assert!(flags.contains("shared"), "a at {logical}+{length}: {flags}");
        let same = b
            .iter()
            .find(|e| e.0 == *logical)
            .expect("b maps the same offset");
        assert_eq!(&same.2, physical, "b's data is a's on the device");
        assert!(same.3.contains("shared"));
    }
    assert!(
        !a.iter().any(|e| e.0 >= 640 * KIB && e.3.contains("shared")),
        "{a:?}"
    );
    assert!(canopy_ok(&["filesystem", "extents", "a"], &m.mnt).contains("prealloc"));
}

#[test]
fn frag_counts_the_extents_the_mount_showed() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mut items = 0;
    for (i, len) in [300 * KIB, 2 * MIB, 64 * KIB].into_iter().enumerate() {
        let name = format!("f{i}");
        fs::write(m.p(&name), common::noise(len as usize, i as u64)).unwrap();
        fs::File::open(m.p(&name)).unwrap().sync_all().unwrap();
        items += extents(&m.mnt, &name)
            .iter()
            .filter(|e| e.2.is_some())
            .count() as u64;
    }
    m.unmount();
    let json = canopy_ok(
        &["inspect", "frag", "--json", &m.img.to_string_lossy()],
        &m.mnt,
    );
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["files"], 3, "{r}");
    let actual = r["actual_extents"].as_u64().unwrap();
    assert!(actual >= 3 && actual <= items, "{r}");
    assert!(r["ideal_extents"].as_u64().unwrap() <= actual, "{r}");
    // Every extent but the image's first has a hint.
    let hinted: u64 = r["locality"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(hinted, items - 1, "{r}");
    assert!(r["median_distance"].is_u64(), "{r}");
    let text = canopy_ok(&["inspect", "frag", &m.img.to_string_lossy()], &m.mnt);
    assert!(
        text.contains("fragmentation factor") && text.contains("median distance"),
        "{text}"
    );
}

#[test]
fn usage_shows_the_writeback_limits_in_effect() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    m.mount("writeback_cache,max_background=32");
    let json = canopy_ok(&["filesystem", "usage", "--json", "."], &m.mnt);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let w = &v["writeback"];
    assert_eq!(w["writeback_cache"], true, "{w}");
    assert_eq!(w["canopy_dirty_limit_follows_global"], true, "{w}");
    let limit = w["canopy_dirty_limit"].as_u64().unwrap();
    assert!((MIB..=64 * MIB).contains(&limit), "{w}");
    assert_eq!(w["max_background"], 32, "{w}");
    assert_eq!(w["congestion_threshold"], 24, "{w}");
    // Root gives its backing device a kernel filesystem's limits.
    if w["strict_limit"].is_boolean() {
        assert_eq!(w["strict_limit"], false, "{w}");
        assert_eq!(w["max_ratio"], 100, "{w}");
    }
    m.unmount();
    m.mount("dirty_limit=4M,strict_limit");
    let json = canopy_ok(&["filesystem", "usage", "--json", "."], &m.mnt);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let w = &v["writeback"];
    assert_eq!(w["canopy_dirty_limit"], 4 * MIB, "{w}");
    assert_eq!(w["canopy_dirty_limit_follows_global"], false, "{w}");
    if w["strict_limit"].is_boolean() {
        assert_eq!(
            w["strict_limit"], true,
            "strict_limit keeps the kernel's: {w}"
        );
    }
    let text = canopy_ok(&["filesystem", "usage", "."], &m.mnt);
    assert!(
        text.contains("Writeback:") && text.contains("Canopy dirty limit"),
        "{text}"
    );
    m.unmount();
}
