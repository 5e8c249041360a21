//! `canopy sync PATH`: make everything written to a mounted Canopy durable,
//! like `btrfs filesystem sync`.
//!
//! `sync(1)` and `syncfs(2)` do not reach a FUSE daemon (the kernel sends
//! FUSE_SYNCFS only to virtiofs servers), and fsync makes only its own
//! file durable (through the log tree), so this asks the daemon serving
//! PATH's mount to commit, over its control socket.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// A file or directory on the mounted filesystem (e.g. its mount point).
    path: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let path = a
        .path
        .canonicalize()
        .with_context(|| format!("opening {}", a.path.display()))?;
    let mnt = mount_point(&path)?;
    let r = canopy::fuse::control::request(&mnt, &canopy::fuse::control::Request::Sync)
        .with_context(|| format!("syncing the filesystem of {}", a.path.display()))?;
    if !r.ok {
        bail!(
            "syncing the filesystem of {}: {}",
            a.path.display(),
            r.error.unwrap_or_else(|| "failed".into())
        );
    }
    Ok(())
}

/// The mount point holding `path`: its highest ancestor on the same device.
pub fn mount_point(path: &Path) -> Result<PathBuf> {
    let dev = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.dev())
            .with_context(|| format!("opening {}", p.display()))
    };
    let mine = dev(path)?;
    let mut at = path.to_path_buf();
    while let Some(parent) = at.parent() {
        if dev(parent)? != mine {
            break;
        }
        at = parent.to_path_buf();
    }
    Ok(at)
}
