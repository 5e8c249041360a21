//! `canopy device stats|add|remove|replace`: a mounted filesystem's error
//! counters per device, and its devices, after `btrfs device` and
//! `btrfs replace`.

use anyhow::{Context, Result};
use canopy::fs::replace::{ReplaceState, ReplaceStatus};
use canopy::fuse::control::{DeviceStats, Request};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum Command {
    /// Read and write errors, copies found bad (checksum, address or an
    /// older generation) and bad copies repaired from a good one, per
    /// device, since the counters were last reset (the image keeps them).
    Stats {
        /// Print the counters as JSON.
        #[arg(long)]
        json: bool,
        /// Zero the counters after printing them.
        #[arg(short = 'z', long)]
        reset: bool,
        /// Exit 64 if any counter is not zero (as btrfs device stats -c).
        #[arg(short = 'c', long)]
        check: bool,
        /// A mounted Canopy filesystem (any path on it).
        path: PathBuf,
    },
    /// Add a device to a mounted filesystem. Nothing moves onto it yet:
    /// new groups may keep copies there, and `canopy balance start
    /// -mconvert=raid1 MNT` (or `-dconvert=raid1`) puts a copy of what is
    /// there already on it. Mount with `-o device=DEV` from then on.
    Add {
        /// Write over a filesystem the device holds.
        #[arg(short = 'f', long)]
        force: bool,
        /// An image file, block device or rbd:POOL/IMAGE.
        device: String,
        /// A mounted Canopy filesystem.
        path: PathBuf,
    },
    /// Move every copy off a device, then take it out of the filesystem
    /// (its superblocks are wiped). Refused for device 1 of a filesystem
    /// whose device 1 holds the first copy of every group (devices under
    /// 1 GiB, or images made before the mapped layout), and while the
    /// profiles need the device
    /// (convert first: `canopy balance start -mconvert=dup MNT`). Waits,
    /// with a progress bar.
    #[command(alias = "delete")]
    Remove {
        /// The device: its path as the mount or `device add` named it, its
        /// devid, or `missing` (the first device a degraded mount lacks:
        /// its copies are rebuilt on the others from the copies left).
        device: String,
        /// A mounted Canopy filesystem.
        path: PathBuf,
    },
    /// Copy everything a device holds to a new device while mounted, then
    /// put the new one in its place (same devid). Reads come from the
    /// device being replaced, or from another copy where it is bad or
    /// missing. Mount with `-o device=NEW` from then on.
    #[command(subcommand)]
    Replace(Replace),
}

#[derive(Subcommand)]
pub enum Replace {
    /// Start replacing SOURCE with TARGET. The target must hold at least
    /// as many bytes as the source. Runs in the background unless -B. An
    /// unmount or a crash keeps it: the next mount opens TARGET again by
    /// this name and copies again; `cancel` gives it up (the filesystem
    /// stays on the source).
    Start {
        /// Read the source only where no other copy is good (for a
        /// failing or slow source; needs raid1, raid1c3 or dup copies).
        #[arg(short = 'r')]
        avoid_source: bool,
        /// Write over a filesystem the target holds.
        #[arg(short = 'f', long)]
        force: bool,
        /// Wait for the replace to end, with a progress bar.
        #[arg(short = 'B')]
        foreground: bool,
        /// The device to replace: its devid, its path as the mount or
        /// `device add` named it, or `missing`.
        source: String,
        /// The new device: an image file, block device or rbd:POOL/IMAGE.
        target: String,
        /// A mounted Canopy filesystem.
        path: PathBuf,
    },
    /// Show how far the replace has come (until it ends, unless -1).
    Status {
        /// Print once and return.
        #[arg(short = '1')]
        once: bool,
        /// Print the status as JSON (once).
        #[arg(long)]
        json: bool,
        /// A mounted Canopy filesystem.
        path: PathBuf,
    },
    /// Stop the running replace; the filesystem stays on the source.
    Cancel {
        /// A mounted Canopy filesystem.
        path: PathBuf,
    },
}

/// `-c` found a counter that is not zero.
const EXIT_ERRORS: u8 = 64;

pub fn run(c: Command) -> Result<ExitCode> {
    match c {
        Command::Stats {
            json,
            reset,
            check,
            path,
        } => stats(&path, json, reset, check),
        Command::Add {
            force,
            device,
            path,
        } => add(&device, &path, force),
        Command::Remove { device, path } => remove(&device, &path),
        Command::Replace(r) => replace(r),
    }
}

fn replace(r: Replace) -> Result<ExitCode> {
    match r {
        Replace::Start {
            avoid_source,
            force,
            foreground,
            source,
            target,
            path,
        } => {
            let req = Request::ReplaceStart {
                source: for_daemon(&source),
                target: for_daemon(&target),
                avoid_source,
                force,
            };
            let st = crate::quota::ask(&path, &req)?.replace.unwrap_or_default();
            match foreground {
                true => watch_replace(&path, st),
                false => {
                    println!(
                        "replacing {source} with {target} (canopy device replace status {})",
                        path.display()
                    );
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Replace::Status { once, json, path } => {
            let st = crate::quota::ask(&path, &Request::ReplaceStatus)?
                .replace
                .unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
                return Ok(ExitCode::SUCCESS);
            }
            match once {
                true => {
                    println!("{}", replace_line(&st));
                    Ok(ExitCode::SUCCESS)
                }
                false => watch_replace(&path, st),
            }
        }
        Replace::Cancel { path } => {
            crate::quota::ask(&path, &Request::ReplaceCancel)?;
            println!("cancelling the replace; the filesystem stays on the source");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Follows a replace until it ends, with a progress bar; fails unless it
/// finished.
fn watch_replace(path: &Path, first: ReplaceStatus) -> Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(first.progress.bytes_total.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {percent}% {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut st = first;
    while st.state == ReplaceState::Running {
        bar.set_length(st.progress.bytes_total.max(1));
        bar.set_position(st.progress.bytes_done.min(st.progress.bytes_total));
        std::thread::sleep(Duration::from_millis(200));
        st = crate::quota::ask(path, &Request::ReplaceStatus)?
            .replace
            .unwrap_or_default();
    }
    bar.finish_and_clear();
    println!("{}", replace_line(&st));
    Ok(match st.state {
        ReplaceState::Finished | ReplaceState::Idle => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    })
}

/// One line on the replace, as `btrfs replace status -1` prints it.
fn replace_line(st: &ReplaceStatus) -> String {
    let what = match (st.source, &st.target) {
        (Some(s), Some(t)) => format!("device {s} to {t}: "),
        _ => String::new(),
    };
    let p = &st.progress;
    let pct = match p.bytes_total {
        0 => 0.0,
        t => 100.0 * p.bytes_done.min(t) as f64 / t as f64,
    };
    let counts = st.report.as_ref().map_or(String::new(), |r| {
        format!(
            ", {} copied, {} read from other copies, {} uncorrectable",
            crate::quota::size(r.bytes_copied, false),
            r.from_other_copies,
            r.uncorrectable.len()
        )
    });
    let error = st
        .error
        .as_ref()
        .map_or(String::new(), |e| format!(": {e}"));
    match st.state {
        ReplaceState::Idle => "never started".into(),
        ReplaceState::Running => format!("{what}{pct:.1}% done"),
        ReplaceState::Finished => format!("{what}finished{counts}"),
        ReplaceState::Cancelled => format!("{what}cancelled at {pct:.1}%{counts}"),
        ReplaceState::Failed => format!("{what}failed at {pct:.1}%{counts}{error}"),
    }
}

fn stats(path: &Path, json: bool, reset: bool, check: bool) -> Result<ExitCode> {
    let r = crate::quota::ask(path, &Request::DeviceStats { reset })?;
    let devices = r.devices.context("the daemon sent no device counters")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
    } else {
        let names = device_names(path);
        for d in &devices {
            let name = names
                .iter()
                .find(|(id, _)| *id == d.devid)
                .map_or_else(|| format!("devid:{}", d.devid), |(_, n)| n.clone());
            print_device(&name, d);
        }
    }
    let any = devices
        .iter()
        .any(|d| d.read_io_errs + d.write_io_errs + d.corruption_errs + d.corrected_errs > 0);
    Ok(match check && any {
        true => ExitCode::from(EXIT_ERRORS),
        false => ExitCode::SUCCESS,
    })
}

/// An absolute path for the daemon (whose working directory is not
/// ours), unless `device` is a devid or an `rbd:` name.
fn for_daemon(device: &str) -> String {
    let plain =
        device.parse::<u64>().is_err() && !device.starts_with("rbd:") && device != "missing";
    match plain {
        true => std::fs::canonicalize(device)
            .map_or_else(|_| device.to_string(), |p| p.display().to_string()),
        false => device.to_string(),
    }
}

fn add(device: &str, path: &Path, force: bool) -> Result<ExitCode> {
    let r = crate::quota::ask(
        path,
        &Request::DeviceAdd {
            path: for_daemon(device),
            force,
        },
    )?;
    let devid = r.devid.context("the daemon named no devid")?;
    println!("added {device} as device {devid}");
    Ok(ExitCode::SUCCESS)
}

fn remove(device: &str, path: &Path) -> Result<ExitCode> {
    let r = crate::quota::ask(
        path,
        &Request::DeviceRemoveStart {
            device: for_daemon(device),
        },
    )?;
    let devid = r.devid.context("the daemon named no devid")?;
    let first = r.balance.unwrap_or_default();
    if let Err(e) = crate::balance::watch(path, first) {
        let _ = crate::quota::ask(path, &Request::DeviceRemoveAbort { devid });
        return Err(e.context(format!("moving the copies off device {devid}")));
    }
    crate::quota::ask(path, &Request::DeviceRemoveFinish { devid })?;
    println!("removed device {devid} ({device})");
    Ok(ExitCode::SUCCESS)
}

fn print_device(name: &str, d: &DeviceStats) {
    for (what, n) in [
        ("write_io_errs", d.write_io_errs),
        ("read_io_errs", d.read_io_errs),
        ("corruption_errs", d.corruption_errs),
        ("corrected_errs", d.corrected_errs),
    ] {
        println!("[{name}].{what:<16} {n}");
    }
}

/// What the daemon of the mount holding `path` calls each device, by
/// devid (device 1 from the mount table if the daemon names none).
fn device_names(path: &Path) -> Vec<(u64, String)> {
    let show = crate::quota::ask(path, &Request::Usage)
        .ok()
        .and_then(|r| r.show);
    let mut names: Vec<(u64, String)> = show
        .into_iter()
        .flat_map(|s| s.devices)
        .filter_map(|d| Some((d.devid, d.path?)))
        .collect();
    if !names.iter().any(|(id, _)| *id == 1) {
        if let Some(n) = mount_source(path) {
            names.push((1, n));
        }
    }
    names
}

/// The image the mount holding `path` was made from, as the mount table
/// names it.
pub(crate) fn mount_source(path: &Path) -> Option<String> {
    let canon = path.canonicalize().ok()?;
    let mnt = crate::sync::mount_point(&canon).ok()?;
    canopy::fuse::mount::mount_source(&mnt)
}
