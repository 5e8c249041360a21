//! `check` within a memory budget: what relates distant items (an entry
//! and its child's back-reference, a file extent and its checksum item
//! or its extent item, a used extent and the free-space trees) is sorted
//! as records, in memory or, past the budget, in runs on temporary files. Each kind of damage those records find is
//! found the same, with the same words, whether the records stayed in
//! memory or were spilled, and an undamaged image is clean either way.

mod common;

use canopy::check::{check_all_devices_within, DEFAULT_MEMORY};
use canopy::dev::{Device, MemDevice};
use canopy::format::inode::DirEntry;
use canopy::format::items::{BlockGroupItem, ExtentItem, BG_DATA};
use canopy::format::key_type::{
    BLOCK_GROUP_ITEM, DIR_INDEX, DIR_ITEM, EXTENT_CSUM, EXTENT_ITEM, FREE_EXTENT, INODE_ITEM,
    INODE_REF,
};
use canopy::format::tree_id::{BLOCK_GROUP, CSUM, EXTENT, FREE_BY_START, FS};
use canopy::format::Key;
use canopy::fs::Fs;
use canopy::{Engine, FormatOptions, OpenOptions};
use common::damage;
use common::multi::{content, populate, write_file, ME, MIB, ROOT_DIR};
use std::sync::Arc;

/// Files in the big directory: enough records that a budget of nothing
/// spills several runs.
const FILES: usize = 3000;

/// A populated image with one directory of [`FILES`] entries.
fn image() -> (Arc<MemDevice>, u64) {
    let dev = Arc::new(MemDevice::new(1024 * MIB));
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &FormatOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    let mode = libc::S_IFDIR | 0o755;
    let big = fs.create(ROOT_DIR, b"big", mode, 0, ME, None).unwrap().ino;
    for i in 0..FILES {
        let bytes = if i % 3 == 0 { content(i) } else { Vec::new() };
        write_file(&fs, big, &format!("f{i}"), &bytes);
    }
    fs.sync().unwrap();
    (dev, big)
}

fn ino_of(dev: &Arc<MemDevice>, dir: u64, name: &str) -> u64 {
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    fs.lookup(dir, name.as_bytes()).unwrap().ino
}

/// The problems check reports with `memory`, as sorted lines.
fn problems(dev: &Arc<MemDevice>, memory: u64) -> Vec<String> {
    let devs = vec![dev.clone() as Arc<dyn Device>];
    let report = check_all_devices_within(devs, &|_, _| {}, memory).unwrap();
    let mut lines: Vec<String> = report
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.location, p.message))
        .collect();
    lines.sort();
    lines
}

/// Checks with the default budget and with none (every record spilled),
/// asserts both say the same, and returns what they say.
fn both_ways(dev: &Arc<MemDevice>) -> Vec<String> {
    let in_memory = problems(dev, DEFAULT_MEMORY);
    let spilled = problems(dev, 0);
    assert_eq!(in_memory, spilled, "spilled records change the report");
    in_memory
}

fn has(lines: &[String], want: &str) {
    assert!(
        lines.iter().any(|l| l.contains(want)),
        "no '{want}' in {lines:#?}"
    );
}

#[test]
fn an_undamaged_image_is_clean_either_way() {
    let (dev, _) = image();
    assert_eq!(both_ways(&dev), Vec::<String>::new());
}

#[test]
fn a_name_without_its_back_reference() {
    let (dev, big) = image();
    let ino = ino_of(&dev, big, "f1234");
    damage(&dev, |tx| {
        tx.delete(FS, &Key::new(ino, INODE_REF, big)).unwrap();
    });
    let lines = both_ways(&dev);
    has(
        &lines,
        &format!("inode {ino}: named 'f1234' in directory {big} without a back-reference"),
    );
}

/// The entry lost by name (lookups miss it), kept by position and by
/// the child's back-reference.
#[test]
fn a_back_reference_without_its_name() {
    let (dev, big) = image();
    let ino = ino_of(&dev, big, "f2001");
    damage(&dev, |tx| {
        let key = Key::new(big, DIR_ITEM, canopy::format::inode::name_hash(b"f2001"));
        let entries = DirEntry::decode_all(&tx.get(FS, &key).unwrap().unwrap()).unwrap();
        assert_eq!(entries.len(), 1, "no collision in this name's item");
        tx.delete(FS, &key).unwrap();
    });
    let lines = both_ways(&dev);
    has(
        &lines,
        &format!(
            "inode {ino}: back-reference to 'f2001' in directory {big}, which has no such entry"
        ),
    );
    has(&lines, "entry 'f2001' (inode");
    has(&lines, "is listed by index but not by name");
    has(&lines, &format!("inode {ino}: link count 1 but 0 found"));
}

#[test]
fn entries_naming_a_missing_inode() {
    let (dev, big) = image();
    let ino = ino_of(&dev, big, "f7");
    damage(&dev, |tx| {
        tx.delete(FS, &Key::new(ino, INODE_ITEM, 0)).unwrap();
    });
    let lines = both_ways(&dev);
    has(
        &lines,
        &format!("inode {ino}: directory entries name a missing inode"),
    );
}

#[test]
fn an_entry_missing_from_the_listing_index() {
    let (dev, big) = image();
    let ino = ino_of(&dev, big, "f2999");
    damage(&dev, |tx| {
        let end = Key::new(big, DIR_INDEX, u64::MAX);
        for (k, d) in tx.range(FS, &Key::new(big, DIR_INDEX, 0), &end).unwrap() {
            if DirEntry::decode_all(&d).unwrap()[0].ino == ino {
                tx.delete(FS, &k).unwrap();
            }
        }
    });
    let lines = both_ways(&dev);
    has(&lines, "entry 'f2999' (inode");
    has(&lines, "is listed by name but not by index");
    has(&lines, &format!("directory {big}"));
}

#[test]
fn a_data_extent_without_its_checksums() {
    let (dev, _) = image();
    let mut gone = 0;
    damage(&dev, |tx| {
        let all = tx.range(CSUM, &Key::MIN, &Key::MAX).unwrap();
        let (k, _) = all
            .iter()
            .find(|(k, _)| k.ty == EXTENT_CSUM)
            .expect("a checksum item");
        gone = k.offset;
        tx.delete(CSUM, k).unwrap();
    });
    let lines = both_ways(&dev);
    has(&lines, &format!("data extent {gone} of tree"));
    has(&lines, "without checksums (reads of it fail)");
}

#[test]
fn an_extent_item_counting_a_reference_too_many() {
    let (dev, _) = image();
    let mut at = 0;
    damage(&dev, |tx| {
        let all = tx.range(EXTENT, &Key::MIN, &Key::MAX).unwrap();
        let (k, d) = all
            .iter()
            .filter(|(k, _)| k.ty == EXTENT_ITEM)
            .map(|(k, d)| (k, ExtentItem::decode(d).unwrap()))
            .find(|(_, e)| !e.is_tree_block())
            .expect("a data extent");
        at = k.objectid;
        let item = ExtentItem {
            refs: d.refs + 1,
            ..d
        };
        tx.update(EXTENT, *k, item.encode()).unwrap();
    });
    let lines = both_ways(&dev);
    has(
        &lines,
        &format!("data extent {at}: extent item counts 2 references, found 1"),
    );
}

#[test]
fn a_free_range_missing_from_the_by_start_tree() {
    let (dev, _) = image();
    let mut gone = Key::MIN;
    damage(&dev, |tx| {
        // In a data group, which the commit of this damage leaves alone.
        let groups = tx.range(BLOCK_GROUP, &Key::MIN, &Key::MAX).unwrap();
        let data: Vec<(u64, u64)> = groups
            .iter()
            .filter(|(k, d)| {
                k.ty == BLOCK_GROUP_ITEM && BlockGroupItem::decode(d).unwrap().flags & BG_DATA != 0
            })
            .map(|(k, _)| (k.objectid, k.objectid + k.offset))
            .collect();
        let all = tx.range(FREE_BY_START, &Key::MIN, &Key::MAX).unwrap();
        gone = all
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| k.ty == FREE_EXTENT)
            .find(|k| data.iter().any(|&(s, e)| s <= k.objectid && k.objectid < e))
            .expect("a free range in a data group");
        tx.delete(FREE_BY_START, &gone).unwrap();
    });
    let lines = both_ways(&dev);
    let range = format!("free space {}+{}", gone.objectid, gone.offset);
    has(
        &lines,
        &format!("{range}: free but not in the by-start tree"),
    );
    has(
        &lines,
        &format!("{range}: by-start and by-length trees disagree"),
    );
}
