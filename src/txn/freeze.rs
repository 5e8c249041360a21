//! `canopy filesystem freeze` and `thaw` at the engine: a commit, then
//! the volume's gate holds every write until the thaw or the timeout
//! (see `volume::freeze`). Reads, and changes that stay in memory, go on;
//! whatever must reach the storage (a flush, an fsync, a commit) waits.

use super::Engine;
use crate::error::{Error, Result};
use std::time::Duration;

impl Engine {
    /// Commits everything and holds every later write for at most
    /// `timeout`. EBUSY if frozen already.
    pub fn freeze(&self, timeout: Duration) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.commit()?;
        match self.shared.dev.freeze(timeout)? {
            true => {
                tracing::info!(timeout_s = timeout.as_secs_f64(), "frozen");
                Ok(())
            }
            false => Err(Error::Posix(
                libc::EBUSY,
                "the filesystem is frozen already",
            )),
        }
    }

    /// Ends a freeze. EINVAL if not frozen.
    pub fn thaw(&self) -> Result<()> {
        match self.shared.dev.thaw() {
            true => {
                tracing::info!("thawed");
                Ok(())
            }
            false => Err(Error::Posix(libc::EINVAL, "the filesystem is not frozen")),
        }
    }

    /// How much longer a freeze holds, if frozen.
    pub fn frozen_for(&self) -> Option<Duration> {
        self.shared.dev.frozen_for()
    }
}
