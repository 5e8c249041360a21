//! Realistic images for the hostile-image fuzzer, and the raw access to
//! their tree blocks that structure-aware mutations need: which blocks
//! are live (reached from the superblock, its fsync log included), which
//! tree each belongs to and which pointer leads to it, and how to fix a
//! block's checksum after its bytes were changed.

use canopy::dev::{Device, MemDevice};
use canopy::format::items::RootItem;
use canopy::format::key_type::ROOT_ITEM;
use canopy::format::node::{Body, Node};
use canopy::format::tree_id;
use canopy::fs::{Fs, Owner};
use canopy::{Engine, FormatOptions, OpenOptions};
use std::collections::HashSet;
use std::sync::Arc;

pub const IMAGE_SIZE: u64 = 32 << 20;
pub const NODESIZE: u32 = 4096;
pub const ME: Owner = Owner { uid: 0, gid: 0 };
/// A fixed filesystem id, so the same calls build the same image.
pub const FSID: [u8; 16] = [0x5a; 16];

/// Header field offsets of a tree block (`format::node`).
pub const OFF_BYTENR: usize = 48;
pub const OFF_GENERATION: usize = 56;
pub const OFF_OWNER: usize = 64;
pub const OFF_FLAGS: usize = 72;
pub const OFF_NRITEMS: usize = 80;
pub const OFF_LEVEL: usize = 84;
pub const HEADER_SIZE: usize = canopy::format::node::HEADER_SIZE;
pub const ITEM_HEADER_SIZE: usize = canopy::format::node::ITEM_HEADER_SIZE;
pub const PTR_SIZE: usize = canopy::format::node::PTR_SIZE;
pub const KEY_SIZE: usize = canopy::format::key::KEY_SIZE;

/// A new filesystem on an image of `IMAGE_SIZE` with 4 KiB nodes.
pub fn fresh_fs() -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    let opts = FormatOptions {
        nodesize: NODESIZE,
        fsid: Some(FSID),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, Fs::new(Arc::new(e)).expect("fs"))
}

pub fn mk(fs: &Fs, parent: u64, name: &str, mode: u32, target: Option<&[u8]>) -> u64 {
    fs.create(parent, name.as_bytes(), mode, 0, ME, target)
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
        .ino
}

/// Lines of text: compresses well.
fn text(len: usize, seed: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut n = seed;
    while out.len() < len {
        out.extend_from_slice(format!("line {n}: the quick brown fox jumps\n").as_bytes());
        n += 1;
    }
    out.truncate(len);
    out
}

/// Files of every shape in `dir`: inline, one extent, many extents, a
/// sparse file, empty; symlinks short and long, a fifo, xattrs.
pub fn populate(fs: &Fs, dir: u64, salt: usize) {
    for f in 0..6 {
        let ino = mk(fs, dir, &format!("file{f}"), libc::S_IFREG | 0o644, None);
        let len = [10, 2000, 5000, 70_000, 300_000, 0][f];
        let data: Vec<u8> = (0..len).map(|b| (b * 31 + salt * 7 + f) as u8).collect();
        fs.write(ino, 0, &data).expect("write");
        if f == 3 {
            fs.write(ino, 1 << 20, b"past a hole")
                .expect("sparse write");
        }
        fs.setxattr(ino, b"user.tag", format!("{salt}/{f}").as_bytes(), 0)
            .expect("xattr");
    }
    mk(fs, dir, "short-link", libc::S_IFLNK | 0o777, Some(b"file1"));
    mk(
        fs,
        dir,
        "long-link",
        libc::S_IFLNK | 0o777,
        Some(&[b'x'; 3000]),
    );
    mk(fs, dir, "fifo", libc::S_IFIFO | 0o600, None);
}

/// Under the root directory: `dirs` directories, a chain `depth` deep
/// below the first, every one of them (root included) `populate`d, and
/// one file with `aliases` extra names spread over them (extended
/// back-references once a directory holds many).
pub fn populated_tree(fs: &Fs, dirs: usize, depth: usize, aliases: usize) {
    let root = 256;
    let mut all = vec![root];
    for d in 0..dirs {
        all.push(mk(
            fs,
            root,
            &format!("dir{d}"),
            libc::S_IFDIR | 0o755,
            None,
        ));
    }
    let mut deep = all[1];
    for d in 0..depth {
        deep = mk(fs, deep, &format!("level{d}"), libc::S_IFDIR | 0o700, None);
    }
    for (i, &dir) in all.iter().enumerate() {
        populate(fs, dir, i);
    }
    let many = mk(fs, root, "many-names", libc::S_IFREG | 0o600, None);
    for n in 0..aliases {
        let name = format!("alias-with-a-fairly-long-name-number-{n:04}");
        fs.link(many, all[n % all.len()], name.as_bytes())
            .expect("link");
    }
}

/// What a realistic image holds: directories (one deep chain), inline,
/// multi-extent and sparse files, hard links (one inode with many names,
/// for extended back-references), symlinks, xattrs, a fifo; a directory
/// with the compression property (zstd, and an lz4 file in it), whose
/// files are compressed inline and as extents; a subvolume with files and
/// a compressed one, a read-only snapshot of it, and changes to the
/// subvolume after the snapshot (so the two share some blocks, not all).
pub fn rich_image() -> Vec<u8> {
    let (dev, fs) = fresh_fs();
    let root = 256;
    populated_tree(&fs, 3, 6, 60);
    // Compressed files: the property on a directory, inherited.
    let zdir = mk(&fs, root, "zdir", libc::S_IFDIR | 0o755, None);
    fs.setxattr(zdir, canopy::compress::PROPERTY, b"zstd", 0)
        .expect("compression property");
    for (n, len) in [1500usize, 3000, 100_000, 400_000].into_iter().enumerate() {
        let f = mk(&fs, zdir, &format!("z{n}"), libc::S_IFREG | 0o644, None);
        fs.write(f, 0, &text(len, n)).expect("write");
    }
    let l = mk(&fs, zdir, "lz4-file", libc::S_IFREG | 0o644, None);
    fs.setxattr(l, canopy::compress::PROPERTY, b"lz4", 0)
        .expect("lz4 property");
    fs.write(l, 0, &text(150_000, 9)).expect("write");
    // A subvolume, filled, snapshotted, then changed.
    let vol = fs
        .create_subvolume(root, b"vol", ME)
        .expect("subvolume")
        .ino;
    let vdir = mk(&fs, vol, "sub", libc::S_IFDIR | 0o755, None);
    populate(&fs, vol, 7);
    populate(&fs, vdir, 8);
    let vz = mk(&fs, vol, "compressed", libc::S_IFREG | 0o644, None);
    fs.setxattr(vz, canopy::compress::PROPERTY, b"zstd", 0)
        .expect("property");
    fs.write(vz, 0, &text(200_000, 3)).expect("write");
    fs.sync().expect("sync");
    fs.snapshot(vol, root, b"vol-snap", true).expect("snapshot");
    fs.sync().expect("sync");
    let f = fs.lookup(vol, b"file3").expect("vol/file3").ino;
    fs.write(f, 4096, &[0x33; 9000])
        .expect("write after snapshot");
    fs.remove(vol, b"file0", false)
        .expect("remove after snapshot");
    mk(&fs, vdir, "after-snapshot", libc::S_IFREG | 0o644, None);
    fs.sync().expect("sync");
    drop(fs);
    dev.snapshot()
}

/// The attributes at `path` from the top.
pub fn resolve(fs: &Fs, path: &str) -> canopy::Result<canopy::fs::Attr> {
    let mut at = fs.getattr(256)?;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = fs.lookup(at.ino, part.as_bytes())?;
    }
    Ok(at)
}

/// `img` opened read-only; a pending log replays in memory if `replay`.
pub fn read_only(img: &[u8], replay: bool) -> Fs {
    let opts = OpenOptions {
        read_only: true,
        replay_log: replay,
        ..OpenOptions::default()
    };
    let dev = Arc::new(MemDevice::from_bytes(img.to_vec()));
    let e = Engine::open(dev as Arc<dyn Device>, &opts).expect("open");
    Fs::new(Arc::new(e)).expect("fs")
}

/// The content of `path`, None if it does not resolve.
pub fn content_of(fs: &Fs, path: &str) -> Option<Vec<u8>> {
    let a = resolve(fs, path).ok()?;
    Some(fs.read(a.ino, 0, a.size as u32).expect("read"))
}

/// Every name under the top, counted; each file read (its first MiB),
/// each symlink read.
pub fn walk_all(fs: &Fs) -> (usize, Vec<String>) {
    let mut queue = vec![(256u64, String::new())];
    let (mut files, mut errors) = (0, vec![]);
    while let Some((dir, path)) = queue.pop() {
        let listing = match fs.readdir(dir, 0, usize::MAX) {
            Ok(l) => l,
            Err(e) => {
                errors.push(format!("{path}: {e}"));
                continue;
            }
        };
        for (_, _, _, name) in listing.into_iter().filter(|e| e.3 != b"." && e.3 != b"..") {
            let p = format!("{path}/{}", String::from_utf8_lossy(&name));
            match fs.lookup(dir, &name) {
                Ok(a) if a.mode & libc::S_IFMT == libc::S_IFDIR => queue.push((a.ino, p)),
                Ok(a) if a.mode & libc::S_IFMT == libc::S_IFREG => {
                    files += 1;
                    if let Err(e) = fs.read(a.ino, 0, a.size.min(1 << 20) as u32) {
                        errors.push(format!("{p}: {e}"));
                    }
                }
                Ok(a) if a.mode & libc::S_IFMT == libc::S_IFLNK => {
                    files += 1;
                    if let Err(e) = fs.readlink(a.ino) {
                        errors.push(format!("{p}: {e}"));
                    }
                }
                Ok(_) => files += 1,
                Err(e) => errors.push(format!("{p}: {e}")),
            }
        }
    }
    (files, errors)
}

/// An image with a damaged pending log, `file` of a corpus: it replays
/// but for the damaged inode, whose path `kept` reads as the last commit
/// has it, while `replayed` gets its fsynced state; everything reads,
/// and the image is clean after a sync.
pub fn assert_log_replays(file: &str, img: &[u8], kept: &str, replayed: &str) {
    let last_commit = read_only(img, false);
    let dev = Arc::new(MemDevice::from_bytes(img.to_vec()));
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).unwrap_or_else(|e| panic!("{file}: replay failed: {e}"));
    assert_eq!(
        content_of(&fs, kept),
        content_of(&last_commit, kept),
        "{file}: {kept} must keep its committed state"
    );
    let now = content_of(&fs, replayed);
    assert!(now.is_some(), "{file}: {replayed} is gone");
    assert_ne!(
        now,
        content_of(&last_commit, replayed),
        "{file}: {replayed} not replayed"
    );
    let (files, errors) = walk_all(&fs);
    assert!(
        files > 100 && errors.is_empty(),
        "{file}: {files} files, {errors:?}"
    );
    fs.sync().expect("sync");
    drop(fs);
    super::assert_fs_clean(&dev);
}

/// `rich_image` as a crash left it after a run of fsyncs: a file
/// rewritten, a new directory with a new file, a file renamed, a hard
/// link added, an xattr set, a compressed file written, a file in the
/// subvolume rewritten, a name removed (fsync of its directory). The
/// fsync log is pending.
pub fn rich_with_log(base: &[u8]) -> Vec<u8> {
    let dev = Arc::new(MemDevice::from_bytes(base.to_vec()));
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).expect("open");
    let fs = Fs::new(Arc::new(e)).expect("fs");
    let at = |p: &str| resolve(&fs, p).unwrap_or_else(|e| panic!("{p}: {e}")).ino;
    let f = at("dir0/file1");
    fs.write(f, 0, &[0x5a; 3000]).expect("write");
    fs.fsync(f).expect("fsync");
    let d = mk(&fs, 256, "logged-dir", libc::S_IFDIR | 0o755, None);
    let n = mk(&fs, d, "fsynced", libc::S_IFREG | 0o644, None);
    fs.write(n, 0, &[0x6b; 6000]).expect("write");
    fs.fsync(n).expect("fsync");
    let dir1 = at("dir1");
    fs.rename(dir1, b"file2", dir1, b"file2-renamed", false, false)
        .expect("rename");
    let r = at("dir1/file2-renamed");
    fs.fsync(r).expect("fsync");
    let h = at("dir2/file0");
    fs.link(h, d, b"hard-link").expect("link");
    fs.setxattr(h, b"user.logged", b"value", 0).expect("xattr");
    fs.fsync(h).expect("fsync");
    let z = at("zdir/z1");
    fs.write(z, 0, &text(20_000, 77)).expect("write");
    fs.fsync(z).expect("fsync");
    let v = at("vol/file1");
    fs.write(v, 100, &[0x7c; 5000]).expect("write");
    fs.fsync(v).expect("fsync");
    let dir2 = at("dir2");
    fs.remove(dir2, b"file4", false).expect("remove");
    fs.fsync(dir2).expect("fsync dir");
    let crashed = dev.snapshot();
    drop(fs);
    crashed
}

/// One live tree block.
#[derive(Clone, Debug)]
pub struct Block {
    pub addr: u64,
    /// The tree it was reached as (`tree_id::LOG` for the pending log).
    pub tree: u64,
    pub level: u8,
    /// The internal node and slot pointing at it (none for a root).
    pub parent: Option<(u64, usize)>,
}

impl Block {
    pub fn is_log(&self) -> bool {
        self.tree == tree_id::LOG
    }

    /// A leaf of a file tree (the top level, a subvolume, the log).
    pub fn is_file_leaf(&self) -> bool {
        self.level == 0
            && (self.tree == tree_id::FS || tree_id::is_subvolume(self.tree) || self.is_log())
    }
}

pub fn superblock(img: &[u8]) -> canopy::format::superblock::Superblock {
    canopy::txn::read_best_superblock(&MemDevice::from_bytes(img.to_vec())).expect("superblock")
}

/// Every tree block reached from the superblock: the root tree, every
/// tree its root items name, and the pending fsync log (its last root and
/// the previous one, which replay falls back to). A block shared
/// by a subvolume and its snapshot is listed once.
pub fn live_blocks(img: &[u8]) -> Vec<Block> {
    let sb = superblock(img);
    let ns = NODESIZE as usize;
    let mut out = vec![];
    let mut seen = HashSet::new();
    let mut queue = vec![(sb.root, tree_id::ROOT, None)];
    // The log's last root, and the one before it (replay's fallback).
    let logs = super::log_roots(&MemDevice::from_bytes(img.to_vec()));
    for &log in logs.iter().rev().take(2) {
        queue.push((log, tree_id::LOG, None));
    }
    while let Some((addr, tree, parent)) = queue.pop() {
        let at = addr as usize;
        if !seen.insert(addr) || at + ns > img.len() {
            continue;
        }
        let Ok(node) = Node::decode(&img[at..at + ns], addr, &sb.fsid) else {
            continue;
        };
        match &node.body {
            Body::Internal(ptrs) => {
                for (slot, p) in ptrs.iter().enumerate() {
                    queue.push((p.bytenr, tree, Some((addr, slot))));
                }
            }
            Body::Leaf(items) if tree == tree_id::ROOT => {
                for it in items.iter().filter(|i| i.key.ty == ROOT_ITEM) {
                    if let Ok(r) = RootItem::decode(it.data) {
                        queue.push((r.bytenr, it.key.objectid, None));
                    }
                }
            }
            Body::Leaf(_) => {}
        }
        out.push(Block {
            addr,
            tree,
            level: node.level,
            parent,
        });
    }
    out.sort_by_key(|b| b.addr);
    out
}

/// Recomputes the checksum of the block at `addr` after a raw change.
pub fn reseal(img: &mut [u8], addr: u64) {
    let (at, ns) = (addr as usize, NODESIZE as usize);
    let sum = crc32c::crc32c(&img[at + 32..at + ns]);
    img[at..at + 4].copy_from_slice(&sum.to_le_bytes());
}

pub fn get_u64(img: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(img[at..at + 8].try_into().expect("8 bytes"))
}

pub fn get_u32(img: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(img[at..at + 4].try_into().expect("4 bytes"))
}

pub fn set_u64(img: &mut [u8], at: usize, v: u64) {
    img[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn set_u32(img: &mut [u8], at: usize, v: u32) {
    img[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The decoded block at `addr`, if it decodes.
pub fn node_at(img: &[u8], addr: u64) -> Option<Node> {
    let (at, ns) = (addr as usize, NODESIZE as usize);
    Node::decode(img.get(at..at + ns)?, addr, &FSID).ok()
}

/// Writes `node` back at its address with a valid checksum; false if it
/// no longer fits in a block.
pub fn store(img: &mut [u8], node: &Node) -> bool {
    let ns = NODESIZE as usize;
    if node.used_bytes() > ns {
        return false;
    }
    let at = node.bytenr as usize;
    img[at..at + ns].copy_from_slice(&node.encode(&FSID, ns));
    true
}
