//! The hostile-image fuzzer with an oracle (issue 58). Each case takes a
//! realistic image (`common::images::rich_image`: directories, inline,
//! multi-extent, sparse and compressed files, hard links, symlinks,
//! xattrs, a subvolume and its snapshot; half the cases with a pending
//! fsync log) and makes 1 to 3 structure-aware changes to live tree
//! blocks of any tree (file trees and the log weighted higher), each
//! block left with a valid checksum so the damage reaches the checks
//! behind it:
//!
//! - fields inside item data, item data resized;
//! - key fields (objectid, type, offset), keys swapped out of order, items
//!   deleted, duplicated or their data swapped;
//! - item headers' data offsets and sizes (raw bytes);
//! - block header generation, owner, level, nritems, flags;
//! - a block's generation with its parent pointer patched to match;
//! - child pointers of internal nodes (address, generation, key);
//! - whole blocks copied over others (address field fixed);
//! - a name's directory index changed everywhere it is recorded (index
//!   key, entries, back-reference), so the items agree with each other.
//!
//! Then the oracle: `check::check_all` on the result. If it calls the
//! image clean, (a) a read-only open and a walk of everything reachable
//! (all data read, links read, xattrs listed) must give no EIO and log no
//! ERROR event; (b) a read-write open, the writes, renames and deletes of
//! `exercise`, a sync, then `check_all` must still be clean; (c) no
//! listing may return more entries than the directory's index items (and
//! the log's items) allow, repeat a name, or fail to advance its offset.
//! A panic, a hang (120 s) or an allocation over 256 MiB fails the test
//! in every mode. A data checksum mismatch alone is reported but passes:
//! `check` does not read file data (scrub does).
//!
//! Environment: `CANOPY_FUZZ_SEED` (the first case's seed; each case
//! prints the seed that reruns it alone with `CANOPY_FUZZ_CASES=1`),
//! `CANOPY_FUZZ_CASES` (default 200, unlimited when only a time is
//! given), `CANOPY_FUZZ_SECS` (time limit, default 300),
//! `CANOPY_FUZZ_REPORT_ONLY=1` (print violations and pass),
//! `CANOPY_FUZZ_VERBOSE=1` (print every case).

#[path = "../common/mod.rs"]
mod common;
mod errors;
mod mutate;
mod walk;

use canopy::dev::{Device, MemDevice};
use canopy::format::key_type::*;
use canopy::format::node::{Body, Node};
use canopy::format::tree_id;
use canopy::fs::{split_node, Fs, SetAttr};
use canopy::{Engine, Error, OpenOptions};
use common::images::*;
use common::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use errors::*;
use mutate::*;
use walk::*;

#[global_allocator]
static GUARD: common::guard::Guard = common::guard::Guard;

const HANG_SECS: u64 = 120;

// One case and its verdict.

struct Images {
    plain: Vec<u8>,
    plain_blocks: Vec<Block>,
    logged: Vec<u8>,
    logged_blocks: Vec<Block>,
}

#[derive(Debug)]
struct Violation {
    kind: &'static str,
    seed: u64,
    mutation: String,
    what: String,
}

#[derive(Debug, Default)]
struct CaseResult {
    check_clean: bool,
    check_error: bool,
    mutation: String,
    violations: Vec<(&'static str, String)>,
}

fn first_problem(r: &canopy::check::Report) -> String {
    let n = r.problems.len();
    r.problems.first().map_or(String::new(), |p| {
        format!("{n} problems, first: {}: {}", p.location, p.message)
    })
}

/// A violation that the design allows for now: `check` does not read
/// file data, so a data checksum that does not match is for scrub to
/// find (issue 58 asks for `check --check-data-csum`). Reported, never
/// failing the test.
const DATA_CSUM: &str = "data-csum-mismatch (scrub's to find)";

struct Verdicts<'a>(&'a mut Vec<(&'static str, String)>);

impl Verdicts<'_> {
    fn push(&mut self, kind: &'static str, what: String) {
        self.0.push((kind, what));
    }

    /// One violation of `kind` for these messages, if any; of kind
    /// `DATA_CSUM` if all of them are data checksum mismatches.
    fn all(&mut self, kind: &'static str, msgs: &[String]) {
        if msgs.is_empty() {
            return;
        }
        let csum = msgs.iter().all(|m| m.contains("data checksum mismatch"));
        self.push(if csum { DATA_CSUM } else { kind }, msgs.join(" | "));
    }
}

fn run_case(images: &Images, seed: u64) -> CaseResult {
    let mut rng = Rng(seed | 1);
    let logged = rng.below(2) == 0;
    let (img, blocks) = if logged {
        (&images.logged, &images.logged_blocks)
    } else {
        (&images.plain, &images.plain_blocks)
    };
    let mut bad = img.clone();
    let changes = mutate(&mut bad, blocks, &mut rng);
    let mut res = CaseResult {
        mutation: format!(
            "{} image; {}",
            if logged { "logged" } else { "plain" },
            changes.join("; ")
        ),
        ..Default::default()
    };
    let bounds = Bounds::of(&bad, blocks);
    take_errors();
    let report = canopy::check::check_all(Arc::new(MemDevice::from_bytes(bad.clone())), &|_, _| {});
    let report = match report {
        Ok(r) => r,
        Err(_) => {
            res.check_error = true;
            return res;
        }
    };
    take_errors();
    if !report.is_clean() {
        // Not judged, but it must still not panic, hang or allocate
        // by the disk (every fourth such case, for speed).
        if rng.below(4) == 0 {
            let dev = Arc::new(MemDevice::from_bytes(bad));
            if let Ok(fs) = open(&dev, false) {
                exercise(&fs, &bounds, &mut Outcome::default());
            }
            take_errors();
        }
        return res;
    }
    res.check_clean = true;
    let warned = expected_errors(&report);
    let take_errors =
        || -> Vec<String> { take_errors().into_iter().filter(|e| !warned(e)).collect() };
    let mut v = Verdicts(&mut res.violations);
    // (a) Read-only: no EIO, no ERROR line.
    let dev = Arc::new(MemDevice::from_bytes(bad.clone()));
    match open(&dev, true) {
        Err(e) => v.push("ro-open-refused", e),
        Ok(fs) => {
            let mut out = Outcome::default();
            walk(&fs, &bounds, &mut out);
            drop(fs);
            v.all("ro-walk-eio", &out.eio);
            for (kind, what) in out.listing {
                v.push(kind, what);
            }
        }
    }
    v.all("ro-error-logged", &take_errors());
    // (b) Read-write: the exercise and a sync leave a clean image.
    let dev = Arc::new(MemDevice::from_bytes(bad));
    match open(&dev, false) {
        Err(e) => v.push("rw-open-refused", e),
        Ok(fs) => {
            let mut out = Outcome::default();
            exercise(&fs, &bounds, &mut out);
            if let Some(why) = fs.engine().shutdown_reason() {
                v.push("rw-shut-down", format!("{why:?}"));
            }
            drop(fs);
            v.all("rw-eio", &out.eio);
            v.all("rw-error-logged", &take_errors());
            let copy = Arc::new(MemDevice::from_bytes(dev.snapshot()));
            match canopy::check::check_all(copy, &|_, _| {}) {
                Ok(r) if r.is_clean() => {}
                Ok(r) => v.push("rw-made-damage", first_problem(&r)),
                Err(e) => v.push("rw-made-damage", format!("check failed: {e}")),
            }
        }
    }
    take_errors();
    res
}

/// ERROR lines a clean report has announced as warnings: a log root
/// passed over as a write a crash cut short (torn, or a stale block
/// where it should be). Such an image is what a power cut during an
/// fsync leaves; check warns, the mount logs it, and neither is damage.
///
/// Reading such a block may also log its bad items (the engine checks
/// every leaf it reads): lines naming a block the warnings name.
fn expected_errors(report: &canopy::check::Report) -> impl Fn(&str) -> bool {
    let torn: Vec<&canopy::check::Problem> = report
        .warnings
        .iter()
        .filter(|w| w.location.starts_with("log root"))
        .collect();
    let blocks: Vec<String> = torn
        .iter()
        .flat_map(|w| {
            format!("{} {}", w.location, w.message)
                .split(|c: char| !c.is_ascii_digit())
                .filter(|n| n.len() >= 6)
                .map(|n| format!("block={n}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let torn_log = !torn.is_empty();
    move |e: &str| {
        torn_log
            && (e.contains("root of the fsync log")
                || e.contains("no root of the fsync log can be replayed")
                || blocks
                    .iter()
                    .any(|b| e.contains(&format!("{b} ")) || e.ends_with(b.as_str())))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let s = std::env::var(name).ok()?;
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

fn build_images() -> Images {
    let plain = rich_image();
    let logged = rich_with_log(&plain);
    let plain_blocks = live_blocks(&plain);
    let logged_blocks = live_blocks(&logged);
    Images {
        plain,
        plain_blocks,
        logged,
        logged_blocks,
    }
}

/// A summary of an image's live blocks, to tell whether a rerun built
/// the same image (a seed reproduces a case only on the same image).
fn fingerprint(blocks: &[Block]) -> String {
    let mut per_tree: BTreeMap<String, usize> = BTreeMap::new();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in blocks {
        *per_tree.entry(tree_name(b.tree)).or_insert(0) += 1;
        for v in [b.addr, b.tree, u64::from(b.level)] {
            h = (h ^ v).wrapping_mul(0x100_0000_01b3);
        }
    }
    let trees: Vec<String> = per_tree.iter().map(|(t, n)| format!("{t} {n}")).collect();
    format!(
        "{} blocks ({}), layout {h:016x}",
        blocks.len(),
        trees.join(", ")
    )
}

#[test]
fn rich_images_are_clean_and_walk_without_errors() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_error_layer();
    let images = build_images();
    for (name, img, blocks) in [
        ("plain", &images.plain, &images.plain_blocks),
        ("logged", &images.logged, &images.logged_blocks),
    ] {
        let dev = Arc::new(MemDevice::from_bytes(img.clone()));
        let report = canopy::check::check_all(dev.clone(), &|_, _| {}).expect("check");
        assert!(report.is_clean(), "{name}: {:#?}", report.problems);
        assert!(blocks.iter().any(|b| tree_id::is_subvolume(b.tree)));
        assert!(blocks.iter().any(|b| b.level > 0));
        assert_eq!(blocks.iter().any(|b| b.is_log()), name == "logged");
        take_errors();
        let bounds = Bounds::of(img, blocks);
        let mut out = Outcome::default();
        let fs = open(&dev, true).expect("read-only open");
        walk(&fs, &bounds, &mut out);
        drop(fs);
        assert!(
            out.eio.is_empty() && out.listing.is_empty(),
            "{name}: {out:?}"
        );
        assert!(out.files > 150, "{name}: {out:?}");
        let mut out = Outcome::default();
        let fs = open(&dev, false).expect("open");
        exercise(&fs, &bounds, &mut out);
        drop(fs);
        assert!(
            out.eio.is_empty() && out.listing.is_empty(),
            "{name}: {out:?}"
        );
        assert_eq!(take_errors(), Vec::<String>::new(), "{name}");
        common::assert_fs_clean(&dev);
    }
}

#[test]
fn image_fuzz_oracle() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_error_layer();
    let secs = env_u64("CANOPY_FUZZ_SECS");
    let cases = env_u64("CANOPY_FUZZ_CASES").unwrap_or(if secs.is_some() { u64::MAX } else { 200 });
    let secs = secs.unwrap_or(300);
    let mut seed = env_u64("CANOPY_FUZZ_SEED").unwrap_or(0x0058_f022_5eed);
    let report_only = std::env::var("CANOPY_FUZZ_REPORT_ONLY").is_ok_and(|v| v == "1");
    let verbose = std::env::var("CANOPY_FUZZ_VERBOSE").is_ok_and(|v| v == "1");
    let started = Instant::now();
    let images = Arc::new(build_images());
    eprintln!(
        "image_fuzz: plain image {}\nimage_fuzz: logged image {}\nimage_fuzz: images built in {:.1} s",
        fingerprint(&images.plain_blocks),
        fingerprint(&images.logged_blocks),
        started.elapsed().as_secs_f64()
    );
    take_errors();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut ran, mut clean, mut check_errors) = (0u64, 0u64, 0u64);
    let mut violations: Vec<Violation> = vec![];
    let mut fatal: Vec<Violation> = vec![];
    while ran < cases && Instant::now() < deadline {
        let case_seed = seed;
        seed = Rng(seed | 1).next();
        let imgs = images.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_case(&imgs, case_seed)
            }));
            let _ = tx.send(r.map_err(|p| panic_message(&*p)));
        });
        ran += 1;
        let res = match rx.recv_timeout(Duration::from_secs(HANG_SECS)) {
            Ok(Ok(res)) => res,
            Ok(Err(msg)) => {
                fatal.push(Violation {
                    kind: "panic",
                    seed: case_seed,
                    mutation: String::new(),
                    what: msg,
                });
                continue;
            }
            Err(_) => {
                fatal.push(Violation {
                    kind: "hang",
                    seed: case_seed,
                    mutation: String::new(),
                    what: format!("no verdict in {HANG_SECS} s"),
                });
                continue;
            }
        };
        clean += u64::from(res.check_clean);
        check_errors += u64::from(res.check_error);
        if verbose {
            eprintln!(
                "case {case_seed:#x}: {} {}: {}",
                if res.check_clean { "clean" } else { "damaged" },
                res.violations.len(),
                res.mutation
            );
        }
        for (kind, what) in res.violations {
            eprintln!(
                "VIOLATION {kind}: CANOPY_FUZZ_SEED={case_seed:#x} CANOPY_FUZZ_CASES=1\n  mutation: {}\n  what: {what}",
                res.mutation
            );
            violations.push(Violation {
                kind,
                seed: case_seed,
                mutation: res.mutation.clone(),
                what,
            });
        }
    }
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for v in violations.iter().chain(&fatal) {
        *by_kind.entry(v.kind).or_insert(0) += 1;
    }
    eprintln!(
        "image_fuzz: {ran} cases in {:.0} s, {clean} check-clean, {check_errors} check errors, \
         {} violations {by_kind:?}",
        started.elapsed().as_secs_f64(),
        violations.len() + fatal.len()
    );
    for v in &fatal {
        eprintln!(
            "FATAL {}: CANOPY_FUZZ_SEED={:#x} CANOPY_FUZZ_CASES=1: {}",
            v.kind, v.seed, v.what
        );
    }
    assert!(fatal.is_empty(), "{} panics or hangs (above)", fatal.len());
    assert!(ran > 0);
    violations.retain(|v| v.kind != DATA_CSUM);
    if !report_only {
        assert!(
            violations.is_empty(),
            "{} oracle violations (above; CANOPY_FUZZ_REPORT_ONLY=1 reports without failing): {:#?}",
            violations.len(),
            violations
                .iter()
                .map(|v| format!("{} {:#x}: {} | {}", v.kind, v.seed, v.mutation, v.what))
                .collect::<Vec<_>>()
        );
    }
}
