//! Handles on a cluster, a pool and an image, closed in the right order
//! when dropped, and librados's errors turned into messages that say what
//! to do.

use super::ffi;
use crate::dev::source::RbdSpec;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

/// How long a client waits for a monitor before it gives up: a mount of a
/// cluster that is down fails with a clear error instead of hanging
/// (librados's own default is 300 s).
pub const MOUNT_TIMEOUT_SECS: u32 = 20;

/// A connected client and its I/O context on the image's pool.
pub struct Pool {
    cluster: ffi::RadosT,
    pub(super) io: ffi::IoctxT,
    /// Left open at drop (see [`Image::leave_open`]).
    leave_open: AtomicBool,
}

// SAFETY: librados handles may be used from any thread; librados locks
// internally.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.leave_open.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: both handles came from librados and are released once.
        unsafe {
            if !self.io.is_null() {
                ffi::rados_ioctx_destroy(self.io);
            }
            ffi::rados_shutdown(self.cluster);
        }
    }
}

/// A C string from one of ours (names and paths never hold NUL: the
/// parser refuses them).
pub fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid(format!("{s:?} holds a NUL byte")))
}

/// The error for librados/librbd's return `r` (a negative errno) while
/// doing `what`.
pub fn errno(r: i64, what: impl Into<String>) -> Error {
    let code = i32::try_from(-r).unwrap_or(libc::EIO);
    Error::io(what, std::io::Error::from_raw_os_error(code))
}

impl Pool {
    /// Connects to the cluster `spec` names and opens its pool.
    pub fn connect(spec: &RbdSpec) -> Result<Pool> {
        let id = spec.id.as_deref().map(cstr).transpose()?;
        let mut cluster = ptr::null_mut();
        // SAFETY: out-pointer to a local; id is a valid C string or null.
        let r = unsafe {
            ffi::rados_create(
                &mut cluster,
                id.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            return Err(errno(r.into(), "creating a Ceph client"));
        }
        let mut pool = Pool {
            cluster,
            io: ptr::null_mut(),
            leave_open: AtomicBool::new(false),
        };
        pool.configure(spec)?;
        pool.connect_and_open(spec)?;
        Ok(pool)
    }

    fn set(&self, key: &str, value: &str) -> Result<()> {
        let (k, v) = (cstr(key)?, cstr(value)?);
        // SAFETY: a live handle and valid C strings.
        let r = unsafe { ffi::rados_conf_set(self.cluster, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("setting Ceph option {key}={value}"),
            ));
        }
        Ok(())
    }

    fn configure(&mut self, spec: &RbdSpec) -> Result<()> {
        let conf = spec
            .conf
            .as_ref()
            .map(|p| cstr(&p.display().to_string()))
            .transpose()?;
        // SAFETY: a live handle; conf is a valid C string or null (the
        // default search: $CEPH_CONF, /etc/ceph/ceph.conf, ...).
        let r = unsafe {
            ffi::rados_conf_read_file(
                self.cluster,
                conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            let shown = spec.conf.as_ref().map_or(
                "the default Ceph config ($CEPH_CONF or /etc/ceph/ceph.conf)".into(),
                |p| p.display().to_string(),
            );
            return Err(errno(r.into(), format!("reading {shown}")));
        }
        if let Some(k) = &spec.keyring {
            self.set("keyring", &k.display().to_string())?;
        }
        self.set("client_mount_timeout", &MOUNT_TIMEOUT_SECS.to_string())?;
        self.set("rados_mon_op_timeout", &MOUNT_TIMEOUT_SECS.to_string())?;
        // Canopy buffers and orders its own writes and makes them durable
        // at its barriers; a second write-back cache in librbd would only
        // copy the data once more.
        self.set("rbd_cache", "false")?;
        // With librbd's default (true) requests are handed to its own
        // threads, and two overlapping writes in flight can land in either
        // order, a read sent after a write can see the data before it
        // (measured: up to 11% of pairs). The backend never has
        // overlapping requests in flight (`aio.rs`); this keeps librbd's
        // submission order besides.
        self.set("rbd_non_blocking_aio", "false")?;
        // Every write hands librbd a buffer of its own that lives until the
        // write completes (`aio::Op`), so librbd need not copy it again.
        self.set("rbd_disable_zero_copy_writes", "false")
    }

    fn connect_and_open(&mut self, spec: &RbdSpec) -> Result<()> {
        // SAFETY: a configured handle.
        let r = unsafe { ffi::rados_connect(self.cluster) };
        let who = format!("client.{}", spec.id.as_deref().unwrap_or("admin"));
        match -r {
            0 => {}
            libc::ETIMEDOUT => {
                return Err(Error::io(
                    format!("connecting to the Ceph cluster as {who}: no monitor answered within {MOUNT_TIMEOUT_SECS} s (is the cluster up? mon_host in its config)"),
                    std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
                ))
            }
            libc::EACCES | libc::EPERM | libc::ENOENT | libc::EINVAL => {
                return Err(errno(r.into(), format!("connecting to the Ceph cluster as {who}: its credentials were refused or not found (id=, keyring=)")))
            }
            _ => return Err(errno(r.into(), format!("connecting to the Ceph cluster as {who}"))),
        }
        let name = cstr(&spec.pool)?;
        // SAFETY: a connected handle, a valid name, an out-pointer.
        let r = unsafe { ffi::rados_ioctx_create(self.cluster, name.as_ptr(), &mut self.io) };
        if r < 0 {
            self.io = ptr::null_mut();
            let why = match -r {
                libc::ENOENT => format!("opening pool {}: it does not exist", spec.pool),
                _ => format!("opening pool {}", spec.pool),
            };
            return Err(errno(r.into(), why));
        }
        Ok(())
    }

    /// How many copies of each object the pool `name` keeps (its `size`),
    /// asked of the monitors; None when they do not say (a client whose
    /// caps do not allow `osd pool get`, or an old cluster).
    pub fn replicas(&self, name: &str) -> Option<u64> {
        let cmd = serde_json::json!({
            "prefix": "osd pool get",
            "pool": name,
            "var": "size",
            "format": "json",
        })
        .to_string();
        let cmd = cstr(&cmd).ok()?;
        let mut cmds = [cmd.as_ptr()];
        let (mut out, mut out_len) = (ptr::null_mut(), 0);
        let (mut status, mut status_len) = (ptr::null_mut(), 0);
        // SAFETY: a connected handle, one valid C string, out-pointers to
        // locals; librados allocates both outputs, released below with
        // rados_buffer_free.
        let (r, reply) = unsafe {
            let r = ffi::rados_mon_command(
                self.cluster,
                cmds.as_mut_ptr(),
                1,
                ptr::null(),
                0,
                &mut out,
                &mut out_len,
                &mut status,
                &mut status_len,
            );
            let reply = match out.is_null() {
                true => Vec::new(),
                false => std::slice::from_raw_parts(out.cast::<u8>(), out_len).to_vec(),
            };
            if !out.is_null() {
                ffi::rados_buffer_free(out);
            }
            if !status.is_null() {
                ffi::rados_buffer_free(status);
            }
            (r, reply)
        };
        if r < 0 {
            return None;
        }
        serde_json::from_slice::<serde_json::Value>(&reply)
            .ok()?
            .get("size")?
            .as_u64()
    }

    /// This client's address, as `ceph osd blocklist` and lock owners
    /// show it.
    pub fn addrs(&self) -> String {
        let mut out: *mut libc::c_char = ptr::null_mut();
        // SAFETY: a connected handle and an out-pointer; librados strdup()s
        // the string, so it is released with free().
        unsafe {
            if ffi::rados_getaddrs(self.cluster, &mut out) < 0 || out.is_null() {
                return "?".into();
            }
            let s = std::ffi::CStr::from_ptr(out).to_string_lossy().into_owned();
            libc::free(out.cast());
            s
        }
    }
}

/// An open image; closed before its pool.
pub struct Image {
    pub(super) handle: ffi::ImageT,
    pub(super) pool: Pool,
}

// SAFETY: librbd image handles are made for concurrent use (QEMU issues
// I/O on one from many threads).
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        if self.pool.leave_open.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: a handle from rbd_open, closed once; it releases a lock
        // the image holds.
        unsafe { ffi::rbd_close(self.handle) };
    }
}

impl Image {
    /// Opens `spec`'s image, read-only or for writing.
    /// A snapshot (`spec.snap`) is always opened read-only.
    pub fn open(spec: &RbdSpec, read_only: bool) -> Result<Image> {
        let pool = Pool::connect(spec)?;
        let name = cstr(&spec.image)?;
        let snap = spec.snap.as_deref().map(cstr).transpose()?;
        let snap_ptr = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let mut handle = ptr::null_mut();
        // SAFETY: a live I/O context, valid names (or a null snapshot),
        // an out-pointer.
        let r = unsafe {
            match read_only || snap.is_some() {
                true => ffi::rbd_open_read_only(pool.io, name.as_ptr(), &mut handle, snap_ptr),
                false => ffi::rbd_open(pool.io, name.as_ptr(), &mut handle, snap_ptr),
            }
        };
        if r < 0 {
            let what = match &spec.snap {
                Some(snap) => format!("rbd:{}/{}@{snap}", spec.pool, spec.image),
                None => format!("rbd:{}/{}", spec.pool, spec.image),
            };
            let why = match (-r, &spec.snap) {
                (libc::ENOENT, None) => {
                    format!("opening {what}: no such image (mkfs --size creates it)")
                }
                (libc::ENOENT, Some(_)) => format!(
                    "opening {what}: no such image or snapshot (rbd snap ls {}/{} lists them)",
                    spec.pool, spec.image
                ),
                _ => format!("opening {what}"),
            };
            return Err(errno(r.into(), why));
        }
        Ok(Image { handle, pool })
    }

    /// Keeps the image and its client open when dropped: librbd holds a
    /// request that will never end (this client lost the exclusive lock
    /// it was queued behind), and closing either waits for it. The
    /// process that leaves them is shutting its filesystem down.
    pub fn leave_open(&self) {
        self.pool.leave_open.store(true, Ordering::Relaxed);
    }

    /// Whether librbd says this client holds the exclusive lock.
    pub fn holds_lock(&self) -> bool {
        let mut owner = 0;
        // SAFETY: a live handle and an out-pointer.
        let r = unsafe { ffi::rbd_is_exclusive_lock_owner(self.handle, &mut owner) };
        r >= 0 && owner != 0
    }

    pub fn size(&self) -> Result<u64> {
        let mut size = 0u64;
        // SAFETY: a live handle and an out-pointer.
        let r = unsafe { ffi::rbd_get_size(self.handle, &mut size) };
        if r < 0 {
            return Err(errno(r.into(), "asking the image's size"));
        }
        Ok(size)
    }

    /// The bytes one whole object takes, where the image keeps its bytes
    /// in order, object after object (no fancy striping); 0 otherwise.
    pub fn object_bytes(&self) -> Result<u64> {
        let (mut unit, mut count) = (0u64, 0u64);
        // SAFETY: a live handle and out-pointers.
        let r = unsafe { ffi::rbd_get_stripe_unit(self.handle, &mut unit) };
        if r < 0 {
            return Err(errno(r.into(), "asking the image's stripe unit"));
        }
        // SAFETY: as above.
        let r = unsafe { ffi::rbd_get_stripe_count(self.handle, &mut count) };
        if r < 0 {
            return Err(errno(r.into(), "asking the image's stripe count"));
        }
        Ok(if count == 1 { unit } else { 0 })
    }

    pub fn features(&self) -> Result<u64> {
        let mut f = 0u64;
        // SAFETY: a live handle and an out-pointer.
        let r = unsafe { ffi::rbd_get_features(self.handle, &mut f) };
        if r < 0 {
            return Err(errno(r.into(), "asking the image's features"));
        }
        Ok(f)
    }
}

/// Creates `spec`'s image of `size` bytes with the cluster's default
/// format and features (format 2, exclusive-lock among them). Returns
/// false when it exists already.
pub fn create(spec: &RbdSpec, size: u64) -> Result<bool> {
    let pool = Pool::connect(spec)?;
    let name = cstr(&spec.image)?;
    let mut order = 0;
    // SAFETY: a live I/O context, a valid name, an out-pointer for the
    // object size (0: the default).
    let r = unsafe { ffi::rbd_create(pool.io, name.as_ptr(), size, &mut order) };
    match -r {
        0 => Ok(true),
        libc::EEXIST => Ok(false),
        _ => Err(errno(r.into(), format!("creating {spec}"))),
    }
}

/// Removes `spec`'s image.
pub fn remove(spec: &RbdSpec) -> Result<()> {
    let pool = Pool::connect(spec)?;
    let name = cstr(&spec.image)?;
    // SAFETY: a live I/O context and a valid name.
    let r = unsafe { ffi::rbd_remove(pool.io, name.as_ptr()) };
    if r < 0 {
        return Err(errno(r.into(), format!("removing {spec}")));
    }
    Ok(())
}
