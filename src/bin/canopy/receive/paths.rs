//! Paths from a stream, resolved so that nothing outside the subvolume
//! being received is ever touched: a path must be relative and have no
//! `.` or `..` component, and its directories are opened beneath the
//! subvolume's root without following any symlink (openat2 with
//! RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS); the last name is then used
//! with the *at calls, never followed either.

use anyhow::{bail, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A directory beneath the root and a name in it.
pub struct At {
    pub dir: std::rc::Rc<OwnedFd>,
    pub name: CString,
}

impl At {
    pub fn fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }
}

/// The subvolume being received, and its directories opened lately.
pub struct Tree {
    root: std::rc::Rc<OwnedFd>,
    cache: Option<(Vec<u8>, std::rc::Rc<OwnedFd>)>,
}

fn check(path: &[u8]) -> Result<()> {
    let shown = String::from_utf8_lossy(path);
    if path.first() == Some(&b'/') {
        bail!("the stream names an absolute path: {shown}");
    }
    if path.contains(&0) {
        bail!("the stream names a path with a NUL byte: {shown}");
    }
    for part in path.split(|&b| b == b'/') {
        if part.is_empty() || part == b"." || part == b".." {
            bail!("the stream names a path outside the subvolume or malformed: {shown}");
        }
    }
    Ok(())
}

/// Opens `rel` (non-empty, checked) as a directory beneath `root`.
fn open_beneath(root: RawFd, rel: &[u8]) -> Result<OwnedFd> {
    let c = CString::new(rel)?;
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid path and open_how for the call's duration.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        bail!("opening directory {}: {e}", String::from_utf8_lossy(rel));
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

impl Tree {
    pub fn new(root: OwnedFd) -> Tree {
        Tree {
            root: std::rc::Rc::new(root),
            cache: None,
        }
    }

    pub fn root_fd(&self) -> RawFd {
        self.root.as_raw_fd()
    }

    /// Forgets opened directories: a rename or removal may change what a
    /// path names.
    pub fn forget(&mut self) {
        self.cache = None;
    }

    /// The directory and last name of `path`; the empty path is the root
    /// itself (as "." in it).
    pub fn at(&mut self, path: &[u8]) -> Result<At> {
        if path.is_empty() {
            return Ok(At {
                dir: self.root.clone(),
                name: CString::new(".")?,
            });
        }
        check(path)?;
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let dir = match (&self.cache, dir.is_empty()) {
            (_, true) => self.root.clone(),
            (Some((p, fd)), _) if p == dir => fd.clone(),
            _ => {
                let fd = std::rc::Rc::new(open_beneath(self.root.as_raw_fd(), dir)?);
                self.cache = Some((dir.to_vec(), fd.clone()));
                fd
            }
        };
        Ok(At {
            dir,
            name: CString::new(name)?,
        })
    }

    /// A name that must be a new entry (not the root).
    pub fn new_entry(&mut self, path: &[u8]) -> Result<At> {
        if path.is_empty() {
            bail!("the stream names the subvolume's root where a new entry is needed");
        }
        self.at(path)
    }
}

/// Opens `path` beneath `root` as a file, never following a symlink.
pub fn open_file(t: &mut Tree, path: &[u8], flags: i32) -> Result<OwnedFd> {
    let at = t.new_entry(path)?;
    // SAFETY: valid directory descriptor and name.
    let fd = unsafe {
        libc::openat(
            at.fd(),
            at.name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        bail!("opening {}: {e}", String::from_utf8_lossy(path));
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `rel` beneath directory `root` as a regular file to read (for a
/// clone's source), refusing anything else.
pub fn open_source(root: RawFd, rel: &[u8]) -> Result<OwnedFd> {
    let mut t = Tree {
        root: std::rc::Rc::new(dup(root)?),
        cache: None,
    };
    open_file(&mut t, rel, libc::O_RDONLY)
}

fn dup(fd: RawFd) -> Result<OwnedFd> {
    // SAFETY: duplicating a descriptor we hold.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        bail!("dup: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
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
        ] {
            assert!(check(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [&b"a"[..], b"a/b/c", b"o257-5-0", b"..a", b"a.."] {
            assert!(check(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
    }
}
