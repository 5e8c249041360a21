//! A leaf's items in memory: one vector of slots (key, where the data
//! lies, how long) and one buffer holding every item's data.
//!
//! Why not a vector of items, each owning its data: a decoded leaf then
//! costs an allocation per item (a cold directory walk spent most of its
//! CPU there), about 29 KB of memory for a 16 KiB block (a 48-byte slot
//! plus an allocation of the data, rounded up, per item), and every size
//! check summed the items. Here decoding a block is two allocations and
//! one copy of its data area, a cached leaf costs its data plus 32 bytes
//! per item, and the bytes it would take on disk are kept as it changes.
//!
//! Changes append to the buffer: a removed or replaced item's old bytes
//! stay behind as garbage until it outweighs the live data, when the
//! buffer is packed again (and always before a leaf is cached or copied).

use super::key::Key;
use super::node::ITEM_HEADER_SIZE;
use std::fmt;

/// Where one item's data lies in the leaf's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    key: Key,
    start: u32,
    len: u32,
}

/// One item of a leaf, borrowed from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemRef<'a> {
    pub key: Key,
    pub data: &'a [u8],
}

impl ItemRef<'_> {
    pub fn to_item(self) -> Item {
        Item {
            key: self.key,
            data: self.data.to_vec(),
        }
    }
}

/// One item with its own data: what a caller builds a leaf from, or takes
/// out of one to change freely (see [`Leaf::edit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: Key,
    pub data: Vec<u8>,
}

impl Item {
    pub fn size_on_disk(&self) -> usize {
        ITEM_HEADER_SIZE + self.data.len()
    }
}

/// The items of a leaf, in key order (callers keep the order).
#[derive(Default)]
pub struct Leaf {
    slots: Vec<Slot>,
    buf: Vec<u8>,
    /// Bytes of `buf` no slot points at.
    garbage: usize,
}

/// Below this many bytes of garbage a leaf is never packed: packing a
/// small buffer saves nothing worth its copy.
const PACK_MIN_GARBAGE: usize = 4096;

impl Leaf {
    pub const fn new() -> Leaf {
        Leaf {
            slots: Vec::new(),
            buf: Vec::new(),
            garbage: 0,
        }
    }

    /// A leaf made of the data area `buf` of a block and the items'
    /// `(key, start, len)` within it, as decoding finds them.
    pub(super) fn from_parts(buf: Vec<u8>, items: impl Iterator<Item = (Key, u32, u32)>) -> Leaf {
        let slots: Vec<Slot> = items
            .map(|(key, start, len)| Slot { key, start, len })
            .collect();
        let live: usize = slots.iter().map(|s| s.len as usize).sum();
        Leaf {
            garbage: buf.len() - live,
            slots,
            buf,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn key(&self, i: usize) -> Key {
        self.slots[i].key
    }

    pub fn data(&self, i: usize) -> &[u8] {
        self.slice(&self.slots[i])
    }

    fn slice(&self, s: &Slot) -> &[u8] {
        &self.buf[s.start as usize..(s.start + s.len) as usize]
    }

    pub fn get(&self, i: usize) -> Option<ItemRef<'_>> {
        self.slots.get(i).map(|s| ItemRef {
            key: s.key,
            data: self.slice(s),
        })
    }

    pub fn first(&self) -> Option<ItemRef<'_>> {
        self.get(0)
    }

    pub fn last(&self) -> Option<ItemRef<'_>> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub fn first_key(&self) -> Option<Key> {
        self.slots.first().map(|s| s.key)
    }

    pub fn last_key(&self) -> Option<Key> {
        self.slots.last().map(|s| s.key)
    }

    pub fn iter(&self) -> Iter<'_> {
        self.range(0..self.len())
    }

    /// Items `range` (clamped to the leaf), in order.
    pub fn range(&self, range: std::ops::Range<usize>) -> Iter<'_> {
        let end = range.end.min(self.len());
        Iter {
            leaf: self,
            range: range.start.min(end)..end,
        }
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = Key> + ExactSizeIterator + '_ {
        self.slots.iter().map(|s| s.key)
    }

    /// The slot of `key` (`Ok`), or where it would be inserted (`Err`).
    pub fn search(&self, key: &Key) -> Result<usize, usize> {
        self.slots.binary_search_by(|s| s.key.cmp(key))
    }

    /// The bytes item `i` takes in an encoded block (header and data).
    pub fn entry_size(&self, i: usize) -> usize {
        ITEM_HEADER_SIZE + self.slots[i].len as usize
    }

    /// The bytes the items take in an encoded block (headers and data).
    pub fn content_bytes(&self) -> usize {
        self.slots.len() * ITEM_HEADER_SIZE + self.buf.len() - self.garbage
    }

    /// Memory this leaf holds: its slots and its buffer.
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.buf.capacity()
    }

    fn append_data(&mut self, data: &[u8]) -> (u32, u32) {
        let start = self.buf.len();
        self.buf.extend_from_slice(data);
        // A leaf holds at most a block (64 KiB) of live data, and packing
        // keeps the garbage below the live data (plus a few KiB).
        (start as u32, data.len() as u32)
    }

    /// Inserts an item at slot `i` (which must keep the key order).
    pub fn insert(&mut self, i: usize, key: Key, data: &[u8]) {
        let (start, len) = self.append_data(data);
        self.slots.insert(i, Slot { key, start, len });
    }

    /// Appends an item after the last (which must keep the key order).
    pub fn push(&mut self, key: Key, data: &[u8]) {
        self.insert(self.len(), key, data);
    }

    /// Removes item `i` and returns its data.
    pub fn remove(&mut self, i: usize) -> Vec<u8> {
        let s = self.slots.remove(i);
        let old = self.slice(&s).to_vec();
        self.garbage += s.len as usize;
        self.maybe_pack();
        old
    }

    /// Replaces the data of item `i` and returns the old data.
    pub fn replace_data(&mut self, i: usize, data: &[u8]) -> Vec<u8> {
        let s = self.slots[i];
        let old = self.slice(&s).to_vec();
        if data.len() <= s.len as usize {
            // Fits where the old data was: the tail left over is garbage.
            let at = s.start as usize;
            self.buf[at..at + data.len()].copy_from_slice(data);
            self.slots[i].len = data.len() as u32;
            self.garbage += s.len as usize - data.len();
        } else {
            let (start, len) = self.append_data(data);
            self.slots[i].start = start;
            self.slots[i].len = len;
            self.garbage += s.len as usize;
        }
        self.maybe_pack();
        old
    }

    /// The data of item `i`, to change in place (its length stays).
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        let s = self.slots[i];
        &mut self.buf[s.start as usize..(s.start + s.len) as usize]
    }

    /// Moves items `at..` into a new leaf, as `Vec::split_off` does.
    pub fn split_off(&mut self, at: usize) -> Leaf {
        let tail = self.slots.split_off(at);
        let bytes = tail.iter().map(|s| s.len as usize).sum();
        let mut out = Leaf::with_capacity(tail.len(), bytes);
        for s in &tail {
            out.push(s.key, self.slice(s));
            self.garbage += s.len as usize;
        }
        self.maybe_pack();
        out
    }

    /// Appends every item of `other` (whose keys must all be greater).
    pub fn append(&mut self, other: &Leaf) {
        self.slots.reserve(other.len());
        for it in other.iter() {
            self.push(it.key, it.data);
        }
    }

    fn with_capacity(items: usize, bytes: usize) -> Leaf {
        Leaf {
            slots: Vec::with_capacity(items),
            buf: Vec::with_capacity(bytes),
            garbage: 0,
        }
    }

    fn maybe_pack(&mut self) {
        if self.garbage >= PACK_MIN_GARBAGE && self.garbage > self.buf.len() - self.garbage {
            *self = self.packed(self.slots.len());
        }
    }

    /// A copy without garbage, with room for `slots` items.
    fn packed(&self, slots: usize) -> Leaf {
        let live = self.buf.len() - self.garbage;
        let mut out = Leaf::with_capacity(slots.max(self.len()), live);
        for it in self.iter() {
            out.push(it.key, it.data);
        }
        out
    }

    /// Gives back spare capacity and garbage: a clean leaf keeps its
    /// memory as long as it is cached.
    pub fn shrink_to_fit(&mut self) {
        if self.garbage > 0 {
            *self = self.packed(self.len());
        } else {
            self.slots.shrink_to_fit();
            self.buf.shrink_to_fit();
        }
    }

    /// A packed copy with room for `extra` more items: a leaf is copied
    /// to be changed, most often by one insert.
    pub fn clone_with_room(&self, extra: usize) -> Leaf {
        let mut out = self.packed(self.len() + extra);
        out.buf.reserve_exact(extra * 64);
        out
    }

    /// The items as owned values, to change freely; [`Leaf::edit`] puts
    /// them back.
    pub fn to_items(&self) -> Vec<Item> {
        self.iter().map(ItemRef::to_item).collect()
    }

    /// The items as a vector to change freely (keys, data, order), put
    /// back into the leaf as they are when the guard drops (a caller that
    /// changed keys sorts them). For tools and tests that rewrite leaves;
    /// the tree changes leaves through the methods above.
    pub fn edit(&mut self) -> EditItems<'_> {
        let items = self.to_items();
        EditItems { leaf: self, items }
    }
}

impl From<Vec<Item>> for Leaf {
    fn from(items: Vec<Item>) -> Leaf {
        let bytes = items.iter().map(|i| i.data.len()).sum();
        let mut leaf = Leaf::with_capacity(items.len(), bytes);
        for it in &items {
            leaf.push(it.key, &it.data);
        }
        leaf
    }
}

impl FromIterator<Item> for Leaf {
    fn from_iter<I: IntoIterator<Item = Item>>(items: I) -> Leaf {
        Leaf::from(items.into_iter().collect::<Vec<Item>>())
    }
}

impl Clone for Leaf {
    fn clone(&self) -> Leaf {
        self.packed(self.len())
    }
}

impl PartialEq for Leaf {
    fn eq(&self, other: &Leaf) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Leaf {}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a Leaf {
    type Item = ItemRef<'a>;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The items of a leaf in order, as [`ItemRef`]s.
#[derive(Clone)]
pub struct Iter<'a> {
    leaf: &'a Leaf,
    range: std::ops::Range<usize>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = ItemRef<'a>;
    fn next(&mut self) -> Option<ItemRef<'a>> {
        self.range.next().and_then(|i| self.leaf.get(i))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }
    fn nth(&mut self, n: usize) -> Option<ItemRef<'a>> {
        self.range.nth(n).and_then(|i| self.leaf.get(i))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.range.next_back().and_then(|i| self.leaf.get(i))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// The guard [`Leaf::edit`] returns: a `Vec<Item>` while it lives.
pub struct EditItems<'a> {
    leaf: &'a mut Leaf,
    items: Vec<Item>,
}

impl std::ops::Deref for EditItems<'_> {
    type Target = Vec<Item>;
    fn deref(&self) -> &Vec<Item> {
        &self.items
    }
}

impl std::ops::DerefMut for EditItems<'_> {
    fn deref_mut(&mut self) -> &mut Vec<Item> {
        &mut self.items
    }
}

impl Drop for EditItems<'_> {
    fn drop(&mut self) {
        *self.leaf = Leaf::from(std::mem::take(&mut self.items));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model_of(leaf: &Leaf) -> Vec<(Key, Vec<u8>)> {
        leaf.iter().map(|i| (i.key, i.data.to_vec())).collect()
    }

    fn size_of(model: &[(Key, Vec<u8>)]) -> usize {
        model.iter().map(|(_, d)| ITEM_HEADER_SIZE + d.len()).sum()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, Vec<u8>),
        Remove(usize),
        Replace(usize, Vec<u8>),
        SplitAppend(usize),
        Shrink,
    }

    fn op() -> impl Strategy<Value = Op> {
        let data = prop::collection::vec(any::<u8>(), 0..3000);
        prop_oneof![
            4 => (0u64..500, data.clone()).prop_map(|(k, d)| Op::Insert(k, d)),
            2 => any::<usize>().prop_map(Op::Remove),
            3 => (any::<usize>(), data).prop_map(|(i, d)| Op::Replace(i, d)),
            1 => any::<usize>().prop_map(Op::SplitAppend),
            1 => Just(Op::Shrink),
        ]
    }

    proptest! {
        /// Every change agrees with a vector of owned items, and the
        /// content size kept along the way is the sum of the items'.
        #[test]
        fn leaf_behaves_like_a_vector_of_items(ops in prop::collection::vec(op(), 1..80)) {
            let mut leaf = Leaf::new();
            let mut model: Vec<(Key, Vec<u8>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, d) => {
                        let key = Key::new(k, 1, 0);
                        if let Err(i) = model.binary_search_by(|(x, _)| x.cmp(&key)) {
                            prop_assert_eq!(leaf.search(&key), Err(i));
                            leaf.insert(i, key, &d);
                            model.insert(i, (key, d));
                        }
                    }
                    Op::Remove(i) if !model.is_empty() => {
                        let i = i % model.len();
                        prop_assert_eq!(leaf.remove(i), model.remove(i).1);
                    }
                    Op::Replace(i, d) if !model.is_empty() => {
                        let i = i % model.len();
                        let old = std::mem::replace(&mut model[i].1, d.clone());
                        prop_assert_eq!(leaf.replace_data(i, &d), old);
                    }
                    Op::SplitAppend(at) => {
                        let at = at % (model.len() + 1);
                        let tail = leaf.split_off(at);
                        prop_assert_eq!(model_of(&tail), model[at..].to_vec());
                        prop_assert_eq!(model_of(&leaf), model[..at].to_vec());
                        leaf.append(&tail);
                    }
                    Op::Shrink => leaf.shrink_to_fit(),
                    _ => {}
                }
                prop_assert_eq!(model_of(&leaf), model.clone());
                prop_assert_eq!(leaf.content_bytes(), size_of(&model));
                prop_assert!(leaf.garbage < PACK_MIN_GARBAGE || leaf.garbage <= leaf.buf.len() - leaf.garbage);
            }
            let copy = leaf.clone_with_room(3);
            prop_assert_eq!(copy.garbage, 0);
            prop_assert_eq!(&copy, &leaf);
        }
    }

    #[test]
    fn edit_puts_changed_items_back_in_order() {
        let mut leaf = Leaf::from(vec![
            Item {
                key: Key::new(1, 1, 0),
                data: vec![1],
            },
            Item {
                key: Key::new(2, 1, 0),
                data: vec![2, 2],
            },
        ]);
        {
            let mut items = leaf.edit();
            items[0].key.objectid = 3;
            items[1].data.push(9);
            items.sort_by_key(|i| i.key);
        }
        assert_eq!(leaf.keys().map(|k| k.objectid).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(leaf.data(0), &[2, 2, 9]);
        assert_eq!(leaf.content_bytes(), 2 * ITEM_HEADER_SIZE + 4);
    }
}
