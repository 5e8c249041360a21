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
use super::OpenOptions;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::superblock::{DeviceItem, Superblock};
use crate::format::SECTORSIZE;
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
        refuse_missing(&missing, opts)?;
    }
    Ok(Assembled {
        sb: newest,
        devices,
        names,
    })
}

/// Names the missing devices, unless the open is degraded (and then
/// read-only: this version writes no copy to a device that is gone).
fn refuse_missing(missing: &[&DeviceItem], opts: &OpenOptions) -> Result<()> {
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
            "{} missing: name every device (mount -o device=PATH, or --device PATH), or open with the copies left (-o degraded,ro)",
            names.join(", ")
        )));
    }
    if !opts.read_only {
        return Err(Error::Invalid(format!(
            "{} missing: a degraded open is read-only in this version (-o degraded,ro)",
            names.join(", ")
        )));
    }
    tracing::warn!(
        "degraded: {} missing; reading the copies left",
        names.join(", ")
    );
    Ok(())
}
