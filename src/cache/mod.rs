//! The block cache: decoded clean tree blocks, bounded, least recently used
//! evicted first.
//!
//! Only clean blocks live here. Dirty blocks belong to the running
//! transaction and blocks being written by a commit are pinned elsewhere
//! until their write completes, so eviction can never lose a change.

use crate::format::node::Node;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

struct Lru {
    map: HashMap<u64, (Arc<Node>, u64)>,
    order: BTreeMap<u64, u64>,
    tick: u64,
}

pub struct BlockCache {
    inner: Mutex<Lru>,
    capacity_blocks: usize,
}

impl BlockCache {
    pub fn new(capacity_blocks: usize) -> BlockCache {
        BlockCache {
            inner: Mutex::new(Lru {
                map: HashMap::new(),
                order: BTreeMap::new(),
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
        let lru = &mut *g;
        lru.tick += 1;
        let tick = lru.tick;
        let (node, t) = lru.map.get_mut(&bytenr)?;
        lru.order.remove(t);
        *t = tick;
        lru.order.insert(tick, bytenr);
        Some(node.clone())
    }

    pub fn insert(&self, node: Arc<Node>) {
        let mut g = crate::sync::lock(&self.inner);
        let lru = &mut *g;
        lru.tick += 1;
        let tick = lru.tick;
        if let Some((_, old)) = lru.map.insert(node.bytenr, (node.clone(), tick)) {
            lru.order.remove(&old);
        }
        lru.order.insert(tick, node.bytenr);
        while lru.map.len() > self.capacity_blocks {
            let Some((_, victim)) = lru.order.pop_first() else {
                break;
            };
            lru.map.remove(&victim);
        }
    }

    pub fn remove(&self, bytenr: u64) {
        let mut g = crate::sync::lock(&self.inner);
        if let Some((_, t)) = g.map.remove(&bytenr) {
            g.order.remove(&t);
        }
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.inner).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
