//! A device that can lose power, for the crash campaign.
//!
//! kill -9 of the daemon never loses a write the daemon made: the host's
//! page cache keeps it. So kill -9 alone cannot find a missing or
//! misplaced barrier. A power cut can: a disk forgets whatever sat in its
//! volatile cache, all of it or any part, sector by sector, and a sector
//! written twice since the last flush may hold either version.
//!
//! [`PowerCutDevice`] wraps a real device (the mounted image) and, before
//! each write, appends the bytes it is about to overwrite to an *undo
//! journal* file. A barrier that returns empties the journal of every
//! write completed before it was issued: those are durable. After the
//! daemon dies, the journal holds every write a power cut may lose, and
//! [`cut_power`] (or the campaign's own copy of it in Python) puts back
//! the old bytes of all of them or of a random subset of sectors.
//!
//! The daemon turns it on from its environment ([`from_env`]), so no
//! mount option a user could meet exists for it:
//! - `CANOPY_POWERCUT_JOURNAL=PATH`: the journal; the mode is on when set.
//!   A mount of several devices journals the others at `PATH.2`,
//!   `PATH.3`, ... in the order its `device=` options name them.
//! - `CANOPY_POWERCUT_TRIGGER=PATH`: when this file exists, the next
//!   barrier kills the daemon (SIGKILL) before flushing: a cut exactly at
//!   a barrier, with everything since the previous one still volatile.
//! - `CANOPY_POWERCUT_BARRIERS=ignored`: barriers neither flush nor empty
//!   the journal (the negative control: a cut must then lose commits).
//!
//! Journal records, little-endian, appended with one write each before
//! the image write they undo is sent (so a record torn by kill -9 belongs
//! to a write that never started, and is dropped): magic `PCJ1`, offset
//! u64, length u32, then the old bytes.

use super::Device;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Start of every journal record.
pub const MAGIC: &[u8; 4] = b"PCJ1";
/// Magic, offset and length.
const HEADER_LEN: usize = 16;

/// What a barrier does under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barriers {
    /// Flushes the device and forgets the journal of what it covered.
    Honest,
    /// Does nothing: every write since the mount stays volatile.
    Ignored,
}

/// A write whose undo record is in the journal and which no barrier has
/// covered yet.
struct Pending {
    id: u64,
    /// The record's place in the journal file, header included.
    at: u64,
    len: u64,
    /// The image write returned: a barrier issued from now on covers it.
    done: bool,
}

struct Journal {
    file: File,
    path: PathBuf,
    end: u64,
    pending: Vec<Pending>,
    next_id: u64,
}

pub struct PowerCutDevice {
    inner: Arc<dyn Device>,
    journal: Mutex<Journal>,
    barriers: Barriers,
    trigger: Option<PathBuf>,
}

/// Wraps `inner` in a [`PowerCutDevice`] when the environment asks for
/// one (see the module comment); returns `inner` itself otherwise.
pub fn from_env(inner: Arc<dyn Device>) -> Result<Arc<dyn Device>> {
    from_env_for(inner, 1)
}

/// [`from_env`] for the `nth` device a mount names (1: the one mounted,
/// 2: the first `device=`, ...): each has its own journal, the first's
/// path with `.N` appended from the second on, so that a cut loses each
/// device's unflushed writes independently, as separate disks would.
pub fn from_env_for(inner: Arc<dyn Device>, nth: usize) -> Result<Arc<dyn Device>> {
    let Some(mut journal) = std::env::var_os("CANOPY_POWERCUT_JOURNAL") else {
        return Ok(inner);
    };
    if nth > 1 {
        journal.push(format!(".{nth}"));
    }
    let barriers = match std::env::var("CANOPY_POWERCUT_BARRIERS").as_deref() {
        Ok("ignored") => Barriers::Ignored,
        Ok("honest") | Err(_) => Barriers::Honest,
        Ok(other) => {
            return Err(Error::Invalid(format!(
                "CANOPY_POWERCUT_BARRIERS={other}: expected honest or ignored"
            )))
        }
    };
    let trigger = std::env::var_os("CANOPY_POWERCUT_TRIGGER").map(PathBuf::from);
    tracing::warn!(journal = %Path::new(&journal).display(), ?barriers,
        "power-cut test mode: every write is journaled until a barrier covers it");
    let dev = PowerCutDevice::new(inner, Path::new(&journal), barriers, trigger)?;
    Ok(Arc::new(dev))
}

impl PowerCutDevice {
    /// Starts an empty journal at `journal` (replacing any old one).
    pub fn new(
        inner: Arc<dyn Device>,
        journal: &Path,
        barriers: Barriers,
        trigger: Option<PathBuf>,
    ) -> Result<PowerCutDevice> {
        let file = create_journal(journal)?;
        Ok(PowerCutDevice {
            inner,
            journal: Mutex::new(Journal {
                file,
                path: journal.to_path_buf(),
                end: 0,
                pending: Vec::new(),
                next_id: 0,
            }),
            barriers,
            trigger,
        })
    }

    /// Journals the bytes `len` bytes at `offset` hold now; returns the
    /// record's id.
    fn record_old(&self, offset: u64, len: usize) -> Result<u64> {
        let mut record = vec![0u8; HEADER_LEN + len];
        self.inner.read_at(&mut record[HEADER_LEN..], offset)?;
        record[..4].copy_from_slice(MAGIC);
        record[4..12].copy_from_slice(&offset.to_le_bytes());
        let len32 = u32::try_from(len).map_err(|_| {
            Error::Invalid(format!("a write of {len} bytes is too long to journal"))
        })?;
        record[12..16].copy_from_slice(&len32.to_le_bytes());
        let mut j = crate::sync::lock(&self.journal);
        let at = j.end;
        j.file.write_all_at(&record, at).map_err(|e| {
            Error::io(
                format!("writing the power-cut journal {}", j.path.display()),
                e,
            )
        })?;
        let id = j.next_id;
        j.next_id += 1;
        j.end += record.len() as u64;
        j.pending.push(Pending {
            id,
            at,
            len: record.len() as u64,
            done: false,
        });
        Ok(id)
    }

    fn mark_done(&self, id: u64) {
        let mut j = crate::sync::lock(&self.journal);
        if let Some(p) = j.pending.iter_mut().find(|p| p.id == id) {
            p.done = true;
        }
    }

    fn journaled_write(&self, buf: &[u8], offset: u64, data: bool) -> Result<()> {
        let id = self.record_old(offset, buf.len())?;
        match data {
            true => self.inner.write_data_at(buf, offset)?,
            false => self.inner.write_at(buf, offset)?,
        }
        self.mark_done(id);
        Ok(())
    }

    /// Dies here, before the flush, when the campaign asked for a cut at
    /// the next barrier.
    fn cut_if_triggered(&self) {
        if self.trigger.as_ref().is_some_and(|t| t.exists()) {
            tracing::warn!("power-cut trigger found: the power goes at this barrier");
            // SAFETY: sends a signal to this very process; nothing to uphold.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    /// Drops the records of `covered` writes, made durable by a barrier.
    fn forget(&self, covered: &[u64]) -> Result<()> {
        let mut j = crate::sync::lock(&self.journal);
        j.pending.retain(|p| !covered.contains(&p.id));
        if j.pending.is_empty() {
            j.file.set_len(0).map_err(|e| {
                Error::io(
                    format!("emptying the power-cut journal {}", j.path.display()),
                    e,
                )
            })?;
            j.end = 0;
            return Ok(());
        }
        rewrite_pending(&mut j)
    }
}

/// Replaces the journal by one holding only the pending records (writes
/// still in flight across a barrier: rare), through a rename so that a
/// kill at any instant leaves one whole journal or the other.
fn rewrite_pending(j: &mut Journal) -> Result<()> {
    let context = |what: &str| format!("{what} the power-cut journal {}", j.path.display());
    let mut kept = Vec::new();
    for p in &j.pending {
        let mut rec = vec![0u8; p.len as usize];
        j.file
            .read_exact_at(&mut rec, p.at)
            .map_err(|e| Error::io(context("reading"), e))?;
        kept.push(rec);
    }
    let tmp = j.path.with_extension("rewrite");
    let file = create_journal(&tmp)?;
    let mut at = 0;
    for (p, rec) in j.pending.iter_mut().zip(&kept) {
        file.write_all_at(rec, at)
            .map_err(|e| Error::io(context("rewriting"), e))?;
        p.at = at;
        at += rec.len() as u64;
    }
    std::fs::rename(&tmp, &j.path).map_err(|e| Error::io(context("renaming"), e))?;
    j.file = file;
    j.end = at;
    Ok(())
}

fn create_journal(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| {
            Error::io(
                format!("creating the power-cut journal {}", path.display()),
                e,
            )
        })
}

impl Device for PowerCutDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.journaled_write(buf, offset, false)
    }

    fn write_data_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.journaled_write(buf, offset, true)
    }

    fn barrier(&self) -> Result<()> {
        self.cut_if_triggered();
        if self.barriers == Barriers::Ignored {
            return Ok(());
        }
        let covered: Vec<u64> = {
            let j = crate::sync::lock(&self.journal);
            j.pending.iter().filter(|p| p.done).map(|p| p.id).collect()
        };
        self.inner.barrier()?;
        self.forget(&covered)
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

    fn refresh_size(&self) -> Result<u64> {
        self.inner.refresh_size()
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.inner.prefetch(offset, len)
    }

    /// Passed straight on: only space free in the last durable commit is
    /// discarded, which no write since the last barrier touched (an
    /// extent written and freed since is pinned until its commit is
    /// durable), so a cut has nothing of it to take back.
    fn discard(&self, offset: u64, len: u64) -> Result<bool> {
        self.inner.discard(offset, len)
    }
}

/// One journaled write: where it went and what was there before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undo {
    pub offset: u64,
    pub old: Vec<u8>,
}

/// Reads a journal's records in order, dropping a torn last one.
pub fn read_journal(path: &Path) -> Result<Vec<Undo>> {
    let bytes = std::fs::read(path).map_err(|e| {
        Error::io(
            format!("reading the power-cut journal {}", path.display()),
            e,
        )
    })?;
    let mut undos = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER_LEN {
        let head = &bytes[at..at + HEADER_LEN];
        if &head[..4] != MAGIC {
            return Err(Error::Invalid(format!(
                "power-cut journal {}: no record at byte {at}",
                path.display()
            )));
        }
        let offset = u64::from_le_bytes(head[4..12].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[12..16].try_into().unwrap_or_default()) as usize;
        let Some(old) = bytes.get(at + HEADER_LEN..at + HEADER_LEN + len) else {
            break;
        };
        undos.push(Undo {
            offset,
            old: old.to_vec(),
        });
        at += HEADER_LEN + len;
    }
    Ok(undos)
}

/// What the cut takes from the disk's volatile cache.
#[derive(Clone, Copy, Debug)]
pub enum Loss {
    /// Every journaled write.
    All,
    /// Each `sector` on its own: any version it held since the last
    /// barrier, chosen by `seed` (kept whole, lost, or an older rewrite).
    Sectors { sector: u64, seed: u64 },
}

/// Applies a power cut to `image` from the journal of its last run.
/// Returns how many bytes were put back.
pub fn cut_power(image: &dyn Device, undos: &[Undo], loss: Loss) -> Result<u64> {
    match loss {
        // Undo newest first: each sector ends at its oldest version.
        Loss::All => {
            for u in undos.iter().rev() {
                image.write_at(&u.old, u.offset)?;
            }
            Ok(undos.iter().map(|u| u.old.len() as u64).sum())
        }
        Loss::Sectors { sector, seed } => cut_sectors(image, undos, sector, seed),
    }
}

/// Per sector, the versions it held (oldest first, the image's current
/// bytes last), and a random choice among them.
fn cut_sectors(image: &dyn Device, undos: &[Undo], sector: u64, seed: u64) -> Result<u64> {
    use std::collections::BTreeMap;
    let mut versions: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for u in undos {
        for (start, bytes) in sector_pieces(u, sector) {
            versions.entry(start).or_default().push(bytes.to_vec());
        }
    }
    let mut rng = seed | 1;
    let mut changed = 0;
    for (start, olds) in versions {
        // xorshift64: enough to scatter the choices; reproducible by seed.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let pick = (rng % (olds.len() as u64 + 1)) as usize;
        if let Some(old) = olds.get(pick) {
            image.write_at(old, start)?;
            changed += old.len() as u64;
        }
    }
    Ok(changed)
}

/// Splits an undo record at `sector` boundaries of the device.
fn sector_pieces(u: &Undo, sector: u64) -> Vec<(u64, &[u8])> {
    let mut pieces = Vec::new();
    let mut pos = u.offset;
    let end = u.offset + u.old.len() as u64;
    while pos < end {
        let next = ((pos / sector) + 1) * sector;
        let stop = next.min(end);
        let from = (pos - u.offset) as usize;
        pieces.push((pos, &u.old[from..(stop - u.offset) as usize]));
        pos = stop;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn device(journal: &Path, barriers: Barriers) -> (Arc<MemDevice>, PowerCutDevice) {
        let mem = Arc::new(MemDevice::new(64 << 10));
        let dev = PowerCutDevice::new(mem.clone(), journal, barriers, None).unwrap();
        (mem, dev)
    }

    /// Writes covered by a barrier survive a cut; later ones are undone,
    /// the oldest version winning for a sector written twice.
    #[test]
    fn a_cut_loses_exactly_what_no_barrier_covered() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j");
        let (mem, dev) = device(&journal, Barriers::Honest);
        dev.write_at(&[1; 4096], 0).unwrap();
        dev.barrier().unwrap();
        assert!(read_journal(&journal).unwrap().is_empty());
        dev.write_at(&[2; 4096], 0).unwrap();
        dev.write_at(&[3; 4096], 0).unwrap();
        dev.write_data_at(&[4; 8192], 8192).unwrap();
        let undos = read_journal(&journal).unwrap();
        assert_eq!(undos.len(), 3);
        cut_power(mem.as_ref(), &undos, Loss::All).unwrap();
        let mut got = vec![0u8; 16384];
        mem.read_at(&mut got, 0).unwrap();
        assert!(got[..4096].iter().all(|&b| b == 1));
        assert!(got[8192..].iter().all(|&b| b == 0));
    }

    /// A subset cut leaves each sector at one of the versions it held.
    #[test]
    fn a_sector_cut_picks_a_version_per_sector() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j");
        let (mem, dev) = device(&journal, Barriers::Honest);
        dev.write_at(&[7; 65536], 0).unwrap();
        dev.write_at(&[8; 65536], 0).unwrap();
        let undos = read_journal(&journal).unwrap();
        cut_power(
            mem.as_ref(),
            &undos,
            Loss::Sectors {
                sector: 512,
                seed: 5,
            },
        )
        .unwrap();
        let mut got = vec![0u8; 65536];
        mem.read_at(&mut got, 0).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for s in got.chunks(512) {
            assert!(s.iter().all(|&b| b == s[0]), "a sector is torn inside");
            seen.insert(s[0]);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 7, 8]);
    }

    /// With barriers ignored nothing is ever forgotten.
    #[test]
    fn ignored_barriers_keep_everything_volatile() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j");
        let (_, dev) = device(&journal, Barriers::Ignored);
        dev.write_at(&[1; 512], 0).unwrap();
        dev.barrier().unwrap();
        dev.write_at(&[2; 512], 512).unwrap();
        assert_eq!(read_journal(&journal).unwrap().len(), 2);
    }

    /// A torn last record (kill -9 inside its write) is dropped.
    #[test]
    fn a_torn_last_record_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j");
        let (_, dev) = device(&journal, Barriers::Honest);
        dev.write_at(&[1; 512], 0).unwrap();
        dev.write_at(&[2; 512], 512).unwrap();
        let len = std::fs::metadata(&journal).unwrap().len();
        let f = OpenOptions::new().write(true).open(&journal).unwrap();
        f.set_len(len - 100).unwrap();
        assert_eq!(read_journal(&journal).unwrap().len(), 1);
    }
}
