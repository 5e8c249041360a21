//! Naming the files a command works on: paths given, directories
//! descended into with `-r`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

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
