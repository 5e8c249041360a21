//! The POSIX layer without a mount: files against byte vectors, directory
//! operations against a map, commit/reopen, and `check` after each commit.

mod common;

use canopy::fs::{Fs, Owner, SetAttr};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };

#[derive(Clone, Debug)]
enum FileOp {
    Write {
        off: u32,
        len: u16,
        byte: u8,
    },
    Truncate {
        size: u32,
    },
    Fallocate {
        off: u32,
        len: u32,
        mode: u8,
    },
    /// copy_file_range from the other file (or the same one) into this one.
    Copy {
        from_other: bool,
        src: u32,
        dst: u32,
        len: u32,
        aligned: bool,
    },
    Swap,
    /// Flush buffered data and commit, without reopening.
    Sync,
    Reopen,
}

fn file_op() -> impl Strategy<Value = FileOp> {
    prop_oneof![
        6 => (0u32..300_000, 1u16..20_000, any::<u8>()).prop_map(|(off, len, byte)| FileOp::Write { off, len, byte }),
        3 => (0u32..3000, 1u16..3000, any::<u8>()).prop_map(|(off, len, byte)| FileOp::Write { off, len, byte }),
        2 => (0u32..300_000).prop_map(|size| FileOp::Truncate { size }),
        2 => (0u32..300_000, 1u32..100_000, 0u8..4).prop_map(|(off, len, mode)| FileOp::Fallocate { off, len, mode }),
        2 => (any::<bool>(), 0u32..300_000, 0u32..300_000, 1u32..200_000, any::<bool>())
            .prop_map(|(from_other, src, dst, len, aligned)| FileOp::Copy { from_other, src, dst, len, aligned }),
        1 => Just(FileOp::Swap),
        1 => Just(FileOp::Sync),
        1 => Just(FileOp::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn file_contents_match_a_byte_vector(ops in proptest::collection::vec(file_op(), 1..40)) {
        let (dev, e) = common::mem_engine(256 << 20, 4096);
        let mut fs = Fs::new(Arc::new(e)).unwrap();
        // Half the cases buffer little, so writers flush as they go.
        let dirty_limit = if ops.len() % 2 == 0 { 16 << 10 } else { 64 << 20 };
        fs.set_dirty_limit(dirty_limit);
        // A third of the cases plain, the rest compressed (lz4, zstd,
        // zstd forced): overwrites, truncates, punches and copies then
        // cut compressed extents.
        let policy = compression_for(ops.len());
        fs.set_compression(policy);
        let mut f = fs.create(ROOT, b"f", libc::S_IFREG | 0o644, 0, ME, None).unwrap().ino;
        let mut g = fs.create(ROOT, b"g", libc::S_IFREG | 0o644, 0, ME, None).unwrap().ino;
        let mut model: Vec<u8> = Vec::new();
        let mut other: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                FileOp::Swap => {
                    std::mem::swap(&mut f, &mut g);
                    std::mem::swap(&mut model, &mut other);
                }
                FileOp::Fallocate { off, len, mode } => {
                    let (off, len) = (u64::from(off), u64::from(len));
                    let flags = match mode {
                        0 => 0,
                        1 => libc::FALLOC_FL_KEEP_SIZE,
                        2 => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        _ => libc::FALLOC_FL_ZERO_RANGE,
                    };
                    fs.fallocate(f, off, len, flags).unwrap();
                    let end = (off + len) as usize;
                    if mode >= 2 {
                        let stop = if mode == 2 { end.min(model.len()) } else { end };
                        if model.len() < stop { model.resize(stop, 0); }
                        if (off as usize) < stop { model[off as usize..stop].fill(0); }
                    } else if mode == 0 && model.len() < end {
                        model.resize(end, 0);
                    }
                }
                FileOp::Copy { from_other, src, dst, len, aligned } => {
                    let (mut src, mut dst, mut len) = (u64::from(src), u64::from(dst), u64::from(len));
                    if aligned { src &= !4095; dst &= !4095; len = (len + 4095) & !4095; }
                    let (sf, sm) = if from_other { (g, other.clone()) } else { (f, model.clone()) };
                    let n = fs.copy_range(sf, src, f, dst, len).unwrap();
                    let avail = (sm.len() as u64).saturating_sub(src).min(len);
                    prop_assert!(n <= avail && (n == avail || n >= 1 << 20), "copied {} of {}", n, avail);
                    if n > 0 {
                        let bytes = sm[src as usize..(src + n) as usize].to_vec();
                        let end = (dst + n) as usize;
                        if model.len() < end { model.resize(end, 0); }
                        model[dst as usize..end].copy_from_slice(&bytes);
                    }
                }
                FileOp::Write { off, len, byte } => {
                    let data = pattern(byte, len as usize);
                    fs.write(f, u64::from(off), &data).unwrap();
                    let end = off as usize + len as usize;
                    if model.len() < end { model.resize(end, 0); }
                    model[off as usize..end].copy_from_slice(&data);
                }
                FileOp::Truncate { size } => {
                    fs.setattr(f, &SetAttr { size: Some(u64::from(size)), ..Default::default() }).unwrap();
                    model.resize(size as usize, 0);
                }
                FileOp::Sync => {
                    fs.sync().unwrap();
                    prop_assert_eq!(fs.dirty_bytes(), 0);
                }
                FileOp::Reopen => {
                    fs = common::reopen(&dev, fs);
                    fs.set_dirty_limit(dirty_limit);
                    fs.set_compression(policy);
                }
            }
            // One write (a byte copy up to 200 KB here) may pass the limit.
            prop_assert!(fs.dirty_bytes() <= dirty_limit + (256 << 10), "buffer past its limit");
            let attr = fs.getattr(f).unwrap();
            prop_assert_eq!(attr.size, model.len() as u64);
            let got = fs.read(f, 0, model.len() as u32 + 10).unwrap();
            prop_assert!(got == model, "contents differ at size {}", model.len());
            check_seek(&fs, f, &model);
            let got = fs.read(g, 0, other.len() as u32 + 10).unwrap();
            prop_assert!(got == other, "other file differs");
        }
        let fs = common::reopen(&dev, fs);
        prop_assert!(fs.read(f, 0, model.len() as u32).unwrap() == model);
    }
}

fn errno<T: std::fmt::Debug>(r: canopy::Result<T>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn directories_and_errors() {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let mut fs = Fs::new(Arc::new(e)).unwrap();
    let d = mkdir(&fs, ROOT, b"d");
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
    let mut names = BTreeMap::new();
    for i in 0..500u32 {
        let n = format!("file-{i}");
        let a = fs
            .create(d, n.as_bytes(), libc::S_IFREG | 0o600, 0, ME, None)
            .unwrap();
        names.insert(n, a.ino);
    }
    assert_eq!(
        errno(fs.create(d, b"file-7", libc::S_IFREG, 0, ME, None)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.create(d, &[b'x'; 256], libc::S_IFREG, 0, ME, None)),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(fs.lookup(d, b"nope")), libc::ENOENT);
    assert_eq!(errno(fs.remove(ROOT, b"d", true)), libc::ENOTEMPTY);
    assert_eq!(errno(fs.remove(ROOT, b"d", false)), libc::EISDIR);
    assert_eq!(errno(fs.remove(d, b"file-1", true)), libc::ENOTDIR);
    // readdir with stable offsets while entries are removed mid-way.
    let first = fs.readdir(d, 0, 100).unwrap();
    assert_eq!(first[0].3, b".");
    assert_eq!(first[1].3, b"..");
    assert_eq!((first[0].1, first[1].1), (d, ROOT), "'.' and '..' inodes");
    let resume = first.last().unwrap().0;
    for i in 0..50u32 {
        fs.remove(d, format!("file-{i}").as_bytes(), false).unwrap();
        names.remove(&format!("file-{i}"));
    }
    let mut seen: Vec<Vec<u8>> = first.iter().skip(2).map(|e| e.3.clone()).collect();
    let mut off = resume;
    loop {
        let more = fs.readdir(d, off, 100).unwrap();
        let Some(last) = more.last() else { break };
        off = last.0;
        seen.extend(more.into_iter().map(|e| e.3));
    }
    assert_eq!(seen.len(), 500, "every entry seen exactly once");
    // rename: over a file, noreplace, exchange, into another directory.
    fs.rename(d, b"file-60", d, b"file-61", false, false)
        .unwrap();
    assert_eq!(fs.lookup(d, b"file-61").unwrap().ino, names["file-60"]);
    assert_eq!(
        errno(fs.rename(d, b"file-61", d, b"file-62", true, false)),
        libc::EEXIST
    );
    fs.rename(d, b"file-61", d, b"file-62", false, true)
        .unwrap();
    assert_eq!(fs.lookup(d, b"file-62").unwrap().ino, names["file-60"]);
    assert_eq!(fs.lookup(d, b"file-61").unwrap().ino, names["file-62"]);
    let d2 = mkdir(&fs, ROOT, b"d2");
    assert_eq!(
        errno(fs.rename(ROOT, b"d", d, b"x", false, false)),
        libc::EINVAL
    );
    fs.rename(ROOT, b"d2", d, b"sub", false, false).unwrap();
    assert_eq!(
        fs.readdir(d2, 0, 2).unwrap()[1].1,
        d,
        "'..' follows a rename"
    );
    let d3 = mkdir(&fs, d2, b"d3");
    assert_eq!(
        errno(fs.rename(ROOT, b"d", d3, b"loop", false, false)),
        libc::EINVAL,
        "a directory cannot move below itself"
    );
    fs.remove(d2, b"d3", true).unwrap();
    assert_eq!(fs.getattr(d).unwrap().nlink, 3);
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
    // links and symlinks
    let f = names["file-100"];
    fs.link(f, ROOT, b"hard").unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    fs.remove(d, b"file-100", false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    let s = fs
        .create(
            ROOT,
            b"sym",
            libc::S_IFLNK | 0o777,
            0,
            ME,
            Some(b"d/file-200"),
        )
        .unwrap();
    assert_eq!(fs.readlink(s.ino).unwrap(), b"d/file-200");
    fs = common::reopen(&dev, fs);
    assert_eq!(fs.lookup(d, b"sub").unwrap().ino, d2);
    assert_eq!(fs.lookup(ROOT, b"hard").unwrap().ino, f);
    // Deleting everything frees the space again.
    fs.remove(ROOT, b"hard", false).unwrap();
    let _ = common::reopen(&dev, fs);
}

/// The compression a case runs with, by its length.
fn compression_for(n: usize) -> canopy::compress::Policy {
    use canopy::compress::{Codec, Policy};
    match n % 4 {
        0 => Policy::default(),
        1 => Policy {
            codec: Some(Codec::Lz4),
            force: false,
        },
        2 => Policy {
            codec: Some(Codec::Zstd(3)),
            force: false,
        },
        _ => Policy {
            codec: Some(Codec::Zstd(1)),
            force: true,
        },
    }
}

/// Bytes a write puts: one byte repeated (compresses), or for a third of
/// the bytes noise seeded by it (does not).
fn pattern(byte: u8, len: usize) -> Vec<u8> {
    if !byte.is_multiple_of(3) {
        return vec![byte; len];
    }
    common::noise(len, u64::from(byte) | 0x9e37_79b9_0000_0000)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

/// A full disk: writes fail with ENOSPC, nothing is lost, the image stays
/// clean, and deleting files makes room again.
#[test]
fn full_disk_gives_enospc_and_recovers() {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).unwrap();
    let chunk = vec![0xc3u8; 1 << 20];
    let mut files = Vec::new();
    let mut full = false;
    'outer: for i in 0..200u32 {
        let f = match fs.create(
            ROOT,
            format!("f{i}").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            ME,
            None,
        ) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC);
                full = true;
                break;
            }
        };
        files.push(f);
        for j in 0..4u64 {
            if let Err(e) = fs.write(f, j << 20, &chunk) {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                full = true;
                break 'outer;
            }
        }
        if i % 8 == 0 {
            fs.sync().unwrap();
        }
    }
    assert!(full, "the disk never filled");
    fs.sync().unwrap();
    common::assert_posix_clean_in_place(dev.clone());
    // Everything written before is intact.
    let first = fs.read(files[0], 0, 4 << 20).unwrap();
    assert!(first.iter().all(|&b| b == 0xc3) && first.len() == 4 << 20);
    for i in 0..files.len() / 2 {
        fs.remove(ROOT, format!("f{i}").as_bytes(), false).unwrap();
    }
    fs.sync().unwrap();
    fs.sync().unwrap();
    let f = fs
        .create(ROOT, b"again", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    fs.write(f, 0, &chunk).unwrap();
    let _ = common::reopen(&dev, fs);
}

/// SEEK_DATA/SEEK_HOLE agree with the contents: what they skip reads as
/// zeros, and they stay within the file.
fn check_seek(fs: &Fs, f: u64, model: &[u8]) {
    let size = model.len() as u64;
    for o in [0, size / 3, size / 2, size.saturating_sub(1), size] {
        match fs.seek(f, o, true) {
            Ok(d) => {
                assert!(d >= o && d < size, "SEEK_DATA {o} -> {d} (size {size})");
                assert!(
                    model[o as usize..d as usize].iter().all(|&b| b == 0),
                    "SEEK_DATA skipped data"
                );
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::ENXIO);
                assert!(
                    model[o.min(size) as usize..].iter().all(|&b| b == 0),
                    "ENXIO with data after {o}"
                );
            }
        }
        match fs.seek(f, o, false) {
            Ok(h) => {
                assert!(h >= o && h <= size, "SEEK_HOLE {o} -> {h} (size {size})");
                if h < size {
                    assert_eq!(model[h as usize], 0, "hole at {h} holds data");
                }
            }
            Err(e) => assert!(e.errno() == libc::ENXIO && o >= size),
        }
    }
}

#[test]
fn seek_data_and_hole_find_extents() {
    let (_dev, e) = common::mem_engine(128 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).unwrap();
    let f = fs
        .create(ROOT, b"sparse", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    const M: u64 = 1 << 20;
    fs.write(f, 0, &vec![1; M as usize]).unwrap();
    fs.write(f, 10 * M, &vec![2; M as usize]).unwrap();
    fs.setattr(
        f,
        &SetAttr {
            size: Some(20 * M),
            ..Default::default()
        },
    )
    .unwrap();
    let data = |o| fs.seek(f, o, true).map_err(|e| e.errno());
    let hole = |o| fs.seek(f, o, false).map_err(|e| e.errno());
    assert_eq!(data(0), Ok(0));
    assert_eq!(hole(0), Ok(M));
    assert_eq!(data(M), Ok(10 * M));
    assert_eq!(data(5 * M), Ok(10 * M));
    assert_eq!(hole(10 * M + 5), Ok(11 * M));
    assert_eq!(data(11 * M), Err(libc::ENXIO));
    assert_eq!(hole(15 * M), Ok(15 * M));
    assert_eq!(hole(20 * M), Err(libc::ENXIO));
}

#[test]
fn xattrs_set_get_list_remove() {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let mut fs = Fs::new(Arc::new(e)).unwrap();
    let f = fs
        .create(ROOT, b"x", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    use canopy::fs::xattr::{XATTR_CREATE, XATTR_REPLACE};
    fs.setxattr(f, b"user.a", b"1", 0).unwrap();
    fs.setxattr(f, b"trusted.b", &[7; 1000], 0).unwrap();
    // An ACL is checked (and sets the mode; see tests/mount_posix.rs).
    assert_eq!(
        errno(fs.setxattr(f, b"system.posix_acl_access", b"acl", 0)),
        libc::EINVAL
    );
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [(1u16, 6u16, u32::MAX), (2, 4, 1000), (4, 4, u32::MAX)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    for (tag, perm) in [(0x10u16, 4u16), (0x20, 4)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    fs.setxattr(f, b"system.posix_acl_access", &acl, 0).unwrap();
    assert_eq!(fs.getxattr(f, b"system.posix_acl_access").unwrap(), acl);
    assert_eq!(
        errno(fs.setxattr(f, b"user.a", b"2", XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.setxattr(f, b"user.zz", b"2", XATTR_REPLACE)),
        libc::ENODATA
    );
    assert_eq!(errno(fs.setxattr(f, b"bogus.a", b"2", 0)), libc::EOPNOTSUPP);
    assert_eq!(
        errno(fs.setxattr(f, b"user.big", &[0; 8000], 0)),
        libc::E2BIG
    );
    fs.setxattr(f, b"user.a", b"22", XATTR_REPLACE).unwrap();
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"22");
    assert_eq!(errno(fs.getxattr(f, b"user.none")), libc::ENODATA);
    fs = common::reopen(&dev, fs);
    let mut names: Vec<Vec<u8>> = fs
        .listxattr(f)
        .unwrap()
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| n.to_vec())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            b"system.posix_acl_access".to_vec(),
            b"trusted.b".to_vec(),
            b"user.a".to_vec()
        ]
    );
    fs.removexattr(f, b"trusted.b").unwrap();
    assert_eq!(errno(fs.removexattr(f, b"trusted.b")), libc::ENODATA);
    // Deleting the file deletes its xattrs too (check finds no leftovers
    // by reopening cleanly; the tree walk would flag nothing, so look).
    fs.remove(ROOT, b"x", false).unwrap();
    let left = fs
        .engine()
        .read(|r| {
            r.range(
                5,
                &canopy::Key::new(f, 0, 0),
                &canopy::Key::new(f + 1, 0, 0),
            )
        })
        .unwrap();
    assert!(left.is_empty());
    let _ = common::reopen(&dev, fs);
}

/// `check` notices a name whose back-reference is missing.
#[test]
fn check_finds_a_missing_back_reference() {
    let (dev, fs, f) = fs_with_file();
    fs.sync().unwrap();
    common::assert_fs_clean(&dev);
    let key = canopy::Key::new(f, canopy::format::key_type::INODE_REF, ROOT);
    fs.engine()
        .write(|tx| tx.delete(canopy::format::tree_id::FS, &key).map(|_| ()))
        .unwrap();
    fs.sync().unwrap();
    drop(fs);
    let copy = Arc::new(canopy::dev::MemDevice::from_bytes(dev.snapshot()));
    let r = canopy::check::check_all(copy, &|_, _| {}).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| format!("{p:?}").contains("without a back-reference")),
        "{:?}",
        r.problems
    );
}

/// Reads and readdir update atime by the mount's policy (relatime by
/// default).
#[test]
fn reads_update_atime_by_policy() {
    let (_dev, fs, f) = fs_with_file();
    fs.write(f, 0, b"hello").unwrap();
    let old = canopy::format::inode::Timespec { sec: 1000, nsec: 5 };
    let set_old = |ino| {
        fs.setattr(
            ino,
            &SetAttr {
                atime: Some(old),
                ..Default::default()
            },
        )
        .unwrap()
    };
    set_old(f);
    fs.read(f, 0, 5).unwrap();
    let first = fs.getattr(f).unwrap().atime;
    assert!(
        first.sec > old.sec,
        "relatime: a read after a change updates atime"
    );
    fs.read(f, 0, 5).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, first, "relatime: not again");

    set_old(ROOT);
    fs.readdir(ROOT, 0, 10).unwrap();
    assert!(fs.getattr(ROOT).unwrap().atime.sec > old.sec, "readdir too");

    fs.set_atime_policy(canopy::fs::AtimePolicy::Never);
    set_old(f);
    fs.read(f, 0, 5).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, old, "noatime");

    fs.set_atime_policy(canopy::fs::AtimePolicy::Strict);
    fs.read(f, 0, 5).unwrap();
    let a = fs.getattr(f).unwrap().atime;
    assert!(a.sec > old.sec);
    std::thread::sleep(std::time::Duration::from_millis(5));
    fs.read(f, 0, 5).unwrap();
    assert_ne!(fs.getattr(f).unwrap().atime, a, "strictatime: every read");
}

/// statfs counts written data as used at once, before it is flushed.
#[test]
fn statfs_counts_buffered_data() {
    let (_dev, fs, f) = fs_with_file();
    let canopy::fs::StatFs {
        blocks: total,
        free,
        ..
    } = fs.statfs();
    fs.write(f, 0, &vec![7u8; 1 << 20]).unwrap();
    assert!(fs.dirty_bytes() > 0, "the write is buffered");
    let canopy::fs::StatFs {
        blocks: total2,
        free: free2,
        ..
    } = fs.statfs();
    assert_eq!(total, total2);
    assert!(free - free2 >= 256, "free blocks {free} -> {free2}");
    fs.sync().unwrap();
    let free3 = fs.statfs().free;
    // (Within a few blocks: the commit also frees and allocates metadata.)
    assert!(
        free - free3 >= 250,
        "still used after the flush: {free} -> {free3}"
    );
}

/// A fresh 64 MiB filesystem with one empty file "f".
fn fs_with_file() -> (Arc<canopy::dev::MemDevice>, Fs, u64) {
    let (dev, e) = common::mem_engine(64 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).unwrap();
    let f = fs
        .create(ROOT, b"f", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    (dev, fs, f)
}

/// Creates directory `name` in `parent`; returns its inode number.
fn mkdir(fs: &Fs, parent: u64, name: &[u8]) -> u64 {
    fs.create(parent, name, libc::S_IFDIR | 0o755, 0, ME, None)
        .unwrap()
        .ino
}

/// One inode with hundreds of long names in one directory: the names
/// overflow the INODE_REF item into INODE_EXTREF items, and every name can
/// be looked up, renamed and removed, leaving a clean image.
#[test]
fn many_names_of_one_inode_in_one_directory() {
    let (dev, mut fs, f) = fs_with_file();
    let name = |i: u32| format!("{i:04}{}", "x".repeat(196)).into_bytes();
    for i in 0..600 {
        fs.link(f, ROOT, &name(i)).unwrap();
    }
    assert_eq!(fs.getattr(f).unwrap().nlink, 601);
    fs = common::reopen(&dev, fs);
    let sub = mkdir(&fs, ROOT, b"sub");
    for i in (0..600).step_by(3) {
        fs.rename(ROOT, &name(i), sub, &name(i), false, false)
            .unwrap();
    }
    for i in (1..600).step_by(3) {
        fs.remove(ROOT, &name(i), false).unwrap();
    }
    fs = common::reopen(&dev, fs);
    for i in 0..600 {
        let (dir, present) = match i % 3 {
            0 => (sub, true),
            1 => (ROOT, false),
            _ => (ROOT, true),
        };
        match fs.lookup(dir, &name(i)) {
            Ok(a) => assert!(present && a.ino == f, "name {i}"),
            Err(e) => assert!(!present && e.errno() == libc::ENOENT, "name {i}: {e}"),
        }
    }
    assert_eq!(fs.getattr(f).unwrap().nlink, 401);
    for i in 0..600 {
        let dir = if i % 3 == 0 { sub } else { ROOT };
        if i % 3 != 1 {
            fs.remove(dir, &name(i), false).unwrap();
        }
    }
    fs.remove(ROOT, b"f", false).unwrap();
    let _ = common::reopen(&dev, fs);
}

/// Names whose hashes collide share one DIR_ITEM; when it is full, create,
/// link and rename fail with EOVERFLOW and change nothing.
#[test]
fn a_full_hash_bucket_fails_cleanly() {
    let (dev, mut fs, f) = fs_with_file();
    let target = canopy::format::crc(b"the bucket");
    let mut colliding = (0u32..)
        .filter_map(|i| forge_crc32c(format!("{i:03}{}", "y".repeat(190)).as_bytes(), target));
    let mut made = Vec::new();
    let err = loop {
        let n = colliding.next().expect("names");
        match fs.create(ROOT, &n, libc::S_IFREG | 0o644, 0, ME, None) {
            Ok(_) => made.push(n),
            Err(e) => break (e, n),
        };
        assert!(
            made.len() < 1000,
            "a 4 KiB node cannot hold 1000 such names"
        );
    };
    assert_eq!(err.0.errno(), libc::EOVERFLOW, "{}", err.0);
    assert!(made.len() > 3, "only {} names fitted", made.len());
    let next = err.1;
    assert_eq!(errno(fs.link(f, ROOT, &next)), libc::EOVERFLOW);
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    assert_eq!(
        errno(fs.rename(ROOT, b"f", ROOT, &next, false, false)),
        libc::EOVERFLOW
    );
    assert_eq!(fs.lookup(ROOT, b"f").unwrap().ino, f);
    assert_eq!(errno(fs.lookup(ROOT, &next)), libc::ENOENT);
    fs = common::reopen(&dev, fs);
    for n in &made {
        fs.lookup(ROOT, n).unwrap();
    }
    // Making room in the bucket lets the name in.
    fs.remove(ROOT, &made[0], false).unwrap();
    fs.rename(ROOT, b"f", ROOT, &next, false, false).unwrap();
    let _ = common::reopen(&dev, fs);
}

/// `prefix` followed by four bytes chosen so that the crc32c of the whole
/// is `target`, or None when those bytes would not make a valid file name.
/// The crc of the appended bytes is affine in their 32 bits, so the bytes
/// come from solving a 32x32 linear system over GF(2).
fn forge_crc32c(prefix: &[u8], target: u32) -> Option<Vec<u8>> {
    let crc_with = |x: u32| {
        let mut v = prefix.to_vec();
        v.extend_from_slice(&x.to_le_bytes());
        canopy::format::crc(&v)
    };
    let base = crc_with(0);
    // Row i: the bit pattern of x (low 32 bits) that flips crc bit i,
    // solved by Gauss-Jordan elimination on columns (crc change, x bit).
    let mut cols: Vec<(u32, u32)> = (0..32).map(|b| (crc_with(1 << b) ^ base, 1 << b)).collect();
    let mut x = 0u32;
    let mut want = target ^ base;
    for bit in 0..32 {
        let pivot = (bit..32).find(|&c| cols[c].0 >> bit & 1 == 1)?;
        cols.swap(bit, pivot);
        let (pc, px) = cols[bit];
        for (c, col) in cols.iter_mut().enumerate() {
            if c != bit && col.0 >> bit & 1 == 1 {
                col.0 ^= pc;
                col.1 ^= px;
            }
        }
    }
    for (bit, (c, px)) in cols.iter().enumerate() {
        debug_assert_eq!(*c, 1 << bit);
        if want >> bit & 1 == 1 {
            x ^= px;
            want ^= c;
        }
    }
    let bytes = x.to_le_bytes();
    if bytes.contains(&0) || bytes.contains(&b'/') {
        return None;
    }
    let mut name = prefix.to_vec();
    name.extend_from_slice(&bytes);
    (canopy::format::crc(&name) == target).then_some(name)
}

/// Looking up "." (what the kernel asks to open a file handle whose inode
/// it dropped) answers a linked inode, and not one whose last name is gone:
/// neither a deleted inode the daemon keeps until the kernel's FORGET
/// arrives nor an unlinked one still open. Those handles are stale.
#[test]
fn dot_lookup_answers_only_linked_inodes() {
    let (_dev, fs, f) = fs_with_file();
    assert_eq!(fs.lookup(f, b".").expect("linked").ino, f);
    let g = fs
        .create(ROOT, b"g", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    fs.open(g);
    fs.remove(ROOT, b"g", false).unwrap();
    assert_eq!(fs.getattr(g).expect("open orphan").nlink, 0);
    assert_eq!(errno(fs.lookup(g, b".")), libc::ENOENT, "open orphan");
    fs.release(g).unwrap();
    assert!(fs.getattr(g).is_ok(), "kept until FORGET");
    assert_eq!(
        errno(fs.lookup(g, b".")),
        libc::ENOENT,
        "deleted, not forgotten"
    );
}

/// A truncate that cuts more extents than one step frees, and the unlink
/// of such a file, go in steps: the head reads as written, the image
/// checks clean after each, and the space comes back.
#[test]
fn truncates_and_unlinks_of_many_extents_go_in_steps() {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    let fs = Fs::new(Arc::new(e)).unwrap();
    let f = fs
        .create(ROOT, b"f", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino;
    let mut model = Vec::new();
    for i in 0..1500u64 {
        let page = vec![(i % 251) as u8 + 1; 4096];
        fs.write(f, i * 8192, &page).unwrap();
        model.resize((i * 8192) as usize, 0);
        model.extend_from_slice(&page);
    }
    let fs = common::reopen(&dev, fs);
    let free = fs.statfs().free;
    for size in [8_000_001u64, 1_000_000, 5000] {
        fs.setattr(
            f,
            &SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )
        .unwrap();
        model.truncate(size as usize);
        assert_eq!(fs.getattr(f).unwrap().size, size);
        assert!(
            fs.read(f, 0, size as u32 + 10).unwrap() == model,
            "at {size}"
        );
    }
    let fs = common::reopen(&dev, fs);
    assert!(fs.read(f, 0, 10_000).unwrap() == model);
    fs.remove(ROOT, b"f", false).unwrap();
    let fs = common::reopen(&dev, fs);
    assert!(fs.statfs().free > free + 1400, "space came back");
}
