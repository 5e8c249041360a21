//! Paths from a stream, resolved inside the subvolume being received and
//! nowhere else: a path must be relative and have no empty, `.` or `..`
//! component, and it is walked name by name from the subvolume's root
//! with directory lookups, so a symlink is never followed (a component
//! that is not a directory ends the walk with an error) and no walk can
//! leave the subvolume.

use crate::error::{Error, Result};
use crate::fs::{Attr, Fs};

/// The subvolume being received, and the directory resolved last (a
/// stream names many entries of one directory in a row).
pub struct Tree {
    root: u64,
    last: Option<(Vec<u8>, u64)>,
}

/// A directory of the subvolume and a name in it.
pub struct At<'p> {
    pub dir: u64,
    pub name: &'p [u8],
}

/// A path as the messages show it.
pub fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// Refuses a path that is absolute, holds a NUL, or has an empty, `.`
/// or `..` component.
pub fn check(path: &[u8]) -> Result<()> {
    if path.first() == Some(&b'/') {
        return Err(Error::Invalid(format!(
            "the stream names an absolute path: {}",
            shown(path)
        )));
    }
    if path.contains(&0) {
        return Err(Error::Invalid(format!(
            "the stream names a path with a NUL byte: {}",
            shown(path)
        )));
    }
    if path
        .split(|&b| b == b'/')
        .any(|part| part.is_empty() || part == b"." || part == b"..")
    {
        return Err(Error::Invalid(format!(
            "the stream names a path outside the subvolume or malformed: {}",
            shown(path)
        )));
    }
    Ok(())
}

impl Tree {
    /// The subvolume whose root directory is node `root`.
    pub fn new(root: u64) -> Tree {
        Tree { root, last: None }
    }

    pub fn root(&self) -> u64 {
        self.root
    }

    /// Forgets the directory resolved last: a rename or removal may change
    /// what its path names.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// The directory holding entry `path` and its last name (the root
    /// itself is no entry).
    pub fn entry<'p>(&mut self, fs: &Fs, path: &'p [u8]) -> Result<At<'p>> {
        if path.is_empty() {
            return Err(Error::Invalid(
                "the stream names the subvolume's root where an entry is needed".into(),
            ));
        }
        check(path)?;
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let dir = match &self.last {
            _ if dir.is_empty() => self.root,
            Some((p, node)) if p == dir => *node,
            _ => {
                let node = self.walk(fs, dir)?;
                self.last = Some((dir.to_vec(), node));
                node
            }
        };
        Ok(At { dir, name })
    }

    /// The node `path` names (the empty path: the root).
    pub fn node(&mut self, fs: &Fs, path: &[u8]) -> Result<u64> {
        self.attr(fs, path).map(|a| a.ino)
    }

    /// The attributes of what `path` names (the empty path: the root).
    pub fn attr(&mut self, fs: &Fs, path: &[u8]) -> Result<Attr> {
        let found = match path.is_empty() {
            true => fs.getattr(self.root),
            false => {
                let at = self.entry(fs, path)?;
                fs.lookup(at.dir, at.name)
            }
        };
        found.map_err(|e| Error::Invalid(format!("looking up {}: {e}", shown(path))))
    }

    /// Walks `dir` (checked, not empty) down from the root, each
    /// component a directory.
    fn walk(&self, fs: &Fs, dir: &[u8]) -> Result<u64> {
        let mut node = self.root;
        for part in dir.split(|&b| b == b'/') {
            let a = fs
                .lookup(node, part)
                .map_err(|e| Error::Invalid(format!("opening directory {}: {e}", shown(dir))))?;
            if !crate::fs::is_dir(a.mode) {
                return Err(Error::Invalid(format!(
                    "opening directory {}: not a directory",
                    shown(dir)
                )));
            }
            node = a.ino;
        }
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn paths_that_leave_the_subvolume_are_refused() {
        for bad in [
            &b"/etc/passwd"[..],
            b"../x",
            b"a/../../x",
            b"a//b",
            b"a/./b",
            b"a/",
            b"a\0b",
        ] {
            assert!(check(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [&b"a"[..], b"a/b/c", b"o257-5-0", b"..a", b"a.."] {
            assert!(check(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
    }
}
