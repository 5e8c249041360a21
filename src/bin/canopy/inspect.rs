//! `canopy inspect`: look inside an unmounted image.

use anyhow::Result;
use canopy::dev::{Device, FileDevice};
use canopy::{Engine, Key, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Show the superblock.
    Super {
        #[arg(long)]
        json: bool,
        image: PathBuf,
    },
    /// Free-space histogram by extent length, like `xfs_db -c freesp`.
    Freesp {
        #[arg(long)]
        json: bool,
        image: PathBuf,
    },
    /// List the items of one tree (by id: 1 root, 2 extent, 3 block group,
    /// 5 fs, 7 csum, 8 quota, 10 free by start, 11 free by length).
    DumpTree {
        /// Tree id.
        #[arg(short = 't', long, default_value_t = 1)]
        tree: u64,
        image: PathBuf,
    },
}

fn open(image: &std::path::Path) -> Result<(Arc<dyn Device>, Engine)> {
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(image, true, false)?);
    let opts = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let e = Engine::open(dev.clone(), &opts)?;
    Ok((dev, e))
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Super { json, image } => show_super(&image, json),
        Command::Freesp { json, image } => show_freesp(&image, json),
        Command::DumpTree { tree, image } => {
            let (_, e) = open(&image)?;
            let items = e.read(|r| r.range(tree, &Key::MIN, &Key::MAX))?;
            for (k, d) in items {
                println!("key {k} size {}", d.len());
            }
            Ok(())
        }
    }
}

fn show_super(image: &Path, json: bool) -> Result<()> {
    let dev = FileDevice::open(image, true, false)?;
    let sb = canopy::txn::read_best_superblock(&dev)?;
    if json {
        let v = serde_json::json!({
            "fsid": canopy::format::uuid::shown(&sb.fsid),
            "label": sb.label,
            "generation": sb.generation,
            "root": sb.root,
            "root_level": sb.root_level,
            "log_root": sb.log_root,
            "log_prev_root": sb.log_prev_root,
            "total_bytes": sb.total_bytes,
            "bytes_used": sb.bytes_used,
            "nodesize": sb.nodesize,
            "sectorsize": sb.sectorsize,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("fsid\t\t{}", canopy::format::uuid::shown(&sb.fsid));
        println!("label\t\t{}", sb.label);
        println!("generation\t{}", sb.generation);
        println!("root\t\t{} (level {})", sb.root, sb.root_level);
        println!("log_root\t{}", sb.log_root);
        println!("log_prev_root\t{}", sb.log_prev_root);
        println!("total_bytes\t{}", sb.total_bytes);
        println!("bytes_used\t{}", sb.bytes_used);
        println!("nodesize\t{}", sb.nodesize);
        println!("sectorsize\t{}", sb.sectorsize);
    }
    Ok(())
}

fn show_freesp(image: &Path, json: bool) -> Result<()> {
    let (_, e) = open(image)?;
    let hist = e.free_histogram();
    let total: u64 = hist.iter().map(|h| h.2).sum();
    if json {
        let rows: Vec<_> = hist
            .iter()
            .map(|&(from, n, bytes)| serde_json::json!({"from_sectors": from, "extents": n, "bytes": bytes}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{:>10} {:>10} {:>10} {:>14} {:>6}",
            "from", "to", "extents", "sectors", "pct"
        );
        for (from, n, bytes) in hist {
            let to = if from == 0 { 0 } else { from * 2 - 1 };
            let pct = if total == 0 {
                0.0
            } else {
                bytes as f64 * 100.0 / total as f64
            };
            println!(
                "{from:>10} {to:>10} {n:>10} {:>14} {pct:>6.2}",
                bytes / 4096
            );
        }
    }
    Ok(())
}
