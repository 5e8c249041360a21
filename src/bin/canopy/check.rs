//! `canopy check`: read-only consistency check.

use canopy::dev::{Access, Source};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Do not show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Also read every data extent and verify it against its checksums,
    /// as `canopy scrub` does. Without it, check reads metadata only: it
    /// proves every data extent has its checksums, but a flipped data
    /// sector is found only by reading it (scrub, or this option).
    #[arg(long)]
    check_data_csum: bool,
    /// Repair what a crash or a bug leaves in counters the rest of the
    /// image determines: block group usage and the free-space trees
    /// (counted again from the extent tree), inode link counts and
    /// nbytes, data extents' reference counts and back-references, lost
    /// listing-index entries and leaked inodes.
    /// Prints each change. With any other damage it changes nothing and
    /// says so. The image must not be mounted.
    #[arg(long, conflicts_with = "check_data_csum")]
    repair: bool,
    /// Memory the records that relate distant items (names and
    /// back-references, extents and checksums) may take; past it they are
    /// sorted in runs on temporary files in $TMPDIR. The block cache
    /// takes an eighth of it; what grows with tree blocks (not files)
    /// comes on top.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size,
          default_value_t = canopy::check::DEFAULT_MEMORY)]
    max_memory: u64,
    /// Another device of the filesystem (repeat for each; a filesystem
    /// over several devices is checked whole or its missing devices are
    /// reported).
    #[arg(long = "device", value_name = "DEV", value_parser = crate::image_arg())]
    devices: Vec<Source>,
    /// Unmounted image file, block device or rbd:POOL/IMAGE.
    #[arg(value_parser = crate::image_arg())]
    image: Source,
}

const EXIT_PROBLEMS: u8 = 4;
const EXIT_OPERATIONAL: u8 = 8;

pub fn run(a: Args) -> ExitCode {
    if a.repair {
        return repair(&a);
    }
    let devs = match crate::Devices::open(&a.image, &a.devices, Access::Peek) {
        Ok(d) => d.devs,
        Err(e) => return fail(&a, &e.to_string()),
    };
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("checking {bar:40} {pos}/{len} blocks")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let report = canopy::check::check_all_devices_within(devs.clone(), &progress, a.max_memory)
        .map(|mut r| {
            if a.check_data_csum && r.is_clean() {
                canopy::check::check_data_sums_devices(devs, &mut r);
            }
            r
        });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => return fail(&a, &e.to_string()),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        for p in &report.problems {
            println!("ERROR {}: {}", p.location, p.message);
        }
        for w in &report.warnings {
            println!("warning {}: {}", w.location, w.message);
        }
        if let Some(log) = &report.log {
            print_log(log);
        }
        if report.queued_blocks > 0 {
            println!(
                "{} tree blocks of deleted subvolumes wait for the cleaner (the next writable mount frees them)",
                report.queued_blocks
            );
        }
        println!(
            "{}: generation {}, {} trees, {} tree blocks, {} data extents, {} bytes used: {}",
            a.image,
            report.generation,
            report.trees,
            report.tree_blocks,
            report.data_extents,
            report.bytes_used,
            if report.is_clean() {
                "clean".to_string()
            } else {
                format!("{} problems", report.problems.len())
            }
        );
    }
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEMS)
    }
}

/// `--repair`: the check, then the fixes if every problem has one.
fn repair(a: &Args) -> ExitCode {
    let devs = match crate::Devices::open(&a.image, &a.devices, Access::Write) {
        Ok(d) => d.devs,
        Err(e) => return fail(a, &e.to_string()),
    };
    let outcome = match canopy::check::repair::repair_within(devs, &|_, _| {}, a.max_memory) {
        Ok(o) => o,
        Err(e) => return fail(a, &format!("repair failed: {e}")),
    };
    use canopy::check::repair::Outcome;
    let (code, report, lines) = match outcome {
        Outcome::Clean(r) => (ExitCode::SUCCESS, r, vec!["nothing to repair".to_string()]),
        Outcome::Refused { report, why } => (
            ExitCode::from(EXIT_PROBLEMS),
            report,
            vec![format!("not repaired, nothing changed: {why}")],
        ),
        Outcome::Repaired { changes, after } => {
            let code = match after.is_clean() {
                true => ExitCode::SUCCESS,
                false => ExitCode::from(EXIT_PROBLEMS),
            };
            (code, after, changes)
        }
    };
    if a.json {
        let out = serde_json::json!({ "changes": lines, "report": report });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return code;
    }
    for p in &report.problems {
        println!("ERROR {}: {}", p.location, p.message);
    }
    for l in &lines {
        println!("{l}");
    }
    println!(
        "{}: {}",
        a.image,
        match report.is_clean() {
            true => "clean".to_string(),
            false => format!("{} problems", report.problems.len()),
        }
    );
    code
}

/// What the next mount would replay of the fsync log a crash left.
fn print_log(log: &canopy::txn::LogVerdict) {
    match &log.chosen {
        Some(which) => println!(
            "fsync log pending: the next mount replays its {which} root \
             ({} inodes, {} new data extents, {} log blocks)",
            log.inodes, log.new_extents, log.blocks
        ),
        None => println!(
            "fsync log pending, but no root of it can be replayed: the next mount \
             opens at the last commit"
        ),
    }
    if !log.skipped.is_empty() {
        println!(
            "  and leaves out {} inode(s) whose logged items are refused (they keep \
             their committed state)",
            log.skipped.len()
        );
    }
}

fn fail(a: &Args, why: &str) -> ExitCode {
    if a.json {
        println!("{}", serde_json::json!({ "error": why }));
    }
    eprintln!("canopy check: {}: {why}", a.image);
    ExitCode::from(EXIT_OPERATIONAL)
}
