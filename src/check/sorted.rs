//! Records sorted within a memory budget: what lets `check` relate items
//! that lie far apart in the trees (an entry and the back-reference of
//! the inode it names, a file extent and its checksum item) whatever the
//! image's size.
//!
//! A record is a fixed array of `u64`s, ordered as an array. Records are
//! kept in memory until the budget is reached, then sorted and written to
//! an unlinked temporary file (a run); reading merges the runs. An image
//! whose records fit the budget never touches a file.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

/// Records of `N` words, sorted by [`Sorter::sorted`].
pub(super) struct Sorter<const N: usize> {
    held: Vec<[u64; N]>,
    /// Records held in memory before a run is written.
    limit: usize,
    runs: Vec<File>,
}

/// An empty sorter on the smallest budget: what stays behind where a
/// sorter's records were taken to be read.
impl<const N: usize> Default for Sorter<N> {
    fn default() -> Sorter<N> {
        Sorter::new(0)
    }
}

impl<const N: usize> Sorter<N> {
    /// A sorter holding at most `budget` bytes of records in memory.
    pub fn new(budget: u64) -> Sorter<N> {
        let bytes = std::mem::size_of::<[u64; N]>() as u64;
        Sorter {
            held: Vec::new(),
            limit: (budget / bytes).max(1024) as usize,
            runs: Vec::new(),
        }
    }

    pub fn push(&mut self, record: [u64; N]) -> std::io::Result<()> {
        if self.held.len() == self.held.capacity() {
            // Grow by doubling, but never past the limit.
            let want = (self.held.capacity() * 2).clamp(64, self.limit);
            self.held.reserve_exact(want - self.held.len());
        }
        self.held.push(record);
        if self.held.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Writes what memory holds as one sorted run.
    fn spill(&mut self) -> std::io::Result<()> {
        self.held.sort_unstable();
        let mut file = temporary_file()?;
        let mut out = BufWriter::with_capacity(1 << 16, &mut file);
        for r in &self.held {
            for w in r {
                out.write_all(&w.to_le_bytes())?;
            }
        }
        out.flush()?;
        drop(out);
        file.seek(SeekFrom::Start(0))?;
        self.runs.push(file);
        self.held.clear();
        Ok(())
    }

    /// Every record pushed, in order (duplicates kept).
    pub fn sorted(mut self) -> std::io::Result<Sorted<N>> {
        if self.runs.is_empty() {
            self.held.sort_unstable();
            return Ok(Sorted::Memory(self.held.into_iter()));
        }
        if !self.held.is_empty() {
            self.spill()?;
        }
        self.held = Vec::new();
        let mut runs: Vec<Run<N>> = self
            .runs
            .into_iter()
            .map(|f| Run {
                reader: BufReader::with_capacity(1 << 16, f),
            })
            .collect();
        let mut heap = BinaryHeap::new();
        for (i, run) in runs.iter_mut().enumerate() {
            if let Some(r) = run.next()? {
                heap.push(Reverse((r, i)));
            }
        }
        Ok(Sorted::Merge { runs, heap })
    }
}

/// An unlinked file in the temporary directory ($TMPDIR, else /tmp).
fn temporary_file() -> std::io::Result<File> {
    let dir = std::env::temp_dir();
    for attempt in 0..64u32 {
        let path = dir.join(format!(
            "canopy-check-{}-{}-{attempt}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "no free name for a temporary file in the temporary directory",
    ))
}

pub(super) struct Run<const N: usize> {
    reader: BufReader<File>,
}

impl<const N: usize> Run<N> {
    fn next(&mut self) -> std::io::Result<Option<[u64; N]>> {
        let mut record = [0u64; N];
        let mut word = [0u8; 8];
        for (i, w) in record.iter_mut().enumerate() {
            match self.reader.read_exact(&mut word) {
                Ok(()) => *w = u64::from_le_bytes(word),
                Err(e) if i == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Some(record))
    }
}

/// The records of a [`Sorter`] in order.
pub(super) enum Sorted<const N: usize> {
    Memory(std::vec::IntoIter<[u64; N]>),
    Merge {
        runs: Vec<Run<N>>,
        heap: BinaryHeap<Reverse<([u64; N], usize)>>,
    },
}

impl<const N: usize> Sorted<N> {
    pub fn next(&mut self) -> std::io::Result<Option<[u64; N]>> {
        match self {
            Sorted::Memory(it) => Ok(it.next()),
            Sorted::Merge { runs, heap } => {
                let Some(Reverse((r, i))) = heap.pop() else {
                    return Ok(None);
                };
                if let Some(next) = runs[i].next()? {
                    heap.push(Reverse((next, i)));
                }
                Ok(Some(r))
            }
        }
    }

    /// The next record, without taking it.
    pub fn peek(&mut self) -> std::io::Result<Option<[u64; N]>> {
        match self {
            Sorted::Memory(it) => Ok(it.as_slice().first().copied()),
            Sorted::Merge { heap, .. } => Ok(heap.peek().map(|Reverse((r, _))| *r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drain<const N: usize>(mut s: Sorted<N>) -> Vec<[u64; N]> {
        let mut out = Vec::new();
        while let Some(r) = s.next().unwrap() {
            out.push(r);
        }
        out
    }

    proptest! {
        /// Whether it spills or not, the records come back as a sort of
        /// them would give them.
        #[test]
        fn sorts_like_a_sort(records in prop::collection::vec((0u64..50, any::<u64>()), 0..5000),
                             budget in prop::sample::select(vec![0u64, 16 << 10, 1 << 30])) {
            let mut s = Sorter::<2>::new(budget);
            for &(a, b) in &records {
                s.push([a, b]).unwrap();
            }
            let mut want: Vec<[u64; 2]> = records.iter().map(|&(a, b)| [a, b]).collect();
            want.sort_unstable();
            prop_assert_eq!(drain(s.sorted().unwrap()), want);
        }
    }

    #[test]
    fn spills_past_the_budget() {
        let mut s = Sorter::<1>::new(0);
        for i in (0..5000u64).rev() {
            s.push([i]).unwrap();
        }
        assert_eq!(s.runs.len(), 4);
        let got = drain(s.sorted().unwrap());
        assert_eq!(got, (0..5000u64).map(|i| [i]).collect::<Vec<_>>());
    }
}
