//! A device that records every write and barrier, and the replay that turns a
//! recording into the disk a crash could have left.
//!
//! Between two barriers the device may persist any subset of the writes in
//! flight, in any order, each 4 KiB page on its own; before a barrier
//! returns, all of them. [`replay`] builds the disk after a prefix of the
//! recorded operations: every page written before the last barrier that
//! returned inside the prefix began, plus the pages written after that
//! which `keep` selects. A barrier is recorded when it returns, with
//! how many operations came before it began: writes sent while it was
//! out (by other threads) are not covered by it. A discard counts
//! as a write of [`DISCARDED`] bytes: after one, a range may read back
//! as anything.

use super::{Device, MemDevice};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Granularity at which a crash may tear writes apart.
pub const PAGE: usize = 4096;

#[derive(Clone, Debug)]
pub enum Op {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A discard of `len` bytes (whole pages) at `offset`.
    Discard {
        offset: u64,
        len: u64,
    },
    /// A barrier that returned; the first `covers` operations of the
    /// recording came before it began, so they are durable.
    Barrier {
        covers: usize,
    },
}

/// What a discarded page reads back as in a replay: not zeros, so that
/// nothing can take a discarded block for an empty one.
pub const DISCARDED: u8 = 0xdb;

impl Op {
    /// Lays the op's pages over `pages` (see [`lay`]).
    fn lay(
        &self,
        pages: &mut BTreeMap<u64, Arc<Vec<u8>>>,
        n: &mut usize,
        keep: &dyn Fn(usize) -> bool,
    ) {
        match self {
            Op::Write { offset, data } => lay(pages, *offset, data, n, keep),
            Op::Discard { offset, len } => {
                let junk = vec![DISCARDED; *len as usize];
                lay(pages, *offset, &junk, n, keep)
            }
            Op::Barrier { .. } => {}
        }
    }

    /// Where the ops before a barrier end: the ops before it are durable.
    fn covers(&self) -> Option<usize> {
        match self {
            Op::Barrier { covers } => Some(*covers),
            _ => None,
        }
    }
}

pub struct RecordingDevice {
    inner: MemDevice,
    ops: Mutex<Vec<Op>>,
    /// How long a barrier takes (0 by default): while one is out, other
    /// threads' writes are recorded and it does not cover them.
    barrier_time: std::time::Duration,
    /// What [`Device::replicates`] says (false by default).
    replicates: bool,
    /// What [`Device::write_unit`] says (0 by default).
    write_unit: u64,
}

impl RecordingDevice {
    pub fn new(initial: Vec<u8>) -> RecordingDevice {
        RecordingDevice {
            inner: MemDevice::from_bytes(initial),
            ops: Mutex::new(Vec::new()),
            barrier_time: std::time::Duration::ZERO,
            replicates: false,
            write_unit: 0,
        }
    }

    /// The same device, saying it keeps copies of its own (as a
    /// replicated Ceph pool does): the fsync log then writes one copy.
    pub fn replicating(self) -> RecordingDevice {
        RecordingDevice {
            replicates: true,
            ..self
        }
    }

    /// The same device, saying it writes in units of `bytes` (as an RBD
    /// image does in objects): long data extents then start on one.
    pub fn with_write_unit(self, bytes: u64) -> RecordingDevice {
        RecordingDevice {
            write_unit: bytes,
            ..self
        }
    }

    /// A device whose barriers each take `time`, as a real one's do.
    pub fn with_barrier_time(initial: Vec<u8>, time: std::time::Duration) -> RecordingDevice {
        RecordingDevice {
            barrier_time: time,
            ..RecordingDevice::new(initial)
        }
    }

    pub fn ops(&self) -> Vec<Op> {
        crate::sync::lock(&self.ops).clone()
    }

    /// Number of operations recorded so far.
    pub fn op_count(&self) -> usize {
        crate::sync::lock(&self.ops).len()
    }

    pub fn contents(&self) -> Vec<u8> {
        self.inner.snapshot()
    }
}

impl Device for RecordingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        crate::sync::lock(&self.ops).push(Op::Write {
            offset,
            data: buf.to_vec(),
        });
        self.inner.write_at(buf, offset)
    }

    fn barrier(&self) -> Result<()> {
        let covers = crate::sync::lock(&self.ops).len();
        if !self.barrier_time.is_zero() {
            std::thread::sleep(self.barrier_time);
        }
        crate::sync::lock(&self.ops).push(Op::Barrier { covers });
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn replicates(&self) -> bool {
        self.replicates
    }

    fn write_unit(&self) -> u64 {
        self.write_unit
    }

    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        crate::sync::lock(&self.ops).push(Op::Discard { offset, len });
        self.inner
            .write_at(&vec![DISCARDED; len as usize], offset)
            .map(|()| true)
    }
}

/// A base image with pages laid over it: what a replayed crash left.
/// Reads see the overlay; writes go to the overlay too.
pub struct OverlayDevice {
    base: Arc<Vec<u8>>,
    pages: Mutex<BTreeMap<u64, Arc<Vec<u8>>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<Vec<u8>>) -> OverlayDevice {
        OverlayDevice::with_pages(base, BTreeMap::new())
    }

    fn with_pages(base: Arc<Vec<u8>>, pages: BTreeMap<u64, Arc<Vec<u8>>>) -> OverlayDevice {
        OverlayDevice {
            base,
            pages: Mutex::new(pages),
        }
    }
}

/// Lays a write over `pages` page by page, for the pages `keep` accepts (by
/// page index counted through `counter`).
fn lay(
    pages: &mut BTreeMap<u64, Arc<Vec<u8>>>,
    offset: u64,
    data: &[u8],
    counter: &mut usize,
    keep: &dyn Fn(usize) -> bool,
) {
    for (i, chunk) in data.chunks(PAGE).enumerate() {
        if keep(*counter) {
            pages.insert(offset + (i * PAGE) as u64, Arc::new(chunk.to_vec()));
        }
        *counter += 1;
    }
}

fn check_range(offset: u64, len: usize, size: usize) -> Result<()> {
    if !offset.is_multiple_of(PAGE as u64)
        || !len.is_multiple_of(PAGE)
        || offset as usize + len > size
    {
        return Err(Error::Invalid(format!(
            "unaligned overlay access {offset}+{len}"
        )));
    }
    Ok(())
}

impl Device for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(offset, buf.len(), self.base.len())?;
        let pages = crate::sync::lock(&self.pages);
        for (i, chunk) in buf.chunks_mut(PAGE).enumerate() {
            let at = offset + (i * PAGE) as u64;
            match pages.get(&at) {
                Some(p) => chunk.copy_from_slice(p),
                None => chunk.copy_from_slice(&self.base[at as usize..at as usize + PAGE]),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(offset, buf.len(), self.base.len())?;
        let mut n = 0;
        lay(
            &mut crate::sync::lock(&self.pages),
            offset,
            buf,
            &mut n,
            &|_| true,
        );
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.len() as u64
    }
}

/// Builds crash images for growing prefixes of one recording, carrying the
/// durable pages forward so each image costs only what changed.
pub struct Replayer {
    base: Arc<Vec<u8>>,
    ops: Vec<Op>,
    durable: BTreeMap<u64, Arc<Vec<u8>>>,
    durable_end: usize,
}

impl Replayer {
    /// How many of the first `prefix` ops are durable: those before the
    /// start of the last barrier that returned within them.
    fn durable_end_at(&self, prefix: usize) -> usize {
        self.ops[..prefix]
            .iter()
            .filter_map(Op::covers)
            .max()
            .unwrap_or(0)
            .max(self.durable_end)
    }

    /// The device offset of each page in flight after the first
    /// `prefix` ops, in the order `at`'s `keep` counts them.
    pub fn pages_in_flight(&self, prefix: usize) -> Vec<u64> {
        let prefix = prefix.min(self.ops.len());
        let start = self.durable_end_at(prefix);
        let mut out = Vec::new();
        for op in &self.ops[start..prefix.max(start)] {
            let (offset, len) = match op {
                Op::Write { offset, data } => (*offset, data.len()),
                Op::Discard { offset, len } => (*offset, *len as usize),
                Op::Barrier { .. } => continue,
            };
            out.extend((0..len.div_ceil(PAGE)).map(|i| offset + (i * PAGE) as u64));
        }
        out
    }

    pub fn new(base: Arc<Vec<u8>>, ops: Vec<Op>) -> Replayer {
        Replayer {
            base,
            ops,
            durable: BTreeMap::new(),
            durable_end: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The disk after the first `prefix` ops: everything before the last
    /// barrier inside the prefix, and of the pages written after it those
    /// for which `keep(i)` is true (i counts those pages from 0). Prefixes
    /// must not decrease from one call to the next.
    pub fn at(&mut self, prefix: usize, keep: &dyn Fn(usize) -> bool) -> OverlayDevice {
        let prefix = prefix.min(self.ops.len());
        let new_end = self.durable_end_at(prefix);
        let mut n = 0;
        for op in &self.ops[self.durable_end..new_end] {
            op.lay(&mut self.durable, &mut n, &|_| true);
        }
        self.durable_end = new_end;
        let mut pages = self.durable.clone();
        let mut n = 0;
        for op in &self.ops[new_end..prefix.max(new_end)] {
            op.lay(&mut pages, &mut n, keep);
        }
        OverlayDevice::with_pages(self.base.clone(), pages)
    }
}
