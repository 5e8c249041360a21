//! Bringing the persistent indexes up to date at commit: root items, the
//! two free-space trees, block group items.

use super::Txn;
use crate::alloc::FreeOp;
use crate::error::{Error, Result};
use crate::format::items::BlockGroupItem;
use crate::format::key_type::{BLOCK_GROUP_ITEM, FREE_EXTENT, ROOT_ITEM};
use crate::format::tree_id::{BLOCK_GROUP, FREE_BY_LEN, FREE_BY_START, ROOT};
use crate::format::Key;

/// Writes the root items of trees whose root moved, and deletes those of
/// dropped trees. Returns whether anything was written.
pub(super) fn write_root_items(tx: &mut Txn<'_>) -> Result<bool> {
    let dropped = std::mem::take(&mut tx.st.dropped);
    let mut changed: Vec<(u64, Vec<u8>)> = Vec::new();
    for (&id, rs) in tx.st.roots.iter_mut() {
        if !rs.dirty || id == ROOT {
            continue;
        }
        rs.dirty = false;
        rs.item.bytenr = rs.ptr.bytenr;
        rs.item.generation = rs.ptr.generation;
        rs.item.level = rs.ptr.level;
        changed.push((id, rs.item.encode()));
    }
    let did = !dropped.is_empty() || !changed.is_empty();
    for id in dropped {
        match tx.delete(ROOT, &Key::new(id, ROOT_ITEM, 0)) {
            Ok(_) | Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    for (id, data) in changed {
        tx.put(ROOT, Key::new(id, ROOT_ITEM, 0), data)?;
    }
    Ok(did)
}

/// Records the device's error counters in the root tree when they differ
/// from what it holds (an image that never saw an error gets no item).
pub(super) fn write_device_stats(tx: &mut Txn<'_>) -> Result<()> {
    let counts: Vec<(u64, [u64; 4])> = tx
        .sh
        .dev
        .all_errors()
        .into_iter()
        .map(|(devid, e)| (devid, e.snapshot()))
        .collect();
    for (devid, [read_errors, corruption_errors, corrected, write_errors]) in counts {
        let stats = crate::format::items::DeviceStats {
            read_errors,
            corruption_errors,
            corrected,
            write_errors,
        };
        let key = device_stats_key(devid);
        let have = tx.get(ROOT, &key)?;
        let data = stats.encode();
        if have.is_none() && stats == Default::default() || have.as_deref() == Some(&data[..]) {
            continue;
        }
        tx.put(ROOT, key, data)?;
    }
    Ok(())
}

/// Where device `devid`'s error counters live.
pub(super) fn device_stats_key(devid: u64) -> Key {
    Key::new(
        crate::format::DEVICE_STATS_OBJECTID,
        crate::format::key_type::DEVICE_STATS,
        devid,
    )
}

/// Writes the usage of every block group that changed.
pub(super) fn write_block_groups(tx: &mut Txn<'_>) -> Result<bool> {
    let groups = tx.allocator().take_dirty_groups();
    let did = !groups.is_empty();
    for g in groups {
        let item = BlockGroupItem {
            used: g.used,
            flags: g.kind.flags(),
            first: g.first,
            extra: g.extra.clone(),
            striped: g.striped,
        };
        let key = Key::new(g.start, BLOCK_GROUP_ITEM, g.len);
        let data = item.encode();
        if tx.get(BLOCK_GROUP, &key)?.as_deref() != Some(&data[..]) {
            tx.put(BLOCK_GROUP, key, data)?;
        }
    }
    Ok(did)
}

/// Gives block groups that hold nothing back to the unallocated pool, so
/// space moves between data and metadata as needs change: deletes the
/// group's item and its free extents. Runs after the journal is replayed,
/// when the free-space trees hold exactly the group's free ranges.
pub(super) fn remove_empty_groups(tx: &mut Txn<'_>) -> Result<bool> {
    let empty = tx.allocator().empty_groups();
    let mut did = false;
    for start in empty {
        // Out of the allocator first: the tree edits below must not
        // allocate from the group they are removing.
        let Some(g) = tx.allocator().remove_group(start) else {
            continue;
        };
        did = true;
        for (s, l) in g.free.iter().collect::<Vec<_>>() {
            delete_extent(tx, s, l)?;
        }
        match tx.delete(BLOCK_GROUP, &Key::new(g.start, BLOCK_GROUP_ITEM, g.len)) {
            Ok(_) | Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(did)
}

/// Replays the allocator's journal into the free-space trees.
pub(super) fn apply_free_journal(tx: &mut Txn<'_>) -> Result<bool> {
    let journal = tx.allocator().take_journal();
    let did = !journal.is_empty();
    for op in journal {
        match op {
            FreeOp::Add(s, l) => add_free(tx, s, l)?,
            FreeOp::Remove(s, l) => remove_free(tx, s, l)?,
        }
    }
    Ok(did)
}

/// Rewrites both free-space trees from the allocator's free ranges as
/// they stand, and marks every block group's item for rewriting at the
/// commit (`canopy check --repair`, after an open that counted usage and
/// free space from the extent tree). Changes the journal holds are in
/// the allocator's ranges already, so they go; the allocations these
/// edits make join the journal afresh and reach the rewritten trees at
/// the commit. Returns how many free ranges were written.
pub(super) fn rewrite_free_trees(tx: &mut Txn<'_>) -> Result<u64> {
    // The next log link's block is free on the disk: written from the
    // allocator, the trees must show it so (this transaction's fsyncs
    // then commit).
    tx.st.release_log_chain(tx.sh.nodesize as u64);
    drop(tx.allocator().take_journal());
    let free: Vec<(u64, u64)> = tx
        .allocator()
        .groups()
        .flat_map(|g| g.free.iter().collect::<Vec<_>>())
        .collect();
    for tree in [FREE_BY_START, FREE_BY_LEN] {
        let root = tx.root_of(tree)?;
        let mut keys = Vec::new();
        let mut c = crate::tree::Cursor::seek(tx, &root, &Key::MIN)?;
        while let Some(it) = c.item() {
            keys.push(it.key);
            c.next(tx)?;
        }
        for k in keys {
            tx.delete(tree, &k)?;
        }
    }
    for &(s, l) in &free {
        insert_extent(tx, s, l)?;
    }
    tx.allocator().mark_all_groups_dirty();
    Ok(free.len() as u64)
}

fn insert_extent(tx: &mut Txn<'_>, s: u64, l: u64) -> Result<()> {
    tx.insert(FREE_BY_START, Key::new(s, FREE_EXTENT, l), Vec::new())?;
    tx.insert(FREE_BY_LEN, Key::new(l, FREE_EXTENT, s), Vec::new())
}

fn delete_extent(tx: &mut Txn<'_>, s: u64, l: u64) -> Result<()> {
    tx.delete(FREE_BY_START, &Key::new(s, FREE_EXTENT, l))?;
    tx.delete(FREE_BY_LEN, &Key::new(l, FREE_EXTENT, s))
        .map(|_| ())
}

/// The last persistent free extent starting at or before `at`.
fn free_extent_at_or_before(tx: &Txn<'_>, at: u64) -> Result<Option<(u64, u64)>> {
    let root = tx.root_of(FREE_BY_START)?;
    let c = crate::tree::Cursor::seek_le(tx, &root, &Key::new(at, FREE_EXTENT, u64::MAX))?;
    Ok(c.and_then(|c| c.item().map(|it| (it.key.objectid, it.key.offset))))
}

fn add_free(tx: &mut Txn<'_>, s: u64, l: u64) -> Result<()> {
    let (gs, ge) = {
        let g = tx
            .allocator()
            .group_containing(s)
            .ok_or_else(|| Error::corrupt(s, "freed space outside any block group"))?;
        (g.start, g.start + g.len)
    };
    let (mut start, mut end) = (s, s + l);
    if let Some((ps, pl)) = free_extent_at_or_before(tx, s + l - 1)? {
        if ps + pl > s && ps < s + l {
            return Err(Error::corrupt(
                s,
                format!("freeing [{s}, +{l}) which is already free"),
            ));
        }
    }
    if let Some((ps, pl)) = free_extent_at_or_before(tx, s.saturating_sub(1))? {
        if ps + pl == s && ps >= gs && s > 0 {
            delete_extent(tx, ps, pl)?;
            start = ps;
        }
    }
    if end < ge {
        if let Some((ns, nl)) = free_extent_at_or_before(tx, end)? {
            if ns == end {
                delete_extent(tx, ns, nl)?;
                end = ns + nl;
            }
        }
    }
    insert_extent(tx, start, end - start)
}

fn remove_free(tx: &mut Txn<'_>, s: u64, l: u64) -> Result<()> {
    let Some((fs, fl)) = free_extent_at_or_before(tx, s)?.filter(|&(fs, fl)| s + l <= fs + fl)
    else {
        return Err(Error::corrupt(
            s,
            format!("allocated [{s}, +{l}) is not free in the free-space tree"),
        ));
    };
    delete_extent(tx, fs, fl)?;
    if s > fs {
        insert_extent(tx, fs, s - fs)?;
    }
    if s + l < fs + fl {
        insert_extent(tx, s + l, fs + fl - s - l)?;
    }
    Ok(())
}
