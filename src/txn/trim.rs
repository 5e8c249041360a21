//! `canopy filesystem trim` (what fstrim does; FITRIM does not reach a
//! FUSE daemon): the storage is told which of its bytes hold nothing, so
//! a thin image (an image file, an RBD image, a thin block device) can
//! give them back.
//!
//! What is discarded is what the allocator holds free: the free ranges
//! of every block group, and the space no group takes. A range is free
//! there only once the commit that freed it is durable (a freed extent
//! stays pinned until then), so the last commit's trees never point into
//! a discarded range, and a crash at any moment finds everything they
//! name. A group's free ranges are taken out of allocations at the
//! engine's write lock ([`crate::alloc::Allocator::begin_discard`]) and
//! discarded without it, so other operations go on meanwhile, then given
//! back; when the space cannot be spared (a nearly full filesystem) they
//! are discarded under the lock instead. Unallocated space is discarded
//! under the lock: a new group could take it otherwise.

use super::Engine;
use crate::dev::Device;
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// What a trim told the storage.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Trimmed {
    /// Bytes of free space discarded (a range counts once, however many
    /// copies of it the profile keeps).
    pub bytes: u64,
    /// Ranges discarded.
    pub ranges: u64,
    /// Whether the storage took discards at all (an image on a host
    /// filesystem without hole punching, or a disk without discard,
    /// does not).
    pub supported: bool,
}

impl Trimmed {
    /// Counts a discard of `len` bytes the storage did (`supported`) or
    /// has no call for.
    pub(super) fn add(&mut self, len: u64, supported: bool) {
        if supported {
            self.bytes += len;
            self.ranges += 1;
            self.supported = true;
        }
    }
}

impl Engine {
    /// Discards every free range of at least `min_len` bytes (fstrim's
    /// `--minimum`): the groups' free space, then unallocated space.
    pub fn trim(&self, min_len: u64) -> Result<Trimmed> {
        let min_len = min_len.max(1);
        let mut done = Trimmed::default();
        let groups: Vec<u64> =
            self.write(|tx| Ok(tx.allocator().groups().map(|g| g.start).collect()))?;
        for start in groups {
            self.check_alive()?;
            let st = crate::sync::write(&self.state);
            let Some(g) = st.alloc.group_containing(start) else {
                continue;
            };
            let free: Vec<(u64, u64)> = g.free.iter().filter(|r| r.1 >= min_len).collect();
            self.discard_sparing_lock(st, &free, |pieces| {
                for &(s, l) in pieces {
                    done.add(l, self.shared.dev.discard(s, l)?);
                }
                Ok(())
            })?;
        }
        self.write(|tx| {
            for (devid, _) in tx.allocator().devices() {
                let Some(dev) = tx.sh.dev.device(devid) else {
                    continue;
                };
                let _pass = tx.sh.dev.pass();
                for (s, l) in tx.allocator().unallocated_ranges(devid) {
                    if l >= min_len {
                        done.add(l, dev.discard(s, l)?);
                    }
                }
            }
            Ok(())
        })?;
        Ok(done)
    }
}
