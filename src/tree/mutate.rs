//! Changing items: insert, replace, delete. Each copies the path to the
//! leaf, changes the leaf, records data references, then lets
//! `rebalance::fix_up_leaf` restore the size invariants and parent keys.

use super::cow::{cow_path, Step};
use super::rebalance::fix_up_leaf;
use super::{max_item_size, BlockWrite, RootPtr};
use crate::error::{Error, Result};
use crate::format::items::data_ref_of;
use crate::format::node::{Body, Leaf};
use crate::format::Key;

fn check_size<B: BlockWrite + ?Sized>(b: &B, data: &[u8]) -> Result<()> {
    let max = max_item_size(b.nodesize());
    if data.len() > max {
        return Err(Error::Invalid(format!(
            "item of {} bytes exceeds the maximum of {max}",
            data.len()
        )));
    }
    Ok(())
}

fn note_data_ref<B: BlockWrite + ?Sized>(b: &mut B, leaf: u64, key: &Key, data: &[u8], delta: i64) {
    if let Some((bytenr, len)) = data_ref_of(key, data) {
        b.data_ref(bytenr, len, leaf, delta);
    }
}

/// The last step of a writable path and the items of its leaf.
fn leaf_of<'b, B: BlockWrite + ?Sized>(
    b: &'b mut B,
    root: &RootPtr,
    path: &[Step],
) -> Result<(Step, &'b mut Leaf)> {
    let Some(step) = path.last().copied() else {
        return Err(Error::corrupt(root.bytenr, "empty path"));
    };
    match &mut b.node_mut(step.bytenr)?.body {
        Body::Leaf(items) => Ok((step, items)),
        Body::Internal(_) => Err(Error::corrupt(step.bytenr, "path does not end in a leaf")),
    }
}

enum Change {
    Insert,
    Replace,
    Upsert,
}

fn set_item<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: Key,
    data: Vec<u8>,
    change: Change,
) -> Result<Option<Vec<u8>>> {
    check_size(b, &data)?;
    let path = cow_path(b, owner, root, &key)?;
    let new_ref = data_ref_of(&key, &data);
    let new_len = data.len();
    let (leaf_step, items) = leaf_of(b, root, &path)?;
    let slot = leaf_step.slot;
    let exists = slot < items.len() && items.key(slot) == key;
    let old = match (exists, change) {
        (true, Change::Insert) => return Err(Error::Exists),
        (false, Change::Replace) => return Err(Error::NotFound),
        (true, _) => Some(items.replace_data(slot, &data)),
        (false, _) => {
            items.insert(slot, key, &data);
            None
        }
    };
    if let Some(old) = &old {
        note_data_ref(b, leaf_step.bytenr, &key, old, -1);
    }
    if let Some((bytenr, len)) = new_ref {
        b.data_ref(bytenr, len, leaf_step.bytenr, 1);
    }
    let same_size = old.as_ref().is_some_and(|o| o.len() == new_len);
    if !same_size || slot == 0 {
        fix_up_leaf(b, owner, root, &path)?;
    }
    Ok(old)
}

/// Inserts a new item; `Error::Exists` if the key is present.
pub fn insert<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: Key,
    data: Vec<u8>,
) -> Result<()> {
    set_item(b, owner, root, key, data, Change::Insert).map(|_| ())
}

/// Replaces the data of an existing item (any new size); returns the old
/// data, or `Error::NotFound`.
pub fn update<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: Key,
    data: Vec<u8>,
) -> Result<Vec<u8>> {
    set_item(b, owner, root, key, data, Change::Replace)?.ok_or(Error::NotFound)
}

/// Inserts or replaces; returns the old data if there was an item.
pub fn put<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: Key,
    data: Vec<u8>,
) -> Result<Option<Vec<u8>>> {
    set_item(b, owner, root, key, data, Change::Upsert)
}

/// Deletes an item and returns its data, or `Error::NotFound`.
pub fn delete<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    key: &Key,
) -> Result<Vec<u8>> {
    let path = cow_path(b, owner, root, key)?;
    let (leaf_step, items) = leaf_of(b, root, &path)?;
    if items.get(leaf_step.slot).is_none_or(|it| it.key != *key) {
        return Err(Error::NotFound);
    }
    let old = items.remove(leaf_step.slot);
    note_data_ref(b, leaf_step.bytenr, key, &old, -1);
    fix_up_leaf(b, owner, root, &path)?;
    Ok(old)
}

/// Deletes the items of `keys` (sorted) that are present, leaf by leaf:
/// the path is copied and fixed up once per leaf rather than once per
/// key, which is what deleting thousands of neighbouring items (the
/// checksums of released extents) costs otherwise. Returns how many it
/// deleted.
pub fn delete_sorted<B: BlockWrite + ?Sized>(
    b: &mut B,
    owner: u64,
    root: &mut RootPtr,
    keys: &[Key],
) -> Result<usize> {
    let mut deleted = 0;
    let mut i = 0;
    while let Some(first) = keys.get(i) {
        let path = cow_path(b, owner, root, first)?;
        let (leaf_step, items) = leaf_of(b, root, &path)?;
        let mut removed = Vec::new();
        let mut here = true; // `first` belongs in this leaf, found or not
        while let Some(key) = keys.get(i) {
            match items.search(key) {
                Ok(slot) => removed.push((*key, items.remove(slot))),
                // Where it would be in this leaf, and not there: missing.
                Err(slot) if here || slot < items.len() => {}
                // Past this leaf's last item: the next leaf's business.
                Err(_) => break,
            }
            here = false;
            i += 1;
        }
        deleted += removed.len();
        let changed = !removed.is_empty();
        for (key, old) in removed {
            note_data_ref(b, leaf_step.bytenr, &key, &old, -1);
        }
        if changed {
            fix_up_leaf(b, owner, root, &path)?;
        }
    }
    Ok(deleted)
}
