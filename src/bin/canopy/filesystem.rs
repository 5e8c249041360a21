//! `canopy filesystem usage`: how a mounted filesystem's device is carved
//! into block groups, after `btrfs filesystem usage`. Balance gives
//! emptied groups back to unallocated space; this is where that shows
//! (statfs counts free space inside groups too).

use crate::quota::{ask, size};
use anyhow::{Context, Result};
use canopy::alloc::SpaceUsage;
use canopy::fs::compression::Compsize;
use canopy::fuse::control::Request;
use clap::Subcommand;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum Command {
    /// Device size, bytes in block groups and in none, and per kind of
    /// group (data, metadata, system, or mixed on small images) how many
    /// groups, their size and the bytes their extents hold.
    Usage {
        /// One JSON object: device_bytes, unallocated, and kinds (kind,
        /// groups, size, used).
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        path: PathBuf,
    },
    /// What the files under PATH take on disk per compression type, after
    /// the `compsize` tool: bytes on disk and decoded (each extent once),
    /// and bytes the files reference (shared extents once per reference).
    Du {
        /// One JSON object: files, regular_extents, refs, inline, total
        /// and kinds (kind, disk, uncompressed, referenced).
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        path: PathBuf,
    },
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Usage { json, raw, path } => {
            let usage = ask(&path, &Request::Usage)?
                .usage
                .context("the daemon sent no usage (an older version?)")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&usage)?);
            } else {
                print_usage(&usage, raw);
            }
            Ok(())
        }
        Command::Du { json, raw, path } => {
            let node = std::fs::metadata(&path)
                .with_context(|| format!("opening {}", path.display()))?
                .ino();
            let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
            let report = ask(&mnt, &Request::Compsize { node })?
                .compsize
                .context("the daemon sent no report (an older version?)")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_compsize(&report, raw);
            }
            Ok(())
        }
    }
}

fn print_compsize(r: &Compsize, raw: bool) {
    println!(
        "Processed {} files, {} regular extents ({} refs), {} inline.",
        r.files, r.regular_extents, r.refs, r.inline
    );
    println!(
        "{:<10} {:>5} {:>12} {:>12} {:>12}",
        "Type", "Perc", "Disk Usage", "Uncompressed", "Referenced"
    );
    for row in std::iter::once(&r.total).chain(&r.kinds) {
        let perc = match row.uncompressed {
            0 => 0,
            u => (row.disk * 100).div_ceil(u),
        };
        println!(
            "{:<10} {:>4}% {:>12} {:>12} {:>12}",
            row.kind,
            perc,
            size(row.disk, raw),
            size(row.uncompressed, raw),
            size(row.referenced, raw)
        );
    }
}

fn print_usage(u: &SpaceUsage, raw: bool) {
    let allocated: u64 = u.kinds.iter().map(|k| k.size).sum();
    let used: u64 = u.kinds.iter().map(|k| k.used).sum();
    println!("Device size:   {:>12}", size(u.device_bytes, raw));
    println!("Allocated:     {:>12}", size(allocated, raw));
    println!("Unallocated:   {:>12}", size(u.unallocated, raw));
    println!("Used:          {:>12}", size(used, raw));
    println!();
    for k in &u.kinds {
        let share = if k.size > 0 {
            100.0 * k.used as f64 / k.size as f64
        } else {
            0.0
        };
        let groups = format!("{} group{}", k.groups, if k.groups == 1 { "" } else { "s" });
        println!(
            "{:<9} {groups:>11}: size {:>12}, used {:>12} ({share:.1}%)",
            k.kind,
            size(k.size, raw),
            size(k.used, raw)
        );
    }
}
