//! `check --repair` on images damaged the way a bug would damage them:
//! a block group's usage counter wrong, a free range missing from the
//! free-space trees (the image no longer mounts), an inode's link count
//! wrong, `nbytes` wrong, an inode whose names went without an orphan
//! item, a data extent's or a tree block's reference count or
//! back-references wrong, a data extent or a tree block nothing points
//! at, a data extent's item lost. Each
//! is repaired, every change is reported, the image then
//! checks clean, mounts, and every file reads as before. Damage it does
//! not mend (an entry lost by name, kept by position) is refused and the image is
//! left byte for byte as it was. Through the command too.

mod common;

use canopy::check::repair::{repair, Outcome};
use canopy::check::Fix;
use canopy::dev::{Device, MemDevice};
use canopy::format::inode::{DirEntry, InodeItem};
use canopy::format::items::{BlockGroupItem, ExtentItem, FileExtentItem, BG_DATA};
use canopy::format::key_type::{
    BLOCK_GROUP_ITEM, DIR_INDEX, DIR_ITEM, EXTENT_CSUM, EXTENT_DATA, EXTENT_ITEM, FREE_EXTENT,
    INODE_ITEM, INODE_REF, SHARED_BLOCK_REF, SHARED_DATA_REF,
};
use canopy::format::tree_id::{BLOCK_GROUP, CSUM, EXTENT, FREE_BY_LEN, FREE_BY_START, FS};
use canopy::format::{Key, CSUM_OBJECTID};
use canopy::fs::Fs;
use canopy::{Engine, FormatOptions, OpenOptions};
use common::damage;
use common::multi::{content, populate, verify, write_file, MIB, ROOT_DIR};
use std::sync::Arc;

/// A populated single-device image (split groups, so data lies apart).
fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(1536 * MIB));
    let opts = FormatOptions {
        mixed: Some(false),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    write_file(&fs, ROOT_DIR, "linked", &content(5));
    fs.sync().unwrap();
    drop(fs);
    dev
}

/// The first data group's item (key, decoded).
fn data_group(tx: &canopy::txn::Txn<'_>) -> (Key, BlockGroupItem) {
    let all = tx
        .range(
            BLOCK_GROUP,
            &Key::MIN,
            &Key::new(u64::MAX, u8::MAX, u64::MAX),
        )
        .unwrap();
    all.into_iter()
        .filter(|(k, _)| k.ty == BLOCK_GROUP_ITEM)
        .map(|(k, d)| (k, BlockGroupItem::decode(&d).unwrap()))
        .find(|(_, g)| g.flags & BG_DATA != 0)
        .expect("a data group")
}

fn repaired(dev: &Arc<MemDevice>) -> Vec<String> {
    match repair(vec![dev.clone() as Arc<dyn Device>], &|_, _| {}).unwrap() {
        Outcome::Repaired { changes, after } => {
            assert!(after.is_clean(), "{:?}", after.problems);
            changes
        }
        other => panic!("not repaired: {other:?}"),
    }
}

fn mounts_and_reads(dev: &Arc<MemDevice>) {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    verify(&fs);
    // And takes new data where the repaired counters say it may.
    write_file(&fs, ROOT_DIR, "after", &content(77));
    fs.sync().unwrap();
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
}

#[test]
fn block_group_usage_and_free_space_are_counted_again() {
    let dev = image();
    damage(&dev, |tx| {
        let (key, mut g) = data_group(tx);
        g.used += 1 << 20;
        tx.put(BLOCK_GROUP, key, g.encode()).unwrap();
    });
    let r = canopy::check::check(dev.as_ref(), &|_, _| {}).unwrap();
    assert!(
        r.problems.iter().any(|p| p.fix == Some(Fix::Space)),
        "{:?}",
        r.problems
    );
    let changes = repaired(&dev);
    assert!(changes.iter().any(|c| c.contains("records")), "{changes:?}");
    mounts_and_reads(&dev);

    // A free range lost from both trees: the image no longer opens.
    let dev = image();
    damage(&dev, |tx| {
        let (key, _) = data_group(tx);
        let free = tx
            .range(
                FREE_BY_START,
                &Key::new(key.objectid, 0, 0),
                &Key::new(key.objectid + key.offset, 0, 0),
            )
            .unwrap();
        let (k, _) = free
            .iter()
            .rev()
            .find(|(k, _)| k.ty == FREE_EXTENT)
            .expect("free");
        tx.delete(FREE_BY_START, k).unwrap();
        tx.delete(FREE_BY_LEN, &Key::new(k.offset, FREE_EXTENT, k.objectid))
            .unwrap();
    });
    let err = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default())
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("canopy check"), "{err}");
    let changes = repaired(&dev);
    assert!(
        changes
            .iter()
            .any(|c| c.contains("not in the by-start tree")),
        "{changes:?}"
    );
    mounts_and_reads(&dev);
}

#[test]
fn a_wrong_link_count_is_set_to_the_names_found() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    damage(&dev, |tx| {
        let key = Key::new(ino, INODE_ITEM, 0);
        let mut item = InodeItem::decode(&tx.get(FS, &key).unwrap().unwrap()).unwrap();
        item.nlink = 3;
        tx.update(FS, key, item.encode()).unwrap();
    });
    let changes = repaired(&dev);
    let want = format!("inode {ino}: link count 3 set to 1");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    mounts_and_reads(&dev);
}

fn ino_of(dev: &Arc<MemDevice>, name: &[u8]) -> u64 {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    fs.lookup(ROOT_DIR, name).unwrap().ino
}

#[test]
fn a_wrong_nbytes_is_set_to_what_the_extents_account_for() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    damage(&dev, |tx| {
        let key = Key::new(ino, INODE_ITEM, 0);
        let mut item = InodeItem::decode(&tx.get(FS, &key).unwrap().unwrap()).unwrap();
        item.nbytes += 8192;
        tx.update(FS, key, item.encode()).unwrap();
    });
    let changes = repaired(&dev);
    assert!(
        changes
            .iter()
            .any(|c| c.contains(&format!("inode {ino}: nbytes"))),
        "{changes:?}"
    );
    mounts_and_reads(&dev);
}

/// An unlink that lost the file's names but left the inode (and its
/// link count) without an orphan item: the link count goes to 0 and an
/// orphan item makes the next mount delete it; nothing else changes.
#[test]
fn a_leaked_inode_gets_an_orphan_item_and_goes_at_the_next_mount() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    damage(&dev, |tx| {
        let end = Key::new(ROOT_DIR, u8::MAX, u64::MAX);
        for (k, d) in tx.range(FS, &Key::new(ROOT_DIR, 0, 0), &end).unwrap() {
            let named = (k.ty == DIR_INDEX || k.ty == DIR_ITEM)
                && DirEntry::decode_all(&d)
                    .unwrap()
                    .iter()
                    .any(|e| e.ino == ino);
            if named {
                tx.delete(FS, &k).unwrap();
            }
        }
        tx.delete(FS, &Key::new(ino, INODE_REF, ROOT_DIR)).unwrap();
    });
    let changes = repaired(&dev);
    assert!(
        changes.iter().any(|c| c.contains("orphan item added")),
        "{changes:?}"
    );
    assert!(
        changes.iter().any(|c| c.contains("link count 1 set to 0")),
        "{changes:?}"
    );
    mounts_and_reads(&dev);
}

/// An entry lost from the index by position (a listing would skip it)
/// while lookups still find it by name: the index item comes back, and
/// the listing shows the file again.
#[test]
fn an_entry_missing_from_the_listing_index_is_put_back() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    damage(&dev, |tx| {
        let end = Key::new(ROOT_DIR, DIR_INDEX, u64::MAX);
        for (k, d) in tx
            .range(FS, &Key::new(ROOT_DIR, DIR_INDEX, 0), &end)
            .unwrap()
        {
            if DirEntry::decode_all(&d).unwrap()[0].ino == ino {
                tx.delete(FS, &k).unwrap();
            }
        }
    });
    let listed = |dev: &Arc<MemDevice>| {
        let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
        let fs = Fs::new(Arc::new(e)).unwrap();
        let names: Vec<Vec<u8>> = fs
            .readdir(ROOT_DIR, 0, 1000)
            .unwrap()
            .into_iter()
            .map(|l| l.3)
            .collect();
        names.iter().any(|n| n == b"linked")
    };
    assert!(!listed(&dev), "the damage hides the file from listings");
    let changes = repaired(&dev);
    assert!(
        changes.iter().any(|c| c.contains("'linked' put back")),
        "{changes:?}"
    );
    assert!(listed(&dev));
    mounts_and_reads(&dev);
}

/// The first data extent of the image: its extent item's key, and the
/// item.
fn a_data_extent(tx: &canopy::txn::Txn<'_>) -> (Key, ExtentItem) {
    let all = tx.range(EXTENT, &Key::MIN, &Key::MAX).unwrap();
    all.into_iter()
        .filter(|(k, _)| k.ty == EXTENT_ITEM)
        .map(|(k, d)| (k, ExtentItem::decode(&d).unwrap()))
        .find(|(_, e)| !e.is_tree_block())
        .expect("a data extent")
}

/// Damages the first data extent with `f(tx, its bytenr, the end of its
/// keys in the extent tree)`; returns its bytenr.
fn damage_a_data_extent(
    dev: &Arc<MemDevice>,
    f: impl FnOnce(&mut canopy::txn::Txn<'_>, u64, Key),
) -> u64 {
    let mut at = 0;
    damage(dev, |tx| {
        let (key, _) = a_data_extent(tx);
        at = key.objectid;
        f(tx, at, Key::new(at, u8::MAX, u64::MAX));
    });
    at
}

/// A bug's wrong count on a data extent (and, with it, a link count off
/// so that the repair also copies leaves on write): the count goes back
/// to the holders found.
#[test]
fn a_data_extents_wrong_count_is_set_to_its_holders() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    let mut at = 0;
    damage(&dev, |tx| {
        let (key, e) = a_data_extent(tx);
        at = key.objectid;
        let item = ExtentItem {
            refs: e.refs + 2,
            ..e
        };
        tx.update(EXTENT, key, item.encode()).unwrap();
        let key = Key::new(ino, INODE_ITEM, 0);
        let mut item = InodeItem::decode(&tx.get(FS, &key).unwrap().unwrap()).unwrap();
        item.nlink = 4;
        tx.update(FS, key, item.encode()).unwrap();
    });
    let changes = repaired(&dev);
    let want = format!("data extent {at}: 3 references set to 1");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    mounts_and_reads(&dev);
}

/// A back-reference lost and one to a leaf that holds nothing of the
/// extent: both are put right.
#[test]
fn a_data_extents_back_references_are_set_to_its_holders() {
    let dev = image();
    let at = damage_a_data_extent(&dev, |tx, at, end| {
        let refs = tx
            .range(EXTENT, &Key::new(at, SHARED_DATA_REF, 0), &end)
            .unwrap();
        let (backref, count) = refs
            .into_iter()
            .find(|(k, _)| k.ty == SHARED_DATA_REF)
            .unwrap();
        tx.delete(EXTENT, &backref).unwrap();
        let stray = Key::new(at, SHARED_DATA_REF, backref.offset + 4096);
        tx.insert(EXTENT, stray, count).unwrap();
    });
    let changes = repaired(&dev);
    let want = format!("data extent {at}: 1 references set to 1, back-references to the 1 leaves");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    mounts_and_reads(&dev);
}

/// A data extent's extent item and back-references lost (as a bug
/// would), with the usage counters then disagreeing: the item comes back
/// with the holders' count, and the space it covers is never handed to
/// anything else: files written after the repair leave every old file as
/// it was.
#[test]
fn a_data_extents_lost_item_is_put_back() {
    let dev = image();
    let at = damage_a_data_extent(&dev, |tx, at, end| {
        for (k, _) in tx.range(EXTENT, &Key::new(at, 0, 0), &end).unwrap() {
            tx.delete(EXTENT, &k).unwrap();
        }
    });
    let changes = repaired(&dev);
    let want = format!("data extent {at}: its missing extent item put back with 1 references");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    assert!(
        changes.iter().any(|c| c.contains("counted again")),
        "the space is counted again too: {changes:?}"
    );
    mounts_and_reads(&dev);
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    for i in 0..40 {
        write_file(&fs, ROOT_DIR, &format!("more{i}"), &content(500 + i));
    }
    fs.sync().unwrap();
    verify(&fs);
    drop(fs);
    common::assert_posix_clean_in_place(dev.clone());
}

/// Bytes the image's counters say are used.
fn used_bytes(dev: &Arc<MemDevice>) -> u64 {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    e.space().0
}

/// A file extent item dropped without its reference (as a bug would):
/// the extent nothing points at is freed with its checksums, alone and
/// beside damaged counters (the repair then recounts the space too).
#[test]
fn a_data_extent_nothing_points_at_is_freed() {
    for with_counters_wrong in [false, true] {
        let dev = image();
        let ino = ino_of(&dev, b"linked");
        let used = used_bytes(&dev);
        let mut leaked = (0, 0);
        damage(&dev, |tx| {
            use canopy::format::node::Body;
            use canopy::tree::{BlockWrite, Cursor};
            let key = Key::new(ino, EXTENT_DATA, 0);
            let data = tx.get(FS, &key).unwrap().unwrap();
            let fe = FileExtentItem::decode(&data).unwrap();
            leaked = (fe.disk_bytenr, fe.disk_num_bytes);
            // Copied on write first, so that its leaf changes in place.
            tx.update(FS, key, data).unwrap();
            let root = tx.root_of(FS).unwrap();
            let c = Cursor::seek(tx, &root, &key).unwrap();
            let (leaf, slot) = c.leaf().map(|(n, s)| (n.bytenr, s)).unwrap();
            if let Body::Leaf(items) = &mut tx.node_mut(leaf).unwrap().body {
                assert_eq!(items.key(slot), key);
                items.remove(slot);
            }
            if with_counters_wrong {
                let (key, mut g) = data_group(tx);
                g.used += 1 << 20;
                tx.put(BLOCK_GROUP, key, g.encode()).unwrap();
            }
        });
        let r = canopy::check::check(dev.as_ref(), &|_, _| {}).unwrap();
        let (bytenr, len) = leaked;
        assert!(
            r.problems
                .iter()
                .any(|p| p.fix == Some(Fix::LeakedData { bytenr, len })),
            "{:?}",
            r.problems
        );
        let changes = repaired(&dev);
        let want = format!("data extent {bytenr}: nothing points at it, its {len} bytes freed");
        assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
        // What the image used before the damage, less the leaked extent
        // (and the wrong counter set right).
        assert_eq!(used_bytes(&dev), used - len, "space given back");
        // Its checksums went with it.
        let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
        let sums = Key::new(CSUM_OBJECTID, EXTENT_CSUM, bytenr);
        assert!(e.read(|r| r.get(CSUM, &sums)).unwrap().is_none());
        drop(e);
        mounts_and_reads(&dev);
    }
}

/// The leaf that holds `key` of the file tree, and its extent item's key
/// and item.
fn leaf_of(tx: &canopy::txn::Txn<'_>, key: &Key) -> (u64, Key, ExtentItem) {
    let root = tx.root_of(FS).unwrap();
    let c = canopy::tree::Cursor::seek(tx, &root, key).unwrap();
    let leaf = c.leaf().map(|(n, _)| n.bytenr).unwrap();
    let end = Key::new(leaf, EXTENT_ITEM, u64::MAX);
    let (k, d) = tx
        .range(EXTENT, &Key::new(leaf, EXTENT_ITEM, 0), &end)
        .unwrap()
        .into_iter()
        .next()
        .expect("the leaf's extent item");
    (leaf, k, ExtentItem::decode(&d).unwrap())
}

/// A bug's wrong count on a tree block, and a lost back-reference beside
/// a stray one on another; with a link count off in the first block, so
/// that the repair's own copy-on-write of that very block is folded
/// against its mended count. Both are set to what points at them.
#[test]
fn a_tree_blocks_references_are_set_to_what_points_at_it() {
    let dev = image();
    let ino = ino_of(&dev, b"linked");
    let inode_key = Key::new(ino, INODE_ITEM, 0);
    damage(&dev, |tx| {
        let mut item = InodeItem::decode(&tx.get(FS, &inode_key).unwrap().unwrap()).unwrap();
        item.nlink = 4;
        tx.update(FS, inode_key, item.encode()).unwrap();
    });
    let (mut counted, mut lost) = (0, 0);
    damage(&dev, |tx| {
        let (leaf, key, e) = leaf_of(tx, &inode_key);
        counted = leaf;
        let item = ExtentItem {
            refs: e.refs + 1,
            ..e
        };
        tx.update(EXTENT, key, item.encode()).unwrap();
        // Another leaf of the file tree: its back-reference swapped for
        // one to a node that does not point at it.
        let (other, _, _) = leaf_of(tx, &Key::new(ROOT_DIR, INODE_ITEM, 0));
        assert_ne!(other, leaf, "the image's file tree has one leaf");
        lost = other;
        let end = Key::new(other, u8::MAX, u64::MAX);
        let (backref, _) = tx
            .range(EXTENT, &Key::new(other, EXTENT_ITEM + 1, 0), &end)
            .unwrap()
            .into_iter()
            .find(|(k, _)| k.objectid == other)
            .unwrap();
        tx.delete(EXTENT, &backref).unwrap();
        let stray = Key::new(other, SHARED_BLOCK_REF, other + 4096);
        tx.insert(EXTENT, stray, Vec::new()).unwrap();
    });
    let r = canopy::check::check(dev.as_ref(), &|_, _| {}).unwrap();
    for b in [counted, lost] {
        assert!(
            r.problems
                .iter()
                .any(|p| matches!(p.fix, Some(Fix::BlockRefs { bytenr, .. }) if bytenr == b)),
            "{:?}",
            r.problems
        );
    }
    let changes = repaired(&dev);
    let want = format!("tree block {counted}: 2 references set to 1");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    let want = format!("tree block {lost}: 1 references set to 1");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    assert!(
        changes.iter().any(|c| c.contains("link count 4 set to 1")),
        "{changes:?}"
    );
    mounts_and_reads(&dev);
}

/// An extent item for a tree block nothing points at, as a bug that lost
/// a block's last pointer without its reference leaves (the block group's
/// counter does not count it, so the space is recounted too): the extent
/// item and its back-reference go and the image uses what it used
/// before.
#[test]
fn a_tree_block_nothing_points_at_is_freed() {
    use canopy::format::items::{BG_METADATA, EXTENT_FLAG_TREE_BLOCK};
    use canopy::format::key_type::TREE_BLOCK_REF;
    let dev = image();
    let used = used_bytes(&dev);
    let mut leaked = 0;
    damage(&dev, |tx| {
        let groups = tx
            .range(BLOCK_GROUP, &Key::MIN, &Key::MAX)
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.ty == BLOCK_GROUP_ITEM);
        let (group, _) = groups
            .map(|(k, d)| (k, BlockGroupItem::decode(&d).unwrap()))
            .find(|(_, g)| g.flags & BG_METADATA != 0)
            .expect("a metadata group");
        let end = Key::new(group.objectid + group.offset, 0, 0);
        let free = tx
            .range(FREE_BY_START, &Key::new(group.objectid, 0, 0), &end)
            .unwrap();
        let (k, _) = free
            .iter()
            .rev()
            .find(|(k, _)| k.ty == FREE_EXTENT && k.offset >= 1 << 20)
            .expect("free space in a metadata group");
        leaked = (k.objectid + (1 << 19)) / 16384 * 16384;
        let item = ExtentItem {
            refs: 1,
            generation: 1,
            flags: EXTENT_FLAG_TREE_BLOCK,
            owner: FS,
            level: 0,
        };
        tx.insert(EXTENT, Key::new(leaked, EXTENT_ITEM, 16384), item.encode())
            .unwrap();
        tx.insert(EXTENT, Key::new(leaked, TREE_BLOCK_REF, FS), Vec::new())
            .unwrap();
    });
    let r = canopy::check::check(dev.as_ref(), &|_, _| {}).unwrap();
    let fix = Some(Fix::LeakedBlock {
        bytenr: leaked,
        len: 16384,
    });
    assert!(r.problems.iter().any(|p| p.fix == fix), "{:?}", r.problems);
    let changes = repaired(&dev);
    let want = format!("tree block {leaked}: nothing points at it, freed");
    assert!(changes.iter().any(|c| c.contains(&want)), "{changes:?}");
    assert_eq!(used_bytes(&dev), used, "the space is free again");
    mounts_and_reads(&dev);
}

#[test]
fn damage_it_does_not_mend_changes_nothing() {
    let dev = image();
    damage(&dev, |tx| {
        let (key, mut g) = data_group(tx);
        g.used += 1 << 20;
        tx.put(BLOCK_GROUP, key, g.encode()).unwrap();
        let end = Key::new(ROOT_DIR, DIR_ITEM, u64::MAX);
        let by_name = tx
            .range(FS, &Key::new(ROOT_DIR, DIR_ITEM, 0), &end)
            .unwrap();
        tx.delete(FS, &by_name[0].0).unwrap();
    });
    let before = dev.snapshot();
    match repair(vec![dev.clone() as Arc<dyn Device>], &|_, _| {}).unwrap() {
        Outcome::Refused { why, .. } => {
            assert!(why.contains("does not mend"), "{why}")
        }
        other => panic!("repaired what it should refuse: {other:?}"),
    }
    assert!(dev.snapshot() == before, "the image changed");
}

/// `canopy check --repair` on an image file: refused while the image is
/// mounted, then the changes printed and exit 0.
#[test]
fn the_command_repairs_and_prints_each_change() {
    if !common::mounted::can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let mut m = common::mounted::Mounted::with_size("1G");
    std::fs::write(m.p("a"), content(3)).unwrap();
    let img = m.img.to_str().unwrap().to_string();
    let dir = m.img.parent().unwrap().to_path_buf();
    let busy = common::mounted::canopy()
        .args(["check", "--repair", &img])
        .output()
        .unwrap();
    assert!(!busy.status.success(), "repair of a mounted image");
    m.unmount();
    let dev: Arc<dyn Device> =
        Arc::new(canopy::dev::FileDevice::open_as(&m.img, canopy::dev::Access::Write).unwrap());
    let e = Engine::open(dev, &OpenOptions::default()).unwrap();
    e.write(|tx| {
        let (key, mut g) = data_group(tx);
        g.used += 4096;
        tx.put(BLOCK_GROUP, key, g.encode())?;
        Ok(())
    })
    .unwrap();
    e.commit().unwrap();
    drop(e);
    let out = common::mounted::canopy_ok(&["check", "--repair", &img], &dir);
    assert!(out.contains("(repaired)") && out.contains("clean"), "{out}");
    m.check();
}
