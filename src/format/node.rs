//! Tree block layout, and the one place where blocks are validated.
//!
//! A block is `nodesize` bytes: a 96-byte header, then
//! - in a leaf: an array of item headers `(key, data offset u32, data size u32)`
//!   growing forward, and the item data packed backward from the block's end,
//!   item 0's data last in the block;
//! - in an internal node: an array of pointers `(key, child bytenr u64,
//!   child generation u64)`.
//!
//! Decoding checks everything a hostile image could get wrong, so that the
//! layers above can trust a decoded [`Node`] (the btrfs-progs "tree checker"
//! idea): checksum, fsid, own address, level, item bounds, key order.

use super::key::{Key, KEY_SIZE};
use super::{crc, le_u32, le_u64, put_u32, put_u64};
use crate::error::{Error, Result};

pub const HEADER_SIZE: usize = 96;
pub const ITEM_HEADER_SIZE: usize = KEY_SIZE + 8;
pub const PTR_SIZE: usize = KEY_SIZE + 16;
/// Trees never grow taller than this; a deeper block is corrupt.
pub const MAX_LEVEL: u8 = 8;

const OFF_CSUM: usize = 0;
const OFF_FSID: usize = 32;
const OFF_BYTENR: usize = 48;
const OFF_GENERATION: usize = 56;
const OFF_OWNER: usize = 64;
const OFF_FLAGS: usize = 72;
const OFF_NRITEMS: usize = 80;
const OFF_LEVEL: usize = 84;

pub use super::leaf::{Item, ItemRef, Leaf};

/// One pointer of an internal node. The generation lets a reader detect a
/// stale or misdirected child block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptr {
    pub key: Key,
    pub bytenr: u64,
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Leaf(Leaf),
    Internal(Vec<Ptr>),
}

/// What an allocation costs beyond the bytes asked for (allocator
/// bookkeeping and size-class rounding), on average.
const ALLOCATION_OVERHEAD: usize = 16;

impl Body {
    /// Gives back the spare capacity a block's vectors gained while it was
    /// changed: a clean block keeps its entries as long as it is cached.
    pub fn shrink_to_fit(&mut self) {
        match self {
            Body::Leaf(items) => items.shrink_to_fit(),
            Body::Internal(ptrs) => ptrs.shrink_to_fit(),
        }
    }

    /// A copy with room for `extra` more entries: a block is copied to be
    /// changed, and a copy of exactly its length would be copied once
    /// more by the first insert that grows it.
    pub fn clone_with_room(&self, extra: usize) -> Body {
        match self {
            Body::Leaf(items) => Body::Leaf(items.clone_with_room(extra)),
            Body::Internal(ptrs) => {
                let mut copy = Vec::with_capacity(ptrs.len() + extra);
                copy.extend_from_slice(ptrs);
                Body::Internal(copy)
            }
        }
    }
}

/// A decoded tree block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub bytenr: u64,
    pub generation: u64,
    pub owner: u64,
    pub flags: u64,
    pub level: u8,
    pub body: Body,
}

impl Node {
    pub fn new_leaf(bytenr: u64, generation: u64, owner: u64) -> Node {
        Node {
            bytenr,
            generation,
            owner,
            flags: 0,
            level: 0,
            body: Body::Leaf(Leaf::new()),
        }
    }

    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    pub fn nritems(&self) -> usize {
        match &self.body {
            Body::Leaf(v) => v.len(),
            Body::Internal(v) => v.len(),
        }
    }

    pub fn first_key(&self) -> Option<Key> {
        match &self.body {
            Body::Leaf(v) => v.first_key(),
            Body::Internal(v) => v.first().map(|p| p.key),
        }
    }

    /// Memory this decoded block holds, for the cache's budget: the node
    /// and its entries (a leaf's slots and data buffer).
    pub fn memory_bytes(&self) -> usize {
        let entries = match &self.body {
            Body::Leaf(items) => items.memory_bytes() + ALLOCATION_OVERHEAD,
            Body::Internal(ptrs) => ptrs.capacity() * std::mem::size_of::<Ptr>(),
        };
        std::mem::size_of::<Node>() + ALLOCATION_OVERHEAD + entries
    }

    /// Bytes this block's content occupies when encoded.
    pub fn used_bytes(&self) -> usize {
        HEADER_SIZE
            + match &self.body {
                Body::Leaf(v) => v.content_bytes(),
                Body::Internal(v) => v.len() * PTR_SIZE,
            }
    }

    /// A leaf's items (none for an internal node).
    pub fn items(&self) -> &Leaf {
        static NONE: Leaf = Leaf::new();
        match &self.body {
            Body::Leaf(v) => v,
            Body::Internal(_) => &NONE,
        }
    }

    pub fn ptrs(&self) -> &[Ptr] {
        match &self.body {
            Body::Internal(v) => v,
            Body::Leaf(_) => &[],
        }
    }

    /// Encodes into `nodesize` bytes with the checksum filled in.
    pub fn encode(&self, fsid: &[u8; 16], nodesize: usize) -> Vec<u8> {
        let mut b = vec![0u8; nodesize];
        self.encode_into(fsid, &mut b);
        b
    }

    /// Encodes into `b` (zeroed, one block long) with the checksum filled
    /// in: a commit encodes its blocks straight into the buffers it
    /// writes.
    pub fn encode_into(&self, fsid: &[u8; 16], b: &mut [u8]) {
        b[OFF_FSID..OFF_FSID + 16].copy_from_slice(fsid);
        put_u64(b, OFF_BYTENR, self.bytenr);
        put_u64(b, OFF_GENERATION, self.generation);
        put_u64(b, OFF_OWNER, self.owner);
        put_u64(b, OFF_FLAGS, self.flags);
        put_u32(b, OFF_NRITEMS, self.nritems() as u32);
        b[OFF_LEVEL] = self.level;
        match &self.body {
            Body::Leaf(items) => encode_items(b, items),
            Body::Internal(ptrs) => {
                for (i, p) in ptrs.iter().enumerate() {
                    let at = HEADER_SIZE + i * PTR_SIZE;
                    p.key.encode(&mut b[at..]);
                    put_u64(b, at + KEY_SIZE, p.bytenr);
                    put_u64(b, at + KEY_SIZE + 8, p.generation);
                }
            }
        }
        let sum = crc(&b[OFF_FSID..]);
        put_u32(b, OFF_CSUM, sum);
    }

    /// Whether `b`, read from `bytenr` where a block was expected and
    /// found wanting, can be a write that never reached the disk: torn
    /// (its checksum fails) or stale (a block once written there whole:
    /// another generation, tree or filesystem). A block whose checksum
    /// holds but that does not decode for any other reason was written
    /// wrong: damage, not a lost write.
    pub fn could_be_lost_write(b: &[u8], bytenr: u64, fsid: &[u8; 16]) -> bool {
        if b.len() < HEADER_SIZE || le_u32(b, OFF_CSUM) != crc(&b[OFF_FSID..]) {
            return true;
        }
        &b[OFF_FSID..OFF_FSID + 16] != fsid || Node::decode(b, bytenr, fsid).is_ok()
    }

    /// Decodes and validates a block read from `bytenr`.
    pub fn decode(b: &[u8], bytenr: u64, fsid: &[u8; 16]) -> Result<Node> {
        let bad = |why: String| Error::corrupt(bytenr, why);
        if b.len() < HEADER_SIZE {
            return Err(bad(format!("block of {} bytes is too short", b.len())));
        }
        let stored = le_u32(b, OFF_CSUM);
        let actual = crc(&b[OFF_FSID..]);
        if stored != actual {
            return Err(bad(format!(
                "checksum mismatch: stored {stored:#010x}, computed {actual:#010x}"
            )));
        }
        if &b[OFF_FSID..OFF_FSID + 16] != fsid {
            return Err(bad("block belongs to another filesystem (fsid)".into()));
        }
        let own = le_u64(b, OFF_BYTENR);
        if own != bytenr {
            return Err(bad(format!(
                "block says it lives at {own} (misdirected write)"
            )));
        }
        let level = b[OFF_LEVEL];
        if level > MAX_LEVEL {
            return Err(bad(format!("level {level} exceeds {MAX_LEVEL}")));
        }
        let n = le_u32(b, OFF_NRITEMS) as usize;
        let body = if level == 0 {
            Body::Leaf(decode_items(b, n).map_err(bad)?)
        } else {
            Body::Internal(decode_ptrs(b, n).map_err(bad)?)
        };
        Ok(Node {
            bytenr,
            generation: le_u64(b, OFF_GENERATION),
            owner: le_u64(b, OFF_OWNER),
            flags: le_u64(b, OFF_FLAGS),
            level,
            body,
        })
    }
}

fn encode_items(b: &mut [u8], items: &Leaf) {
    let mut data_end = b.len();
    for (i, it) in items.iter().enumerate() {
        let at = HEADER_SIZE + i * ITEM_HEADER_SIZE;
        let start = data_end - it.data.len();
        it.key.encode(&mut b[at..]);
        put_u32(b, at + KEY_SIZE, start as u32);
        put_u32(b, at + KEY_SIZE + 4, it.data.len() as u32);
        b[start..data_end].copy_from_slice(it.data);
        data_end = start;
    }
}

fn decode_items(b: &[u8], n: usize) -> std::result::Result<Leaf, String> {
    let headers_end = n
        .checked_mul(ITEM_HEADER_SIZE)
        .and_then(|x| x.checked_add(HEADER_SIZE))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| format!("{n} items do not fit in the block"))?;
    let mut items = Vec::with_capacity(n);
    let mut data_end = b.len();
    let mut prev: Option<Key> = None;
    for i in 0..n {
        let at = HEADER_SIZE + i * ITEM_HEADER_SIZE;
        let key = Key::decode(&b[at..]);
        if prev.is_some_and(|p| p >= key) {
            return Err(format!("item {i} key {key} is not above the previous key"));
        }
        prev = Some(key);
        let start = le_u32(b, at + KEY_SIZE) as usize;
        let size = le_u32(b, at + KEY_SIZE + 4) as usize;
        if start.checked_add(size) != Some(data_end) || start < headers_end {
            return Err(format!(
                "item {i} data [{start}, +{size}) is not packed below {data_end}"
            ));
        }
        items.push((key, start, size));
        data_end = start;
    }
    // The data area, item 0's data last, copied once; slots point into it.
    let area = b[data_end..].to_vec();
    let slots = items
        .into_iter()
        .map(|(key, start, size)| (key, (start - data_end) as u32, size as u32));
    Ok(Leaf::from_parts(area, slots))
}

fn decode_ptrs(b: &[u8], n: usize) -> std::result::Result<Vec<Ptr>, String> {
    if n == 0 {
        return Err("internal node without pointers".into());
    }
    if n.checked_mul(PTR_SIZE)
        .and_then(|x| x.checked_add(HEADER_SIZE))
        > Some(b.len())
    {
        return Err(format!("{n} pointers do not fit in the block"));
    }
    let generation = le_u64(b, OFF_GENERATION);
    let mut ptrs = Vec::with_capacity(n);
    let mut prev: Option<Key> = None;
    for i in 0..n {
        let at = HEADER_SIZE + i * PTR_SIZE;
        let key = Key::decode(&b[at..]);
        if prev.is_some_and(|p| p >= key) {
            return Err(format!(
                "pointer {i} key {key} is not above the previous key"
            ));
        }
        prev = Some(key);
        let p = Ptr {
            key,
            bytenr: le_u64(b, at + KEY_SIZE),
            generation: le_u64(b, at + KEY_SIZE + 8),
        };
        if p.bytenr == 0 || !p.bytenr.is_multiple_of(u64::from(super::SECTORSIZE)) {
            return Err(format!("pointer {i} to unaligned block {}", p.bytenr));
        }
        if p.generation > generation {
            return Err(format!(
                "pointer {i} child generation {} is newer than the node's {generation}",
                p.generation
            ));
        }
        ptrs.push(p);
    }
    Ok(ptrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_roundtrip_and_corruption_detected() {
        let fsid = [7u8; 16];
        let mut n = Node::new_leaf(1 << 20, 3, 5);
        n.body = Body::Leaf(Leaf::from(vec![
            Item {
                key: Key::new(1, 1, 0),
                data: vec![1, 2, 3],
            },
            Item {
                key: Key::new(2, 1, 0),
                data: vec![],
            },
        ]));
        let b = n.encode(&fsid, 4096);
        assert_eq!(Node::decode(&b, 1 << 20, &fsid).unwrap(), n);
        assert!(Node::decode(&b, 2 << 20, &fsid).is_err());
        let mut c = b.clone();
        c[4000] ^= 1;
        assert!(Node::decode(&c, 1 << 20, &fsid).is_err());
    }
}
