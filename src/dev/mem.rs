//! A device in memory, for tests and tools.

use super::Device;
use crate::error::{Error, Result};
use std::sync::Mutex;

pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
}

impl MemDevice {
    pub fn new(size: u64) -> MemDevice {
        MemDevice::from_bytes(vec![0; size as usize])
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            bytes: Mutex::new(bytes),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        crate::sync::lock(&self.bytes).clone()
    }
}

fn range(offset: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>> {
    let start = usize::try_from(offset).map_err(|_| Error::Invalid("offset".into()))?;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(Error::io(
            format!("access of {len} bytes at {offset} beyond device end {size}"),
            std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        )),
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let bytes = crate::sync::lock(&self.bytes);
        let r = range(offset, buf.len(), bytes.len())?;
        buf.copy_from_slice(&bytes[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut bytes = crate::sync::lock(&self.bytes);
        let r = range(offset, buf.len(), bytes.len())?;
        bytes[r].copy_from_slice(buf);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        crate::sync::lock(&self.bytes).len() as u64
    }

    /// Zeros, as a thin device that reads discarded space as zeros.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        let mut bytes = crate::sync::lock(&self.bytes);
        let n = usize::try_from(len).map_err(|_| Error::Invalid("discard too long".into()))?;
        let r = range(offset, n, bytes.len())?;
        bytes[r].fill(0);
        Ok(true)
    }
}
