//! `canopy scrub`: read every tree block and data extent back and verify
//! its checksum, on an unmounted image or through a mount's daemon.

use canopy::dev::{Access, Source};
use canopy::fuse::control::{self, Request, Response, ScrubState, ScrubStatus};
use canopy::scrub::{Control, Pace, Progress, Report};
use canopy::{Engine, OpenOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt::Display;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Do not show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Report bad copies of `dup` blocks without rewriting them from the
    /// good copy (an unmounted image is then opened for reading only).
    #[arg(short = 'r', long)]
    readonly: bool,
    /// On a mount point: start the scrub in the daemon and return at once
    /// (follow it with `canopy scrub status`).
    #[arg(short = 'b', long)]
    background: bool,
    /// Another device of an unmounted filesystem (repeat for each).
    #[arg(long = "device", value_name = "DEV", value_parser = crate::image_arg())]
    devices: Vec<Source>,
    /// An unmounted image (scrubbed here: a file, block device or
    /// rbd:POOL/IMAGE) or a mount point (scrubbed by its daemon in the
    /// background, throttled).
    path: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Show the progress or the result of a mount's scrub.
    Status {
        /// Print the status as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// A mounted Canopy filesystem.
        mountpoint: PathBuf,
    },
    /// Stop a mount's running scrub.
    Cancel {
        /// A mounted Canopy filesystem.
        mountpoint: PathBuf,
    },
}

/// Exit codes as btrfs-progs' scrub: 0 clean, 1 could not scrub, 3 damage.
const EXIT_FAILED: u8 = 1;
const EXIT_DAMAGE: u8 = 3;

pub fn run(a: Args) -> ExitCode {
    match &a.command {
        Some(Command::Status { json, mountpoint }) => status(mountpoint, *json),
        Some(Command::Cancel { mountpoint }) => cancel(mountpoint),
        None => match &a.path {
            None => {
                eprintln!("canopy scrub: give an image or a mount point (see --help)");
                ExitCode::from(2)
            }
            Some(p) if p.is_dir() => online(&a, p),
            Some(p) => match Source::from_arg(p.as_os_str()) {
                Ok(image) => offline(&a, &image),
                Err(e) => fail(a.json, "canopy scrub", &e.to_string()),
            },
        },
    }
}

fn fail(json: bool, what: &str, why: &str) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "error": why }));
    }
    eprintln!("{what}: {why}");
    ExitCode::from(EXIT_FAILED)
}

fn bar(quiet: bool) -> Option<ProgressBar> {
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "scrubbing {bar:40} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    })
}

fn show(bar: &Option<ProgressBar>, p: &Progress) {
    if let Some(b) = bar {
        b.set_length(p.bytes_total.max(p.bytes_done));
        b.set_position(p.bytes_done);
    }
}

fn offline(a: &Args, image: &Source) -> ExitCode {
    let what = format!("canopy scrub: {image}");
    // A snapshot never changes: its bad copies are reported, not mended.
    let readonly = a.readonly || image.is_snapshot();
    let access = match readonly {
        true => Access::Share,
        false => Access::Write,
    };
    let devs = match crate::Devices::open(image, &a.devices, access) {
        Ok(d) => d,
        Err(e) => {
            let hint = if e.to_string().contains("mounted") {
                "; scrub its mount point instead"
            } else {
                ""
            };
            return fail(a.json, &what, &format!("{e}{hint}"));
        }
    };
    let ro = devs.options(OpenOptions {
        read_only: true,
        repair_when_read_only: !readonly,
        ..Default::default()
    });
    let engine = match Engine::open_devices(devs.devs.clone(), &ro) {
        Ok(e) => e,
        Err(e) => return fail(a.json, &what, &e.to_string()),
    };
    let ctl = Arc::new(Control::default());
    let c = ctl.clone();
    let worker =
        std::thread::spawn(move || canopy::scrub::run(&engine, &c, Pace { throttle: false }));
    let bar = bar(a.quiet);
    while !worker.is_finished() {
        show(&bar, &ctl.progress());
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    match worker.join() {
        Ok(Ok(report)) => finish(a.json, image, &report),
        Ok(Err(e)) => fail(a.json, &what, &e.to_string()),
        Err(_) => fail(a.json, &what, "the scrub failed unexpectedly"),
    }
}

fn ask(mnt: &Path, req: Request) -> Result<Response, String> {
    let r = control::request(mnt, &req).map_err(|e| e.to_string())?;
    match (&r.error, r.ok) {
        (Some(e), false) => Err(e.clone()),
        _ => Ok(r),
    }
}

fn online(a: &Args, mnt: &Path) -> ExitCode {
    let what = format!("canopy scrub: {}", mnt.display());
    if let Err(e) = ask(mnt, Request::ScrubStart) {
        return fail(a.json, &what, &e);
    }
    if a.background {
        if !a.quiet {
            println!(
                "scrub started on {}; see `canopy scrub status {}`",
                mnt.display(),
                mnt.display()
            );
        }
        return ExitCode::SUCCESS;
    }
    let bar = bar(a.quiet);
    loop {
        let st = match ask(mnt, Request::ScrubStatus).map(|r| r.scrub) {
            Ok(Some(st)) => st,
            Ok(None) => return fail(a.json, &what, "the daemon sent no scrub status"),
            Err(e) => return fail(a.json, &what, &e),
        };
        show(&bar, &st.progress);
        if st.state != ScrubState::Running {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            return ended(a.json, mnt, &st);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Reports a mount's scrub that has ended.
fn ended(json: bool, mnt: &Path, st: &ScrubStatus) -> ExitCode {
    match (&st.report, &st.error) {
        (Some(r), _) => finish(json, &mnt.display(), r),
        (None, e) => fail(
            json,
            &format!("canopy scrub: {}", mnt.display()),
            e.as_deref().unwrap_or("the scrub failed"),
        ),
    }
}

fn status(mnt: &Path, json: bool) -> ExitCode {
    let what = format!("canopy scrub status: {}", mnt.display());
    let st = match ask(mnt, Request::ScrubStatus).map(|r| r.scrub) {
        Ok(Some(st)) => st,
        Ok(None) => return fail(json, &what, "the daemon sent no scrub status"),
        Err(e) => return fail(json, &what, &e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&st).unwrap_or_default());
    } else {
        let p = &st.progress;
        let pct = (p.bytes_done * 100).checked_div(p.bytes_total).unwrap_or(0);
        println!(
            "scrub on {}: {:?}, {} of {} bytes ({pct}%)",
            mnt.display(),
            st.state,
            p.bytes_done,
            p.bytes_total
        );
        if let Some(r) = &st.report {
            print_report(&mnt.display(), r);
        }
        if let Some(e) = &st.error {
            println!("error: {e}");
        }
    }
    match &st.report {
        Some(r) if !r.is_clean() => ExitCode::from(EXIT_DAMAGE),
        _ => ExitCode::SUCCESS,
    }
}

fn cancel(mnt: &Path) -> ExitCode {
    match ask(mnt, Request::ScrubCancel) {
        Ok(r) => {
            let running = r.scrub.is_some_and(|s| s.state == ScrubState::Running);
            println!(
                "{}",
                if running {
                    "scrub cancelled"
                } else {
                    "no scrub was running"
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(
            false,
            &format!("canopy scrub cancel: {}", mnt.display()),
            &e,
        ),
    }
}

/// One line per file: `label` PATH (inode N): bytes START..END, ...
fn print_files(label: &str, files: &[canopy::scrub::DamagedFile]) {
    for f in files {
        let ranges: Vec<String> = f.ranges.iter().map(|(s, e)| format!("{s}..{e}")).collect();
        println!(
            "{label} {} (inode {}): bytes {}",
            f.path.as_deref().unwrap_or("(no path)"),
            f.ino,
            ranges.join(", ")
        );
    }
}

fn print_report(path: &dyn Display, r: &Report) {
    for b in &r.bad_tree_blocks {
        println!(
            "ERROR tree block {} (tree {}): every copy bad: {}",
            b.bytenr, b.tree, b.error
        );
    }
    for c in &r.bad_copies {
        println!(
            "{} {} copy {}: {}",
            if c.repaired { "corrected" } else { "ERROR" },
            c.what(),
            c.copy,
            c.error
        );
    }
    for s in &r.bad_data_sectors {
        println!("ERROR data sector at {s}: checksum mismatch");
    }
    print_files("damaged file", &r.damaged_files);
    print_files("file with a bad copy", &r.repaired_files);
    for b in &r.unsummed_extents {
        println!("ERROR data extent at {b}: no checksums (reads of it fail)");
    }
    print_files("file without checksums", &r.unsummed_files);
    for e in &r.errors {
        println!("ERROR {e}");
    }
    let mib = (r.data_bytes as f64) / f64::from(1u32 << 20);
    println!(
        "{}: {} tree blocks, {} data extents ({mib:.1} MiB) in {:.1} s{}: {}",
        path,
        r.tree_blocks,
        r.data_extents,
        r.seconds,
        if r.cancelled { ", cancelled" } else { "" },
        if r.is_clean() {
            match r.bad_copies.len() {
                0 => "no damage found".to_string(),
                n => format!("{n} bad copies corrected, nothing lost"),
            }
        } else {
            format!(
                "{} damaged tree blocks, {} bad copies ({} corrected), {} damaged data sectors, \
                 {} damaged files, {} data extents without checksums",
                r.bad_tree_blocks.len(),
                r.bad_copies.len(),
                r.bad_copies.iter().filter(|c| c.repaired).count(),
                r.bad_data_sectors.len(),
                r.damaged_files.len(),
                r.unsummed_extents.len()
            )
        }
    );
}

fn finish(json: bool, path: &dyn Display, r: &Report) -> ExitCode {
    if json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    } else {
        print_report(path, r);
    }
    if r.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGE)
    }
}
