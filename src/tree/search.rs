//! Read-only access: point lookups and cursors that walk items in key order
//! in either direction, crossing leaves through the path kept in the cursor.

use super::{child_slot, read_child, BlockRead, RootPtr};
use crate::error::Result;
use crate::format::node::{ItemRef, Node};
use crate::format::Key;
use std::sync::Arc;

/// The data of the item with exactly `key`, if present.
pub fn get<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, key: &Key) -> Result<Option<Vec<u8>>> {
    get_with(b, root, key, <[u8]>::to_vec)
}

/// What `f` makes of the data of the item with exactly `key`, if present,
/// read where the item lies: a caller that decodes the item (an inode, a
/// directory entry: most lookups) copies nothing first.
pub fn get_with<B: BlockRead + ?Sized, R>(
    b: &B,
    root: &RootPtr,
    key: &Key,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<Option<R>> {
    let mut node = b.read_node(root.bytenr, root.generation)?;
    while !node.is_leaf() {
        let ptrs = node.ptrs();
        let ptr = ptrs[child_slot(ptrs, key)];
        node = read_child(b, &ptr, node.level)?;
    }
    let items = node.items();
    Ok(items.search(key).ok().map(|i| f(items.data(i))))
}

/// What `f` makes of the data of the item with each of `keys` (ascending;
/// repeats allowed), in that order; `None` where a key is absent. The
/// path from the root is kept between keys and climbed only as far as
/// the next key leaves it, so keys that share a leaf cost one descent: a
/// directory listing's inodes, looked up in inode order, mostly do.
pub fn get_many_with<B: BlockRead + ?Sized, R>(
    b: &B,
    root: &RootPtr,
    keys: &[Key],
    mut f: impl FnMut(&Key, &[u8]) -> R,
) -> Result<Vec<Option<R>>> {
    debug_assert!(keys.windows(2).all(|w| w[0] <= w[1]));
    let mut out = Vec::with_capacity(keys.len());
    // Each node on the path with the key its subtree ends before (None:
    // the tree's end).
    let mut path: Vec<(Arc<Node>, Option<Key>)> =
        vec![(b.read_node(root.bytenr, root.generation)?, None)];
    for key in keys {
        while path.len() > 1
            && path
                .last()
                .is_some_and(|(_, end)| end.is_some_and(|e| *key >= e))
        {
            path.pop();
        }
        while let Some((node, end)) = path.last().filter(|(n, _)| !n.is_leaf()) {
            let ptrs = node.ptrs();
            let slot = child_slot(ptrs, key);
            let child_end = ptrs.get(slot + 1).map(|p| p.key).or(*end);
            let child = read_child(b, &ptrs[slot], node.level)?;
            path.push((child, child_end));
        }
        let leaf = match path.last() {
            Some((leaf, _)) => leaf.items(),
            None => break,
        };
        out.push(leaf.search(key).ok().map(|i| f(key, leaf.data(i))));
    }
    Ok(out)
}

/// Number of blocks in the tree at `root`. Reads only the internal nodes
/// (a level-1 node's pointers count its leaves), so it costs about one
/// block read per hundred blocks counted.
pub fn count_blocks<B: BlockRead + ?Sized>(b: &B, root: &RootPtr) -> Result<u64> {
    let mut total = 0;
    visit_blocks(b, root, |_| total += 1)?;
    Ok(total)
}

/// Addresses of every block of the tree at `root` (reads the internal
/// nodes only, like [`count_blocks`]).
pub fn block_addresses<B: BlockRead + ?Sized>(b: &B, root: &RootPtr) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    visit_blocks(b, root, |bytenr| out.push(bytenr))?;
    Ok(out)
}

/// Calls `f` with the address of every block of the tree, reading the
/// internal nodes only.
fn visit_blocks<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    mut f: impl FnMut(u64),
) -> Result<()> {
    f(root.bytenr);
    if root.level == 0 {
        return Ok(());
    }
    let mut stack = vec![b.read_node(root.bytenr, root.generation)?];
    while let Some(node) = stack.pop() {
        for p in node.ptrs() {
            f(p.bytenr);
            if node.level > 1 {
                stack.push(read_child(b, p, node.level)?);
            }
        }
    }
    Ok(())
}

/// Starts reading the leaves that hold keys `first..=last` (at most
/// `max` of them), reading only the internal nodes above them: a reader
/// about to look up items across a range (a sequential file reader's
/// checksums) then waits for the disk once, not once per leaf.
pub fn prefetch_leaves<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    first: &Key,
    last: &Key,
    max: usize,
) -> Result<()> {
    if root.level == 0 {
        return Ok(());
    }
    let mut node = b.read_node(root.bytenr, root.generation)?;
    // Down the path of `first`; the leaves that follow it under the
    // same parent are the ones a walk to `last` reads next.
    while node.level > 1 {
        let Some(ptr) = node.ptrs().get(child_slot(node.ptrs(), first)) else {
            return Ok(());
        };
        node = read_child(b, ptr, node.level)?;
    }
    let ptrs = node.ptrs();
    if ptrs.is_empty() {
        return Ok(());
    }
    let from = child_slot(ptrs, first);
    // Keys out of order (a damaged node) must not make the range run
    // backwards; `child_slot` never passes the last slot, so neither does
    // `to`.
    let to = child_slot(ptrs, last).clamp(from, from + max.max(1) - 1);
    let leaves: Vec<u64> = ptrs[from..=to].iter().map(|p| p.bytenr).collect();
    b.prefetch(&leaves);
    Ok(())
}

/// Leaves per read-ahead step of a forward walk.
const READAHEAD_LEAVES: usize = 16;

/// A position in a tree: the nodes from root to leaf and the slot in each.
/// It holds its blocks, so it stays valid (as a view of the moment it was
/// made) while the tree changes; re-seek after modifying the tree.
pub struct Cursor {
    path: Vec<(Arc<Node>, usize)>,
}

impl Cursor {
    /// Positions at the first item with key >= `key` (possibly past the end).
    pub fn seek<B: BlockRead + ?Sized>(b: &B, root: &RootPtr, key: &Key) -> Result<Cursor> {
        let mut path = Vec::with_capacity(usize::from(root.level) + 1);
        let mut node = b.read_node(root.bytenr, root.generation)?;
        while !node.is_leaf() {
            let slot = child_slot(node.ptrs(), key);
            let ptr = node.ptrs()[slot];
            let child = read_child(b, &ptr, node.level)?;
            path.push((node, slot));
            node = child;
        }
        let slot = match node.items().search(key) {
            Ok(i) | Err(i) => i,
        };
        path.push((node, slot));
        let mut c = Cursor { path };
        c.settle_forward(b)?;
        Ok(c)
    }

    /// Positions at the last item with key <= `key`, if any.
    pub fn seek_le<B: BlockRead + ?Sized>(
        b: &B,
        root: &RootPtr,
        key: &Key,
    ) -> Result<Option<Cursor>> {
        let mut c = Cursor::seek(b, root, key)?;
        if c.item().is_some_and(|it| it.key == *key) {
            return Ok(Some(c));
        }
        Ok(c.prev(b)?.is_some().then_some(c))
    }

    /// The item under the cursor; None past the end.
    pub fn item(&self) -> Option<ItemRef<'_>> {
        let (leaf, slot) = self.path.last()?;
        leaf.items().get(*slot)
    }

    /// The leaf under the cursor and the slot in it.
    pub fn leaf(&self) -> Option<(&Arc<Node>, usize)> {
        self.path.last().map(|(n, s)| (n, *s))
    }

    /// Moves to the next item and returns it.
    pub fn next<B: BlockRead + ?Sized>(&mut self, b: &B) -> Result<Option<ItemRef<'_>>> {
        if let Some((_, slot)) = self.path.last_mut() {
            *slot += 1;
        }
        self.settle_forward(b)?;
        Ok(self.item())
    }

    /// Moves to the previous item and returns it; at the first item, stays
    /// and returns None.
    pub fn prev<B: BlockRead + ?Sized>(&mut self, b: &B) -> Result<Option<ItemRef<'_>>> {
        let depth = self.path.len();
        if self.path[depth - 1].1 > 0 {
            self.path[depth - 1].1 -= 1;
            return Ok(self.item());
        }
        // Find the lowest ancestor that has a slot to the left.
        let Some(up) = (0..depth - 1).rev().find(|&d| self.path[d].1 > 0) else {
            return Ok(None);
        };
        self.path[up].1 -= 1;
        for d in up..depth - 1 {
            let (node, slot) = &self.path[d];
            let ptr = node.ptrs()[*slot];
            let child = read_child(b, &ptr, node.level)?;
            let last = child.nritems().saturating_sub(1);
            self.path[d + 1] = (child, last);
        }
        Ok(self.item())
    }

    /// Moves to the first item of the next leaf; None at the last leaf.
    /// Walking a range leaf by leaf visits each leaf exactly once.
    pub fn next_leaf<B: BlockRead + ?Sized>(&mut self, b: &B) -> Result<Option<ItemRef<'_>>> {
        let depth = self.path.len();
        let n = self.path[depth - 1].0.nritems();
        let before = self.path[depth - 1].0.bytenr;
        self.path[depth - 1].1 = n;
        self.settle_forward(b)?;
        if self.path[depth - 1].0.bytenr == before {
            return Ok(None);
        }
        Ok(self.item())
    }

    /// Moves to the last item of the previous leaf; None at the first leaf
    /// (the cursor then stays on the first item).
    pub fn prev_leaf<B: BlockRead + ?Sized>(&mut self, b: &B) -> Result<Option<ItemRef<'_>>> {
        let depth = self.path.len();
        self.path[depth - 1].1 = 0;
        self.prev(b)
    }

    /// If the leaf slot is past its last item, moves to the first item of
    /// the next leaf (visiting each leaf once).
    fn settle_forward<B: BlockRead + ?Sized>(&mut self, b: &B) -> Result<()> {
        let depth = self.path.len();
        let (leaf, slot) = &self.path[depth - 1];
        if *slot < leaf.nritems() {
            return Ok(());
        }
        let Some(up) = (0..depth - 1)
            .rev()
            .find(|&d| self.path[d].1 + 1 < self.path[d].0.nritems())
        else {
            return Ok(());
        };
        self.path[up].1 += 1;
        for d in up..depth - 1 {
            let (node, slot) = &self.path[d];
            let ptr = node.ptrs()[*slot];
            if d + 2 == depth {
                self.read_ahead(b, d);
            }
            let child = read_child(b, &ptr, node.level)?;
            self.path[d + 1] = (child, 0);
        }
        Ok(())
    }

    /// A forward walk reads leaves in order: every READAHEAD_LEAVES leaves,
    /// ask for the next 2 * READAHEAD_LEAVES, so a cold walk (a seek
    /// through a file of many extents) waits on the disk once per batch,
    /// not once per leaf. `d` is the level of the leaves' parent in the path.
    fn read_ahead<B: BlockRead + ?Sized>(&self, b: &B, d: usize) {
        let (parent, slot) = &self.path[d];
        if slot % READAHEAD_LEAVES != 0 {
            return;
        }
        let next: Vec<u64> = parent
            .ptrs()
            .iter()
            .skip(*slot)
            .take(2 * READAHEAD_LEAVES)
            .map(|p| p.bytenr)
            .collect();
        b.prefetch(&next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::{Body, Ptr};
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// Internal nodes in memory; leaves are only ever prefetched.
    struct Blocks {
        nodes: HashMap<u64, Arc<Node>>,
        prefetched: RefCell<Vec<u64>>,
    }

    impl BlockRead for Blocks {
        fn read_node(&self, bytenr: u64, _generation: u64) -> Result<Arc<Node>> {
            self.nodes
                .get(&bytenr)
                .cloned()
                .ok_or_else(|| crate::error::Error::corrupt(bytenr, "a leaf was read"))
        }
        fn nodesize(&self) -> usize {
            16384
        }
        fn item_limits(&self) -> crate::format::checker::Limits {
            crate::format::checker::Limits {
                device_size: 1 << 40,
            }
        }
        fn prefetch(&self, bytenrs: &[u64]) {
            self.prefetched.borrow_mut().extend_from_slice(bytenrs);
        }
    }

    fn key(n: u64) -> Key {
        Key::new(7, 128, n)
    }

    fn internal(bytenr: u64, level: u8, ptrs: Vec<Ptr>) -> Arc<Node> {
        Arc::new(Node {
            bytenr,
            generation: 1,
            owner: 7,
            flags: 0,
            level,
            body: Body::Internal(ptrs),
        })
    }

    /// A root over two parents of four leaves each: leaf `i` (address
    /// 1000 + i) holds keys from `i * 100`.
    fn two_level() -> (Blocks, RootPtr) {
        let leaf = |i: u64| Ptr {
            key: key(i * 100),
            bytenr: 1000 + i,
            generation: 1,
        };
        let parents = [
            internal(10, 1, (0..4).map(leaf).collect()),
            internal(11, 1, (4..8).map(leaf).collect()),
        ];
        let root = internal(
            1,
            2,
            parents
                .iter()
                .map(|p| Ptr {
                    key: p.first_key().unwrap_or(key(0)),
                    bytenr: p.bytenr,
                    generation: 1,
                })
                .collect(),
        );
        let ptr = RootPtr {
            bytenr: 1,
            generation: 1,
            level: 2,
        };
        let nodes = [root, parents[0].clone(), parents[1].clone()]
            .into_iter()
            .map(|n| (n.bytenr, n))
            .collect();
        let blocks = Blocks {
            nodes,
            prefetched: RefCell::new(Vec::new()),
        };
        (blocks, ptr)
    }

    #[test]
    fn prefetches_the_leaves_of_a_range_without_reading_them() {
        let (b, root) = two_level();
        prefetch_leaves(&b, &root, &key(150), &key(250), 32).expect("prefetch");
        assert_eq!(*b.prefetched.borrow(), [1001, 1002]);
    }

    #[test]
    fn a_damaged_node_neither_panics_nor_reads_backwards() {
        let ptr = |k: u64, bytenr: u64| Ptr {
            key: key(k),
            bytenr,
            generation: 1,
        };
        let parent = internal(10, 1, vec![ptr(500, 1000), ptr(100, 1001), ptr(300, 1002)]);
        let empty = internal(11, 1, Vec::new());
        for node in [parent, empty] {
            let root = RootPtr {
                bytenr: node.bytenr,
                generation: 1,
                level: 1,
            };
            let b = Blocks {
                nodes: [(node.bytenr, node)].into_iter().collect(),
                prefetched: RefCell::new(Vec::new()),
            };
            prefetch_leaves(&b, &root, &key(400), &key(200), 32).expect("prefetch");
            assert!(b.prefetched.borrow().len() <= 1);
        }
    }

    #[test]
    fn a_range_past_its_parent_stops_at_the_parent_and_at_the_limit() {
        let (b, root) = two_level();
        prefetch_leaves(&b, &root, &key(150), &key(650), 32).expect("prefetch");
        assert_eq!(*b.prefetched.borrow(), [1001, 1002, 1003]);
        let (b, root) = two_level();
        prefetch_leaves(&b, &root, &key(420), &key(790), 2).expect("prefetch");
        assert_eq!(*b.prefetched.borrow(), [1004, 1005]);
    }
}
