//! One writer across hosts: RBD's exclusive lock, taken explicitly.
//!
//! A client that only writes takes the image's lock implicitly and hands
//! it to the next client that asks: two mounts would take turns writing
//! over each other. A client that called `rbd_lock_acquire` keeps the
//! lock: another's acquire and writes fail with EROFS. Taking it over
//! (`--break-lock`, `-o takeover`) breaks the lock, and librbd blocklists
//! the holder's address as it does (`rbd_blocklist_on_break_lock`, on by
//! default), so a holder that was only paused can never write again.

use super::cluster::{errno, Image};
use super::ffi;
use crate::dev::source::RbdSpec;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// How long to wait for a holder that is going away: `umount` returns
/// before the daemon has written its last commit and closed the image,
/// and a mount right after should wait for that rather than fail (as
/// image files do, `dev::exclusive`).
const LOCK_GRACE: Duration = Duration::from_secs(5);

/// The current holders of the exclusive lock (librbd's owner strings).
pub fn owners(image: &Image) -> Result<Vec<String>> {
    let mut mode = 0;
    let mut slots: Vec<*mut libc::c_char> = vec![std::ptr::null_mut(); 8];
    let mut n = slots.len();
    // SAFETY: a live handle; `slots` has room for `n` owner pointers,
    // which librbd allocates and rbd_lock_get_owners_cleanup frees.
    let r =
        unsafe { ffi::rbd_lock_get_owners(image.handle, &mut mode, slots.as_mut_ptr(), &mut n) };
    match -r {
        0 => {}
        libc::ENOENT => return Ok(Vec::new()),
        _ => return Err(errno(r.into(), "asking who holds the image's lock")),
    }
    let names = slots[..n]
        .iter()
        .filter(|p| !p.is_null())
        // SAFETY: NUL-terminated strings from librbd, read before cleanup.
        .map(|&p| {
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    // SAFETY: frees exactly what rbd_lock_get_owners returned.
    unsafe { ffi::rbd_lock_get_owners_cleanup(slots.as_mut_ptr(), n) };
    Ok(names)
}

fn try_acquire(image: &Image) -> i32 {
    // SAFETY: a live handle.
    unsafe { ffi::rbd_lock_acquire(image.handle, ffi::LOCK_MODE_EXCLUSIVE) }
}

/// Refuses an image without the exclusive-lock feature: nothing would keep
/// a second writer out.
fn require_feature(image: &Image, spec: &RbdSpec) -> Result<()> {
    if image.features()? & ffi::FEATURE_EXCLUSIVE_LOCK == 0 {
        return Err(Error::Invalid(format!(
            "{spec} lacks the exclusive-lock feature, so nothing keeps a second writer out; \
             enable it with `rbd feature enable {}/{} exclusive-lock`",
            spec.pool, spec.image
        )));
    }
    Ok(())
}

/// Takes the exclusive lock for a writer; with `takeover`, from whoever
/// holds it. A takeover breaks the holders' locks before it asks: an
/// acquire first asks the holder to hand the lock over, and a holder that
/// is paused or cut off never answers, so the request would wait out
/// librbd's 30 s request timeout.
pub fn acquire(image: &Image, spec: &RbdSpec, takeover: bool) -> Result<()> {
    require_feature(image, spec)?;
    let deadline = Instant::now() + LOCK_GRACE;
    loop {
        if takeover {
            break_holders(image, spec)?;
        }
        let r = try_acquire(image);
        if r == 0 {
            return confirm(image, spec);
        }
        if r != -libc::EROFS && r != -libc::EBUSY {
            return Err(errno(
                r.into(),
                format!("taking the exclusive lock of {spec}"),
            ));
        }
        if Instant::now() >= deadline {
            return Err(in_use(image, spec));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Checks the lock is ours after an acquire said so.
fn confirm(image: &Image, spec: &RbdSpec) -> Result<()> {
    if !image.holds_lock() {
        return Err(Error::Invalid(format!(
            "{spec}: the exclusive lock was granted and then lost; another writer took it"
        )));
    }
    tracing::info!(image = %spec, client = %image.pool.addrs(), "holding the exclusive lock");
    Ok(())
}

fn in_use(image: &Image, spec: &RbdSpec) -> Error {
    let holders = owners(image).unwrap_or_default();
    let who = match holders.is_empty() {
        true => "another client".to_string(),
        false => format!("lock owner {}", holders.join(", ")),
    };
    Error::Invalid(format!(
        "{spec} is in use by another writer ({who}; `rbd status {}/{}` shows its address); \
         if that host is gone, mount with --break-lock (-o takeover) to fence it and take over",
        spec.pool, spec.image
    ))
}

/// Breaks every holder's lock; librbd blocklists each as it does.
fn break_holders(image: &Image, spec: &RbdSpec) -> Result<()> {
    for owner in owners(image)? {
        tracing::warn!(image = %spec, %owner, "taking over: breaking the lock and blocklisting its holder");
        let c = super::cluster::cstr(&owner)?;
        // SAFETY: a live handle and a valid C string.
        let r = unsafe { ffi::rbd_lock_break(image.handle, ffi::LOCK_MODE_EXCLUSIVE, c.as_ptr()) };
        if r < 0 && r != -libc::ENOENT {
            return Err(errno(
                r.into(),
                format!("breaking {owner}'s lock on {spec}"),
            ));
        }
    }
    Ok(())
}

/// Refuses a read-only user while a writer holds the image: what it read
/// would change under it. librbd answers who holds the lock only on a
/// handle opened for writing, so this asks on one of its own, which never
/// writes and so never takes the lock.
pub fn refuse_if_written(spec: &RbdSpec) -> Result<()> {
    let image = Image::open(spec, false)?;
    match owners(&image)?.as_slice() {
        [] => Ok(()),
        holders => Err(Error::Invalid(format!(
            "{spec} is mounted read-write elsewhere (lock owner {}); a read-only mount would see it change",
            holders.join(", ")
        ))),
    }
}
