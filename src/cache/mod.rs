//! The block cache: decoded clean tree blocks, bounded in bytes of
//! memory, least recently used evicted first. A lookup only stamps the
//! block it finds (commits and the quota accounting make hundreds per
//! millisecond); keeping the order is left to eviction, which drops an
//! eighth of the budget at a time.
//!
//! The bound is memory, not blocks: a decoded leaf costs more than its
//! bytes on disk (an item header and an allocation per item), and a
//! leaf's share of that overhead depends on how many items it holds, so a
//! count of blocks said little about what the daemon holds (issue 54: a
//! budget of 16,384 blocks came to ~470 MB after a million creates).
//!
//! Only clean blocks live here. Dirty blocks belong to the running
//! transaction and blocks being written by a commit are pinned elsewhere
//! until their write completes, so eviction can never lose a change.

use crate::format::node::Node;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

/// A cached block, when it was last used, and the memory it holds.
struct Entry {
    node: Arc<Node>,
    used: u64,
    bytes: usize,
}

/// A map keyed by block address (the dirty set, blocks in flight, the
/// cache), hashed by [`AddressHasher`].
pub type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;

/// A set of block addresses, hashed by [`AddressHasher`].
pub type BlockSet = std::collections::HashSet<u64, BuildHasherDefault<AddressHasher>>;

struct Inner {
    map: BlockMap<Entry>,
    tick: u64,
    /// Sum of the entries' `bytes`.
    bytes: usize,
}

/// Fraction of the budget evicted at once when the cache is over it: a
/// use only stamps its entry, and eviction pays for the order in batches.
const EVICT_SHARE: usize = 8;

/// The smallest budget: a few blocks of the largest node size, so that
/// a walk down one path always fits.
pub const MIN_BYTES: usize = 16 * 65536;

/// The default budget (the `cache_size` mount option). A cached leaf
/// holds about one and a half times its bytes in the allocator's pages
/// (leaves of every size, evicted in any order, leave pages part-used), so
/// the budget is most of the daemon's memory: after a million creates in
/// 1,000 directories it held 239-244 MB with 128M and 149-189 MB with 64M,
/// creating as fast (issue 54).
pub const DEFAULT_BYTES: usize = 64 << 20;

pub struct BlockCache {
    inner: Mutex<Inner>,
    capacity_bytes: usize,
}

impl BlockCache {
    /// A cache holding at most `capacity_bytes` of decoded blocks (see
    /// [`Node::memory_bytes`]), and never less than [`MIN_BYTES`].
    pub fn new(capacity_bytes: usize) -> BlockCache {
        BlockCache {
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                tick: 0,
                bytes: 0,
            }),
            capacity_bytes: capacity_bytes.max(MIN_BYTES),
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
        let bytes = node.memory_bytes();
        let mut g = crate::sync::lock(&self.inner);
        g.tick += 1;
        let used = g.tick;
        g.bytes += bytes;
        if let Some(old) = g.map.insert(node.bytenr, Entry { node, used, bytes }) {
            g.bytes -= old.bytes;
        }
        if g.bytes > self.capacity_bytes {
            let target = self.capacity_bytes - self.capacity_bytes / EVICT_SHARE;
            evict_least_recent(&mut g, target);
        }
    }

    pub fn remove(&self, bytenr: u64) {
        let mut g = crate::sync::lock(&self.inner);
        if let Some(old) = g.map.remove(&bytenr) {
            g.bytes -= old.bytes;
        }
    }

    /// Memory the cached blocks hold, in bytes.
    pub fn bytes(&self) -> usize {
        crate::sync::lock(&self.inner).bytes
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.inner).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops the entries used longest ago until the cache holds at most
/// `target` bytes.
fn evict_least_recent(g: &mut Inner, target: usize) {
    let mut by_age: Vec<(u64, u64, usize)> =
        g.map.iter().map(|(&b, e)| (e.used, b, e.bytes)).collect();
    by_age.sort_unstable();
    for (_, bytenr, bytes) in by_age {
        if g.bytes <= target {
            break;
        }
        g.map.remove(&bytenr);
        g.bytes -= bytes;
    }
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
            body: Body::Leaf(crate::format::node::Leaf::new()),
        })
    }

    #[test]
    fn keeps_what_was_used_last_and_stays_within_its_bytes() {
        let each = node(0).memory_bytes();
        let cap = MIN_BYTES;
        let fit = (cap / each) as u64;
        let c = BlockCache::new(cap);
        for b in 0..fit {
            c.insert(node(b * 4096));
        }
        assert_eq!(c.len() as u64, fit);
        // Block 0 is used again, so the oldest are 1, 2, ...
        assert!(c.get(0).is_some());
        c.insert(node(fit * 4096));
        assert!(c.bytes() <= cap, "{}", c.bytes());
        assert!(c.contains(0), "a block just used is kept");
        assert!(c.contains(fit * 4096), "the block just inserted is kept");
        assert!(!c.contains(4096), "the block used longest ago goes first");
        for b in fit + 1..4 * fit {
            c.insert(node(b * 4096));
            assert!(c.bytes() <= cap);
            assert_eq!(
                c.bytes(),
                c.len() * each,
                "the sum follows inserts and evictions"
            );
        }
        assert!(c.contains((4 * fit - 1) * 4096));
        c.remove((4 * fit - 1) * 4096);
        assert!(!c.contains((4 * fit - 1) * 4096));
        assert_eq!(c.bytes(), c.len() * each);
    }
}
