//! `canopy rescue`: repairs of an unmounted image that give up something
//! to get the rest back, as `btrfs rescue`.

use anyhow::{Context, Result};
use canopy::dev::{Access, Device, OpenHow, Source};
use canopy::txn::LogVerdict;
use canopy::{Engine, OpenOptions};
use clap::Subcommand;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum Command {
    /// Drop the fsync log a crash left, after saying what it held. The
    /// image then opens at its last commit: what was fsynced after it is
    /// lost. For a log that keeps the image from mounting; replay
    /// already passes over a damaged log root on its own.
    ZeroLog(ZeroLogArgs),
    /// Rewrite every superblock copy that is bad or older than the newest
    /// good one, after checking that the filesystem it names opens (as
    /// `btrfs rescue super-recover`). Says what it would write; writes
    /// only with -y.
    SuperRecover(SuperRecoverArgs),
}

#[derive(clap::Args)]
pub struct SuperRecoverArgs {
    /// Write the copies (without it, only say what would be written).
    #[arg(short = 'y', long = "yes")]
    yes: bool,
    /// Print the copies and what was done as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Unmounted image file, block device or rbd:POOL/IMAGE.
    #[arg(value_parser = crate::image_arg())]
    image: Source,
}

#[derive(clap::Args)]
pub struct ZeroLogArgs {
    /// Print what was dropped as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Another device of the filesystem (repeat for each).
    #[arg(long = "device", value_name = "DEV", value_parser = crate::image_arg())]
    devices: Vec<Source>,
    /// Unmounted image file, block device or rbd:POOL/IMAGE.
    #[arg(value_parser = crate::image_arg())]
    image: Source,
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::ZeroLog(a) => zero_log(&a),
        Command::SuperRecover(a) => super_recover(&a),
    }
}

/// One superblock copy and what recovery does with it.
#[derive(serde::Serialize)]
struct SuperCopy {
    offset: u64,
    /// Its generation, when it is valid.
    generation: Option<u64>,
    /// Why it is not, when it is not.
    error: Option<String>,
    rewrite: bool,
}

fn super_recover(a: &SuperRecoverArgs) -> Result<()> {
    let shown = &a.image;
    let access = if a.yes { Access::Write } else { Access::Share };
    let dev: Arc<dyn Device> = Arc::from(
        a.image
            .open(access, OpenHow::default())
            .with_context(|| format!("opening {shown}"))?,
    );
    let best = canopy::txn::read_best_superblock(dev.as_ref())
        .with_context(|| format!("{shown}: no superblock copy is good; nothing to recover from"))?;
    // One device of several opens alone, degraded: its own copies are
    // what is recovered.
    let opts = OpenOptions {
        read_only: true,
        degraded: true,
        ..OpenOptions::default()
    };
    Engine::open(dev.clone(), &opts).with_context(|| {
        format!(
            "{shown}: the newest good superblock copy (generation {}) names a filesystem that does not open",
            best.generation
        )
    })?;
    let copies: Vec<SuperCopy> = canopy::txn::read_super_copies(dev.as_ref())
        .into_iter()
        .filter(|(off, _)| {
            let own = best.device_bytes(best.devid).unwrap_or(best.total_bytes);
            off + canopy::format::SUPER_SIZE <= own
        })
        .map(|(offset, r)| {
            let generation = r.as_ref().ok().map(|sb| sb.generation);
            SuperCopy {
                offset,
                generation,
                error: r.err().map(|e| e.to_string()),
                rewrite: generation != Some(best.generation),
            }
        })
        .collect();
    let todo = copies.iter().filter(|c| c.rewrite).count();
    let write = a.yes && todo > 0;
    if write {
        for c in copies.iter().filter(|c| c.rewrite) {
            dev.write_at(&best.encode(c.offset), c.offset)
                .with_context(|| format!("writing the superblock copy at {}", c.offset))?;
        }
        dev.barrier().context("flushing the superblock copies")?;
    }
    if a.json {
        let v = serde_json::json!({
            "generation": best.generation,
            "copies": copies,
            "written": write,
        });
        println!("{v}");
    } else {
        for c in &copies {
            let state = match (&c.error, c.generation) {
                (Some(e), _) => format!("bad: {e}"),
                (None, Some(g)) if g == best.generation => format!("good (generation {g})"),
                (None, g) => format!("older (generation {})", g.unwrap_or(0)),
            };
            let action = match (c.rewrite, write) {
                (false, _) => "",
                (true, true) => ": rewritten",
                (true, false) => ": would be rewritten",
            };
            println!("superblock copy at {}: {state}{action}", c.offset);
        }
    }
    match (todo, a.yes) {
        (0, _) => {
            if !a.json {
                println!(
                    "{shown}: every superblock copy is good (generation {})",
                    best.generation
                );
            }
            Ok(())
        }
        (n, true) => {
            if !a.json {
                println!(
                    "{shown}: {n} superblock copies rewritten from generation {}",
                    best.generation
                );
            }
            Ok(())
        }
        (n, false) => anyhow::bail!(
            "{n} superblock copies need rewriting; nothing written: run again with -y"
        ),
    }
}

fn zero_log(a: &ZeroLogArgs) -> Result<()> {
    let shown = &a.image;
    let devs = crate::Devices::open(&a.image, &a.devices, Access::Write)
        .with_context(|| format!("opening {shown}"))?;
    let found = what_the_log_holds(&devs).with_context(|| format!("reading {shown}"))?;
    let Some(found) = found else {
        report(a, None, None);
        return Ok(());
    };
    let engine = Engine::open_devices(
        devs.devs.clone(),
        &devs.options(OpenOptions {
            replay_log: false,
            ..OpenOptions::default()
        }),
    )
    .with_context(|| format!("opening {shown}"))?;
    let generation = engine
        .commit()
        .with_context(|| format!("writing {shown} without its log"))?;
    report(a, Some(&found), Some(generation));
    Ok(())
}

/// The log the image names, examined as a mount would (read-only).
fn what_the_log_holds(devs: &crate::Devices) -> canopy::Result<Option<LogVerdict>> {
    let opts = devs.options(OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    });
    Ok(Engine::open_devices(devs.devs.clone(), &opts)?.log_found())
}

fn report(a: &ZeroLogArgs, found: Option<&LogVerdict>, generation: Option<u64>) {
    if a.json {
        let v = serde_json::json!({ "dropped": found, "generation": generation });
        println!("{v}");
        return;
    }
    let Some(v) = found else {
        println!("{}: no fsync log to drop", a.image);
        return;
    };
    match &v.chosen {
        Some(which) => println!(
            "dropped the fsync log: its {which} root held {} inode(s), {} new data \
             extent(s) in {} block(s)",
            v.inodes, v.new_extents, v.blocks
        ),
        None => println!("dropped the fsync log: no root of it could be replayed"),
    }
    for d in &v.dropped {
        println!("  {} root {}: {}", d.which, d.root, d.reason);
    }
    if let Some(g) = generation {
        println!("the image now opens at its last commit (generation {g})");
    }
}
