//! Engine benchmark: insert, point lookup, ordered scan and delete of N keys
//! through a real image file, committing every `--commit-every` operations.
//! Run through `bench/engine.sh`, which builds in release mode.
//!
//! Usage: engine_bench [--keys N] [--rounds R] [--nodesize B] [--commit-every C] [--json] DIR

use canopy::dev::{Device, FileDevice};
use canopy::format::tree_id::FS;
use canopy::{Engine, FormatOptions, Key, OpenOptions};
use std::sync::Arc;
use std::time::Instant;

struct Opts {
    keys: u64,
    rounds: usize,
    nodesize: u32,
    commit_every: u64,
    json: bool,
    dir: std::path::PathBuf,
}

fn parse() -> Opts {
    let mut o = Opts {
        keys: 1_000_000,
        rounds: 3,
        nodesize: 16384,
        commit_every: 10_000,
        json: false,
        dir: std::env::temp_dir(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| usage())
        };
        match a.as_str() {
            "--keys" => o.keys = num(),
            "--rounds" => o.rounds = num() as usize,
            "--nodesize" => o.nodesize = num() as u32,
            "--commit-every" => o.commit_every = num().max(1),
            "--json" => o.json = true,
            "-h" | "--help" => usage(),
            d => o.dir = d.into(),
        }
    }
    o
}

fn usage() -> ! {
    eprintln!("usage: engine_bench [--keys N] [--rounds R] [--nodesize B] [--commit-every C] [--json] DIR");
    std::process::exit(2)
}

/// A fixed permutation of 0..n (multiplicative hashing by an odd constant
/// modulo a power of two, then skipping values >= n).
fn shuffled(n: u64) -> Vec<u64> {
    let m = n.next_power_of_two();
    (0..m)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & (m - 1))
        .filter(|&x| x < n)
        .collect()
}

fn key(i: u64) -> Key {
    Key::new(i.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 8, 1, i)
}

type Phase = (&'static str, f64);

fn round(o: &Opts, path: &std::path::Path) -> canopy::Result<Vec<Phase>> {
    let _ = std::fs::remove_file(path);
    FileDevice::create_image(path, 8 << 30)?;
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, false, true)?);
    let fmt = FormatOptions {
        nodesize: o.nodesize,
        ..Default::default()
    };
    drop(Engine::format(dev.clone(), &fmt)?);
    let e = Engine::open(dev.clone(), &OpenOptions::default())?;
    let order = shuffled(o.keys);
    let mut out = Vec::new();
    let value = vec![0xabu8; 32];

    let t = Instant::now();
    for chunk in order.chunks(o.commit_every as usize) {
        e.write(|tx| {
            for &i in chunk {
                tx.insert(FS, key(i), value.clone())?;
            }
            Ok(())
        })?;
        e.commit()?;
    }
    out.push((
        "insert (random order)",
        o.keys as f64 / t.elapsed().as_secs_f64(),
    ));

    // Cold-ish: reopen so lookups start from an empty cache.
    drop(e);
    let e = Engine::open(dev.clone(), &OpenOptions::default())?;
    let t = Instant::now();
    e.read(|r| {
        for &i in &order {
            if r.get(FS, &key(i))?.is_none() {
                return Err(canopy::Error::NotFound);
            }
        }
        Ok(())
    })?;
    out.push((
        "lookup (random order)",
        o.keys as f64 / t.elapsed().as_secs_f64(),
    ));

    let t = Instant::now();
    let n = e.read(|r| {
        let root = r.root(FS)?;
        let mut c = canopy::tree::Cursor::seek(r, &root, &Key::MIN)?;
        let mut n = 0u64;
        while c.item().is_some() {
            n += 1;
            c.next(r)?;
        }
        Ok(n)
    })?;
    assert_eq!(n, o.keys);
    out.push(("ordered scan", o.keys as f64 / t.elapsed().as_secs_f64()));

    let t = Instant::now();
    for chunk in order.chunks(o.commit_every as usize) {
        e.write(|tx| {
            for &i in chunk {
                tx.delete(FS, &key(i))?;
            }
            Ok(())
        })?;
        e.commit()?;
    }
    out.push((
        "delete (random order)",
        o.keys as f64 / t.elapsed().as_secs_f64(),
    ));
    drop(e);
    let _ = std::fs::remove_file(path);
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let o = parse();
    let path = o.dir.join("canopy-engine-bench.img");
    let mut rounds: Vec<Vec<Phase>> = Vec::new();
    for r in 0..o.rounds {
        match round(&o, &path) {
            Ok(p) => rounds.push(p),
            Err(e) => {
                eprintln!("round {r} failed: {e}");
                std::process::exit(1);
            }
        }
    }
    let names: Vec<&str> = rounds[0].iter().map(|p| p.0).collect();
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let v: Vec<f64> = rounds.iter().map(|r| r[i].1).collect();
        let (min, max) = v
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        rows.push((name, median(v), min, max));
    }
    if o.json {
        let j: Vec<_> = rows
            .iter()
            .map(|(n, m, lo, hi)| serde_json::json!({"phase": n, "median_ops_per_s": m, "min": lo, "max": hi}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"keys": o.keys, "nodesize": o.nodesize,
            "commit_every": o.commit_every, "rounds": o.rounds, "results": j})
        );
    } else {
        println!(
            "{} keys, nodesize {}, commit every {} ops, {} rounds (ops/s: median, min-max)",
            o.keys, o.nodesize, o.commit_every, o.rounds
        );
        for (n, m, lo, hi) in rows {
            println!("| {n:<22} | {m:>12.0} | {lo:>10.0} – {hi:<10.0} |");
        }
    }
}
