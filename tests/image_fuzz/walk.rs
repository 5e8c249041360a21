//! The walk and the exercise, with listings bounded by what each
//! directory holds.

use super::*;

/// What opening and using one image showed.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) opened: bool,
    pub(crate) files: usize,
    /// Operations refused with EIO: what and why (the first few).
    pub(crate) eio: Vec<String>,
    /// Listings that broke a rule (kind, what).
    pub(crate) listing: Vec<(&'static str, String)>,
}

pub(crate) fn note<T>(out: &mut Outcome, what: impl FnOnce() -> String, r: Result<T, Error>) {
    if let Err(e) = r {
        if e.errno() == libc::EIO && out.eio.len() < 5 {
            out.eio.push(format!("{}: {e}", what()));
        }
    }
}

/// How many entries each directory may list: its index items in the
/// image's trees, plus every item of the pending log (it may add
/// names), plus "." and "..".
pub(crate) struct Bounds {
    pub(crate) index: HashMap<(u64, u64), usize>,
    pub(crate) log_items: usize,
}

impl Bounds {
    pub(crate) fn of(img: &[u8], blocks: &[Block]) -> Bounds {
        let mut index = HashMap::new();
        let mut log_items = 0;
        for b in blocks.iter().filter(|b| b.level == 0) {
            let Some(node) = node_at(img, b.addr) else {
                continue;
            };
            if b.is_log() {
                log_items += node.nritems();
                continue;
            }
            for it in node.items().iter().filter(|i| i.key.ty == DIR_INDEX) {
                *index.entry((b.tree, it.key.objectid)).or_insert(0) += 1;
            }
        }
        Bounds { index, log_items }
    }

    pub(crate) fn of_dir(&self, node: u64) -> usize {
        let (tree, ino) = split_node(node);
        self.index.get(&(tree, ino)).copied().unwrap_or(0) + self.log_items + 2
    }
}

/// Visits every directory reachable from the root (each once), stats and
/// reads everything in it. Returns the directories found.
pub(crate) fn walk(fs: &Fs, bounds: &Bounds, out: &mut Outcome) -> Vec<u64> {
    let mut dirs = vec![];
    let mut queue = vec![(256u64, String::new())];
    let mut seen = HashSet::new();
    while let Some((dir, path)) = queue.pop() {
        if !seen.insert(dir) || dirs.len() > 2000 {
            continue;
        }
        dirs.push(dir);
        let limit = bounds.of_dir(dir);
        let mut names = HashSet::new();
        let mut listed = 0usize;
        let mut offset = 0;
        'listing: loop {
            let page = match fs.readdir(dir, offset, 64) {
                Ok(p) => p,
                Err(e) => {
                    note(out, || format!("readdir /{path}"), Err::<(), _>(e));
                    break;
                }
            };
            if page.is_empty() {
                break;
            }
            for (next, _, _, name) in page {
                listed += 1;
                let shown = String::from_utf8_lossy(&name).into_owned();
                if next <= offset {
                    out.listing.push((
                        "listing-offset-stuck",
                        format!("/{path}: entry {shown:?} at offset {next} after {offset}"),
                    ));
                    break 'listing;
                }
                offset = next;
                if !names.insert(name.clone()) {
                    out.listing.push((
                        "listing-repeats-name",
                        format!("/{path}: {shown:?} listed twice (offset {next})"),
                    ));
                    break 'listing;
                }
                if listed > limit {
                    out.listing.push((
                        "listing-too-long",
                        format!("/{path}: more than {limit} entries listed"),
                    ));
                    break 'listing;
                }
                if name == b"." || name == b".." {
                    continue;
                }
                let sub = if path.is_empty() {
                    shown
                } else {
                    format!("{path}/{shown}")
                };
                let attr = match fs.lookup(dir, &name) {
                    Ok(a) => a,
                    Err(e) => {
                        note(out, || format!("lookup /{sub}"), Err::<(), _>(e));
                        continue;
                    }
                };
                out.files += 1;
                visit(fs, attr, &sub, out, &mut queue);
            }
        }
    }
    dirs
}

pub(crate) fn visit(
    fs: &Fs,
    attr: canopy::fs::Attr,
    path: &str,
    out: &mut Outcome,
    queue: &mut Vec<(u64, String)>,
) {
    let ino = attr.ino;
    note(out, || format!("getattr /{path}"), fs.getattr(ino));
    match fs.listxattr(ino) {
        Ok(names) => {
            for name in names.split(|&c| c == 0).filter(|n| !n.is_empty()) {
                note(
                    out,
                    || format!("getxattr /{path} {}", String::from_utf8_lossy(name)),
                    fs.getxattr(ino, name),
                );
            }
        }
        Err(e) => note(out, || format!("listxattr /{path}"), Err::<(), _>(e)),
    }
    match attr.mode & libc::S_IFMT {
        libc::S_IFDIR => queue.push((ino, path.to_string())),
        libc::S_IFLNK => note(out, || format!("readlink /{path}"), fs.readlink(ino)),
        libc::S_IFREG => {
            fs.open(ino);
            let mut pos = 0;
            while pos < attr.size.min(2 << 20) {
                match fs.read(ino, pos, 128 << 10) {
                    Ok(d) if !d.is_empty() => pos += d.len() as u64,
                    r => {
                        note(out, || format!("read /{path} at {pos}"), r);
                        break;
                    }
                }
            }
            note(out, || format!("seek data /{path}"), fs.seek(ino, 0, true));
            note(out, || format!("seek hole /{path}"), fs.seek(ino, 0, false));
            note(out, || format!("release /{path}"), fs.release(ino));
        }
        _ => {}
    }
}

/// Opens `dev` as asked, or says why not.
pub(crate) fn open(dev: &Arc<MemDevice>, read_only: bool) -> Result<Fs, String> {
    let opts = OpenOptions {
        read_only,
        ..Default::default()
    };
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &opts).map_err(|e| e.to_string())?;
    Fs::new(Arc::new(e)).map_err(|e| e.to_string())
}

/// The walk, then changes everywhere it reached, then a sync.
pub(crate) fn exercise(fs: &Fs, bounds: &Bounds, out: &mut Outcome) {
    out.opened = true;
    let dirs = walk(fs, bounds, out);
    let me = canopy::fs::Owner { uid: 0, gid: 0 };
    for (n, &dir) in dirs.iter().take(8).enumerate() {
        let name = format!("new{n}");
        if let Ok(a) = fs.create(dir, name.as_bytes(), libc::S_IFREG | 0o644, 0, me, None) {
            note(
                out,
                || format!("write new{n}"),
                fs.write(a.ino, 0, &[7u8; 9000]),
            );
            note(
                out,
                || format!("rename new{n}"),
                fs.rename(dir, name.as_bytes(), dirs[0], b"moved", false, false),
            );
            note(
                out,
                || format!("link new{n}"),
                fs.link(a.ino, dir, b"again"),
            );
        }
        note(
            out,
            || "remove file1".into(),
            fs.remove(dir, b"file1", false),
        );
        note(
            out,
            || "remove short-link".into(),
            fs.remove(dir, b"short-link", false),
        );
        note(
            out,
            || "rename file2".into(),
            fs.rename(dir, b"file2", dir, b"file2-renamed", false, true),
        );
        if let Ok(a) = fs.lookup(dir, b"file3") {
            let shrink = SetAttr {
                size: Some(3000),
                ..Default::default()
            };
            note(out, || "truncate file3".into(), fs.setattr(a.ino, &shrink));
            note(
                out,
                || "fallocate file3".into(),
                fs.fallocate(a.ino, 0, 1 << 16, 0),
            );
            note(
                out,
                || "removexattr file3".into(),
                fs.removexattr(a.ino, b"user.tag"),
            );
        }
    }
    for pair in dirs.windows(2).take(6) {
        note(
            out,
            || "rename dir1 into another".into(),
            fs.rename(pair[0], b"dir1", pair[1], b"dir1", false, false),
        );
        note(
            out,
            || "rmdir dir2".into(),
            fs.remove(pair[0], b"dir2", true),
        );
    }
    note(out, || "sync".into(), fs.sync());
}
