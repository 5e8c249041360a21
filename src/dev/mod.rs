//! Devices: where blocks are stored.
//!
//! Everything above this layer sees a [`Device`]: positional reads and writes
//! plus a barrier that makes every earlier write durable. A commit is only as
//! safe as the barrier, so the file device maps it to `fdatasync`.
//!
//! - [`FileDevice`]: an image file or block device, locked against a second
//!   user.
//! - `RbdDevice`: an image on a Ceph cluster, through librbd (the `rbd`
//!   feature; built where librbd is installed), named `rbd:POOL/IMAGE`.
//! - [`MemDevice`]: a byte vector, for tests.
//! - [`fault::FaultyDevice`]: fails, tears, loses or misdirects chosen
//!   operations, for tests.
//! - [`crash::RecordingDevice`]: records every write and barrier so that tests
//!   can replay any prefix of them, as a crash would leave the disk.
//! - [`powercut::PowerCutDevice`]: journals what each write overwrites until
//!   a barrier covers it, so that the crash campaign can cut the power of a
//!   real mount (lose every unflushed write, or any subset of sectors).

pub mod crash;
pub mod exclusive;
pub mod fault;
mod file;
mod mem;
pub mod powercut;
#[cfg(canopy_rbd)]
mod rbd;
mod signature;
pub mod source;

pub use exclusive::Access;
pub use file::FileDevice;
pub use mem::MemDevice;
#[cfg(canopy_rbd)]
pub use rbd::RbdDevice;
pub use signature::existing_filesystem;
pub use source::{OpenHow, RbdSpec, Source};

use crate::error::Result;
use bytes::Bytes;

pub trait Device: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Writes all of `buf` at `offset`; not durable until [`Device::barrier`].
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Writes file data (whole sectors at a sector-aligned offset) that is
    /// not read back soon. The file device sends it around the host's page
    /// cache (direct I/O), so that data is cached once, in Canopy's own
    /// bounded buffers; others write it like anything else. Not durable
    /// until [`Device::barrier`].
    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_at(buf, offset)
    }
    /// [`Device::write_data_at`] for a caller that gives its bytes away: a
    /// device that keeps a write in flight after returning (RBD) takes
    /// them as they are instead of copying them.
    fn write_data_owned(&self, buf: Bytes, offset: u64) -> Result<()> {
        self.write_data_at(&buf, offset)
    }
    /// Returns once every write issued before it is durable.
    fn barrier(&self) -> Result<()>;
    /// Size in bytes, as last seen.
    fn size(&self) -> u64;
    /// Looks at the storage's size again (it may have grown since open:
    /// `rbd resize`, a longer image file, a larger block device) and
    /// returns it; [`Device::size`] reports it from then on.
    fn refresh_size(&self) -> Result<u64> {
        Ok(self.size())
    }
    /// Hints that `[offset, offset+len)` will be read soon (readahead);
    /// may do nothing.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Tells the storage that `[offset, offset+len)` holds nothing anyone
    /// will read (`canopy filesystem trim`), so a thin image can give the
    /// space back. Reads of it afterwards may return anything. Returns
    /// false where the storage has no such call (nothing is done then).
    fn discard(&self, _offset: u64, _len: u64) -> Result<bool> {
        Ok(false)
    }
    /// The storage's own unit of writing, where a write that covers whole
    /// units aligned to their size costs it less than one that cuts into
    /// them (an RBD image's objects); 0 where it has none worth aligning
    /// to. Long data extents start on such a boundary.
    fn write_unit(&self) -> u64 {
        0
    }
    /// Whether the storage keeps copies of every write itself (a Ceph
    /// pool of size 2 or more), so that a second copy of short-lived
    /// metadata (the fsync log) would only cost another write.
    fn replicates(&self) -> bool {
        false
    }
}
