//! Compressed extents below the mount: they take less space and read back
//! exactly (whole, in random 4 KiB pieces, after reopening), the property
//! and its inheritance choose the codec, files that do not compress stop
//! being tried, reflinks and snapshots share compressed extents, and a
//! hostile image (a lying decoded length, a corrupt payload, an unknown
//! codec) gives EIO for that file alone.

mod common;

use canopy::compress::{Codec, Policy, PROPERTY};
use canopy::dev::{Device, MemDevice};
use canopy::format::items::{FileExtentItem, COMPRESS_NONE};
use canopy::format::{key_type, tree_id, Key, CSUM_OBJECTID};
use canopy::fs::Fs;
use canopy::{Engine, OpenOptions};
use common::paths::{file, read_all, ME};
use std::sync::Arc;

const ROOT: u64 = 256;
const ZSTD: Policy = Policy {
    codec: Some(Codec::Zstd(3)),
    force: false,
};

fn fresh() -> (Arc<MemDevice>, Fs) {
    let (dev, e) = common::mem_engine(256 << 20, 4096);
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

/// Lines of text: compresses about 10:1.
fn text(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!("line {i}: the quick brown fox {}\n", i * 7919 % 1000).as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// Bytes on disk per kind for `node`.
fn disk_of(fs: &Fs, node: u64, kind: &str) -> u64 {
    let r = fs.compsize(node).expect("compsize");
    r.kinds
        .iter()
        .filter(|k| k.kind == kind)
        .map(|k| k.disk)
        .sum()
}

#[test]
fn compressed_files_are_smaller_and_read_back_exactly() {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let data = text(3 << 20);
    let f = file(&fs, ROOT, "t", &data);
    fs.sync().expect("sync");
    let a = fs.getattr(f).expect("getattr");
    assert!(
        a.blocks * 512 < data.len() as u64 / 4,
        "st_blocks counts bytes on disk: {}",
        a.blocks
    );
    assert!(disk_of(&fs, f, "zstd") > 0);
    assert_eq!(disk_of(&fs, f, "none"), 0);
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, f), data);
    let mut rng = common::Rng(7);
    for _ in 0..200 {
        let off = rng.below(data.len() as u64 - 4096);
        let got = fs.read(f, off, 4096).expect("read");
        assert_eq!(got, &data[off as usize..off as usize + 4096], "at {off}");
    }
    // Overwrite the middle, punch a hole, truncate: slices of compressed
    // extents keep reading right.
    let mut model = data.clone();
    fs.write(f, 200_000, &[b'x'; 5000]).expect("write");
    model[200_000..205_000].fill(b'x');
    fs.fallocate(
        f,
        400_000,
        300_000,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .expect("punch");
    model[400_000..700_000].fill(0);
    fs.setattr(
        f,
        &canopy::fs::SetAttr {
            size: Some(2_000_001),
            ..Default::default()
        },
    )
    .expect("truncate");
    model.truncate(2_000_001);
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, f), model);
}

#[test]
fn lz4_and_levels_round_trip() {
    for codec in [Codec::Lz4, Codec::Zstd(1), Codec::Zstd(15)] {
        let (dev, fs) = fresh();
        fs.set_compression(Policy {
            codec: Some(codec),
            force: false,
        });
        let data = text(1 << 20);
        let f = file(&fs, ROOT, "t", &data);
        let fs = common::reopen(&dev, fs);
        let kind = if codec == Codec::Lz4 { "lz4" } else { "zstd" };
        assert!(disk_of(&fs, f, kind) > 0, "{codec:?}");
        assert_eq!(read_all(&fs, f), data, "{codec:?}");
    }
}

#[test]
fn the_property_chooses_and_is_inherited() {
    let (dev, fs) = fresh();
    let d = mkdir(&fs, ROOT, b"d");
    fs.setxattr(d, PROPERTY, b"lz4", 0).expect("set property");
    assert_eq!(
        fs.setxattr(d, PROPERTY, b"zlib", 0).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        fs.setxattr(d, PROPERTY, b"zstd:99", 0).unwrap_err().errno(),
        libc::EINVAL
    );
    let sub = mkdir(&fs, d, b"sub");
    assert_eq!(fs.getxattr(sub, PROPERTY).expect("inherited"), b"lz4");
    let f = file(&fs, sub, "f", &text(1 << 20));
    // "none" on a file wins over the mount's compress=zstd.
    fs.set_compression(ZSTD);
    let plain = file(&fs, ROOT, "plain", b"");
    fs.setxattr(plain, PROPERTY, b"none", 0).expect("none");
    fs.write(plain, 0, &text(1 << 20)).expect("write");
    let fs = common::reopen(&dev, fs);
    assert!(disk_of(&fs, f, "lz4") > 0);
    assert_eq!(disk_of(&fs, f, "zstd"), 0);
    assert_eq!(disk_of(&fs, plain, "zstd"), 0);
    assert!(disk_of(&fs, plain, "none") >= 1 << 20);
    // The empty value unsets it.
    fs.setxattr(d, PROPERTY, b"", 0).expect("unset");
    assert_eq!(fs.getxattr(d, PROPERTY).unwrap_err().errno(), libc::ENODATA);
}

#[test]
fn a_file_that_does_not_compress_stops_being_tried_unless_forced() {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let f = file(&fs, ROOT, "n", &common::noise(1 << 20, 3));
    fs.sync().expect("sync");
    fs.write(f, 1 << 20, &text(1 << 20)).expect("write");
    fs.sync().expect("sync");
    assert_eq!(disk_of(&fs, f, "zstd"), 0, "given up after the noise");
    fs.set_compression(Policy {
        force: true,
        ..ZSTD
    });
    fs.write(f, 2 << 20, &text(1 << 20)).expect("write");
    let fs = common::reopen(&dev, fs);
    assert!(disk_of(&fs, f, "zstd") > 0, "compress-force tries again");
    let mut want = common::noise(1 << 20, 3);
    want.extend(text(1 << 20));
    want.extend(text(1 << 20));
    assert_eq!(read_all(&fs, f), want);
}

#[test]
fn reflinks_and_snapshots_share_compressed_extents() {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let data = text(2 << 20);
    let f = file(&fs, ROOT, "a", &data);
    let g = file(&fs, ROOT, "b", b"");
    fs.sync().expect("sync");
    let n = fs
        .copy_range(f, 0, g, 0, data.len() as u64)
        .expect("reflink");
    assert_eq!(n, data.len() as u64);
    fs.snapshot(ROOT_NODE(&fs), ROOT, b"snap", true)
        .expect("snapshot");
    fs.write(f, 100_000, b"changed").expect("write");
    let report = fs.compsize(fs.root_node()).expect("compsize");
    let zstd = report
        .kinds
        .iter()
        .find(|k| k.kind == "zstd")
        .expect("zstd row");
    assert!(zstd.referenced >= 3 * data.len() as u64, "{report:?}");
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, g), data);
    let mut changed = data.clone();
    changed[100_000..100_007].copy_from_slice(b"changed");
    assert_eq!(read_all(&fs, f), changed);
}

#[allow(non_snake_case)]
fn ROOT_NODE(fs: &Fs) -> u64 {
    fs.root_node()
}

fn mkdir(fs: &Fs, parent: u64, name: &[u8]) -> u64 {
    fs.create(parent, name, libc::S_IFDIR | 0o755, 0, ME, None)
        .expect("mkdir")
        .ino
}

/// The first compressed extent item of `ino` in the top subvolume.
fn first_compressed(fs: &Fs, ino: u64) -> (Key, FileExtentItem) {
    fs.engine()
        .read(|r| {
            let from = Key::new(ino, key_type::EXTENT_DATA, 0);
            let to = Key::new(ino, key_type::EXTENT_DATA + 1, 0);
            for (k, d) in r.range(tree_id::FS, &from, &to)? {
                let fe = FileExtentItem::decode(&d).expect("item");
                if fe.compression != COMPRESS_NONE {
                    return Ok((k, fe));
                }
            }
            panic!("no compressed extent");
        })
        .expect("read")
}

/// Two compressed files; `damage` changes the first's first compressed
/// extent (its item, or its bytes with checksums to match). Reading it
/// is EIO; the other file reads as written.
fn hostile(damage: impl Fn(&Fs, &Arc<MemDevice>, Key, FileExtentItem)) {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let victim = file(&fs, ROOT, "victim", &text(1 << 20));
    let data = text(1 << 19);
    let other = file(&fs, ROOT, "other", &data);
    fs.sync().expect("sync");
    let inode = fs.getattr(victim).expect("attr").ino;
    let (k, fe) = first_compressed(&fs, inode);
    damage(&fs, &dev, k, fe);
    let fs = {
        fs.sync().expect("sync");
        drop(fs);
        let e =
            Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
        Fs::new(Arc::new(e)).expect("fs")
    };
    let err = fs.read(victim, 0, 1 << 20).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert_eq!(read_all(&fs, other), data);
}

fn put_item(fs: &Fs, k: Key, fe: &FileExtentItem) {
    fs.engine()
        .write(|tx| tx.put(tree_id::FS, k, fe.encode()).map(|_| ()))
        .expect("put");
}

#[test]
fn a_decompression_bomb_is_eio() {
    hostile(|fs, _, k, mut fe| {
        fe.ram_bytes = 1 << 40;
        put_item(fs, k, &fe);
    });
}

#[test]
fn a_short_declared_length_is_eio() {
    hostile(|fs, _, k, mut fe| {
        fe.ram_bytes /= 2;
        fe.num_bytes = fe.ram_bytes;
        put_item(fs, k, &fe);
    });
}

#[test]
fn an_unknown_codec_is_eio() {
    hostile(|fs, _, k, mut fe| {
        fe.compression = 9;
        put_item(fs, k, &fe);
    });
}

#[test]
fn a_corrupt_payload_under_good_checksums_is_eio() {
    hostile(|fs, dev, _, fe| {
        let mut frame = vec![0u8; fe.disk_num_bytes as usize];
        dev.read_at(&mut frame, fe.disk_bytenr).expect("read");
        let half = frame.len() / 2;
        for b in &mut frame[16..half] {
            *b ^= 0xa5;
        }
        dev.write_at(&frame, fe.disk_bytenr).expect("write");
        let sums: Vec<u8> = frame
            .chunks(4096)
            .flat_map(|s| canopy::format::crc(s).to_le_bytes())
            .collect();
        let key = Key::new(CSUM_OBJECTID, key_type::EXTENT_CSUM, fe.disk_bytenr);
        fs.engine()
            .write(|tx| tx.put(tree_id::CSUM, key, sums).map(|_| ()))
            .expect("sums");
    });
}

#[test]
fn a_truncated_payload_is_eio() {
    hostile(|fs, _, k, mut fe| {
        // The item says the frame is one sector long: the payload's
        // declared length runs past it (or its end is cut off).
        fe.disk_num_bytes = 4096;
        put_item(fs, k, &fe);
    });
}

/// A flipped byte in a compressed extent: scrub finds the sector, and
/// names every file byte the extent decodes to as damaged (they are lost
/// together); reading them is EIO, the rest of the file reads.
#[test]
fn scrub_maps_a_bad_compressed_sector_to_the_whole_extent() {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let data = text(1 << 20);
    let f = file(&fs, ROOT, "t", &data);
    fs.sync().expect("sync");
    let inode = fs.getattr(f).expect("attr").ino;
    let (k, fe) = first_compressed(&fs, inode);
    let mut byte = [0u8; 1];
    dev.read_at(&mut byte, fe.disk_bytenr + 100).expect("read");
    byte[0] ^= 0xff;
    dev.write_at(&byte, fe.disk_bytenr + 100).expect("write");
    let ctl = canopy::scrub::Control::default();
    let report = canopy::scrub::run(fs.engine(), &ctl, canopy::scrub::Pace { throttle: false })
        .expect("scrub");
    assert_eq!(report.bad_data_sectors, vec![fe.disk_bytenr]);
    let damaged = &report.damaged_files;
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    let whole = (k.offset, k.offset + fe.num_bytes);
    assert_eq!(damaged[0].ranges, vec![whole]);
    assert_eq!(fs.read(f, k.offset, 4096).unwrap_err().errno(), libc::EIO);
    let past = whole.1 as usize;
    assert_eq!(
        fs.read(f, whole.1, 4096).expect("the next extent"),
        &data[past..past + 4096]
    );
}

/// The extent items of `ino` in the top subvolume.
fn items_of(fs: &Fs, ino: u64) -> Vec<FileExtentItem> {
    fs.engine()
        .read(|r| {
            let from = Key::new(ino, key_type::EXTENT_DATA, 0);
            let to = Key::new(ino, key_type::EXTENT_DATA + 1, 0);
            let items = r.range(tree_id::FS, &from, &to)?;
            Ok(items
                .iter()
                .map(|(_, d)| FileExtentItem::decode(d).expect("item"))
                .collect())
        })
        .expect("read")
}

fn set_size(fs: &Fs, f: u64, size: u64) {
    let s = canopy::fs::SetAttr {
        size: Some(size),
        ..Default::default()
    };
    fs.setattr(f, &s).expect("truncate");
}

/// Files of up to a sector whose frame fits the inline limit are stored
/// inline compressed (btrfs's rule); larger ones and ones that do not
/// shrink are not. They read back, count their stored bytes, and keep
/// reading right through a rewrite, a truncate, growth into extents and
/// a mount without compression.
#[test]
fn small_files_are_compressed_inline() {
    use canopy::format::items::{COMPRESS_LZ4, COMPRESS_ZSTD, FILE_EXTENT_INLINE};
    use canopy::format::superblock::INCOMPAT_COMPRESSED_INLINE;
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let sizes = [1500usize, 2048, 2049, 3000, 4096, 4097];
    let files: Vec<(u64, Vec<u8>)> = sizes
        .iter()
        .map(|&n| (file(&fs, ROOT, &format!("t{n}"), &text(n)), text(n)))
        .collect();
    let noisy = common::noise(3000, 5);
    let plain = file(&fs, ROOT, "noise", &noisy);
    let before = canopy::txn::read_best_superblock(dev.as_ref()).expect("sb");
    assert_eq!(before.incompat & INCOMPAT_COMPRESSED_INLINE, 0);
    let fs = common::reopen(&dev, fs);
    let after = canopy::txn::read_best_superblock(dev.as_ref()).expect("sb");
    assert_ne!(
        after.incompat & INCOMPAT_COMPRESSED_INLINE,
        0,
        "older code refuses it"
    );
    for (f, data) in &files {
        assert_eq!(&read_all(&fs, *f), data, "{} bytes", data.len());
        let items = items_of(&fs, fs.getattr(*f).expect("attr").ino);
        let inline = items[0].kind == FILE_EXTENT_INLINE;
        assert_eq!(inline, data.len() <= 4096, "{} bytes", data.len());
        if inline {
            assert_eq!(items[0].compression, COMPRESS_ZSTD);
            assert!(items[0].inline_data.len() < data.len() / 2);
            let blocks = fs.getattr(*f).expect("attr").blocks;
            assert!(blocks * 512 < data.len() as u64, "{blocks} blocks");
        }
    }
    let noise_items = items_of(&fs, fs.getattr(plain).expect("attr").ino);
    assert_eq!(noise_items[0].compression, COMPRESS_NONE);
    assert!(disk_of(&fs, files[3].0, "zstd") > 0, "compsize counts it");

    // Rewrites, a truncate, and growth past a sector.
    let (f, mut model) = files[3].clone();
    fs.write(f, 100, b"rewritten").expect("write");
    model[100..109].copy_from_slice(b"rewritten");
    set_size(&fs, f, 2500);
    model.truncate(2500);
    assert_eq!(read_all(&fs, f), model);
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, f), model);
    let tail = text(6000);
    fs.write(f, 2500, &tail).expect("grow");
    model.extend_from_slice(&tail);
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, f), model);
    assert!(items_of(&fs, fs.getattr(f).expect("attr").ino)
        .iter()
        .all(|fe| fe.kind != FILE_EXTENT_INLINE));

    // Without compression, a compressed inline file reads and is
    // rewritten plain; with lz4 it is compressed again.
    fs.set_compression(Policy::default());
    let (g, mut gm) = files[1].clone();
    fs.write(g, 0, b"plain now").expect("write");
    gm[..9].copy_from_slice(b"plain now");
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, g), gm);
    let gi = fs.getattr(g).expect("attr").ino;
    assert_eq!(items_of(&fs, gi)[0].compression, COMPRESS_NONE);
    fs.set_compression(Policy {
        codec: Some(Codec::Lz4),
        force: false,
    });
    fs.write(g, 10, b"lz4").expect("write");
    gm[10..13].copy_from_slice(b"lz4");
    let fs = common::reopen(&dev, fs);
    assert_eq!(read_all(&fs, g), gm);
    assert_eq!(items_of(&fs, gi)[0].compression, COMPRESS_LZ4);
}

/// A small compressed file, and another; `damage` changes the first's
/// inline item. Reading it is EIO; the other reads as written.
fn hostile_inline(damage: impl Fn(&mut FileExtentItem)) {
    let (dev, fs) = fresh();
    fs.set_compression(ZSTD);
    let victim = file(&fs, ROOT, "victim", &text(3000));
    let other = file(&fs, ROOT, "other", &text(3500));
    fs.sync().expect("sync");
    let ino = fs.getattr(victim).expect("attr").ino;
    let k = Key::new(ino, key_type::EXTENT_DATA, 0);
    let mut fe = items_of(&fs, ino).remove(0);
    assert_ne!(fe.compression, COMPRESS_NONE);
    damage(&mut fe);
    put_item(&fs, k, &fe);
    fs.sync().expect("sync");
    drop(fs);
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let err = fs.read(victim, 0, 3000).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert_eq!(read_all(&fs, other), text(3500));
}

#[test]
fn a_lying_inline_frame_is_eio() {
    hostile_inline(|fe| fe.ram_bytes = 1 << 40);
    hostile_inline(|fe| fe.ram_bytes = 4096);
    hostile_inline(|fe| fe.ram_bytes = 100);
    hostile_inline(|fe| fe.compression = 9);
    hostile_inline(|fe| fe.inline_data.truncate(fe.inline_data.len() / 2));
    hostile_inline(|fe| {
        for b in &mut fe.inline_data[8..] {
            *b ^= 0x5a;
        }
    });
}
