//! Quota groups through a real FUSE mount and the `canopy quota` and
//! `canopy qgroup` commands: numbers after writes and snapshots, groups
//! of groups, a limit that makes writes fail with EDQUOT while deleting
//! still works, and `check` verifying every number after unmount.

mod common;

use common::mounted::{can_mount, canopy, canopy_ok, Mounted};
use std::fs;
use std::io::Write;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// (referenced, exclusive, parents, path) of group `id` from `show --json`.
fn group(mnt: &Path, id: &str) -> (u64, u64, Vec<String>, serde_json::Value) {
    let json = canopy_ok(&["qgroup", "show", "--json", "."], mnt);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["qgroupid"] == id)
        .unwrap_or_else(|| panic!("no qgroup {id} in {json}"))
        .clone();
    let parents = row["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    (
        row["referenced"].as_u64().unwrap(),
        row["exclusive"].as_u64().unwrap(),
        parents,
        row,
    )
}

#[test]
fn quota_groups_and_limits_through_the_mount() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let out = canopy()
        .args(["qgroup", "show", "."])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success(), "show without quotas must fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not enabled"));

    canopy_ok(&["quota", "enable", "."], &mnt);
    canopy_ok(&["subvolume", "create", "home"], &mnt);
    fs::write(m.p("home/f"), vec![5u8; 2 * MIB as usize]).unwrap();
    let (r, e, _, row) = group(&mnt, "0/256");
    assert!(r >= 2 * MIB && e == r, "{row}");
    assert_eq!(row["path"], "home");
    assert!(row["max_referenced"].is_null());

    canopy_ok(&["subvolume", "snapshot", "home", "snap"], &mnt);
    let (sr, se, _, _) = group(&mnt, "0/257");
    assert_eq!(sr, r, "the snapshot references what home does");
    assert!(se < MIB);
    assert!(group(&mnt, "0/256").1 < MIB, "home's data is shared now");

    canopy_ok(&["qgroup", "create", "1/1", "."], &mnt);
    canopy_ok(&["qgroup", "assign", "0/256", "1/1", "."], &mnt);
    canopy_ok(&["qgroup", "assign", "0/257", "1/1", "."], &mnt);
    let (gr, ge, _, _) = group(&mnt, "1/1");
    assert_eq!(
        gr, ge,
        "all that home and its snapshot share is the group's"
    );
    assert_eq!(group(&mnt, "0/256").2, vec!["1/1".to_string()]);

    // A limit on home: a write past it fails with EDQUOT, the top level
    // is not limited, and deleting frees the room again.
    canopy_ok(&["qgroup", "limit", "4M", "home"], &mnt);
    assert_eq!(group(&mnt, "0/256").3["max_referenced"], 4 * MIB);
    let mut f = fs::File::create(m.p("home/big")).unwrap();
    let chunk = vec![1u8; MIB as usize];
    let mut failed = None;
    for _ in 0..8 {
        if let Err(e) = f.write_all(&chunk) {
            failed = e.raw_os_error();
            break;
        }
    }
    drop(f);
    assert_eq!(failed, Some(libc::EDQUOT), "writes past the limit");
    fs::write(m.p("free"), vec![1u8; 4 * MIB as usize]).unwrap();
    fs::remove_file(m.p("home/big")).unwrap();
    fs::remove_file(m.p("home/f")).unwrap();
    fs::write(m.p("home/again"), vec![1u8; 2 * MIB as usize]).unwrap();
    canopy_ok(&["qgroup", "limit", "none", "0/256", "."], &mnt);
    assert!(group(&mnt, "0/256").3["max_referenced"].is_null());

    canopy_ok(&["quota", "rescan", "."], &mnt);
    let text = canopy_ok(&["qgroup", "show", "."], &mnt);
    assert!(text.contains("0/257") && text.contains("snap"), "{text}");
    m.unmount();
    // check recounts every group from scratch.
    m.check();
    m.mount("");
    canopy_ok(&["quota", "disable", "."], &mnt);
    m.unmount();
    m.check();
}
