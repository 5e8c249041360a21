//! `canopy device add|remove` as the mounted filesystem answers them.
//!
//! Adding is one commit (`Engine::add_device`). Removing moves every copy
//! off the device first, with a balance of the groups that have one
//! there (`-ddevid=N -mdevid=N`) while the allocator keeps new copies
//! elsewhere; once that balance has finished, a commit drops the device
//! from the table (`Engine::remove_device`). The caller follows the
//! balance in between ([`Fs::device_remove_start`], then
//! [`Fs::device_remove_finish`] or [`Fs::device_remove_abort`]), so the
//! daemon never blocks on it.

use super::balance::BalanceState;
use super::Fs;
use crate::balance::{self, BalanceArgs, Filter};
use crate::dev::Device;
use crate::error::{Error, Result};
use std::sync::Arc;

impl Fs {
    /// Adds `dev` (called `name`) to the filesystem; returns its devid.
    pub fn device_add(&self, dev: Arc<dyn Device>, name: String) -> Result<u64> {
        self.core.check_balance_writable()?;
        self.check_no_replace()?;
        self.core.engine.add_device(dev, name)
    }

    /// Starts emptying device `devid`: no new copy goes there, and a
    /// balance moves the groups with a copy there. Returns how many.
    pub fn device_remove_start(&self, devid: u64) -> Result<u64> {
        self.core.check_balance_writable()?;
        self.check_no_replace()?;
        self.core.engine.check_removable(devid)?;
        if self.core.engine.read(balance::recorded)?.is_some() {
            return Err(Error::Posix(
                libc::EINPROGRESS,
                "a balance is recorded: let it finish or cancel it first",
            ));
        }
        self.core.engine.set_device_leaving(devid, true)?;
        let args = BalanceArgs {
            data: Filter::All,
            metadata: Filter::All,
            devid: Some(devid),
            ..BalanceArgs::default()
        };
        self.balance_start(args).inspect_err(|_| {
            let _ = self.core.engine.set_device_leaving(devid, false);
        })
    }

    /// Takes device `devid` out once the balance of
    /// [`Fs::device_remove_start`] has finished.
    pub fn device_remove_finish(&self, devid: u64) -> Result<()> {
        let st = self.balance_status();
        let ours = st.args.is_some_and(|a| a.devid == Some(devid));
        if ours && st.state != BalanceState::Finished {
            return Err(Error::Posix(
                libc::EBUSY,
                "the balance moving copies off the device has not finished",
            ));
        }
        // A commit gives back the groups emptied before it; those its
        // own unpinning empties go at the next.
        self.core.engine.commit()?;
        self.core.engine.commit()?;
        self.core.engine.remove_device(devid)
    }

    /// Lets device `devid` take new copies again (its removal failed or
    /// was given up).
    pub fn device_remove_abort(&self, devid: u64) -> Result<()> {
        self.core.engine.set_device_leaving(devid, false)
    }
}
