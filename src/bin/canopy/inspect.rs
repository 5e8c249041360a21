//! `canopy inspect`: look inside an unmounted image.

use anyhow::Result;
use canopy::dev::{Access, Device, OpenHow, Source};
use canopy::{Engine, Key, OpenOptions};
use std::sync::Arc;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Show the superblock.
    Super {
        #[arg(long)]
        json: bool,
        #[arg(value_parser = crate::image_arg())]
        image: Source,
    },
    /// Free-space histogram by extent length, like `xfs_db -c freesp`.
    Freesp {
        #[arg(long)]
        json: bool,
        #[arg(value_parser = crate::image_arg())]
        image: Source,
    },
    /// Fragmentation of every subvolume's files, like `xfs_db -c frag`:
    /// extents actual and ideal and the fragmentation factor, files per
    /// extent count, and how far each extent landed from its allocation
    /// hint (the file's previous extent; a first extent, placed by size,
    /// from the data of the inode before it) in power-of-two buckets,
    /// extents placed in
    /// another block group counted apart (seed mail 004's locality
    /// histogram).
    Frag {
        /// One JSON object: files, actual_extents, ideal_extents,
        /// fragmentation_percent, extents_per_file and locality (from, to,
        /// count), median_distance, switched_group.
        #[arg(long)]
        json: bool,
        #[arg(value_parser = crate::image_arg())]
        image: Source,
    },
    /// List the items of one tree (by id: 1 root, 2 extent, 3 block group,
    /// 5 fs, 7 csum, 8 quota, 10 free by start, 11 free by length).
    DumpTree {
        /// Tree id.
        #[arg(short = 't', long, default_value_t = 1)]
        tree: u64,
        #[arg(value_parser = crate::image_arg())]
        image: Source,
    },
}

/// Opens `image` to look at it, beside a live mount if there is one.
fn open_device(image: &Source) -> Result<Arc<dyn Device>> {
    Ok(Arc::from(image.open(Access::Peek, OpenHow::default())?))
}

/// The filesystem on `image`, read-only; one device of several opens
/// alone (degraded), reading the copies it holds.
fn open(image: &Source) -> Result<(Arc<dyn Device>, Engine)> {
    let dev = open_device(image)?;
    let opts = OpenOptions {
        read_only: true,
        degraded: true,
        ..Default::default()
    };
    let e = Engine::open(dev.clone(), &opts)?;
    Ok((dev, e))
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Super { json, image } => show_super(&image, json),
        Command::Freesp { json, image } => show_freesp(&image, json),
        Command::Frag { json, image } => show_frag(&image, json),
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

fn show_super(image: &Source, json: bool) -> Result<()> {
    let dev = open_device(image)?;
    let sb = canopy::txn::read_best_superblock(dev.as_ref())?;
    if json {
        let v = serde_json::json!({
            "fsid": canopy::format::uuid::shown(&sb.fsid),
            "label": sb.label,
            "generation": sb.generation,
            "root": sb.root,
            "root_level": sb.root_level,
            "log_root": sb.log_root,
            "log_prev_root": sb.log_prev_root,
            "log_chain": sb.log_chain,
            "log_chain_roots": canopy::txn::read_chain(dev.as_ref(), &sb)
                .iter().map(|l| l.root).collect::<Vec<_>>(),
            "total_bytes": sb.total_bytes,
            "bytes_used": sb.bytes_used,
            "nodesize": sb.nodesize,
            "sectorsize": sb.sectorsize,
            "incompat": sb.incompat,
            "metadata_profile": sb.metadata_profile.name(),
            "data_profile": sb.data_profile.name(),
            "system_chunks": sb.system_chunks.iter().map(|c| serde_json::json!({
                "start": c.start, "len": c.len,
                "first": c.first.map(|s| serde_json::json!({
                    "devid": s.devid, "offset": s.offset,
                })),
                "copies": c.extra.iter().map(|s| serde_json::json!({
                    "devid": s.devid, "offset": s.offset,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "devid": sb.devid,
            "devices": sb.devices.iter().map(|d| serde_json::json!({
                "devid": d.devid, "bytes": d.bytes,
                "uuid": canopy::format::uuid::shown(&d.uuid),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("fsid\t\t{}", canopy::format::uuid::shown(&sb.fsid));
        println!("label\t\t{}", sb.label);
        println!("generation\t{}", sb.generation);
        println!("root\t\t{} (level {})", sb.root, sb.root_level);
        println!("log_root\t{}", sb.log_root);
        println!("log_prev_root\t{}", sb.log_prev_root);
        println!("log_chain\t{}", sb.log_chain);
        let links = canopy::txn::read_chain(dev.as_ref(), &sb);
        let shown: Vec<String> = links.iter().map(|l| l.root.to_string()).collect();
        println!("log_chain_roots\t{}", shown.join(" "));
        println!("total_bytes\t{}", sb.total_bytes);
        println!("bytes_used\t{}", sb.bytes_used);
        println!("nodesize\t{}", sb.nodesize);
        println!("sectorsize\t{}", sb.sectorsize);
        println!("incompat\t{:#x}", sb.incompat);
        println!("metadata\t{}", sb.metadata_profile.name());
        println!("data\t\t{}", sb.data_profile.name());
        for c in &sb.system_chunks {
            let copies: Vec<String> = c
                .extra
                .iter()
                .map(|s| format!("device {} at {}", s.devid, s.offset))
                .collect();
            let first = c
                .first
                .map(|s| format!("first copy: device {} at {}, ", s.devid, s.offset))
                .unwrap_or_default();
            println!(
                "system group\t{} ({} bytes), {first}other copies: {}",
                c.start,
                c.len,
                copies.join(", ")
            );
        }
        println!("devid		{}", sb.devid);
        for d in &sb.devices {
            println!(
                "device		{} ({} bytes, uuid {})",
                d.devid,
                d.bytes,
                canopy::format::uuid::shown(&d.uuid)
            );
        }
    }
    Ok(())
}

fn show_frag(image: &Source, json: bool) -> Result<()> {
    let (_, e) = open(image)?;
    let r = canopy::fs::extents::frag(&e)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "actual {}, ideal {}, fragmentation factor {:.2}%",
        r.actual_extents, r.ideal_extents, r.fragmentation_percent
    );
    let per_file = r.actual_extents as f64 / r.files.max(1) as f64;
    println!("Files on this filesystem average {per_file:.2} extents per file");
    println!("{:>10} {:>10} {:>10}", "from", "to", "files");
    for b in r.extents_per_file.iter().filter(|b| b.count > 0) {
        println!("{:>10} {:>10} {:>10}", b.from, b.to, b.count);
    }
    println!();
    println!("Distance from the allocation hint (bytes):");
    println!("{:>14} {:>14} {:>10}", "from", "to", "extents");
    for b in r
        .locality
        .iter()
        .filter(|b| b.count > 0 || b.to == 0 && b.from > 0)
    {
        let to = if b.to == 0 && b.from > 0 {
            "other group".to_string()
        } else {
            b.to.to_string()
        };
        println!("{:>14} {to:>14} {:>10}", b.from, b.count);
    }
    match r.median_distance {
        Some(u64::MAX) => println!("median distance: another block group"),
        Some(d) => println!("median distance: {d} bytes"),
        None => println!("median distance: none (no extent has a hint)"),
    }
    Ok(())
}

fn show_freesp(image: &Source, json: bool) -> Result<()> {
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
