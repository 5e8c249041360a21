//! The block cache: decoded clean tree blocks, bounded, least recently used
//! evicted first. A lookup only stamps the block it finds (commits and the
//! quota accounting make hundreds per millisecond); keeping the order is
//! left to eviction, which drops an eighth of the cache at a time.
//!
//! Only clean blocks live here. Dirty blocks belong to the running
//! transaction and blocks being written by a commit are pinned elsewhere
//! until their write completes, so eviction can never lose a change.

use crate::format::node::Node;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

/// A cached block and when it was last used.
struct Entry {
    node: Arc<Node>,
    used: u64,
}

/// A map keyed by block address (the dirty set, blocks in flight, the
/// cache), hashed by [`AddressHasher`].
pub type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;

/// A set of block addresses, hashed by [`AddressHasher`].
pub type BlockSet = std::collections::HashSet<u64, BuildHasherDefault<AddressHasher>>;

struct Inner {
    map: BlockMap<Entry>,
    tick: u64,
}

/// Fraction of the cache evicted at once when it is over capacity: a use
/// only stamps its entry, and eviction pays for the order in batches.
const EVICT_SHARE: usize = 8;

pub struct BlockCache {
    inner: Mutex<Inner>,
    capacity_blocks: usize,
}

impl BlockCache {
    pub fn new(capacity_blocks: usize) -> BlockCache {
        BlockCache {
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                tick: 0,
            }),
            capacity_blocks: capacity_blocks.max(16),
        }
    }

    /// Whether the block is cached, without counting as a use (read-ahead
    /// asks this and must not keep blocks alive).
    pub fn contains(&self, bytenr: u64) -> bool {
        crate::sync::lock(&self.inner).map.contains_key(&bytenr)
    }

    pub fn get(&self, bytenr: u64) -> Option<Arc<Node>> {
        let mut g = crate::sync::lock(&self.inner);
        g.tick += 1;
        let tick = g.tick;
        let e = g.map.get_mut(&bytenr)?;
        e.used = tick;
        Some(e.node.clone())
    }

    pub fn insert(&self, node: Arc<Node>) {
        let mut g = crate::sync::lock(&self.inner);
        g.tick += 1;
        let used = g.tick;
        g.map.insert(node.bytenr, Entry { node, used });
        if g.map.len() > self.capacity_blocks {
            let excess = g.map.len() - self.capacity_blocks;
            evict_least_recent(&mut g.map, excess + self.capacity_blocks / EVICT_SHARE);
        }
    }

    pub fn remove(&self, bytenr: u64) {
        crate::sync::lock(&self.inner).map.remove(&bytenr);
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.inner).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops the `n` entries used longest ago (stamps are unique).
fn evict_least_recent<S: std::hash::BuildHasher>(map: &mut HashMap<u64, Entry, S>, n: usize) {
    if n == 0 {
        return;
    }
    if n >= map.len() {
        map.clear();
        return;
    }
    let mut stamps: Vec<u64> = map.values().map(|e| e.used).collect();
    let (_, &mut cutoff, _) = stamps.select_nth_unstable(n - 1);
    map.retain(|_, e| e.used > cutoff);
}

/// Hashes block addresses: multiples of the block size, spread by one
/// multiplication (the map is internal, so no key is chosen by an
/// adversary).
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // High bits feed hashbrown's control bytes, low bits its buckets:
        // fold the product so both vary.
        let p = (v ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = p ^ (p >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::Body;

    fn node(bytenr: u64) -> Arc<Node> {
        Arc::new(Node {
            bytenr,
            generation: 1,
            owner: 5,
            flags: 0,
            level: 0,
            body: Body::Leaf(Vec::new()),
        })
    }

    #[test]
    fn keeps_what_was_used_last_and_stays_within_capacity() {
        let c = BlockCache::new(64);
        for b in 0..64u64 {
            c.insert(node(b * 4096));
        }
        // Block 0 is used again, so the oldest are 1, 2, ...
        assert!(c.get(0).is_some());
        c.insert(node(64 * 4096));
        assert!(c.len() <= 64, "{}", c.len());
        assert!(c.contains(0), "a block just used is kept");
        assert!(c.contains(64 * 4096), "the block just inserted is kept");
        assert!(!c.contains(4096), "the block used longest ago goes first");
        for b in 100..1000u64 {
            c.insert(node(b * 4096));
            assert!(c.len() <= 64);
        }
        assert!(c.contains(999 * 4096));
        c.remove(999 * 4096);
        assert!(!c.contains(999 * 4096));
    }
}
