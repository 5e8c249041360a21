//! An image file or block device accessed with pread/pwrite (never mmap: an
//! I/O error must be an error, not SIGBUS).

use super::Device;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub struct FileDevice {
    file: File,
    size: u64,
    path: String,
}

impl FileDevice {
    /// Opens `path` for reading (and writing unless `read_only`). With
    /// `exclusive`, takes an exclusive lock so a second opener is refused.
    pub fn open(path: &Path, read_only: bool, exclusive: bool) -> Result<FileDevice> {
        let shown = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| Error::io(format!("opening {shown}"), e))?;
        if exclusive {
            file.try_lock().map_err(|_| {
                Error::Invalid(format!("{shown} is in use by another Canopy process"))
            })?;
        }
        let size = device_size(&file).map_err(|e| Error::io(format!("sizing {shown}"), e))?;
        Ok(FileDevice {
            file,
            size,
            path: shown,
        })
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
        self.file.write_all_at(buf, offset).map_err(|e| {
            Error::io(
                format!("writing {} bytes at {offset} of {}", buf.len(), self.path),
                e,
            )
        })
    }

    fn barrier(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(format!("syncing {}", self.path), e))
    }

    fn size(&self) -> u64 {
        self.size
    }
}
