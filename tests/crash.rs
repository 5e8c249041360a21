//! Crash consistency: record every write and barrier of a workload of many
//! transactions, then rebuild the disk a crash could have left after every
//! prefix of them (and, for the writes in flight, several subsets), open it
//! and require exactly the contents of a committed generation: the last one
//! whose commit completed, or the one being committed. `check` must be
//! clean on every image.

mod common;

use common::Rng;

use canopy::dev::crash::{OverlayDevice, RecordingDevice, Replayer};
use canopy::dev::Device;
use canopy::format::items::FileExtentItem;
use canopy::format::key_type::EXTENT_DATA;
use canopy::format::tree_id::{FIRST_FREE, FS};
use canopy::{Engine, Key, OpenOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A key type the item checker does not know: engine tests store
/// arbitrary payloads under it.
const TEST_ITEM: u8 = 2;

type Trees = BTreeMap<u64, BTreeMap<Key, Vec<u8>>>;

fn data_pattern(bytenr: u64) -> u8 {
    (bytenr / 4096 % 251) as u8
}

/// One random change applied to the engine and the model.
fn random_change(e: &Engine, model: &mut Trees, rng: &mut Rng, next_tree: &mut u64) {
    let ids: Vec<u64> = model.keys().copied().collect();
    let id = ids[rng.below(ids.len() as u64) as usize];
    let k = Key::new(256 + rng.below(600), TEST_ITEM, 0);
    match rng.below(20) {
        0..=9 => {
            let v = vec![rng.below(256) as u8; rng.below(300) as usize];
            e.write(|tx| tx.put(id, k, v.clone())).unwrap();
            model.get_mut(&id).unwrap().insert(k, v);
        }
        10..=14 => {
            let had = model.get_mut(&id).unwrap().remove(&k).is_some();
            let r = e.write(|tx| tx.delete(id, &k));
            assert_eq!(r.is_ok(), had);
        }
        15..=17 => {
            let dk = Key::new(k.objectid, EXTENT_DATA, 0);
            let len = (rng.below(4) + 1) * 4096;
            let v = e
                .write(|tx| {
                    let b = tx.alloc_data(len, 0)?;
                    tx.write_data(b, &vec![data_pattern(b); len as usize])?;
                    let fe = FileExtentItem::whole(b, len, tx.transid());
                    tx.put(id, dk, fe.encode())?;
                    Ok(fe.encode())
                })
                .unwrap();
            model.get_mut(&id).unwrap().insert(dk, v);
        }
        18 if model.len() < 4 => {
            let dst = *next_tree;
            *next_tree += 1;
            e.write(|tx| tx.clone_tree(id, dst, b"snap")).unwrap();
            let copy = model[&id].clone();
            model.insert(dst, copy);
        }
        _ if id != FS => {
            e.write(|tx| tx.drop_tree(id)).unwrap();
            model.remove(&id);
        }
        _ => {}
    }
}

fn verify(dev: &dyn Device, e: &Engine, want: &Trees) {
    for (&id, items) in want {
        let got = e.read(|r| r.range(id, &Key::MIN, &Key::MAX)).unwrap();
        let want_items: Vec<(Key, Vec<u8>)> = items.iter().map(|(k, v)| (*k, v.clone())).collect();
        assert!(
            got == want_items,
            "tree {id} differs from its committed model"
        );
        for (k, v) in items.iter().filter(|(k, _)| k.ty == EXTENT_DATA) {
            let fe = FileExtentItem::decode(v).unwrap();
            let mut buf = vec![0u8; fe.disk_num_bytes as usize];
            dev.read_at(&mut buf, fe.disk_bytenr).unwrap();
            assert!(
                buf.iter().all(|&b| b == data_pattern(fe.disk_bytenr)),
                "data of {k} lost"
            );
        }
    }
    let ids = e.read(|r| Ok(r.tree_ids())).unwrap();
    for id in ids.iter().filter(|&&i| i == FS || i >= FIRST_FREE) {
        assert!(want.contains_key(id), "tree {id} should not exist");
    }
}

/// The commits a recording begins with: the image's last, and the one
/// the writable open makes at once (a log chain of its own), which
/// changes nothing else; each with the ops recorded when it was durable.
fn opened_ends(fs: &canopy::fs::Fs, rec: &RecordingDevice) -> Vec<(u64, usize)> {
    let g = fs.engine().committed_generation();
    vec![(g - 1, 0), (g, rec.op_count())]
}

/// The disk a crash after `prefix` recorded ops could leave (`keep` picks
/// the writes in flight that reached it), opened read-only; its generation
/// must be the last completed commit or the one in flight.
fn open_crashed(
    rp: &mut Replayer,
    prefix: usize,
    keep: &dyn Fn(usize) -> bool,
    ends: &[(u64, usize)],
) -> (Arc<OverlayDevice>, Engine) {
    let completed = ends
        .iter()
        .filter(|(_, end)| *end <= prefix)
        .map(|(g, _)| *g)
        .max()
        .unwrap();
    let dev = Arc::new(rp.at(prefix, keep));
    let ro = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &ro)
        .unwrap_or_else(|err| panic!("prefix {prefix}: open failed: {err}"));
    let g = e.committed_generation();
    assert!(
        g == completed || g == completed + 1,
        "prefix {prefix}: generation {g}, last completed {completed}"
    );
    (dev, e)
}

fn run_crash_workload(seed: u64, transactions: usize, nodesize: u32) {
    let (base_dev, e) = common::mem_engine(40 << 20, nodesize);
    drop(e);
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let mut model: Trees = BTreeMap::new();
    model.insert(FS, BTreeMap::new());
    let first_gen = e.committed_generation();
    let mut models: BTreeMap<u64, Trees> = BTreeMap::new();
    // The open commits once (a log chain of its own), changing nothing.
    models.insert(first_gen - 1, model.clone());
    models.insert(first_gen, model.clone());
    // (generation, number of ops once its commit returned)
    let mut ends = vec![(first_gen - 1, 0usize), (first_gen, rec.op_count())];
    let mut rng = Rng(seed | 1);
    let mut next_tree = FIRST_FREE;
    for _ in 0..transactions {
        for _ in 0..rng.below(60) + 1 {
            random_change(&e, &mut model, &mut rng, &mut next_tree);
        }
        let g = e.commit().unwrap();
        models.insert(g, model.clone());
        ends.push((g, rec.op_count()));
    }
    e.crash();
    let mut rp = Replayer::new(base, rec.ops());
    let mut images = 0;
    for prefix in 0..=rp.len() {
        let variants: [&dyn Fn(usize) -> bool; 3] = [&|_| true, &|_| false, &|i| i % 3 != 1];
        for keep in variants {
            let (dev, e) = open_crashed(&mut rp, prefix, keep, &ends);
            let g = e.committed_generation();
            verify(dev.as_ref(), &e, &models[&g]);
            drop(e);
            common::assert_clean(dev.as_ref());
            images += 1;
        }
    }
    eprintln!("crash workload: {} ops, {images} images", rp.len());
    assert!(images > transactions * 3);
}

#[test]
fn every_prefix_opens_to_a_committed_generation_4k() {
    run_crash_workload(0x9e37_79b9_7f4a_7c15, 40, 4096);
}

#[test]
fn every_prefix_opens_to_a_committed_generation_16k() {
    run_crash_workload(0x2545_f491_4f6c_dd1d, 30, 16384);
}

/// A fresh filesystem of `size` bytes in memory, its state now (`base`),
/// and an `Fs` on it whose every write the recorder keeps.
fn recorded_fs(size: u64) -> (Arc<Vec<u8>>, Arc<RecordingDevice>, canopy::fs::Fs) {
    use canopy::fs::Fs;
    let (base_dev, e) = common::mem_engine(size, 4096);
    drop(Fs::new(Arc::new(e)).unwrap());
    let base = Arc::new(base_dev.snapshot());
    let rec = Arc::new(RecordingDevice::new(base.as_ref().clone()));
    let e = Engine::open(rec.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    (base, rec, Fs::new(Arc::new(e)).unwrap())
}

/// Files (name → contents) as committed at each generation.
type Files = BTreeMap<Vec<u8>, Vec<u8>>;

fn fs_files(fs: &canopy::fs::Fs) -> Files {
    let mut out = Files::new();
    for (_, ino, _, name) in fs.readdir(256, 2, 100_000).unwrap() {
        let size = fs.getattr(ino).unwrap().size;
        out.insert(name, fs.read(ino, 0, size as u32).unwrap());
    }
    out
}

/// A disk filled to ENOSPC, half emptied and filled again, with commits
/// on the full disk and freed space discarded after each: every prefix of
/// its writes opens to a committed generation holding exactly the files
/// committed then.
#[test]
fn every_prefix_of_a_fill_to_enospc_keeps_the_committed_files() {
    use canopy::fs::{Fs, Owner};
    let (base, rec, fs) = recorded_fs(32 << 20);
    // Each commit discards what it made reusable (`-o discard=sync`):
    // the half emptied is discarded, then filled again.
    fs.engine()
        .set_discard(canopy::txn::DiscardMode::Sync)
        .unwrap();
    let mut files = Files::new();
    let mut models: BTreeMap<u64, Files> = BTreeMap::new();
    let mut ends = opened_ends(&fs, &rec);
    for &(g, _) in &ends {
        models.insert(g, files.clone());
    }
    let mut rng = Rng(0x51ed_2701_a3c4_6b8f);
    let mut commit = |fs: &Fs, files: &Files| {
        fs.sync().unwrap();
        let g = fs.engine().committed_generation();
        models.insert(g, files.clone());
        ends.push((g, rec.op_count()));
    };
    let me = Owner { uid: 0, gid: 0 };
    let mut next = 0u32;
    for round in 0..2 {
        loop {
            let name = format!("f{next}").into_bytes();
            next += 1;
            let Ok(a) = fs.create(256, &name, libc::S_IFREG | 0o644, 0, me, None) else {
                break;
            };
            let data = vec![(next % 251) as u8; (rng.below(3 << 20) + 1) as usize];
            files.insert(name.clone(), Vec::new());
            match fs.write(a.ino, 0, &data) {
                Ok(_) => {
                    files.insert(name, data);
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    break;
                }
            }
            if next.is_multiple_of(3) {
                commit(&fs, &files);
            }
        }
        commit(&fs, &files);
        if round == 0 {
            let names: Vec<Vec<u8>> = files.keys().step_by(2).cloned().collect();
            for name in names {
                fs.remove(256, &name, false).unwrap();
                files.remove(&name);
            }
            commit(&fs, &files);
        }
    }
    drop(fs);
    let replay = Replay {
        rp: Replayer::new(base, rec.ops()),
        ends,
        models,
    };
    replay.check_prefixes(300, &|i| i % 2 == 0, "fill-to-ENOSPC");
}

/// An `Fs` workload's recorded writes, where its commits ended, and the
/// files each committed generation holds.
struct Replay {
    rp: Replayer,
    ends: Vec<(u64, usize)>,
    models: BTreeMap<u64, Files>,
}

impl Replay {
    /// Opens the disk a crash could leave after about `samples` prefixes
    /// (and every barrier's neighbourhood: a data write is one op however
    /// large), `keep` choosing the pages in flight that reached it: each
    /// must hold exactly the files of the generation it opens to, and
    /// check clean.
    fn check_prefixes(mut self, samples: usize, keep: &dyn Fn(usize) -> bool, what: &str) {
        use canopy::fs::Fs;
        let len = self.rp.len();
        let step = (len / samples).max(1);
        let ends = &self.ends;
        let mut images = 0;
        for prefix in
            (0..=len).filter(|p| p % step == 0 || ends.iter().any(|e| e.1.abs_diff(*p) <= 2))
        {
            let (dev, e) = open_crashed(&mut self.rp, prefix, keep, ends);
            let g = e.committed_generation();
            let fs = Fs::new(Arc::new(e)).unwrap();
            let want = self.models.get(&g).unwrap_or_else(|| {
                panic!("prefix {prefix}: generation {g} was not recorded ({ends:?})")
            });
            assert!(
                fs_files(&fs) == *want,
                "prefix {prefix}: files of generation {g} differ"
            );
            drop(fs);
            common::assert_posix_clean_in_place(dev.clone());
            images += 1;
        }
        eprintln!("{what} crash workload: {len} ops, {images} images");
    }
}

/// A compressed workload (zstd, text and noise, overwrites of parts of
/// compressed extents, deletions): every prefix of its writes opens to a
/// committed generation holding exactly the files committed then.
#[test]
fn every_prefix_of_a_compressed_workload_keeps_the_committed_files() {
    use canopy::fs::Owner;
    let (base, rec, fs) = recorded_fs(64 << 20);
    fs.set_compression(canopy::compress::Policy {
        codec: Some(canopy::compress::Codec::Zstd(1)),
        force: true,
    });
    let mut files = Files::new();
    let mut models: BTreeMap<u64, Files> = BTreeMap::new();
    let mut ends = opened_ends(&fs, &rec);
    for &(g, _) in &ends {
        models.insert(g, files.clone());
    }
    let mut rng = Rng(0xc0de_5eed_7a11_0003);
    let me = Owner { uid: 0, gid: 0 };
    // `-o discard=async` with no delay, run between every two steps, so
    // that space freed inside a transaction is discarded too.
    fs.engine()
        .set_discard(canopy::txn::DiscardMode::Async)
        .unwrap();
    let mut discarded = 0;
    for step in 0..60u64 {
        discarded += fs
            .engine()
            .discard_freed(canopy::txn::DiscardPass::ALL)
            .unwrap()
            .bytes;
        // A file of hundreds of extents, truncated and then unlinked in
        // steps (`fs::reclaim`) among the other changes.
        if big_file_step(&fs, step, &mut files) {
            continue;
        }
        let name = format!("f{}", rng.below(8)).into_bytes();
        match (files.get(&name).cloned(), rng.below(4)) {
            (Some(_), 0) => {
                fs.remove(256, &name, false).unwrap();
                files.remove(&name);
            }
            (Some(mut data), _) => {
                let ino = fs.lookup(256, &name).unwrap().ino;
                let off = rng.below(data.len() as u64 + 1) as usize;
                let patch = {
                    let len = rng_len(&mut rng);
                    chunk_of(&mut rng, len)
                };
                fs.write(ino, off as u64, &patch).unwrap();
                data.resize(data.len().max(off + patch.len()), 0);
                data[off..off + patch.len()].copy_from_slice(&patch);
                files.insert(name, data);
            }
            (None, _) => {
                let a = fs
                    .create(256, &name, libc::S_IFREG | 0o644, 0, me, None)
                    .unwrap();
                let data = {
                    let len = rng_len(&mut rng);
                    chunk_of(&mut rng, len)
                };
                fs.write(a.ino, 0, &data).unwrap();
                files.insert(name, data);
            }
        }
        if step % 3 == 2 {
            fs.sync().unwrap();
            let g = fs.engine().committed_generation();
            models.insert(g, files.clone());
            ends.push((g, rec.op_count()));
        }
    }
    drop(fs);
    assert!(discarded > 1 << 20, "only {discarded} bytes discarded");
    let replay = Replay {
        rp: Replayer::new(base, rec.ops()),
        ends,
        models,
    };
    replay.check_prefixes(200, &|i| i % 2 == 1, "compressed");
}

/// At steps 10, 25 and 40: writes a file of 600 sparse 4 KiB pieces,
/// truncates it to 1 MB, unlinks it. True when it did one of those.
fn big_file_step(fs: &canopy::fs::Fs, step: u64, files: &mut Files) -> bool {
    let name = b"big".to_vec();
    match step {
        10 => {
            let me = canopy::fs::Owner { uid: 0, gid: 0 };
            let a = fs
                .create(256, &name, libc::S_IFREG | 0o644, 0, me, None)
                .unwrap();
            let mut data = Vec::new();
            for i in 0..600u64 {
                let page = vec![(i % 250) as u8 + 1; 4096];
                fs.write(a.ino, i * 8192, &page).unwrap();
                data.resize((i * 8192) as usize, 0);
                data.extend_from_slice(&page);
            }
            files.insert(name, data);
        }
        25 => {
            let ino = fs.lookup(256, &name).unwrap().ino;
            let cut = canopy::fs::SetAttr {
                size: Some(1_000_000),
                ..Default::default()
            };
            fs.setattr(ino, &cut).unwrap();
            if let Some(d) = files.get_mut(&name) {
                d.truncate(1_000_000);
            }
        }
        40 => {
            fs.remove(256, &name, false).unwrap();
            files.remove(&name);
        }
        _ => return false,
    }
    true
}

fn rng_len(rng: &mut Rng) -> usize {
    (rng.below(600_000) + 1) as usize
}

/// Text (compresses) or noise (does not), by a coin.
fn chunk_of(rng: &mut Rng, len: usize) -> Vec<u8> {
    let noisy = rng.below(3) == 0;
    let mut out = Vec::with_capacity(len + 32);
    while out.len() < len {
        if noisy {
            out.extend_from_slice(&rng.next().to_le_bytes());
        } else {
            out.extend_from_slice(format!("row {} of the ledger\n", rng.below(50)).as_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Files of many short extents, one of them reflinked into another file
/// and both partly overwritten afterwards, defragmented again and again
/// between commits (`fs::defrag`: extents merged, every holder repointed,
/// items joined; then recompressed with lz4 and again with zstd, items
/// cut per chunk in every holder): every prefix of the writes opens to a
/// committed generation holding exactly the files committed then, and
/// checks clean.
#[test]
fn every_prefix_of_defragmenting_keeps_the_committed_files() {
    use canopy::compress::Codec;
    use canopy::fs::defrag::DefragArgs;
    use canopy::fs::{Fs, Owner};
    const PIECE: usize = 4096;
    const PIECES: u64 = 256;
    let (base, rec, fs) = recorded_fs(64 << 20);
    let me = Owner { uid: 0, gid: 0 };
    let mut files = Files::new();
    let mut models: BTreeMap<u64, Files> = BTreeMap::new();
    let mut ends = opened_ends(&fs, &rec);
    for &(g, _) in &ends {
        models.insert(g, files.clone());
    }
    let commit = |fs: &Fs, files: &Files, models: &mut BTreeMap<u64, Files>, ends: &mut Vec<_>| {
        fs.sync().unwrap();
        let g = fs.engine().committed_generation();
        models.insert(g, files.clone());
        ends.push((g, rec.op_count()));
    };
    let mut rng = Rng(0xdef7_a6d0_0000_0056);
    let names: Vec<Vec<u8>> = (0..3).map(|i| format!("frag{i}").into_bytes()).collect();
    let mut inos = Vec::new();
    for name in &names {
        let a = fs
            .create(256, name, libc::S_IFREG | 0o644, 0, me, None)
            .unwrap();
        let full = canopy::fs::SetAttr {
            size: Some(PIECES * PIECE as u64),
            ..Default::default()
        };
        fs.setattr(a.ino, &full).unwrap();
        inos.push(a.ino);
        files.insert(name.clone(), vec![0; PIECES as usize * PIECE]);
    }
    // Pieces in a random order, committed every few: each its own extent,
    // scattered.
    let write_piece = |fs: &Fs, files: &mut Files, rng: &mut Rng, f: usize, p: u64| {
        let byte = (rng.below(250) + 1) as u8;
        fs.write(inos[f], p * PIECE as u64, &[byte; PIECE]).unwrap();
        let d = files.get_mut(&names[f]).unwrap();
        d[p as usize * PIECE..(p as usize + 1) * PIECE].fill(byte);
    };
    let mut order: Vec<u64> = (0..PIECES).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (n, &p) in order.iter().enumerate() {
        for f in 0..names.len() {
            write_piece(&fs, &mut files, &mut rng, f, p);
        }
        if n % 16 == 15 {
            commit(&fs, &files, &mut models, &mut ends);
        }
    }
    // A reflinked copy shares frag0's extents.
    let copy = fs
        .create(256, b"copy", libc::S_IFREG | 0o644, 0, me, None)
        .unwrap();
    let len = PIECES * PIECE as u64;
    assert_eq!(fs.copy_range(inos[0], 0, copy.ino, 0, len).unwrap(), len);
    files.insert(b"copy".to_vec(), files[&names[0]].clone());
    commit(&fs, &files, &mut models, &mut ends);
    let codecs = [None, Some(Codec::Lz4), Some(Codec::Zstd(3))];
    for (round, compress) in codecs.into_iter().enumerate() {
        let mut recompressed = 0;
        for (i, &ino) in inos.iter().enumerate().chain([(9, &copy.ino)]) {
            // Pieces written in the running transaction, merged in it too
            // (the defragment flushes them; its commit takes them).
            if i < 3 && round > 0 {
                for _ in 0..8 {
                    let p = rng.below(PIECES);
                    write_piece(&fs, &mut files, &mut rng, i, p);
                }
            }
            let mut start = 0;
            loop {
                let args = DefragArgs {
                    start,
                    threshold: 2 << 20,
                    compress,
                };
                let r = fs.defragment(ino, args).unwrap();
                recompressed += r.recompressed;
                if round == 0 && i < 3 && start == 0 {
                    assert!(r.merged > 0, "frag{i}: nothing merged");
                }
                // The request that ends a file commits (when anything
                // merged), and a recompressing one commits where the
                // running transaction holds the next extent: the files
                // as written, the other files having no buffered writes.
                let g = fs.engine().committed_generation();
                let last = ends.last().map_or(0, |e| e.0);
                if g != last {
                    for between in last + 1..=g {
                        models.insert(between, files.clone());
                    }
                    ends.push((g, rec.op_count()));
                }
                match r.next {
                    Some(n) => start = n,
                    None => break,
                }
            }
        }
        if compress.is_some() {
            assert!(recompressed > 0, "round {round}: nothing recompressed");
        }
        // Overwrites among the merged extents split them again.
        for _ in 0..24 {
            let f = rng.below(names.len() as u64) as usize;
            let p = rng.below(PIECES);
            write_piece(&fs, &mut files, &mut rng, f, p);
        }
        commit(&fs, &files, &mut models, &mut ends);
    }
    assert!(fs_files(&fs) == files, "the files as written");
    // Reading set access times: committed here, not by the drop.
    commit(&fs, &files, &mut models, &mut ends);
    drop(fs);
    let replay = Replay {
        rp: Replayer::new(base, rec.ops()),
        ends,
        models,
    };
    replay.check_prefixes(250, &|i| i % 3 != 0, "defragment");
}

/// What a generation committed of the in-place workload below: the file
/// that keeps checksums, the `chattr +C` file's size, and the snapshot's
/// two files once it exists.
#[derive(Clone)]
struct InPlaceModel {
    /// None before the files were committed.
    cow: Option<Vec<u8>>,
    nocow_size: u64,
    snap: Option<(Vec<u8>, Vec<u8>)>,
}

/// A `chattr +C` file overwritten in place (first into its preallocated
/// space, then over its own data), beside a file that keeps checksums,
/// with a snapshot of both half-way: every prefix of the writes opens
/// clean, the other file and the snapshot hold exactly what was
/// committed, and each sector of the `+C` file the value it had at the
/// last fsync or commit before the crash, or one written after (in
/// place, a later write may have reached the disk too).
#[test]
fn every_prefix_of_in_place_writes_keeps_what_was_committed() {
    in_place_writes_keep_what_was_synced(3, |fs, ino| fs.fsync(ino));
}

/// The same with fdatasync, which keeps the logged inode item when only
/// its times changed, and writes of up to 96 KiB, more than the log
/// carries (`LOG_DATA_MAX`), so they are flushed in place first: such an
/// fdatasync may add nothing to the log, and the data it wrote in place
/// still needs a barrier before it returns.
#[test]
fn every_prefix_of_in_place_writes_keeps_what_was_fdatasynced() {
    in_place_writes_keep_what_was_synced(24, |fs, ino| fs.fdatasync(ino));
}

/// The workload above, writes of 1 to `most` pieces of 4 KiB, `sync`
/// after every fourth.
fn in_place_writes_keep_what_was_synced(
    most: u64,
    sync: impl Fn(&canopy::fs::Fs, u64) -> canopy::Result<()>,
) {
    use canopy::fs::{Fs, Owner};
    const PIECE: usize = 4096;
    const PIECES: u64 = 192;
    const FS_NOCOW_FL: u32 = 0x0080_0000;
    let (base, rec, fs) = recorded_fs(64 << 20);
    let me = Owner { uid: 0, gid: 0 };
    let mk = |name: &[u8]| {
        fs.create(256, name, libc::S_IFREG | 0o644, 0, me, None)
            .unwrap()
            .ino
    };
    let (nocow, cow) = (mk(b"nocow"), mk(b"cow"));
    fs.set_file_flags(nocow, FS_NOCOW_FL).unwrap();
    assert_eq!(fs.file_flags(nocow).unwrap(), FS_NOCOW_FL);
    let len = PIECES * PIECE as u64;
    fs.fallocate(nocow, 0, len, 0).unwrap();
    let mut cow_data = vec![0u8; len as usize];
    fs.setattr(
        cow,
        &canopy::fs::SetAttr {
            size: Some(len),
            ..Default::default()
        },
    )
    .unwrap();
    // Every value each piece of the +C file was given: (write number,
    // value); and (recorded ops, write number) where each fsync or commit
    // returned.
    let mut seen: Vec<Vec<(u64, u8)>> = vec![vec![(0, 0)]; PIECES as usize];
    let mut durable: Vec<(usize, u64)> = Vec::new();
    let mut nocow_data = vec![0u8; len as usize];
    let mut snap: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut models: BTreeMap<u64, InPlaceModel> = BTreeMap::new();
    let mut ends = opened_ends(&fs, &rec);
    let model = |cow: &[u8], snap: &Option<(Vec<u8>, Vec<u8>)>| InPlaceModel {
        cow: Some(cow.to_vec()),
        nocow_size: len,
        snap: snap.clone(),
    };
    let before = InPlaceModel {
        cow: None,
        nocow_size: 0,
        snap: None,
    };
    for &(g, _) in &ends {
        models.insert(g, before.clone());
    }
    let commit = |fs: &Fs, m: InPlaceModel, models: &mut BTreeMap<_, _>, ends: &mut Vec<_>| {
        fs.sync().unwrap();
        let g = fs.engine().committed_generation();
        models.insert(g, m);
        ends.push((g, rec.op_count()));
    };
    commit(&fs, model(&cow_data, &None), &mut models, &mut ends);
    let mut rng = Rng(0x0c0f_fee0_0000_0043);
    for step in 0..240u64 {
        // One to `most` pieces: a write may span written and
        // preallocated space, or shared and unshared extents.
        let n = 1 + rng.below(most) as usize;
        let p = rng.below(PIECES - n as u64 + 1) as usize;
        let byte = (rng.below(250) + 1) as u8;
        let at = (p * PIECE) as u64;
        fs.write(nocow, at, &vec![byte; n * PIECE]).unwrap();
        nocow_data[p * PIECE..(p + n) * PIECE].fill(byte);
        for piece in &mut seen[p..p + n] {
            piece.push((step + 1, byte));
        }
        let other = byte.wrapping_add(1);
        fs.write(cow, at, &vec![other; n * PIECE]).unwrap();
        cow_data[p * PIECE..(p + n) * PIECE].fill(other);
        if step % 4 == 3 {
            sync(&fs, nocow).unwrap();
            durable.push((rec.op_count(), step + 1));
            // An fsync commits instead of logging now and then (a new
            // block group): what it committed is what was written.
            let g = fs.engine().committed_generation();
            if g != ends.last().map_or(0, |e| e.0) {
                models.insert(g, model(&cow_data, &snap));
                ends.push((g, rec.op_count()));
            }
        }
        if step == 120 {
            commit(&fs, model(&cow_data, &snap), &mut models, &mut ends);
            fs.snapshot(256, 256, b"snap", false).unwrap();
            snap = Some((nocow_data.clone(), cow_data.clone()));
            commit(&fs, model(&cow_data, &snap), &mut models, &mut ends);
        } else if step % 12 == 11 {
            commit(&fs, model(&cow_data, &snap), &mut models, &mut ends);
            durable.push((rec.op_count(), step + 1));
        }
    }
    commit(&fs, model(&cow_data, &snap), &mut models, &mut ends);
    drop(fs);
    let mut rp = Replayer::new(base, rec.ops());
    let total = rp.len();
    let step = (total / 200).max(1);
    let keep = |i: usize| !i.is_multiple_of(3);
    let mut images = 0;
    for prefix in
        (0..=total).filter(|p| p % step == 0 || ends.iter().any(|e| e.1.abs_diff(*p) <= 2))
    {
        let (dev, e) = open_crashed(&mut rp, prefix, &keep, &ends);
        let g = e.committed_generation();
        let fs = Fs::new(Arc::new(e)).unwrap();
        let want = models
            .get(&g)
            .unwrap_or_else(|| panic!("prefix {prefix}: generation {g} was not recorded"));
        let read = |dir: u64, name: &[u8]| {
            let a = fs.lookup(dir, name).unwrap();
            fs.read(a.ino, 0, a.size as u32).unwrap()
        };
        let Some(cow) = &want.cow else {
            assert!(
                fs.lookup(256, b"cow").is_err(),
                "prefix {prefix}: cow too early"
            );
            drop(fs);
            common::assert_posix_clean_in_place(dev.clone());
            continue;
        };
        assert!(read(256, b"cow") == *cow, "prefix {prefix}: cow differs");
        let got = read(256, b"nocow");
        assert_eq!(got.len() as u64, want.nocow_size, "prefix {prefix}");
        let synced = durable
            .iter()
            .filter(|d| d.0 <= prefix)
            .map(|d| d.1)
            .max()
            .unwrap_or(0);
        for (p, sector) in got.chunks(PIECE).enumerate() {
            let since = seen[p].iter().rposition(|w| w.0 <= synced).unwrap_or(0);
            let allowed: Vec<u8> = seen[p][since..].iter().map(|w| w.1).collect();
            assert!(
                sector.iter().all(|&b| b == sector[0]) && allowed.contains(&sector[0]),
                "prefix {prefix} (generation {g}): piece {p} of nocow holds {:?}.., \
                 durable then or written after: {allowed:?}",
                &sector[..4],
            );
        }
        if let Some((snap_nocow, snap_cow)) = &want.snap {
            let s = fs.lookup(256, b"snap").unwrap().ino;
            assert!(
                read(s, b"nocow") == *snap_nocow,
                "prefix {prefix}: snap/nocow changed"
            );
            assert!(
                read(s, b"cow") == *snap_cow,
                "prefix {prefix}: snap/cow changed"
            );
        }
        drop(fs);
        common::assert_posix_clean_in_place(dev.clone());
        images += 1;
    }
    eprintln!("in-place crash workload: {total} ops, {images} images");
}
