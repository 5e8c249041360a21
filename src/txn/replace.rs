//! The engine's half of `canopy device replace`: putting a new device in
//! the place of one of the filesystem's devices while it stays mounted.
//!
//! The new device (the target) takes the source's devid and lies out
//! exactly as the source does: every copy the source holds at physical
//! offset X, the target holds at X. So nothing above the volume changes,
//! not the block group items, not the system array, not the allocator.
//! [`Engine::replace_begin`] makes the volume send every write meant for
//! the source to the target as well, then commits: a commit waits for
//! data writes in flight, and supersedes the fsync log, so from then on
//! every byte written for the source reaches the target too. What was
//! there before, `replace` (above) copies, reading a good copy of each
//! tree block and data extent. [`Engine::replace_finish`] then puts the
//! target in the source's place (a new uuid in the device table) and
//! commits, which writes the target's superblocks; only then are the
//! source's superblocks wiped.
//!
//! Nothing about the replace is durable before that last commit: a crash
//! or a cancel leaves the filesystem on the source, as it was, and the
//! target unused (it has no superblock naming the filesystem), so the
//! replace starts over.

use super::devices::{devices_changed, missing_devids, wipe_superblocks};
use super::open::random_fsid;
use super::Engine;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::SECTORSIZE;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

impl Engine {
    /// Starts replacing device `source` with `target` (called `name`):
    /// checks both, sends the source's writes to the target from now on,
    /// and commits. Returns the flag a failed write to the target sets.
    pub fn replace_begin(
        &self,
        source: u64,
        target: Arc<dyn Device>,
        name: &str,
    ) -> Result<Arc<AtomicBool>> {
        if self.is_read_only() {
            return Err(Error::Posix(libc::EROFS, "the filesystem is read-only"));
        }
        self.refuse_own_device(target.as_ref(), name)?;
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
            if let Some(going) = self.shared.dev.replace_source() {
                return Err(Error::Posix(
                    libc::EBUSY,
                    match going == source {
                        true => "this device is being replaced already",
                        false => "another device is being replaced",
                    },
                ));
            }
            Ok(self.shared.dev.set_replace_target(source, target.clone()))
        })?;
        if let Err(e) = self.commit() {
            self.shared.dev.clear_replace_target();
            return Err(e);
        }
        tracing::info!(source, target = name, "device replace started");
        Ok(failed)
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
            let old = self.shared.dev.take_replacement()?;
            let sb = &mut tx.st.sb;
            if let Some(d) = sb.devices.iter_mut().find(|d| d.devid == source) {
                d.uuid = random_fsid();
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

    /// Gives a replace up (cancelled, or a write to the target failed):
    /// the source stays, and the target is left unused.
    pub fn replace_abandon(&self) {
        if self.shared.dev.clear_replace_target().is_some() {
            tracing::info!("device replace given up; the filesystem stays on the source");
        }
    }
}
