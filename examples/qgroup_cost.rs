//! Accounting cost per commit as the number of snapshots grows (issue 15's
//! aim: the cost with 64 snapshots at most 1.2x the cost with 1).
//!
//! Builds a subvolume of many small files in memory, takes S read-only
//! snapshots with a few files changed before each, then times the qgroup
//! accounting of commits that change a few files. The time is the
//! engine's own timer (the `qgroup accounting` debug event), so the rest of
//! the commit does not blur it. Run through `bench/qgroup_cost.sh`.
//!
//! Last, each scenario deletes its oldest snapshot and commits: that
//! commit's accounting time is reported too (a deletion is counted from
//! scratch, see `qgroup::account`).
//!
//! With `--same-history`, every scenario first changes 3 files and commits
//! as often as the largest one takes snapshots, so that only the number
//! of snapshots differs between them, not how often the trees were
//! rewritten.
//!
//! Usage: qgroup_cost [--files N] [--commits C] [--snapshots S,S,...] [--same-history] [--json]

use canopy::dev::{Device, MemDevice};
use canopy::fs::{Fs, Owner, QuotaChange};
use canopy::{Engine, FormatOptions};
use std::sync::Arc;

#[path = "support/events.rs"]
mod events;
use events::FieldLog;

const ROOT: u64 = 256;
const ME: Owner = Owner { uid: 0, gid: 0 };

struct Opts {
    files: u32,
    commits: usize,
    snapshots: Vec<usize>,
    same_history: bool,
    json: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        files: 50_000,
        commits: 31,
        snapshots: vec![1, 64],
        same_history: false,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--files" => o.files = value().parse().unwrap_or_else(|_| usage()),
            "--commits" => o.commits = value().parse().unwrap_or_else(|_| usage()),
            "--snapshots" => {
                o.snapshots = value()
                    .split(',')
                    .map(|s| s.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--same-history" => o.same_history = true,
            "--json" => o.json = true,
            _ => usage(),
        }
    }
    o
}

fn usage() -> ! {
    eprintln!("usage: qgroup_cost [--files N] [--commits C] [--snapshots S,S,...] [--same-history] [--json]");
    std::process::exit(2)
}

/// A small xorshift generator: the same files change in every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One filesystem with its snapshots taken: the files that change and
/// the generator choosing them.
struct Scenario {
    snapshots: usize,
    fs: Fs,
    home: u64,
    files: Vec<u64>,
    rng: Rng,
    samples: Vec<u64>,
}

impl Scenario {
    /// Fills a subvolume with `o.files` files, then takes `snapshots`
    /// read-only snapshots with 3 files changed and a commit after each.
    fn build(o: &Opts, snapshots: usize) -> Res<Scenario> {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4 << 30));
        let format = FormatOptions {
            nodesize: 16384,
            ..Default::default()
        };
        let fs = Fs::new(Arc::new(Engine::format(dev, &format)?))?;
        fs.quota(QuotaChange::Enable)?;
        let home = fs.create_subvolume(ROOT, b"home", ME)?.ino;
        let mut files = Vec::with_capacity(o.files as usize);
        let mut dir = home;
        for i in 0..o.files {
            if i % 1000 == 0 {
                let name = format!("d{}", i / 1000);
                dir = fs
                    .create(home, name.as_bytes(), libc::S_IFDIR | 0o755, 0, ME, None)?
                    .ino;
            }
            // Sizes from inline to a few blocks, as in a source tree.
            let len = [700usize, 3000, 9000, 20_000][i as usize % 4];
            let name = format!("f{i}");
            let a = fs.create(dir, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)?;
            fs.write(a.ino, 0, &vec![i as u8; len])?;
            files.push(a.ino);
        }
        fs.sync()?;
        let mut s = Scenario {
            snapshots,
            fs,
            home,
            files,
            rng: Rng(0x2545_f491),
            samples: Vec::new(),
        };
        let rounds = if o.same_history {
            o.snapshots.iter().copied().max().unwrap_or(snapshots)
        } else {
            snapshots
        };
        for n in 0..rounds {
            if n + snapshots >= rounds {
                s.fs.snapshot(s.home, ROOT, format!("s{n}").as_bytes(), true)?;
            }
            s.change(n)?;
            s.fs.sync()?;
        }
        Ok(s)
    }

    /// Overwrites the start of 3 files chosen at random.
    fn change(&mut self, round: usize) -> Res<()> {
        for k in 0..3 {
            let ino = self.files[self.rng.below(self.files.len())];
            self.fs.write(ino, k * 4096, &[round as u8; 5000])?;
        }
        Ok(())
    }

    /// Deletes the oldest snapshot and commits; the accounting's time (µs).
    fn delete_oldest(&mut self, timings: &FieldLog) -> Res<u64> {
        let Some(oldest) = (0..)
            .map(|n| format!("s{n}"))
            .take(1024)
            .find(|name| self.fs.lookup(ROOT, name.as_bytes()).is_ok())
        else {
            return Ok(0);
        };
        // The deletion may commit by itself: time from before it.
        timings.clear();
        self.fs.delete_subvolume(ROOT, oldest.as_bytes())?;
        self.fs.sync()?;
        Ok(timings.take().iter().sum())
    }

    /// The first, second and third quartile of the samples.
    fn quartiles(&mut self) -> [u64; 3] {
        self.samples.sort_unstable();
        let n = self.samples.len();
        [1, 2, 3].map(|q| self.samples.get(n * q / 4).copied().unwrap_or(0))
    }
}

/// Commits of 3 changed files in every scenario in turn, so that a noisy
/// moment of the machine falls on all of them alike.
fn measure(o: &Opts, scenarios: &mut [Scenario], timings: &FieldLog) -> Res<()> {
    for round in 0..o.commits {
        for s in scenarios.iter_mut() {
            s.change(round)?;
            timings.clear();
            s.fs.sync()?;
            s.samples.extend(timings.take());
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let o = parse();
    let timings = FieldLog::install("canopy::qgroup::account", "micros")?;
    let mut scenarios = o
        .snapshots
        .iter()
        .map(|&n| Scenario::build(&o, n))
        .collect::<Res<Vec<_>>>()?;
    measure(&o, &mut scenarios, &timings)?;
    let mut rows = Vec::new();
    for s in &mut scenarios {
        let [q1, m, q3] = s.quartiles();
        let deletion = s.delete_oldest(&timings)?;
        rows.push((s.snapshots, m, deletion));
        if !o.json {
            println!(
                "{:>4} snapshots: accounting {q1} / {m} / {q3} µs per commit (quartiles of {}); \
                 deleting a snapshot: {deletion} µs",
                s.snapshots,
                s.samples.len()
            );
        }
    }
    if o.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(s, m, d)| {
                serde_json::json!({"snapshots": s, "median_micros": m, "deletion_micros": d})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        if first.1 > 0 {
            println!(
                "ratio {} / {} snapshots: {:.2}x",
                last.0,
                first.0,
                last.1 as f64 / first.1 as f64
            );
        }
    }
    Ok(())
}
