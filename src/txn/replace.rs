//! The engine's half of `canopy device replace`: putting a new device in
//! the place of one of the filesystem's devices while it stays mounted.
//!
//! The new device (the target) takes the source's devid and lies out
//! exactly as the source does: every copy the source holds at physical
//! offset X, the target holds at X. So nothing above the volume changes,
//! not the block group items, not the system array, not the allocator.
//! [`Engine::replace_begin`] records the replace in the root tree (a
//! `DevReplaceItem`: source, the target's future uuid and size, the name
//! it was opened by), puts a marker naming the filesystem and that uuid
//! where the target's first superblock will go, makes the volume send
//! every write meant for the source to the target as well, and commits:
//! a commit waits for data writes in flight and supersedes the fsync log,
//! so from then on every byte written for the source reaches the target
//! too. What was there before, `replace` (above) copies, reading a good
//! copy of each tree block and data extent. [`Engine::replace_finish`]
//! then puts the target in the source's place (the table entry takes the
//! recorded uuid), deletes the record and commits, which writes the
//! target's superblocks; only then are the source's superblocks wiped.
//!
//! A replace cut short by an unmount or a crash keeps its record; the
//! next mount opens the target again by its name, finds its marker and
//! starts the copy over ([`Engine::replace_resume`]): the copy writes
//! every block the source holds, so nothing it did before matters. A
//! cancel, a failure, or a target that cannot be opened or lacks its
//! marker gives the replace up: the record goes, the marker is wiped,
//! and the filesystem stays on the source.

use super::devices::{devices_changed, missing_devids, wipe_superblocks};
use super::open::random_fsid;
use super::Engine;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::items::DevReplaceItem;
use crate::format::key_type::DEV_REPLACE;
use crate::format::tree_id::ROOT;
use crate::format::{Key, DEV_REPLACE_OBJECTID, SECTORSIZE, SUPER_OFFSETS};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The marker's first bytes.
const MARKER_MAGIC: &[u8; 8] = b"CNPYRPL1";
/// Magic, the filesystem's fsid, the target's uuid, then a crc32c of them.
const MARKER_LEN: usize = 44;

fn record_key() -> Key {
    Key::new(DEV_REPLACE_OBJECTID, DEV_REPLACE, 0)
}

/// The marker a replace target carries where its first superblock copy
/// will go: which filesystem and which uuid it is being filled for.
fn marker(fsid: &[u8; 16], uuid: &[u8; 16]) -> Vec<u8> {
    let mut b = Vec::with_capacity(SECTORSIZE as usize);
    b.extend_from_slice(MARKER_MAGIC);
    b.extend_from_slice(fsid);
    b.extend_from_slice(uuid);
    b.extend_from_slice(&crate::format::crc(&b).to_le_bytes());
    b.resize(SECTORSIZE as usize, 0);
    b
}

fn has_marker(dev: &dyn Device, fsid: &[u8; 16], uuid: &[u8; 16]) -> bool {
    let mut b = vec![0u8; SECTORSIZE as usize];
    dev.read_at(&mut b, SUPER_OFFSETS[0]).is_ok()
        && b[..MARKER_LEN] == marker(fsid, uuid)[..MARKER_LEN]
}

fn wipe_marker(dev: &dyn Device) -> Result<()> {
    dev.write_at(&vec![0u8; SECTORSIZE as usize], SUPER_OFFSETS[0])?;
    dev.barrier()
}

impl Engine {
    /// Starts replacing device `source` with `target` (called `name`,
    /// by which a later mount opens it again): checks both, records the
    /// replace, sends the source's writes to the target from now on, and
    /// commits. Returns the flag a failed write to the target sets.
    pub fn replace_begin(
        &self,
        source: u64,
        target: Arc<dyn Device>,
        name: &str,
        avoid_source: bool,
    ) -> Result<Arc<AtomicBool>> {
        if self.is_read_only() {
            return Err(Error::Posix(libc::EROFS, "the filesystem is read-only"));
        }
        if name.is_empty() || name.len() > crate::format::items::DEV_REPLACE_NAME_MAX {
            return Err(Error::Invalid(format!("a target named {name:?}")));
        }
        self.refuse_own_device(target.as_ref(), name)?;
        let record = DevReplaceItem {
            source,
            target_bytes: 0,
            target_uuid: random_fsid(),
            avoid_source,
            name: name.as_bytes().to_vec(),
        };
        let failed = self.write(|tx| {
            let Some(need) = tx.st.sb.device_bytes(source) else {
                return Err(Error::Invalid(format!(
                    "the filesystem has no device {source}"
                )));
            };
            let has = target.size() - target.size() % u64::from(SECTORSIZE);
            if has < need {
                return Err(Error::Invalid(format!(
                    "{name} holds {has} bytes; device {source} holds {need}, and its replacement must hold at least as many"
                )));
            }
            self.refuse_second_replace(source)?;
            if tx.get(ROOT, &record_key())?.is_some() {
                return Err(Error::Posix(
                    libc::EBUSY,
                    "a device replace is recorded (it resumes at mount)",
                ));
            }
            let record = DevReplaceItem {
                target_bytes: need,
                ..record.clone()
            };
            target.write_at(&marker(&self.shared.fsid, &record.target_uuid), SUPER_OFFSETS[0])?;
            target.barrier()?;
            tx.insert(ROOT, record_key(), record.encode())?;
            Ok(self.shared.dev.set_replace_target(source, target.clone()))
        })?;
        self.commit_or_drop_target(&target)?;
        tracing::info!(source, target = name, "device replace started");
        Ok(failed)
    }

    /// The replace the filesystem records, if one was going when it was
    /// last unmounted (or crashed).
    pub fn recorded_replace(&self) -> Result<Option<DevReplaceItem>> {
        let data = self.read(|r| r.get(ROOT, &record_key()))?;
        data.map(|d| DevReplaceItem::decode(&d).map_err(|e| Error::corrupt(0, e)))
            .transpose()
    }

    /// Carries on the recorded replace with `target`, opened again by its
    /// recorded name: it must carry the marker the replace put there and
    /// hold the recorded size. Sends the source's writes to it again and
    /// commits; the copy then starts over. Returns the record and the flag
    /// a failed write to the target sets.
    pub fn replace_resume(
        &self,
        target: Arc<dyn Device>,
    ) -> Result<(DevReplaceItem, Arc<AtomicBool>)> {
        let record = self
            .recorded_replace()?
            .ok_or_else(|| Error::Invalid("no device replace is recorded".into()))?;
        let name = String::from_utf8_lossy(&record.name).into_owned();
        if !has_marker(target.as_ref(), &self.shared.fsid, &record.target_uuid) {
            return Err(Error::Invalid(format!(
                "{name} does not carry the marker of this filesystem's replace"
            )));
        }
        if target.size() < record.target_bytes {
            return Err(Error::Invalid(format!(
                "{name} is smaller than when the replace began"
            )));
        }
        let failed = self.write(|tx| {
            if tx.st.sb.device_bytes(record.source).is_none() {
                return Err(Error::corrupt(0, "replace of a device the table lacks"));
            }
            self.refuse_second_replace(record.source)?;
            Ok(self
                .shared
                .dev
                .set_replace_target(record.source, target.clone()))
        })?;
        self.commit_or_drop_target(&target)?;
        tracing::info!(
            source = record.source,
            target = name,
            "device replace resumed"
        );
        Ok((record, failed))
    }

    fn refuse_second_replace(&self, source: u64) -> Result<()> {
        match self.shared.dev.replace_source() {
            None => Ok(()),
            Some(going) => Err(Error::Posix(
                libc::EBUSY,
                match going == source {
                    true => "this device is being replaced already",
                    false => "another device is being replaced",
                },
            )),
        }
    }

    /// The commit that makes a replace's target receive writes durable;
    /// if it fails, the target is let go.
    fn commit_or_drop_target(&self, target: &Arc<dyn Device>) -> Result<()> {
        self.commit().map(drop).inspect_err(|_| {
            self.shared.dev.clear_replace_target();
            let _ = wipe_marker(target.as_ref());
        })
    }

    /// Whether device `devid` is present (not missing from a degraded
    /// open).
    pub fn device_present(&self, devid: u64) -> bool {
        self.shared.dev.device(devid).is_some()
    }

    /// The device being replaced, if a replace is going.
    pub fn replace_source(&self) -> Option<u64> {
        self.shared.dev.replace_source()
    }

    /// Puts the target in the source's place once everything is copied
    /// (see the module's doc), and commits; then wipes the source's
    /// superblocks, if it is present. `name` is what `filesystem show`
    /// calls the target from now on.
    pub fn replace_finish(&self, name: String) -> Result<()> {
        let (source, old) = self.write(|tx| {
            let source = self
                .shared
                .dev
                .replace_source()
                .ok_or_else(|| Error::Invalid("no device replace is going".into()))?;
            let record = tx
                .get(ROOT, &record_key())?
                .map(|d| DevReplaceItem::decode(&d).map_err(|e| Error::corrupt(0, e)))
                .transpose()?
                .ok_or_else(|| Error::corrupt(0, "a device replace without its record"))?;
            tx.delete(ROOT, &record_key())?;
            let old = self.shared.dev.take_replacement()?;
            let sb = &mut tx.st.sb;
            if let Some(d) = sb.devices.iter_mut().find(|d| d.devid == source) {
                d.uuid = record.target_uuid;
            }
            // A missing source is present again: it takes new copies.
            tx.st.alloc.set_leaving(source, false);
            let missing = missing_devids(&tx.st.sb, &self.shared.dev);
            tx.st.alloc.set_missing(&missing);
            devices_changed(tx);
            Ok((source, old))
        })?;
        crate::sync::write(&self.device_names).insert(source, name);
        self.commit()?;
        if let Some(old) = old {
            // The table no longer names the old device (its uuid), but a
            // filesystem of one device has no table: wipe it either way.
            if let Err(e) = wipe_superblocks(old.as_ref()) {
                tracing::warn!(source, error = %e, "device replace: wiping the old device's superblocks failed");
            }
        }
        tracing::info!(source, "device replace finished");
        Ok(())
    }

    /// Gives a replace up (cancelled, failed, or its target unusable):
    /// deletes its record and commits, and wipes the target's marker (when
    /// a target is given or in use). The source stays.
    pub fn replace_abandon(&self, target: Option<Arc<dyn Device>>) -> Result<()> {
        let target = self.shared.dev.clear_replace_target().or(target);
        self.write(|tx| match tx.delete(ROOT, &record_key()) {
            Ok(_) | Err(Error::NotFound) => Ok(()),
            Err(e) => Err(e),
        })?;
        self.commit()?;
        if let Some(t) = target {
            let _ = wipe_marker(t.as_ref());
        }
        tracing::info!("device replace given up; the filesystem stays on the source");
        Ok(())
    }

    /// Stops a replace for an unmount: the target receives nothing more,
    /// and the record stays, so the next mount resumes it.
    pub fn replace_suspend(&self) {
        if self.shared.dev.clear_replace_target().is_some() {
            tracing::info!("device replace suspended; the next mount resumes it");
        }
    }
}
