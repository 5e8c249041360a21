//! Space reservations: an operation asks for the worst case of what it
//! will allocate before it changes anything, so a full disk is an ENOSPC
//! at the call and never a surprise half-way through an operation or in
//! the commit.
//!
//! Three amounts are promised at any moment (btrfs's block reserves are
//! the model):
//!
//! - **The commit's own need.** A commit copies blocks of the trees it
//!   maintains (extent, free space, block groups, checksums, root tree) and
//!   inserts items for every extent the transaction allocated or freed.
//!   Each block is copied at most once per transaction, so the need is
//!   bounded by the size of those trees plus their growth. The sizes are
//!   counted exactly ([`TreeBlocks`]), so this *global reserve* follows
//!   the filesystem as it grows and costs a few blocks on a small one.
//! - **Buffered data.** Data written but not yet given extents holds a
//!   reservation of its sector footprint, plus the tree items its flush
//!   will insert, until the flush turns it into extents. So a flush, and
//!   the commit after it, cannot fail for space the write was promised.
//! - **The operation at hand**: copies of the paths of the items it will
//!   change, with a split at every level. Nothing of this is held after
//!   the operation: every operation runs alone under the state lock, so
//!   checking it against what is left is enough.
//!
//! Ordinary operations also leave a margin ([`DELETE_MARGIN_BLOCKS`])
//! that only deletions may use, so unlink, rmdir and truncate work on a
//! full disk. When a check fails, the caller flushes buffered data and
//! commits (freed space is pinned until a commit is durable), then asks
//! again before answering ENOSPC (see `Fs::write_reserved`).

use super::State;
use crate::alloc::Claims;
use crate::format::tree_id;
use std::collections::BTreeMap;

/// Tree blocks kept for deletions beyond what ordinary operations may use.
pub const DELETE_MARGIN_BLOCKS: u64 = 64;

/// Bytes of tree items the worst case adds per flushed data sector: a file
/// extent item, a checksum, an extent item with its back-reference and two
/// free-space items, each with its item header, when every sector ends up
/// an extent of its own.
const META_BYTES_PER_DATA_SECTOR: u64 = 256;

/// Bytes of commit-time items per extent changed in the transaction (extent
/// item, back-reference, free-space items, all with item headers).
const COMMIT_BYTES_PER_EXTENT: u64 = 256;

/// Bytes of tree items one new data extent brings, in its file and at the
/// commit: a file extent item (78) and the commit's items.
pub const EXTENT_ITEMS_BYTES: u64 = 80 + COMMIT_BYTES_PER_EXTENT;

/// Trees the commit itself edits in metadata groups; the root tree and
/// the block group tree live in system groups.
const COMMIT_TREES: [u64; 5] = [
    tree_id::EXTENT,
    tree_id::CSUM,
    tree_id::QUOTA,
    tree_id::FREE_BY_START,
    tree_id::FREE_BY_LEN,
];

/// Number of blocks in each tree that never shares blocks (exact: counted
/// at open, then +1 per block allocated and -1 per block freed).
pub(crate) type TreeBlocks = BTreeMap<u64, u64>;

/// What an operation is about to do, for [`State::check_room`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Need {
    /// Tree the operation edits (its height sizes a path copy).
    pub tree: u64,
    /// Items it inserts, changes or deletes there.
    pub items: u64,
    /// Bytes of item payload it adds beyond small fixed-size items
    /// (inline data, xattr values, symlink targets).
    pub payload: u64,
    /// Data bytes it allocates now (its extent items are among `items`).
    pub data: u64,
    /// Data bytes it buffers for a later flush: held until flushed, with
    /// the tree items the flush may need (see `META_BYTES_PER_DATA_SECTOR`).
    pub buffer: u64,
    /// A deletion: may use the margin kept from ordinary operations.
    pub deleting: bool,
    /// Bytes of existing extents the operation makes the tree reach
    /// (a reflink): they count against referenced-bytes limits only.
    pub shared: u64,
    /// Relocation (balance): it changes no ownership, so no quota limit
    /// applies to what it allocates.
    pub moving: bool,
}

impl Need {
    pub fn items(tree: u64, items: u64) -> Need {
        Need {
            tree,
            items,
            ..Need::default()
        }
    }

    pub fn data(mut self, bytes: u64) -> Need {
        self.data = bytes;
        self
    }

    pub fn buffer(mut self, bytes: u64) -> Need {
        self.buffer = bytes;
        self
    }

    pub fn payload(mut self, bytes: u64) -> Need {
        self.payload = bytes;
        self
    }

    pub fn shared(mut self, bytes: u64) -> Need {
        self.shared = bytes;
        self
    }

    pub fn deleting(mut self) -> Need {
        self.deleting = true;
        self
    }

    pub fn moving(mut self) -> Need {
        self.moving = true;
        self
    }
}

/// Most pointers or items one tree block of `ns` bytes can hold (a
/// bound: every item costs at least its 17-byte key and an offset).
fn max_entries_per_block(ns: u64) -> u64 {
    ns / 16
}

impl State {
    fn level_of(&self, tree: u64) -> u64 {
        self.roots.get(&tree).map_or(0, |r| u64::from(r.ptr.level))
    }

    /// Blocks to copy a path of `tree` and split every block on it, and
    /// to grow a new root.
    fn path_blocks(&self, tree: u64) -> u64 {
        2 * (self.level_of(tree) + 1) + 1
    }

    fn blocks_for_bytes(ns: u64, bytes: u64) -> u64 {
        // Leaves may be half full: count items at half a block each.
        bytes.div_ceil(ns / 2)
    }

    /// Tree blocks the commit of the running transaction may allocate:
    /// (in metadata groups, in system groups).
    pub(crate) fn commit_need_blocks(&self, ns: u64) -> (u64, u64) {
        let mut copies = 0;
        for t in COMMIT_TREES {
            copies += self.tree_blocks.get(&t).copied().unwrap_or(1) + self.path_blocks(t);
        }
        let changed = self.refs.len() as u64
            + self.dropped.len() as u64
            + copies
            + self
                .mechanisms
                .iter()
                .map(|m| m.commit_entries(&self.slots, max_entries_per_block(ns)))
                .sum::<u64>();
        let growth = Self::blocks_for_bytes(ns, changed * COMMIT_BYTES_PER_EXTENT);
        let system_tree = |t| self.tree_blocks.get(&t).copied().unwrap_or(1) + self.path_blocks(t);
        let root_tree = system_tree(tree_id::ROOT)
            + system_tree(tree_id::BLOCK_GROUP)
            + Self::blocks_for_bytes(ns, self.roots.len() as u64 * 128);
        (copies + growth, root_tree)
    }

    /// Tree blocks the flush of `bytes` of buffered data may need.
    fn flush_need_blocks(&self, ns: u64, bytes: u64) -> u64 {
        let sectors = bytes.div_ceil(u64::from(crate::format::SECTORSIZE));
        Self::blocks_for_bytes(ns, sectors * META_BYTES_PER_DATA_SECTOR)
    }

    /// The claims the running transaction holds with `need` added.
    pub(crate) fn claims_with(&self, ns: u64, need: &Need) -> Claims {
        let (commit_meta, commit_sys) = self.commit_need_blocks(ns);
        let buffered = self.data_reserved + need.buffer;
        let op = need.items * self.path_blocks(need.tree)
            + Self::blocks_for_bytes(ns, need.payload)
            + self.flush_need_blocks(ns, buffered + self.flushing);
        let margin = if need.deleting {
            0
        } else {
            DELETE_MARGIN_BLOCKS
        };
        Claims {
            data: buffered + need.data,
            metadata: (commit_meta + op + margin) * ns,
            system: commit_sys * ns,
            block: ns,
        }
    }

    /// Whether `need` fits beside everything already promised; if so, the
    /// allocator learns the new claims (so new groups respect them).
    pub(crate) fn check_room(&mut self, ns: u64, need: &Need) -> bool {
        let claims = self.claims_with(ns, need);
        if !self.alloc.can_meet(&claims) {
            return false;
        }
        self.alloc.set_claims(claims);
        true
    }

    /// Data bytes writers can still get: free and unallocated space less
    /// what is promised to buffered data, the commit, and metadata kept
    /// for deletions. Counted as flushed data (an extent item per 2 MiB):
    /// the worst case a buffered write holds while it waits is given back
    /// by its flush, and a writer that meets it flushes and asks again.
    pub(crate) fn data_available(&self, ns: u64) -> u64 {
        let fits = |d: u64| {
            // An extent item (and its commit-time items) per 2 MiB.
            let items = d.div_ceil(2 << 20);
            let need = Need::items(tree_id::FS, 0)
                .data(d)
                .payload(items * EXTENT_ITEMS_BYTES);
            self.alloc.can_meet(&self.claims_with(ns, &need))
        };
        // Largest d that fits, by halving.
        let (mut lo, mut hi) = (0u64, self.alloc.bytes_free());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}
