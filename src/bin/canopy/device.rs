//! `canopy device stats`: a mounted filesystem's error counters per
//! device, after `btrfs device stats`.

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
}

/// `-c` found a counter that is not zero.
const EXIT_ERRORS: u8 = 64;

pub fn run(c: Command) -> Result<ExitCode> {
    let Command::Stats {
        json,
        reset,
        check,
        path,
    } = c;
    let r = crate::quota::ask(&path, &Request::DeviceStats { reset })?;
    let devices = r.devices.context("the daemon sent no device counters")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
    } else {
        let names = device_names(&path);
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
