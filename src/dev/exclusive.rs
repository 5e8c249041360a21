//! One writer per piece of storage, whatever path names it.
//!
//! Storage is identified by the inode that holds it, (st_dev, st_ino), not
//! by the path given: an image file can also be reached as a loop device,
//! and a second writer through the other name would silently destroy what
//! the first one committed. So:
//!
//! - an image file is locked with flock(2) (exclusive for a writer, shared
//!   for a read-only mount), and a writer also refuses it while a loop
//!   device backed by the same inode is held exclusively (mounted by the
//!   kernel, or opened by another writer);
//! - a block device is opened with O_EXCL by a writer (the kernel's own
//!   "one exclusive opener" rule, which mounts also obey);
//! - a loop device is resolved to its backing file (sysfs names it, the
//!   LOOP_GET_STATUS64 ioctl proves it is the same inode) and that file is
//!   locked exactly as if it had been given, so a Canopy on the file and a
//!   Canopy on the loop device exclude each other.
//!
//! Read-only mounts share with each other; inspection tools (`inspect`,
//! `check`) take a shared lock when they can and warn when they cannot.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How the storage will be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A read-write mount or mkfs: nobody else may hold it.
    Write,
    /// A read-only mount: other readers may, a writer may not.
    Share,
    /// A look by a tool that never writes: proceeds even beside a writer.
    Peek,
}

/// The locks that make the storage ours; released when dropped.
pub struct Claim {
    /// The backing file of a loop device, held open for its lock.
    _backing: Option<File>,
}

/// How long to wait for another Canopy process to let go of an image.
/// `umount` of a FUSE mount returns before its daemon has written its last
/// commit and exited; a mount, mkfs or check right after it should wait for
/// that rather than fail or read a commit half written.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens `path` for `access`, claiming the storage behind it.
pub fn open(path: &Path, access: Access) -> Result<(File, Claim)> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("opening {shown}"), e))?;
    if meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{shown} is a directory, not an image file or block device"
        )));
    }
    let block = meta.file_type().is_block_device();
    let mut opts = OpenOptions::new();
    opts.read(true).write(access == Access::Write);
    if block && access == Access::Write {
        opts.custom_flags(libc::O_EXCL);
    }
    // Like the file lock, wait out a daemon still finishing its unmount.
    let opened = within_grace(
        || opts.open(path),
        |e| e.raw_os_error() == Some(libc::EBUSY),
    );
    let file = opened.map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => Error::Invalid(format!(
            "{shown} is in use (mounted, or opened exclusively by another program)"
        )),
        _ => Error::io(format!("opening {shown}"), e),
    })?;
    if !block {
        lock(&file, access, &shown)?;
        if access == Access::Write {
            refuse_busy_loops(&meta, &shown)?;
        }
        return Ok((file, Claim { _backing: None }));
    }
    // A reader of a block device holds nothing a writer would notice, so
    // it looks for one: a writer (or a kernel mount) holds it O_EXCL.
    if access == Access::Share && held_exclusively(path) {
        return Err(Error::Invalid(format!(
            "{shown} is in use by a writer (mounted read-write, or opened exclusively)"
        )));
    }
    let backing = match loop_backing(&file, meta.rdev()) {
        Some(b) => Some(claim_backing(b, access, &shown)?),
        None => None,
    };
    Ok((file, Claim { _backing: backing }))
}

fn lock(file: &File, access: Access, shown: &str) -> Result<()> {
    match access {
        Access::Write => wait_for_lock(|| file.try_lock())
            .map_err(|_| Error::Invalid(format!("{shown} is in use by another Canopy process"))),
        Access::Share => wait_for_lock(|| file.try_lock_shared()).map_err(|_| {
            Error::Invalid(format!(
                "{shown} is mounted read-write by another Canopy process"
            ))
        }),
        Access::Peek => {
            if wait_for_lock(|| file.try_lock_shared()).is_err() {
                tracing::warn!(image = %shown, "in use by a mounted Canopy; reading it as it is");
            }
            Ok(())
        }
    }
}

fn wait_for_lock(
    try_lock: impl Fn() -> std::result::Result<(), std::fs::TryLockError>,
) -> std::result::Result<(), std::fs::TryLockError> {
    within_grace(try_lock, |e| matches!(e, std::fs::TryLockError::WouldBlock))
}

/// Tries `attempt` again every 50 ms while it fails with an error `busy`
/// accepts, for at most [`LOCK_GRACE`].
fn within_grace<T, E>(
    attempt: impl Fn() -> std::result::Result<T, E>,
    busy: impl Fn(&E) -> bool,
) -> std::result::Result<T, E> {
    let since = std::time::Instant::now();
    loop {
        match attempt() {
            Err(e) if busy(&e) && since.elapsed() < LOCK_GRACE => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// What a loop device is backed by: the file's name (from sysfs) and its
/// identity (from the driver).
struct Backing {
    path: PathBuf,
    dev: (u32, u32),
    ino: u64,
    loop_name: String,
}

/// The kernel's `struct loop_info64` (linux/loop.h); only the identity
/// fields are read, the rest give the layout.
#[repr(C)]
#[allow(dead_code)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// The backing file's (major, minor, inode) as the loop driver reports
/// them, or None when `file` is not a bound loop device.
fn loop_identity(file: &File) -> Option<((u32, u32), u64)> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero bytes are a valid LoopInfo64.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes at most size_of::<LoopInfo64>() bytes into
    // `info`; on a device that is not a loop it fails without writing.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    if r != 0 {
        return None;
    }
    // The driver encodes dev_t the kernel's "new" way (major in bits 8..20).
    let d = info.lo_device;
    let major = ((d >> 8) & 0xfff) as u32;
    let minor = ((d & 0xff) | ((d >> 12) & 0xfff00)) as u32;
    Some(((major, minor), info.lo_inode))
}

fn loop_backing(file: &File, rdev: u64) -> Option<Backing> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let name = std::fs::read_to_string(sys.join("loop/backing_file")).ok()?;
    let loop_name = std::fs::read_link(&sys)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("loop {major}:{minor}"));
    let (dev, ino) = loop_identity(file)?;
    Some(Backing {
        path: PathBuf::from(name.trim_end_matches('\n')),
        dev,
        ino,
        loop_name,
    })
}

/// Opens and locks a loop device's backing file as if it had been given.
fn claim_backing(b: Backing, access: Access, shown: &str) -> Result<File> {
    let found = File::open(&b.path).ok().filter(|f| {
        f.metadata().is_ok_and(|m| {
            (libc::major(m.dev()), libc::minor(m.dev())) == b.dev && m.ino() == b.ino
        })
    });
    let Some(f) = found else {
        if access == Access::Peek {
            return File::open("/dev/null").map_err(|e| Error::io("opening /dev/null", e));
        }
        return Err(Error::Invalid(format!(
            "{shown} ({}) is backed by {}, which no longer has that name: \
             refusing to use it, as another writer could not be ruled out",
            b.loop_name,
            b.path.display()
        )));
    };
    let via = format!("{} (the file behind {shown})", b.path.display());
    lock(&f, access, &via)?;
    Ok(f)
}

/// Whether someone holds the block device at `path` with O_EXCL.
fn held_exclusively(path: &Path) -> bool {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .err()
        .is_some_and(|e| e.raw_os_error() == Some(libc::EBUSY))
}

/// Refuses an image file while a loop device backed by it is held
/// exclusively: mounted by the kernel or opened by a writer.
fn refuse_busy_loops(meta: &std::fs::Metadata, shown: &str) -> Result<()> {
    let me = (
        (libc::major(meta.dev()), libc::minor(meta.dev())),
        meta.ino(),
    );
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || !e.path().join("loop/backing_file").exists() {
            continue;
        }
        let dev = Path::new("/dev").join(&name);
        let Ok(f) = File::open(&dev) else { continue };
        if loop_identity(&f) != Some(me) {
            continue;
        }
        drop(f);
        if held_exclusively(&dev) {
            return Err(Error::Invalid(format!(
                "{shown} is in use through {} (mounted, or opened by another writer)",
                dev.display()
            )));
        }
    }
    Ok(())
}
