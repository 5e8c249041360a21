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
}

#[derive(clap::Args)]
pub struct ZeroLogArgs {
    /// Print what was dropped as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Unmounted image file, block device or rbd:POOL/IMAGE.
    #[arg(value_parser = crate::image_arg())]
    image: Source,
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::ZeroLog(a) => zero_log(&a),
    }
}

fn zero_log(a: &ZeroLogArgs) -> Result<()> {
    let shown = &a.image;
    let dev: Arc<dyn Device> = Arc::from(
        a.image
            .open(Access::Write, OpenHow::default())
            .with_context(|| format!("opening {shown}"))?,
    );
    let found = what_the_log_holds(dev.clone()).with_context(|| format!("reading {shown}"))?;
    let Some(found) = found else {
        report(a, None, None);
        return Ok(());
    };
    let engine = Engine::open(
        dev,
        &OpenOptions {
            replay_log: false,
            ..OpenOptions::default()
        },
    )
    .with_context(|| format!("opening {shown}"))?;
    let generation = engine
        .commit()
        .with_context(|| format!("writing {shown} without its log"))?;
    report(a, Some(&found), Some(generation));
    Ok(())
}

/// The log the image names, examined as a mount would (read-only).
fn what_the_log_holds(dev: Arc<dyn Device>) -> canopy::Result<Option<LogVerdict>> {
    let opts = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    Ok(Engine::open(dev, &opts)?.log_found())
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
