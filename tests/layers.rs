//! The layers of the library, top to bottom, and the test that keeps them:
//! a module may use only modules of lower layers (never one above it, nor
//! one beside it in its own layer). This table is the one place the
//! order is written; lib.rs and docs/architecture.md follow it.
//!
//! An upward use that cannot be avoided at once would be listed in
//! [`DEBTS`]; the list is empty (the transaction calls the mechanisms
//! above it through `txn::Mechanism`). The test fails on any upward or
//! sideways use not listed, and also when a listed debt is paid off
//! without being struck from the list, so the list stays true.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top to bottom; modules in one row are one layer.
const LAYERS: &[&[&str]] = &[
    &["fuse"],
    &["send", "receive"],
    &["check"],
    &["fs"],
    &["replace"],
    &["scrub"],
    &["balance"],
    &["engine"],
    &["qgroup"],
    &["extent"],
    &["txn"],
    &["tree"],
    &["alloc"],
    &["cache", "compress", "stream"],
    &["format"],
    &["volume"],
    &["dev"],
    &["error", "sync", "units"],
];

/// Upward uses that remain, (from, to).
const DEBTS: &[(&str, &str)] = &[];

/// Names lib.rs re-exports at the crate root, and their modules.
const REEXPORTS: &[(&str, &str)] = &[
    ("Engine", "txn"),
    ("FormatOptions", "txn"),
    ("OpenOptions", "txn"),
    ("Error", "error"),
    ("Result", "error"),
    ("Key", "format"),
];

fn layer_of(module: &str) -> Option<usize> {
    let module = REEXPORTS
        .iter()
        .find(|(name, _)| *name == module)
        .map_or(module, |(_, m)| m);
    LAYERS.iter().position(|row| row.contains(&module))
}

/// The top-level module a source file belongs to (`src/txn/log.rs` →
/// `txn`, `src/error.rs` → `error`); None for the crate root and binaries.
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    let top = match first.strip_suffix(".rs") {
        Some(stem) => stem.to_string(),
        None => first,
    };
    (top != "lib" && top != "bin" && top != "main").then_some(top)
}

/// Code of a line without its comment (doc comments name other modules
/// freely).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// The top-level modules `text` names through `crate::`, including each
/// of a `use crate::{a::x, b}` group.
fn crate_uses(text: &str) -> BTreeSet<String> {
    let code: String = text.lines().map(code).collect::<Vec<_>>().join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &group[i..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        out.insert(name);
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// (from module, to module) → files that make the use.
fn uses() -> BTreeMap<(String, String), Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let Some(from) = module_of(rel) else { continue };
        let text = std::fs::read_to_string(&f).expect("read");
        for to in crate_uses(&text) {
            let to = REEXPORTS
                .iter()
                .find(|(name, _)| *name == to)
                .map_or(to.as_str(), |(_, m)| m)
                .to_string();
            if to != from {
                out.entry((from.clone(), to))
                    .or_default()
                    .push(rel.display().to_string());
            }
        }
    }
    out
}

#[test]
fn every_module_has_a_layer() {
    for ((from, to), files) in uses() {
        assert!(
            layer_of(&from).is_some(),
            "module {from} is in no layer (tests/layers.rs)"
        );
        assert!(
            layer_of(&to).is_some(),
            "{files:?} use crate::{to}, which is in no layer (tests/layers.rs)"
        );
    }
}

#[test]
fn modules_use_only_lower_layers() {
    let mut wrong = Vec::new();
    let mut debts_seen = BTreeSet::new();
    for ((from, to), files) in uses() {
        let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to)) else {
            continue;
        };
        if b > a {
            continue;
        }
        if DEBTS.contains(&(from.as_str(), to.as_str())) {
            debts_seen.insert((from.clone(), to.clone()));
            continue;
        }
        let how = if a == b { "beside it" } else { "above it" };
        wrong.push(format!("{from} uses {to}, {how}, in {files:?}"));
    }
    assert!(
        wrong.is_empty(),
        "uses against the layers:\n{}",
        wrong.join("\n")
    );
    for &(from, to) in DEBTS {
        assert!(
            debts_seen.contains(&(from.to_string(), to.to_string())),
            "{from} no longer uses {to}: strike it from DEBTS in tests/layers.rs"
        );
    }
}

#[test]
fn the_parser_sees_grouped_and_plain_uses() {
    let text = "use crate::{alloc::X, tree::{a, b}, format};\n\
                // crate::fuse in a comment\n\
                let x = crate::txn::Txn::new();";
    let got: Vec<String> = crate_uses(text).into_iter().collect();
    assert_eq!(got, ["alloc", "format", "tree", "txn"]);
}
