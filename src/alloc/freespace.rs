//! Free extents of one block group, indexed by start and by length.
//!
//! Near-mode allocation follows the XFS rework in `shared/seeds/004_…`: look
//! at the extent holding the hint first ("last block scan"), then search the
//! by-length index (extents big enough, nearest the hint among them) and the
//! by-start index (walking out from the hint both ways) together, each for a
//! bounded number of steps, and take the candidate that gives the most of the
//! wanted length, nearest the hint. The bound keeps the worst case fixed
//! however fragmented the group is; extent size wins over locality.

use std::collections::{BTreeMap, BTreeSet};

/// How many index entries each side of the near search may visit.
const SEARCH_LIMIT: usize = 32;

#[derive(Clone, Debug, Default)]
pub struct FreeIndex {
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    total: u64,
    /// For each tree block size (4 KiB << i), the bytes of whole blocks
    /// the free extents hold: a tree block fits in no hole smaller than
    /// itself, however many free bytes there are.
    whole: [u64; BLOCK_SIZES],
}

/// Tree block sizes tracked by [`FreeIndex::whole_blocks`]: 4 KiB to 64 KiB.
const BLOCK_SIZES: usize = 5;
const SMALLEST_BLOCK: u64 = 4096;

impl FreeIndex {
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Free bytes in whole `block`-sized pieces (`block` a power of two
    /// from 4 KiB to 64 KiB; any other size counts every extent).
    pub fn whole_blocks(&self, block: u64) -> u64 {
        match Self::size_index(block) {
            Some(i) => self.whole[i],
            None => self.iter().map(|(_, l)| l / block.max(1) * block).sum(),
        }
    }

    fn size_index(block: u64) -> Option<usize> {
        (0..BLOCK_SIZES).find(|&i| SMALLEST_BLOCK << i == block)
    }

    fn count_whole(&mut self, len: u64, add: bool) {
        for (i, w) in self.whole.iter_mut().enumerate() {
            let b = SMALLEST_BLOCK << i;
            let bytes = len / b * b;
            *w = if add { *w + bytes } else { *w - bytes };
        }
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    fn add_raw(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        self.total += len;
        self.count_whole(len, true);
    }

    fn remove_raw(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        self.total -= len;
        self.count_whole(len, false);
    }

    /// The free extent containing `at`, if any.
    fn containing(&self, at: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.by_start.range(..=at).next_back()?;
        (at < s + l).then_some((s, l))
    }

    /// Marks `[start, start+len)` free, merging with neighbours. Returns
    /// false (and changes nothing) if any of it is already free.
    pub fn insert(&mut self, start: u64, len: u64) -> bool {
        let end = start + len;
        if self.containing(start).is_some() || self.by_start.range(start..end).next().is_some() {
            return false;
        }
        let (mut s, mut e) = (start, end);
        if let Some((ls, ll)) = self
            .by_start
            .range(..start)
            .next_back()
            .map(|(&a, &b)| (a, b))
        {
            if ls + ll == start {
                self.remove_raw(ls, ll);
                s = ls;
            }
        }
        if let Some(&rl) = self.by_start.get(&end) {
            self.remove_raw(end, rl);
            e = end + rl;
        }
        self.add_raw(s, e - s);
        true
    }

    pub fn contains(&self, start: u64, len: u64) -> bool {
        self.containing(start)
            .is_some_and(|(s, l)| start + len <= s + l)
    }

    /// Marks `[start, start+len)` used; it must lie in one free extent.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        let Some((s, l)) = self
            .containing(start)
            .filter(|&(s, l)| start + len <= s + l)
        else {
            return false;
        };
        self.remove_raw(s, l);
        if start > s {
            self.add_raw(s, start - s);
        }
        if start + len < s + l {
            self.add_raw(start + len, s + l - start - len);
        }
        true
    }

    /// Chooses `(start, len)` with `min <= len <= max` near `hint`.
    pub fn near(&self, hint: u64, min: u64, max: u64) -> Option<(u64, u64)> {
        let mut best: Option<Candidate> = None;
        if let Some((s, l)) = self.containing(hint) {
            let room = s + l - hint;
            if room >= max {
                return Some((hint, max));
            }
            if room >= min {
                best = Some(Candidate {
                    start: hint,
                    len: room,
                    distance: 0,
                });
            }
        }
        let mut consider = |s: u64, l: u64| {
            if l < min {
                return;
            }
            let c = Candidate::place(s, l, hint, max);
            if best.is_none_or(|b| c.better_than(&b)) {
                best = Some(c);
            }
        };
        // By length: extents that satisfy `max`, nearest the hint; if none,
        // the largest ones that satisfy `min`.
        let want = max.max(min);
        let big_enough = self.by_len.range((want, 0)..).take(SEARCH_LIMIT);
        let mut any_big = false;
        for &(l, s) in big_enough {
            any_big = true;
            consider(s, l);
        }
        if !any_big {
            for &(l, s) in self.by_len.range((min, 0)..).rev().take(SEARCH_LIMIT) {
                consider(s, l);
            }
        }
        // By start: walk outwards from the hint.
        for (&s, &l) in self.by_start.range(..hint).rev().take(SEARCH_LIMIT) {
            consider(s, l);
        }
        for (&s, &l) in self.by_start.range(hint..).take(SEARCH_LIMIT) {
            consider(s, l);
        }
        best.map(|c| (c.start, c.len))
    }
}

#[derive(Clone, Copy)]
struct Candidate {
    start: u64,
    len: u64,
    distance: u64,
}

impl Candidate {
    /// Places an allocation of up to `max` bytes in free extent `(s, l)` as
    /// close to `hint` as it can go.
    fn place(s: u64, l: u64, hint: u64, max: u64) -> Candidate {
        let len = l.min(max);
        let start = if hint <= s {
            s
        } else {
            (s + l - len).min(hint)
        };
        Candidate {
            start,
            len,
            distance: start.abs_diff(hint),
        }
    }

    fn better_than(&self, other: &Candidate) -> bool {
        (self.len, std::cmp::Reverse(self.distance))
            > (other.len, std::cmp::Reverse(other.distance))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut f = FreeIndex::default();
        assert!(f.insert(0, 10));
        assert!(f.insert(20, 10));
        assert!(f.insert(10, 10));
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0, 30)]);
        assert!(!f.insert(5, 1));
        assert!(f.remove(10, 5));
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![(0, 10), (15, 15)]);
        assert_eq!(f.total(), 25);
        assert!(!f.remove(9, 2));
    }

    #[test]
    fn near_prefers_hint_then_size_then_distance() {
        let mut f = FreeIndex::default();
        f.insert(0, 4);
        f.insert(100, 16);
        f.insert(1000, 64);
        assert_eq!(f.near(102, 4, 4), Some((102, 4)));
        assert_eq!(f.near(990, 16, 16), Some((1000, 16)));
        // Size first: only the 64-byte extent satisfies 32.
        assert_eq!(f.near(0, 1, 32), Some((1000, 32)));
        // Partial: nothing has 128; best is the longest.
        assert_eq!(f.near(0, 8, 128), Some((1000, 64)));
        assert_eq!(f.near(0, 100, 128), None);
    }
}
