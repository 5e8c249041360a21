//! Growing a mounted filesystem into a larger device (`canopy filesystem
//! resize [DEVID:]SIZE`).
//!
//! Block groups are carved out of the devices as they fill, so growing is
//! only a new end: the allocator may place groups up to it, and the
//! superblock records it. Both change in one transaction, committed at
//! once; until that commit is durable, a crash finds the old size and
//! nothing placed beyond it (a log never names space of groups made since
//! the last commit, see `txn::log`). Superblock copies the new space
//! holds (64 MiB, 256 GiB) are cut out of the groups made there and
//! written by every commit from then on. Shrinking, which must first
//! move everything out of the space given up, is not supported yet.

use super::Engine;
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
    /// Grows device `devid` as `to` says, looking at the device's size
    /// again first (it may have grown since open: `rbd resize`, a longer
    /// image file). Asking for the present size does nothing.
    ///
    /// Device 1 is the filesystem in the bound layout: its size is the
    /// logical space. Another device of the bound layout only holds
    /// further copies, so growing it makes room for those. In the mapped
    /// layout every device's bytes add to the logical space.
    pub fn grow(&self, devid: u64, to: GrowTo) -> Result<Grown> {
        let device = self.shared.dev.device(devid).ok_or_else(|| {
            Error::Invalid(format!(
                "device {devid} is not one of this filesystem's present devices (see `canopy filesystem show`)"
            ))
        })?;
        let device_bytes = whole_sectors(device.refresh_size()?);
        let grown = self.write(|tx| {
            let mapped = tx.st.sb.is_mapped();
            let old_bytes = match (devid, mapped) {
                (crate::volume::PRIMARY_DEVID, false) => tx.st.sb.total_bytes,
                _ => tx.st.sb.device_bytes(devid).ok_or_else(|| {
                    Error::Invalid(format!("device {devid} is not in the device table"))
                })?,
            };
            let new_bytes = whole_sectors(match to {
                GrowTo::By(n) => old_bytes.saturating_add(n),
                GrowTo::To(n) => n,
                GrowTo::Max => device_bytes,
            });
            if new_bytes < old_bytes {
                return Err(Error::Invalid(format!(
                    "device {devid} holds {old_bytes} bytes of the filesystem; shrinking it is not supported yet"
                )));
            }
            if new_bytes > device_bytes {
                return Err(Error::Invalid(format!(
                    "device {devid} holds only {device_bytes} bytes, {new_bytes} asked; grow the device first (rbd resize, truncate -s, a larger partition)"
                )));
            }
            if new_bytes > old_bytes {
                grow_device(tx, devid, old_bytes, new_bytes);
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
                devid,
                from = grown.old_bytes,
                to = grown.new_bytes,
                "device grown"
            );
        }
        Ok(grown)
    }
}

/// Records device `devid`'s new size in the superblock and the
/// allocator, and the logical space that grows with it.
fn grow_device(tx: &mut super::Txn<'_>, devid: u64, old_bytes: u64, new_bytes: u64) {
    let mapped = tx.st.sb.is_mapped();
    for d in tx.st.sb.devices.iter_mut().filter(|d| d.devid == devid) {
        d.bytes = d.bytes.max(new_bytes);
    }
    if devid == crate::volume::PRIMARY_DEVID {
        tx.st.alloc.grow(new_bytes);
    } else {
        super::devices::devices_changed(tx);
    }
    match mapped {
        true => super::devices::add_logical_space(tx, new_bytes - old_bytes),
        false if devid == crate::volume::PRIMARY_DEVID => tx.st.sb.total_bytes = new_bytes,
        false => {}
    }
    tx.st.superblock_changed = true;
}
