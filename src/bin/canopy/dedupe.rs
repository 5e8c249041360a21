//! `canopy dedupe [-r] [--dry-run] PATH...`: make files that hold the same
//! blocks share them, as duperemove does on btrfs. FIDEDUPERANGE never
//! reaches a FUSE daemon, so the daemon finds and shares the blocks
//! itself (`canopy::fs::dedupe`); this command names the files.

use anyhow::{Context, Result};
use canopy::fuse::control::Request;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Descend into directories (without it, directories are an error).
    #[arg(short, long)]
    recurse: bool,
    /// Report what matches without sharing anything.
    #[arg(long, short = 'd')]
    dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Sizes in bytes.
    #[arg(long, short = 'b')]
    raw: bool,
    /// Files (and with -r directories) on one mounted Canopy filesystem.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let (mnt, files) = crate::walk::files_on_one_mount(&a.paths, a.recurse)?;
    let nodes: Vec<u64> = files.iter().map(|(_, m)| m.ino()).collect();
    let report = crate::quota::ask(
        &mnt,
        &Request::Dedupe {
            nodes,
            dry_run: a.dry_run,
        },
    )?
    .dedupe
    .context("the daemon sent no report (an older version?)")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let size = |b| crate::quota::size(b, a.raw);
    println!("Files:              {}", report.files);
    println!("Scanned:            {}", size(report.scanned));
    println!("Duplicate blocks:   {}", size(report.duplicate));
    if a.dry_run {
        println!("Dry run: nothing shared.");
    } else {
        println!("Deduplicated:       {}", size(report.deduped));
        println!(
            "Skipped:            {} (differed, changed or shared already)",
            size(report.skipped)
        );
    }
    Ok(())
}
