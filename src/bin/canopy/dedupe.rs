//! `canopy dedupe [-r] [--dry-run] PATH...`: make files that hold the same
//! blocks share them, as duperemove does on btrfs. FIDEDUPERANGE never
//! reaches a FUSE daemon, so the daemon finds and shares the blocks
//! itself (`canopy::fs::dedupe`); this command names the files.

use anyhow::{bail, Context, Result};
use canopy::fuse::control::Request;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    let mut files = Vec::new();
    for p in &a.paths {
        collect(p, a.recurse, &mut files)?;
    }
    let first = a.paths[0]
        .canonicalize()
        .with_context(|| format!("opening {}", a.paths[0].display()))?;
    let mnt = crate::sync::mount_point(&first)?;
    let dev = std::fs::metadata(&mnt)?.dev();
    let mut nodes = Vec::with_capacity(files.len());
    for (path, m) in files {
        if m.dev() != dev {
            bail!(
                "{} is not on the filesystem mounted at {}",
                path.display(),
                mnt.display()
            );
        }
        nodes.push(m.ino());
    }
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

/// Adds the regular files at `path` (under it with `recurse`) to `out`.
fn collect(path: &Path, recurse: bool, out: &mut Vec<(PathBuf, std::fs::Metadata)>) -> Result<()> {
    let m =
        std::fs::symlink_metadata(path).with_context(|| format!("opening {}", path.display()))?;
    if m.is_file() {
        out.push((path.to_path_buf(), m));
    } else if m.is_dir() {
        if !recurse {
            bail!(
                "{} is a directory (-r descends into directories)",
                path.display()
            );
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("listing {}", path.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("listing {}", path.display()))?;
        entries.sort();
        for e in entries {
            collect(&e, true, out)?;
        }
    }
    Ok(())
}
