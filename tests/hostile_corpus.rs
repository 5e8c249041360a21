//! The hostile images issue 58 found, kept as a corpus with what must
//! happen to each (`tests/images/found/verdicts.txt`): the problem
//! `canopy check` reports, then one of
//!
//! - `eio PATH`: a mount reads everything but PATH, which gives EIO;
//! - `open-refused`: the image does not open, read-only or not (nothing
//!   is written to it);
//! - `check-only`: the mount may read all of it (the damage is one a read
//!   cannot see, as a lost write under a parent patched to match);
//! - `log KEPT REPLAYED`: the pending fsync log replays but for the
//!   damaged inode, whose path KEPT reads as the last commit has it, while
//!   REPLAYED gets its fsynced state; the image is clean afterwards.
//!
//! Every image is also mounted read-write, changed and synced: nothing
//! may panic, hang or shut the engine down on what check already named.
//!
//! `make_found_corpus` (ignored) writes the images from
//! `common::images::rich_image` and `rich_with_log`; `found_corpus`
//! replays them.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::format::inode::{name_hash, DirEntry};
use canopy::format::items::FileExtentItem;
use canopy::format::key_type::*;
use canopy::format::node::{Body, Item};
use canopy::format::{tree_id, Key, CSUM_OBJECTID};
use canopy::fs::Fs;
use canopy::{Engine, OpenOptions};
use common::images::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images/found")
}

/// Applies `f` to the items of every live leaf `which` selects, storing
/// each changed leaf with its keys in order and a valid checksum; how
/// many leaves changed.
fn edit_leaves(
    img: &mut [u8],
    which: impl Fn(&Block) -> bool,
    f: &dyn Fn(&mut Vec<Item>) -> bool,
) -> usize {
    let mut changed = 0;
    for b in live_blocks(img)
        .into_iter()
        .filter(|b| b.level == 0 && which(b))
    {
        let Some(mut node) = node_at(img, b.addr) else {
            continue;
        };
        let Body::Leaf(leaf) = &mut node.body else {
            continue;
        };
        let mut items = leaf.edit();
        if f(&mut items) {
            items.sort_by_key(|i| i.key);
            drop(items);
            assert!(store(img, &node), "leaf {} still fits", b.addr);
            changed += 1;
        }
    }
    changed
}

/// Leaves of the top-level file tree (where `entry_of` looks).
fn top(b: &Block) -> bool {
    b.tree == tree_id::FS
}

fn log(b: &Block) -> bool {
    b.is_log()
}

/// Changes the item `key` with `f` in every leaf `which` selects.
fn edit_item(
    img: &mut [u8],
    which: impl Fn(&Block) -> bool,
    key: Key,
    f: impl Fn(&mut Item),
) -> usize {
    edit_leaves(img, which, &|items| {
        let hit = items.iter_mut().filter(|i| i.key == key).map(&f).count();
        hit > 0
    })
}

fn delete_item(img: &mut [u8], which: impl Fn(&Block) -> bool, key: Key) -> usize {
    edit_leaves(img, which, &|items| {
        let before = items.len();
        items.retain(|i| i.key != key);
        items.len() != before
    })
}

/// Rewrites the entries of an item's data with `f`.
fn entries(item: &mut Item, f: impl Fn(&mut DirEntry)) {
    let mut es = DirEntry::decode_all(&item.data).expect("entries");
    es.iter_mut().for_each(f);
    item.data = DirEntry::encode_all(&es);
}

/// Inode number, parent and index of `path` in the image's last commit.
fn entry_of(img: &[u8], path: &str) -> (u64, u64, u64) {
    let fs = read_only(img, false);
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let parent = resolve(&fs, dir).expect("parent").ino;
    let ino = resolve(&fs, path).expect("path").ino;
    let index = fs
        .readdir(parent, 0, usize::MAX)
        .expect("readdir")
        .into_iter()
        .find(|e| e.3 == name.as_bytes())
        .expect("listed")
        .0
        - 1;
    (ino, parent, index)
}

/// The first file extent item of `path`.
fn first_extent(img: &[u8], path: &str) -> FileExtentItem {
    let (ino, _, _) = entry_of(img, path);
    let key = Key::new(ino, EXTENT_DATA, 0);
    live_blocks(img)
        .into_iter()
        .filter(|b| b.level == 0 && top(b))
        .filter_map(|b| node_at(img, b.addr))
        .find_map(|n| match n.body {
            Body::Leaf(items) => items
                .into_iter()
                .find(|i| i.key == key)
                .map(|i| FileExtentItem::decode(i.data).expect("extent")),
            Body::Internal(_) => None,
        })
        .expect("a first extent")
}

type Change = Box<dyn Fn(&mut Vec<u8>)>;

/// (name, with a pending log, change, what check says, outcome).
fn cases() -> Vec<(&'static str, bool, Change, &'static str, String)> {
    const PAST: u64 = (1 << 62) - 1;
    vec![
        (
            // The endless listing: an index the next offset cannot pass,
            // recorded the same in every item that holds it.
            "dir-index-2e62",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, dir, index) = entry_of(img, "dir0/file5");
                let set = |e: &mut DirEntry| {
                    if e.name == b"file5" {
                        e.index = PAST;
                    }
                };
                let k = Key::new(dir, DIR_INDEX, index);
                assert!(
                    edit_item(img, top, k, |i| {
                        i.key.offset = PAST;
                        entries(i, set);
                    }) > 0
                );
                let k = Key::new(dir, DIR_ITEM, name_hash(b"file5"));
                assert!(edit_item(img, top, k, |i| entries(i, set)) > 0);
                let k = Key::new(ino, INODE_REF, dir);
                assert!(edit_item(img, top, k, |i| entries(i, set)) > 0);
            }),
            "is past the last one",
            "eio dir0".into(),
        ),
        (
            // A write into the subvolume used to commit a second root item.
            "root-item-offset",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let vol = tree_id::FIRST_FREE;
                let k = Key::new(vol, ROOT_ITEM, 0);
                assert!(
                    edit_item(
                        img,
                        |b| b.tree == tree_id::ROOT,
                        k,
                        |i| {
                            i.key.offset = u64::MAX - 4095;
                        }
                    ) > 0
                );
            }),
            "with key offset",
            "open-refused".into(),
        ),
        (
            "entry-inode-above-range",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, dir, index) = entry_of(img, "dir1/file0");
                let far = |e: &mut DirEntry| {
                    if e.name == b"file0" {
                        e.ino = (1 << 40) + ino;
                    }
                };
                let k = Key::new(dir, DIR_INDEX, index);
                assert!(edit_item(img, top, k, |i| entries(i, far)) > 0);
                let k = Key::new(dir, DIR_ITEM, name_hash(b"file0"));
                assert!(edit_item(img, top, k, |i| entries(i, far)) > 0);
            }),
            "above 1099511627775",
            "eio dir1/file0".into(),
        ),
        (
            "file-mode-symlink",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, _, _) = entry_of(img, "dir2/file1");
                let mode = (libc::S_IFLNK | 0o777).to_le_bytes();
                let k = Key::new(ino, INODE_ITEM, 0);
                assert!(edit_item(img, top, k, |i| i.data[28..32].copy_from_slice(&mode)) > 0);
            }),
            "whose data does not match",
            "eio dir2/file1".into(),
        ),
        (
            "inline-compression-byte",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, _, _) = entry_of(img, "dir0/file0");
                let k = Key::new(ino, EXTENT_DATA, 0);
                let zstd = canopy::format::items::COMPRESS_ZSTD;
                assert!(edit_item(img, top, k, |i| i.data[16] = zstd) > 0);
            }),
            "does not decode",
            "eio dir0/file0".into(),
        ),
        (
            "data-without-checksums",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let fe = first_extent(img, "dir1/file3");
                let k = Key::new(CSUM_OBJECTID, EXTENT_CSUM, fe.disk_bytenr);
                assert!(delete_item(img, |b| b.tree == tree_id::CSUM, k) > 0);
            }),
            "without checksums",
            "eio dir1/file3".into(),
        ),
        (
            // A lost write: the block holds an older generation than its
            // allocation, and its parent was patched to agree.
            "stale-block-parent-patched",
            false,
            Box::new(|img: &mut Vec<u8>| {
                let b = live_blocks(img)
                    .into_iter()
                    .find(|b| b.tree == tree_id::FS && b.level == 0 && b.parent.is_some())
                    .expect("an fs leaf under a parent");
                let (parent, slot) = b.parent.expect("parent");
                set_u64(img, b.addr as usize + OFF_GENERATION, 1);
                reseal(img, b.addr);
                let ptr = parent as usize + HEADER_SIZE + slot * PTR_SIZE + KEY_SIZE + 8;
                set_u64(img, ptr, 1);
                reseal(img, parent);
            }),
            "older than its allocation",
            "check-only".into(),
        ),
        (
            // Replay used to strip the file of every name.
            "log-inode-ref-deleted",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, dir, _) = entry_of(img, "dir0/file1");
                assert!(delete_item(img, log, Key::new(ino, INODE_REF, dir)) > 0);
            }),
            "links but no names",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
        (
            "log-inode-item-52-bytes",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, _, _) = entry_of(img, "dir0/file1");
                let k = Key::new(ino, INODE_ITEM, 0);
                assert!(edit_item(img, log, k, |i| i.data.truncate(52)) > 0);
            }),
            "inode item of 52 bytes",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
        (
            "log-mode-deleted",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, _, _) = entry_of(img, "dir0/file1");
                assert!(delete_item(img, log, Key::new(ino, LOG_INODE, 0)) > 0);
            }),
            "without its mode or inode item",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
        (
            "log-key-type-changed",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, _, _) = entry_of(img, "dir0/file1");
                let k = Key::new(ino, XATTR_ITEM, name_hash(b"user.tag"));
                assert!(edit_item(img, log, k, |i| i.key.ty = 200) > 0);
            }),
            "a kind the log does not hold",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
        (
            "log-ref-index-2e62",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let (ino, dir, _) = entry_of(img, "dir0/file1");
                let k = Key::new(ino, INODE_REF, dir);
                assert!(edit_item(img, log, k, |i| entries(i, |e| e.index = PAST)) > 0);
            }),
            "is past the last one",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
        (
            // A file's back-reference re-keyed to a logged directory:
            // replay used to give the directory a second name.
            "log-ref-rekeyed-to-a-directory",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let fs = read_only(img, true);
                let dir = resolve(&fs, "logged-dir").expect("logged-dir").ino;
                let file = resolve(&fs, "logged-dir/hard-link").expect("hard-link").ino;
                drop(fs);
                let k = Key::new(file, INODE_REF, dir);
                assert!(edit_item(img, log, k, |i| i.key.objectid = dir) > 0);
            }),
            "directory with more than one name",
            "log logged-dir dir1/file2-renamed".into(),
        ),
        (
            "log-data-without-checksums",
            true,
            Box::new(|img: &mut Vec<u8>| {
                let fs = read_only(img, true);
                let ino = resolve(&fs, "dir0/file1").expect("file1").ino;
                drop(fs);
                let key = Key::new(ino, EXTENT_DATA, 0);
                let mut bytenr = None;
                for b in live_blocks(img).into_iter().filter(log) {
                    let Some(n) = node_at(img, b.addr) else {
                        continue;
                    };
                    if let Body::Leaf(items) = n.body {
                        for i in items.iter().filter(|i| i.key == key) {
                            bytenr = FileExtentItem::decode(i.data).ok().map(|f| f.disk_bytenr);
                        }
                    }
                }
                let at = bytenr.expect("file1's logged extent");
                let k = Key::new(CSUM_OBJECTID, EXTENT_CSUM, at);
                assert!(delete_item(img, log, k) > 0);
            }),
            "without its checksums",
            "log dir0/file1 dir1/file2-renamed".into(),
        ),
    ]
}

/// Writes the corpus
/// (`cargo test --release --test hostile_corpus make_found_corpus -- --ignored`).
#[test]
#[ignore]
fn make_found_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).expect("corpus directory");
    let plain = rich_image();
    let logged = rich_with_log(&plain);
    let mut verdicts = String::from(
        "# Hostile images issue 58 found (zstd): what `canopy check` reports,\n\
         # then what a mount must do (tests/hostile_corpus.rs says how to read it).\n\
         # Written by `cargo test --release --test hostile_corpus make_found_corpus -- --ignored`.\n",
    );
    for (name, with_log, change, says, outcome) in cases() {
        let mut img = if with_log {
            logged.clone()
        } else {
            plain.clone()
        };
        change(&mut img);
        let packed = zstd::encode_all(&img[..], 19).expect("zstd");
        std::fs::write(dir.join(format!("{name}.img.zst")), packed).expect("write image");
        verdicts.push_str(&format!("{name}.img.zst\t{says}\t{outcome}\n"));
    }
    std::fs::write(dir.join("verdicts.txt"), verdicts).expect("write verdicts");
}

/// The outcome `eio PATH`: everything reads but PATH, which gives EIO.
fn expect_eio(file: &str, img: &[u8], path: &str) {
    let fs = read_only(img, true);
    let (files, errors) = walk_all(&fs);
    assert!(files > 60, "{file}: only {files} files readable");
    assert!(!errors.is_empty(), "{file}: {path} read without an error");
    // A damaged entry may fail its directory's listing too.
    let parent = path.rsplit_once('/').map_or("", |p| p.0);
    for e in &errors {
        assert!(
            e.starts_with(&format!("/{path}")) || e.starts_with(&format!("/{parent}: ")),
            "{file}: an error away from {path}: {e}"
        );
    }
    let a = resolve(&fs, path);
    let errno = match a {
        Err(e) => e.errno(),
        Ok(a) => match a.mode & libc::S_IFMT {
            libc::S_IFDIR => fs.readdir(a.ino, 0, 100).err(),
            libc::S_IFLNK => fs.readlink(a.ino).err(),
            _ => fs.read(a.ino, 0, 4096).err(),
        }
        .map_or(0, |e| e.errno()),
    };
    assert_eq!(errno, libc::EIO, "{file}: {path}");
}

/// A read-write mount that changes things and syncs: errors are fine,
/// a panic is not, nor a shut-down engine unless `may_stop` (damage a
/// read cannot see stops the engine where a write meets it, with the
/// error: the `check-only` images).
fn write_through(file: &str, img: &[u8], may_stop: bool) {
    let dev = Arc::new(MemDevice::from_bytes(img.to_vec()));
    let Ok(e) = Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()) else {
        return;
    };
    let Ok(fs) = Fs::new(Arc::new(e)) else {
        return;
    };
    for dir in ["", "dir0", "dir1", "dir2", "vol", "vol/sub"] {
        let Ok(d) = resolve(&fs, dir) else { continue };
        let made = fs.create(d.ino, b"new", libc::S_IFREG | 0o644, 0, ME, None);
        if let Ok(a) = made {
            let _ = fs.write(a.ino, 0, &[1u8; 9000]);
        }
        let _ = fs.rename(d.ino, b"file2", d.ino, b"file2-moved", false, false);
        let _ = fs.remove(d.ino, b"file0", false);
    }
    let _ = fs.sync();
    let down = fs.engine().shutdown_reason();
    assert!(
        may_stop || down.is_none(),
        "{file}: the engine shut down: {down:?}"
    );
}

#[test]
fn found_corpus() {
    let dir = corpus_dir();
    let text = std::fs::read_to_string(dir.join("verdicts.txt")).expect("verdicts.txt");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert!(lines.len() >= 14, "{} images", lines.len());
    for line in lines {
        let f: Vec<&str> = line.split('\t').collect();
        let [file, says, outcome] = f[..] else {
            panic!("verdict line {line:?}: file, check says, outcome");
        };
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
        let words: Vec<&str> = outcome.split(' ').collect();
        match words[..] {
            ["eio", path] => expect_eio(file, &img, path),
            ["open-refused"] => {
                for read_only in [true, false] {
                    let dev = Arc::new(MemDevice::from_bytes(img.clone()));
                    let opts = OpenOptions {
                        read_only,
                        ..OpenOptions::default()
                    };
                    let r = Engine::open(dev.clone() as Arc<dyn Device>, &opts);
                    assert!(r.is_err(), "{file}: opened (read-only {read_only})");
                    assert!(dev.snapshot() == img, "{file}: a refused open wrote");
                }
            }
            ["check-only"] => {}
            ["log", kept, replayed] => assert_log_replays(file, &img, kept, replayed),
            _ => panic!("{file}: unknown outcome {outcome:?}"),
        }
        write_through(file, &img, outcome == "check-only");
    }
}

/// Flipped data sectors: `check` reads no data and calls the image
/// clean (scrub's to find, by design); `check --check-data-csum` names
/// each sector and every file it reaches, in a subvolume and in the
/// snapshot sharing the extent too.
#[test]
fn check_data_csum_finds_a_flipped_data_sector() {
    let mut img = rich_image();
    let fe = first_extent(&img, "dir1/file3");
    img[fe.disk_bytenr as usize + 5000] ^= 0x20;
    // And one the subvolume shares with its snapshot.
    let shared = {
        let fs = read_only(&img, false);
        let node = resolve(&fs, "vol/file4").expect("vol/file4").ino;
        let (tree, ino) = canopy::fs::split_node(node);
        drop(fs);
        let key = Key::new(ino, EXTENT_DATA, 0);
        live_blocks(&img)
            .into_iter()
            .filter(|b| b.level == 0 && b.tree == tree)
            .filter_map(|b| node_at(&img, b.addr))
            .find_map(|n| n.items().iter().find(|i| i.key == key).map(|i| i.to_item()))
            .map(|i| FileExtentItem::decode(&i.data).expect("extent"))
            .expect("vol/file4's first extent")
    };
    img[shared.disk_bytenr as usize + 10] ^= 0x01;
    let dev = Arc::new(MemDevice::from_bytes(img));
    let mut report = canopy::check::check_all(dev.clone(), &|_, _| {}).expect("check ran");
    assert!(report.is_clean(), "{:#?}", report.problems);
    canopy::check::check_data_sums(dev, &mut report);
    let said: Vec<String> = report
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.location, p.message))
        .collect();
    let sector = (fe.disk_bytenr + 4096).to_string();
    assert!(
        said.iter()
            .any(|p| p.contains(&sector) && p.contains("checksum mismatch")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|p| p.contains("/dir1/file3") && p.contains("4096..8192")),
        "{said:#?}"
    );
    for path in ["/vol/file4", "/vol-snap/file4"] {
        let named = said
            .iter()
            .any(|p| p.contains(path) && p.contains("0..4096"));
        assert!(named, "{path}: {said:#?}");
    }
}
