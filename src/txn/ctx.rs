//! The views through which callers and the tree layer see the state: a
//! [`Txn`] (writer, joined to the running transaction) and a [`Reader`].

use super::refs::{ExtentKind, PendingExtent, RefHolder};
use super::Slots;
use super::{Need, RootState, Shared, State};
use crate::alloc::{Allocator, GroupKind};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::items::{RootItem, SubvolIdent};
use crate::format::node::{Body, Node};
use crate::format::{tree_id, Key, SECTORSIZE};
use crate::tree::{self, BlockRead, BlockWrite, Cursor, Holder, RootPtr};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Finds a block: dirty in this transaction, being written by a commit, in
/// the cache, or on disk (then checked and cached).
fn read_block(st: &State, sh: &Shared, bytenr: u64, generation: u64) -> Result<Arc<Node>> {
    let node = if let Some(n) = block_in_memory(st, sh, bytenr) {
        n
    } else {
        let n = Arc::new(super::copies::read_tree_block(sh, bytenr, generation)?);
        sh.check_leaf(&n);
        sh.cache.insert(n.clone());
        n
    };
    if node.generation != generation {
        return Err(Error::corrupt(
            bytenr,
            format!(
                "block has generation {}, its parent expected {generation}",
                node.generation
            ),
        ));
    }
    Ok(node)
}

/// The block at `bytenr` if it is in memory: made or copied in this
/// transaction, being written, or cached.
fn block_in_memory(st: &State, sh: &Shared, bytenr: u64) -> Option<Arc<Node>> {
    if let Some(n) = st.dirty.get(&bytenr) {
        return Some(n.clone());
    }
    if let Some(n) = crate::sync::lock(&sh.inflight).get(&bytenr).cloned() {
        return Some(n);
    }
    sh.cache.get(bytenr)
}

/// Starts reading the blocks not already in memory, merging adjacent ones
/// into one request.
fn prefetch_blocks(st: &State, sh: &Shared, bytenrs: &[u64]) {
    let ns = sh.nodesize as u64;
    let mut want: Vec<u64> = bytenrs
        .iter()
        .copied()
        .filter(|b| !st.dirty.contains_key(b) && !sh.cache.contains(*b))
        .collect();
    want.sort_unstable();
    let mut run: Option<(u64, u64)> = None;
    for b in want {
        run = match run {
            Some((start, end)) if end == b => Some((start, b + ns)),
            Some((start, end)) => {
                sh.dev.prefetch(start, end - start);
                Some((b, b + ns))
            }
            None => Some((b, b + ns)),
        };
    }
    if let Some((start, end)) = run {
        sh.dev.prefetch(start, end - start);
    }
}

fn root_of(st: &State, id: u64) -> Result<RootPtr> {
    if id == tree_id::LOG {
        // The running transaction's log, or else one waiting for replay.
        let log = st.log.as_ref().map(|l| l.ptr);
        let pending = st.pending_log.as_ref().map(|p| p.ptr);
        return log
            .or(pending)
            .ok_or_else(|| Error::Invalid("there is no log tree".into()));
    }
    st.roots
        .get(&id)
        .map(|r| r.ptr)
        // A subvolume deleted meanwhile: what named it is gone too.
        .ok_or(Error::NotFound)
}

/// Items with `start <= key < end`, in order.
fn collect_range<B: BlockRead + ?Sized>(
    b: &B,
    root: &RootPtr,
    start: &Key,
    end: &Key,
) -> Result<Vec<(Key, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut c = Cursor::seek(b, root, start)?;
    let mut cur = c.item().map(|it| (it.key, it.data.to_vec()));
    while let Some((k, d)) = cur {
        if k >= *end {
            break;
        }
        out.push((k, d));
        cur = c.next(b)?.map(|it| (it.key, it.data.to_vec()));
    }
    Ok(out)
}

/// A read-only view of the current state.
pub struct Reader<'a> {
    st: &'a State,
    pub(in crate::txn) sh: &'a Shared,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(st: &'a State, sh: &'a Shared) -> Reader<'a> {
        Reader { st, sh }
    }

    /// What the mechanisms above keep in the transaction.
    pub fn slots(&self) -> &Slots {
        &self.st.slots
    }

    pub fn get(&self, tree: u64, key: &Key) -> Result<Option<Vec<u8>>> {
        tree::get(self, &root_of(self.st, tree)?, key)
    }

    /// [`tree::get_with`] in `tree`: `f` reads the item where it lies.
    pub fn get_with<R>(
        &self,
        tree: u64,
        key: &Key,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        tree::get_with(self, &root_of(self.st, tree)?, key, f)
    }

    /// [`tree::get_many_with`] in `tree`: one lookup for many sorted keys.
    pub fn get_many_with<R>(
        &self,
        tree: u64,
        keys: &[Key],
        f: impl FnMut(&Key, &[u8]) -> R,
    ) -> Result<Vec<Option<R>>> {
        tree::get_many_with(self, &root_of(self.st, tree)?, keys, f)
    }

    pub fn range(&self, tree: u64, start: &Key, end: &Key) -> Result<Vec<(Key, Vec<u8>)>> {
        collect_range(self, &root_of(self.st, tree)?, start, end)
    }

    /// A cursor at the first item >= `key`.
    pub fn cursor(&self, tree: u64, key: &Key) -> Result<Cursor> {
        Cursor::seek(self, &root_of(self.st, tree)?, key)
    }

    pub fn tree_ids(&self) -> Vec<u64> {
        self.st.roots.keys().copied().collect()
    }

    pub fn root(&self, tree: u64) -> Result<RootPtr> {
        root_of(self.st, tree)
    }

    pub fn tree_exists(&self, id: u64) -> bool {
        self.st.roots.contains_key(&id)
    }

    /// The root item of tree `id` as the next commit will write it.
    pub fn root_item(&self, id: u64) -> Result<RootItem> {
        self.st
            .roots
            .get(&id)
            .map(|rs| rs.item.clone())
            .ok_or(Error::NotFound)
    }

    pub fn read_data(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.sh.dev.read_at(buf, bytenr)
    }

    /// Reads every copy of the tree block at `bytenr` from the device,
    /// bypassing every cache, checks each as a first read would
    /// (checksum, fsid, own address, layout, and a generation no newer
    /// than `generation`, the one its extent item records), and rewrites
    /// bad copies from a good one. None: the block is dirty or being
    /// written, so the disk does not hold it yet. A block reachable from
    /// the state cannot be reused while the caller holds the state.
    pub fn verify_block_on_disk(
        &self,
        bytenr: u64,
        generation: u64,
    ) -> Option<super::CopiesVerdict> {
        self.on_disk(bytenr)
            .then(|| super::copies::verify_copies(self.sh, bytenr, generation))
    }

    /// Whether the tree block at `bytenr` is on disk as the state has it:
    /// not dirty, nor being written (its write reaches every copy).
    fn on_disk(&self, bytenr: u64) -> bool {
        !self.st.dirty.contains_key(&bytenr)
            && !crate::sync::lock(&self.sh.inflight).contains_key(&bytenr)
    }

    /// The first good copy, trying copies in `order`, of the tree block
    /// at `bytenr` (see `copies::first_good_copy`); None while the block
    /// is not on disk yet (its write will reach every copy).
    pub fn good_block_on_disk(
        &self,
        bytenr: u64,
        generation: u64,
        order: &[usize],
    ) -> Option<Result<(usize, Vec<u8>)>> {
        self.on_disk(bytenr)
            .then(|| super::copies::first_good_copy(self.sh, bytenr, generation, order))
    }
}

impl BlockRead for Reader<'_> {
    fn read_node(&self, bytenr: u64, generation: u64) -> Result<Arc<Node>> {
        read_block(self.st, self.sh, bytenr, generation)
    }

    fn node_in_memory(&self, bytenr: u64) -> Option<Arc<Node>> {
        block_in_memory(self.st, self.sh, bytenr)
    }

    fn prefetch(&self, bytenrs: &[u64]) {
        prefetch_blocks(self.st, self.sh, bytenrs);
    }

    fn nodesize(&self) -> usize {
        self.sh.nodesize
    }

    fn item_limits(&self) -> crate::format::checker::Limits {
        self.sh.item_limits()
    }
}

/// A writer joined to the running transaction.
pub struct Txn<'a> {
    pub(in crate::txn) st: &'a mut State,
    pub(in crate::txn) sh: &'a Shared,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(st: &'a mut State, sh: &'a Shared) -> Txn<'a> {
        Txn { st, sh }
    }

    /// The root of tree `id` as this transaction has it.
    pub fn root_of(&self, id: u64) -> Result<RootPtr> {
        root_of(self.st, id)
    }

    /// Runs a tree operation on tree `id` and records its new root.
    fn with_root<R>(
        &mut self,
        id: u64,
        f: impl FnOnce(&mut Self, &mut RootPtr) -> Result<R>,
    ) -> Result<R> {
        let mut ptr = self.root_of(id)?;
        if id == tree_id::LOG && self.st.log.is_none() {
            return Err(Error::Invalid("the log found at open is read-only".into()));
        }
        let before = ptr;
        self.st.changes += 1;
        let r = f(self, &mut ptr);
        if ptr != before {
            if id == tree_id::LOG {
                if let Some(l) = self.st.log.as_mut() {
                    l.ptr = ptr;
                }
            } else {
                self.st.set_root(id, ptr);
            }
        }
        r
    }

    pub fn get(&self, tree: u64, key: &Key) -> Result<Option<Vec<u8>>> {
        tree::get(self, &self.root_of(tree)?, key)
    }

    /// [`tree::get_with`] in `tree`: `f` reads the item where it lies.
    pub fn get_with<R>(
        &self,
        tree: u64,
        key: &Key,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        tree::get_with(self, &self.root_of(tree)?, key, f)
    }

    pub fn range(&self, tree: u64, start: &Key, end: &Key) -> Result<Vec<(Key, Vec<u8>)>> {
        collect_range(self, &self.root_of(tree)?, start, end)
    }

    pub fn cursor(&self, tree: u64, key: &Key) -> Result<Cursor> {
        Cursor::seek(self, &self.root_of(tree)?, key)
    }

    pub fn insert(&mut self, tree: u64, key: Key, data: Vec<u8>) -> Result<()> {
        self.with_root(tree, |tx, root| tree::insert(tx, tree, root, key, data))
    }

    pub fn put(&mut self, tree: u64, key: Key, data: Vec<u8>) -> Result<Option<Vec<u8>>> {
        self.with_root(tree, |tx, root| tree::put(tx, tree, root, key, data))
    }

    pub fn update(&mut self, tree: u64, key: Key, data: Vec<u8>) -> Result<Vec<u8>> {
        self.with_root(tree, |tx, root| tree::update(tx, tree, root, key, data))
    }

    pub fn delete(&mut self, tree: u64, key: &Key) -> Result<Vec<u8>> {
        self.with_root(tree, |tx, root| tree::delete(tx, tree, root, key))
    }

    /// Deletes the items of `keys` (sorted) that are present, leaf by
    /// leaf; how many (see `tree::delete_sorted`).
    pub fn delete_sorted(&mut self, tree: u64, keys: &[Key]) -> Result<usize> {
        self.with_root(tree, |tx, root| tree::delete_sorted(tx, tree, root, keys))
    }

    /// Packs the leaves under one parent of tree `tree`, from where `from`
    /// belongs; where to carry on (see `tree::repack_leaves`).
    pub fn repack_leaves(&mut self, tree: u64, from: &Key) -> Result<Option<Key>> {
        self.with_root(tree, |tx, root| tree::repack_leaves(tx, tree, root, from))
    }

    pub fn tree_ids(&self) -> Vec<u64> {
        self.st.roots.keys().copied().collect()
    }

    /// Every tree whose root may not be the last commit's (or that is
    /// new), without looking at each of many snapshots.
    pub(crate) fn moved_roots(&self) -> Vec<u64> {
        debug_assert!(
            self.st.roots.iter().all(|(id, rs)| {
                self.st.committed.get(id) == Some(&rs.ptr) || self.st.moved.contains(id)
            }),
            "a root moved without being noted in State::moved"
        );
        self.st.moved.iter().copied().collect()
    }

    pub fn tree_exists(&self, id: u64) -> bool {
        self.st.roots.contains_key(&id)
    }

    pub fn root_item(&self, id: u64) -> Result<RootItem> {
        let rs = self
            .st
            .roots
            .get(&id)
            .ok_or_else(|| Error::Invalid(format!("tree {id} does not exist")))?;
        Ok(rs.item.clone())
    }

    /// Turns incompatible feature `bit` on for good (older code must not
    /// open the image); the next commit writes it.
    pub fn set_incompat(&mut self, bit: u64) {
        if self.st.sb.incompat & bit == 0 {
            self.st.sb.incompat |= bit;
            self.st.changes += 1;
        }
    }

    /// Sets the identity of subvolume `id` (uuids and transids for send
    /// and receive); the next commit writes it and the feature bit.
    pub fn set_root_ident(&mut self, id: u64, ident: SubvolIdent) -> Result<()> {
        let rs = self.st.roots.get_mut(&id).ok_or(Error::NotFound)?;
        rs.item.ident = Some(ident);
        rs.dirty = true;
        self.st.changes += 1;
        self.set_incompat(crate::format::superblock::INCOMPAT_SUBVOL_UUIDS);
        Ok(())
    }

    /// Sets the flags of tree `id`'s root item (a subvolume's read-only
    /// bit); the next commit writes them.
    pub fn set_root_flags(&mut self, id: u64, flags: u64) -> Result<()> {
        let rs = self.st.roots.get_mut(&id).ok_or(Error::NotFound)?;
        rs.item.flags = flags;
        rs.dirty = true;
        self.st.changes += 1;
        Ok(())
    }

    fn add_root(&mut self, id: u64, ptr: RootPtr, parent_id: u64, name: Vec<u8>) {
        let transid = self.st.transid;
        let item = RootItem {
            bytenr: ptr.bytenr,
            generation: ptr.generation,
            level: ptr.level,
            last_snapshot: if parent_id != 0 { transid } else { 0 },
            parent_id,
            flags: 0,
            created: transid,
            name,
            ident: None,
        };
        self.st.roots.insert(
            id,
            RootState {
                ptr,
                item,
                dirty: true,
            },
        );
        self.st.moved.insert(id);
        self.st.dropped.retain(|&d| d != id);
    }

    /// Creates an empty tree with id `id`.
    pub fn create_tree(&mut self, id: u64, name: &[u8]) -> Result<()> {
        if self.st.roots.contains_key(&id) || id == 0 {
            return Err(Error::Exists);
        }
        let hint = self
            .st
            .roots
            .get(&tree_id::ROOT)
            .map_or(0, |r| r.ptr.bytenr);
        let ptr = tree::create(self, id, hint)?;
        self.add_root(id, ptr, 0, name.to_vec());
        for m in self.st.mechanisms {
            m.tree_created(self, id)?;
        }
        Ok(())
    }

    /// Makes tree `dst` a clone of tree `src` in O(1): both share every
    /// block until one of them changes it.
    pub fn clone_tree(&mut self, src: u64, dst: u64, name: &[u8]) -> Result<()> {
        if !tree_id::is_shareable(src) || !tree_id::is_shareable(dst) {
            return Err(Error::Invalid(format!(
                "trees {src} and {dst} cannot share blocks"
            )));
        }
        if self.st.roots.contains_key(&dst) {
            return Err(Error::Exists);
        }
        // A `chattr +C` file's write in place must not change the clone.
        self.wait_in_place(None);
        let ptr = self.root_of(src)?;
        // Blocks of `src` already dirty are now reachable from both trees:
        // from here on neither may modify them in place.
        let frozen: Vec<u64> = self
            .st
            .dirty
            .iter()
            .filter(|(_, n)| n.owner == src)
            .map(|(&b, _)| b)
            .collect();
        self.st.frozen.extend(frozen);
        self.block_ref(ptr.bytenr, Holder::Root(dst), 1);
        let transid = self.st.transid;
        if let Some(rs) = self.st.roots.get_mut(&src) {
            rs.item.last_snapshot = transid;
            rs.dirty = true;
        }
        self.add_root(dst, ptr, src, name.to_vec());
        for m in self.st.mechanisms {
            m.tree_cloned(self, src, dst)?;
        }
        Ok(())
    }

    /// Drops tree `id`: its root item goes at commit, and every block only
    /// it held is freed in bounded steps by the drop queue's cleaner
    /// (`extent::drop`).
    pub fn drop_tree(&mut self, id: u64) -> Result<()> {
        if !(tree_id::is_shareable(id) || id == tree_id::QUOTA) {
            return Err(Error::Invalid(format!("tree {id} cannot be dropped")));
        }
        let rs = self.st.roots.remove(&id).ok_or(Error::NotFound)?;
        self.block_ref(rs.ptr.bytenr, Holder::Root(id), -1);
        self.st.dropped.push(id);
        for m in self.st.mechanisms {
            m.tree_dropped(self, id)?;
        }
        Ok(())
    }

    /// Allocates a data extent of exactly `len` bytes (a multiple of the
    /// sector size) near `hint`. It is freed at commit unless a file
    /// extent item references it by then.
    pub fn alloc_data(&mut self, len: u64, hint: u64) -> Result<u64> {
        self.alloc_data_range(len, len, hint)
            .map(|(start, _)| start)
    }

    /// Allocates a data extent of `min` to `max` bytes (multiples of the
    /// sector size) near `hint`: the whole `max` where free space has it,
    /// a shorter piece where it is fragmented. Returns (start, length).
    pub fn alloc_data_range(&mut self, min: u64, max: u64, hint: u64) -> Result<(u64, u64)> {
        let s = u64::from(SECTORSIZE);
        if min == 0 || !min.is_multiple_of(s) || !max.is_multiple_of(s) || min > max {
            return Err(Error::Invalid(format!("data extent of {min}..{max} bytes")));
        }
        let (start, len) = self.st.alloc.alloc(GroupKind::Data, min, max, hint)?;
        self.note_new_data(start, len);
        Ok((start, len))
    }

    /// Records a data extent just allocated: a change of the transaction,
    /// and an extent its references follow.
    pub(in crate::txn) fn note_new_data(&mut self, start: u64, len: u64) {
        self.st.changes += 1;
        self.st.refs.new_extent(start, len, ExtentKind::Data);
    }

    /// Checks that `need` fits beside everything already promised (see
    /// `txn::space`). Call it before changing anything: its ENOSPC then
    /// leaves the filesystem as it was and running.
    pub fn reserve(&mut self, need: &Need) -> Result<()> {
        if !need.deleting && !need.moving {
            let new = need.data + need.buffer;
            for m in self.st.mechanisms {
                m.admit(&self.st.slots, need.tree, new + need.shared, new)?;
            }
        }
        let ns = self.sh.nodesize as u64;
        if self.st.check_room(ns, need) {
            Ok(())
        } else {
            Err(Error::NoSpace)
        }
    }

    /// Most extents an allocation of `len` data bytes in pieces of at
    /// most `max_piece` can take on today's free space (for reservations).
    pub fn data_pieces_bound(&self, len: u64, max_piece: u64) -> u64 {
        self.st.alloc.pieces_bound(GroupKind::Data, len, max_piece)
    }

    /// Holds `bytes` of data space for buffered writes until
    /// [`Txn::release_data`] (checked beforehand by [`Txn::reserve`]).
    pub fn hold_data(&mut self, tree: u64, bytes: u64) {
        self.st.data_reserved += bytes;
        for m in self.st.mechanisms {
            m.data_held(&mut self.st.slots, tree, bytes);
        }
    }

    /// Gives back data space held for buffered writes (flushed or dropped).
    pub fn release_data(&mut self, tree: u64, bytes: u64) {
        // Every byte released was held: a reservation never goes below
        // zero (the saturation only keeps a release build running).
        debug_assert!(
            bytes <= self.st.data_reserved,
            "released {bytes} data bytes with {} held",
            self.st.data_reserved
        );
        self.st.data_reserved = self.st.data_reserved.saturating_sub(bytes);
        for m in self.st.mechanisms {
            m.data_released(&mut self.st.slots, tree, bytes);
        }
    }

    /// Writes data into an extent allocated in this transaction. Data is
    /// written before the commit's barrier, so the superblock never points
    /// at data that did not reach the disk.
    pub fn write_data(&mut self, bytenr: u64, data: &[u8]) -> Result<()> {
        if !self.st.refs.is_new(bytenr) {
            return Err(Error::Invalid(format!(
                "data extent {bytenr} was not allocated in this transaction"
            )));
        }
        self.sh.dev.write_data_at(data, bytenr)
    }

    pub fn read_data(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.sh.dev.read_at(buf, bytenr)
    }

    pub fn transid(&self) -> u64 {
        self.st.transid
    }

    /// Changes the profiles new (metadata, data) groups get; None keeps
    /// one. The superblock records them at the commit, with the feature
    /// bit a second copy needs.
    pub fn set_profiles(
        &mut self,
        metadata: Option<crate::format::superblock::Profile>,
        data: Option<crate::format::superblock::Profile>,
    ) -> Result<()> {
        use crate::format::superblock::{Profile, INCOMPAT_DUP};
        let sb = &mut self.st.sb;
        let devices = sb.devices.len();
        for p in [metadata, data].into_iter().flatten() {
            if p.min_devices() > devices {
                return Err(Error::Invalid(format!(
                    "the {} profile needs {} devices; the filesystem has {devices}",
                    p.name(),
                    p.min_devices()
                )));
            }
            if p == Profile::Raid10 && !sb.is_mapped() {
                return Err(Error::Invalid(
                    "raid10 stripes groups over devices, which this filesystem's layout (device 1 holds every first copy: one device, mixed groups, or an older image) cannot".into(),
                ));
            }
        }
        sb.metadata_profile = metadata.unwrap_or(sb.metadata_profile);
        sb.data_profile = data.unwrap_or(sb.data_profile);
        if sb.metadata_profile != Profile::Single || sb.data_profile != Profile::Single {
            sb.incompat |= INCOMPAT_DUP;
        }
        self.st
            .alloc
            .set_profiles(sb.metadata_profile, sb.data_profile);
        self.st.superblock_changed = true;
        Ok(())
    }

    pub fn nodesize_bytes(&self) -> usize {
        self.sh.nodesize
    }

    /// Notes, for the commit's quota accounting, that the extent at
    /// `bytenr` had reference changes other than a block copy's (called
    /// while folding delayed references).
    pub(crate) fn trace_for_quota(&mut self, bytenr: u64, len: u64, data: bool, owner: u64) {
        for m in self.st.mechanisms {
            m.extent_changed(&mut self.st.slots, bytenr, len, data, owner);
        }
    }

    /// What the mechanisms above keep in the transaction (see
    /// `mechanism`).
    pub fn slots(&self) -> &Slots {
        &self.st.slots
    }

    pub(crate) fn slots_mut(&mut self) -> &mut Slots {
        &mut self.st.slots
    }

    pub(crate) fn was_copied(&self, bytenr: u64) -> bool {
        self.st.refs.was_copied(bytenr)
    }

    pub(crate) fn take_delayed_refs(&mut self) -> BTreeMap<u64, PendingExtent> {
        self.st.refs.take()
    }

    pub(crate) fn allocator(&mut self) -> &mut Allocator {
        &mut self.st.alloc
    }

    /// Forgets a freed tree block of tree `owner`. A block of the last
    /// commit stays cached until this commit is durable (`State::retired`).
    pub(crate) fn forget_block(&mut self, bytenr: u64, owner: u64) {
        if let Some(n) = self.st.tree_blocks.get_mut(&owner) {
            *n = n.saturating_sub(1);
        }
        self.st.frozen.remove(&bytenr);
        if self.st.dirty.remove(&bytenr).is_none() {
            self.st.retired.push(bytenr);
        }
    }

    pub(crate) fn free_extent(
        &mut self,
        bytenr: u64,
        len: u64,
        never_committed: bool,
    ) -> Result<()> {
        // A durable log may name what was never committed (see `log`).
        let reusable = never_committed && !self.st.log_durable;
        self.st.alloc.free(bytenr, len, reusable)
    }
}

impl BlockRead for Txn<'_> {
    fn read_node(&self, bytenr: u64, generation: u64) -> Result<Arc<Node>> {
        read_block(self.st, self.sh, bytenr, generation)
    }

    fn node_in_memory(&self, bytenr: u64) -> Option<Arc<Node>> {
        block_in_memory(self.st, self.sh, bytenr)
    }

    fn nodesize(&self) -> usize {
        self.sh.nodesize
    }

    fn item_limits(&self) -> crate::format::checker::Limits {
        self.sh.item_limits()
    }
}

impl BlockWrite for Txn<'_> {
    fn transid(&self) -> u64 {
        self.st.transid
    }

    fn is_writable(&self, bytenr: u64) -> bool {
        self.st.dirty.contains_key(&bytenr) && !self.st.frozen.contains(&bytenr)
    }

    fn node_mut(&mut self, bytenr: u64) -> Result<&mut Node> {
        self.st
            .dirty
            .get_mut(&bytenr)
            .map(Arc::make_mut)
            .ok_or_else(|| Error::corrupt(bytenr, "modifying a block that is not dirty"))
    }

    fn alloc_node(&mut self, owner: u64, level: u8, hint: u64) -> Result<u64> {
        let ns = self.sh.nodesize as u64;
        let kind = Allocator::kind_for_tree(owner);
        let mut flags = 0;
        let bytenr = if owner == tree_id::LOG {
            // No extent item and no free-space change: the commit frees
            // the log's blocks as a set (`State::drop_log`). Placed right
            // after the block kept for the next chain link, so that the
            // log write sends link and blocks as one run (and the link
            // after them is taken from where they end).
            let hint = self.st.log_chain.map_or(hint, |c| c.at + ns);
            let (bytenr, _) = self.st.alloc.alloc_transient(kind, ns, ns, hint)?;
            if let Some(l) = self.st.log.as_mut() {
                l.blocks.insert(bytenr);
                l.unwritten.push(bytenr);
                flags = l.nonce;
            }
            bytenr
        } else {
            let (bytenr, _) = self.st.alloc.alloc(kind, ns, ns, hint)?;
            if !tree_id::is_shareable(owner) {
                *self.st.tree_blocks.entry(owner).or_insert(0) += 1;
            }
            self.st
                .refs
                .new_extent(bytenr, ns, ExtentKind::Tree { owner, level });
            bytenr
        };
        let body = if level == 0 {
            Body::Leaf(crate::format::node::Leaf::new())
        } else {
            Body::Internal(Vec::new())
        };
        let node = Node {
            bytenr,
            generation: self.st.transid,
            owner,
            flags,
            level,
            body,
        };
        self.sh.cache.remove(bytenr);
        self.st.dirty.insert(bytenr, Arc::new(node));
        Ok(bytenr)
    }

    fn block_ref(&mut self, child: u64, holder: Holder, delta: i64) {
        // The log holds no references (see `log`).
        let from_log = match holder {
            Holder::Root(id) => id == tree_id::LOG,
            Holder::Parent(p) => self.st.is_log_block(p),
        };
        if from_log {
            if delta < 0 {
                // A log block another one replaced (or a child moving
                // between parents, read again from the device if need
                // be): no search reaches it again, so it leaves the
                // cache now rather than all at the commit.
                self.sh.cache.remove(child);
            }
            return;
        }
        let h = match holder {
            Holder::Parent(p) => RefHolder::TreeParent(p),
            Holder::Root(id) => RefHolder::TreeRoot(id),
        };
        let ns = self.sh.nodesize as u64;
        self.st.refs.add(child, ns, h, delta);
    }

    fn data_ref(&mut self, bytenr: u64, len: u64, leaf: u64, delta: i64) {
        if self.st.is_log_block(leaf) {
            return;
        }
        self.st
            .refs
            .add(bytenr, len, RefHolder::DataLeaf(leaf), delta);
    }

    fn begin_copy(&mut self, original: u64) {
        self.st.refs.note_copied(original);
        self.st.refs.set_copying(true);
    }

    fn end_copy(&mut self) {
        self.st.refs.set_copying(false);
    }

    fn holds_refs(&self, owner: u64) -> bool {
        owner != tree_id::LOG
    }

    fn forget_replaced(&mut self, bytenr: u64) {
        // Only a written log block is copied, and those live in the cache.
        if !self.st.dirty.contains_key(&bytenr) {
            self.sh.cache.remove(bytenr);
        }
    }
}
