//! How long a metadata balance under many snapshots holds other work up:
//! the state lock held by each balance commit (the engine's "commit
//! prepared under the state lock" debug event) and the latency of a small
//! buffered write made every millisecond meanwhile. Builds, in memory, a
//! subvolume of many small files with quotas on and S read-only
//! snapshots with 3 files changed after each, then runs `balance -m`.
//! (bench/run.py's `ls during balance` column is served from the kernel's
//! caches and no longer shows these holds.)
//!
//! Usage: balance_latency [--files N] [--snapshots S]

use canopy::balance::{BalanceArgs, Filter};
use canopy::dev::{Device, MemDevice};
use canopy::fs::{Fs, Owner, QuotaChange};
use canopy::{Engine, FormatOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/events.rs"]
mod events;
use events::FieldLog;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn parse() -> (u32, usize) {
    let (mut files, mut snapshots) = (50_000u32, 64usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), value) {
            ("--files", Some(v)) => files = v as u32,
            ("--snapshots", Some(v)) => snapshots = v as usize,
            _ => {
                eprintln!("usage: balance_latency [--files N] [--snapshots S]");
                std::process::exit(2)
            }
        }
    }
    (files, snapshots)
}

/// The subvolume's files, after `snapshots` snapshots were taken.
fn build(fs: &Fs, files: u32, snapshots: usize) -> Res<Vec<u64>> {
    fs.quota(QuotaChange::Enable)?;
    let home = fs.create_subvolume(ROOT, b"home", ME)?.ino;
    let mut inodes = Vec::with_capacity(files as usize);
    let mut dir = home;
    for i in 0..files {
        if i % 1000 == 0 {
            let name = format!("d{}", i / 1000);
            dir = fs
                .create(home, name.as_bytes(), libc::S_IFDIR | 0o755, 0, ME, None)?
                .ino;
        }
        let name = format!("f{i}");
        let a = fs.create(dir, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)?;
        let len = [700usize, 3000, 9000, 20_000][i as usize % 4];
        fs.write(a.ino, 0, &vec![i as u8; len])?;
        inodes.push(a.ino);
    }
    fs.sync()?;
    for s in 0..snapshots {
        fs.snapshot(home, ROOT, format!("s{s}").as_bytes(), true)?;
        for k in 0..3 {
            let ino = inodes[(s * 7919 + k * 104_729) % inodes.len()];
            fs.write(ino, 0, &[s as u8; 5000])?;
        }
        fs.sync()?;
    }
    Ok(inodes)
}

/// Writes a few bytes to `ino` every millisecond until `stop`; each
/// write's latency in µs.
fn probe(fs: Arc<Fs>, ino: u64, stop: Arc<AtomicBool>) -> Res<Vec<u64>> {
    let mut latencies = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        fs.write(ino, (i % 64) * 512, b"probe")?;
        latencies.push(t.elapsed().as_micros() as u64);
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(latencies)
}

/// "p50 / p99 / max" of `v`.
fn spread(mut v: Vec<u64>) -> String {
    v.sort_unstable();
    let at = |q: usize| v.get((v.len() * q / 100).min(v.len().saturating_sub(1)));
    match (at(50), at(99), v.last()) {
        (Some(a), Some(b), Some(c)) => format!("{a} / {b} / {c}"),
        _ => "none".into(),
    }
}

fn main() -> Res<()> {
    let (files, snapshots) = parse();
    let holds = FieldLog::install("canopy::txn::commit", "held_us")?;
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4 << 30));
    let format = FormatOptions {
        nodesize: 16384,
        ..Default::default()
    };
    let fs = Arc::new(Fs::new(Arc::new(Engine::format(dev, &format)?))?);
    let inodes = build(&fs, files, snapshots)?;
    holds.clear();
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (fs, stop, ino) = (fs.clone(), stop.clone(), inodes[17]);
        std::thread::spawn(move || probe(fs, ino, stop))
    };
    let t = Instant::now();
    let args = BalanceArgs {
        data: Filter::Skip,
        metadata: Filter::All,
        ..Default::default()
    };
    fs.balance_start(args)?;
    let status = fs.balance_wait();
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let latencies = prober.join().map_err(|_| "probe panicked")??;
    let held = holds.take();
    println!(
        "{snapshots} snapshots, {files} files: balance -m {:?} in {took:.2?}",
        status.state
    );
    println!(
        "  commits: {}, state lock held p50 / p99 / max {} µs",
        held.len(),
        spread(held)
    );
    println!(
        "  writes every ms meanwhile: {}, latency p50 / p99 / max {} µs",
        latencies.len(),
        spread(latencies)
    );
    Ok(())
}
