//! `canopy filesystem usage`: how a mounted filesystem's device is carved
//! into block groups, after `btrfs filesystem usage`. Balance gives
//! emptied groups back to unallocated space; this is where that shows
//! (statfs counts free space inside groups too). It also shows the
//! limits on written data the mount may buffer: the kernel's (its
//! global dirty limit and the mount's backing device) and Canopy's own.

use crate::quota::{ask, size};
use anyhow::{Context, Result};
use canopy::alloc::SpaceUsage;
use canopy::fs::compression::Compsize;
use canopy::fs::extents::FileMap;
use canopy::fuse::bdi::WritebackLimits;
use canopy::fuse::control::Request;
use canopy::txn::GrowTo;
use clap::Subcommand;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum Command {
    /// The filesystem's label and uuid, bytes used, and each device with
    /// its size and the bytes of it in block groups (second copies
    /// included), as `btrfs filesystem show`.
    Show {
        /// One JSON object: label, uuid, bytes_used, devices (devid,
        /// size, allocated, path).
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        /// Another device of an unmounted filesystem (repeat for each).
        #[arg(long = "device", value_name = "DEV", value_parser = crate::image_arg())]
        devices: Vec<canopy::dev::Source>,
        /// A mount point (or any path on the mount), or an unmounted
        /// image, block device or rbd:POOL/IMAGE.
        path: PathBuf,
    },
    /// Device size, bytes in block groups and in none, and per kind of
    /// group (data, metadata, system, or mixed on small images) and
    /// profile (single, or dup: two copies, each taking device space) how
    /// many groups, their size and the bytes their extents hold. Then the
    /// writeback limits in effect: whether the kernel buffers writes
    /// (writeback_cache), its global dirty limit, the mount's backing
    /// device (strict_limit, max_ratio, max_bytes, read-ahead), FUSE's
    /// background request limits, and Canopy's own dirty_limit.
    Usage {
        /// One JSON object: device_bytes, unallocated, kinds (kind,
        /// profile, groups, size, used) and writeback (the limits, by
        /// name).
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        path: PathBuf,
    },
    /// Where a file's bytes lie on the device, after `filefrag -v` and
    /// `xfs_bmap -v` (FUSE passes no FIEMAP, so those cannot look): each
    /// extent's range in the file, its place on the device, its size there
    /// and its flags (hole, inline, prealloc, zstd/lz4, shared). Data
    /// still buffered is written first, as FIEMAP's sync flag does.
    Extents {
        /// One JSON object: size, and extents (logical, length, physical,
        /// disk_bytes, flags).
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        path: PathBuf,
    },
    /// Rewrite files held in many short extents into long ones, written
    /// in file order, as `btrfs filesystem defragment` does. Unlike
    /// btrfs's, an extent a snapshot or a reflink shares stays shared:
    /// the extents themselves are merged and every holder follows, so
    /// used space does not grow. Compressed extents are left as they are,
    /// unless -c asks for every extent to be rewritten compressed (every
    /// holder follows there too). Runs online, a piece at a time; run
    /// again after an interruption to go on (what is done is not done
    /// twice).
    Defragment(crate::defrag::Args),
    /// Grow a mounted filesystem into a larger device (after `rbd
    /// resize`, `truncate -s` of an image file, a larger partition), as
    /// `btrfs filesystem resize` does: SIZE is `max` (all of the device),
    /// `+SIZE` (this much more) or a new size (e.g. 20G) of the device's
    /// share, prefixed with `DEVID:` for a device other than 1 (as in
    /// `2:max`; `canopy filesystem show` lists the ids). The new space
    /// shows in `df` at once. Shrinking is not supported yet.
    Resize {
        /// One JSON object: devid, old_bytes, new_bytes, device_bytes.
        #[arg(long)]
        json: bool,
        /// [DEVID:]max, [DEVID:]+SIZE or [DEVID:]SIZE (K, M, G, T
        /// suffixes).
        #[arg(allow_hyphen_values = true)]
        size: String,
        /// The mount point (or any path in the filesystem).
        path: PathBuf,
    },
    /// Tell the storage which of its bytes hold nothing, so that a thin
    /// image (an image file, an RBD image, a thin block device) gives
    /// them back, as fstrim does (FITRIM does not reach a FUSE
    /// filesystem): every free range of the block groups and the space
    /// no group takes. Only space free in the last commit is discarded,
    /// so a crash meanwhile loses nothing. Needs root, as fstrim.
    Trim {
        /// Ranges shorter than this are left (K, M, G suffixes; fstrim's
        /// `--minimum`).
        #[arg(short = 'm', long = "minimum", value_name = "MINLEN", default_value = "0",
              value_parser = |s: &str| canopy::units::parse_size(s))]
        minimum: u64,
        /// Say how much was discarded (as `fstrim -v`).
        #[arg(short, long)]
        verbose: bool,
        /// One JSON object: bytes, ranges, supported.
        #[arg(long)]
        json: bool,
        /// The mount point (or any path in the filesystem).
        path: PathBuf,
    },
    /// Commit everything and hold every later write until `thaw` (what
    /// fsfreeze --freeze does; FIFREEZE does not reach a FUSE
    /// filesystem), so that a snapshot of the storage taken meanwhile
    /// (`rbd snap create`, LVM) holds a clean filesystem. Readers go on;
    /// writers wait. A freeze nobody thaws ends by itself after
    /// --timeout. Needs root.
    Freeze {
        /// Seconds after which the freeze ends without a thaw.
        #[arg(long, value_name = "SECS", default_value_t = 60)]
        timeout: u64,
        /// The mount point (or any path in the filesystem).
        path: PathBuf,
    },
    /// End a freeze: the writes held meanwhile go on (fsfreeze
    /// --unfreeze). Needs root.
    Thaw {
        /// The mount point (or any path in the filesystem).
        path: PathBuf,
    },
    /// What the files under PATH hold, as `btrfs filesystem du` says it
    /// (Total they reference, Exclusive to them: what deleting them would
    /// free, and Set shared with other files or snapshots, each byte
    /// once), then per compression type, after the `compsize` tool: bytes
    /// on disk and decoded (each extent once), and bytes the files
    /// reference (shared extents once per reference).
    Du {
        /// One JSON object: files, regular_extents, refs, inline, total
        /// and kinds (kind, disk, uncompressed, referenced), exclusive
        /// and set_shared.
        #[arg(long)]
        json: bool,
        /// Sizes in bytes.
        #[arg(long, short = 'b')]
        raw: bool,
        path: PathBuf,
    },
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Show {
            json,
            raw,
            devices,
            path,
        } => show(&path, &devices, json, raw),
        Command::Usage { json, raw, path } => {
            let answer = ask(&path, &Request::Usage)?;
            let usage = answer
                .usage
                .context("the daemon sent no usage (an older version?)")?;
            let devices = answer.show.map(|s| s.devices).unwrap_or_default();
            let writeback = ask(&path, &Request::Writeback)?.writeback;
            if json {
                let mut v = serde_json::to_value(&usage)?;
                v["devices"] = serde_json::to_value(&devices)?;
                v["writeback"] = serde_json::to_value(&writeback)?;
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_usage(&usage, raw);
                print_devices(&devices, raw);
                if let Some(w) = writeback {
                    print_writeback(&w, raw);
                }
            }
            Ok(())
        }
        Command::Extents { json, raw, path } => {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            // Data the kernel still buffers (writeback_cache) reaches the
            // daemon first.
            file.sync_data()
                .with_context(|| format!("syncing {}", path.display()))?;
            let node = file.metadata()?.ino();
            let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
            let map = ask(&mnt, &Request::Extents { node })?
                .extents
                .context("the daemon sent no extents (an older version?)")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&map)?);
            } else {
                print_extents(&path, &map, raw);
            }
            Ok(())
        }
        Command::Resize { json, size, path } => resize(&size, &path, json),
        Command::Trim {
            minimum,
            verbose,
            json,
            path,
        } => trim(minimum, &path, verbose, json),
        Command::Freeze { timeout, path } => {
            let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
            let timeout_ms = timeout.max(1).saturating_mul(1000);
            ask(&mnt, &Request::Freeze { timeout_ms })?;
            Ok(())
        }
        Command::Thaw { path } => {
            let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
            ask(&mnt, &Request::Thaw)?;
            Ok(())
        }
        Command::Defragment(a) => crate::defrag::run(a),
        Command::Du { json, raw, path } => {
            let node = std::fs::metadata(&path)
                .with_context(|| format!("opening {}", path.display()))?
                .ino();
            let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
            let report = ask(&mnt, &Request::Compsize { node })?
                .compsize
                .context("the daemon sent no report (an older version?)")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_sharing(&report, &path, raw);
                print_compsize(&report, raw);
            }
            Ok(())
        }
    }
}

/// Parses btrfs's resize argument: max, +SIZE or SIZE.
fn grow_to(arg: &str) -> Result<GrowTo> {
    if arg == "max" {
        return Ok(GrowTo::Max);
    }
    if arg.starts_with('-') {
        anyhow::bail!("shrinking a filesystem ({arg}) is not supported yet");
    }
    match arg.strip_prefix('+') {
        Some(n) => Ok(GrowTo::By(
            crate::parse_size(n).map_err(anyhow::Error::msg)?,
        )),
        None => Ok(GrowTo::To(
            crate::parse_size(arg).map_err(anyhow::Error::msg)?,
        )),
    }
}

/// Splits btrfs's `DEVID:` prefix off a resize argument.
fn devid_and_size(arg: &str) -> Result<(u64, &str)> {
    match arg.split_once(':') {
        None => Ok((canopy::volume::PRIMARY_DEVID, arg)),
        Some((devid, size)) => match devid.parse::<u64>() {
            Ok(d) if d > 0 => Ok((d, size)),
            _ => anyhow::bail!("{arg}: the device id before ':' must be a number from 1 up"),
        },
    }
}

fn resize(arg: &str, path: &std::path::Path, json: bool) -> Result<()> {
    let (devid, size) = devid_and_size(arg)?;
    let to = grow_to(size)?;
    let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
    let request = Request::Resize {
        to,
        devid: Some(devid),
    };
    let g = ask(&mnt, &request)?
        .grown
        .context("the daemon sent no sizes (an older version?)")?;
    if json {
        let mut v = serde_json::to_value(g)?;
        v["devid"] = devid.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if g.new_bytes == g.old_bytes {
        println!(
            "{}: device {devid} already {} bytes (the device holds {})",
            mnt.display(),
            g.new_bytes,
            g.device_bytes
        );
    } else {
        println!(
            "Resized device {devid} of {} from {} to {} bytes",
            mnt.display(),
            g.old_bytes,
            g.new_bytes
        );
    }
    Ok(())
}

fn trim(minimum: u64, path: &std::path::Path, verbose: bool, json: bool) -> Result<()> {
    let mnt = crate::sync::mount_point(&path.canonicalize()?)?;
    let t = ask(&mnt, &Request::Trim { min_len: minimum })?
        .trimmed
        .context("the daemon sent no report (an older version?)")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&t)?);
    } else if !t.supported {
        // As fstrim: exit 1 with a message where discard is unsupported.
        anyhow::bail!("{}: the discard operation is not supported", mnt.display());
    } else if verbose {
        println!(
            "{}: {} ({} bytes) trimmed",
            mnt.display(),
            crate::quota::size(t.bytes, false),
            t.bytes
        );
    }
    Ok(())
}

fn print_extents(path: &std::path::Path, map: &FileMap, raw: bool) {
    let data = map.extents.iter().filter(|e| e.physical.is_some()).count();
    println!(
        "{}: {} bytes, {data} extents on the device",
        path.display(),
        map.size
    );
    println!(
        "{:>4} {:>12} {:>12} {:>16} {:>12}  flags",
        "ext", "logical", "length", "physical", "on disk"
    );
    for (i, e) in map.extents.iter().enumerate() {
        let physical = e.physical.map_or("-".to_string(), |p| p.to_string());
        println!(
            "{i:>4} {:>12} {:>12} {physical:>16} {:>12}  {}",
            e.logical,
            size(e.length, raw),
            size(e.disk_bytes, raw),
            e.flags.join(",")
        );
    }
}

/// `btrfs filesystem du`'s line: what the files reference, what only
/// they hold, and what they share (each byte once).
fn print_sharing(r: &Compsize, path: &std::path::Path, raw: bool) {
    println!(
        "{:>12} {:>12} {:>12}  Filename",
        "Total", "Exclusive", "Set shared"
    );
    println!(
        "{:>12} {:>12} {:>12}  {}",
        size(r.total.referenced, raw),
        size(r.exclusive, raw),
        size(r.set_shared, raw),
        path.display()
    );
    println!();
}

fn print_compsize(r: &Compsize, raw: bool) {
    println!(
        "Processed {} files, {} regular extents ({} refs), {} inline.",
        r.files, r.regular_extents, r.refs, r.inline
    );
    println!(
        "{:<10} {:>5} {:>12} {:>12} {:>12}",
        "Type", "Perc", "Disk Usage", "Uncompressed", "Referenced"
    );
    for row in std::iter::once(&r.total).chain(&r.kinds) {
        let perc = match row.uncompressed {
            0 => 0,
            u => (row.disk * 100).div_ceil(u),
        };
        println!(
            "{:<10} {:>4}% {:>12} {:>12} {:>12}",
            row.kind,
            perc,
            size(row.disk, raw),
            size(row.uncompressed, raw),
            size(row.referenced, raw)
        );
    }
}

fn print_writeback(w: &WritebackLimits, raw: bool) {
    let known = |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map_or("unknown".into(), f);
    let bytes = |v: u64| size(v, raw);
    let follows = if w.canopy_dirty_limit_follows_global {
        " (follows the global limit, at most 64 MiB)"
    } else {
        " (dirty_limit=)"
    };
    println!();
    println!("Writeback:");
    let cache = if w.writeback_cache { "on" } else { "off" };
    println!("  Kernel writeback cache:  {cache}");
    println!(
        "  Global dirty limit:      {}",
        known(w.global_dirty_limit, &bytes)
    );
    println!(
        "  Backing device:          {}",
        w.bdi.as_deref().unwrap_or("unknown")
    );
    let strict = |s: u64| if s != 0 { "yes".into() } else { "no".into() };
    println!(
        "  Strict limit:            {}",
        known(w.strict_limit.map(u64::from), &strict)
    );
    println!(
        "  Max share of the limit:  {}",
        known(w.max_ratio, &|r| format!("{r}%"))
    );
    println!("  Max bytes:               {}", known(w.max_bytes, &bytes));
    println!(
        "  Read-ahead:              {}",
        known(w.read_ahead_kb, &|k| bytes(k * 1024))
    );
    let requests = |n: u64| format!("{n} requests");
    println!(
        "  Max background:          {}",
        known(w.max_background, &requests)
    );
    println!(
        "  Congestion threshold:    {}",
        known(w.congestion_threshold, &requests)
    );
    println!(
        "  Canopy dirty limit:      {}{follows}",
        bytes(w.canopy_dirty_limit)
    );
}

/// `filesystem show`: through the daemon for a mount, read-only here for
/// an unmounted image.
fn show(
    path: &std::path::Path,
    others: &[canopy::dev::Source],
    json: bool,
    raw: bool,
) -> Result<()> {
    let mut show = if path.is_dir() {
        let mut show = ask(path, &Request::Usage)?
            .show
            .context("the daemon sent no filesystem (an older version?)")?;
        // An older daemon names no device: the mount table names the first.
        if let Some(d) = show.devices.first_mut().filter(|d| d.path.is_none()) {
            d.path = crate::device::mount_source(path);
        }
        show
    } else {
        let image = canopy::dev::Source::from_arg(path.as_os_str())?;
        let devs = crate::Devices::open(&image, others, canopy::dev::Access::Share)?;
        let opts = devs.options(canopy::OpenOptions {
            read_only: true,
            ..Default::default()
        });
        let engine = canopy::Engine::open_devices(devs.devs.clone(), &opts)
            .with_context(|| format!("opening {}", path.display()))?;
        engine.show()
    };
    for d in show.devices.iter_mut().filter(|d| d.path.is_none()) {
        d.path = Some(match d.missing {
            true => "<missing>".into(),
            false => format!("devid:{}", d.devid),
        });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&show)?);
        return Ok(());
    }
    let label = match show.label.is_empty() {
        true => "none".to_string(),
        false => format!("'{}'", show.label),
    };
    println!("Label: {label}  uuid: {}", show.uuid);
    println!(
        "\tTotal devices {} FS bytes used {}",
        show.devices.len(),
        size(show.bytes_used, raw)
    );
    for d in &show.devices {
        println!(
            "\tdevid {:>4} size {} used {} path {}",
            d.devid,
            size(d.size, raw),
            size(d.allocated, raw),
            d.path.as_deref().unwrap_or("?")
        );
    }
    if show.devices.iter().any(|d| d.missing) {
        println!("\t*** Some devices missing");
    }
    Ok(())
}

/// Each device's size and what block groups take of it (every copy
/// counted where it lies), as `btrfs filesystem usage` lists devices.
fn print_devices(devices: &[canopy::alloc::DeviceShow], raw: bool) {
    if devices.len() < 2 {
        return;
    }
    println!();
    println!("Devices:");
    for d in devices {
        let state = match d.missing {
            true => " (missing)",
            false => "",
        };
        println!(
            "  devid {:>2} size {:>12}, allocated {:>12}, unallocated {:>12}  {}{state}",
            d.devid,
            size(d.size, raw),
            size(d.allocated, raw),
            size(d.size.saturating_sub(d.allocated), raw),
            d.path.as_deref().unwrap_or("?")
        );
    }
}

fn print_usage(u: &SpaceUsage, raw: bool) {
    let allocated: u64 = u.kinds.iter().map(|k| k.device_bytes()).sum();
    let used: u64 = u.kinds.iter().map(|k| k.used).sum();
    println!("Device size:   {:>12}", size(u.device_bytes, raw));
    println!("Allocated:     {:>12}", size(allocated, raw));
    println!("Unallocated:   {:>12}", size(u.unallocated, raw));
    println!("Used:          {:>12}", size(used, raw));
    println!();
    for k in &u.kinds {
        let share = if k.size > 0 {
            100.0 * k.used as f64 / k.size as f64
        } else {
            0.0
        };
        let groups = format!("{} group{}", k.groups, if k.groups == 1 { "" } else { "s" });
        println!(
            "{:<16} {groups:>11}: size {:>12}, used {:>12} ({share:.1}%)",
            format!("{},{}", k.kind, k.profile),
            size(k.size, raw),
            size(k.used, raw)
        );
    }
}
