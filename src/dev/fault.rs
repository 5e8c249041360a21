//! A device that misbehaves on purpose, for tests: it wraps any
//! [`Device`] and fails reads, writes or barriers at chosen points, tears
//! writes, loses them, sends them to the wrong place, or forgets every
//! write since the last barrier, as a disk whose volatile cache was lost.
//!
//! The models are TigerBeetle's storage fault injection and redb's
//! crash tests. Faults are armed one at a time with [`FaultyDevice::arm`];
//! each counts matching operations from the moment it was armed and fires
//! on the `nth` (0-based). Silent faults (torn, lost, misdirected) report
//! success: the filesystem must find the damage when it reads the block.

use super::Device;
use crate::error::{Error, Result};
use std::sync::Mutex;

/// Which writes a write fault counts: every write, only writes of one
/// size, or each `n`-byte block of writes that are whole blocks (a commit
/// writes runs of tree blocks in one call; this reaches each of them,
/// and never the 4 KiB superblock when `n` is larger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sized {
    Any,
    Exactly(usize),
    EachBlock(usize),
}

impl Sized {
    fn admits(self, len: usize) -> bool {
        match self {
            Sized::Any => true,
            Sized::Exactly(n) => n == len,
            Sized::EachBlock(n) => n > 0 && len.is_multiple_of(n),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The nth read fails with EIO.
    FailRead { nth: u64 },
    /// The nth matching write fails with EIO, having written nothing.
    FailWrite { nth: u64, only: Sized },
    /// The nth barrier fails with EIO (the writes before it may or may
    /// not have landed; here they did).
    FailBarrier { nth: u64 },
    /// Of the nth matching write only the first half lands; success is
    /// reported.
    TornWrite { nth: u64, only: Sized },
    /// The nth matching write never lands; success is reported.
    LostWrite { nth: u64, only: Sized },
    /// The nth matching write lands `by` bytes away from where it was
    /// sent (clamped inside the device); success is reported.
    MisdirectedWrite { nth: u64, only: Sized, by: i64 },
}

struct Armed {
    fault: Fault,
    seen: u64,
    fired: bool,
}

/// Old contents of a range overwritten since the last barrier.
struct Undo {
    offset: u64,
    old: Vec<u8>,
}

pub struct FaultyDevice<D: Device> {
    inner: D,
    armed: Mutex<Option<Armed>>,
    /// Writes since the last barrier, oldest first, for [`Self::lose_unflushed`].
    unflushed: Mutex<Vec<Undo>>,
}

fn injected(what: &str) -> Error {
    Error::io(
        format!("{what} (injected fault)"),
        std::io::Error::from_raw_os_error(libc::EIO),
    )
}

impl<D: Device> FaultyDevice<D> {
    pub fn new(inner: D) -> FaultyDevice<D> {
        FaultyDevice {
            inner,
            armed: Mutex::new(None),
            unflushed: Mutex::new(Vec::new()),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Arms `fault`, replacing any fault armed before.
    pub fn arm(&self, fault: Fault) {
        *crate::sync::lock(&self.armed) = Some(Armed {
            fault,
            seen: 0,
            fired: false,
        });
    }

    pub fn disarm(&self) {
        *crate::sync::lock(&self.armed) = None;
    }

    /// Whether the armed fault has fired.
    pub fn fired(&self) -> bool {
        crate::sync::lock(&self.armed)
            .as_ref()
            .is_some_and(|a| a.fired)
    }

    /// Forgets every write since the last barrier: the disk a power cut
    /// leaves when the device's write cache is lost.
    pub fn lose_unflushed(&self) -> Result<()> {
        let undo = std::mem::take(&mut *crate::sync::lock(&self.unflushed));
        for u in undo.into_iter().rev() {
            self.inner.write_at(&u.old, u.offset)?;
        }
        Ok(())
    }

    /// Counts an operation against the armed fault; true when it fires now.
    fn fires(&self, matches: impl Fn(&Fault) -> Option<u64>) -> Option<Fault> {
        let mut g = crate::sync::lock(&self.armed);
        let a = g.as_mut()?;
        let nth = matches(&a.fault)?;
        let now = a.seen == nth && !a.fired;
        a.seen += 1;
        if now {
            a.fired = true;
            return Some(a.fault);
        }
        None
    }

    fn write_fault(&self, len: usize) -> Option<Fault> {
        self.fires(|f| match *f {
            Fault::FailWrite { nth, only }
            | Fault::TornWrite { nth, only }
            | Fault::LostWrite { nth, only }
            | Fault::MisdirectedWrite { nth, only, .. }
                if only.admits(len) =>
            {
                Some(nth)
            }
            _ => None,
        })
    }

    /// Writes through, remembering what was there for `lose_unflushed`.
    fn land(&self, buf: &[u8], offset: u64, data: bool) -> Result<()> {
        let mut old = vec![0u8; buf.len()];
        self.inner.read_at(&mut old, offset)?;
        crate::sync::lock(&self.unflushed).push(Undo { offset, old });
        if data {
            self.inner.write_data_at(buf, offset)
        } else {
            self.inner.write_at(buf, offset)
        }
    }

    fn only(&self) -> Option<Sized> {
        crate::sync::lock(&self.armed)
            .as_ref()
            .map(|a| match a.fault {
                Fault::FailWrite { only, .. }
                | Fault::TornWrite { only, .. }
                | Fault::LostWrite { only, .. }
                | Fault::MisdirectedWrite { only, .. } => only,
                _ => Sized::Any,
            })
    }

    fn write(&self, buf: &[u8], offset: u64, data: bool) -> Result<()> {
        match self.only() {
            Some(Sized::EachBlock(n)) if n > 0 && buf.len() > n && buf.len().is_multiple_of(n) => {
                for (i, block) in buf.chunks(n).enumerate() {
                    self.write_one(block, offset + (i * n) as u64, data)?;
                }
                Ok(())
            }
            _ => self.write_one(buf, offset, data),
        }
    }

    fn write_one(&self, buf: &[u8], offset: u64, data: bool) -> Result<()> {
        match self.write_fault(buf.len()) {
            None => self.land(buf, offset, data),
            Some(Fault::FailWrite { .. }) => Err(injected(&format!(
                "writing {} bytes at {offset}",
                buf.len()
            ))),
            Some(Fault::TornWrite { .. }) => {
                let half = (buf.len() / 2).next_multiple_of(512).min(buf.len());
                self.land(&buf[..half], offset, false)
            }
            Some(Fault::LostWrite { .. }) => Ok(()),
            Some(Fault::MisdirectedWrite { by, .. }) => {
                let max = self.inner.size().saturating_sub(buf.len() as u64);
                let to = offset.saturating_add_signed(by).min(max);
                self.land(buf, to, data)
            }
            Some(_) => self.land(buf, offset, data),
        }
    }
}

impl<D: Device> Device for FaultyDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let fault = self.fires(|f| match *f {
            Fault::FailRead { nth } => Some(nth),
            _ => None,
        });
        if fault.is_some() {
            return Err(injected(&format!(
                "reading {} bytes at {offset}",
                buf.len()
            )));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write(buf, offset, false)
    }

    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write(buf, offset, true)
    }

    fn barrier(&self) -> Result<()> {
        let fault = self.fires(|f| match *f {
            Fault::FailBarrier { nth } => Some(nth),
            _ => None,
        });
        if fault.is_some() {
            return Err(injected("flushing the device"));
        }
        // Only what was written before the barrier began: barriers may
        // run beside writes on other threads.
        let covered = crate::sync::lock(&self.unflushed).len();
        self.inner.barrier()?;
        let mut unflushed = crate::sync::lock(&self.unflushed);
        let covered = covered.min(unflushed.len());
        unflushed.drain(..covered);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn replicates(&self) -> bool {
        self.inner.replicates()
    }

    fn write_unit(&self) -> u64 {
        self.inner.write_unit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn faults_fire_once_at_their_point() {
        let d = FaultyDevice::new(MemDevice::new(1 << 20));
        d.arm(Fault::FailWrite {
            nth: 1,
            only: Sized::Exactly(4096),
        });
        d.write_at(&[1; 512], 0).unwrap();
        d.write_at(&[1; 4096], 4096).unwrap();
        assert!(d.write_at(&[2; 4096], 8192).is_err());
        d.write_at(&[3; 4096], 8192).unwrap();
        assert!(d.fired());

        d.arm(Fault::TornWrite {
            nth: 0,
            only: Sized::Any,
        });
        d.write_at(&[9; 4096], 16384).unwrap();
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 16384).unwrap();
        assert!(b[..2048].iter().all(|&x| x == 9) && b[2048..].iter().all(|&x| x == 0));

        d.arm(Fault::MisdirectedWrite {
            nth: 0,
            only: Sized::Any,
            by: 4096,
        });
        d.write_at(&[7; 4096], 32768).unwrap();
        d.read_at(&mut b, 36864).unwrap();
        assert_eq!(b[0], 7);
        d.read_at(&mut b, 32768).unwrap();
        assert_eq!(b[0], 0);

        d.barrier().unwrap();
        d.write_at(&[5; 4096], 0).unwrap();
        d.lose_unflushed().unwrap();
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 1);
    }
}
