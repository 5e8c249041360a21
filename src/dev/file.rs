//! An image file or block device accessed with pread/pwrite (never mmap: an
//! I/O error must be an error, not SIGBUS).
//!
//! Data writes of at least [`DIRECT_MIN`] go through a second descriptor
//! opened with O_DIRECT: a large write through the page cache costs a copy
//! into freshly zeroed host pages, and the host's own dirty limit then
//! throttles that second copy of data Canopy already buffers under its
//! `dirty_limit` (the collapse at low limits that seed mail 001 measures on
//! loop images). Tree blocks and smaller data writes stay buffered. Where
//! the host refuses O_DIRECT (tmpfs, some FUSE filesystems), data is
//! written through the page cache like everything else.
//!
//! A mount whose own writes the kernel buffers (`writeback_cache`) sends
//! every write direct ([`FileDevice::write_everything_direct`]) unless the
//! daemon is an I/O flusher: the kernel counts the mount's dirty pages
//! against the same global limit as the image's, so a buffered write of
//! the image can wait for pages only the daemon itself can clean (see
//! `fuse::bdi`).

use super::exclusive::Access;
use super::Device;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub struct FileDevice {
    file: File,
    /// The same file opened with O_DIRECT, for data writes.
    direct: Option<File>,
    /// Cleared when the host rejects a direct write; data then goes buffered.
    direct_ok: AtomicBool,
    /// Smallest data write sent direct ([`DIRECT_MIN`], or every aligned
    /// write, tree blocks too, after `write_everything_direct`).
    direct_min: AtomicUsize,
    size: AtomicU64,
    path: String,
    /// Keeps other writers out for as long as the device is open.
    _claim: super::exclusive::Claim,
}

/// Alignment of direct I/O buffers, offsets and lengths: the largest
/// logical block size a host device is likely to have.
const DIRECT_ALIGN: usize = 4096;

/// Smallest data write sent direct. A direct write returns only once the
/// device has it, under the engine's lock; for small files (dbench's mix,
/// mail servers) that wait per extent costs more than the copy it saves,
/// and the page cache lets one barrier write them all together.
const DIRECT_MIN: usize = 1 << 20;

impl FileDevice {
    /// Opens `path` for reading (and writing unless `read_only`), claiming
    /// the storage behind it (see [`super::exclusive`]): with `exclusive`,
    /// a writer's claim or, read-only, a reader's that a writer excludes;
    /// without, a look that proceeds even beside a live mount.
    pub fn open(path: &Path, read_only: bool, exclusive: bool) -> Result<FileDevice> {
        let access = match (read_only, exclusive) {
            (false, _) => Access::Write,
            (true, true) => Access::Share,
            (true, false) => Access::Peek,
        };
        FileDevice::open_as(path, access)
    }

    /// Opens `path` for `access`, claiming the storage as it needs.
    pub fn open_as(path: &Path, access: Access) -> Result<FileDevice> {
        let shown = path.display().to_string();
        let read_only = access != Access::Write;
        let (file, claim) = super::exclusive::open(path, access)?;
        let size = device_size(&file).map_err(|e| Error::io(format!("sizing {shown}"), e))?;
        let direct = if read_only {
            None
        } else {
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        };
        Ok(FileDevice {
            file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct_min: AtomicUsize::new(DIRECT_MIN),
            direct,
            size: AtomicU64::new(size),
            path: shown,
            _claim: claim,
        })
    }

    /// Sends every aligned write direct, tree blocks and small data too
    /// (see the module comment). Returns whether direct I/O is possible.
    pub fn write_everything_direct(&self) -> bool {
        self.direct_min.store(1, Ordering::Relaxed);
        self.writes_direct()
    }

    /// Whether data writes currently bypass the host's page cache.
    pub fn writes_direct(&self) -> bool {
        self.direct_ok.load(Ordering::Relaxed)
    }

    /// Writes `buf` with O_DIRECT, through an aligned bounce buffer when
    /// `buf` itself is not aligned. Returns false (having written nothing
    /// that counts) when direct I/O cannot take this write.
    fn try_write_direct(&self, buf: &[u8], offset: u64) -> Result<bool> {
        let Some(direct) = self.direct.as_ref().filter(|_| self.writes_direct()) else {
            return Ok(false);
        };
        let aligned = |n: u64| n.is_multiple_of(DIRECT_ALIGN as u64);
        let min = self.direct_min.load(Ordering::Relaxed);
        if buf.len() < min || !aligned(buf.len() as u64) || !aligned(offset) {
            return Ok(false);
        }
        let r = if aligned(buf.as_ptr() as u64) {
            direct.write_all_at(buf, offset)
        } else {
            bounce::with_aligned_copy(buf, |b| direct.write_all_at(b, offset))
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(image = %self.path, "direct I/O refused; writing data buffered");
                self.direct_ok.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(Error::io(
                format!("writing {} bytes at {offset} of {}", buf.len(), self.path),
                e,
            )),
        }
    }

    /// Creates (or extends) a sparse image file of `size` bytes.
    pub fn create_image(path: &Path, size: u64) -> Result<()> {
        let shown = path.display().to_string();
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("creating {shown}"), e))?;
        let meta = f
            .metadata()
            .map_err(|e| Error::io(format!("stat {shown}"), e))?;
        if meta.is_file() && meta.len() < size {
            f.set_len(size)
                .map_err(|e| Error::io(format!("sizing {shown}"), e))?;
        }
        Ok(())
    }
}

/// Regular files report their length; block devices report 0 there, so seek
/// to the end instead.
fn device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

impl Device for FileDevice {
    /// Asks the kernel to start reading the range into its page cache
    /// (posix_fadvise WILLNEED), so a later pread finds it there.
    fn prefetch(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; the advice cannot change the file.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            Error::io(
                format!("reading {} bytes at {offset} of {}", buf.len(), self.path),
                e,
            )
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.direct_min.load(Ordering::Relaxed) < DIRECT_MIN
            && self.try_write_direct(buf, offset)?
        {
            return Ok(());
        }
        self.file.write_all_at(buf, offset).map_err(|e| {
            Error::io(
                format!("writing {} bytes at {offset} of {}", buf.len(), self.path),
                e,
            )
        })
    }

    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.try_write_direct(buf, offset)? {
            return Ok(());
        }
        self.write_at(buf, offset)
    }

    /// fdatasync of the buffered descriptor also flushes the device cache
    /// for the direct writes: both descriptors name one file.
    fn barrier(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(format!("syncing {}", self.path), e))
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn refresh_size(&self) -> Result<u64> {
        let size =
            device_size(&self.file).map_err(|e| Error::io(format!("sizing {}", self.path), e))?;
        self.size.store(size, Ordering::Relaxed);
        Ok(size)
    }

    /// An image file gets a hole punched (its blocks go back to the host
    /// filesystem; the size stays), a block device BLKDISCARD. Where the
    /// host supports neither, nothing happens.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        let is_file = self.file.metadata().is_ok_and(|m| m.is_file());
        let r = if is_file {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: a valid descriptor; the range lies inside the file.
            unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) }
        } else {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s (start, length).
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => Ok(false),
            _ => Err(Error::io(
                format!("discarding {len} bytes at {offset} of {}", self.path),
                e,
            )),
        }
    }
}

/// `_IO(0x12, 119)`: discard a range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// Page-aligned scratch memory for direct writes of unaligned buffers, one
/// per thread and reused, so that a write costs one copy and no fresh
/// (kernel-zeroed) pages.
mod bounce {
    use super::DIRECT_ALIGN;
    use std::alloc::{alloc, dealloc, Layout};
    use std::cell::RefCell;

    struct Aligned {
        ptr: *mut u8,
        layout: Layout,
    }

    impl Drop for Aligned {
        fn drop(&mut self) {
            // SAFETY: ptr came from alloc with this layout.
            unsafe { dealloc(self.ptr, self.layout) }
        }
    }

    thread_local! {
        static SCRATCH: RefCell<Option<Aligned>> = const { RefCell::new(None) };
    }

    /// Calls `f` with an aligned copy of `buf`.
    pub fn with_aligned_copy<R>(
        buf: &[u8],
        f: impl FnOnce(&[u8]) -> std::io::Result<R>,
    ) -> std::io::Result<R> {
        SCRATCH.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|a| a.layout.size() < buf.len()) {
                *slot = None;
                let layout = Layout::from_size_align(buf.len(), DIRECT_ALIGN)
                    .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
                // SAFETY: the layout has a non-zero size (direct writes are
                // at least DIRECT_MIN bytes).
                let ptr = unsafe { alloc(layout) };
                if ptr.is_null() {
                    return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
                }
                *slot = Some(Aligned { ptr, layout });
            }
            let a = slot
                .as_ref()
                .ok_or_else(|| std::io::Error::other("no scratch"))?;
            // SAFETY: the allocation holds at least buf.len() bytes, is
            // owned by this thread, and is written before it is read.
            let copy = unsafe {
                std::ptr::copy_nonoverlapping(buf.as_ptr(), a.ptr, buf.len());
                std::slice::from_raw_parts(a.ptr, buf.len())
            };
            f(copy)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Data written by the direct path, from aligned and unaligned memory,
    /// reads back through the buffered descriptor (which may have cached
    /// the old contents), and unaligned writes fall back to buffered ones.
    #[test]
    fn data_writes_read_back_whichever_path_they_take() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("dev.img");
        FileDevice::create_image(&img, 4 << 20).unwrap();
        let dev = FileDevice::open(&img, false, true).unwrap();
        let mut old = vec![0u8; DIRECT_MIN];
        dev.read_at(&mut old, 8192).unwrap();
        let backing: Vec<u8> = (0..DIRECT_MIN + 1).map(|i| (i * 7 % 251) as u8).collect();
        let unaligned = &backing[1..];
        dev.write_data_at(unaligned, 8192).unwrap();
        let mut got = vec![0u8; DIRECT_MIN];
        dev.read_at(&mut got, 8192).unwrap();
        assert!(got == unaligned);
        dev.write_data_at(b"short", 100).unwrap();
        let mut got = [0u8; 5];
        dev.read_at(&mut got, 100).unwrap();
        assert_eq!(&got, b"short");
        eprintln!("direct I/O in use: {}", dev.writes_direct());
    }
}
