//! Hostile images at the Fs layer: a filesystem with every kind of file is
//! corrupted with structure-aware mutations (decoded leaf items given
//! impossible sizes, offsets, names and modes, re-encoded with a valid
//! checksum, so the damage reaches the item checker and not just the
//! block checksum), then opened through `Fs` as the daemon would: every
//! directory walked, every file stat'ed and read, every symlink read,
//! every xattr listed, then written to.
//!
//! Any panic, abort, hang or allocation sized by the disk fails the test:
//! the watchdog fails it after [`HANG_SECS`], and the allocator
//! (`common::guard`) aborts the process on any single allocation over
//! 256 MiB.
//!
//! `structure_aware_fuzz` runs for `CANOPY_FUZZ_SECS` seconds (a few by
//! default; docs/testing.md describes the CPU-hour run). `corpus` replays
//! the images kept in `tests/images/` against their expected verdicts.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::format::key_type::*;
use canopy::format::node::{Body, Node};
use canopy::fs::{Fs, SetAttr};
use canopy::{Engine, Error, OpenOptions};
use common::images::{
    assert_log_replays, fresh_fs, populated_tree, read_only, resolve, IMAGE_SIZE, ME, NODESIZE,
};
use common::Rng;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANG_SECS: u64 = 120;

#[global_allocator]
static GUARD: common::guard::Guard = common::guard::Guard;

/// A filesystem holding every kind of thing the fs layer decodes: inline
/// and extent files, a sparse file, short and long symlinks, hard links
/// (one with many names, for extended back-references), xattrs, special
/// files and a deep directory chain.
fn sample_image() -> Vec<u8> {
    let (dev, fs) = fresh_fs();
    populated_tree(&fs, 4, 12, 200);
    fs.sync().expect("sync");
    drop(fs);
    dev.snapshot()
}

/// Every tree block in the image that decodes (live or stale) and
/// belongs to the fs tree, by address.
fn fs_leaves(img: &[u8], fsid: &[u8; 16]) -> Vec<u64> {
    let ns = NODESIZE as usize;
    (0..img.len() / ns)
        .filter_map(|i| {
            let at = (i * ns) as u64;
            let n = Node::decode(&img[i * ns..(i + 1) * ns], at, fsid).ok()?;
            (n.owner == canopy::format::tree_id::FS && n.is_leaf()).then_some(at)
        })
        .collect()
}

/// Values that break assumptions: boundaries, the device size, huge.
fn interesting(rng: &mut Rng) -> u64 {
    const V: [u64; 12] = [
        0,
        1,
        4095,
        4096,
        u32::MAX as u64,
        1 << 61,
        i64::MAX as u64,
        u64::MAX,
        u64::MAX - 4095,
        IMAGE_SIZE,
        IMAGE_SIZE - 4096,
        256,
    ];
    match rng.below(3) {
        0 => rng.next(),
        _ => V[rng.below(V.len() as u64) as usize],
    }
}

/// One structure-aware change to one item of a leaf.
fn mutate_leaf(node: &mut Node, rng: &mut Rng) {
    let Body::Leaf(leaf) = &mut node.body else {
        return;
    };
    let mut items = leaf.edit();
    if items.is_empty() {
        return;
    }
    let at = rng.below(items.len() as u64) as usize;
    let it = &mut items[at];
    match rng.below(7) {
        // A field of the payload (every layout is runs of u64/u32/u16).
        0..=2 if !it.data.is_empty() => {
            let width = [8usize, 4, 2][rng.below(3) as usize].min(it.data.len());
            let off = rng.below((it.data.len() - width + 1) as u64) as usize;
            let v = interesting(rng).to_le_bytes();
            it.data[off..off + width].copy_from_slice(&v[..width]);
        }
        3 if !it.data.is_empty() => {
            let off = rng.below(it.data.len() as u64) as usize;
            it.data[off] ^= 1 << rng.below(8);
        }
        4 => {
            let len = rng.below(it.data.len() as u64 + 40) as usize;
            it.data.resize(len, 0xa5);
        }
        5 => it.key.offset = interesting(rng),
        _ => {
            it.key.objectid = interesting(rng);
            it.key.ty =
                [INODE_ITEM, INODE_REF, DIR_ITEM, DIR_INDEX, EXTENT_DATA][rng.below(5) as usize];
        }
    }
    // Keep the leaf well formed so the damage reaches the item checker.
    items.sort_by_key(|i| i.key);
    items.dedup_by_key(|i| i.key);
}

/// A copy of `img` with 1..=3 structure-aware changes to fs leaves, each
/// leaf re-encoded with a valid checksum.
fn mutate(img: &[u8], leaves: &[u64], fsid: &[u8; 16], rng: &mut Rng) -> Vec<u8> {
    let mut bad = img.to_vec();
    let ns = NODESIZE as usize;
    for _ in 0..1 + rng.below(3) {
        let at = leaves[rng.below(leaves.len() as u64) as usize] as usize;
        let Ok(mut node) = Node::decode(&bad[at..at + ns], at as u64, fsid) else {
            continue;
        };
        mutate_leaf(&mut node, rng);
        if node.used_bytes() <= ns {
            bad[at..at + ns].copy_from_slice(&node.encode(fsid, ns));
        }
    }
    bad
}

/// What one exercise saw: operations refused with EIO, and whether the
/// filesystem would open at all.
#[derive(Debug, Default)]
struct Outcome {
    opened: bool,
    eio: usize,
    files: usize,
}

fn note(out: &mut Outcome, r: Result<impl Sized, Error>) {
    if let Err(e) = r {
        if e.errno() == libc::EIO {
            out.eio += 1;
        }
    }
}

/// Everything the daemon would do with the image. Errors are all fine;
/// only panics, aborts, hangs and huge allocations are failures.
fn exercise(img: Vec<u8>) -> Outcome {
    let mut out = Outcome::default();
    let dev = Arc::new(MemDevice::from_bytes(img));
    let Ok(engine) = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()) else {
        return out;
    };
    let Ok(fs) = Fs::new(Arc::new(engine)) else {
        return out;
    };
    out.opened = true;
    let dirs = walk(&fs, &mut out);
    // Then change things everywhere the walk reached.
    for (n, &dir) in dirs.iter().take(8).enumerate() {
        let name = format!("new{n}");
        if let Ok(a) = fs.create(dir, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None) {
            note(&mut out, fs.write(a.ino, 0, &[7u8; 9000]));
            note(
                &mut out,
                fs.rename(dir, name.as_bytes(), dirs[0], b"moved", false, false),
            );
            note(&mut out, fs.link(a.ino, dir, b"again"));
        }
        note(&mut out, fs.remove(dir, b"file1", false));
        note(&mut out, fs.remove(dir, b"short-link", false));
        note(
            &mut out,
            fs.rename(dir, b"file2", dir, b"file2-renamed", false, true),
        );
        if let Ok(a) = fs.lookup(dir, b"file3") {
            let shrink = SetAttr {
                size: Some(3000),
                ..Default::default()
            };
            note(&mut out, fs.setattr(a.ino, &shrink));
            note(&mut out, fs.fallocate(a.ino, 0, 1 << 16, 0));
            note(&mut out, fs.removexattr(a.ino, b"user.tag"));
        }
    }
    // Directories into each other: a looping parent chain must be refused.
    for pair in dirs.windows(2).take(6) {
        note(
            &mut out,
            fs.rename(pair[0], b"dir1", pair[1], b"dir1", false, false),
        );
        note(&mut out, fs.remove(pair[0], b"dir2", true));
    }
    note(&mut out, fs.sync());
    drop(fs);
    let _ = canopy::check::check_all(dev as Arc<dyn Device>, &|_, _| {});
    out
}

/// Visits every directory reachable from the root (each once), stats and
/// reads everything in it. Returns the directories found.
fn walk(fs: &Fs, out: &mut Outcome) -> Vec<u64> {
    let mut dirs = vec![];
    let mut queue = vec![256u64];
    let mut seen = HashSet::new();
    while let Some(dir) = queue.pop() {
        if !seen.insert(dir) {
            continue;
        }
        dirs.push(dir);
        let mut offset = 0;
        loop {
            let page = match fs.readdir(dir, offset, 64) {
                Ok(p) => p,
                Err(e) => {
                    note(out, Err::<(), _>(e));
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            assert!(last.0 > offset, "readdir of {dir} went backwards");
            offset = last.0;
            for (_, _, _, name) in page {
                let attr = match fs.lookup(dir, &name) {
                    Ok(a) => a,
                    Err(e) => {
                        note(out, Err::<(), _>(e));
                        continue;
                    }
                };
                out.files += 1;
                visit(fs, attr, out, &mut queue);
            }
        }
    }
    dirs
}

fn visit(fs: &Fs, attr: canopy::fs::Attr, out: &mut Outcome, queue: &mut Vec<u64>) {
    note(out, fs.getattr(attr.ino));
    note(out, fs.listxattr(attr.ino));
    note(out, fs.getxattr(attr.ino, b"user.tag"));
    match attr.mode & libc::S_IFMT {
        libc::S_IFDIR => queue.push(attr.ino),
        libc::S_IFLNK => note(out, fs.readlink(attr.ino)),
        libc::S_IFREG => {
            fs.open(attr.ino);
            // Reads as the kernel sends them: bounded chunks, up to 2 MiB.
            let mut pos = 0;
            while pos < attr.size.min(2 << 20) {
                match fs.read(attr.ino, pos, 128 << 10) {
                    Ok(d) if !d.is_empty() => pos += d.len() as u64,
                    r => {
                        note(out, r);
                        break;
                    }
                }
            }
            note(out, fs.seek(attr.ino, 0, true));
            note(out, fs.seek(attr.ino, 0, false));
            note(out, fs.release(attr.ino));
        }
        _ => {}
    }
}

/// Runs `f` on its own thread and fails the test if it does not finish.
fn with_watchdog<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(HANG_SECS)) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung"),
        Err(_) => panic!("{what}: panicked"),
    }
}

#[test]
fn the_sample_image_is_clean_and_walks_without_errors() {
    let img = sample_image();
    let out = with_watchdog("clean image", move || exercise(img));
    assert!(out.opened);
    assert_eq!(out.eio, 0, "{out:?}");
    assert!(out.files > 150, "{out:?}");
}

#[test]
fn structure_aware_fuzz() {
    let secs = std::env::var("CANOPY_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let seed = std::env::var("CANOPY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d_u64);
    let img = Arc::new(sample_image());
    let fsid = canopy::txn::read_best_superblock(&MemDevice::from_bytes(img.to_vec()))
        .expect("superblock")
        .fsid;
    let leaves = Arc::new(fs_leaves(&img, &fsid));
    assert!(leaves.len() > 20, "only {} fs leaves", leaves.len());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut rounds, mut opened, mut eio) = (0u64, 0u64, 0u64);
    let mut rng = Rng(seed);
    while Instant::now() < deadline {
        let round_seed = rng.next();
        let (img, leaves) = (img.clone(), leaves.clone());
        let out = with_watchdog(&format!("fuzz round seed {round_seed:#x}"), move || {
            let bad = mutate(&img, &leaves, &fsid, &mut Rng(round_seed));
            exercise(bad)
        });
        rounds += 1;
        opened += u64::from(out.opened);
        eio += out.eio as u64;
    }
    eprintln!(
        "fuzz: {rounds} rounds in {secs} s, {opened} opened, {eio} operations refused with EIO"
    );
    assert!(rounds > 0 && opened > 0);
}

/// One image of the corpus and what must happen with it.
struct Verdict {
    file: String,
    /// A substring of a problem `canopy check` must report.
    check_says: String,
    /// A path whose access must fail with EIO (the damaged inode).
    eio_path: String,
}

fn read_verdicts(dir: &Path) -> Vec<Verdict> {
    verdict_lines(dir, &["file", "check says", "EIO path"])
        .into_iter()
        .map(|f| Verdict {
            file: f[0].clone(),
            check_says: f[1].clone(),
            eio_path: f[2].clone(),
        })
        .collect()
}

/// The lines of `dir/verdicts.txt` but comments and blank ones, each cut
/// at tabs into one field per name of `fields`.
fn verdict_lines(dir: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("verdicts.txt")).expect("verdicts.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<String> = l.split('\t').map(String::from).collect();
            assert_eq!(
                f.len(),
                fields.len(),
                "verdict line {l:?}: {}",
                fields.join(", ")
            );
            f
        })
        .collect()
}

/// Everything a user would do to the one path: any of it may fail, and
/// one of them must fail with EIO.
fn touch_path(fs: &Fs, path: &str) -> Vec<i32> {
    let Ok(a) = resolve(fs, path) else {
        return vec![resolve(fs, path).err().map_or(0, |e| e.errno())];
    };
    let errno = |r: Result<Vec<u8>, Error>| r.err().map_or(0, |e| e.errno());
    vec![
        fs.getattr(a.ino).err().map_or(0, |e| e.errno()),
        errno(fs.read(a.ino, 0, 4096)),
        errno(fs.readlink(a.ino)),
        errno(fs.listxattr(a.ino)),
        fs.readdir(a.ino, 0, 100).err().map_or(0, |e| e.errno()),
    ]
}

#[test]
fn corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images");
    let verdicts = read_verdicts(&dir);
    assert!(verdicts.len() >= 6);
    for v in verdicts {
        let packed = std::fs::read(dir.join(&v.file)).expect("corpus image");
        let img = zstd::decode_all(&packed[..]).expect("zstd");
        let dev = Arc::new(MemDevice::from_bytes(img.clone()));
        let report = canopy::check::check_all(dev, &|_, _| {}).expect("check ran");
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.message.contains(&v.check_says)),
            "{}: check should report {:?}, said {:#?}",
            v.file,
            v.check_says,
            report.problems
        );
        let path = v.eio_path.clone();
        let (file, errs) = (
            v.file.clone(),
            with_watchdog(&v.file, move || {
                let dev = Arc::new(MemDevice::from_bytes(img.clone()));
                let e =
                    Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()).expect("open");
                let fs = Fs::new(Arc::new(e)).expect("fs");
                let errs = touch_path(&fs, &path);
                // The rest of the filesystem stays usable.
                let mut out = Outcome::default();
                walk(&fs, &mut out);
                assert!(out.files > 100, "{out:?}");
                // Deleting the damaged file fails or works, but never
                // leaves the filesystem shut down half-way.
                let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
                if let Ok(parent) = resolve(&fs, dir) {
                    let _ = fs.remove(parent.ino, name.as_bytes(), false);
                    let _ = fs.remove(parent.ino, name.as_bytes(), true);
                }
                let down = fs.engine().shutdown_reason();
                assert!(down.is_none(), "{path}: {down:?}");
                drop(fs);
                exercise(img);
                errs
            }),
        );
        assert!(
            errs.contains(&libc::EIO),
            "{file}: {} should give EIO somewhere, got {errs:?}",
            v.eio_path
        );
    }
}

/// Rewrites, in every decodable copy of every fs leaf, the item `key`
/// with `change`, re-encoding the leaf with a valid checksum.
fn patch_item(img: &mut [u8], key: canopy::Key, change: &dyn Fn(&mut Vec<u8>)) {
    let fsid = canopy::txn::read_best_superblock(&MemDevice::from_bytes(img.to_vec()))
        .expect("superblock")
        .fsid;
    let mut hits = 0;
    for at in fs_leaves(img, &fsid) {
        if patch_leaf(img, at as usize, &fsid, key, change) {
            hits += 1;
        }
    }
    assert!(hits > 0, "no leaf holds {key}");
}

/// Rewrites the item `key` of the leaf at `at` with `change`, re-encoding
/// the leaf with a valid checksum; false when the block is no leaf or
/// holds no such item.
fn patch_leaf(
    img: &mut [u8],
    at: usize,
    fsid: &[u8; 16],
    key: canopy::Key,
    change: &dyn Fn(&mut Vec<u8>),
) -> bool {
    let ns = NODESIZE as usize;
    let mut node = Node::decode(&img[at..at + ns], at as u64, fsid).expect("leaf");
    let Body::Leaf(leaf) = &mut node.body else {
        return false;
    };
    let mut items = leaf.edit();
    let Some(it) = items.iter_mut().find(|i| i.key == key) else {
        return false;
    };
    change(&mut it.data);
    drop(items);
    img[at..at + ns].copy_from_slice(&node.encode(fsid, ns));
    true
}

fn put(at: usize, v: impl AsRef<[u8]>) -> impl Fn(&mut Vec<u8>) {
    let v = v.as_ref().to_vec();
    move |d: &mut Vec<u8>| d[at..at + v.len()].copy_from_slice(&v)
}

/// Writes the corpus (`cargo test --test hostile_fs make_corpus -- --ignored`).
/// Each image is the sample with one targeted corruption.
#[test]
#[ignore]
fn make_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images");
    std::fs::create_dir_all(&dir).unwrap();
    let clean = sample_image();
    let fs = read_only(&clean, true);
    let ino = |p: &str| resolve(&fs, p).unwrap().ino;
    let k = canopy::Key::new;
    let name5 = canopy::format::inode::name_hash(b"file5");
    let xhash = canopy::format::inode::name_hash(b"user.tag");
    type Case<'a> = (
        &'a str,
        canopy::Key,
        Box<dyn Fn(&mut Vec<u8>)>,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "symlink-size-2e61",
            k(ino("dir0/short-link"), INODE_ITEM, 0),
            Box::new(put(0, (1u64 << 61).to_le_bytes())),
            "symlink of",
            "dir0/short-link",
        ),
        (
            "extent-past-device",
            k(ino("dir1/file3"), EXTENT_DATA, 0),
            Box::new(put(21, (IMAGE_SIZE + (1 << 20)).to_le_bytes())),
            "outside the device",
            "dir1/file3",
        ),
        (
            "extent-offset-overflow",
            k(ino("dir2/file4"), EXTENT_DATA, 0),
            Box::new(put(37, (u64::MAX - 4095).to_le_bytes())),
            "file extent uses",
            "dir2/file4",
        ),
        (
            "inode-mode-unknown",
            k(ino("dir3/file0"), INODE_ITEM, 0),
            Box::new(put(28, 0o170644u32.to_le_bytes())),
            "no known file type",
            "dir3/file0",
        ),
        (
            "dirent-wrong-hash",
            k(ino("dir0"), DIR_ITEM, name5),
            Box::new(put(19 + 3, b"%")),
            "under the wrong hash",
            "dir0/file5",
        ),
        (
            "xattr-value-length",
            k(ino("dir1/file0"), XATTR_ITEM, xhash),
            Box::new(put(2, u32::MAX.to_le_bytes())),
            "xattr past its item",
            "dir1/file0",
        ),
        (
            "dir-nlink-one",
            k(ino("dir2"), INODE_ITEM, 0),
            Box::new(put(16, 1u32.to_le_bytes())),
            "directory with 1 link",
            "dir2",
        ),
        (
            "inline-length",
            k(ino("dir0/file0"), EXTENT_DATA, 0),
            Box::new(put(8, 99u64.to_le_bytes())),
            "inline extent of",
            "dir0/file0",
        ),
    ];
    let mut verdicts = String::from(
        "# Hostile images (zstd) and what must happen: a problem `canopy check`\n\
         # reports, and a path whose access gives EIO while the rest stays usable.\n\
         # Written by `cargo test --test hostile_fs make_corpus -- --ignored`.\n",
    );
    for (name, key, change, says, path) in cases {
        let mut img = clean.clone();
        patch_item(&mut img, key, &*change);
        let packed = zstd::encode_all(&img[..], 19).unwrap();
        std::fs::write(dir.join(format!("{name}.img.zst")), packed).unwrap();
        verdicts.push_str(&format!("{name}.img.zst\t{says}\t{path}\n"));
    }
    std::fs::write(dir.join("verdicts.txt"), verdicts).unwrap();
}

/// A directory whose highest index item is at the end of the index range
/// (found by the fuzzer): adding an entry fails with an error instead of
/// overflowing the next index.
#[test]
fn a_directory_index_at_the_end_of_its_range_fails_creates() {
    let (dev, fs) = fresh_fs();
    let dir = fs
        .create(256, b"d", libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("mkdir")
        .ino;
    fs.create(dir, b"a", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    fs.sync().expect("sync");
    drop(fs);
    let mut img = dev.snapshot();
    let fsid = canopy::txn::read_best_superblock(&MemDevice::from_bytes(img.clone()))
        .expect("superblock")
        .fsid;
    let ns = NODESIZE as usize;
    let mut hits = 0;
    for at in fs_leaves(&img, &fsid) {
        let at = at as usize;
        let mut node = Node::decode(&img[at..at + ns], at as u64, &fsid).expect("leaf");
        let Body::Leaf(leaf) = &mut node.body else {
            continue;
        };
        let index = canopy::Key::new(dir, DIR_INDEX, 2);
        let mut items = leaf.edit();
        if let Some(it) = items.iter_mut().find(|i| i.key == index) {
            it.key.offset = u64::MAX;
            drop(items);
            img[at..at + ns].copy_from_slice(&node.encode(&fsid, ns));
            hits += 1;
        }
    }
    assert!(hits > 0, "no leaf holds the entry's index");
    let r = with_watchdog("create after the last index", move || {
        let dev = Arc::new(MemDevice::from_bytes(img));
        let e = Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()).expect("open");
        let fs = Fs::new(Arc::new(e)).expect("fs");
        fs.create(dir, b"b", libc::S_IFREG | 0o644, 0, ME, None)
            .map(|a| a.ino)
            .map_err(|e| e.to_string())
    });
    assert!(r.is_err(), "{r:?}");
}

/// The sample image as a crash left it after two fsyncs: `dir0/file1`
/// rewritten, and `fsynced` created and written. Its fsync log is pending.
fn sample_with_log() -> Vec<u8> {
    let dev = Arc::new(MemDevice::from_bytes(sample_image()));
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let f = resolve(&fs, "dir0/file1").expect("dir0/file1").ino;
    fs.write(f, 0, &[0x5a; 3000]).expect("write");
    fs.fsync(f).expect("fsync");
    let n = fs
        .create(256, b"fsynced", libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create")
        .ino;
    fs.write(n, 0, &[0x6b; 6000]).expect("write");
    fs.fsync(n).expect("fsync");
    let crashed = dev.snapshot();
    drop(fs);
    crashed
}

/// Rewrites the item `key` of the pending log's root leaf with `change`,
/// re-encoding the leaf with a valid checksum.
fn patch_log_item(img: &mut [u8], key: canopy::Key, change: &dyn Fn(&mut Vec<u8>)) {
    let sb = canopy::txn::read_best_superblock(&MemDevice::from_bytes(img.to_vec()))
        .expect("superblock");
    let root = common::last_log_root(&MemDevice::from_bytes(img.to_vec()));
    assert_ne!(root, 0, "the image has a pending log");
    assert!(
        patch_leaf(img, root as usize, &sb.fsid, key, change),
        "the sample's log is one leaf, holding {key}"
    );
}

/// Images with a damaged pending log (`tests/images/log/`): check names
/// the damage, the mount replays the log but for the damaged inode,
/// which reads as the last commit has it (as `nologreplay` shows it), and
/// the image is clean after the replay.
#[test]
fn log_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images/log");
    let lines = verdict_lines(&dir, &["file", "check says", "path kept", "path replayed"]);
    assert!(lines.len() >= 3);
    for f in lines {
        let [file, says, kept, replayed] = [&f[0], &f[1], &f[2], &f[3]].map(String::as_str);
        let packed = std::fs::read(dir.join(file)).expect("corpus image");
        let img = zstd::decode_all(&packed[..]).expect("zstd");
        let report =
            canopy::check::check_all(Arc::new(MemDevice::from_bytes(img.clone())), &|_, _| {})
                .expect("check ran");
        assert!(
            report.problems.iter().any(|p| p.message.contains(says)),
            "{file}: check should report {says:?}, said {:#?}",
            report.problems
        );
        assert_log_replays(file, &img, kept, replayed);
    }
}

/// Writes the log corpus
/// (`cargo test --test hostile_fs make_log_corpus -- --ignored`).
#[test]
#[ignore]
fn make_log_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images/log");
    std::fs::create_dir_all(&dir).unwrap();
    let crashed = sample_with_log();
    let fs = read_only(&crashed, true);
    let ino = |p: &str| resolve(&fs, p).unwrap().ino;
    let (file1, fsynced) = (ino("dir0/file1"), ino("fsynced"));
    let tree_root = canopy::txn::read_best_superblock(&MemDevice::from_bytes(crashed.clone()))
        .unwrap()
        .root;
    let k = canopy::Key::new;
    type Case<'a> = (
        &'a str,
        canopy::Key,
        Box<dyn Fn(&mut Vec<u8>)>,
        &'a str,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            // The image: a logged symlink of 2^61 bytes.
            "log-symlink-size-2e61",
            k(file1, INODE_ITEM, 0),
            Box::new(|d: &mut Vec<u8>| {
                put(0, (1u64 << 61).to_le_bytes())(d);
                put(28, (libc::S_IFLNK | 0o777).to_le_bytes())(d);
            }),
            "symlink of",
            "dir0/file1",
            "fsynced",
        ),
        (
            // A logged file extent naming a committed tree block (the
            // root tree's root).
            "log-extent-at-tree-block",
            k(fsynced, EXTENT_DATA, 0),
            Box::new(move |d: &mut Vec<u8>| put(21, tree_root.to_le_bytes())(d)),
            "not a data extent of the last commit",
            "fsynced",
            "dir0/file1",
        ),
        (
            "log-mode-unknown",
            k(file1, LOG_INODE, 0),
            Box::new(put(0, [7u8])),
            "log mode is not one byte",
            "dir0/file1",
            "fsynced",
        ),
    ];
    let mut verdicts = String::from(
        "# Images with a damaged pending fsync log (zstd): a problem `canopy check`\n\
         # reports, a path that keeps its committed state, a path that replays.\n\
         # Written by `cargo test --test hostile_fs make_log_corpus -- --ignored`.\n",
    );
    for (name, key, change, says, kept, replayed) in cases {
        let mut img = crashed.clone();
        patch_log_item(&mut img, key, &*change);
        let packed = zstd::encode_all(&img[..], 19).unwrap();
        std::fs::write(dir.join(format!("{name}.img.zst")), packed).unwrap();
        verdicts.push_str(&format!("{name}.img.zst\t{says}\t{kept}\t{replayed}\n"));
    }
    std::fs::write(dir.join("verdicts.txt"), verdicts).unwrap();
}
