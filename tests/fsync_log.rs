//! fsync through the log tree, crash by crash: each scenario (the patterns
//! of the kernel's own fsync crash tests) runs on a recording device; the
//! disk a crash could leave after every prefix of its writes (log writes
//! included, and subsets of the writes in flight) is opened, which
//! replays the log, and must hold exactly what was committed or fsynced
//! by then: fsynced files with their content, size and names, nothing
//! half-written. Every image must also pass every pass of `check` after
//! the replay (link counts and nbytes included).

mod common;

use canopy::dev::crash::{RecordingDevice, Replayer};
use canopy::dev::Device;
use canopy::fs::{Fs, Owner, SetAttr};
use canopy::{Engine, OpenOptions};
use std::sync::Arc;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 7) as u8) | 1)
        .collect()
}

/// The inode at `path` ("a/b"), if every component exists.
fn lookup(fs: &Fs, path: &str) -> Option<u64> {
    let mut at = ROOT;
    for part in path.split('/') {
        at = fs.lookup(at, part.as_bytes()).ok()?.ino;
    }
    Some(at)
}

fn content(fs: &Fs, path: &str) -> Option<Vec<u8>> {
    let ino = lookup(fs, path)?;
    let size = fs.getattr(ino).ok()?.size;
    Some(fs.read(ino, 0, size as u32).expect("read"))
}

fn file(fs: &Fs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let a = fs
        .create(parent, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    if !data.is_empty() {
        fs.write(a.ino, 0, data).expect("write");
    }
    a.ino
}

fn mkdir(fs: &Fs, parent: u64, name: &str) -> u64 {
    fs.create(parent, name.as_bytes(), libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("mkdir")
        .ino
}

type Step = Box<dyn Fn(&Fs)>;
type Check = Box<dyn Fn(&Fs, usize) -> Result<(), String>>;

/// The disk a scenario runs on.
#[derive(Clone, Copy)]
struct Layout {
    bytes: u64,
    /// Mixed data+metadata groups (small images) or split ones (images
    /// of 1 GiB and more, scaled down here so new groups come quickly).
    mixed: bool,
    /// Whether an fsync may commit instead of logging (it must when the
    /// log would name a block group no durable superblock knows).
    may_commit: bool,
}

const SMALL_MIXED: Layout = Layout {
    bytes: 64 << 20,
    mixed: true,
    may_commit: false,
};

/// Runs `setup` and commits it, then `steps` (each ends with an fsync)
/// while recording; then opens the image every prefix of the recording
/// leaves and asks `check` about it, given how many steps had returned.
fn crash_every_prefix(name: &str, setup: Step, steps: Vec<Step>, check: Check) {
    crash_every_prefix_on(SMALL_MIXED, name, setup, steps, check)
}

fn format_fs(layout: Layout) -> (Arc<canopy::dev::MemDevice>, Fs) {
    let dev = Arc::new(canopy::dev::MemDevice::new(layout.bytes));
    let opts = canopy::FormatOptions {
        nodesize: 4096,
        fsid: Some([0x42; 16]),
        mixed: Some(layout.mixed),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

/// Every data checksum of the replayed filesystem matches its data.
fn assert_scrub_clean(name: &str, prefix: usize, fs: &Fs) {
    let ctl = canopy::scrub::Control::default();
    let pace = canopy::scrub::Pace { throttle: false };
    let r = canopy::scrub::run(fs.engine(), &ctl, pace)
        .unwrap_or_else(|e| panic!("{name}, prefix {prefix}: scrub failed: {e}"));
    assert!(
        r.is_clean(),
        "{name}, prefix {prefix}: scrub after replay: {:?} {:?} {:?}",
        r.bad_data_sectors,
        r.damaged_files,
        r.bad_tree_blocks
    );
}

fn crash_every_prefix_on(layout: Layout, name: &str, setup: Step, steps: Vec<Step>, check: Check) {
    let (base_dev, fs) = format_fs(layout);
    setup(&fs);
    fs.sync().expect("commit the setup");
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    // Reference changes are folded early and often, so every pattern
    // also runs with some of its extents folded before it is logged.
    let early = OpenOptions {
        settle_early_at: 64,
        ..OpenOptions::default()
    };
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &early).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let commits_before = fs.engine().committed_generation();
    let mut ends = Vec::new();
    for step in &steps {
        step(&fs);
        ends.push(rec.op_count());
    }
    assert!(
        layout.may_commit || fs.engine().committed_generation() == commits_before,
        "{name}: fsync committed instead of logging"
    );
    let ops = rec.ops();
    drop(fs);
    let last = *ends.last().expect("steps");
    let mut rp = Replayer::new(base, ops);
    let mut images = 0;
    for prefix in 0..=last {
        // Since a log write has one barrier, its link may land
        // without some of its blocks or data: the patterns below keep
        // every page, none, every other one, and all but the first.
        for keep in [
            &(|_| true) as &dyn Fn(usize) -> bool,
            &|_| false,
            &|i| i % 2 == 1,
            &|i| i > 0,
        ] {
            let dev = Arc::new(rp.at(prefix, keep));
            let done = ends.iter().filter(|&&e| e <= prefix).count();
            let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default())
                .unwrap_or_else(|err| panic!("{name}, prefix {prefix}: open failed: {err}"));
            let fs = Fs::new(Arc::new(e))
                .unwrap_or_else(|err| panic!("{name}, prefix {prefix}: replay failed: {err}"));
            // The step in flight may show or not: its fsync has not
            // returned, but its log may already be on the disk.
            let ok = check(&fs, done).or_else(|why| match done < steps.len() {
                true => check(&fs, done + 1).map_err(|next| format!("{why}; or {next}")),
                false => Err(why),
            });
            if let Err(why) = ok {
                panic!("{name}, prefix {prefix} ({done} fsyncs returned): {why}");
            }
            assert_scrub_clean(name, prefix, &fs);
            drop(fs);
            common::assert_posix_clean_in_place(dev.clone());
            images += 1;
        }
    }
    eprintln!("{name}: {last} ops, {images} images");
}

fn expect(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why())
    }
}

fn expect_content(fs: &Fs, path: &str, want: Option<&[u8]>) -> Result<(), String> {
    let got = content(fs, path);
    expect(got.as_deref() == want, || {
        format!(
            "{path}: {} bytes, expected {}",
            got.as_ref()
                .map_or("absent".into(), |g| g.len().to_string()),
            want.map_or("absent".into(), |w| w.len().to_string())
        )
    })
}

#[test]
fn a_new_file_in_a_new_directory_survives_its_fsync() {
    let data = pattern(3, 100_000);
    let d = data.clone();
    crash_every_prefix(
        "new file",
        Box::new(|_| {}),
        vec![Box::new(move |fs| {
            let dir = mkdir(fs, ROOT, "d");
            let f = file(fs, dir, "f", &d);
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => expect(lookup(fs, "d").is_none(), || "d before fsync".into()),
            _ => expect_content(fs, "d/f", Some(&data)),
        }),
    );
}

#[test]
fn fsync_after_truncate_and_rewrite() {
    let a = pattern(5, 64 << 10);
    let b = pattern(9, 3000);
    let mut want = a[..3000].to_vec();
    want.extend_from_slice(&b);
    let (a2, b2) = (a.clone(), b.clone());
    crash_every_prefix(
        "truncate",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![Box::new(move |fs| {
            let f = lookup(fs, "f").expect("f");
            let s = SetAttr {
                size: Some(5000),
                ..Default::default()
            };
            fs.setattr(f, &s).expect("truncate");
            fs.write(f, 3000, &b2).expect("write");
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", Some(&a)),
            _ => expect_content(fs, "f", Some(&want)),
        }),
    );
}

/// `canopy filesystem defragment -c` rewrites a committed file's
/// extents compressed (its nbytes falls), then a write and an fsync log
/// the file: the log must carry the rewritten ranges with the new nbytes,
/// or replay would lay that nbytes over the committed, uncompressed items
/// (found by the crash campaign).
#[test]
fn fsync_after_recompressing() {
    use canopy::compress::Codec;
    use canopy::fs::defrag::DefragArgs;
    let a = pattern(3, 512 << 10);
    let b = pattern(11, 4096);
    let mut want = a.clone();
    want[12288..16384].copy_from_slice(&b);
    let a2 = a.clone();
    crash_every_prefix(
        "recompress",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![Box::new(move |fs| {
            let f = lookup(fs, "f").expect("f");
            let mut start = 0;
            let mut recompressed = 0;
            loop {
                let args = DefragArgs {
                    start,
                    threshold: 2 << 20,
                    compress: Some(Codec::Zstd(3)),
                };
                let r = fs.defragment(f, args).expect("recompress");
                recompressed += r.recompressed;
                match r.next {
                    Some(n) => start = n,
                    None => break,
                }
            }
            assert!(recompressed > 0, "nothing recompressed");
            fs.write(f, 12288, &b).expect("write");
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| {
            // Committed as a mount commits its replay: the check after
            // then sees the replayed inode and items together.
            fs.sync().map_err(|e| format!("commit after replay: {e}"))?;
            // nbytes counts plain extents whole and compressed ones as
            // stored: at least the plain ones, at most everything.
            let f = lookup(fs, "f").ok_or("f is gone")?;
            let map = fs.extent_map(f).map_err(|e| e.to_string())?;
            let plain: u64 = map
                .extents
                .iter()
                .filter(|e| e.physical.is_some() && !e.flags.iter().any(|f| f == "zstd"))
                .map(|e| e.length)
                .sum();
            let nbytes = fs.getattr(f).map_err(|e| e.to_string())?.blocks * 512;
            expect(
                nbytes >= plain && nbytes <= map.size.next_multiple_of(512),
                || {
                    format!(
                        "nbytes {nbytes} for {plain} plain bytes in a {} byte file",
                        map.size
                    )
                },
            )?;
            match done {
                0 => expect_content(fs, "f", Some(&a)),
                _ => expect_content(fs, "f", Some(&want)),
            }
        }),
    );
}

#[test]
fn fsync_after_punching_a_hole() {
    let a = pattern(7, 64 << 10);
    let mut want = a.clone();
    want[4096..12288].fill(0);
    want[20000..20100].fill(0);
    let a2 = a.clone();
    crash_every_prefix(
        "punch",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![Box::new(|fs| {
            let f = lookup(fs, "f").expect("f");
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            fs.fallocate(f, 4096, 8192, mode).expect("punch");
            fs.fallocate(f, 20000, 100, mode).expect("punch");
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", Some(&a)),
            _ => expect_content(fs, "f", Some(&want)),
        }),
    );
}

#[test]
fn fsync_after_link_and_unlink() {
    let a = pattern(11, 10_000);
    let a2 = a.clone();
    crash_every_prefix(
        "link",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![
            Box::new(|fs| {
                let f = lookup(fs, "f").expect("f");
                fs.link(f, ROOT, b"g").expect("link");
                fs.fsync(f).expect("fsync");
            }),
            Box::new(|fs| {
                fs.remove(ROOT, b"g", false).expect("unlink");
                let f = lookup(fs, "f").expect("f");
                fs.fsync(f).expect("fsync");
            }),
        ],
        Box::new(move |fs, done| {
            expect_content(fs, "f", Some(&a))?;
            let g = lookup(fs, "g");
            let nlink = fs.getattr(lookup(fs, "f").expect("f")).expect("attr").nlink;
            match done {
                1 => expect(g.is_some() && nlink == 2, || {
                    format!("g {g:?}, nlink {nlink}")
                }),
                _ => expect(g.is_none() && nlink == 1, || {
                    format!("g {g:?}, nlink {nlink}")
                }),
            }
        }),
    );
}

#[test]
fn a_file_fsynced_after_its_parent_was_renamed() {
    let a = pattern(13, 30_000);
    let b = pattern(17, 4096);
    let mut want = a.clone();
    want[..4096].copy_from_slice(&b);
    let a2 = a.clone();
    crash_every_prefix(
        "renamed parent",
        Box::new(move |fs| {
            let d = mkdir(fs, ROOT, "d");
            file(fs, d, "f", &a2);
        }),
        vec![Box::new(move |fs| {
            fs.rename(ROOT, b"d", ROOT, b"e", false, false)
                .expect("rename");
            let f = lookup(fs, "e/f").expect("e/f");
            fs.write(f, 0, &b).expect("write");
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => {
                expect_content(fs, "d/f", Some(&a))?;
                expect(lookup(fs, "e").is_none(), || "e before fsync".into())
            }
            _ => {
                expect_content(fs, "e/f", Some(&want))?;
                expect(lookup(fs, "d").is_none(), || "d after fsync".into())
            }
        }),
    );
}

#[test]
fn fsync_of_a_file_then_of_its_directory() {
    let x = pattern(19, 5000);
    let x2 = x.clone();
    crash_every_prefix(
        "file then dir",
        Box::new(|fs| {
            mkdir(fs, ROOT, "d");
        }),
        vec![
            Box::new(move |fs| {
                let d = lookup(fs, "d").expect("d");
                let f = file(fs, d, "x", &x2);
                fs.fsync(f).expect("fsync x");
            }),
            Box::new(|fs| {
                let d = lookup(fs, "d").expect("d");
                file(fs, d, "y", &pattern(23, 100));
                file(fs, d, "z", &pattern(24, 70_000));
                fs.fsync(d).expect("fsync d");
            }),
        ],
        Box::new(move |fs, done| {
            // The directory fsync makes the names durable, not the
            // unsynced data: y and z may be empty, never a size
            // without its bytes.
            for (name, want) in [("d/y", pattern(23, 100)), ("d/z", pattern(24, 70_000))] {
                if let Some(got) = content(fs, name) {
                    expect(got.is_empty() || got == want, || {
                        format!("{name}: {} bytes not written by anyone", got.len())
                    })?;
                }
            }
            let y = lookup(fs, "d/y");
            match done {
                0 => expect_content(fs, "d/x", None),
                1 => expect_content(fs, "d/x", Some(&x)),
                _ => {
                    expect_content(fs, "d/x", Some(&x))?;
                    expect(y.is_some(), || "d/y lost after fsync of d".into())?;
                    expect(lookup(fs, "d/z").is_some(), || "d/z lost".into())
                }
            }
        }),
    );
}

#[test]
fn a_rename_after_fsync_leaves_exactly_one_name() {
    let a = pattern(29, 20_000);
    let a2 = a.clone();
    crash_every_prefix(
        "one name",
        Box::new(|fs| {
            mkdir(fs, ROOT, "d1");
            mkdir(fs, ROOT, "d2");
        }),
        vec![
            Box::new(move |fs| {
                let d1 = lookup(fs, "d1").expect("d1");
                let f = file(fs, d1, "f", &a2);
                fs.fsync(f).expect("fsync f");
            }),
            Box::new(|fs| {
                let (d1, d2) = (lookup(fs, "d1").expect("d1"), lookup(fs, "d2").expect("d2"));
                fs.rename(d1, b"f", d2, b"g", false, false).expect("rename");
                fs.fsync(d2).expect("fsync d2");
            }),
        ],
        Box::new(move |fs, done| {
            let (old, new) = (content(fs, "d1/f"), content(fs, "d2/g"));
            match done {
                0 => expect(old.is_none() && new.is_none(), || {
                    "file before fsync".into()
                }),
                1 => expect(old.as_deref() == Some(&a[..]) && new.is_none(), || {
                    format!(
                        "old {:?} new {:?}",
                        old.map(|o| o.len()),
                        new.map(|n| n.len())
                    )
                }),
                _ => expect(old.is_none() && new.as_deref() == Some(&a[..]), || {
                    format!(
                        "old {:?} new {:?}",
                        old.map(|o| o.len()),
                        new.map(|n| n.len())
                    )
                }),
            }
        }),
    );
}

/// The editor pattern: rename the old file aside, write a new one under
/// its name, fsync the new one. The old file must keep its new name.
#[test]
fn a_new_file_under_a_renamed_files_name() {
    let a = pattern(31, 9000);
    let b = pattern(37, 7000);
    let (a2, b2) = (a.clone(), b.clone());
    crash_every_prefix(
        "editor",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![Box::new(move |fs| {
            fs.rename(ROOT, b"f", ROOT, b"f~", false, false)
                .expect("rename");
            let f = file(fs, ROOT, "f", &b2);
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", Some(&a)),
            _ => {
                expect_content(fs, "f", Some(&b))?;
                expect_content(fs, "f~", Some(&a))
            }
        }),
    );
}

/// O_TMPFILE then linkat: an unnamed open file gets a name, then fsync.
#[test]
fn an_unnamed_file_linked_then_fsynced() {
    let t = pattern(41, 12_345);
    let t2 = t.clone();
    crash_every_prefix(
        "tmpfile",
        Box::new(|_| {}),
        vec![Box::new(move |fs| {
            let f = file(fs, ROOT, "tmp", &[]);
            fs.open(f);
            fs.remove(ROOT, b"tmp", false).expect("unlink");
            fs.write(f, 0, &t2).expect("write");
            fs.link(f, ROOT, b"final").expect("linkat");
            fs.fsync(f).expect("fsync");
            fs.release(f).expect("release");
        })],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "final", None),
            _ => {
                expect_content(fs, "final", Some(&t))?;
                expect_content(fs, "tmp", None)
            }
        }),
    );
}

/// A symlink whose target is too long to be inline is logged whole with
/// its directory: target bytes included.
#[test]
fn a_long_symlink_made_durable_by_a_directory_fsync() {
    let target = pattern(47, 3000);
    let t2 = target.clone();
    crash_every_prefix(
        "long symlink",
        Box::new(|_| {}),
        vec![Box::new(move |fs| {
            fs.create(ROOT, b"l", libc::S_IFLNK | 0o777, 0, ME, Some(&t2))
                .expect("symlink");
            fs.fsync(ROOT).expect("fsync root");
        })],
        Box::new(move |fs, done| match (lookup(fs, "l"), done) {
            (None, 0) => Ok(()),
            (None, _) => Err("l lost after fsync of its directory".into()),
            (Some(l), _) => {
                let got = fs.readlink(l).map_err(|e| format!("readlink: {e}"))?;
                expect(got == target, || format!("target of {} bytes", got.len()))
            }
        }),
    );
}

#[test]
fn an_unlink_made_durable_by_a_directory_fsync() {
    crash_every_prefix(
        "unlink",
        Box::new(|_| {}),
        vec![
            Box::new(|fs| {
                let f = file(fs, ROOT, "f", &pattern(43, 5000));
                fs.fsync(f).expect("fsync f");
            }),
            Box::new(|fs| {
                fs.remove(ROOT, b"f", false).expect("unlink");
                fs.fsync(ROOT).expect("fsync root");
            }),
        ],
        Box::new(|fs, done| {
            let f = lookup(fs, "f");
            match done {
                1 => expect(f.is_some(), || "f lost".into()),
                _ => expect(f.is_none(), || format!("f present after {done} fsyncs")),
            }
        }),
    );
}

/// Overwrites in the middle of a large file, fsynced twice: only the
/// changed ranges are logged, and both survive.
#[test]
fn overwrites_in_a_large_file_fsynced_twice() {
    let a = pattern(47, 1 << 20);
    let b = pattern(53, 10_000);
    let c = pattern(59, 5000);
    let mut after_b = a.clone();
    after_b[300_000..310_000].copy_from_slice(&b);
    let mut after_c = after_b.clone();
    after_c[700_001..705_001].copy_from_slice(&c);
    after_c.extend_from_slice(&c);
    let a2 = a.clone();
    crash_every_prefix(
        "overwrites",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![
            Box::new(move |fs| {
                let f = lookup(fs, "f").expect("f");
                fs.write(f, 300_000, &b).expect("write");
                fs.fsync(f).expect("fsync");
            }),
            Box::new(move |fs| {
                let f = lookup(fs, "f").expect("f");
                fs.write(f, 700_001, &c).expect("write");
                fs.write(f, 1 << 20, &c).expect("append");
                fs.fsync(f).expect("fsync");
            }),
        ],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", Some(&a)),
            1 => expect_content(fs, "f", Some(&after_b)),
            _ => expect_content(fs, "f", Some(&after_c)),
        }),
    );
}

/// Seed 003: renames after an unrelated fsync do not touch the log, and
/// a commit afterwards drops it.
#[test]
fn renames_of_unlogged_files_leave_the_log_alone() {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let d = mkdir(&fs, ROOT, "d");
    for i in 0..200 {
        file(&fs, d, &format!("f{i}"), &[]);
    }
    fs.sync().expect("commit");
    let other = file(&fs, ROOT, "other", &pattern(61, 4096));
    fs.fsync(other).expect("fsync");
    let log_blocks = |fs: &Fs| {
        fs.engine()
            .read(|r| {
                let root = r.root(canopy::format::tree_id::LOG)?;
                Ok(canopy::tree::block_addresses(r, &root)?.len())
            })
            .expect("log")
    };
    let before = log_blocks(&fs);
    let items = |fs: &Fs| {
        fs.engine()
            .read(|r| {
                r.range(
                    canopy::format::tree_id::LOG,
                    &canopy::Key::MIN,
                    &canopy::Key::MAX,
                )
            })
            .expect("log items")
    };
    let logged = items(&fs);
    for i in 0..200 {
        let (from, to) = (format!("f{i}"), format!("f{i}-RPMDELETE"));
        fs.rename(d, from.as_bytes(), d, to.as_bytes(), false, false)
            .expect("rename");
    }
    assert_eq!(
        items(&fs),
        logged,
        "renames of unlogged files changed the log"
    );
    assert_eq!(log_blocks(&fs), before);
    fs.sync().expect("commit");
    assert!(
        fs.engine()
            .read(|r| r.root(canopy::format::tree_id::LOG))
            .is_err(),
        "the commit kept the log"
    );
    drop(fs);
    common::assert_fs_clean(&dev);
}

/// The log is one tree for every subvolume: a file fsynced in a subvolume
/// and one fsynced in the top level, with the same local inode numbers,
/// each come back with exactly its own content.
#[test]
fn fsyncs_in_two_subvolumes_replay_into_their_own_trees() {
    let a = pattern(11, 50_000);
    let b = pattern(23, 70_000);
    let (a2, b2) = (a.clone(), b.clone());
    crash_every_prefix(
        "subvolumes",
        Box::new(|fs| {
            fs.create_subvolume(ROOT, b"sv", ME).expect("subvolume");
        }),
        vec![
            Box::new(move |fs| {
                let sv = lookup(fs, "sv").expect("sv");
                let f = file(fs, sv, "f", &a2);
                fs.fsync(f).expect("fsync in the subvolume");
            }),
            Box::new(move |fs| {
                let f = file(fs, ROOT, "f", &b2);
                fs.fsync(f).expect("fsync in the top level");
            }),
        ],
        Box::new(move |fs, done| {
            expect_content(fs, "sv/f", (done >= 1).then_some(a.as_slice()))?;
            expect_content(fs, "f", (done >= 2).then_some(b.as_slice()))
        }),
    );
}

/// Hundreds of scattered overwrites fsynced at once: the flush passes
/// the point where reference changes are folded before the commit (with
/// its own extents still in flight), and the log must still carry the
/// checksums of every extent the transaction made.
#[test]
fn scattered_overwrites_past_the_early_fold_survive_their_fsync() {
    const BLOCKS: u64 = 1024;
    let a = pattern(71, (BLOCKS * 4096) as usize);
    let mut after = a.clone();
    // Every third block, in a scattered order (3 is prime to the count).
    let rewrites: Vec<(u64, Vec<u8>)> = (0..BLOCKS / 3 * 2)
        .map(|i| {
            let block = (i * 3 + i / (BLOCKS / 3)) % BLOCKS;
            (block * 4096, vec![(i % 251) as u8; 4096])
        })
        .collect();
    for (at, d) in &rewrites {
        after[*at as usize..*at as usize + d.len()].copy_from_slice(d);
    }
    let a2 = a.clone();
    crash_every_prefix(
        "scattered overwrites",
        Box::new(move |fs| {
            file(fs, ROOT, "f", &a2);
        }),
        vec![Box::new(move |fs| {
            let f = lookup(fs, "f").expect("f");
            for (at, d) in &rewrites {
                fs.write(f, *at, d).expect("write");
            }
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", Some(&a)),
            _ => expect_content(fs, "f", Some(&after)),
        }),
    );
}

/// The log's blocks are taken and given back without a word to the
/// free-space tree (they are free there at every commit): after hundreds
/// of fsyncs, with the allocator journal applied early and often in
/// between, a commit leaves an image whose free space agrees with its
/// extents, and the space the log used is free again after the next
/// commit.
#[test]
fn the_log_leaves_the_free_space_as_it_found_it() {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    drop(e);
    let early = OpenOptions {
        settle_early_at: 16,
        ..OpenOptions::default()
    };
    let open = |dev: &Arc<canopy::dev::MemDevice>| {
        let e = Engine::open(dev.clone() as Arc<dyn Device>, &early).expect("open");
        Fs::new(Arc::new(e)).expect("fs")
    };
    let fs = open(&dev);
    let dir = mkdir(&fs, ROOT, "d");
    fs.sync().expect("commit");
    let free_before = fs.engine().space().1;
    let commits = fs.engine().committed_generation();
    let mut files = Vec::new();
    for i in 0..300u32 {
        let data = pattern(i as u8, 1000 + i as usize * 37);
        let ino = file(&fs, dir, &format!("f{i}"), &data);
        fs.fsync(ino).expect("fsync");
        files.push((format!("d/f{i}"), data));
    }
    assert_eq!(
        fs.engine().committed_generation(),
        commits,
        "fsync committed instead of logging"
    );
    fs.sync().expect("commit after the fsyncs");
    fs.sync().expect("a second commit unpins the log's blocks");
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
    let fs = open(&dev);
    for (path, data) in &files {
        assert_eq!(content(&fs, path).as_ref(), Some(data), "{path}");
    }
    // What the files hold is gone from the free space; the log's
    // blocks (hundreds of them) are not.
    let used_by_files: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let free_after = fs.engine().space().1;
    assert!(
        free_before.saturating_sub(free_after) < used_by_files + (2 << 20),
        "free space fell by {} for {used_by_files} bytes of files",
        free_before - free_after
    );
}

/// `discard=async` holds the space the log freed while fsyncs keep
/// coming (the next transaction's log takes it again, and on a thin
/// image a write to discarded space makes the host allocate inside the
/// fsync), and discards it once the log has been idle; what it discards
/// leaves the file's content and the image clean.
#[test]
fn the_log_space_is_discarded_once_fsyncs_stop() {
    use canopy::txn::{DiscardMode, DiscardPass};
    use std::time::Duration;
    let (dev, fs) = format_fs(Layout {
        bytes: 256 << 20,
        ..SMALL_MIXED
    });
    fs.engine()
        .set_discard(DiscardMode::Async)
        .expect("discard");
    let ino = file(&fs, ROOT, "wal", &pattern(1, 64 << 10));
    fs.sync().expect("commit");
    let commits = fs.engine().committed_generation();
    // Database pages appended and fsynced: each fsync copies the log's
    // leaves, and the copies stay the log's until the commit.
    for i in 0..400u64 {
        let page = pattern(i as u8, 8192);
        fs.write(ino, (64 << 10) + i * 8192, &page).expect("write");
        fs.fsync(ino).expect("fsync");
    }
    assert_eq!(
        fs.engine().committed_generation(),
        commits,
        "fsync committed"
    );
    fs.sync().expect("commit drops the log");
    fs.sync().expect("second commit");
    // Every free piece, however short: on this small mixed image the
    // log's blocks lie between the trees'.
    let pass = |log_idle| DiscardPass {
        delay: Duration::ZERO,
        batches: usize::MAX,
        log_idle,
        min_len: 1,
        window: 1,
    };
    // The log was written just now: its space stays.
    let while_busy = fs
        .engine()
        .discard_freed(pass(Some(Duration::from_secs(3600))))
        .expect("discard")
        .bytes;
    let once_idle = fs
        .engine()
        .discard_freed(pass(Some(Duration::ZERO)))
        .expect("discard")
        .bytes;
    assert!(
        once_idle >= 2 << 20,
        "the log's space held back: {once_idle} bytes discarded once idle, \
         {while_busy} before"
    );
    let expect: Vec<u8> = [pattern(1, 64 << 10)]
        .into_iter()
        .chain((0..400u64).map(|i| pattern(i as u8, 8192)))
        .flatten()
        .collect();
    assert!(
        content(&fs, "wal") == Some(expect.clone()),
        "content after discards"
    );
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    assert!(
        content(&fs, "wal") == Some(expect),
        "content after reopening"
    );
}

/// A log write has one barrier for its blocks, its data and its chain
/// link, so a crash may keep the link of the second fsync without all it
/// depends on. Replay must then find that out and give the
/// first fsync's content, never the half-landed second.
#[test]
fn a_log_write_that_landed_in_part_falls_back_to_the_one_before() {
    let first = pattern(61, 20_000);
    let second = pattern(67, 20_000);
    let (base_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    file(&fs, ROOT, "f", &pattern(71, 20_000));
    fs.sync().expect("commit the setup");
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let f = lookup(&fs, "f").expect("f");
    for data in [&first, &second] {
        fs.write(f, 0, data).expect("write");
        fs.fsync(f).expect("fsync");
    }
    let ops = rec.ops();
    drop(fs);
    // The second fsync's writes are those in flight before the last
    // barrier: its data first, the link last.
    let only_link = |i: usize, f: &InFlight| i + 1 == f.pages;
    let all_but_data = |i: usize, f: &InFlight| i >= f.first_write;
    for (what, keep) in [
        (
            "only the link",
            &only_link as &dyn Fn(usize, &InFlight) -> bool,
        ),
        ("all but the data", &all_but_data),
    ] {
        let disk = before_last_barrier(base.as_ref().clone(), ops.clone(), keep);
        let dev = Arc::new(canopy::dev::MemDevice::from_bytes(disk));
        let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default())
            .unwrap_or_else(|err| panic!("{what}: open failed: {err}"));
        let fs = Fs::new(Arc::new(e)).unwrap_or_else(|err| panic!("{what}: replay failed: {err}"));
        if let Err(why) = expect_content(&fs, "f", Some(&first)) {
            panic!("{what}: {why}");
        }
        drop(fs);
        common::assert_posix_clean_in_place(dev.clone());
    }
}

/// Where a recording wrote log chain links (`format::loglink`): pages
/// of its writes that begin like one (alone, or joined to the run of log
/// blocks they were sent with).
fn link_pages(ops: &[canopy::dev::crash::Op]) -> std::collections::HashSet<u64> {
    use canopy::dev::crash::PAGE;
    use canopy::format::loglink::{LogLink, LINK_BYTES};
    ops.iter()
        .filter_map(|o| match o {
            canopy::dev::crash::Op::Write { offset, data } => Some((*offset, data)),
            _ => None,
        })
        .flat_map(|(offset, data)| {
            data.chunks_exact(PAGE)
                .enumerate()
                .filter(|(_, page)| LogLink::looks_like_link(&page[..LINK_BYTES]))
                .map(move |(i, _)| offset + (i * PAGE) as u64)
        })
        .collect()
}

/// The pages written between the last two barriers of a recording.
struct InFlight {
    /// How many in all.
    pages: usize,
    /// How many the first write has (in a log write, the file's data).
    first_write: usize,
}

/// The disk after `ops` when the crash came just before their last
/// barrier, keeping of the pages in flight those `keep` selects.
fn before_last_barrier(
    base: Vec<u8>,
    ops: Vec<canopy::dev::crash::Op>,
    keep: &dyn Fn(usize, &InFlight) -> bool,
) -> Vec<u8> {
    use canopy::dev::crash::{Op, PAGE};
    let last = ops
        .iter()
        .rposition(|o| matches!(o, Op::Barrier { .. }))
        .expect("a barrier");
    let start = ops[..last]
        .iter()
        .rposition(|o| matches!(o, Op::Barrier { .. }))
        .map_or(0, |i| i + 1);
    let pages_of = |o: &Op| match o {
        Op::Write { data, .. } => data.len().div_ceil(PAGE),
        Op::Discard { len, .. } => (*len as usize).div_ceil(PAGE),
        Op::Barrier { .. } => 0,
    };
    let in_flight = InFlight {
        pages: ops[start..last].iter().map(pages_of).sum(),
        first_write: ops[start..last].first().map_or(0, pages_of),
    };
    let size = base.len();
    let dev = Replayer::new(Arc::new(base), ops).at(last, &|i| keep(i, &in_flight));
    let mut out = vec![0u8; size];
    dev.read_at(&mut out, 0).expect("read the crashed disk");
    out
}

/// A run that crashed with its log's blocks on the disk but not the
/// chain link naming them leaves log blocks at the addresses of the next
/// run's log. If that run's link lands without its own blocks, replay
/// must not take the old run's blocks for them: each run's open commits,
/// so its log has a chain, a nonce and a generation of its own, and the
/// committed content is what remains.
#[test]
fn blocks_a_crashed_run_left_are_not_taken_for_the_next_runs_log() {
    let committed = pattern(73, 20_000);
    let (base_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    file(&fs, ROOT, "f", &committed);
    fs.sync().expect("commit the setup");
    drop(fs);
    let run = |disk: Vec<u8>, data: &[u8]| {
        let rec = Arc::new(RecordingDevice::new(disk));
        let e =
            Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
        let fs = Fs::new(Arc::new(e)).expect("fs");
        let f = lookup(&fs, "f").expect("f");
        fs.write(f, 0, data).expect("write");
        fs.fsync(f).expect("fsync");
        let ops = rec.ops();
        drop(fs);
        ops
    };
    // First run: everything but the link (the last page) lands.
    let base = base_dev.snapshot();
    // More than an fsync puts in the log: the data goes first, to an
    // extent, and the log write follows it.
    let first_ops = run(base.clone(), &pattern(79, 80_000));
    let first_written: Vec<(u64, usize)> = first_ops
        .iter()
        .filter_map(|o| match o {
            canopy::dev::crash::Op::Write { offset, data } => Some((*offset, data.len())),
            canopy::dev::crash::Op::Discard { .. } | canopy::dev::crash::Op::Barrier { .. } => None,
        })
        .collect();
    let after_first = before_last_barrier(base, first_ops, &|i, f| i + 1 < f.pages);
    // Second run: only its link lands.
    let second_ops = run(after_first.clone(), &pattern(83, 80_000));
    let disk = before_last_barrier(after_first, second_ops, &|i, f| i + 1 == f.pages);
    let dev = Arc::new(canopy::dev::MemDevice::from_bytes(disk));
    let root = common::last_log_root(dev.as_ref());
    assert_ne!(root, 0, "the second run's chain leads to its log");
    assert!(
        first_written
            .iter()
            .any(|&(o, n)| o <= root && root < o + n as u64),
        "the first run wrote a block where the second run's log root is"
    );
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("replay");
    if let Err(why) = expect_content(&fs, "f", Some(&committed)) {
        panic!("{why}");
    }
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
}

/// When an fsync returned: (thread, round, ops recorded by then).
type Returned = (u8, u8, usize);

/// Threads that write and fsync their own file at once, a few times each.
const FSYNC_THREADS: u8 = 4;

/// The content of thread `t`'s file after its fsync of round `r`.
fn version(t: u8, r: u8) -> Vec<u8> {
    pattern(t * 16 + r + 1, 6000)
}

/// Runs [`FSYNC_THREADS`] threads that each write and fsync their own
/// file `rounds` times on a recording device whose barriers take
/// `barrier_time`, with `in_flight` log writes out at once at most.
/// Returns the disk before, the recording, and when each fsync returned.
fn concurrent_fsyncs(
    rounds: u8,
    barrier_time: std::time::Duration,
    in_flight: usize,
) -> (Arc<Vec<u8>>, Vec<canopy::dev::crash::Op>, Vec<Returned>) {
    concurrent_fsyncs_and_commits(rounds, barrier_time, in_flight, 0)
}

/// [`concurrent_fsyncs`] with a thread beside them that commits
/// `commits` times, as the mount's periodic commit does.
fn concurrent_fsyncs_and_commits(
    rounds: u8,
    barrier_time: std::time::Duration,
    in_flight: usize,
    commits: usize,
) -> (Arc<Vec<u8>>, Vec<canopy::dev::crash::Op>, Vec<Returned>) {
    let (base_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    for t in 0..FSYNC_THREADS {
        file(&fs, ROOT, &format!("f{t}"), &pattern(200 + t, 6000));
    }
    fs.sync().expect("commit the setup");
    drop(fs);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::with_barrier_time(
        base.as_ref().clone(),
        barrier_time,
    ));
    let opts = OpenOptions {
        log_writes_in_flight: in_flight,
        ..OpenOptions::default()
    };
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &opts).expect("open");
    let fs = Arc::new(Fs::new(Arc::new(e)).expect("fs"));
    let returned = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let committer = &fs;
        s.spawn(move || {
            for _ in 0..commits {
                std::thread::sleep(std::time::Duration::from_millis(2));
                committer.sync().expect("commit");
            }
        });
        for t in 0..FSYNC_THREADS {
            let (fs, rec, returned) = (&fs, &rec, &returned);
            s.spawn(move || {
                let f = lookup(fs, &format!("f{t}")).expect("file");
                for r in 0..rounds {
                    fs.write(f, 0, &version(t, r)).expect("write");
                    fs.fsync(f).expect("fsync");
                    let at = rec.op_count();
                    returned.lock().expect("lock").push((t, r, at));
                }
            });
        }
    });
    let returned = returned.into_inner().expect("lock");
    let ops = rec.ops();
    drop(fs);
    (base, ops, returned)
}

/// Opens the crashed disk `dev` (`what` says how it was made) and checks
/// that each thread's file holds the content of its last fsync that had
/// returned within the first `prefix` ops, or of a later one.
/// Returns which log root the open replayed (`last`, `previous`,
/// `older`), if any.
fn assert_returned_fsyncs_kept(
    dev: Arc<dyn Device>,
    what: &str,
    prefix: usize,
    rounds: u8,
    returned: &[Returned],
) -> Option<String> {
    let e = Engine::open(dev, &OpenOptions::default())
        .unwrap_or_else(|err| panic!("{what}: open failed: {err}"));
    let chosen = e.log_found().and_then(|v| v.chosen);
    let fs = Fs::new(Arc::new(e)).unwrap_or_else(|err| panic!("{what}: replay failed: {err}"));
    for t in 0..FSYNC_THREADS {
        let done = returned
            .iter()
            .filter(|&&(tt, _, at)| tt == t && at <= prefix)
            .map(|&(_, r, _)| r)
            .max();
        let got = content(&fs, &format!("f{t}")).expect("file survives");
        let allowed: Vec<Vec<u8>> = match done {
            Some(r) => (r..rounds).map(|r| version(t, r)).collect(),
            None => std::iter::once(pattern(200 + t, 6000))
                .chain((0..rounds).map(|r| version(t, r)))
                .collect(),
        };
        assert!(
            allowed.contains(&got),
            "{what}: f{t} lost its fsync of round {done:?}"
        );
    }
    chosen
}

/// Four threads write and fsync their own file, five times each, at once:
/// concurrent fsyncs share log writes, which must reach the device in the
/// order their blocks were taken. At every barrier of the recording, each
/// file holds the content of its last fsync that had returned by then,
/// or of a later one.
#[test]
fn concurrent_fsyncs_each_survive_from_the_moment_they_return() {
    const ROUNDS: u8 = 5;
    let (base, ops, returned) = concurrent_fsyncs(ROUNDS, std::time::Duration::ZERO, 1);
    let barriers: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, canopy::dev::crash::Op::Barrier { .. }))
        .map(|(i, _)| i + 1)
        .collect();
    let mut rp = Replayer::new(base, ops);
    for prefix in barriers {
        let dev = Arc::new(rp.at(prefix, &|_| true));
        let what = format!("prefix {prefix}");
        let _ = assert_returned_fsyncs_kept(dev.clone(), &what, prefix, ROUNDS, &returned);
        common::assert_posix_clean_in_place(dev.clone());
    }
}

/// Barriers that take time (3 ms each here, so four threads' fsyncs meet
/// while one is out): whatever a crash keeps of the writes no returned
/// barrier covers (all, none, only the chain links and superblocks, all
/// but the newest of those, or mixes of pages), each file holds the
/// content of its last fsync that had returned, or of a later one, and
/// checks clean. One log write at a time by default; with two in flight
/// (`-o log_writes=2`) some crashes keep links whose writes before them
/// had not landed, so replay must reach past the previous root.
#[test]
fn fsyncs_behind_slow_barriers_keep_every_one_that_returned() {
    fsyncs_behind_slow_barriers(1);
    fsyncs_behind_slow_barriers(2);
}

fn fsyncs_behind_slow_barriers(in_flight: usize) {
    const ROUNDS: u8 = 6;
    let first_super = canopy::format::SUPER_OFFSETS[0];
    let (base, ops, returned) =
        concurrent_fsyncs(ROUNDS, std::time::Duration::from_millis(3), in_flight);
    // What names a log root: a chain link (or a commit's superblock).
    let links = link_pages(&ops);
    assert!(!links.is_empty(), "the fsyncs wrote chain links");
    let overlapped = links_sent_beside_a_barrier(&ops, &links);
    match in_flight {
        1 => assert_eq!(
            overlapped, 0,
            "a log write went out beside another's barrier"
        ),
        _ => assert!(
            overlapped > 0,
            "no log write was sent while another's barrier was out"
        ),
    }
    let mut chosen_older = 0;
    let names_root = |p: &u64| *p == first_super || links.contains(p);
    let mut rp = Replayer::new(base, ops);
    let mut opened = 0;
    for prefix in 1..=rp.len() {
        let pages = rp.pages_in_flight(prefix);
        let is_super = |i: usize| names_root(&pages[i]);
        let newest_super = pages.iter().rposition(names_root);
        let mix = |i: usize, seed: usize| {
            !(i.wrapping_mul(2_654_435_761) >> 7)
                .wrapping_add(seed)
                .is_multiple_of(3)
        };
        let keeps: [(&str, &dyn Fn(usize) -> bool); 6] = [
            ("everything", &|_| true),
            ("nothing", &|_| false),
            ("only the links and superblocks", &is_super),
            ("all but the newest link or superblock", &|i| {
                Some(i) != newest_super
            }),
            ("a mix", &|i| mix(i, 0)),
            ("another mix", &|i| mix(i, 1) || is_super(i)),
        ];
        for (how, keep) in keeps {
            let dev = Arc::new(rp.at(prefix, keep));
            let what = format!("prefix {prefix}, {how} kept");
            let chosen = assert_returned_fsyncs_kept(dev.clone(), &what, prefix, ROUNDS, &returned);
            chosen_older += usize::from(chosen.as_deref() == Some("older"));
            // Checking every image would take minutes: every seventh.
            opened += 1;
            if opened % 7 == 0 {
                common::assert_posix_clean_in_place(dev.clone());
            }
        }
    }
    if in_flight > 1 {
        assert!(
            chosen_older > 0,
            "no crash needed a root older than the previous one"
        );
    }
}

/// How many chain links of `ops` were sent while a barrier that does not
/// cover them was out (log writes that overlapped).
fn links_sent_beside_a_barrier(
    ops: &[canopy::dev::crash::Op],
    links: &std::collections::HashSet<u64>,
) -> usize {
    use canopy::dev::crash::Op;
    ops.iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Op::Barrier { covers } => Some(&ops[*covers..i]),
            _ => None,
        })
        .map(|between| {
            between
                .iter()
                .filter(|o| match o {
                    Op::Write { offset, data } => (0..data.len() as u64)
                        .step_by(canopy::dev::crash::PAGE)
                        .any(|at| links.contains(&(offset + at))),
                    _ => false,
                })
                .count()
        })
        .sum()
}

/// Split groups, scaled down: data groups of 25 MiB, metadata groups of
/// 4 MiB, so a scenario reaches a new group in a few steps.
const SPLIT: Layout = Layout {
    bytes: 256 << 20,
    mixed: false,
    may_commit: true,
};

/// Groups of `kind` ("data", "metadata") and the bytes they have free.
fn groups_of(fs: &Fs, kind: &str) -> (u64, u64) {
    let u = fs.engine().usage();
    u.kinds
        .iter()
        .find(|k| k.kind == kind)
        .map_or((0, 0), |k| (k.groups, k.size - k.used))
}

/// The first fsync whose data needs a new block group (on a fresh 4 GiB
/// image, the first fsync of a file too big to be inline): the group is
/// not in any durable superblock, so the log must not name its space.
#[test]
fn fsync_whose_data_needs_a_new_block_group() {
    let small = pattern(11, 5000);
    let big = pattern(12, 3 << 20);
    let (s2, b2) = (small.clone(), big.clone());
    crash_every_prefix_on(
        SPLIT,
        "new data group",
        Box::new(|fs| {
            // Make the first data group, then leave it 64 KiB short of full.
            file(fs, ROOT, "seed", &pattern(14, 8192));
            fs.sync().expect("commit");
            let (groups, free) = groups_of(fs, "data");
            assert_eq!(groups, 1, "one data group to fill");
            let fill = pattern(13, (free - (64 << 10)) as usize);
            file(fs, ROOT, "fill", &fill);
        }),
        vec![
            Box::new(move |fs| {
                let f = file(fs, ROOT, "x", &s2);
                fs.fsync(f).expect("fsync");
            }),
            Box::new(move |fs| {
                let f = file(fs, ROOT, "y", &b2);
                fs.fsync(f).expect("fsync");
                let (groups, _) = groups_of(fs, "data");
                assert!(groups >= 2, "the scenario must reach a new data group");
            }),
        ],
        Box::new(move |fs, done| {
            expect_content(fs, "x", (done >= 1).then_some(&small[..]))?;
            expect_content(fs, "y", (done >= 2).then_some(&big[..]))
        }),
    );
}

/// fsync-heavy work that fills metadata groups: the log's own blocks
/// land in a group created in the running transaction.
#[test]
fn fsyncs_while_metadata_groups_are_added() {
    const STEPS: usize = 12;
    let value = |i: usize, j: usize| pattern((i * 8 + j) as u8, 3000);
    let groups_after_setup = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let g2 = groups_after_setup.clone();
    let steps: Vec<Step> = (0..STEPS)
        .map(|i| {
            let g = groups_after_setup.clone();
            Box::new(move |fs: &Fs| {
                let f = file(fs, ROOT, &format!("m{i}"), b"m");
                for j in 0..8 {
                    let name = format!("user.x{j}");
                    fs.setxattr(f, name.as_bytes(), &value(i, j), 0)
                        .expect("setxattr");
                }
                fs.fsync(f).expect("fsync");
                if i == STEPS - 1 {
                    let before = g.load(std::sync::atomic::Ordering::Relaxed);
                    assert!(
                        groups_of(fs, "metadata").0 > before,
                        "the scenario must reach a new metadata group"
                    );
                }
            }) as Step
        })
        .collect();
    crash_every_prefix_on(
        SPLIT,
        "new metadata groups",
        Box::new(move |fs| {
            // Fill the metadata groups until about 120 KiB are left.
            let big = pattern(1, 3000);
            for n in 0.. {
                let (_, free) = groups_of(fs, "metadata");
                if free < 120 << 10 {
                    break;
                }
                let f = file(fs, ROOT, &format!("pad{n}"), b"");
                for j in 0..8 {
                    let name = format!("user.p{j}");
                    fs.setxattr(f, name.as_bytes(), &big, 0).expect("pad");
                }
                if n % 64 == 63 {
                    fs.sync().expect("commit");
                }
            }
            let groups = groups_of(fs, "metadata").0;
            g2.store(groups, std::sync::atomic::Ordering::Relaxed);
        }),
        steps,
        Box::new(move |fs, done| {
            for i in 0..STEPS {
                let name = format!("m{i}");
                let Some(f) = lookup(fs, &name) else {
                    expect(i >= done, || format!("{name} lost"))?;
                    continue;
                };
                for j in 0..8 {
                    let got = fs.getxattr(f, format!("user.x{j}").as_bytes()).ok();
                    expect(i >= done || got == Some(value(i, j)), || {
                        format!("{name}: xattr {j} lost")
                    })?;
                }
            }
            Ok(())
        }),
    );
}

/// A WAL segment rewritten in place (the same page written again and
/// fdatasynced, as PostgreSQL does with its last WAL page) beside a
/// rollback journal created, fsynced and deleted: extents are freed and
/// replaced many times within one transaction, and every replay must
/// leave data that matches its checksums.
#[test]
fn rewritten_wal_pages_and_recycled_journals() {
    const STEPS: usize = 10;
    let seg = pattern(40, 256 << 10);
    // The WAL file after each step: a page at a moving offset rewritten.
    let mut states = vec![seg.clone()];
    for i in 0..STEPS {
        let mut next = states[i].clone();
        let at = (i / 3) * 8192;
        next[at..at + 8192].copy_from_slice(&pattern(50 + i as u8, 8192));
        states.push(next);
    }
    let states = Arc::new(states);
    let s2 = states.clone();
    let steps: Vec<Step> = (0..STEPS)
        .map(|i| {
            let states = states.clone();
            Box::new(move |fs: &Fs| {
                let j = file(fs, ROOT, "journal", &pattern(90 + i as u8, 20_000));
                fs.fsync(j).expect("fsync journal");
                let w = lookup(fs, "wal").expect("wal");
                let at = (i / 3) * 8192;
                fs.write(w, at as u64, &states[i + 1][at..at + 8192])
                    .expect("write");
                fs.fsync(w).expect("fdatasync wal");
                fs.remove(ROOT, b"journal", false).expect("unlink");
                fs.fsync(ROOT).expect("fsync dir");
            }) as Step
        })
        .collect();
    crash_every_prefix(
        "wal",
        Box::new(move |fs| {
            file(fs, ROOT, "wal", &seg);
        }),
        steps,
        Box::new(move |fs, done| {
            expect_content(fs, "wal", Some(&s2[done]))?;
            // The journal of the step in flight may be there, whole.
            let journal = content(fs, "journal");
            expect(
                journal.is_none_or(|j| (0..STEPS).any(|i| j == pattern(90 + i as u8, 20_000))),
                || "a journal with other content".into(),
            )
        }),
    );
}

/// The disk as a crash now would leave it (every write done so far).
fn crashed(dev: &canopy::dev::MemDevice) -> Arc<canopy::dev::MemDevice> {
    Arc::new(canopy::dev::MemDevice::from_bytes(dev.snapshot()))
}

fn open_fs(dev: &Arc<canopy::dev::MemDevice>) -> Fs {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    Fs::new(Arc::new(e)).expect("replay")
}

/// A log keeps the checksum item of an extent its transaction later
/// freed (the page was rewritten and fsynced again). Replay must not
/// leave that item in the checksum tree: after a second run puts new
/// data at that address and fsyncs it, a second crash and replay must
/// give the new data its own checksums, not the stale ones.
#[test]
fn checksums_of_extents_freed_before_the_crash_do_not_outlive_the_replay() {
    let (mut dev, mut fs) = format_fs(SMALL_MIXED);
    file(&fs, ROOT, "base", &pattern(1, 8192));
    fs.sync().expect("commit");
    for round in 0..8u8 {
        let a = file(&fs, ROOT, &format!("a{round}"), &pattern(10 + round, 8192));
        fs.fsync(a).expect("fsync");
        fs.write(a, 0, &pattern(20 + round, 8192)).expect("rewrite");
        fs.fsync(a).expect("fsync again");
        let dev2 = crashed(&dev);
        drop(fs);
        let fs2 = open_fs(&dev2);
        let c = file(&fs2, ROOT, &format!("c{round}"), &pattern(30 + round, 8192));
        fs2.fsync(c).expect("fsync c");
        let dev3 = crashed(&dev2);
        drop(fs2);
        let fs3 = open_fs(&dev3);
        let a_now = pattern(20 + round, 8192);
        expect_content(&fs3, &format!("a{round}"), Some(&a_now)).expect("a");
        let c_now = pattern(30 + round, 8192);
        expect_content(&fs3, &format!("c{round}"), Some(&c_now)).expect("c");
        assert_scrub_clean("stale checksums", round as usize, &fs3);
        drop(fs3);
        common::assert_posix_clean_in_place(dev3.clone());
        dev = dev3;
        fs = open_fs(&dev);
    }
}

/// The crashed disk of a run that committed `f` ("first") and then
/// logged a rewrite of it ("second", 5000 bytes) with an fsync.
fn crashed_with_a_log() -> Arc<canopy::dev::MemDevice> {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let f = file(&fs, ROOT, "f", b"first");
    fs.sync().expect("commit");
    fs.write(f, 0, &pattern(60, 5000)).expect("write");
    fs.fsync(f).expect("fsync");
    let out = crashed(&dev);
    drop(fs);
    out
}

/// Rewrites the log's root leaf with `change` applied to its items and a
/// valid checksum, so only the item checker and replay's examination can
/// tell.
fn damage_log_leaf(dev: &dyn Device, change: impl Fn(&mut canopy::format::node::Item)) {
    use canopy::format::node::{Body, Node};
    let root = common::last_log_root(dev);
    assert_ne!(root, 0, "the crash left a log");
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, root).expect("read");
    let mut node = Node::decode(&buf, root, &[0x42; 16]).expect("decode");
    let Body::Leaf(leaf) = &mut node.body else {
        panic!("a one-block log is a leaf");
    };
    leaf.edit().iter_mut().for_each(change);
    dev.write_at(&node.encode(&[0x42; 16], 4096), root)
        .expect("write");
}

/// A log whose items are wrong as written (here a logged inode of an
/// impossible size, the issue's symlink of 2^61 bytes) must not lock the
/// committed files away: check names the problem, and replay leaves that
/// inode as the last commit has it.
#[test]
fn a_damaged_log_is_reported_by_check_and_skipped_by_the_mount() {
    let dev = crashed_with_a_log();
    damage_log_leaf(dev.as_ref(), |it| {
        if it.key.ty == canopy::format::key_type::INODE_ITEM {
            let mut inode = canopy::format::inode::InodeItem::decode(&it.data).expect("inode");
            inode.mode = libc::S_IFLNK | 0o777;
            inode.size = 1 << 61;
            it.data = inode.encode();
        }
    });
    let r = canopy::check::check_all(crashed(&dev), &|_, _| {}).expect("check ran");
    assert!(
        r.problems
            .iter()
            .any(|p| p.location.starts_with("log inode")),
        "check must name the damaged inode of the log: {:#?}",
        r.problems
    );
    let log = r.log.expect("check reports the log");
    assert_eq!(log.skipped.len(), 1, "{log:#?}");
    let fs = open_fs(&dev);
    expect_content(&fs, "f", Some(b"first")).expect("the last commit's file");
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
}

/// What `g` holds in [`crashed_with_two_logged_files`].
fn g_content() -> Vec<u8> {
    pattern(61, 70_000)
}

/// The crashed disk of a run that committed `f`, then gave it an xattr
/// and new data (fsynced twice: the second time its bytes go in the
/// log), created `g`, and fsynced both: one log leaf holds every
/// kind of item the log has, for two inodes.
fn crashed_with_two_logged_files() -> Arc<canopy::dev::MemDevice> {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let f = file(&fs, ROOT, "f", b"first");
    fs.sync().expect("commit");
    fs.setxattr(f, b"user.k", b"value", 0).expect("setxattr");
    fs.write(f, 0, &pattern(60, 5000)).expect("write f");
    // Inline until now: flushed to an extent, which the log names.
    fs.fsync(f).expect("fsync f");
    // A small write to a file with extents: its bytes go in the log.
    fs.write(f, 6000, &pattern(62, 1000))
        .expect("write f again");
    fs.fsync(f).expect("fsync f again");
    // More than an fsync logs: flushed, and named by extent.
    let g = file(&fs, ROOT, "g", &g_content());
    fs.fsync(g).expect("fsync g");
    let out = crashed(&dev);
    drop(fs);
    out
}

/// Ways to damage one item's bytes, each leaving a block with a valid
/// checksum.
fn item_damage(data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("emptied".to_string(), Vec::new()),
        ("halved".to_string(), data[..data.len() / 2].to_vec()),
        ("grown".to_string(), [data, &[0xa5; 7]].concat()),
    ];
    for at in (0..data.len().saturating_sub(7)).step_by(8) {
        for (name, word) in [("max", u64::MAX), ("2^61", 1u64 << 61)] {
            let mut d = data.to_vec();
            d[at..at + 8].copy_from_slice(&word.to_le_bytes());
            out.push((format!("{name} at {at}"), d));
        }
    }
    if let Some(&b) = data.first() {
        let mut d = data.to_vec();
        d[0] = b ^ 0xff;
        out.push(("first byte flipped".to_string(), d));
    }
    out
}

/// Hostile items in a log leaf, for each kind of item the log holds:
/// every damage of one of `f`'s items leaves an image that mounts (with
/// no error), `g`'s fsync replayed, `f` readable (or gone, when its
/// names were damaged into ones that cannot be), and check clean after
/// the replay. Damage to a checksum item drops the
/// root (no inode owns it), so `g` may then be lost as well.
#[test]
fn hostile_log_items_never_lock_the_filesystem_away() {
    use canopy::format::key_type::*;
    use std::collections::BTreeSet;
    let dev = crashed_with_two_logged_files();
    let root = common::last_log_root(dev.as_ref());
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, root).expect("read");
    let leaf = canopy::format::node::Node::decode(&buf, root, &[0x42; 16]).expect("leaf");
    let canopy::format::node::Body::Leaf(items) = &leaf.body else {
        panic!("a small log is one leaf");
    };
    let csum = canopy::format::CSUM_OBJECTID;
    let f_node = items
        .iter()
        .map(|i| i.key.objectid)
        .filter(|&o| o != csum)
        .min()
        .expect("logged inodes");
    let mut kinds = BTreeSet::new();
    let mut cases = 0;
    // Each case damages and replays its own copy-on-write view of it.
    let crashed_image = Arc::new(dev.snapshot());
    for (index, item) in items.iter().enumerate() {
        let is_csum = item.key.objectid == csum;
        if item.key.objectid != f_node && !is_csum {
            continue;
        }
        kinds.insert(item.key.ty);
        for (how, data) in item_damage(item.data) {
            cases += 1;
            let what = format!("item {} {how}", item.key);
            let img = Arc::new(canopy::dev::crash::OverlayDevice::new(
                crashed_image.clone(),
            ));
            let n = std::cell::Cell::new(0);
            damage_log_leaf(img.as_ref(), |it| {
                if n.get() == index {
                    it.data = data.clone();
                }
                n.set(n.get() + 1);
            });
            let report = canopy::check::check_all(common::read_only(img.clone()), &|_, _| {})
                .unwrap_or_else(|e| panic!("{what}: check failed: {e}"));
            let e = Engine::open(img.clone() as Arc<dyn Device>, &OpenOptions::default())
                .unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
            let fs = Fs::new(Arc::new(e)).unwrap_or_else(|e| panic!("{what}: replay failed: {e}"));
            // Damage the checker cannot tell from a real change (a size,
            // a time) replays as it reads: f need only read back whole.
            if let Some(f) = lookup(&fs, "f") {
                let size = fs
                    .getattr(f)
                    .unwrap_or_else(|e| panic!("{what}: stat f: {e}"))
                    .size;
                fs.read(f, 0, size.min(1 << 20) as u32)
                    .unwrap_or_else(|e| panic!("{what}: read f: {e}"));
            }
            let g = content(&fs, "g");
            match is_csum {
                false => assert_eq!(g, Some(g_content()), "{what}: g's fsync lost"),
                true => assert!(
                    [None, Some(g_content())].contains(&g),
                    "{what}: g has {:?} bytes",
                    g.map(|g| g.len())
                ),
            }
            let verdict = report.log.as_ref().expect("check reports the log");
            // A checksum that does not match its data reads as a write
            // that never landed: a warning, not a problem.
            if !verdict.skipped.is_empty() || !verdict.dropped.is_empty() {
                let said = report.problems.len() + report.warnings.len();
                assert!(said > 0, "{what}: check found nothing");
            }
            drop(fs);
            common::assert_clean(img.as_ref());
        }
    }
    for kind in [
        LOG_INODE,
        INODE_ITEM,
        INODE_REF,
        XATTR_ITEM,
        LOG_RANGE,
        EXTENT_DATA,
        EXTENT_CSUM,
        LOG_DATA,
    ] {
        assert!(
            kinds.contains(&kind),
            "no item of kind {kind} in the log: {kinds:?}"
        );
    }
    assert!(cases > 50, "only {cases} damaged images");
}

/// A pending log that checks out: check is clean and says what the next
/// mount would replay.
#[test]
fn check_says_what_a_pending_log_would_replay() {
    let dev = crashed_with_a_log();
    let r = canopy::check::check_all(crashed(&dev), &|_, _| {}).expect("check ran");
    assert!(r.is_clean(), "{:#?}", r.problems);
    let log = r.log.expect("check reports the log");
    assert_eq!(log.chosen.as_deref(), Some("last"));
    assert_eq!(log.inodes, 1);
    assert_eq!(log.new_extents, 1);
    let fs = open_fs(&dev);
    expect_content(&fs, "f", Some(&pattern(60, 5000))).expect("the fsynced file");
}

/// SQLite's rollback journal with `synchronous=EXTRA`: the journal is
/// created and fsynced in one transaction, and deleted, with a directory
/// fsync, after the next commit. The deletion must survive a crash, or
/// the journal comes back as a hot journal and rolls the commit back.
#[test]
fn a_committed_file_unlinked_then_its_directory_fsynced() {
    crash_every_prefix(
        "unlink after commit",
        Box::new(|fs| {
            let d = mkdir(fs, ROOT, "d");
            file(fs, d, "journal", &pattern(44, 5000));
            file(fs, ROOT, "j2", &pattern(45, 5000));
        }),
        vec![
            Box::new(|fs| {
                let d = lookup(fs, "d").expect("d");
                fs.remove(d, b"journal", false).expect("unlink");
                fs.fsync(d).expect("fsync d");
            }),
            Box::new(|fs| {
                fs.remove(ROOT, b"j2", false).expect("unlink");
                fs.fsync(ROOT).expect("fsync root");
            }),
        ],
        Box::new(|fs, done| {
            expect(done < 1 || lookup(fs, "d/journal").is_none(), || {
                "d/journal back after its durable unlink".into()
            })?;
            expect(done < 2 || lookup(fs, "j2").is_none(), || {
                "j2 back after its durable unlink".into()
            })
        }),
    );
}

/// The same, with the file still open when it is unlinked (FUSE sends
/// the release of a closed file after the unlink that follows it).
#[test]
fn an_open_committed_file_unlinked_then_its_directory_fsynced() {
    crash_every_prefix(
        "unlink while open",
        Box::new(|fs| {
            file(fs, ROOT, "journal", &pattern(46, 25136));
        }),
        vec![
            Box::new(|fs| {
                let j = lookup(fs, "journal").expect("journal");
                fs.open(j);
                fs.write(j, 0, &pattern(47, 512)).expect("write");
                fs.fsync(j).expect("fsync journal");
                fs.remove(ROOT, b"journal", false).expect("unlink");
                fs.fsync(ROOT).expect("fsync root");
            }),
            Box::new(|fs| {
                let j = file(fs, ROOT, "journal", &pattern(48, 25136));
                fs.fsync(j).expect("fsync journal");
                fs.fsync(ROOT).expect("fsync root");
                fs.open(j);
                fs.remove(ROOT, b"journal", false).expect("unlink");
                fs.fsync(ROOT).expect("fsync root");
            }),
        ],
        Box::new(|fs, done| {
            let j = content(fs, "journal");
            // Step 2's own journal may show while that step runs.
            let ok = match done {
                0 => true,
                1 => j.is_none_or(|j| j == pattern(48, 25136)),
                _ => j.is_none(),
            };
            expect(ok, || {
                format!("journal back after its durable unlink ({done} steps)")
            })
        }),
    );
}

/// SQLite's commit in rollback-journal mode with `synchronous=EXTRA`, step
/// by step: a new journal, fsynced with its directory; the database page
/// written and fsynced; the journal closed and deleted, the directory
/// fsynced. After a crash the database must hold every returned commit
/// and no journal of a returned commit may be back (SQLite would roll the
/// commit back). FUSE may deliver the close after the unlink, so every
/// other commit deletes its journal while it is still open.
#[test]
fn sqlite_rollback_journal_commits() {
    const STEPS: usize = 8;
    fn page(i: usize) -> Vec<u8> {
        pattern(100 + i as u8, 4096)
    }
    let db_after = |done: usize| {
        let mut db = pattern(99, 64 << 10);
        for i in 0..done {
            let at = (i % 4) * 4096;
            db[at..at + 4096].copy_from_slice(&page(i));
        }
        db
    };
    let steps: Vec<Step> = (0..STEPS)
        .map(|i| {
            Box::new(move |fs: &Fs| {
                let db = lookup(fs, "db").expect("db");
                let j = file(fs, ROOT, "db-journal", &pattern(120 + i as u8, 8192));
                fs.open(j);
                fs.fsync(j).expect("fsync journal");
                fs.fsync(ROOT).expect("fsync dir");
                if i % 3 == 1 {
                    // The periodic commit, between the journal and its deletion.
                    fs.sync().expect("commit");
                }
                let at = (i % 4) * 4096;
                fs.write(db, at as u64, &page(i)).expect("write db");
                fs.fsync(db).expect("fsync db");
                if i % 3 == 2 {
                    fs.sync().expect("commit");
                }
                if i % 2 == 0 {
                    fs.release(j).expect("close");
                    fs.remove(ROOT, b"db-journal", false).expect("unlink");
                } else {
                    fs.remove(ROOT, b"db-journal", false).expect("unlink");
                    fs.release(j).expect("close");
                }
                fs.fsync(ROOT).expect("fsync dir");
            }) as Step
        })
        .collect();
    let with_commits = Layout {
        may_commit: true,
        ..SMALL_MIXED
    };
    crash_every_prefix_on(
        with_commits,
        "sqlite rollback journal",
        Box::new(move |fs| {
            file(fs, ROOT, "db", &pattern(99, 64 << 10));
        }),
        steps,
        Box::new(move |fs, done| {
            // The step in flight may have written its page, and its
            // journal may be there (SQLite would roll that step back);
            // never the journal of a returned step.
            let db = content(fs, "db");
            expect(
                db == Some(db_after(done)) || db == Some(db_after(done + 1)),
                || format!("db is neither after {done} nor after {} commits", done + 1),
            )?;
            let j = content(fs, "db-journal");
            expect(
                j.is_none_or(|j| j == pattern(120 + done as u8, 8192)),
                || format!("the journal of a returned commit is back ({done} commits)"),
            )
        }),
    );
}

/// Issue 36, item 3: fsync waits for its own file's data, never for
/// another file's flush. Another file's flush stays in flight while a
/// commit waits for it to end; an fsync of a small file must return
/// meanwhile, through the log (a commit could not finish before the
/// flight ends).
#[test]
fn fsync_goes_ahead_of_a_commit_waiting_for_another_flush() {
    use std::time::{Duration, Instant};
    let (_dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Arc::new(Fs::new(Arc::new(e)).expect("fs"));
    let small = file(&fs, ROOT, "small", &[]);
    fs.sync().expect("commit");
    let engine = fs.engine().clone();
    let other_flush = engine.write(|tx| Ok(tx.start_flight(0))).expect("flight");
    let committer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.sync())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !engine.commit_waits_for_flights() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let commit_waited = engine.commit_waits_for_flights();
    let (tx, rx) = std::sync::mpsc::channel();
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs
                .write(small, 0, &pattern(5, 4096))
                .and_then(|_| fs.fsync(small));
            let _ = tx.send(r);
        })
    };
    let fsynced = rx.recv_timeout(Duration::from_secs(10));
    // End the other flush whatever happened, so nothing hangs.
    engine
        .write(|tx| tx.end_flight(other_flush))
        .expect("end flight");
    committer.join().expect("committer").expect("commit");
    syncer.join().expect("fsync thread");
    assert!(commit_waited, "the commit never waited for the open flight");
    match fsynced {
        Ok(r) => r.expect("fsync"),
        Err(_) => panic!("fsync waited for another file's flush (a waiting commit)"),
    }
    assert_eq!(content(&fs, "small"), Some(pattern(5, 4096)));
}

/// A small file compressed inline, fsynced as it is rewritten, truncated
/// and grown past a sector into extents: every step's content survives.
#[test]
fn a_compressed_inline_file_through_its_fsyncs() {
    let text = |n: usize| -> Vec<u8> {
        let line = b"a line of text that compresses well 0123456789\n";
        line.iter().copied().cycle().take(n).collect()
    };
    let mut states = vec![text(3000)];
    let mut s1 = states[0].clone();
    s1.extend_from_slice(&text(500));
    states.push(s1.clone());
    states.push(s1[..1000].to_vec());
    let mut s3 = states[2].clone();
    s3.extend_from_slice(&text(7000));
    states.push(s3);
    let want = states.clone();
    let zstd = canopy::compress::Policy {
        codec: Some(canopy::compress::Codec::Zstd(3)),
        force: false,
    };
    let step = move |i: usize, states: Vec<Vec<u8>>| -> Step {
        Box::new(move |fs: &Fs| {
            fs.set_compression(zstd);
            let f = match i {
                0 => file(fs, ROOT, "f", &[]),
                _ => lookup(fs, "f").expect("f"),
            };
            let (old, new) = (i.checked_sub(1).map_or(0, |p| states[p].len()), &states[i]);
            let s = SetAttr {
                size: Some(new.len() as u64),
                ..Default::default()
            };
            fs.setattr(f, &s).expect("size");
            if new.len() > old {
                fs.write(f, old as u64, &new[old..]).expect("write");
            }
            fs.fsync(f).expect("fsync");
            // Written inline compressed: st_blocks counts the frame. The
            // truncate keeps the part it leaves plain (counted whole).
            let stored = fs.getattr(f).expect("attr").blocks * 512;
            match i {
                0 | 1 => assert!(stored < new.len() as u64 / 2, "step {i}: {stored}"),
                2 => assert_eq!(stored, 1024, "step 2"),
                _ => {}
            }
        })
    };
    let steps = (0..states.len()).map(|i| step(i, states.clone())).collect();
    crash_every_prefix(
        "compressed inline",
        Box::new(|_| {}),
        steps,
        Box::new(move |fs, done| match done {
            0 => expect_content(fs, "f", None),
            n => expect_content(fs, "f", Some(&want[n - 1])),
        }),
    );
}

/// A hole over 300 extents (more than one step of the punch's bounded
/// steps), then fsync: before the fsync returns a crash may show part of
/// the hole punched (never a byte outside it changed); after, all of it.
#[test]
fn fsync_after_punching_a_hole_in_steps() {
    let len = 600 * 4096;
    let a = pattern(3, len);
    let (from, to) = (5000usize, len - 5000);
    let mut want = a.clone();
    want[from..to].fill(0);
    let a2 = a.clone();
    crash_every_prefix(
        "punch in steps",
        Box::new(move |fs| {
            let f = file(fs, ROOT, "f", &[]);
            // Every other sector first, then the rest: 600 extents.
            for i in (0..600).step_by(2).chain((1..600).step_by(2)) {
                fs.write(f, i * 4096, &a2[i as usize * 4096..(i as usize + 1) * 4096])
                    .expect("write");
                fs.fsync(f).expect("fsync");
            }
        }),
        vec![Box::new(move |fs| {
            let f = lookup(fs, "f").expect("f");
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            fs.fallocate(f, from as u64, (to - from) as u64, mode)
                .expect("punch");
            fs.fsync(f).expect("fsync");
        })],
        Box::new(move |fs, done| {
            let got = content(fs, "f").ok_or("f is gone")?;
            if done == 1 {
                return expect(got == want, || "the hole is not all there".into());
            }
            let outside = got[..from] == a[..from] && got[to..] == a[to..];
            let inside = got[from..to]
                .iter()
                .zip(&a[from..to])
                .all(|(g, o)| g == o || *g == 0);
            expect(outside && inside, || {
                "bytes outside the hole changed".into()
            })
        }),
    );
}

/// Issue 57, item 1: an fsync's log write names the log's root in a chain
/// link, not in the superblock (no superblock copy is written: on RBD
/// each copy is another object), and the next commit writes every copy;
/// the image opens with what was fsynced, and a commit's superblock names
/// where the next log's chain begins.
#[test]
fn an_fsync_writes_no_superblock_copy() {
    use canopy::dev::crash::Op;
    use canopy::format::SUPER_OFFSETS;
    let (base_dev, e) = common::mem_engine(128 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let f = file(&fs, ROOT, "f", b"committed");
    fs.sync().expect("commit");
    drop(fs);
    let rec = Arc::new(RecordingDevice::new(base_dev.snapshot()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let copies_written = |ops: &[Op]| -> Vec<usize> {
        SUPER_OFFSETS[..2]
            .iter()
            .map(|&s| {
                ops.iter()
                    .filter(|o| matches!(o, Op::Write { offset, .. } if *offset == s))
                    .count()
            })
            .collect()
    };
    // The open commits once, so that this run's log has a chain of its own.
    let at_open = copies_written(&rec.ops());
    assert_eq!(at_open, vec![1, 1], "the open's commit");
    let sb = canopy::txn::read_best_superblock(&canopy::dev::MemDevice::from_bytes(rec.contents()))
        .expect("superblock");
    assert_ne!(sb.log_chain, 0, "a commit names where the next log begins");
    for round in 0..3u8 {
        fs.write(f, 0, &[b'0' + round; 16]).expect("write");
        fs.fsync(f).expect("fsync");
    }
    assert_eq!(copies_written(&rec.ops()), at_open, "the log writes");
    let fsynced = rec.contents();
    assert_eq!(
        common::log_roots(&canopy::dev::MemDevice::from_bytes(fsynced.clone())).len(),
        3,
        "one link per log write"
    );
    fs.sync().expect("commit");
    assert_eq!(
        copies_written(&rec.ops()),
        vec![2, 2],
        "the commit writes both"
    );
    drop(fs);
    // A crash after the last fsync: the chain leads to the log.
    let dev = Arc::new(canopy::dev::MemDevice::from_bytes(fsynced));
    let fs = open_fs(&dev);
    let f = lookup(&fs, "f").expect("f");
    assert_eq!(fs.read(f, 0, 16).expect("read"), vec![b'2'; 16]);
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
}

/// A chain link damaged after it was written ends the chain there, like
/// one a crash tore: replay takes the root of the link before it, or
/// opens at the last commit when the first link is the damaged one. The
/// mount never fails and the image checks clean.
#[test]
fn a_damaged_chain_link_ends_the_chain_there() {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let f = file(&fs, ROOT, "f", b"committed");
    fs.sync().expect("commit");
    let (one, two) = (pattern(91, 5000), pattern(93, 5000));
    for data in [&one, &two] {
        fs.write(f, 0, data).expect("write");
        fs.fsync(f).expect("fsync");
    }
    let image = dev.snapshot();
    drop(fs);
    let whole = Arc::new(canopy::dev::MemDevice::from_bytes(image.clone()));
    let sb = canopy::txn::read_best_superblock(whole.as_ref()).expect("superblock");
    let links = canopy::txn::read_chain(whole.as_ref(), &sb);
    assert_eq!(links.len(), 2, "one link per log write");
    let fs = open_fs(&whole);
    expect_content(&fs, "f", Some(&two)).unwrap_or_else(|why| panic!("whole chain: {why}"));
    drop(fs);
    for (damaged, want) in [(1, &one[..]), (0, &b"committed"[..])] {
        let dev = Arc::new(canopy::dev::MemDevice::from_bytes(image.clone()));
        let at = links[damaged].bytenr + 64;
        let mut byte = [0u8; 1];
        dev.read_at(&mut byte, at).expect("read");
        dev.write_at(&[byte[0] ^ 0x10], at).expect("write");
        let fs = open_fs(&dev);
        expect_content(&fs, "f", Some(want))
            .unwrap_or_else(|why| panic!("link {damaged} damaged: {why}"));
        drop(fs);
        common::assert_posix_clean_in_place(dev.clone());
    }
}

/// Concurrent fsyncs with commits beside them (the mount commits every
/// few seconds): at every barrier, and with each mix of the writes in
/// flight, every fsync that had returned is there. A commit ends the
/// log's chain and its superblock starts the next, so a crash between
/// any two of their writes must still find the log.
#[test]
fn concurrent_fsyncs_beside_commits_each_survive() {
    const ROUNDS: u8 = 8;
    for seed in 0..3usize {
        // Runs 0 and 2 with two log writes in flight, run 1 with one.
        let in_flight = 2 - seed % 2;
        let (base, ops, returned) = concurrent_fsyncs_and_commits(
            ROUNDS,
            std::time::Duration::from_millis(1),
            in_flight,
            6,
        );
        // The commits happened while the fsyncs went on: superblocks were
        // written between the first fsync's return and the last one's.
        let first_super = canopy::format::SUPER_OFFSETS[0];
        let (first, last) = returned
            .iter()
            .fold((usize::MAX, 0), |(lo, hi), r| (lo.min(r.2), hi.max(r.2)));
        let commits_among = ops[first..last]
            .iter()
            .filter(|o| matches!(o, canopy::dev::crash::Op::Write { offset, .. } if *offset == first_super))
            .count();
        assert!(commits_among > 0, "run {seed}: no commit among the fsyncs");
        let mut rp = Replayer::new(base, ops);
        for prefix in 1..=rp.len() {
            let keeps: [(&str, &dyn Fn(usize) -> bool); 3] = [
                ("everything", &|_| true),
                ("nothing", &|_| false),
                ("a mix", &|i| (i + seed) % 3 != 0),
            ];
            for (how, keep) in keeps {
                let dev = Arc::new(rp.at(prefix, keep));
                let what = format!("run {seed}, prefix {prefix}, {how} kept");
                let _ = assert_returned_fsyncs_kept(dev, &what, prefix, ROUNDS, &returned);
            }
        }
    }
}

/// Issue 57, item 1: on storage that keeps copies of its own (a
/// replicated Ceph pool), a log write writes one copy of the log's blocks
/// and link even where tree blocks have two (`dup`); elsewhere both. At
/// every barrier, and with the writes in flight kept or lost, the image
/// opens with every fsync that had returned and checks clean: replay
/// reads the first copy, and the stale second one is never taken.
#[test]
fn on_replicated_storage_a_log_write_writes_one_copy() {
    use canopy::dev::crash::Op;
    use canopy::format::loglink::{LogLink, LINK_BYTES};
    const ROUNDS: u8 = 12;
    let dev = Arc::new(canopy::dev::MemDevice::new(256 << 20));
    let opts = canopy::FormatOptions {
        nodesize: 4096,
        mixed: Some(false),
        metadata_profile: Some(canopy::format::superblock::Profile::Dup),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    file(&fs, ROOT, "f", &pattern(5, 6000));
    fs.sync().expect("commit");
    drop(fs);
    let base = Arc::new(dev.snapshot());
    // Link pages written, and how many distinct links they hold.
    let link_copies = |ops: &[Op]| {
        let mut pages = 0;
        let mut links = std::collections::HashSet::new();
        for o in ops {
            let Op::Write { data, .. } = o else { continue };
            for page in data.chunks_exact(canopy::dev::crash::PAGE) {
                if LogLink::looks_like_link(&page[..LINK_BYTES]) {
                    pages += 1;
                    links.insert(page[..64].to_vec());
                }
            }
        }
        (pages, links.len())
    };
    let mut ops_of = Vec::new();
    for replicated in [false, true] {
        let rec = RecordingDevice::new(base.as_ref().clone());
        let rec = Arc::new(match replicated {
            true => rec.replicating(),
            false => rec,
        });
        let e =
            Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
        let fs = Fs::new(Arc::new(e)).expect("fs");
        let f = lookup(&fs, "f").expect("f");
        let mut returned = Vec::new();
        for r in 0..ROUNDS {
            fs.write(f, 0, &version(0, r)).expect("write");
            fs.fsync(f).expect("fsync");
            returned.push((0u8, r, rec.op_count()));
        }
        drop(fs);
        let ops = rec.ops();
        let (pages, links) = link_copies(&ops);
        assert!(links >= usize::from(ROUNDS), "one link per fsync: {links}");
        let copies = match replicated {
            true => 1,
            false => 2,
        };
        assert_eq!(pages, links * copies, "replicated: {replicated}");
        ops_of.push((ops, returned));
    }
    let (ops, returned) = ops_of.pop().expect("the replicated run");
    let barriers: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, Op::Barrier { .. }))
        .map(|(i, _)| i + 1)
        .collect();
    let mut rp = Replayer::new(base, ops);
    for prefix in barriers {
        let keeps: [(&str, &dyn Fn(usize) -> bool); 2] =
            [("everything", &|_| true), ("nothing", &|_| false)];
        for (how, keep) in keeps {
            let dev = Arc::new(rp.at(prefix, keep));
            let what = format!("prefix {prefix}, {how} kept");
            let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default())
                .unwrap_or_else(|err| panic!("{what}: open failed: {err}"));
            let fs = Fs::new(Arc::new(e)).unwrap_or_else(|err| panic!("{what}: {err}"));
            let done = returned
                .iter()
                .filter(|&&(_, _, at)| at <= prefix)
                .map(|&(_, r, _)| r)
                .max();
            let got = content(&fs, "f").expect("f");
            let ok = match done {
                Some(r) => (r..ROUNDS).any(|r| got == version(0, r)),
                None => true,
            };
            assert!(ok, "{what}: lost the fsync of round {done:?}");
            drop(fs);
            common::assert_posix_clean_in_place(dev.clone());
        }
    }
}

/// The model of [`small_writes_fsynced_in_the_log_survive_every_crash`]:
/// the file after its first `steps` steps.
fn logged_bytes_model(steps: usize) -> Vec<u8> {
    let mut f = pattern(90, 40_000);
    let put = |f: &mut Vec<u8>, at: usize, d: &[u8]| {
        if f.len() < at + d.len() {
            f.resize(at + d.len(), 0);
        }
        f[at..at + d.len()].copy_from_slice(d);
    };
    for step in 0..steps {
        match step {
            0 => put(&mut f, 5000, &pattern(91, 100)),
            1 => {
                put(&mut f, 8192, &pattern(92, 4096));
                put(&mut f, 40_000, &pattern(93, 3000));
            }
            2 => {
                put(&mut f, 5000, &pattern(94, 50));
                f.truncate(30_000);
                put(&mut f, 29_900, &pattern(95, 500));
            }
            3 => put(&mut f, 0, &pattern(96, 70_000)),
            _ => put(&mut f, 100, &pattern(97, 10)),
        }
    }
    f
}

/// Small writes to a file with extents are fsynced with their bytes in
/// the log (`LOG_DATA`), not written to extents first: rewrites, an
/// append, a truncate under logged bytes, a write too large for the log
/// (flushed to extents, which the log then names) and a small one after
/// it. At every crash point the file is as one of its fsyncs left it.
#[test]
fn small_writes_fsynced_in_the_log_survive_every_crash() {
    let steps: Vec<Step> = (0..5)
        .map(|step| -> Step {
            Box::new(move |fs: &Fs| {
                let f = lookup(fs, "f").expect("f");
                match step {
                    0 => drop(fs.write(f, 5000, &pattern(91, 100)).expect("write")),
                    1 => {
                        fs.write(f, 8192, &pattern(92, 4096)).expect("write");
                        fs.write(f, 40_000, &pattern(93, 3000)).expect("append");
                    }
                    2 => {
                        fs.write(f, 5000, &pattern(94, 50)).expect("write");
                        let s = SetAttr {
                            size: Some(30_000),
                            ..Default::default()
                        };
                        fs.setattr(f, &s).expect("truncate");
                        fs.write(f, 29_900, &pattern(95, 500)).expect("write");
                    }
                    3 => drop(fs.write(f, 0, &pattern(96, 70_000)).expect("write")),
                    _ => drop(fs.write(f, 100, &pattern(97, 10)).expect("write")),
                }
                fs.fsync(f).expect("fsync");
            })
        })
        .collect();
    crash_every_prefix(
        "logged bytes",
        Box::new(|fs| {
            file(fs, ROOT, "f", &logged_bytes_model(0));
            fs.sync().expect("commit the file's extents");
        }),
        steps,
        Box::new(|fs, done| expect_content(fs, "f", Some(&logged_bytes_model(done)))),
    );
}

/// A fresh filesystem holding `f`, 20,000 bytes of `pattern(seed)`
/// committed to extents, then `len` bytes of `pattern(seed + 1)` written
/// at `at` and fsynced (their bytes go in the log); and what `f` holds.
fn small_write_fsynced_into_a_committed_file(
    seed: u8,
    at: usize,
    len: usize,
) -> (Arc<canopy::dev::MemDevice>, Fs, Vec<u8>) {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let mut want = pattern(seed, 20_000);
    let f = file(&fs, ROOT, "f", &want);
    fs.sync().expect("commit");
    fs.write(f, at as u64, &pattern(seed + 1, len))
        .expect("write");
    want[at..at + len].copy_from_slice(&pattern(seed + 1, len));
    fs.fsync(f).expect("fsync");
    (dev, fs, want)
}

/// The crashed disk of a run that committed `f` with extents, then wrote
/// a few bytes into it and fsynced: the bytes are only in the log.
fn crashed_with_logged_bytes() -> (Arc<canopy::dev::MemDevice>, Vec<u8>) {
    let (dev, fs, want) = small_write_fsynced_into_a_committed_file(100, 6000, 700);
    let out = crashed(&dev);
    drop(fs);
    (out, want)
}

/// The kinds of item in the log the crash left on `dev`.
fn log_item_kinds(dev: &dyn Device) -> std::collections::BTreeSet<u8> {
    use canopy::format::node::{Body, Node};
    let root = common::last_log_root(dev);
    assert_ne!(root, 0, "the crash left a log");
    let mut kinds = std::collections::BTreeSet::new();
    let mut todo = vec![root];
    while let Some(at) = todo.pop() {
        let mut buf = vec![0u8; 4096];
        dev.read_at(&mut buf, at).expect("read");
        match Node::decode(&buf, at, &[0x42; 16]).expect("decode").body {
            Body::Leaf(items) => kinds.extend(items.iter().map(|i| i.key.ty)),
            Body::Internal(ptrs) => todo.extend(ptrs.iter().map(|p| p.bytenr)),
        }
    }
    kinds
}

/// A file `name` holding `data`, committed; then the image opened again
/// on a recording device. Returns the committed image, the recorder, the
/// filesystem on it and the file.
fn committed_then_recorded(name: &str, data: &[u8]) -> (Vec<u8>, Arc<RecordingDevice>, Fs, u64) {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let f = file(&fs, ROOT, name, data);
    fs.sync().expect("commit");
    drop(fs);
    let base = dev.snapshot();
    let rec = Arc::new(RecordingDevice::new(base.clone()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    (base, rec, Fs::new(Arc::new(e)).expect("fs"), f)
}

/// An fsync of a small write writes only log pages (blocks and the chain
/// link, the bytes inside the blocks) before its one barrier: nothing goes
/// to the file's extents until the commit. Once the chain runs (after the
/// transaction's first log write), blocks and link go out as one write.
#[test]
fn a_small_fsynced_write_reaches_the_disk_in_the_log_write_alone() {
    use canopy::dev::crash::{Op, PAGE};
    use canopy::format::key_type::{EXTENT_DATA, LOG_DATA, LOG_RANGE};
    use canopy::format::loglink::{LogLink, LINK_BYTES};
    use canopy::format::node::Node;
    let (base, rec, fs, f) = committed_then_recorded("f", &pattern(102, 20_000));
    fs.write(f, 100, &pattern(103, 10)).expect("write");
    fs.fsync(f).expect("the transaction's first fsync");
    let before = rec.ops().len();
    fs.write(f, 4096, &pattern(103, 4096)).expect("write");
    fs.fsync(f).expect("fsync");
    let ops = rec.ops()[before..].to_vec();
    let writes: Vec<(u64, &Vec<u8>)> = ops
        .iter()
        .filter_map(|o| match o {
            Op::Write { offset, data } => Some((*offset, data)),
            _ => None,
        })
        .collect();
    let barriers = ops
        .iter()
        .filter(|o| matches!(o, Op::Barrier { .. }))
        .count();
    let shape: Vec<(u64, usize)> = writes.iter().map(|(o, d)| (*o, d.len())).collect();
    assert_eq!(barriers, 1, "one barrier: {shape:?}");
    assert_eq!(writes.len(), 1, "one write, blocks and link: {shape:?}");
    for (offset, data) in &writes {
        for (i, page) in data.chunks_exact(PAGE).enumerate() {
            let at = offset + (i * PAGE) as u64;
            let log_block = Node::decode(page, at, &[0x42; 16])
                .is_ok_and(|n| n.owner == canopy::format::tree_id::LOG);
            assert!(
                log_block || LogLink::looks_like_link(&page[..LINK_BYTES]),
                "page {at} of the fsync's write is not the log's: {shape:?}"
            );
        }
    }
    let all = rec.ops();
    let mut replayer = Replayer::new(Arc::new(base), all.clone());
    let disk = replayer.at(all.len(), &|_| true);
    let kinds = log_item_kinds(&disk);
    assert!(
        kinds.contains(&LOG_DATA),
        "the bytes are in the log: {kinds:?}"
    );
    assert!(
        !kinds.contains(&EXTENT_DATA) && !kinds.contains(&LOG_RANGE),
        "no extent was written for them: {kinds:?}"
    );
    drop(fs);
}

/// A commit drops the log, so the bytes it holds must be in the trees by
/// then, whoever commits: here the engine directly, with no flush of the
/// file before it. A crash after that commit keeps them.
#[test]
fn a_commit_writes_the_bytes_the_log_holds_before_dropping_it() {
    let (dev, fs, want) = small_write_fsynced_into_a_committed_file(104, 9000, 300);
    fs.engine()
        .commit()
        .expect("a commit from below the fs layer");
    let disk = crashed(&dev);
    drop(fs);
    assert_eq!(
        common::last_log_root(disk.as_ref()),
        0,
        "the commit dropped the log"
    );
    let fs = open_fs(&disk);
    expect_content(&fs, "f", Some(&want)).expect("the fsynced bytes");
    drop(fs);
    common::assert_posix_clean_in_place(disk.clone());
}

/// Bytes in the log replay on a writable mount (the replay's commit
/// writes them to extents), show on a read-only one (from memory), and
/// check calls the image clean.
#[test]
fn logged_bytes_replay_on_writable_and_read_only_mounts() {
    use canopy::format::key_type::LOG_DATA;
    let (dev, want) = crashed_with_logged_bytes();
    assert!(log_item_kinds(dev.as_ref()).contains(&LOG_DATA));
    let report = canopy::check::check_all(crashed(&dev), &|_, _| {}).expect("check ran");
    assert!(report.is_clean(), "{:#?}", report.problems);
    let ro = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let e = Engine::open(crashed(&dev) as Arc<dyn Device>, &ro).expect("open read-only");
    let fs = Fs::new(Arc::new(e)).expect("replay in memory");
    expect_content(&fs, "f", Some(&want)).expect("read-only replay");
    drop(fs);
    let fs = open_fs(&dev);
    expect_content(&fs, "f", Some(&want)).expect("writable replay");
    drop(fs);
    assert_eq!(common::last_log_root(dev.as_ref()), 0, "replay committed");
    common::assert_clean(dev.as_ref());
    let fs = open_fs(&dev);
    expect_content(&fs, "f", Some(&want)).expect("after the replay's commit");
}

/// A WAL-like file: 8 KiB appended into a committed file and fsynced,
/// round after round, so the bytes the log holds pass `LOG_DATA_MAX` and
/// a flush empties the leaves that held them. Every log block a log
/// write sends is its link's root or a child of a block sent with it:
/// a leaf the tree no longer reaches (emptied) is never written.
#[test]
fn a_log_write_sends_only_blocks_its_root_reaches() {
    use canopy::dev::crash::{Op, PAGE};
    use canopy::format::loglink::LogLink;
    use canopy::format::node::{Body, Node};
    const FSID: [u8; 16] = [0x42; 16];
    let (base, rec, fs, f) = committed_then_recorded("wal", &pattern(7, 512 << 10));
    let mut want = pattern(7, 512 << 10);
    for round in 0..40usize {
        let at = round * 8192;
        let page = pattern(round as u8, 8192);
        fs.write(f, at as u64, &page).expect("write");
        want[at..at + 8192].copy_from_slice(&page);
        fs.fdatasync(f).expect("fdatasync");
    }
    let ops = rec.ops();
    let (mut sent, mut reached, mut checked) = (Vec::new(), Vec::new(), 0);
    for op in &ops {
        match op {
            Op::Write { offset, data } => {
                for (i, page) in data.chunks_exact(PAGE).enumerate() {
                    let at = offset + (i * PAGE) as u64;
                    if let Some(link) = LogLink::decode(page, at, &FSID) {
                        reached.push(link.root);
                    } else if let Ok(n) = Node::decode(page, at, &FSID) {
                        if n.owner != canopy::format::tree_id::LOG {
                            continue;
                        }
                        if let Body::Internal(ptrs) = &n.body {
                            reached.extend(ptrs.iter().map(|p| p.bytenr));
                        }
                        sent.push((at, n.nritems()));
                    }
                }
            }
            Op::Barrier { .. } => {
                for (at, items) in sent.drain(..) {
                    assert!(
                        reached.contains(&at),
                        "log block {at} ({items} items) was sent, but neither the link's \
                         root nor a block sent with it points to it"
                    );
                    checked += 1;
                }
                reached.clear();
            }
            _ => {}
        }
    }
    assert!(checked >= 40, "log blocks sent: {checked}");
    let disk = {
        let mut replayer = Replayer::new(Arc::new(base), ops.clone());
        Arc::new(replayer.at(ops.len(), &|_| true))
    };
    drop(fs);
    let e = Engine::open(disk.clone() as Arc<dyn Device>, &OpenOptions::default())
        .expect("open the recorded image");
    let fs = Fs::new(Arc::new(e)).expect("replay");
    expect_content(&fs, "wal", Some(&want)).expect("every fdatasynced page");
    drop(fs);
    common::assert_posix_clean_in_place(disk);
}

/// fdatasync need not make a new mtime durable, and keeps the log's copy
/// of the inode item when only its times changed (its leaf is not
/// written again); a size change is logged all the same, and fsync
/// logs the times.
#[test]
fn fdatasync_logs_the_size_and_fsync_the_times() {
    let (dev, fs) = format_fs(SMALL_MIXED);
    let f = file(&fs, ROOT, "f", &pattern(3, 64 << 10));
    fs.sync().expect("commit");
    let mtime = |fs: &Fs| {
        fs.getattr(lookup(fs, "f").expect("f"))
            .expect("getattr")
            .mtime
    };
    let mut want = pattern(3, 64 << 10);
    // Logged in full once (times and all), then overwritten in place.
    fs.write(f, 0, &pattern(4, 4096)).expect("write");
    want[..4096].copy_from_slice(&pattern(4, 4096));
    fs.fsync(f).expect("fsync");
    let logged_mtime = mtime(&fs);
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs.write(f, 8192, &pattern(5, 4096)).expect("write");
    want[8192..12288].copy_from_slice(&pattern(5, 4096));
    fs.fdatasync(f).expect("fdatasync of an overwrite");
    let disk = crashed(&dev);
    let replayed = open_fs(&disk);
    expect_content(&replayed, "f", Some(&want)).expect("the overwrite");
    assert_eq!(
        mtime(&replayed),
        logged_mtime,
        "the overwrite's fdatasync kept the logged inode item"
    );
    drop(replayed);
    common::assert_posix_clean_in_place(disk);
    // An append changes the size: fdatasync logs it.
    fs.write(f, 64 << 10, &pattern(6, 3000)).expect("append");
    want.extend_from_slice(&pattern(6, 3000));
    fs.fdatasync(f).expect("fdatasync of an append");
    let disk = crashed(&dev);
    let replayed = open_fs(&disk);
    expect_content(&replayed, "f", Some(&want)).expect("the append and its size");
    drop(replayed);
    // fsync makes the times durable too.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs.write(f, 0, &pattern(7, 100)).expect("write");
    want[..100].copy_from_slice(&pattern(7, 100));
    fs.fsync(f).expect("fsync");
    let now = mtime(&fs);
    let disk = crashed(&dev);
    drop(fs);
    let replayed = open_fs(&disk);
    expect_content(&replayed, "f", Some(&want)).expect("the last write");
    assert_eq!(mtime(&replayed), now, "fsync logged the new mtime");
    drop(replayed);
    common::assert_posix_clean_in_place(disk);
}
