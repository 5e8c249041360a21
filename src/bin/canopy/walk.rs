//! Naming the files a command works on: paths given, directories
//! descended into with `-r`.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The regular files at `paths` (under them with `recurse`) and the
/// mount point of the first: every file must lie on that one mount.
pub fn files_on_one_mount(
    paths: &[PathBuf],
    recurse: bool,
) -> Result<(PathBuf, Vec<(PathBuf, std::fs::Metadata)>)> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, recurse, &mut files)?;
    }
    let first = paths.first().context("no path given")?;
    let first = first
        .canonicalize()
        .with_context(|| format!("opening {}", first.display()))?;
    let mnt = crate::sync::mount_point(&first)?;
    let dev = std::fs::metadata(&mnt)?.dev();
    if let Some((path, _)) = files.iter().find(|(_, m)| m.dev() != dev) {
        bail!(
            "{} is not on the filesystem mounted at {}",
            path.display(),
            mnt.display()
        );
    }
    Ok((mnt, files))
}

/// Adds the regular files at `path` (under it with `recurse`) to `out`.
pub fn collect(
    path: &Path,
    recurse: bool,
    out: &mut Vec<(PathBuf, std::fs::Metadata)>,
) -> Result<()> {
    let m =
        std::fs::symlink_metadata(path).with_context(|| format!("opening {}", path.display()))?;
    if m.is_file() {
        out.push((path.to_path_buf(), m));
    } else if m.is_dir() {
        if !recurse {
            bail!(
                "{} is a directory (-r descends into directories)",
                path.display()
            );
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("listing {}", path.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("listing {}", path.display()))?;
        entries.sort();
        for e in entries {
            collect(&e, true, out)?;
        }
    }
    Ok(())
}
