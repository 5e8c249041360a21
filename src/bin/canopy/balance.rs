//! `canopy balance`: empty block groups of a mounted filesystem by moving
//! their extents into others, after `btrfs balance`. The daemon's balance
//! thread does the work; these commands start, watch, pause, resume and
//! cancel it over the control socket.

use crate::quota::{ask, size};
use anyhow::{bail, Result};
use canopy::balance::{BalanceArgs, Filter};
use canopy::format::superblock::Profile;
use canopy::fs::{BalanceState, BalanceStatus};
use canopy::fuse::control::Request;
use clap::Subcommand;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand)]
pub enum Command {
    /// Move the extents of the chosen block groups into others, then free
    /// the emptied groups. With neither -d nor -m, every group. Shared
    /// extents move once: nothing is unshared and no qgroup number
    /// changes. Waits with a progress bar unless --bg.
    Start {
        /// Data groups; filters, comma-separated: `usage=N` (only those
        /// used below N percent), `devid=N` (only those with a copy on
        /// device N), `convert=single|dup|raid1|raid1c3|raid10` (give every data
        /// group that profile: new groups get it, and the groups of
        /// another profile are emptied into them; `soft` is accepted and
        /// changes nothing: groups already converted are always skipped).
        #[arg(short = 'd', value_name = "FILTERS", num_args = 0..=1,
              require_equals = true, default_missing_value = "")]
        data: Option<String>,
        /// Metadata and system groups; filters as for -d (`-mconvert=dup`
        /// keeps two copies of every tree block).
        #[arg(short = 'm', value_name = "FILTERS", num_args = 0..=1,
              require_equals = true, default_missing_value = "")]
        metadata: Option<String>,
        /// Return once the balance has started; it runs in the daemon.
        #[arg(long = "bg", alias = "background")]
        background: bool,
        path: PathBuf,
    },
    /// Show how far the running, paused or last balance got.
    Status {
        /// One JSON object: state, groups_total, groups_left,
        /// extents_moved, bytes_moved, groups_no_space, error.
        #[arg(long)]
        json: bool,
        path: PathBuf,
    },
    /// Stop moving extents; the balance stays recorded, across unmounts,
    /// until resumed or cancelled.
    Pause { path: PathBuf },
    /// Carry on a paused balance.
    Resume { path: PathBuf },
    /// Stop and forget the balance (groups already emptied stay so).
    Cancel { path: PathBuf },
}

/// btrfs writes filters glued to their flag (`-dusage=50`), which clap
/// would read as flags `-u`, `-s`...: after `balance start`, such an
/// argument becomes `-d=usage=50`.
pub fn glue_filters(mut argv: Vec<OsString>) -> Vec<OsString> {
    let starts = argv
        .windows(2)
        .position(|w| w[0] == "balance" && w[1] == "start");
    if let Some(at) = starts {
        for a in argv.iter_mut().skip(at + 2) {
            if a == "--" {
                break;
            }
            let Some(s) = a.to_str() else { continue };
            let glued = (s.starts_with("-d") || s.starts_with("-m")) && s.len() > 2;
            if glued && !s[2..].starts_with('=') {
                *a = format!("{}={}", &s[..2], &s[2..]).into();
            }
        }
    }
    argv
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Start {
            data,
            metadata,
            background,
            path,
        } => {
            let args = balance_args(data.as_deref(), metadata.as_deref())?;
            let r = ask(&path, &Request::BalanceStart { args })?;
            let st = r.balance.unwrap_or_default();
            if background {
                println!("balance started: {} block groups", st.groups_total);
                return Ok(());
            }
            watch(&path, st)
        }
        Command::Status { json, path } => {
            let st = ask(&path, &Request::BalanceStatus)?
                .balance
                .unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print_status(&st);
            }
            Ok(())
        }
        Command::Pause { path } => ask(&path, &Request::BalancePause).map(drop),
        Command::Resume { path } => ask(&path, &Request::BalanceResume).map(drop),
        Command::Cancel { path } => ask(&path, &Request::BalanceCancel).map(drop),
    }
}

/// `-d`/`-m` as btrfs takes them: absent, bare, or comma-separated
/// filters: `usage=N` (0..=100), `convert=PROFILE`, `soft`.
fn balance_args(data: Option<&str>, metadata: Option<&str>) -> Result<BalanceArgs> {
    if data.is_none() && metadata.is_none() {
        return Ok(BalanceArgs::all());
    }
    let skip = (Filter::Skip, None, None);
    let (data, data_convert, d_devid) = data.map_or(Ok(skip), |f| filters(f, "-d"))?;
    let (metadata, metadata_convert, m_devid) = metadata.map_or(Ok(skip), |f| filters(f, "-m"))?;
    let devid = match (d_devid, m_devid) {
        (Some(a), Some(b)) if a != b => bail!("-ddevid={a} and -mdevid={b}: one device at a time"),
        (a, b) => a.or(b),
    };
    Ok(BalanceArgs {
        data,
        metadata,
        data_convert,
        metadata_convert,
        devid,
    })
}

/// One flag's filters: which groups (all unless `usage=N` or `devid=N`
/// narrows them) and the profile to convert them to.
fn filters(f: &str, flag: &str) -> Result<(Filter, Option<Profile>, Option<u64>)> {
    let mut filter = Filter::All;
    let mut convert = None;
    let mut devid = None;
    for part in f.split(',').filter(|p| !p.is_empty()) {
        if part == "soft" {
            continue;
        }
        if let Some(n) = part.strip_prefix("usage=") {
            filter = match n.parse::<u8>() {
                Ok(p) if p <= 100 => Filter::UsageBelow(p),
                _ => bail!("{flag}usage={n}: N is a percentage, 0 to 100"),
            };
        } else if let Some(p) = part.strip_prefix("convert=") {
            convert = match Profile::parse(p) {
                Some(p) => Some(p),
                None => bail!(
                    "{flag}convert={p}: the profiles are single, dup, raid1, raid1c3 and raid10"
                ),
            };
        } else if let Some(n) = part.strip_prefix("devid=") {
            devid = match n.parse::<u64>() {
                Ok(d) if d > 0 => Some(d),
                _ => bail!("{flag}devid={n}: N is a device id, 1 or more"),
            };
        } else {
            bail!("{flag}{part}: the filters are usage=N, devid=N, convert=PROFILE and soft");
        }
    }
    Ok((filter, convert, devid))
}

/// Follows the balance with a progress bar until it ends; an error if it
/// failed or was cancelled.
pub(crate) fn watch(path: &Path, first: BalanceStatus) -> Result<()> {
    let bar = indicatif::ProgressBar::new(first.groups_total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{bar:30}] {pos}/{len} groups emptied, {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut st = first;
    loop {
        bar.set_length(st.groups_total);
        bar.set_position(st.groups_total.saturating_sub(st.groups_left));
        bar.set_message(format!(
            "{} extents ({}) moved",
            st.extents_moved,
            size(st.bytes_moved, false)
        ));
        if st.state != BalanceState::Running {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        st = ask(path, &Request::BalanceStatus)?
            .balance
            .unwrap_or_default();
    }
    bar.finish_and_clear();
    match st.state {
        BalanceState::Finished | BalanceState::Idle => {
            println!(
                "balance done: {} block groups emptied, {} extents ({}) moved",
                st.groups_total,
                st.extents_moved,
                size(st.bytes_moved, false)
            );
            Ok(())
        }
        BalanceState::Paused => bail!("balance paused ({} groups left)", st.groups_left),
        BalanceState::Cancelled => bail!("balance cancelled"),
        BalanceState::Failed => bail!(
            "balance failed: {}",
            st.error.unwrap_or_else(|| "unknown error".into())
        ),
        BalanceState::Running => unreachable!("the loop ends only when not running"),
    }
}

fn print_status(st: &BalanceStatus) {
    let state = match st.state {
        BalanceState::Idle => {
            println!("no balance found");
            return;
        }
        BalanceState::Running => "running",
        BalanceState::Paused => "paused",
        BalanceState::Finished => "finished",
        BalanceState::Cancelled => "cancelled",
        BalanceState::Failed => "failed",
    };
    println!("balance {state}");
    println!(
        "{} out of about {} block groups left, {} extents ({}) moved",
        st.groups_left,
        st.groups_total,
        st.extents_moved,
        size(st.bytes_moved, false)
    );
    if st.groups_no_space > 0 {
        println!(
            "{} block groups skipped: no space for their extents",
            st.groups_no_space
        );
    }
    if let Some(e) = &st.error {
        println!("error: {e}");
    }
}
