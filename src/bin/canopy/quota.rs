//! `canopy quota` and `canopy qgroup`: quota groups of a mounted
//! filesystem, after `btrfs quota` and `btrfs qgroup`. Requests go over
//! the mount's control socket; each change is committed before the
//! command returns.

use anyhow::{bail, Context, Result};
use canopy::format::qgroup;
use canopy::fs::{QgroupRow, QuotaChange, RescanStatus};
use canopy::fuse::control::{self, Request, Response};
use clap::Subcommand;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Turn quotas on: every subvolume gets its group (0/ID), counted at
    /// once.
    Enable { path: PathBuf },
    /// Turn quotas off and forget every group and limit.
    Disable { path: PathBuf },
    /// Count every group again from nothing, in the background: each
    /// commit counts a batch of extents, so the filesystem stays usable
    /// (the numbers are kept exact at every commit; this is a repair).
    /// Until it is done, numbers and limits cover what it has counted.
    Rescan {
        /// Show how far a rescan has got instead of starting one.
        #[arg(short = 's', long, conflicts_with = "wait")]
        status: bool,
        /// Start a rescan and wait for it, with a progress bar.
        #[arg(short = 'w', long)]
        wait: bool,
        /// With -s: one JSON object (running, thread, cursor, total).
        #[arg(long, requires = "status")]
        json: bool,
        path: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum QgroupCommand {
    /// List the groups with their referenced and exclusive bytes.
    Show {
        /// One JSON array: qgroupid, path, referenced, exclusive,
        /// max_referenced, max_exclusive (null: no limit), parents,
        /// children.
        #[arg(long)]
        json: bool,
        /// Print sizes in bytes rather than with units.
        #[arg(long)]
        raw: bool,
        path: PathBuf,
    },
    /// Create a group of level 1 or higher (LEVEL/ID, e.g. 1/100).
    Create { qgroupid: String, path: PathBuf },
    /// Remove a group of level 1 or higher that holds no other group.
    Destroy { qgroupid: String, path: PathBuf },
    /// Make group SRC a member of the higher group DST.
    Assign {
        src: String,
        dst: String,
        path: PathBuf,
    },
    /// Take group SRC out of DST.
    Remove {
        src: String,
        dst: String,
        path: PathBuf,
    },
    /// Limit a group's referenced bytes (or with -e its exclusive bytes)
    /// to SIZE, or lift the limit with `none`. TARGET is a subvolume's
    /// path, or a qgroup id followed by the mount point.
    Limit {
        /// Limit the exclusive bytes instead of the referenced ones.
        #[arg(short = 'e', long)]
        exclusive: bool,
        /// A size such as 10G, or `none`.
        size: String,
        /// A subvolume (its root directory), or LEVEL/ID.
        target: String,
        /// The mount point, when TARGET is a qgroup id.
        path: Option<PathBuf>,
    },
}

pub fn run_quota(c: QuotaCommand) -> Result<()> {
    let (change, path, what) = match c {
        QuotaCommand::Enable { path } => (QuotaChange::Enable, path, "enabling quotas"),
        QuotaCommand::Disable { path } => (QuotaChange::Disable, path, "disabling quotas"),
        QuotaCommand::Rescan {
            status,
            wait,
            json,
            path,
        } => return rescan(status, wait, json, &path),
    };
    change_at(&path, change).with_context(|| format!("{what} on {}", path.display()))
}

fn rescan(status: bool, wait: bool, json: bool, path: &Path) -> Result<()> {
    let ask_status = || -> Result<RescanStatus> {
        Ok(ask(path, &Request::QuotaRescanStatus)?
            .rescan
            .unwrap_or_default())
    };
    if status {
        let st = ask_status()?;
        if json {
            println!("{}", serde_json::to_string_pretty(&st)?);
        } else if st.running {
            println!(
                "rescan {}: {:.1}% ({} of {})",
                if st.thread {
                    "running"
                } else {
                    "stopped (see the daemon's log)"
                },
                percent(&st),
                size(st.cursor, false),
                size(st.total, false)
            );
        } else {
            println!("no rescan operation in progress");
        }
        return Ok(());
    }
    change_at(path, QuotaChange::Rescan)
        .with_context(|| format!("rescanning quotas on {}", path.display()))?;
    if !wait {
        println!("quota rescan started");
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    loop {
        let st = ask_status()?;
        if !st.running {
            break;
        }
        if !st.thread {
            bar.finish_and_clear();
            bail!(
                "the rescan stopped at {} (see the daemon's log); `canopy quota rescan` starts it again",
                size(st.cursor, false)
            );
        }
        bar.set_position((percent(&st) * 10.0) as u64);
        bar.set_message(format!(
            "counted up to {} of {}",
            size(st.cursor, false),
            size(st.total, false)
        ));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bar.finish_and_clear();
    println!("quota rescan done");
    Ok(())
}

fn percent(st: &RescanStatus) -> f64 {
    if st.total == 0 {
        return 100.0;
    }
    (st.cursor as f64 * 100.0 / st.total as f64).min(100.0)
}

pub fn run_qgroup(c: QgroupCommand) -> Result<()> {
    match c {
        QgroupCommand::Show { json, raw, path } => {
            let r = ask(&path, &Request::QgroupShow)?;
            let rows = r.qgroups.unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print_table(&rows, raw);
            }
            Ok(())
        }
        QgroupCommand::Create { qgroupid, path } => {
            change_at(&path, QuotaChange::Create(parse_id(&qgroupid)?))
        }
        QgroupCommand::Destroy { qgroupid, path } => {
            change_at(&path, QuotaChange::Destroy(parse_id(&qgroupid)?))
        }
        QgroupCommand::Assign { src, dst, path } => {
            let (child, parent) = (parse_id(&src)?, parse_id(&dst)?);
            change_at(&path, QuotaChange::Assign { child, parent })
        }
        QgroupCommand::Remove { src, dst, path } => {
            let (child, parent) = (parse_id(&src)?, parse_id(&dst)?);
            change_at(&path, QuotaChange::Remove { child, parent })
        }
        QgroupCommand::Limit {
            exclusive,
            size,
            target,
            path,
        } => limit(exclusive, &size, &target, path),
    }
}

fn limit(exclusive: bool, size: &str, target: &str, path: Option<PathBuf>) -> Result<()> {
    let bytes = match size {
        "none" => None,
        s => Some(canopy::units::parse_size(s).map_err(anyhow::Error::msg)?),
    };
    match path {
        Some(mnt) => {
            let qgroupid = parse_id(target)?;
            change_at(
                &mnt,
                QuotaChange::Limit {
                    qgroupid,
                    bytes,
                    exclusive,
                },
            )
        }
        None => {
            let sub = Path::new(target);
            let node = std::fs::metadata(sub)
                .with_context(|| format!("opening {target}"))?
                .ino();
            let req = Request::QgroupLimitNode {
                node,
                bytes,
                exclusive,
            };
            ask(sub, &req).map(drop)
        }
    }
}

fn parse_id(s: &str) -> Result<u64> {
    qgroup::parse(s).with_context(|| format!("'{s}' is not a qgroup id (LEVEL/ID, e.g. 1/100)"))
}

fn change_at(path: &Path, change: QuotaChange) -> Result<()> {
    ask(path, &Request::Quota { change }).map(drop)
}

/// Sends `req` to the daemon serving the mount that holds `path`.
pub(crate) fn ask(path: &Path, req: &Request) -> Result<Response> {
    let canon = path
        .canonicalize()
        .with_context(|| format!("opening {}", path.display()))?;
    let mnt = crate::sync::mount_point(&canon)?;
    let r = control::request(&mnt, req)?;
    if !r.ok {
        bail!("{}", r.error.unwrap_or_else(|| "failed".into()));
    }
    Ok(r)
}

/// `bytes` with a binary unit (or as a plain number when `raw`).
pub(crate) fn size(bytes: u64, raw: bool) -> String {
    if raw {
        return bytes.to_string();
    }
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.2}{}", UNITS[u])
    }
}

fn limit_text(l: Option<u64>, raw: bool) -> String {
    l.map_or_else(|| "none".to_string(), |b| size(b, raw))
}

/// The table `btrfs qgroup show` prints, with limits and paths.
fn print_table(rows: &[QgroupRow], raw: bool) {
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12} {:<10} Path",
        "Qgroupid", "Referenced", "Exclusive", "Max rfer", "Max excl", "Parent"
    );
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12} {:<10} ----",
        "--------", "----------", "---------", "--------", "--------", "------"
    );
    for r in rows {
        let parents = if r.parents.is_empty() {
            "-".to_string()
        } else {
            r.parents.join(",")
        };
        let path = r.path.clone().unwrap_or_else(|| {
            if r.qgroupid.starts_with("0/") {
                "<deleted>".into()
            } else {
                "-".into()
            }
        });
        let path = if path.is_empty() {
            "<toplevel>".into()
        } else {
            path
        };
        println!(
            "{:<10} {:>12} {:>12} {:>12} {:>12} {:<10} {}",
            r.qgroupid,
            size(r.referenced, raw),
            size(r.exclusive, raw),
            limit_text(r.max_referenced, raw),
            limit_text(r.max_exclusive, raw),
            parents,
            path
        );
    }
}
