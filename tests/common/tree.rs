//! A directory tree as a comparable value: every entry's type, mode,
//! owner, size, modification time, contents (or link target, or device),
//! data ranges (where the holes are), xattrs and hard-link group, by path.
//! Two trees that compare equal hold the same files in every way a
//! receive must carry over (access and change times aside: reading
//! changes the first, and no one can set the second).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    /// A hash of the contents, the link target, or the device number.
    pub body: String,
    /// Data ranges (SEEK_DATA / SEEK_HOLE), for regular files.
    pub data: Vec<(u64, u64)>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Every path naming the same inode, for hard links.
    pub links: Vec<String>,
}

/// Options of a comparison.
#[derive(Clone, Copy, Default)]
pub struct Compare {
    /// Leave out where the holes are (streams of version 1 write zeros
    /// into holes an incremental send punches; btrfs rounds differently).
    pub ignore_holes: bool,
}

pub fn snapshot_of(root: &Path, how: Compare) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    walk(root, root, &mut out, &mut inodes, how);
    for paths in inodes.values() {
        for p in paths {
            if let Some(e) = out.get_mut(p) {
                e.links = paths.clone();
            }
        }
    }
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, Entry>,
    inodes: &mut BTreeMap<u64, Vec<String>>,
    how: Compare,
) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names {
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let (kind, body) = if ft.is_dir() {
            ("dir", String::new())
        } else if ft.is_symlink() {
            let t = std::fs::read_link(&p).unwrap();
            ("symlink", t.to_string_lossy().into_owned())
        } else if ft.is_file() {
            ("file", hash(&std::fs::read(&p).unwrap()))
        } else if ft.is_fifo() {
            ("fifo", String::new())
        } else if ft.is_socket() {
            ("socket", String::new())
        } else {
            ("device", format!("{:x}", m.rdev()))
        };
        if !ft.is_dir() {
            inodes.entry(m.ino()).or_default().push(rel.clone());
        }
        let data = match ft.is_file() && !how.ignore_holes {
            true => data_ranges(&p, m.size()),
            false => Vec::new(),
        };
        out.insert(
            rel,
            Entry {
                kind,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: if ft.is_dir() { 0 } else { m.size() },
                mtime: (m.mtime(), m.mtime_nsec()),
                body,
                data,
                xattrs: xattrs(&p),
                links: Vec::new(),
            },
        );
        if ft.is_dir() {
            walk(root, &p, out, inodes, how);
        }
    }
}

fn hash(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for &x in b {
        h = (h ^ u64::from(x)).wrapping_mul(0x100000001b3);
    }
    format!("{:016x}:{}", h, b.len())
}

fn data_ranges(p: &Path, size: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    let mut out = Vec::new();
    let mut pos = 0i64;
    while (pos as u64) < size {
        // SAFETY: a descriptor we hold.
        let start = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if start < 0 {
            break;
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(f.as_raw_fd(), start, libc::SEEK_HOLE) };
        // By whole sectors: small data may be kept inline (SEEK_HOLE then
        // says where the bytes end) or in a block, the same file either way.
        let (a, b) = (
            start as u64 / 4096 * 4096,
            (end as u64).next_multiple_of(4096),
        );
        match out.last_mut() {
            Some((_, e)) if *e >= a => *e = b,
            _ => out.push((a, b)),
        }
        pos = end;
    }
    out
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: valid path and buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: valid strings and buffer.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if len >= 0 {
            v.truncate(len as usize);
            out.push((name.to_vec(), v));
        }
    }
    out.sort();
    out
}

/// Panics with the first difference between the trees at `a` and `b`;
/// returns how many entries they hold.
pub fn assert_same(a: &Path, b: &Path, how: Compare) -> usize {
    let (x, y) = (snapshot_of(a, how), snapshot_of(b, how));
    for (k, v) in &x {
        match y.get(k) {
            None => panic!("{k} is in {} but not in {}", a.display(), b.display()),
            Some(w) => assert_eq!(
                v,
                w,
                "{k} differs between {} and {}",
                a.display(),
                b.display()
            ),
        }
    }
    for k in y.keys() {
        assert!(
            x.contains_key(k),
            "{k} is in {} but not in {}",
            b.display(),
            a.display()
        );
    }
    x.len()
}
