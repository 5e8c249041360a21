//! The engine assembled: the transaction core (`txn`) with the mechanisms
//! it calls at its fixed points.
//!
//! `txn` is below the extent and quota mechanisms, which are built on its
//! transactions, so it cannot name them; it calls them through
//! [`Mechanism`] in the order of [`MECHANISMS`]: the extent mechanism
//! first (it folds the reference changes that the quota accounting then
//! reads). This module, above both, is where they meet, and it defines
//! the two ways to get an [`Engine`].

use crate::dev::Device;
use crate::error::Result;
use crate::extent::Extents;
use crate::qgroup::Quota;
use crate::txn::{Engine, FormatOptions, Mechanism, OpenOptions};
use std::sync::Arc;

/// Every mechanism above the transaction, in the order it calls them.
pub static MECHANISMS: [&dyn Mechanism; 2] = [&Extents, &Quota];

impl Engine {
    /// Writes a new empty filesystem to `dev` (generation 1) and returns it
    /// open.
    pub fn format(dev: Arc<dyn Device>, opts: &FormatOptions) -> Result<Engine> {
        Engine::format_with(vec![dev], opts, &MECHANISMS)
    }

    /// Writes a new empty filesystem over `devs` (device ids 1, 2, ... in
    /// order) and returns it open.
    pub fn format_devices(devs: Vec<Arc<dyn Device>>, opts: &FormatOptions) -> Result<Engine> {
        Engine::format_with(devs, opts, &MECHANISMS)
    }

    /// Opens the filesystem on `dev` at its newest valid superblock.
    pub fn open(dev: Arc<dyn Device>, opts: &OpenOptions) -> Result<Engine> {
        Engine::open_with(vec![dev], opts, &MECHANISMS)
    }

    /// Opens the filesystem whose devices are `devs`, in any order.
    pub fn open_devices(devs: Vec<Arc<dyn Device>>, opts: &OpenOptions) -> Result<Engine> {
        Engine::open_with(devs, opts, &MECHANISMS)
    }
}
