//! The mount's place in the kernel's writeback: its backing device (bdi)
//! limits and the global dirty limit, after seed mail 001.
//!
//! The kernel gives every FUSE mount a backing device with `strict_limit`
//! set and `max_ratio` at 1%: its dirty and writeback pages may take at
//! most 1% of the global dirty limit, even when nothing else is dirty,
//! because an unprivileged daemon could otherwise hold the whole limit in
//! writeback that never ends. Under `-o writeback_cache` (the kernel
//! buffers writes) that is the mail's collapse: at `vm.dirty_bytes=1M`
//! the mount may hold 10 KB, and writes crawl at 1 MB/s. A daemon run
//! by root is as trusted as a kernel filesystem, so at mount time it
//! gives its own device what a kernel filesystem's has: no strict limit
//! and a share of up to 100% of the global limit, which the kernel still
//! enforces for all devices together. Nothing global (`vm.*`) is changed.
//!
//! The daemon itself writes its image through the page cache of another
//! device, and the kernel counts the mount's own dirty and writeback
//! pages against the same global limit. Once they fill it, the daemon's
//! writes to its image wait in the kernel's throttle for pages that only
//! the daemon can clean: at `vm.dirty_bytes=1M` ten writers moved 43 MB
//! in 17 minutes. So the daemon declares itself an I/O flusher
//! (`PR_SET_IO_FLUSHER`, as loop devices and FUSE servers may): the
//! kernel then throttles its writes only against its image's device,
//! and its allocations never wait on reclaim writing back the mount.
//! That needs CAP_SYS_RESOURCE, which containers often drop; a mount
//! under `writeback_cache` without it writes its image with O_DIRECT
//! (`dev::file`), which the dirty throttle never sees.
//!
//! Canopy's own buffer (`dirty_limit=`, see `fs::writeback`) follows the
//! global limit in the same spirit unless a mount sets it: it never holds
//! more unflushed data than the kernel would let a kernel filesystem hold.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// What decides how much written data the mount may hold before writers
/// wait (`canopy filesystem usage`). Sizes are bytes; `None` where the
/// kernel does not say (an older kernel, or no sysfs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritebackLimits {
    /// Whether the kernel buffers writes (`-o writeback_cache` agreed).
    pub writeback_cache: bool,
    /// The kernel's global dirty limit (`vm.dirty_bytes`, or
    /// `vm.dirty_ratio` of available memory).
    pub global_dirty_limit: Option<u64>,
    /// The backing device, as /sys/class/bdi names it (`0:NN`).
    pub bdi: Option<String>,
    /// The device may never pass its own share of the global limit.
    pub strict_limit: Option<bool>,
    /// Its largest share of the global limit, in percent.
    pub max_ratio: Option<u64>,
    pub max_bytes: Option<u64>,
    pub read_ahead_kb: Option<u64>,
    /// FUSE requests in the background (writeback, read-ahead) at once,
    /// and the number past which the device counts as congested.
    pub max_background: Option<u64>,
    pub congestion_threshold: Option<u64>,
    /// Canopy's own buffer of written data before it flushes.
    pub canopy_dirty_limit: u64,
    /// Whether that buffer follows the global limit (no `dirty_limit=`).
    pub canopy_dirty_limit_follows_global: bool,
}

/// What the daemon's parts learn about the mount's kernel side at
/// different times: the session whether the kernel agreed to buffer
/// writes, the mount which device it got; the control socket reports it.
#[derive(Debug, Default)]
pub struct KernelSide {
    pub writeback_cache: std::sync::atomic::AtomicBool,
    pub bdi: std::sync::OnceLock<String>,
    /// No `dirty_limit=`: Canopy's buffer follows the global limit.
    pub buffer_follows_global: bool,
    /// What INIT asked for (reported when fusectl is not mounted).
    pub max_background: u16,
}

impl KernelSide {
    /// What is in effect now, with Canopy's buffer at `canopy_dirty_limit`.
    pub fn limits(&self, canopy_dirty_limit: u64) -> WritebackLimits {
        let wbc = self
            .writeback_cache
            .load(std::sync::atomic::Ordering::Relaxed);
        let read = read(self.bdi.get().map(String::as_str), wbc, canopy_dirty_limit);
        let asked = u64::from(self.max_background);
        let congestion = u64::from(congestion_threshold(self.max_background));
        WritebackLimits {
            canopy_dirty_limit_follows_global: self.buffer_follows_global,
            max_background: read.max_background.or(Some(asked)),
            congestion_threshold: read.congestion_threshold.or(Some(congestion)),
            ..read
        }
    }
}

/// Canopy's own buffer when the global limit is larger (or unknown).
pub const BUFFER_CAP: u64 = crate::fs::writeback::DEFAULT_DIRTY_LIMIT;

/// Gives the mount's backing device `dev` the limits a kernel
/// filesystem's has (see the module comment): no strict limit, up to
/// the whole global limit. Needs root; logs and keeps the kernel's
/// defaults otherwise.
pub fn follow_global_limit(dev: &str) {
    for (knob, value) in [("strict_limit", "0"), ("max_ratio", "100")] {
        let path = format!("/sys/class/bdi/{dev}/{knob}");
        if read_number(&path) == value.parse().ok() {
            continue;
        }
        if let Err(e) = std::fs::write(&path, value) {
            tracing::warn!(error = %e, %path, "could not lift the kernel's per-mount dirty limit; writes under writeback_cache may crawl at a small vm.dirty_bytes");
        }
    }
}

/// `prctl` option of Linux 5.6 (not in every libc binding).
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// Marks the daemon (every thread it starts after this) as an I/O
/// flusher (see the module comment). Needs CAP_SYS_RESOURCE; without it
/// the kernel's default holds (returns false), and a mount under
/// `writeback_cache` then writes its image direct instead.
pub fn become_io_flusher() -> bool {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        tracing::debug!(error = %e, "not an I/O flusher (needs CAP_SYS_RESOURCE)");
    }
    r == 0
}

/// Sets the device's read-ahead (bytes, rounded down to KiB) when it
/// differs. The kernel caps what a FUSE daemon may ask for at INIT at
/// its 128 KiB default, so this goes through sysfs.
pub fn set_readahead(dev: &str, bytes: u64) {
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    let want = bytes / 1024;
    if read_number(&path) == Some(want) {
        return;
    }
    if let Err(e) = std::fs::write(&path, want.to_string()) {
        tracing::warn!(error = %e, %path, "could not raise read-ahead");
    }
}

/// Three quarters of `max_background`, as libfuse sets it.
pub fn congestion_threshold(max_background: u16) -> u16 {
    (u32::from(max_background) * 3 / 4).max(1) as u16
}

/// Reads what is in effect for device `dev` (None: the mount's device is
/// unknown).
pub fn read(dev: Option<&str>, writeback_cache: bool, canopy_dirty_limit: u64) -> WritebackLimits {
    let bdi = |knob: &str| dev.and_then(|d| read_number(&format!("/sys/class/bdi/{d}/{knob}")));
    let fusectl = |knob: &str| {
        let dir = dev.and_then(connection_dir)?;
        read_number(&dir.join(knob).to_string_lossy())
    };
    WritebackLimits {
        writeback_cache,
        global_dirty_limit: global_dirty_limit(),
        bdi: dev.map(str::to_string),
        strict_limit: bdi("strict_limit").map(|v| v != 0),
        max_ratio: bdi("max_ratio"),
        max_bytes: bdi("max_bytes"),
        read_ahead_kb: bdi("read_ahead_kb"),
        max_background: fusectl("max_background"),
        congestion_threshold: fusectl("congestion_threshold"),
        canopy_dirty_limit,
        canopy_dirty_limit_follows_global: false,
    }
}

/// The kernel's global dirty limit in bytes: `vm.dirty_bytes` when set,
/// else `vm.dirty_ratio` percent of available memory (close to the
/// kernel's own "dirtyable memory").
pub fn global_dirty_limit() -> Option<u64> {
    let bytes = read_number("/proc/sys/vm/dirty_bytes")?;
    if bytes > 0 {
        return Some(bytes);
    }
    let ratio = read_number("/proc/sys/vm/dirty_ratio")?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(available_kb * 1024 / 100 * ratio)
}

/// Canopy's own buffer when no `dirty_limit=` is given: the global dirty
/// limit, at most [`BUFFER_CAP`], at least 1 MiB (one write request).
pub fn buffer_following_global() -> u64 {
    global_dirty_limit().map_or(BUFFER_CAP, |g| g.clamp(1 << 20, BUFFER_CAP))
}

/// The fusectl directory of the connection on device `dev` (`0:NN`: the
/// connection is named after the minor number).
fn connection_dir(dev: &str) -> Option<std::path::PathBuf> {
    let minor = dev.split(':').nth(1)?;
    let dir = Path::new("/sys/fs/fuse/connections").join(minor);
    dir.is_dir().then_some(dir)
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn congestion_is_three_quarters_and_never_zero() {
        assert_eq!(congestion_threshold(16), 12);
        assert_eq!(congestion_threshold(64), 48);
        assert_eq!(congestion_threshold(1), 1);
    }

    #[test]
    fn the_buffer_stays_between_one_request_and_the_cap() {
        let b = buffer_following_global();
        assert!((1 << 20..=BUFFER_CAP).contains(&b), "{b}");
    }
}
