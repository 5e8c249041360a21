//! Reading and setting one extended attribute of a path (how `canopy
//! property` reaches the `compression` property: the daemon checks the
//! value).

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).context("path with a NUL byte")
}

/// The attribute's value, or None when the file has none.
pub fn get(path: &Path, name: &str) -> Result<Option<String>> {
    let (p, n) = (c_path(path)?, CString::new(name)?);
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) {
            return Ok(None);
        }
        bail!("reading {name} of {}: {e}", path.display());
    }
    buf.truncate(got as usize);
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// Sets the attribute; an empty value removes it where the filesystem
/// takes it so (Canopy's and btrfs's compression property).
pub fn set(path: &Path, name: &str, value: &str) -> Result<()> {
    let (p, n) = (c_path(path)?, CString::new(name)?);
    // SAFETY: valid NUL-terminated strings and a value of the length given.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            bail!("'{value}' is not a compression (zstd, zstd:LEVEL, lz4, none or \"\")");
        }
        bail!("{e}");
    }
    Ok(())
}
