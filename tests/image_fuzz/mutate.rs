//! The mutations: structure-aware changes to live tree blocks, each block
//! left with a valid checksum so the damage reaches the checks behind it.

use super::*;

pub(crate) fn tree_name(id: u64) -> String {
    match id {
        tree_id::ROOT => "root tree".into(),
        tree_id::EXTENT => "extent tree".into(),
        tree_id::BLOCK_GROUP => "block group tree".into(),
        tree_id::FS => "fs tree".into(),
        tree_id::CSUM => "csum tree".into(),
        tree_id::QUOTA => "quota tree".into(),
        tree_id::FREE_BY_START => "free-by-start tree".into(),
        tree_id::FREE_BY_LEN => "free-by-len tree".into(),
        tree_id::LOG => "fsync log".into(),
        id => format!("tree {id}"),
    }
}

pub(crate) fn block_name(b: &Block) -> String {
    let what = if b.level == 0 {
        "leaf".to_string()
    } else {
        format!("node L{}", b.level)
    };
    format!("{} {what} @{}", tree_name(b.tree), b.addr)
}

/// Values that break assumptions: boundaries, the device size, the ends
/// of the directory index and inode ranges, huge.
pub(crate) fn interesting(rng: &mut Rng) -> u64 {
    const V: [u64; 18] = [
        0,
        1,
        2,
        255,
        256,
        4095,
        4096,
        u32::MAX as u64,
        1 << 40,
        (1 << 40) - 1,
        (1 << 61),
        (1 << 62) - 1,
        1 << 62,
        i64::MAX as u64,
        u64::MAX,
        u64::MAX - 4095,
        IMAGE_SIZE,
        IMAGE_SIZE - 4096,
    ];
    match rng.below(4) {
        0 => rng.next(),
        _ => V[rng.below(V.len() as u64) as usize],
    }
}

/// A value near `old` or an interesting one.
pub(crate) fn nearby(rng: &mut Rng, old: u64) -> u64 {
    match rng.below(6) {
        0 => old.wrapping_add(1),
        1 => old.wrapping_sub(1),
        2 => old.wrapping_add(rng.below(8192)),
        3 => old ^ (1 << rng.below(64)),
        _ => interesting(rng),
    }
}

pub(crate) const KEY_TYPES: [u8; 24] = [
    INODE_ITEM,
    INODE_REF,
    INODE_EXTREF,
    XATTR_ITEM,
    ORPHAN_ITEM,
    DIR_LOG_INDEX,
    DIR_ITEM,
    DIR_INDEX,
    EXTENT_DATA,
    EXTENT_CSUM,
    ROOT_ITEM,
    ROOT_BACKREF,
    ROOT_REF,
    EXTENT_ITEM,
    TREE_BLOCK_REF,
    EXTENT_DATA_REF,
    SHARED_BLOCK_REF,
    SHARED_DATA_REF,
    BLOCK_GROUP_ITEM,
    FREE_EXTENT,
    LOG_INODE,
    LOG_RANGE,
    DEFAULT_SUBVOL,
    0,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    ItemField,
    KeyField,
    KeyOrder,
    ItemSwap,
    ItemDelete,
    ItemDup,
    ItemHeader,
    Header,
    GenerationWithParent,
    ChildPtr,
    BlockSwap,
    Renumber,
}

/// Kinds and their weights.
pub(crate) const KINDS: [(Kind, u64); 12] = [
    (Kind::ItemField, 5),
    (Kind::KeyField, 4),
    (Kind::KeyOrder, 1),
    (Kind::ItemSwap, 1),
    (Kind::ItemDelete, 3),
    (Kind::ItemDup, 1),
    (Kind::ItemHeader, 1),
    (Kind::Header, 2),
    (Kind::GenerationWithParent, 1),
    (Kind::ChildPtr, 2),
    (Kind::BlockSwap, 1),
    (Kind::Renumber, 2),
];

pub(crate) fn pick_weighted<T: Copy>(rng: &mut Rng, choices: &[(T, u64)]) -> Option<T> {
    let total: u64 = choices.iter().map(|c| c.1).sum();
    if total == 0 {
        return None;
    }
    let mut at = rng.below(total);
    for &(c, w) in choices {
        if at < w {
            return Some(c);
        }
        at -= w;
    }
    None
}

/// A live block passing `filter`, log blocks and file-tree leaves
/// weighted higher.
pub(crate) fn pick_block<'a>(
    rng: &mut Rng,
    blocks: &'a [Block],
    filter: impl Fn(&Block) -> bool,
) -> Option<&'a Block> {
    let choices: Vec<(usize, u64)> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| filter(b))
        .map(|(i, b)| {
            let w = if b.is_log() {
                8
            } else if b.is_file_leaf() {
                3
            } else {
                1
            };
            (i, w)
        })
        .collect();
    pick_weighted(rng, &choices).map(|i| &blocks[i])
}

/// Makes one change of kind `kind`; None if the kind found nothing to
/// change (the caller picks again).
pub(crate) fn mutate_one(
    img: &mut [u8],
    blocks: &[Block],
    kind: Kind,
    rng: &mut Rng,
) -> Option<String> {
    let ns = NODESIZE as usize;
    let leaf = |b: &Block| b.level == 0;
    match kind {
        Kind::ItemField
        | Kind::KeyField
        | Kind::ItemSwap
        | Kind::ItemDelete
        | Kind::ItemDup
        | Kind::KeyOrder
        | Kind::ItemHeader => {
            let b = pick_block(rng, blocks, leaf)?;
            let mut node = node_at(img, b.addr)?;
            let n = node.nritems();
            if n == 0 {
                return None;
            }
            let i = rng.below(n as u64) as usize;
            let what = match kind {
                Kind::KeyOrder => key_order(img, b.addr, n, rng)?,
                Kind::ItemHeader => item_header(img, b.addr, n, i, rng),
                _ => {
                    let what = change_item(&mut node, i, kind, rng)?;
                    if !store(img, &node) {
                        return None;
                    }
                    what
                }
            };
            Some(format!("{}: {what}", block_name(b)))
        }
        Kind::Header => {
            let b = pick_block(rng, blocks, |_| true)?;
            let at = b.addr as usize;
            let before = img[at..at + HEADER_SIZE].to_vec();
            let what = match rng.below(5) {
                0 => {
                    let old = get_u64(img, at + OFF_GENERATION);
                    let v = nearby(rng, old);
                    set_u64(img, at + OFF_GENERATION, v);
                    format!("header generation {old} -> {v}")
                }
                1 => {
                    let old = get_u64(img, at + OFF_OWNER);
                    let v = [1, 2, 5, 7, 256, 257, tree_id::LOG, rng.next()][rng.below(8) as usize];
                    set_u64(img, at + OFF_OWNER, v);
                    format!("header owner {old} -> {v}")
                }
                2 => {
                    let old = img[at + OFF_LEVEL];
                    let v = [old.wrapping_add(1), old.wrapping_sub(1), 0, 1, 8, 9]
                        [rng.below(6) as usize];
                    img[at + OFF_LEVEL] = v;
                    format!("header level {old} -> {v}")
                }
                3 => {
                    let old = get_u32(img, at + OFF_NRITEMS);
                    let v = [old.wrapping_add(1), old.wrapping_sub(1), 0, u32::MAX]
                        [rng.below(4) as usize];
                    set_u32(img, at + OFF_NRITEMS, v);
                    format!("header nritems {old} -> {v}")
                }
                _ => {
                    let old = get_u64(img, at + OFF_FLAGS);
                    let v = nearby(rng, old);
                    set_u64(img, at + OFF_FLAGS, v);
                    format!("header flags {old:#x} -> {v:#x}")
                }
            };
            if img[at..at + HEADER_SIZE] == before[..] {
                return None;
            }
            reseal(img, b.addr);
            Some(format!("{}: {what}", block_name(b)))
        }
        Kind::GenerationWithParent => {
            let b = pick_block(rng, blocks, |b| b.parent.is_some())?;
            let (parent, slot) = b.parent?;
            let at = b.addr as usize;
            let old = get_u64(img, at + OFF_GENERATION);
            let v = match rng.below(3) {
                0 => old.saturating_sub(1),
                1 => old.saturating_sub(1 + rng.below(old.max(1))),
                _ => 1,
            };
            set_u64(img, at + OFF_GENERATION, v);
            reseal(img, b.addr);
            let p = parent as usize + HEADER_SIZE + slot * PTR_SIZE + KEY_SIZE + 8;
            set_u64(img, p, v);
            reseal(img, parent);
            Some(format!(
                "{}: generation {old} -> {v}, parent @{parent} slot {slot} patched to match",
                block_name(b)
            ))
        }
        Kind::ChildPtr => {
            let b = pick_block(rng, blocks, |b| b.level > 0)?;
            let at = b.addr as usize;
            let n = get_u32(img, at + OFF_NRITEMS) as usize;
            if n == 0 || HEADER_SIZE + n * PTR_SIZE > ns {
                return None;
            }
            let slot = rng.below(n as u64) as usize;
            let p = at + HEADER_SIZE + slot * PTR_SIZE;
            let what = match rng.below(4) {
                0 | 1 => {
                    let old = get_u64(img, p + KEY_SIZE);
                    let same_level: Vec<&Block> =
                        blocks.iter().filter(|o| o.level + 1 == b.level).collect();
                    let v = match rng.below(4) {
                        0 | 1 if !same_level.is_empty() => {
                            same_level[rng.below(same_level.len() as u64) as usize].addr
                        }
                        2 => blocks[rng.below(blocks.len() as u64) as usize].addr,
                        _ => nearby(rng, old) & !4095,
                    };
                    set_u64(img, p + KEY_SIZE, v);
                    format!("pointer {slot} address {old} -> {v}")
                }
                2 => {
                    let old = get_u64(img, p + KEY_SIZE + 8);
                    let v = nearby(rng, old);
                    set_u64(img, p + KEY_SIZE + 8, v);
                    format!("pointer {slot} generation {old} -> {v}")
                }
                _ => {
                    let key = canopy::Key::decode(&img[p..]);
                    let mut k = key;
                    match rng.below(3) {
                        0 => k.objectid = nearby(rng, k.objectid),
                        1 => k.ty = KEY_TYPES[rng.below(KEY_TYPES.len() as u64) as usize],
                        _ => k.offset = nearby(rng, k.offset),
                    }
                    k.encode(&mut img[p..p + KEY_SIZE]);
                    format!("pointer {slot} key {key} -> {k}")
                }
            };
            reseal(img, b.addr);
            Some(format!("{}: {what}", block_name(b)))
        }
        Kind::Renumber => renumber(img, blocks, rng),
        Kind::BlockSwap => {
            let dst = pick_block(rng, blocks, |_| true)?;
            let src = if rng.below(2) == 0 {
                pick_block(rng, blocks, |o| {
                    o.addr != dst.addr && o.tree == dst.tree && o.level == dst.level
                })
            } else {
                pick_block(rng, blocks, |o| o.addr != dst.addr)
            }?;
            let copy = img[src.addr as usize..src.addr as usize + ns].to_vec();
            img[dst.addr as usize..dst.addr as usize + ns].copy_from_slice(&copy);
            set_u64(img, dst.addr as usize + OFF_BYTENR, dst.addr);
            reseal(img, dst.addr);
            Some(format!(
                "{} overwritten by a copy of {}",
                block_name(dst),
                block_name(src)
            ))
        }
    }
}

/// The entries of a directory item, directory index or inode
/// back-reference: (start in the data, inode, index, name).
pub(crate) fn entries(data: &[u8]) -> Vec<(usize, u64, u64, Vec<u8>)> {
    let mut out = vec![];
    let mut at = 0;
    while at + 19 <= data.len() {
        let ino = u64::from_le_bytes(data[at..at + 8].try_into().expect("8"));
        let index = u64::from_le_bytes(data[at + 9..at + 17].try_into().expect("8"));
        let len = usize::from(u16::from_le_bytes([data[at + 17], data[at + 18]]));
        let Some(name) = data.get(at + 19..at + 19 + len) else {
            break;
        };
        out.push((at, ino, index, name.to_vec()));
        at += 19 + len;
    }
    out
}

pub(crate) const NAMED: [u8; 4] = [DIR_ITEM, DIR_INDEX, INODE_REF, INODE_EXTREF];

/// One name given another directory index everywhere it is recorded in
/// its tree (the directory item, the index item's key and entry, the
/// inode's back-reference), so the items still agree: an index at the
/// end of the range, past it, or colliding.
pub(crate) fn renumber(img: &mut [u8], blocks: &[Block], rng: &mut Rng) -> Option<String> {
    let b = pick_block(rng, blocks, |b| b.is_file_leaf())?;
    let node = node_at(img, b.addr)?;
    let named: Vec<_> = node
        .items()
        .iter()
        .filter(|i| NAMED.contains(&i.key.ty))
        .collect();
    let it = named.get(rng.below(named.len().max(1) as u64) as usize)?;
    let (_, ino, old, name) = entries(it.data).into_iter().next()?;
    // (directory, inode) of the name.
    let (dir, child) = if it.key.ty == DIR_ITEM || it.key.ty == DIR_INDEX {
        (it.key.objectid, ino)
    } else {
        (ino, it.key.objectid)
    };
    let v = match rng.below(10) {
        0 => (1 << 62) - 2,
        1 => (1 << 62) - 1,
        2 => 1 << 62,
        3 => 1 << 63,
        4 => u64::MAX,
        5 => u64::from(u32::MAX) + 1,
        6 => old + 1,
        7 => 2,
        8 => 1,
        _ => rng.next(),
    };
    let mut touched = 0;
    for o in blocks.iter().filter(|o| o.level == 0 && o.tree == b.tree) {
        let Some(mut n) = node_at(img, o.addr) else {
            continue;
        };
        let Body::Leaf(leaf) = &mut n.body else {
            continue;
        };
        let mut items = leaf.edit();
        let mut changed = false;
        for item in items.iter_mut().filter(|i| NAMED.contains(&i.key.ty)) {
            let on_dir = item.key.ty == DIR_ITEM || item.key.ty == DIR_INDEX;
            for (at, ino, index, nm) in entries(&item.data) {
                let pair = if on_dir {
                    (item.key.objectid, ino)
                } else {
                    (ino, item.key.objectid)
                };
                if pair != (dir, child) || nm != name || index != old {
                    continue;
                }
                item.data[at + 9..at + 17].copy_from_slice(&v.to_le_bytes());
                if item.key.ty == DIR_INDEX {
                    item.key.offset = v;
                }
                changed = true;
                touched += 1;
            }
        }
        if changed {
            items.sort_by_key(|i| i.key);
            items.dedup_by_key(|i| i.key);
            drop(items);
            if !store(img, &n) {
                return None;
            }
        }
    }
    (touched > 0).then(|| {
        format!(
            "{}: {:?} (inode {child} in directory {dir}) index {old} -> {v} in {touched} items",
            tree_name(b.tree),
            String::from_utf8_lossy(&name)
        )
    })
}

/// A decoded-item change to item `i` of a leaf, re-encoded sorted.
pub(crate) fn change_item(node: &mut Node, i: usize, kind: Kind, rng: &mut Rng) -> Option<String> {
    let Body::Leaf(leaf) = &mut node.body else {
        return None;
    };
    let mut items = leaf.edit();
    let key = items[i].key;
    let what = match kind {
        Kind::ItemField => {
            let it = &mut items[i];
            match rng.below(6) {
                0..=3 if !it.data.is_empty() => {
                    let width = [8usize, 4, 2, 1][rng.below(4) as usize].min(it.data.len());
                    let off = rng.below((it.data.len() - width + 1) as u64) as usize;
                    let mut old = [0u8; 8];
                    old[..width].copy_from_slice(&it.data[off..off + width]);
                    let old = u64::from_le_bytes(old);
                    let v = match (width, rng.below(4)) {
                        (4, 0) => u64::from(
                            [
                                libc::S_IFLNK | 0o777,
                                libc::S_IFDIR | 0o755,
                                libc::S_IFREG | 0o644,
                            ][rng.below(3) as usize],
                        ),
                        (1, 0) => [0, 1, 2, 3, 4, 255][rng.below(6) as usize],
                        _ => nearby(rng, old),
                    };
                    it.data[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
                    format!("item {i} {key}: {width}-byte field at {off}: {old:#x} -> {v:#x}")
                }
                4 if !it.data.is_empty() => {
                    let off = rng.below(it.data.len() as u64) as usize;
                    let bit = rng.below(8);
                    it.data[off] ^= 1 << bit;
                    format!("item {i} {key}: bit {bit} of byte {off} flipped")
                }
                _ => {
                    let old = it.data.len();
                    let len = match rng.below(3) {
                        0 => old.saturating_sub(1 + rng.below(8) as usize),
                        1 => old + 1 + rng.below(8) as usize,
                        _ => rng.below(old as u64 + 40) as usize,
                    };
                    it.data.resize(len, 0xa5);
                    format!("item {i} {key}: data resized {old} -> {len}")
                }
            }
        }
        Kind::KeyField => {
            let mut k = key;
            match rng.below(3) {
                0 => k.objectid = nearby(rng, k.objectid),
                1 => k.ty = KEY_TYPES[rng.below(KEY_TYPES.len() as u64) as usize],
                _ => k.offset = nearby(rng, k.offset),
            }
            if items.iter().any(|o| o.key == k) {
                return None;
            }
            items[i].key = k;
            format!("item {i} key {key} -> {k}")
        }
        Kind::ItemSwap => {
            let same: Vec<usize> = (0..items.len())
                .filter(|&j| j != i && items[j].key.ty == key.ty)
                .collect();
            let j = *same.get(rng.below(same.len().max(1) as u64) as usize)?;
            let data = std::mem::take(&mut items[i].data);
            items[i].data = std::mem::replace(&mut items[j].data, data);
            format!("data of items {key} and {} swapped", items[j].key)
        }
        Kind::ItemDelete => {
            items.remove(i);
            format!("item {i} {key} deleted")
        }
        Kind::ItemDup => {
            let mut copy = items[i].clone();
            if rng.below(2) == 0 {
                copy.key.offset = copy.key.offset.wrapping_add(1);
            } else {
                copy.key.objectid = copy.key.objectid.wrapping_add(1);
            }
            if items.iter().any(|o| o.key == copy.key) {
                return None;
            }
            let k = copy.key;
            items.push(copy);
            format!("item {i} {key} duplicated as {k}")
        }
        _ => return None,
    };
    items.sort_by_key(|i| i.key);
    Some(what)
}

/// Two item keys swapped in place: the leaf is no longer sorted.
pub(crate) fn key_order(img: &mut [u8], addr: u64, n: usize, rng: &mut Rng) -> Option<String> {
    if n < 2 {
        return None;
    }
    let i = rng.below(n as u64 - 1) as usize;
    let j = if rng.below(2) == 0 {
        i + 1
    } else {
        rng.below(n as u64) as usize
    };
    if i == j {
        return None;
    }
    let at = |k: usize| addr as usize + HEADER_SIZE + k * ITEM_HEADER_SIZE;
    let a = img[at(i)..at(i) + KEY_SIZE].to_vec();
    let b = img[at(j)..at(j) + KEY_SIZE].to_vec();
    img[at(i)..at(i) + KEY_SIZE].copy_from_slice(&b);
    img[at(j)..at(j) + KEY_SIZE].copy_from_slice(&a);
    reseal(img, addr);
    Some(format!(
        "keys of items {i} ({}) and {j} ({}) swapped",
        canopy::Key::decode(&a),
        canopy::Key::decode(&b)
    ))
}

/// An item header's data offset or size changed (raw bytes).
pub(crate) fn item_header(img: &mut [u8], addr: u64, n: usize, i: usize, rng: &mut Rng) -> String {
    let h = addr as usize + HEADER_SIZE + i * ITEM_HEADER_SIZE + KEY_SIZE;
    let (field, at) = if rng.below(2) == 0 {
        ("offset", h)
    } else {
        ("size", h + 4)
    };
    let old = get_u32(img, at);
    let other = {
        let j = rng.below(n as u64) as usize;
        get_u32(
            img,
            addr as usize + HEADER_SIZE + j * ITEM_HEADER_SIZE + KEY_SIZE,
        )
    };
    let v = match rng.below(7) {
        0 => old.wrapping_add(1),
        1 => old.wrapping_sub(1),
        2 => old.wrapping_add(8),
        3 => old.wrapping_sub(8),
        4 => other,
        5 => [0, NODESIZE, NODESIZE - 1, u32::MAX][rng.below(4) as usize],
        _ => rng.next() as u32,
    };
    set_u32(img, at, v);
    reseal(img, addr);
    format!("item {i} header data {field} {old} -> {v}")
}

/// 1 to 3 changes (mostly 1, so a violation names its cause).
pub(crate) fn mutate(img: &mut [u8], blocks: &[Block], rng: &mut Rng) -> Vec<String> {
    let count = [1, 1, 1, 1, 1, 2, 2, 3][rng.below(8) as usize];
    let mut done = vec![];
    let mut tries = 0;
    while done.len() < count && tries < 50 {
        tries += 1;
        let Some(kind) = pick_weighted(rng, &KINDS) else {
            break;
        };
        if let Some(what) = mutate_one(img, blocks, kind, rng) {
            done.push(format!("{kind:?}: {what}"));
        }
    }
    done
}
