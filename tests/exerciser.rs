//! A random file-operation exerciser through the real mount, compared with
//! an in-memory model after every read, with unmount/remount and kill -9 +
//! remount (where everything up to the last fsync must have survived, and
//! nothing after it: periodic commits are switched off for this, and the
//! mount uses `notreelog` so that an fsync commits everything, which this
//! whole-state model needs; fsync through the log, which makes only the
//! file durable, has its own crash tests in tests/fsync_log.rs). Now and
//! then it takes a read-only snapshot of the top level with `canopy
//! subvolume snapshot -r` (checked against a copy of the model, and after
//! every remount) or deletes one.
//!
//! `CANOPY_EXERCISER_OPS` sets the number of operations (CI: a few
//! thousand; see docs/testing.md for the long run) and
//! `CANOPY_EXERCISER_SEED` the seed, `CANOPY_EXERCISER_REMOUNT_DIV=N` keeps
//! only 1 in N of the remount and kill -9 steps (for long runs).

mod common;

use common::mounted::{can_mount, canopy, Mounted};
use common::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

#[derive(Clone, Default)]
struct Model {
    /// File contents by inode id; names point at ids (hard links share).
    files: BTreeMap<u64, Vec<u8>>,
    names: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    next_id: u64,
    /// Read-only snapshots of the top level, by name: the state when each
    /// was taken. Snapshots that existed then appear in it as empty
    /// directories (`stubs`), as nested subvolumes do in btrfs.
    snaps: BTreeMap<String, Snap>,
}

#[derive(Clone)]
struct Snap {
    files: Model,
    stubs: Vec<String>,
}

/// Most snapshots alive at once.
const MAX_SNAPS: usize = 3;

const DIRS: [&str; 3] = ["", "a/", "a/b/"];

impl Model {
    fn file_names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }
}

fn pick<T: Clone>(rng: &mut Rng, v: &[T]) -> Option<T> {
    (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize].clone())
}

fn random_name(rng: &mut Rng, m: &Model) -> String {
    let dirs: Vec<&str> = DIRS
        .iter()
        .copied()
        .filter(|d| d.is_empty() || m.dirs.contains(d.trim_end_matches('/')))
        .collect();
    format!(
        "{}f{}",
        dirs[rng.below(dirs.len() as u64) as usize],
        rng.below(12)
    )
}

fn verify_file(mnt: &Mounted, m: &Model, name: &str) {
    let want = &m.files[&m.names[name]];
    let got = fs::read(mnt.p(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
    assert!(
        got.len() == want.len() && got == *want,
        "{name}: {} bytes, model {}",
        got.len(),
        want.len()
    );
}

fn verify_all(mnt: &Mounted, m: &Model) {
    let snaps: Vec<String> = m.snaps.keys().cloned().collect();
    verify_tree(mnt, m, "", &snaps);
    for (name, snap) in &m.snaps {
        verify_tree(mnt, &snap.files, &format!("{name}/"), &snap.stubs);
        for stub in &snap.stubs {
            let stub_dir = mnt.p(&format!("{name}/{stub}"));
            assert_eq!(
                fs::read_dir(&stub_dir).map(|d| d.count()).ok(),
                Some(0),
                "{name}/{stub}: a snapshot inside a snapshot is an empty directory"
            );
        }
    }
}

/// The files and directories of model `m` under `root` ("" or "sN/"),
/// whose top directory also holds the links of `subvolumes`.
fn verify_tree(mnt: &Mounted, m: &Model, root: &str, subvolumes: &[String]) {
    for name in m.names.keys() {
        let want = &m.files[&m.names[name]];
        let path = format!("{root}{name}");
        let got = fs::read(mnt.p(&path)).unwrap_or_else(|e| panic!("read {path}: {e}"));
        assert!(
            got == *want,
            "{path}: {} bytes, model {}",
            got.len(),
            want.len()
        );
    }
    for d in ["", "a", "a/b"] {
        let at = format!("{root}{d}");
        if !d.is_empty() && !m.dirs.contains(d) {
            assert!(!mnt.p(&at).exists(), "{at} should not exist");
            continue;
        }
        let mut got: Vec<String> = fs::read_dir(mnt.p(&at))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        got.sort();
        let prefix = if d.is_empty() {
            String::new()
        } else {
            format!("{d}/")
        };
        let mut want: Vec<String> = m
            .names
            .keys()
            .filter_map(|n| {
                n.strip_prefix(&prefix)
                    .filter(|r| !r.contains('/'))
                    .map(str::to_string)
            })
            .chain(m.dirs.iter().filter_map(|x| {
                x.strip_prefix(&prefix)
                    .filter(|r| !r.contains('/'))
                    .map(str::to_string)
            }))
            .collect();
        if d.is_empty() {
            want.extend(m.dirs.iter().filter(|x| !x.contains('/')).cloned());
            want.extend(subvolumes.iter().cloned());
        }
        want.sort();
        want.dedup();
        assert_eq!(got, want, "listing of '{at}'");
    }
}

/// One random operation. `remount_div` thins out unmount/remount and
/// kill -9 steps (1 in `remount_div` of the draws that pick them is kept)
/// so that long runs spend their time on file operations.
fn step(mnt: &mut Mounted, m: &mut Model, durable: &mut Model, rng: &mut Rng, remount_div: u64) {
    if rng.below(120) == 0 {
        snapshot_step(mnt, m, rng);
        // A snapshot of the top level flushes and commits everything;
        // after a deletion the step syncs.
        *durable = m.clone();
        return;
    }
    let names = m.file_names();
    let mut draw = rng.below(100);
    while draw >= 91 && rng.below(remount_div) != 0 {
        draw = rng.below(100);
    }
    match draw {
        0..=29 => {
            let name = pick(rng, &names).unwrap_or_else(|| random_name(rng, m));
            let off = if rng.below(4) == 0 {
                rng.below(3 << 20)
            } else {
                rng.below(70_000)
            };
            let len = if rng.below(5) == 0 {
                rng.below(1 << 20) + 1
            } else {
                rng.below(9000) + 1
            };
            let byte = rng.below(256) as u8;
            let f = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(mnt.p(&name))
                .unwrap();
            f.write_all_at(&vec![byte; len as usize], off).unwrap();
            let id = *m.names.entry(name.clone()).or_insert_with(|| {
                m.next_id += 1;
                m.next_id
            });
            let c = m.files.entry(id).or_default();
            let end = (off + len) as usize;
            if c.len() < end {
                c.resize(end, 0);
            }
            c[off as usize..end].fill(byte);
        }
        30..=39 => {
            if let Some(name) = pick(rng, &names) {
                verify_file(mnt, m, &name);
                let c = &m.files[&m.names[&name]];
                let f = fs::File::open(mnt.p(&name)).unwrap();
                let o = rng.below(c.len() as u64 + 1);
                // SAFETY: lseek on an open descriptor.
                let d = unsafe { libc::lseek(f.as_raw_fd(), o as i64, libc::SEEK_DATA) };
                if d >= 0 {
                    assert!(
                        c[o as usize..d as usize].iter().all(|&b| b == 0),
                        "SEEK_DATA skipped data in {name}"
                    );
                } else {
                    assert!(c[(o as usize).min(c.len())..].iter().all(|&b| b == 0));
                }
            }
        }
        40..=46 => {
            if let Some(name) = pick(rng, &names) {
                let size = rng.below(200_000);
                fs::OpenOptions::new()
                    .write(true)
                    .open(mnt.p(&name))
                    .unwrap()
                    .set_len(size)
                    .unwrap();
                m.files
                    .get_mut(&m.names[&name])
                    .unwrap()
                    .resize(size as usize, 0);
            }
        }
        47..=52 => {
            if let Some(name) = pick(rng, &names) {
                let f = fs::OpenOptions::new()
                    .write(true)
                    .open(mnt.p(&name))
                    .unwrap();
                let c = m.files.get_mut(&m.names[&name]).unwrap();
                let off = rng.below(c.len() as u64 + 10_000);
                let len = rng.below(50_000) + 1;
                let (mode, keep) = match rng.below(3) {
                    0 => (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, true),
                    1 => (libc::FALLOC_FL_ZERO_RANGE, false),
                    _ => (0, false),
                };
                // SAFETY: fallocate on an open descriptor.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
                assert_eq!(r, 0, "fallocate mode {mode}");
                let end = (off + len) as usize;
                if mode != 0 {
                    let stop = if keep { end.min(c.len()) } else { end };
                    if c.len() < stop {
                        c.resize(stop, 0);
                    }
                    if (off as usize) < stop {
                        c[off as usize..stop].fill(0);
                    }
                } else if c.len() < end {
                    c.resize(end, 0);
                }
            }
        }
        53..=58 => {
            if let (Some(a), Some(b)) = (pick(rng, &names), pick(rng, &names)) {
                let src_c = m.files[&m.names[&a]].clone();
                let aligned = rng.below(2) == 0;
                let mut so = rng.below(src_c.len() as u64 + 1);
                let mut dof = rng.below(100_000);
                if aligned {
                    so &= !4095;
                    dof &= !4095;
                }
                let len = rng.below(300_000) + 1;
                let (fi, fo) = (
                    fs::File::open(mnt.p(&a)).unwrap(),
                    fs::OpenOptions::new().write(true).open(mnt.p(&b)).unwrap(),
                );
                let (mut oi, mut oo) = (so as i64, dof as i64);
                // SAFETY: valid descriptors and offsets.
                let n = unsafe {
                    libc::copy_file_range(
                        fi.as_raw_fd(),
                        &mut oi,
                        fo.as_raw_fd(),
                        &mut oo,
                        len as usize,
                        0,
                    )
                };
                let same = m.names[&a] == m.names[&b];
                let eff = len.min(src_c.len() as u64 - so);
                let overlap = same && eff > 0 && so < dof + eff && dof < so + eff;
                if overlap {
                    // The kernel refuses overlapping copies within a file.
                    assert_eq!(n, -1);
                    return;
                }
                assert!(
                    n >= 0,
                    "copy_file_range failed: {}",
                    std::io::Error::last_os_error()
                );
                let n = n as usize;
                if n > 0 {
                    let bytes = src_c[so as usize..so as usize + n].to_vec();
                    let c = m.files.get_mut(&m.names[&b]).unwrap();
                    let end = dof as usize + n;
                    if c.len() < end {
                        c.resize(end, 0);
                    }
                    c[dof as usize..end].copy_from_slice(&bytes);
                }
            }
        }
        59..=66 => {
            if let Some(a) = pick(rng, &names) {
                let b = random_name(rng, m);
                if a != b && !m.dirs.contains(&b) {
                    fs::rename(mnt.p(&a), mnt.p(&b)).unwrap();
                    if m.names.get(&b) == m.names.get(&a) {
                        // Two links of one file: POSIX rename does nothing.
                        return;
                    }
                    let id = m.names.remove(&a).unwrap();
                    if let Some(old) = m.names.insert(b, id) {
                        if !m.names.values().any(|&v| v == old) {
                            m.files.remove(&old);
                        }
                    }
                }
            }
        }
        67..=70 => {
            if let Some(a) = pick(rng, &names) {
                let b = random_name(rng, m);
                if !m.names.contains_key(&b) && !m.dirs.contains(&b) {
                    fs::hard_link(mnt.p(&a), mnt.p(&b)).unwrap();
                    let id = m.names[&a];
                    m.names.insert(b, id);
                }
            }
        }
        71..=78 => {
            if let Some(a) = pick(rng, &names) {
                fs::remove_file(mnt.p(&a)).unwrap();
                let id = m.names.remove(&a).unwrap();
                if !m.names.values().any(|&v| v == id) {
                    m.files.remove(&id);
                }
            }
        }
        79..=82 => {
            let d = if m.dirs.contains("a") { "a/b" } else { "a" };
            if !m.dirs.contains(d) {
                fs::create_dir(mnt.p(d)).unwrap();
                m.dirs.insert(d.to_string());
            } else {
                let prefix = format!("{d}/");
                let empty = !m.names.keys().any(|n| n.starts_with(&prefix))
                    && !m.dirs.iter().any(|x| x.starts_with(&prefix));
                let r = fs::remove_dir(mnt.p(d));
                assert_eq!(r.is_ok(), empty, "rmdir {d}");
                if empty {
                    m.dirs.remove(d);
                }
            }
        }
        83..=90 => {
            if let Some(a) = pick(rng, &names) {
                fs::File::open(mnt.p(&a)).unwrap().sync_all().unwrap();
                *durable = m.clone();
            }
        }
        91..=94 => {
            verify_all(mnt, m);
            mnt.unmount();
            mnt.check();
            mnt.mount("commit=3600,notreelog");
            *durable = m.clone();
            verify_all(mnt, m);
        }
        _ => {
            mnt.kill9();
            mnt.check();
            mnt.mount("commit=3600,notreelog");
            *m = durable.clone();
            verify_all(mnt, m);
        }
    }
}

/// `canopy subvolume` through the mount: a read-only snapshot of the top
/// level (which must equal the model and refuse changes), or the deletion
/// of one, sometimes waiting for the cleaner.
fn snapshot_step(mnt: &Mounted, m: &mut Model, rng: &mut Rng) {
    let run = |args: &[&str]| {
        let out = canopy().args(args).current_dir(&mnt.mnt).output().unwrap();
        assert!(
            out.status.success(),
            "canopy {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let names: Vec<String> = m.snaps.keys().cloned().collect();
    if names.len() < MAX_SNAPS && (names.is_empty() || rng.below(2) == 0) {
        let name = format!("s{}", rng.below(1000));
        if m.snaps.contains_key(&name) {
            return;
        }
        run(&["subvolume", "snapshot", "-r", ".", &name]);
        let mut files = m.clone();
        files.snaps.clear();
        let snap = Snap {
            files,
            stubs: names,
        };
        verify_tree(mnt, &snap.files, &format!("{name}/"), &snap.stubs);
        if let Some(f) = snap.files.names.keys().next() {
            let r = fs::OpenOptions::new()
                .write(true)
                .open(mnt.p(&format!("{name}/{f}")));
            assert_eq!(
                r.err().and_then(|e| e.raw_os_error()),
                Some(libc::EROFS),
                "a read-only snapshot refuses writes"
            );
        }
        m.snaps.insert(name, snap);
    } else if let Some(name) = pick(rng, &names) {
        run(&["subvolume", "delete", &name]);
        m.snaps.remove(&name);
        assert!(!mnt.p(&name).exists(), "{name} deleted");
        if rng.below(2) == 0 {
            run(&["subvolume", "sync", "."]);
        }
        // The deletion commits, but (as a periodic commit of btrfs) it
        // does not flush other files' buffered data: make it all durable
        // so the model's crash state is this one.
        run(&["sync", "."]);
    }
}

#[test]
fn random_operations_match_the_model() {
    exercise("512M", 3000);
}

/// The same on an image of the size users have: split data and metadata
/// block groups, and new groups made while fsyncs and crashes happen (the
/// small mixed images rarely need one).
#[test]
fn random_operations_match_the_model_on_a_4_gib_image() {
    exercise("4G", 1500);
}

/// Runs `CANOPY_EXERCISER_OPS` (else `default_ops`) random operations on
/// a fresh image of `size`.
fn exercise(size: &str, default_ops: u64) {
    if !can_mount() {
        return;
    }
    let ops: u64 = std::env::var("CANOPY_EXERCISER_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_ops);
    let seed: u64 = std::env::var("CANOPY_EXERCISER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c0de);
    let remount_div: u64 = std::env::var("CANOPY_EXERCISER_REMOUNT_DIV")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut mnt = Mounted::with_size(size);
    mnt.unmount();
    mnt.mount("commit=3600,notreelog");
    let mut m = Model::default();
    let mut durable = Model::default();
    let mut rng = Rng(seed | 1);
    for i in 0..ops {
        step(&mut mnt, &mut m, &mut durable, &mut rng, remount_div);
        if i % 10_000 == 9_999 {
            eprintln!("exerciser: {} operations", i + 1);
        }
    }
    verify_all(&mnt, &m);
    mnt.unmount();
    mnt.check();
}
