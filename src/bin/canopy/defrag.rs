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

impl Totals {
    fn add(&mut self, file: &DefragReport) {
        self.files += 1;
        self.extents_merged += file.merged;
        self.extents_written += file.written;
        self.bytes_copied += file.bytes;
        self.items_joined += file.items_joined;
    }
}

pub fn run(a: Args) -> Result<()> {
    let (mnt, files) = crate::walk::files_on_one_mount(&a.paths, a.recursive)?;
    let total: u64 = files.iter().map(|f| f.1.len()).sum();
    let bar = bar(a.quiet || a.json, total);
    let mut totals = Totals::default();
    let mut failed = 0;
    for (path, m) in &files {
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
                say(&bar, format!("defragmenting {}: {e:#}", path.display()));
                failed += 1;
                continue;
            }
        };
        totals.add(&done);
        if a.verbose {
            let line = format!(
                "{}: {} extents merged into {}",
                path.display(),
                done.merged + done.written,
                done.written
            );
            say(&bar, line);
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
        all.add(&r);
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

/// A line for the user, above the progress bar while there is one.
fn say(bar: &Option<ProgressBar>, line: String) {
    match bar {
        Some(b) => b.println(line),
        None => eprintln!("{line}"),
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
