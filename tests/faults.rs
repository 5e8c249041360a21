//! The filesystem on a device that misbehaves (`dev::fault`), driven
//! through the Fs layer:
//!
//! - a failed write or flush, at every write of a commit, shuts the
//!   filesystem down cleanly and the image keeps its last commit;
//! - a torn, lost or misdirected tree block write, at every tree block of
//!   a commit, is found when read: a reopened image never returns wrong
//!   data, only EIO, and `canopy check` reports what reads refused;
//! - every prefix of the device writes of a POSIX workload (create,
//!   rename, write, fsync, unlink of an open file, xattrs, links,
//!   directories) reopens to exactly the namespace, contents, xattrs and
//!   link counts that one of its fsyncs saw.

mod common;

use canopy::dev::crash::{RecordingDevice, Replayer};
use canopy::dev::fault::{Fault, FaultyDevice, Sized};
use canopy::dev::{Device, MemDevice};
use canopy::fs::{Fs, Owner};
use canopy::{Engine, FormatOptions, OpenOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

const ME: Owner = Owner { uid: 0, gid: 0 };
const ROOT: u64 = 256;
const NODESIZE: u32 = 16384;

/// What POSIX shows of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    mode: u32,
    nlink: u32,
    size: u64,
    /// crc32c of the file contents or symlink target.
    data: u32,
    /// Names and crc32c of values.
    xattrs: BTreeMap<String, u32>,
}

type Tree = BTreeMap<String, Seen>;

/// Everything reachable from the root, by path. Reads that fail are
/// returned as the error.
fn observe(fs: &Fs) -> canopy::Result<Tree> {
    let mut out = Tree::new();
    let mut todo = vec![(String::new(), ROOT)];
    while let Some((path, dir)) = todo.pop() {
        for (_, ino, _, name) in fs.readdir(dir, 2, 1 << 20)? {
            let name = String::from_utf8_lossy(&name).into_owned();
            let p = format!("{path}/{name}");
            let a = fs.getattr(ino)?;
            let data = match a.mode & libc::S_IFMT {
                libc::S_IFREG => fs.read(ino, 0, a.size as u32)?,
                libc::S_IFLNK => fs.readlink(ino)?,
                libc::S_IFDIR => {
                    todo.push((p.clone(), ino));
                    Vec::new()
                }
                _ => Vec::new(),
            };
            let data = crc32c::crc32c(&data);
            let mut xattrs = BTreeMap::new();
            for n in fs
                .listxattr(ino)?
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
            {
                let v = fs.getxattr(ino, n)?;
                xattrs.insert(String::from_utf8_lossy(n).into_owned(), crc32c::crc32c(&v));
            }
            let seen = Seen {
                mode: a.mode,
                nlink: a.nlink,
                size: a.size,
                data,
                xattrs,
            };
            out.insert(p, seen);
        }
    }
    Ok(out)
}

fn fresh_image(size: u64) -> Vec<u8> {
    let dev = Arc::new(MemDevice::new(size));
    let opts = FormatOptions {
        nodesize: NODESIZE,
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).unwrap();
    drop(Fs::new(Arc::new(e)).unwrap());
    dev.snapshot()
}

fn open_fs(dev: Arc<dyn Device>) -> canopy::Result<Fs> {
    Fs::new(Arc::new(Engine::open(dev, &OpenOptions::default())?))
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + seed * 13) % 251) as u8)
        .collect()
}

/// The first state: a few directories, files of every size class,
/// symlinks, hard links and xattrs.
fn populate(fs: &Fs) -> canopy::Result<()> {
    let d = fs
        .create(ROOT, b"d", libc::S_IFDIR | 0o755, 0, ME, None)?
        .ino;
    for (i, len) in [0usize, 100, 3000, 9000, 200_000].into_iter().enumerate() {
        let f = fs.create(
            d,
            format!("f{i}").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            ME,
            None,
        )?;
        fs.write(f.ino, 0, &pattern(i, len))?;
        fs.setxattr(f.ino, b"user.n", format!("{i}").as_bytes(), 0)?;
    }
    fs.create(ROOT, b"ln", libc::S_IFLNK | 0o777, 0, ME, Some(b"d/f1"))?;
    let f = fs.lookup(d, b"f2")?;
    fs.link(f.ino, ROOT, b"hard")?;
    fs.sync()
}

/// The second state, changing a bit of everything the first made.
fn change(fs: &Fs) -> canopy::Result<()> {
    let d = fs.lookup(ROOT, b"d")?.ino;
    fs.rename(d, b"f1", ROOT, b"moved", false, false)?;
    let f3 = fs.lookup(d, b"f3")?.ino;
    fs.write(f3, 4096, &pattern(77, 20_000))?;
    fs.remove(d, b"f0", false)?;
    let e = fs
        .create(ROOT, b"e", libc::S_IFDIR | 0o700, 0, ME, None)?
        .ino;
    let g = fs.create(e, b"g", libc::S_IFREG | 0o600, 0, ME, None)?;
    fs.write(g.ino, 0, &pattern(5, 70_000))?;
    fs.setxattr(g.ino, b"user.big", &[3u8; 3000], 0)?;
    fs.removexattr(fs.lookup(d, b"f4")?.ino, b"user.n")?;
    fs.sync()
}

/// A failed write (at every write of the commit in turn) or barrier: the
/// filesystem shuts down, keeps refusing changes, and the image holds
/// the first state or, where the failure came after the new superblock
/// was durable, the second; never anything else.
#[test]
fn failed_writes_and_flushes_keep_the_last_commit() {
    let base = fresh_image(48 << 20);
    let (first, second) = {
        let dev = Arc::new(MemDevice::from_bytes(base.clone()));
        let fs = open_fs(dev.clone()).unwrap();
        populate(&fs).unwrap();
        let first = observe(&fs).unwrap();
        change(&fs).unwrap();
        (first, observe(&fs).unwrap())
    };
    let mut faults: Vec<Fault> = (0..400)
        .map(|nth| Fault::FailWrite {
            nth,
            only: Sized::EachBlock(4096),
        })
        .collect();
    faults.extend((0..4).map(|nth| Fault::FailBarrier { nth }));
    let (mut fired, mut kept_second) = (0, 0);
    for fault in faults {
        let dev = Arc::new(FaultyDevice::new(MemDevice::from_bytes(base.clone())));
        let fs = open_fs(dev.clone()).unwrap();
        populate(&fs).unwrap();
        dev.arm(fault);
        let r = change(&fs);
        if !dev.fired() {
            assert!(r.is_ok(), "{fault:?} did not fire, yet: {r:?}");
            if matches!(fault, Fault::FailWrite { .. }) {
                break; // past the last write of the commit
            }
            continue;
        }
        fired += 1;
        assert!(r.is_err(), "{fault:?}: the change reported success");
        let why = fs.engine().shutdown_reason();
        assert!(why.is_some(), "{fault:?}: the filesystem kept running");
        let later = fs.create(ROOT, b"later", libc::S_IFREG | 0o644, 0, ME, None);
        assert_eq!(later.map(|_| ()).unwrap_err().errno(), libc::EIO);
        drop(fs);
        let img = dev.inner().snapshot();
        let copy = Arc::new(MemDevice::from_bytes(img.clone()));
        let report = canopy::check::check_all(copy, &|_, _| {}).unwrap();
        assert!(report.is_clean(), "{fault:?}: {:#?}", report.problems);
        let fs = open_fs(Arc::new(MemDevice::from_bytes(img))).unwrap();
        let now = observe(&fs).unwrap();
        assert!(now == first || now == second, "{fault:?}: neither state");
        kept_second += usize::from(now == second);
    }
    eprintln!("{fired} failures injected, {kept_second} after the commit point");
    assert!(fired > 20);
}

/// A tree block write that is torn, lost or misdirected (each tree block
/// write of the commit in turn) is found when the block is read: the
/// reopened filesystem gives the right data or EIO, and where it gives
/// EIO (or cannot open), `canopy check` reports damage.
#[test]
fn torn_lost_and_misdirected_tree_blocks_are_detected() {
    let base = fresh_image(48 << 20);
    let second = {
        let dev = Arc::new(MemDevice::from_bytes(base.clone()));
        let fs = open_fs(dev.clone()).unwrap();
        populate(&fs).unwrap();
        change(&fs).unwrap();
        observe(&fs).unwrap()
    };
    let only = Sized::EachBlock(NODESIZE as usize);
    let (mut runs, mut detected) = (0, 0);
    for nth in 0..200 {
        let kinds = [
            Fault::TornWrite { nth, only },
            Fault::LostWrite { nth, only },
            Fault::MisdirectedWrite {
                nth,
                only,
                by: 3 * i64::from(NODESIZE),
            },
        ];
        let mut any = false;
        for fault in kinds {
            let dev = Arc::new(FaultyDevice::new(MemDevice::from_bytes(base.clone())));
            let fs = open_fs(dev.clone()).unwrap();
            populate(&fs).unwrap();
            dev.arm(fault);
            let r = change(&fs);
            let fired = dev.fired();
            drop(fs);
            if !fired {
                continue;
            }
            any = true;
            runs += 1;
            // The damaged block may be read back in the same session (from
            // the cache it is not; from disk it is caught): EIO is fine.
            let _ = r;
            let img = dev.inner().snapshot();
            let refused = match open_fs(Arc::new(MemDevice::from_bytes(img.clone()))) {
                Err(_) => true,
                Ok(fs) => {
                    let r = observe_each(&fs, &second, &fault);
                    drop(fs);
                    r
                }
            };
            let copy = Arc::new(MemDevice::from_bytes(img));
            let report = canopy::check::check_all(copy, &|_, _| {}).unwrap();
            if refused {
                detected += 1;
                assert!(!report.is_clean(), "{fault:?}: EIO, but check is clean");
            }
        }
        if !any {
            break;
        }
    }
    eprintln!("{runs} silent faults injected, {detected} hit a live block");
    assert!(runs >= 15 && detected > 0);
}

/// Reads every path of `want`; each read gives exactly what was written
/// or an error. Returns whether any read was refused.
fn observe_each(fs: &Fs, want: &Tree, fault: &Fault) -> bool {
    match observe(fs) {
        Ok(seen) => {
            let differ: Vec<_> = seen
                .iter()
                .filter(|(p, s)| want.get(*p) != Some(s))
                .map(|(p, _)| p)
                .chain(want.keys().filter(|p| !seen.contains_key(*p)))
                .collect();
            assert!(
                differ.is_empty(),
                "{fault:?}: wrong data returned for {differ:?}"
            );
            false
        }
        Err(e) => {
            assert_eq!(e.errno(), libc::EIO, "{e}");
            true
        }
    }
}

/// Every prefix of the device writes of a POSIX workload reopens to the
/// state one of its fsyncs saw: the last completed one or the one in
/// flight, with the open-but-unlinked file gone.
#[test]
fn every_prefix_of_a_posix_workload_is_a_state_an_fsync_saw() {
    let base = Arc::new(fresh_image(40 << 20));
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let fs = open_fs(rec.clone()).unwrap();
    // The open commits once (a log chain of its own): the image holds
    // the same files at the generation before it.
    let opened = fs.engine().committed_generation();
    let at_open = observe(&fs).unwrap();
    let mut states = vec![(opened - 1, at_open.clone()), (opened, at_open)];
    let mut ends = vec![0usize, rec.op_count()];
    let mut synced = |fs: &Fs, states: &mut Vec<(u64, Tree)>| {
        fs.sync().unwrap();
        states.push((fs.engine().committed_generation(), observe(fs).unwrap()));
        ends.push(rec.op_count());
    };
    populate(&fs).unwrap();
    synced(&fs, &mut states);
    // An open file unlinked, then written through its handle: it must
    // vanish at mount, its space with it.
    let doomed = fs
        .create(ROOT, b"tmp", libc::S_IFREG | 0o600, 0, ME, None)
        .unwrap()
        .ino;
    fs.write(doomed, 0, &pattern(8, 30_000)).unwrap();
    synced(&fs, &mut states);
    fs.open(doomed);
    fs.remove(ROOT, b"tmp", false).unwrap();
    fs.write(doomed, 0, &pattern(9, 50_000)).unwrap();
    synced(&fs, &mut states);
    change(&fs).unwrap();
    synced(&fs, &mut states);
    let x = fs.lookup(ROOT, b"moved").unwrap().ino;
    fs.rename(ROOT, b"moved", ROOT, b"hard", false, false)
        .unwrap();
    fs.setxattr(x, b"user.after", b"rename", 0).unwrap();
    fs.remove(ROOT, b"ln", false).unwrap();
    fs.create(
        ROOT,
        b"ln",
        libc::S_IFLNK | 0o777,
        0,
        ME,
        Some(&[b'y'; 3000]),
    )
    .unwrap();
    synced(&fs, &mut states);
    fs.release(doomed).unwrap();
    synced(&fs, &mut states);
    drop(fs);

    let mut rp = Replayer::new(base, rec.ops());
    let mut images = 0;
    for prefix in 0..=rp.len() {
        let keeps: [&dyn Fn(usize) -> bool; 5] = [
            &|_| true,
            &|_| false,
            &|i| i % 3 == 0,
            &|i| i % 2 == 1,
            &|i| i % 7 != 3,
        ];
        for keep in keeps {
            let dev = Arc::new(rp.at(prefix, keep));
            // As the crash left it: the open, and then mounting (which
            // deletes orphans), commit.
            let g = canopy::txn::read_best_superblock(dev.as_ref())
                .unwrap_or_else(|e| panic!("prefix {prefix}: no superblock: {e}"))
                .generation;
            let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default())
                .unwrap_or_else(|e| panic!("prefix {prefix}: open failed: {e}"));
            let fs = Fs::new(Arc::new(e)).unwrap();
            let done = ends.iter().rposition(|&e| e <= prefix).unwrap();
            let now = observe(&fs).unwrap_or_else(|e| panic!("prefix {prefix}: {e}"));
            let (g_done, s_done) = &states[done];
            let ok = (g == *g_done && now == *s_done)
                || states
                    .get(done + 1)
                    .is_some_and(|(g1, s1)| g == *g1 && now == *s1);
            assert!(
                ok,
                "prefix {prefix}: generation {g} is not a state an fsync saw"
            );
            drop(fs);
            let report = canopy::check::check_all(dev as Arc<dyn Device>, &|_, _| {}).unwrap();
            assert!(report.is_clean(), "prefix {prefix}: {:#?}", report.problems);
            images += 1;
        }
    }
    eprintln!("POSIX crash workload: {} ops, {images} images", rp.len());
}
