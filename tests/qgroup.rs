//! Quota groups below the mount: numbers after snapshots, overwrites,
//! reflinks, deletions and group changes, each compared with a count
//! made from scratch after every commit; limits (EDQUOT) and that
//! deleting always works.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::format::qgroup::qgroupid;
use canopy::fs::{Fs, QgroupRow, QuotaChange};
use canopy::{Engine, OpenOptions};
use common::paths::{file, ME};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const ROOT: u64 = 256;

fn fresh() -> (Arc<MemDevice>, Fs) {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    fs.quota(QuotaChange::Enable).expect("enable");
    (dev, fs)
}

/// Commits and requires the recorded numbers to equal a fresh count.
fn assert_exact(fs: &Fs) {
    fs.sync().expect("sync");
    common::assert_quota_exact(fs, "after a commit");
}

fn row(fs: &Fs, id: &str) -> QgroupRow {
    fs.qgroup_show()
        .expect("show")
        .into_iter()
        .find(|r| r.qgroupid == id)
        .unwrap_or_else(|| panic!("no qgroup {id}"))
}

/// A subvolume "home" holding `n` files `f0000`, `f0001`, ... of
/// `base + (i % cycle) * step` 4-byte words each: its node and the files'
/// names and nodes.
fn home_with_files(
    fs: &Fs,
    n: u32,
    base: usize,
    cycle: usize,
    step: usize,
) -> (u64, Vec<(String, u64)>) {
    let home = fs.create_subvolume(ROOT, b"home", ME).expect("subvol").ino;
    let files = (0..n)
        .map(|i| {
            let name = format!("f{i:04}");
            let data = i.to_le_bytes().repeat(base + (i as usize % cycle) * step);
            let node = file(fs, home, &name, &data);
            (name, node)
        })
        .collect();
    (home, files)
}

fn subvol_id(fs: &Fs, name: &str) -> u64 {
    let node = fs.lookup(ROOT, name.as_bytes()).expect("subvolume").ino;
    fs.qgroup_of_node(node).expect("qgroup")
}

#[test]
fn numbers_follow_writes_snapshots_and_deletions() {
    let (dev, fs) = fresh();
    let home = fs.create_subvolume(ROOT, b"home", ME).expect("subvol").ino;
    let big = vec![7u8; 4 * MIB as usize];
    let f = file(&fs, home, "big", &big);
    file(&fs, home, "small", b"hello");
    assert_exact(&fs);
    let h = row(&fs, "0/256");
    assert!(h.referenced >= 4 * MIB, "{h:?}");
    assert_eq!(h.referenced, h.exclusive, "nothing is shared yet");

    fs.snapshot(home, ROOT, b"snap", true).expect("snapshot");
    assert_exact(&fs);
    let (h, s) = (row(&fs, "0/256"), row(&fs, "0/257"));
    assert_eq!(
        s.referenced, h.referenced,
        "a snapshot references what its source does"
    );
    assert!(
        h.exclusive < 64 << 10,
        "the source's data is shared now: {h:?}"
    );

    // Overwriting half of the file in the source makes that half its own
    // and the old half the snapshot's own.
    fs.write(f, 0, &vec![9u8; 2 * MIB as usize])
        .expect("overwrite");
    assert_exact(&fs);
    let (h, s) = (row(&fs, "0/256"), row(&fs, "0/257"));
    assert!(
        h.exclusive >= 2 * MIB && s.exclusive >= 2 * MIB,
        "{h:?} {s:?}"
    );

    // A reflink into the top level shares the source's new data.
    let copy = file(&fs, ROOT, "copy", b"");
    fs.copy_range(f, 0, copy, 0, 2 * MIB).expect("reflink");
    assert_exact(&fs);
    assert!(row(&fs, "0/256").exclusive < 2 * MIB);

    // Deleting the snapshot gives its half back to nobody, and the
    // source's numbers are exact at once.
    fs.delete_subvolume(ROOT, b"snap").expect("delete");
    assert_exact(&fs);
    assert!(fs
        .qgroup_show()
        .expect("show")
        .iter()
        .all(|r| r.qgroupid != "0/257"));
    fs.clean_deleted().expect("clean");
    assert_exact(&fs);
    drop(fs);
    common::assert_fs_clean(&dev);
}

#[test]
fn higher_groups_hold_their_members_and_snapshots_join_them() {
    let (_dev, fs) = fresh();
    let a = fs.create_subvolume(ROOT, b"a", ME).expect("a").ino;
    let b = fs.create_subvolume(ROOT, b"b", ME).expect("b").ino;
    let fa = file(&fs, a, "x", &vec![1u8; MIB as usize]);
    file(&fs, b, "y", &vec![2u8; MIB as usize]);
    let group = qgroupid(1, 100);
    fs.quota(QuotaChange::Create(group)).expect("create");
    for sv in ["a", "b"] {
        let child = subvol_id(&fs, sv);
        fs.quota(QuotaChange::Assign {
            child,
            parent: group,
        })
        .expect("assign");
    }
    assert_exact(&fs);
    let g = row(&fs, "1/100");
    let (ra, rb) = (row(&fs, "0/256"), row(&fs, "0/257"));
    assert_eq!(g.referenced, ra.referenced + rb.referenced);
    assert_eq!(g.exclusive, g.referenced);

    // A reflink from a to b shares within the group: still exclusive to it.
    let fb = file(&fs, b, "z", b"");
    fs.copy_range(fa, 0, fb, 0, MIB).expect("reflink");
    assert_exact(&fs);
    let g = row(&fs, "1/100");
    assert_eq!(g.exclusive, g.referenced);

    // A snapshot of a joins 1/100, so the group's numbers do not move.
    fs.snapshot(a, ROOT, b"a-snap", false).expect("snapshot");
    assert_exact(&fs);
    assert_eq!(row(&fs, "0/258").parents, vec!["1/100".to_string()]);
    assert_eq!(row(&fs, "1/100").exclusive, g.exclusive);

    // Taking it out makes what it shares with a no longer the group's own.
    let snap = subvol_id(&fs, "a-snap");
    fs.quota(QuotaChange::Remove {
        child: snap,
        parent: group,
    })
    .expect("remove");
    assert_exact(&fs);
    assert!(row(&fs, "1/100").exclusive < g.exclusive);
    assert_eq!(
        fs.quota(QuotaChange::Destroy(group)).unwrap_err().errno(),
        libc::ENOTEMPTY
    );
}

#[test]
fn limits_refuse_writes_with_edquot_and_deleting_still_works() {
    let (dev, fs) = fresh();
    let home = fs.create_subvolume(ROOT, b"home", ME).expect("subvol").ino;
    let q = subvol_id(&fs, "home");
    fs.quota(QuotaChange::Limit {
        qgroupid: q,
        bytes: Some(3 * MIB),
        exclusive: false,
    })
    .expect("limit");
    let f = file(&fs, home, "a", &vec![1u8; 2 * MIB as usize]);
    let err = fs
        .write(f, 2 * MIB, &vec![1u8; 2 * MIB as usize])
        .unwrap_err();
    assert_eq!(err.errno(), libc::EDQUOT);
    assert_eq!(
        fs.getattr(f).expect("stat").size,
        2 * MIB,
        "nothing written"
    );
    // Other subvolumes are not limited.
    file(&fs, ROOT, "free", &vec![1u8; 4 * MIB as usize]);
    // Deleting works, and frees the quota.
    fs.remove(home, b"a", false).expect("unlink");
    assert_exact(&fs);
    let f = file(&fs, home, "b", &vec![1u8; 2 * MIB as usize]);
    assert_exact(&fs);
    assert_eq!(row(&fs, "0/256").max_referenced, Some(3 * MIB));
    // The limit survives a remount.
    fs.sync().expect("sync");
    drop(fs);
    let e = Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    assert_eq!(
        fs.write(f, 2 * MIB, &vec![1u8; 2 * MIB as usize])
            .unwrap_err()
            .errno(),
        libc::EDQUOT
    );
    // fallocate and a reflink from another subvolume count too, and
    // change nothing when refused.
    let g = fs
        .create(home, b"g", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create")
        .ino;
    assert_eq!(
        fs.fallocate(g, 0, 2 * MIB, 0).unwrap_err().errno(),
        libc::EDQUOT
    );
    assert_eq!(fs.getattr(g).expect("stat").size, 0);
    let outside = file(&fs, ROOT, "outside", &vec![4u8; 2 * MIB as usize]);
    assert_eq!(
        fs.copy_range(outside, 0, g, 0, 2 * MIB)
            .unwrap_err()
            .errno(),
        libc::EDQUOT
    );
    assert_eq!(fs.getattr(g).expect("stat").size, 0);
    // Within the limit both work.
    fs.fallocate(g, 0, 64 * 1024, 0).expect("small fallocate");
    fs.copy_range(outside, 0, g, 64 * 1024, 64 * 1024)
        .expect("small reflink");
    assert_exact(&fs);
    fs.quota(QuotaChange::Limit {
        qgroupid: q,
        bytes: None,
        exclusive: false,
    })
    .expect("no limit");
    fs.write(f, 2 * MIB, &vec![1u8; 2 * MIB as usize])
        .expect("write without limit");
    assert_exact(&fs);
}

#[test]
fn disabled_quotas_answer_enotconn_and_enable_counts_what_exists() {
    let (_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    assert_eq!(fs.qgroup_show().unwrap_err().errno(), libc::ENOTCONN);
    file(&fs, ROOT, "a", &vec![3u8; MIB as usize]);
    fs.quota(QuotaChange::Enable).expect("enable");
    assert_exact(&fs);
    assert!(row(&fs, "0/5").referenced >= MIB);
    fs.quota(QuotaChange::Disable).expect("disable");
    assert_eq!(fs.qgroup_show().unwrap_err().errno(), libc::ENOTCONN);
}

/// Trees several levels deep shared by many snapshots, some of them
/// changed too: the commit's accounting (which decides membership by
/// searching only the trees a commit changed) equals a fresh count after
/// every commit, through writes, overwrites, removals, renames and new
/// snapshots in the same commits.
#[test]
fn deep_trees_under_many_snapshots_stay_exact() {
    let (_dev, fs) = fresh();
    let (home, mut files) = home_with_files(&fs, 600, 64, 7, 300);
    assert_exact(&fs);
    let mut snaps = Vec::new();
    let mut rng = 0x2545_f491_u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for round in 0..24u32 {
        let name = format!("s{round}");
        let snap = fs
            .snapshot(home, ROOT, name.as_bytes(), round % 3 == 0)
            .expect("snapshot");
        snaps.push((snap.ino, round % 3 == 0));
        for k in 0..3u32 {
            let (_, ino) = &files[next(files.len())];
            fs.write(*ino, u64::from(k) * 4096, &[round as u8; 5000])
                .expect("overwrite");
        }
        // A writable snapshot changes too: its own copies of shared
        // leaves.
        let (s, ro) = snaps[next(snaps.len())];
        if !ro {
            let victim = &files[next(files.len())].0;
            let a = fs.lookup(s, victim.as_bytes()).expect("lookup in snapshot");
            fs.write(a.ino, 0, b"changed in a snapshot").expect("write");
            if round % 4 == 1 {
                fs.remove(s, victim.as_bytes(), false)
                    .expect("unlink in snapshot");
            }
        }
        if round % 5 == 2 {
            let i = next(files.len());
            let (old, ino) = files.remove(i);
            let new = format!("r{round}-{old}");
            fs.rename(home, old.as_bytes(), home, new.as_bytes(), false, false)
                .expect("rename");
            files.push((new, ino));
        }
        if round % 2 == 0 {
            assert_exact(&fs);
        }
    }
    assert_exact(&fs);
}

/// A rescan counts a batch of extents per commit: between its commits
/// the numbers equal a fresh count of the extents below its cursor,
/// while writes, overwrites and snapshots go on; it survives a reopen
/// (the cursor is in the status item) and ends with every number exact.
#[test]
fn a_rescan_counts_in_batches_beside_other_work_and_survives_reopen() {
    let (dev, fs) = fresh();
    let home = fs.create_subvolume(ROOT, b"home", ME).expect("subvol").ino;
    let mut files = Vec::new();
    // Past the inline limit: each file has a data extent.
    for i in 0..4500u32 {
        files.push(file(
            &fs,
            home,
            &format!("f{i}"),
            &i.to_le_bytes().repeat(1250),
        ));
    }
    fs.snapshot(home, ROOT, b"before", false).expect("snapshot");
    assert_exact(&fs);
    let exact = row(&fs, "0/256");

    let partial = |fs: &Fs| common::assert_quota_exact(fs, "mid-rescan");
    let cursor = |fs: &Fs| fs.quota_rescan_status().expect("status");
    // Driven by hand (no rescan thread): each commit counts a batch.
    fs.engine().write(|tx| tx.quota_rescan()).expect("rescan");
    fs.engine().commit().expect("commit");
    let first = cursor(&fs);
    assert!(first.running && first.cursor > 0, "{first:?}");
    partial(&fs);
    assert!(row(&fs, "0/256").referenced < exact.referenced);
    // Work beside it: overwrites of files on both sides of the cursor,
    // a new file and a snapshot, then more batches.
    for (k, &f) in files.iter().enumerate().step_by(97) {
        fs.write(f, 0, &[k as u8; 700]).expect("overwrite");
    }
    file(&fs, home, "new", &[9u8; 50_000]);
    fs.snapshot(home, ROOT, b"during", true).expect("snapshot");
    fs.engine().commit().expect("commit");
    partial(&fs);
    // Stop half-way: the next open carries on from the recorded cursor.
    let at = cursor(&fs);
    drop(fs);
    // Read-only first: a writable open commits, which counts a batch.
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &ro).expect("open read-only");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let again = cursor(&fs);
    assert!(at.running, "three batches at least: {at:?}");
    assert_eq!(again, at);
    partial(&fs);
    drop(fs);
    let e = Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    partial(&fs);
    fs.quota_rescan_wait().expect("wait");
    assert!(!cursor(&fs).running);
    assert_exact(&fs);
    // Through Fs::quota the rescan runs in its own thread.
    fs.quota(QuotaChange::Rescan).expect("rescan");
    fs.quota_rescan_wait().expect("wait");
    assert_exact(&fs);
}

/// Commits since open that counted every number from scratch.
fn recounts(fs: &Fs) -> u64 {
    fs.engine()
        .read(|r| Ok(r.qgroups().recounts()))
        .expect("recounts")
}

/// Deleting a snapshot is accounted from what it reached, not by a count
/// from scratch, and stays exact: the oldest, the newest and one in the
/// middle, writable ones changed after they were taken, one deleted in
/// the commit that also changes its source, and what the cleaner frees
/// afterwards. (Fails if deletions count from scratch, or if the trace
/// misses what one other subvolume now holds alone.)
#[test]
fn deleting_snapshots_is_accounted_by_difference() {
    let (_dev, fs) = fresh();
    let (home, files) = home_with_files(&fs, 400, 100, 5, 1500);
    for s in 0..8u32 {
        let writable = s % 2 == 1;
        let snap = fs
            .snapshot(home, ROOT, format!("s{s}").as_bytes(), !writable)
            .expect("snapshot");
        for k in 0..3u32 {
            let ino = files[((s * 7 + k * 13) % 400) as usize].1;
            fs.write(ino, u64::from(k) * 4096, &[s as u8; 6000])
                .expect("overwrite");
        }
        if writable {
            let a = fs
                .lookup(snap.ino, files[(s * 11) as usize].0.as_bytes())
                .expect("lookup in snapshot");
            fs.write(a.ino, 0, b"changed in the snapshot")
                .expect("write");
        }
        assert_exact(&fs);
    }
    let before = recounts(&fs);
    for (name, change_source) in [("s0", false), ("s7", true), ("s4", false), ("s3", true)] {
        if change_source {
            fs.write(files[5].1, 0, &[0xee; 9000]).expect("write");
        }
        fs.delete_subvolume(ROOT, name.as_bytes()).expect("delete");
        assert_exact(&fs);
        fs.clean_step().expect("cleaner step");
        assert_exact(&fs);
    }
    assert_eq!(
        recounts(&fs),
        before,
        "deleting a snapshot among several counted from scratch"
    );
    // The last ones share little but with home: whichever way the commit
    // takes, the numbers stay exact.
    for name in ["s1", "s2", "s5", "s6"] {
        fs.delete_subvolume(ROOT, name.as_bytes()).expect("delete");
        assert_exact(&fs);
    }
    let h = row(&fs, "0/256");
    assert_eq!(
        h.referenced, h.exclusive,
        "home holds everything alone again"
    );
}
