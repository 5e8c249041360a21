//! `canopy filesystem defragment [-r] [-v] [-c[ALGO]] [-t SIZE] PATH...`:
//! rewrite files held in many short extents into long ones, or with
//! `-c` their data compressed, as `btrfs filesystem defragment` does,
//! but keeping what snapshots and reflinks share shared
//! (`canopy::fs::defrag`). FUSE carries no defragment ioctl, so
//! the daemon does the work, one bounded piece of a file per request.

use anyhow::{bail, Context, Result};
use canopy::compress::Codec;
use canopy::fs::defrag::{DefragArgs, DefragReport};
use canopy::fuse::control::{Client, Request, Response};
use indicatif::{ProgressBar, ProgressStyle};
use std::ffi::OsString;
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
    /// Rewrite the data compressed with ALGO (zstd, zstd:LEVEL or lz4;
    /// zstd when none is given; written right after the option,
    /// as `-clz4` or `--compress=lz4`), whatever the extents' lengths; what does not compress
    /// stays as it is. `chattr +C` files are left alone.
    #[arg(short = 'c', long = "compress", value_name = "ALGO", num_args = 0..=1,
          require_equals = true, default_missing_value = "zstd", value_parser = parse_codec)]
    compress: Option<Codec>,
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

/// Sends `req` to the mount's daemon: its answer, or its error.
fn ask(daemon: &Client, req: &Request) -> Result<Response> {
    let r = daemon.request(req)?;
    if !r.ok {
        bail!("{}", r.error.unwrap_or_else(|| "failed".into()));
    }
    Ok(r)
}

/// btrfs writes `-c`'s codec glued to it (`-czstd`, as getopt's optional
/// values are), which clap would read as flags `-z`, `-s`...: after
/// `defragment`, such an argument becomes `-c=zstd`.
pub fn glue_codec(mut argv: Vec<OsString>) -> Vec<OsString> {
    let Some(at) = argv.iter().position(|a| a == "defragment") else {
        return argv;
    };
    for a in argv.iter_mut().skip(at + 1) {
        if a == "--" {
            break;
        }
        let Some(s) = a.to_str() else { continue };
        if let Some(codec) = s.strip_prefix("-c").filter(|c| !c.is_empty()) {
            if !codec.starts_with('=') {
                *a = format!("-c={codec}").into();
            }
        }
    }
    argv
}

/// `-c`'s value: a codec (`none` makes no sense here).
fn parse_codec(s: &str) -> std::result::Result<Codec, String> {
    Codec::parse(s)?.ok_or_else(|| format!("'{s}' is no compression; give zstd, zstd:LEVEL or lz4"))
}

/// Totals over every file.
#[derive(Default, serde::Serialize)]
struct Totals {
    files: u64,
    extents_merged: u64,
    extents_written: u64,
    bytes_copied: u64,
    items_joined: u64,
    extents_recompressed: u64,
    extents_incompressible: u64,
    stored_before: u64,
    stored_after: u64,
}

impl Totals {
    fn add(&mut self, file: &DefragReport) {
        self.files += 1;
        self.extents_merged += file.merged;
        self.extents_written += file.written;
        self.bytes_copied += file.bytes;
        self.items_joined += file.items_joined;
        self.extents_recompressed += file.recompressed;
        self.extents_incompressible += file.incompressible;
        self.stored_before += file.stored_before;
        self.stored_after += file.stored_after;
    }
}

pub fn run(a: Args) -> Result<()> {
    let (mnt, files) = crate::walk::files_on_one_mount(&a.paths, a.recursive)?;
    let daemon = Client::new(&mnt);
    let total: u64 = files.iter().map(|f| f.1.len()).sum();
    let bar = bar(a.quiet || a.json, total);
    let mut totals = Totals::default();
    let mut failed = 0;
    for (path, m) in &files {
        let before = bar.as_ref().map_or(0, |b| b.position());
        let done = defragment(&daemon, path, (a.threshold, a.compress), |at| {
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
            let line = match a.compress {
                Some(_) => format!(
                    "{}: {} extents recompressed, {} stored as {}",
                    path.display(),
                    done.recompressed,
                    crate::quota::size(done.stored_before, false),
                    crate::quota::size(done.stored_after, false)
                ),
                None => format!(
                    "{}: {} extents merged into {}",
                    path.display(),
                    done.merged + done.written,
                    done.written
                ),
            };
            say(&bar, line);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if totals.extents_written > 0 {
        // The old extents' space is free when the command ends.
        ask(&daemon, &Request::Sync).context("committing")?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&totals)?);
    } else if !a.quiet && totals.files > 0 && a.compress.is_some() {
        println!(
            "{} files: {} extents recompressed ({} left: they do not compress), {} stored as {}",
            totals.files,
            totals.extents_recompressed,
            totals.extents_incompressible,
            crate::quota::size(totals.stored_before, false),
            crate::quota::size(totals.stored_after, false)
        );
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
    daemon: &Client,
    path: &Path,
    (threshold, compress): (u64, Option<Codec>),
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
        let args = DefragArgs {
            start,
            threshold,
            compress,
        };
        let r = ask(daemon, &Request::Defragment { node, args })?
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
