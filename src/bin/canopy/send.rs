//! `canopy send`: a read-only subvolume of a mounted filesystem as a
//! btrfs send stream, after `btrfs send`.

use anyhow::{bail, Context, Result};
use canopy::fuse::send;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Send only the difference from this read-only snapshot, which the
    /// receiving side must hold (received earlier).
    #[arg(short = 'p', value_name = "PARENT")]
    parent: Option<PathBuf>,
    /// A read-only subvolume the receiving side holds: extents shared with
    /// it go as clones, not data (repeatable).
    #[arg(short = 'c', value_name = "CLONE_SRC")]
    clone_sources: Vec<PathBuf>,
    /// Write the stream to FILE instead of standard output.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Stream version: 2 (default; larger writes, holes punched) or 1
    /// (what older btrfs receive takes).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    proto: u32,
    /// No progress on standard error.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// A JSON summary at the end (on standard output with -f, else on
    /// standard error).
    #[arg(long)]
    json: bool,
    /// The read-only subvolume to send (its path in the mount).
    snapshot: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let mnt = crate::subvolume::mount_of(&a.snapshot)?;
    let name = a
        .snapshot
        .canonicalize()?
        .file_name()
        .map(|n| n.as_encoded_bytes().to_vec())
        .unwrap_or_default();
    let req = canopy::send::Request {
        snapshot: crate::subvolume::node_of(&a.snapshot)?,
        parent: a.parent.as_deref().map(node_in(&mnt)).transpose()?,
        clone_sources: a
            .clone_sources
            .iter()
            .map(|c| node_in(&mnt)(c))
            .collect::<Result<_>>()?,
        proto: a.proto,
        name,
    };
    let mut out: Box<dyn Write> = match &a.file {
        Some(f) => {
            Box::new(std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?)
        }
        None if std::io::stdout().is_terminal() => {
            bail!("not writing a send stream to a terminal: redirect it or use -f FILE")
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let bar = progress_bar(a.quiet);
    let started = std::time::Instant::now();
    let summary = send::request(&mnt, &req, &mut out, &mut |bytes, s| {
        bar.set_message(format!(
            "{} sent, {} of {} inodes",
            canopy::units::shown(bytes),
            s.done,
            s.inodes
        ));
    })
    .with_context(|| format!("sending {}", a.snapshot.display()));
    bar.finish_and_clear();
    let summary = summary?;
    if a.json {
        let line = serde_json::to_string(&summary)?;
        match a.file {
            Some(_) => println!("{line}"),
            None => eprintln!("{line}"),
        }
    } else if !a.quiet {
        eprintln!(
            "At subvol {}: {} in {:.1} s, {} inodes, {} commands",
            a.snapshot.display(),
            canopy::units::shown(summary.bytes),
            started.elapsed().as_secs_f64(),
            summary.inodes,
            summary.commands
        );
    }
    Ok(())
}

/// The node id of a subvolume given by path, which must be on `mnt`.
fn node_in(mnt: &std::path::Path) -> impl Fn(&std::path::Path) -> Result<u64> + '_ {
    move |p| {
        if crate::subvolume::mount_of(p)? != mnt {
            bail!(
                "{} is not on the same filesystem as the snapshot",
                p.display()
            );
        }
        crate::subvolume::node_of(p)
    }
}

/// A spinner on standard error (hidden when it is not a terminal).
pub fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
