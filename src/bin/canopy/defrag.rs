//! `canopy filesystem defragment [-r] [-v] [-t SIZE] PATH...`: rewrite
//! files held in many short extents into long ones, as `btrfs filesystem
//! defragment` does, but keeping what snapshots and reflinks share
//! shared (`canopy::fs::defrag`). FUSE carries no defragment ioctl, so
//! the daemon does the work, one bounded piece of a file per request.

use anyhow::{bail, Context, Result};
use canopy::fs::defrag::{DefragArgs, DefragReport};
use canopy::fuse::control::Request;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Descend into directories (without it, a directory is an error).
    #[arg(short, long)]
    recursive: bool,
    /// Name each file as it is done.
    #[arg(short, long)]
    verbose: bool,
    /// Extents this long or longer are left alone (K, M, G suffixes;
    /// Canopy's data extents are at most 2M, so anything from 2M up
    /// means every extent shorter than that).
    #[arg(short = 't', value_name = "SIZE", default_value = "32M",
          value_parser = |s: &str| canopy::units::parse_size(s))]
    threshold: u64,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    /// Print the totals as JSON.
    #[arg(long)]
    json: bool,
    /// Files (and with -r directories) on one mounted Canopy filesystem.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

/// Totals over every file.
#[derive(Default, serde::Serialize)]
struct Totals {
    files: u64,
    extents_merged: u64,
    extents_written: u64,
    bytes_copied: u64,
    items_joined: u64,
}

pub fn run(a: Args) -> Result<()> {
    let mut files = Vec::new();
    for p in &a.paths {
        crate::walk::collect(p, a.recursive, &mut files)?;
    }
    let first = a.paths[0]
        .canonicalize()
        .with_context(|| format!("opening {}", a.paths[0].display()))?;
    let mnt = crate::sync::mount_point(&first)?;
    let dev = std::fs::metadata(&mnt)?.dev();
    let total: u64 = files.iter().map(|f| f.1.len()).sum();
    let bar = bar(a.quiet || a.json, total);
    let mut totals = Totals::default();
    let mut failed = 0;
    for (path, m) in &files {
        if m.dev() != dev {
            bail!(
                "{} is not on the filesystem mounted at {}",
                path.display(),
                mnt.display()
            );
        }
        let before = bar.as_ref().map_or(0, |b| b.position());
        let done = defragment(&mnt, path, a.threshold, |at| {
            if let Some(b) = &bar {
                b.set_position(before + at.min(m.len()));
            }
        });
        if let Some(b) = &bar {
            b.set_position(before + m.len());
        }
        // As btrfs: a file that cannot be done is named, the rest go on.
        let done = match done {
            Ok(done) => done,
            // Deleted since it was listed: nothing left to do.
            Err(e) if vanished(&e) => continue,
            Err(e) => {
                let line = format!("defragmenting {}: {e:#}", path.display());
                match &bar {
                    Some(b) => b.println(line),
                    None => eprintln!("{line}"),
                }
                failed += 1;
                continue;
            }
        };
        totals.files += 1;
        totals.extents_merged += done.merged;
        totals.extents_written += done.written;
        totals.bytes_copied += done.bytes;
        totals.items_joined += done.items_joined;
        if a.verbose {
            let line = format!(
                "{}: {} extents merged into {}",
                path.display(),
                done.merged + done.written,
                done.written
            );
            match &bar {
                Some(b) => b.println(line),
                None => eprintln!("{line}"),
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&totals)?);
    } else if !a.quiet && totals.files > 0 {
        println!(
            "{} files: {} extents merged into {}, {} copied",
            totals.files,
            totals.extents_merged + totals.extents_written,
            totals.extents_written,
            crate::quota::size(totals.bytes_copied, false)
        );
    }
    if failed > 0 {
        bail!(
            "{failed} of {} files could not be defragmented",
            files.len()
        );
    }
    Ok(())
}

/// Defragments one file, request by request; `progress` gets the offset
/// reached. The totals of every request.
fn defragment(
    mnt: &Path,
    path: &Path,
    threshold: u64,
    mut progress: impl FnMut(u64),
) -> Result<DefragReport> {
    let file = std::fs::File::open(path)?;
    // Data the kernel still buffers (writeback_cache) reaches the daemon
    // first, so it is defragmented too.
    file.sync_data()?;
    let node = file.metadata()?.ino();
    let mut all = DefragReport::default();
    let mut start = 0;
    loop {
        let args = DefragArgs { start, threshold };
        let r = crate::quota::ask(mnt, &Request::Defragment { node, args })?
            .defrag
            .context("the daemon sent no report (an older version?)")?;
        all.merged += r.merged;
        all.written += r.written;
        all.bytes += r.bytes;
        all.items_joined += r.items_joined;
        match r.next {
            Some(next) if next > start => {
                progress(next);
                start = next;
            }
            Some(_) => bail!("the daemon did not move on from offset {start}"),
            None => return Ok(all),
        }
    }
}

fn vanished(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

fn bar(hidden: bool, total: u64) -> Option<ProgressBar> {
    (!hidden && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "defragmenting {bar:40} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    })
}
