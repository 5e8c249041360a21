//! The devices of a filesystem: the table mkfs writes, and which device
//! is which at open.
//!
//! Every device holds superblock copies; each copy names its own devid
//! and the whole device table (devid, size, uuid), so any device tells
//! which others the filesystem needs. At open the newest copy among all
//! the devices given is the filesystem's state, each device is matched
//! to its table entry by devid and uuid, and a device the table names
//! but nobody gave is refused by name unless the open is degraded.

use super::open::{random_fsid, read_best_superblock, MIN_DEVICE_BYTES};
use super::{Engine, OpenOptions, Txn};
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::superblock::{
    DeviceItem, Superblock, DEVICES_MAX, INCOMPAT_DEVICES, SYSTEM_CHUNKS_MAX_DEVICES,
};
use crate::format::{SECTORSIZE, SUPER_OFFSETS, SUPER_SIZE};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table of a new filesystem over `devs`: devids 1, 2, ... in order,
/// each with its whole size (in whole sectors) and a fresh uuid.
pub(super) fn new_table(devs: &[Arc<dyn Device>]) -> Result<Vec<DeviceItem>> {
    if devs.is_empty() || devs.len() > crate::format::superblock::DEVICES_MAX {
        return Err(Error::Invalid(format!(
            "{} devices given; a filesystem has 1 to {}",
            devs.len(),
            crate::format::superblock::DEVICES_MAX
        )));
    }
    devs.iter()
        .enumerate()
        .map(|(i, d)| {
            let size = d.size();
            if size < MIN_DEVICE_BYTES {
                return Err(Error::Invalid(format!(
                    "device {} of {size} bytes is smaller than the minimum {MIN_DEVICE_BYTES}",
                    i + 1
                )));
            }
            Ok(DeviceItem {
                devid: i as u64 + 1,
                bytes: size - size % u64::from(SECTORSIZE),
                uuid: random_fsid(),
            })
        })
        .collect()
}

/// The filesystem `devs` make up: its newest superblock and its present
/// devices by devid.
pub(super) struct Assembled {
    pub sb: Superblock,
    pub devices: BTreeMap<u64, Arc<dyn Device>>,
    /// What the opener called each device, by devid.
    pub names: BTreeMap<u64, String>,
}

/// Matches `devs` (in any order) to the device table of their newest
/// superblock. Refuses devices of another filesystem, unknown or
/// repeated ones, and (unless `opts.degraded`) a missing one.
pub(super) fn assemble(devs: Vec<Arc<dyn Device>>, opts: &OpenOptions) -> Result<Assembled> {
    let name = |i: usize| {
        opts.device_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("device {} given", i + 1))
    };
    let mut found: Vec<(Superblock, Arc<dyn Device>)> = Vec::new();
    for (i, dev) in devs.into_iter().enumerate() {
        let sb = read_best_superblock(dev.as_ref()).map_err(|e| match e {
            Error::NotCanopy(why) if i > 0 => Error::NotCanopy(format!("{}: {why}", name(i))),
            e => e,
        })?;
        found.push((sb, dev));
    }
    let newest = found
        .iter()
        .max_by_key(|(sb, _)| sb.generation)
        .map(|(sb, _)| sb.clone())
        .ok_or_else(|| Error::Invalid("no device given".into()))?;
    let mut devices: BTreeMap<u64, Arc<dyn Device>> = BTreeMap::new();
    let mut names = BTreeMap::new();
    for (i, (sb, dev)) in found.into_iter().enumerate() {
        let which = name(i);
        if sb.fsid != newest.fsid {
            return Err(Error::Invalid(format!(
                "{which} belongs to another filesystem ({} rather than {})",
                crate::format::uuid::shown(&sb.fsid),
                crate::format::uuid::shown(&newest.fsid)
            )));
        }
        let entry = newest.devices.iter().find(|d| d.devid == sb.devid);
        let own = sb.devices.iter().find(|d| d.devid == sb.devid);
        match (entry, own) {
            (Some(e), Some(o)) if e.uuid == o.uuid => {}
            _ => {
                return Err(Error::Invalid(format!(
                    "{which} was device {} of this filesystem but is no longer one of its devices (replaced or removed)",
                    sb.devid
                )))
            }
        }
        if devices.contains_key(&sb.devid) {
            return Err(Error::Invalid(format!(
                "{which} is device {} again (named twice, or a copy of it)",
                sb.devid
            )));
        }
        if sb.generation != newest.generation {
            tracing::warn!(
                devid = sb.devid,
                generation = sb.generation,
                newest = newest.generation,
                "device's superblock is older than the filesystem's: a commit did not reach it"
            );
        }
        devices.insert(sb.devid, dev);
        if let Some(n) = opts.device_names.get(i) {
            names.insert(sb.devid, n.clone());
        }
    }
    let missing: Vec<&DeviceItem> = newest
        .devices
        .iter()
        .filter(|d| !devices.contains_key(&d.devid))
        .collect();
    if !missing.is_empty() {
        refuse_missing(&missing, opts, newest.is_mapped())?;
    }
    Ok(Assembled {
        sb: newest,
        devices,
        names,
    })
}

/// Names the missing devices, unless the open is degraded; in the bound
/// layout (`mapped` false), where device 1 holds every first copy, a
/// degraded open without device 1 is read-only.
fn refuse_missing(missing: &[&DeviceItem], opts: &OpenOptions, mapped: bool) -> Result<()> {
    let names: Vec<String> = missing
        .iter()
        .map(|d| {
            format!(
                "device {} ({} bytes, uuid {})",
                d.devid,
                d.bytes,
                crate::format::uuid::shown(&d.uuid)
            )
        })
        .collect();
    if !opts.degraded {
        return Err(Error::Invalid(format!(
            "{} missing: name every device (mount -o device=PATH, or --device PATH), or open with the copies left (-o degraded)",
            names.join(", ")
        )));
    }
    let primary = missing
        .iter()
        .any(|d| d.devid == crate::volume::PRIMARY_DEVID);
    if primary && !opts.read_only && !mapped {
        return Err(Error::Invalid(format!(
            "{} missing: device 1 holds the first copy of every group, so without it a degraded open is read-only (-o degraded,ro)",
            names.join(", ")
        )));
    }
    tracing::warn!(
        "degraded: {} missing; reading the copies left{}",
        names.join(", "),
        match opts.read_only {
            true => "",
            false => ", writing new groups to the devices present",
        }
    );
    Ok(())
}

impl Engine {
    /// Adds `dev` to the filesystem as its next devid (`canopy device
    /// add`) and commits: from then on every superblock names it, and
    /// new groups may keep copies there (existing ones move with a
    /// balance, `-mconvert=raid1` for example). `name` is what
    /// `filesystem show` calls it.
    pub fn add_device(&self, dev: Arc<dyn Device>, name: String) -> Result<u64> {
        let bytes = dev.size() - dev.size() % u64::from(SECTORSIZE);
        if bytes < MIN_DEVICE_BYTES {
            return Err(Error::Invalid(format!(
                "{name} holds {bytes} bytes, less than the minimum {MIN_DEVICE_BYTES}"
            )));
        }
        self.refuse_own_device(dev.as_ref(), &name)?;
        let devid = self.write(|tx| {
            if self.shared.dev.replace_source().is_some() {
                return Err(Error::Posix(libc::EBUSY, "a device replace is running"));
            }
            let sb = &mut tx.st.sb;
            if sb.devices.len() >= DEVICES_MAX {
                return Err(Error::Invalid(format!(
                    "the filesystem has {DEVICES_MAX} devices, the most it can have"
                )));
            }
            if !sb.has_device_table() {
                if tx.st.alloc.system_chunks().len() > SYSTEM_CHUNKS_MAX_DEVICES {
                    return Err(Error::Invalid(format!(
                        "more than {SYSTEM_CHUNKS_MAX_DEVICES} system groups with two copies: balance the system groups first"
                    )));
                }
                sb.incompat |= INCOMPAT_DEVICES;
            }
            let devid = sb.devices.iter().map(|d| d.devid).max().unwrap_or(0) + 1;
            sb.devices.push(DeviceItem {
                devid,
                bytes,
                uuid: random_fsid(),
            });
            if sb.is_mapped() {
                // Room in the logical address space for what it holds.
                add_logical_space(tx, bytes);
            }
            devices_changed(tx);
            self.shared.dev.add_device(devid, dev.clone());
            Ok(devid)
        })?;
        crate::sync::write(&self.device_names).insert(devid, name);
        self.commit()?;
        tracing::info!(devid, bytes, "device added");
        Ok(devid)
    }

    /// Refuses a device (called `name`) whose superblock names this
    /// filesystem: one of its devices, or one that was.
    pub(super) fn refuse_own_device(&self, dev: &dyn Device, name: &str) -> Result<()> {
        match read_best_superblock(dev) {
            Ok(sb) if sb.fsid == self.shared.fsid => Err(Error::Invalid(format!(
                "{name} is already device {} of this filesystem",
                sb.devid
            ))),
            _ => Ok(()),
        }
    }

    /// Marks device `devid` as being emptied, so that no new copy goes
    /// there (`canopy device remove` sets it before its balance), or
    /// not.
    pub fn set_device_leaving(&self, devid: u64, leaving: bool) -> Result<()> {
        self.write(|tx| {
            tx.st.alloc.set_leaving(devid, leaving);
            Ok(())
        })
    }

    /// The first device the filesystem names that this open lacks
    /// (`canopy device remove missing`).
    pub fn missing_device(&self) -> Option<u64> {
        let st = crate::sync::read(&self.state);
        missing_devids(&st.sb, &self.shared.dev).first().copied()
    }

    /// Whether device `devid` can leave the filesystem once no copy lies
    /// on it: it is one of its devices (not device 1 in the bound
    /// layout), and the profiles new groups get can be kept by the devices
    /// left.
    pub fn check_removable(&self, devid: u64) -> Result<()> {
        let st = crate::sync::read(&self.state);
        removable(&st.sb, devid)
    }

    /// Takes device `devid` out of the filesystem (`canopy device
    /// remove`, once a balance moved every copy off it): commits a
    /// device table without it, then wipes its superblock copies so that
    /// it is never taken for one of the filesystem's devices again.
    pub fn remove_device(&self, devid: u64) -> Result<()> {
        let dev = self.write(|tx| {
            removable(&tx.st.sb, devid)?;
            let left = tx.st.alloc.allocated_on(devid);
            if left > 0 {
                return Err(Error::Posix(
                    libc::EBUSY,
                    "copies still lie on the device (a balance must move them first)",
                ));
            }
            tx.st.sb.devices.retain(|d| d.devid != devid);
            tx.st.alloc.set_leaving(devid, false);
            devices_changed(tx);
            let key = super::persist::device_stats_key(devid);
            if tx.get(crate::format::tree_id::ROOT, &key)?.is_some() {
                tx.delete(crate::format::tree_id::ROOT, &key)?;
            }
            Ok(self.shared.dev.remove_device(devid))
        })?;
        crate::sync::write(&self.device_names).remove(&devid);
        self.commit()?;
        // A missing device is not there to wipe: its table is older than
        // every present device's, which no longer names it.
        if let Some(dev) = dev {
            wipe_superblocks(dev.as_ref())?;
        }
        tracing::info!(devid, "device removed");
        Ok(())
    }
}

/// The mapped layout's logical address space grows by `bytes` (a device
/// added or grown): the superblock, the allocator and the volume's map
/// follow.
pub(super) fn add_logical_space(tx: &mut Txn<'_>, bytes: u64) {
    tx.st.sb.total_bytes += bytes;
    let total = tx.st.sb.total_bytes;
    tx.st.alloc.set_logical_bytes(total);
    tx.sh.dev.set_logical_bytes(total);
}

/// The allocator follows the device table, and the next commit writes it.
pub(super) fn devices_changed(tx: &mut Txn<'_>) {
    let sb = &tx.st.sb;
    let others = sb.devices.iter().map(|d| (d.devid, d.bytes)).collect();
    let table = sb.has_device_table();
    tx.st.alloc.set_devices(others, table);
    tx.st.superblock_changed = true;
}

/// The devices the table names that the volume lacks (a degraded open).
pub(super) fn missing_devids(sb: &Superblock, vol: &crate::volume::Volume) -> Vec<u64> {
    sb.devices
        .iter()
        .map(|d| d.devid)
        .filter(|&d| vol.device(d).is_none())
        .collect()
}

fn removable(sb: &Superblock, devid: u64) -> Result<()> {
    if devid == crate::volume::PRIMARY_DEVID && !sb.is_mapped() {
        return Err(Error::Invalid(
            "device 1 holds the first copy of every block group in this layout: it cannot be removed (replace it instead)".into(),
        ));
    }
    if sb.device_bytes(devid).is_none() {
        return Err(Error::Invalid(format!(
            "the filesystem has no device {devid}"
        )));
    }
    let left = sb.devices.len() - 1;
    for p in [sb.metadata_profile, sb.data_profile] {
        if p.min_devices() > left {
            return Err(Error::Invalid(format!(
                "the {} profile needs {} devices and {left} would be left: convert first (canopy balance start -mconvert=dup -dconvert=single)",
                p.name(),
                p.min_devices()
            )));
        }
    }
    Ok(())
}

/// Zeroes every superblock copy on `dev` (the magic with it), durably.
pub(super) fn wipe_superblocks(dev: &dyn Device) -> Result<()> {
    let zeros = vec![0u8; SUPER_SIZE as usize];
    for &off in SUPER_OFFSETS.iter() {
        if off + SUPER_SIZE <= dev.size() {
            dev.write_at(&zeros, off)?;
        }
    }
    dev.barrier()
}
