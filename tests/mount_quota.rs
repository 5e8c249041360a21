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

    let before = canopy_ok(&["qgroup", "show", "--raw", "."], &mnt);
    let done = canopy_ok(&["quota", "rescan", "-w", "."], &mnt);
    assert!(done.contains("rescan done"), "{done}");
    let st: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["quota", "rescan", "-s", "--json", "."], &mnt)).unwrap();
    assert_eq!(st["running"], false, "{st}");
    assert_eq!(
        canopy_ok(&["qgroup", "show", "--raw", "."], &mnt),
        before,
        "a rescan counts what the commits counted"
    );
    // Started in the background, it carries on across a remount.
    canopy_ok(&["quota", "rescan", "."], &mnt);
    m.unmount();
    m.check();
    m.mount("");
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

/// Every file's path and content under `dir`.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.display().to_string(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn balance_commands_move_everything_and_change_no_number() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let out = canopy()
        .args(["balance", "start", "-dusage=101", "."])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success(), "usage past 100% must be refused");
    canopy_ok(&["quota", "enable", "."], &mnt);
    canopy_ok(&["subvolume", "create", "home"], &mnt);
    for i in 0..40u8 {
        fs::write(
            m.p(&format!("home/f{i}")),
            vec![i; 64 * 1024 + usize::from(i)],
        )
        .unwrap();
    }
    // Enough extents that a balance runs longer than the commands
    // that pause it.
    fs::create_dir(m.p("home/small")).unwrap();
    for i in 0..1500u32 {
        fs::write(
            m.p(&format!("home/small/{i}")),
            i.to_le_bytes().repeat(1024),
        )
        .unwrap();
    }
    canopy_ok(&["subvolume", "snapshot", "home", "snap"], &mnt);
    fs::write(m.p("home/f0"), b"changed after the snapshot").unwrap();
    // Reading updates access times (relatime), which unshares inode
    // leaves: read first, then take the numbers.
    let files = contents(&mnt);
    canopy_ok(&["sync", "."], &mnt);
    let numbers = || canopy_ok(&["qgroup", "show", "--raw", "."], &mnt);
    let before = numbers();
    // (size of the groups, bytes used in them, bytes used in data
    // groups, unallocated bytes)
    let usage = || -> (u64, u64, u64, u64) {
        let u: serde_json::Value =
            serde_json::from_str(&canopy_ok(&["filesystem", "usage", "--json", "."], &mnt))
                .unwrap();
        let kinds = u["kinds"].as_array().unwrap();
        let sum = |f: &str| kinds.iter().map(|k| k[f].as_u64().unwrap()).sum::<u64>();
        let (size, used) = (sum("size"), sum("used"));
        let data_used = kinds
            .iter()
            .filter(|k| k["kind"] == "data")
            .map(|k| k["used"].as_u64().unwrap())
            .sum::<u64>();
        let unallocated = u["unallocated"].as_u64().unwrap();
        assert!(
            size + unallocated <= u["device_bytes"].as_u64().unwrap() && used <= size,
            "{u}"
        );
        assert!(
            kinds.iter().all(|k| k["groups"].as_u64().unwrap() > 0),
            "{u}"
        );
        (size, used, data_used, unallocated)
    };
    let (size_before, used_before, data_before, _) = usage();
    assert!(used_before > 0);
    let text = canopy_ok(&["filesystem", "usage", "."], &mnt);
    assert!(text.contains("Unallocated:"), "{text}");

    let done = canopy_ok(&["balance", "start", "-dusage=100", "-m", "."], &mnt);
    assert!(done.contains("balance done"), "{done}");
    let st: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["balance", "status", "--json", "."], &mnt)).unwrap();
    assert_eq!(st["state"], "finished", "{st}");
    assert!(st["groups_total"].as_u64().unwrap() > 0, "{st}");
    assert!(st["extents_moved"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["args"]["data"]["usage_below"], 100, "{st}");
    assert_eq!(numbers(), before, "balance changes no qgroup number");
    assert_eq!(contents(&mnt), files);
    canopy_ok(&["sync", "."], &mnt);
    let (size_after, used_after, data_after, _) = usage();
    // Nothing was unshared: every fs-tree block and data extent is in the
    // qgroup numbers compared above. The trees balance rewrites besides
    // (extents, free space, checksums) may end a few leaves larger or
    // smaller, depending on when its commits fell.
    let slack = 4 * 16384;
    assert!(
        size_after <= size_before && data_after <= data_before && used_after <= used_before + slack,
        "groups grew across a balance: {size_before} -> {size_after} bytes, \
         {used_before} -> {used_after} used, {data_before} -> {data_after} in data"
    );

    // Paused in the background, it stays recorded across a remount;
    // cancel forgets it; resumed, it runs to its end.
    for then in ["cancel", "resume"] {
        canopy_ok(&["balance", "start", "--bg", "."], &mnt);
        let paused = canopy()
            .args(["balance", "pause", "."])
            .current_dir(&mnt)
            .output()
            .unwrap();
        if !paused.status.success() {
            // Done before the pause came: that must be all it says.
            let st = canopy_ok(&["balance", "status", "."], &mnt);
            assert!(st.contains("finished"), "{st}");
            eprintln!("the balance finished before it could be paused");
            continue;
        }
        m.unmount();
        m.check();
        m.mount("");
        let st = canopy_ok(&["balance", "status", "."], &mnt);
        assert!(st.contains("balance paused"), "{st}");
        canopy_ok(&["balance", then, "."], &mnt);
        let want = if then == "cancel" {
            "cancelled"
        } else {
            "finished"
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let st = canopy_ok(&["balance", "status", "."], &mnt);
            if st.contains(want) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{st}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    assert_eq!(numbers(), before);
    assert_eq!(contents(&mnt), files);
    m.unmount();
    m.check();
}
