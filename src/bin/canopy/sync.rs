//! `canopy sync PATH`: make everything written to a mounted Canopy durable,
//! like `btrfs filesystem sync`.
//!
//! `sync(1)` and `syncfs(2)` do not reach a FUSE daemon: the kernel sends
//! FUSE_SYNCFS only to virtiofs servers. fsync of any file or directory of
//! a Canopy mount commits everything, so this opens PATH and fsyncs it.

use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A file or directory on the mounted filesystem (e.g. its mount point).
    path: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let f =
        std::fs::File::open(&a.path).with_context(|| format!("opening {}", a.path.display()))?;
    f.sync_all()
        .with_context(|| format!("syncing the filesystem of {}", a.path.display()))
}
