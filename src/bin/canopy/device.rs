//! `canopy device stats|add|remove`: a mounted filesystem's error
//! counters per device, and its devices, after `btrfs device`.

use anyhow::{Context, Result};
use canopy::fuse::control::{DeviceStats, Request};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
    /// (its superblocks are wiped). Refused for device 1, which holds the
    /// first copy of every group, and while the profiles need the device
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
