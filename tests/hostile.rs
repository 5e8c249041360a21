//! Hostile images: flipped bytes (with and without a fixed-up checksum, so
//! that the semantic checks are reached, not just the checksum) and
//! truncation. Opening, reading, writing, committing and checking must give
//! errors, never a panic or a hang.

mod common;

use common::Rng;

use canopy::dev::{Device, MemDevice};
use canopy::format::node::Node;
use canopy::format::tree_id::FS;
use canopy::{Engine, Key, OpenOptions};
use std::sync::Arc;

/// A key type the item checker does not know: engine tests store
/// arbitrary payloads under it.
const TEST_ITEM: u8 = 2;

/// A small image with several trees, data extents and a clone.
fn sample_image(nodesize: u32) -> (Vec<u8>, Vec<u64>) {
    let mut h = common::model::Harness::with_size(nodesize, 36 << 20);
    use common::model::Op;
    for k in 0..400u16 {
        h.apply(&Op::Insert {
            tree: 0,
            key: k,
            len: 120,
        });
        if k % 25 == 0 {
            h.apply(&Op::NewData {
                tree: 0,
                key: k,
                blocks: 1,
            });
        }
    }
    h.apply(&Op::Commit);
    h.apply(&Op::Clone { tree: 0 });
    h.apply(&Op::Delete { tree: 1, key: 3 });
    h.apply(&Op::Reopen);
    let dev = h.dev.clone();
    drop(h);
    let report = canopy::check::check(dev.as_ref(), &|_, _| {}).unwrap();
    assert!(report.is_clean());
    let blocks = live_blocks(dev.as_ref());
    (dev.snapshot(), blocks)
}

/// Addresses of every live tree block (via the extent tree).
fn live_blocks(dev: &dyn Device) -> Vec<u64> {
    let e = Engine::open(
        Arc::new(MemDevice::from_bytes(read_all(dev))) as Arc<dyn Device>,
        &OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let items = e
        .read(|r| r.range(canopy::format::tree_id::EXTENT, &Key::MIN, &Key::MAX))
        .unwrap();
    items
        .iter()
        .filter(|(k, d)| {
            k.ty == canopy::format::key_type::EXTENT_ITEM
                && canopy::format::items::ExtentItem::decode(d)
                    .unwrap()
                    .is_tree_block()
        })
        .map(|(k, _)| k.objectid)
        .collect()
}

fn read_all(dev: &dyn Device) -> Vec<u8> {
    let mut v = vec![0u8; dev.size() as usize];
    dev.read_at(&mut v, 0).unwrap();
    v
}

/// Everything a user could do with an image; all errors are acceptable.
fn exercise(img: Vec<u8>) -> bool {
    let dev = Arc::new(MemDevice::from_bytes(img));
    let report = canopy::check::check(dev.as_ref(), &|_, _| {});
    let clean = report.as_ref().is_ok_and(|r| r.is_clean());
    if let Ok(e) = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()) {
        let ids = e.read(|r| Ok(r.tree_ids())).unwrap_or_default();
        for id in ids {
            let _ = e.read(|r| r.range(id, &Key::MIN, &Key::MAX));
        }
        let _ = e.write(|tx| {
            for i in 0..50u64 {
                tx.put(FS, Key::new(i * 3, TEST_ITEM, 9), vec![1; 100])?;
            }
            Ok(())
        });
        let _ = e.commit();
        e.crash();
    }
    clean
}

fn fix_block_checksum(img: &mut [u8], bytenr: u64, nodesize: usize) {
    let b = &mut img[bytenr as usize..bytenr as usize + nodesize];
    let sum = canopy::format::crc(&b[32..]);
    b[0..4].copy_from_slice(&sum.to_le_bytes());
}

fn flips(nodesize: u32, seed: u64, rounds: usize) {
    let (img, blocks) = sample_image(nodesize);
    let ns = nodesize as usize;
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let mut bad = img.clone();
        let target = blocks[(rng.next() % blocks.len() as u64) as usize];
        let fix = round % 2 == 0;
        for _ in 0..1 + rng.next() % 4 {
            let at = target as usize + 32 + (rng.next() as usize % (ns - 32));
            bad[at] ^= 1 << (rng.next() % 8);
        }
        if fix {
            fix_block_checksum(&mut bad, target, ns);
        }
        let changed = bad != img;
        let clean = exercise(bad.clone());
        if !fix && changed {
            assert!(
                !clean,
                "round {round}: a flipped live block {target} passed check"
            );
        }
        // A corrupted block must never decode silently as something else
        // without its checksum being fixed.
        if !fix && changed {
            let r = Node::decode(
                &bad[target as usize..target as usize + ns],
                target,
                &[0x42; 16],
            );
            assert!(r.is_err());
        }
    }
}

#[test]
fn flipped_bytes_4k() {
    flips(4096, 0x1234_5678_9abc_def1, 150);
}

#[test]
fn flipped_bytes_16k() {
    flips(16384, 0x0fed_cba9_8765_4321, 100);
}

#[test]
fn flipped_superblock_and_random_bytes() {
    let (img, _) = sample_image(4096);
    let mut rng = Rng(77);
    for round in 0..120 {
        let mut bad = img.clone();
        let at = if round % 2 == 0 {
            (64 << 10) + (rng.next() % 4096) as usize
        } else {
            (rng.next() % img.len() as u64) as usize
        };
        bad[at] ^= 1 << (rng.next() % 8);
        exercise(bad);
    }
    // Every superblock copy destroyed: a clear error.
    let mut bad = img.clone();
    for off in canopy::format::SUPER_OFFSETS {
        if (off as usize) < bad.len() {
            bad[off as usize + 64] ^= 0xff;
        }
    }
    let dev = Arc::new(MemDevice::from_bytes(bad));
    assert!(Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).is_err());
    assert!(canopy::check::check(dev.as_ref(), &|_, _| {}).is_err());
}

#[test]
fn truncated_images() {
    let (img, _) = sample_image(4096);
    for len in [
        0usize,
        4096,
        65536,
        70000,
        1 << 20,
        3 << 20,
        8 << 20,
        img.len() / 2,
        img.len() - 4096,
    ] {
        let bad = img[..len.min(img.len())].to_vec();
        assert!(
            !exercise(bad),
            "truncated image of {len} bytes passed check"
        );
    }
}
