//! What a command names as its device: an image file or block device by
//! path, or an RBD image as `rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=CLIENT&keyring=PATH]`
//! (a snapshot, `@SNAP`, is opened read-only).
//!
//! Every command that takes an image (mkfs, mount, check, scrub, inspect,
//! rescue, fstab through the mount helper) parses it here and opens it
//! with [`Source::open`], so the two kinds of storage behave alike: one
//! writer, readers that a writer excludes, tools that only look.

use super::exclusive::Access;
use super::{Device, FileDevice};
use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

const RBD_PREFIX: &str = "rbd:";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An image file or block device.
    Path(PathBuf),
    /// An image on a Ceph cluster, reached through librbd.
    Rbd(RbdSpec),
}

/// An RBD image and how to reach its cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// A snapshot of the image (`@SNAP`): it never changes, so any number
    /// of hosts read it while a writer goes on with the image.
    pub snap: Option<String>,
    /// ceph.conf to read; librados's default search (`$CEPH_CONF`,
    /// /etc/ceph/ceph.conf, ...) when absent.
    pub conf: Option<PathBuf>,
    /// Client id without `client.` (`admin` when absent).
    pub id: Option<String>,
    /// Keyring file, when the conf does not name it.
    pub keyring: Option<PathBuf>,
}

/// How a device is opened beyond its access mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenHow {
    /// Take the storage from a writer that holds it (RBD: break its lock
    /// and blocklist it, for failover). Image files are never taken over.
    pub takeover: bool,
}

impl FromStr for Source {
    type Err = Error;

    fn from_str(s: &str) -> Result<Source> {
        match s.strip_prefix(RBD_PREFIX) {
            Some(rest) => Ok(Source::Rbd(RbdSpec::parse(rest)?)),
            None if s.is_empty() => Err(Error::Invalid("an empty image name".into())),
            None => Ok(Source::Path(PathBuf::from(s))),
        }
    }
}

impl Source {
    /// The device a command-line argument names: `rbd:...` (which must be
    /// UTF-8) or a path, which may be any bytes.
    pub fn from_arg(arg: &std::ffi::OsStr) -> Result<Source> {
        use std::os::unix::ffi::OsStrExt;
        if !arg.as_bytes().starts_with(RBD_PREFIX.as_bytes()) {
            return match arg.is_empty() {
                true => Err(Error::Invalid("an empty image name".into())),
                false => Ok(Source::Path(PathBuf::from(arg))),
            };
        }
        arg.to_str()
            .ok_or_else(|| Error::Invalid(format!("{}: not UTF-8", arg.to_string_lossy())))?
            .parse()
    }
}

impl RbdSpec {
    /// Parses what follows `rbd:`.
    fn parse(rest: &str) -> Result<RbdSpec> {
        let bad = |why: &str| {
            Error::Invalid(format!(
                "rbd:{rest}: {why} (expected rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=CLIENT&keyring=PATH])"
            ))
        };
        let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (pool, image) = name.split_once('/').ok_or_else(|| bad("no pool"))?;
        let (image, snap) = match image.split_once('@') {
            Some((image, snap)) => (image, Some(snap)),
            None => (image, None),
        };
        let ok = |s: &str| !s.is_empty() && !s.contains(['/', '@', '\0']);
        if !ok(pool) || !ok(image) || snap.is_some_and(|s| !ok(s)) {
            return Err(bad(
                "the pool, the image and a snapshot must be non-empty names",
            ));
        }
        let mut spec = RbdSpec {
            pool: pool.into(),
            image: image.into(),
            snap: snap.map(String::from),
            ..RbdSpec::default()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad("a parameter without ="))?;
            if v.is_empty() || v.contains('\0') {
                return Err(bad("an empty parameter"));
            }
            match k {
                "conf" => spec.conf = Some(v.into()),
                "id" => spec.id = Some(v.strip_prefix("client.").unwrap_or(v).into()),
                "keyring" => spec.keyring = Some(v.into()),
                _ => return Err(bad(&format!("unknown parameter {k}"))),
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Path(p) => write!(f, "{}", p.display()),
            Source::Rbd(r) => write!(f, "{r}"),
        }
    }
}

impl fmt::Display for RbdSpec {
    /// The full name, parameters included, so that it can be given again
    /// (the daemon is started with it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{RBD_PREFIX}{}/{}", self.pool, self.image)?;
        if let Some(snap) = &self.snap {
            write!(f, "@{snap}")?;
        }
        let params = [
            ("conf", self.conf.as_ref().map(|p| p.display().to_string())),
            ("id", self.id.clone()),
            (
                "keyring",
                self.keyring.as_ref().map(|p| p.display().to_string()),
            ),
        ];
        let mut sep = '?';
        for (k, v) in params {
            if let Some(v) = v {
                write!(f, "{sep}{k}={v}")?;
                sep = '&';
            }
        }
        Ok(())
    }
}

impl Source {
    /// The argument that names it again, byte for byte (a path need not
    /// be UTF-8).
    pub fn to_arg(&self) -> std::ffi::OsString {
        match self {
            Source::Path(p) => p.as_os_str().to_owned(),
            Source::Rbd(r) => r.to_string().into(),
        }
    }

    /// Whether it names an RBD snapshot, which only reads.
    pub fn is_snapshot(&self) -> bool {
        matches!(self, Source::Rbd(r) if r.snap.is_some())
    }

    /// The path, for a source that is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Source::Path(p) => Some(p),
            Source::Rbd(_) => None,
        }
    }

    /// Whether the storage exists (an RBD image is looked up on open).
    pub fn exists(&self) -> bool {
        match self {
            Source::Path(p) => p.exists(),
            Source::Rbd(_) => true,
        }
    }

    /// Opens the storage for `access`, claiming it as that access needs.
    pub fn open(&self, access: Access, how: OpenHow) -> Result<Box<dyn Device>> {
        match self {
            Source::Path(p) => Ok(Box::new(FileDevice::open_as(p, access)?)),
            Source::Rbd(spec) => open_rbd(spec, access, how),
        }
    }

    /// Creates the storage with at least `size` bytes where it is missing
    /// (a sparse file, or an RBD image); an existing one is grown only if
    /// it is a regular file. Returns whether it was created.
    pub fn create(&self, size: u64) -> Result<bool> {
        match self {
            Source::Path(p) => {
                let existed = p.exists();
                FileDevice::create_image(p, size)?;
                Ok(!existed)
            }
            Source::Rbd(spec) => create_rbd(spec, size),
        }
    }

    /// Removes storage this run created (mkfs failed).
    pub fn remove_created(&self) {
        match self {
            Source::Path(p) => {
                let _ = std::fs::remove_file(p);
            }
            Source::Rbd(spec) => remove_rbd(spec),
        }
    }
}

#[cfg(canopy_rbd)]
fn open_rbd(spec: &RbdSpec, access: Access, how: OpenHow) -> Result<Box<dyn Device>> {
    Ok(Box::new(super::rbd::RbdDevice::open(spec, access, how)?))
}

#[cfg(canopy_rbd)]
fn create_rbd(spec: &RbdSpec, size: u64) -> Result<bool> {
    super::rbd::create_image(spec, size)
}

#[cfg(canopy_rbd)]
fn remove_rbd(spec: &RbdSpec) {
    super::rbd::remove_created_image(spec)
}

#[cfg(not(canopy_rbd))]
fn no_rbd(spec: &RbdSpec) -> Error {
    Error::Invalid(format!(
        "{spec}: this canopy was built without the RBD backend (it needs librbd-dev and librados-dev at build time)"
    ))
}

#[cfg(not(canopy_rbd))]
fn open_rbd(spec: &RbdSpec, _: Access, _: OpenHow) -> Result<Box<dyn Device>> {
    Err(no_rbd(spec))
}

#[cfg(not(canopy_rbd))]
fn create_rbd(spec: &RbdSpec, _: u64) -> Result<bool> {
    Err(no_rbd(spec))
}

#[cfg(not(canopy_rbd))]
fn remove_rbd(_: &RbdSpec) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for s in [
            "rbd:rbd/fs",
            "rbd:pool/img?conf=/etc/ceph/x.conf",
            "rbd:p/i?conf=/c&id=a&keyring=/k",
            "rbd:p/i@monday",
            "rbd:p/i@s1?conf=/c",
        ] {
            let src: Source = s.parse().unwrap();
            assert_eq!(src.to_string(), s);
        }
        let Source::Rbd(r) = "rbd:p/i?id=client.b".parse().unwrap() else {
            panic!("not rbd")
        };
        assert_eq!(r.id.as_deref(), Some("b"));
        assert_eq!(
            "./rbd:x".parse::<Source>().unwrap(),
            Source::Path("./rbd:x".into())
        );
    }

    #[test]
    fn bad_names_say_what_is_expected() {
        for s in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:pool/",
            "rbd:p/i/j",
            "rbd:p/i?x=1",
            "rbd:p/i?conf",
            "rbd:p/i?conf=",
            "rbd:p/i@",
            "rbd:p/@s",
            "rbd:p/i@s@t",
            "",
        ] {
            let e = s.parse::<Source>().unwrap_err().to_string();
            assert!(!e.is_empty(), "{s}");
        }
    }
}
