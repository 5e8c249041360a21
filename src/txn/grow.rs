//! Growing a mounted filesystem into a larger device (`canopy filesystem
//! resize`).
//!
//! Block groups are carved out of the device as it fills, so growing is
//! only a new end: the allocator may place groups up to it, and the
//! superblock records it. Both change in one transaction, committed at
//! once; until that commit is durable, a crash finds the old size and
//! nothing placed beyond it (a log never names space of groups made since
//! the last commit, see `txn::log`). Superblock copies the new space
//! holds (64 MiB, 256 GiB) are cut out of the groups made there and
//! written by every commit from then on. Shrinking, which must first
//! move everything out of the space given up, is not supported yet.

use super::Engine;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::SECTORSIZE;

/// The size asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GrowTo {
    /// This many bytes more.
    By(u64),
    /// This total size.
    To(u64),
    /// All of the device.
    Max,
}

/// What a resize did: the filesystem's size before and after, and the
/// device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grown {
    pub old_bytes: u64,
    pub new_bytes: u64,
    pub device_bytes: u64,
}

fn whole_sectors(n: u64) -> u64 {
    n - n % u64::from(SECTORSIZE)
}

impl Engine {
    /// Grows the filesystem as `to` says, looking at the device's size
    /// again first (it may have grown since open: `rbd resize`, a longer
    /// image file). Asking for the present size does nothing.
    pub fn grow(&self, to: GrowTo) -> Result<Grown> {
        let device_bytes = whole_sectors(self.shared.dev.refresh_size()?);
        let grown = self.write(|tx| {
            // Device 1's share: the whole filesystem in the bound layout.
            let mapped = tx.st.sb.is_mapped();
            let old_bytes = match mapped {
                true => tx.st.sb.device_bytes(1).ok_or_else(|| {
                    Error::Invalid(
                        "device 1, which resize grows, was removed from the filesystem".into(),
                    )
                })?,
                false => tx.st.sb.total_bytes,
            };
            let asked = match to {
                GrowTo::By(n) => old_bytes.saturating_add(n),
                GrowTo::To(n) => n,
                GrowTo::Max => device_bytes,
            };
            let new_bytes = whole_sectors(asked);
            if new_bytes < old_bytes {
                return Err(Error::Invalid(format!(
                    "the filesystem holds {old_bytes} bytes; shrinking it is not supported yet"
                )));
            }
            if new_bytes > device_bytes {
                return Err(Error::Invalid(format!(
                    "the device holds only {device_bytes} bytes, {new_bytes} asked; grow the device first (rbd resize, truncate -s, a larger partition)"
                )));
            }
            if new_bytes > old_bytes {
                tx.st.alloc.grow(new_bytes);
                tx.st.sb.total_bytes = match mapped {
                    true => tx.st.sb.total_bytes + (new_bytes - old_bytes),
                    false => new_bytes,
                };
                if mapped {
                    tx.st.alloc.set_logical_bytes(tx.st.sb.total_bytes);
                    self.shared.dev.set_logical_bytes(tx.st.sb.total_bytes);
                }
                for d in tx.st.sb.devices.iter_mut().filter(|d| d.devid == 1) {
                    d.bytes = d.bytes.max(new_bytes);
                }
                tx.st.superblock_changed = true;
            }
            Ok(Grown {
                old_bytes,
                new_bytes,
                device_bytes,
            })
        })?;
        if grown.new_bytes > grown.old_bytes {
            self.commit()?;
            tracing::info!(
                from = grown.old_bytes,
                to = grown.new_bytes,
                "filesystem grown"
            );
        }
        Ok(grown)
    }
}
