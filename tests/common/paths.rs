//! Files and paths through the Fs API, for tests that work below the mount.

use canopy::fs::{Fs, Owner};

pub const ME: Owner = Owner { uid: 0, gid: 0 };

/// Creates `name` in `parent` holding `data`; returns its node.
pub fn file(fs: &Fs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let a = fs
        .create(parent, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)
        .expect("create");
    fs.write(a.ino, 0, data).expect("write");
    a.ino
}

/// The whole content of the file at `node`.
pub fn read_all(fs: &Fs, node: u64) -> Vec<u8> {
    let size = fs.getattr(node).expect("getattr").size;
    fs.read(node, 0, size as u32).expect("read")
}

/// The node at `path` (slash-separated) from the mount's root.
pub fn at(fs: &Fs, path: &str) -> canopy::Result<u64> {
    let mut node = fs.root_node();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        node = fs.lookup(node, part.as_bytes())?.ino;
    }
    Ok(node)
}
