//! Free extents of one block group, indexed by start and by length.
//!
//! Near-mode allocation follows the XFS rework of seed mail 004 (see
//! [`FreeIndex::near_counted`]): a bounded number of index visits whatever
//! the free space looks like, extent size before locality.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default)]
pub struct FreeIndex {
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    total: u64,
    /// For each tree block size (4 KiB << i), the bytes of whole blocks
    /// the free extents hold: a tree block fits in no hole smaller than
    /// itself, however many free bytes there are.
    whole: [u64; BLOCK_SIZES],
    /// Extents per length class (`[2^i, 2^(i+1))` bytes, the last class
    /// open-ended): how many are long enough is known without walking the
    /// by-length index.
    classes: [u32; CLASSES],
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
        self.classes[length_class(len)] += 1;
    }

    fn remove_raw(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        self.total -= len;
        self.count_whole(len, false);
        self.classes[length_class(len)] -= 1;
    }

    /// Whether more than `LAST_BLOCK` extents are `len` bytes or longer,
    /// and whether none are; from the class counts where they tell, else
    /// by walking the by-length index. Also the index entries walked.
    fn fits(&self, len: u64) -> (Fits, usize) {
        let class = length_class(len);
        let above: u64 = self.classes[class + 1..]
            .iter()
            .map(|&n| u64::from(n))
            .sum();
        let within = u64::from(self.classes[class]);
        if above > LAST_BLOCK as u64 {
            return (Fits::Many, 0);
        }
        if above + within <= LAST_BLOCK as u64 {
            return match self.by_len.range((len, 0)..).next() {
                Some(_) => (Fits::Few, 1),
                None => (Fits::None, 1),
            };
        }
        match self.by_len.range((len, 0)..).take(LAST_BLOCK + 1).count() {
            0 => (Fits::None, 1),
            n if n <= LAST_BLOCK => (Fits::Few, n),
            n => (Fits::Many, n),
        }
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

    /// The free pieces of `[start, start+len)`, in order.
    pub fn within(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let end = start + len;
        let first = self.containing(start).map_or(start, |(s, _)| s);
        self.by_start
            .range(first..end)
            .map(|(&s, &l)| (s.max(start), (s + l).min(end)))
            .filter(|&(a, b)| b > a)
            .map(|(a, b)| (a, b - a))
            .collect()
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

    /// Chooses `(start, len)` with `min <= len <= max` by size alone: the
    /// shortest extent that has all of `max` (the lowest of equals), else
    /// the largest if it has `min` (XFS's by-size mode).
    pub fn by_size(&self, min: u64, max: u64) -> Option<(u64, u64)> {
        if let Some(&(_, s)) = self.by_len.range((max, 0)..).next() {
            return Some((s, max));
        }
        let &(l, _) = self.by_len.iter().next_back()?;
        let &(_, s) = self.by_len.range((l, 0)..).next()?;
        (l >= min).then_some((s, l))
    }

    /// Chooses `(start, len)` with `min <= len <= max` near `hint`.
    pub fn near(&self, hint: u64, min: u64, max: u64) -> Option<(u64, u64)> {
        self.near_counted(hint, min, max).0
    }

    /// [`FreeIndex::near`], also returning how many index entries it
    /// visited: the work is bounded whatever the free space looks like
    /// (the allocator's tests and its micro-benchmark check it).
    ///
    /// Size wins over locality: the answer has the most of `max` any
    /// free extent gives. Among extents that give all of it, the search
    /// follows XFS's near mode (seed mail 004):
    /// 1. the extent holding the hint, if it has room from the hint on;
    /// 2. the "last block scan": when few extents are large enough (one
    ///    leaf of XFS's by-size tree), all of them, so the nearest wins;
    /// 3. otherwise the by-start index walked out from the hint both ways
    ///    and the by-length index searched near the hint within one length
    ///    class, then within the class at twice that length, and so on
    ///    (the search key increment), a step of each in turn, for a fixed
    ///    number of steps, stopping early once nothing left can be nearer.
    ///
    /// When no extent gives all of `max`, the largest ones do (nearest
    /// among equal lengths), if they give at least `min`.
    pub fn near_counted(&self, hint: u64, min: u64, max: u64) -> (Option<(u64, u64)>, usize) {
        let mut search = NearSearch::new(hint, max);
        if let Some(found) = search.in_hint_extent(self) {
            return (Some(found), search.visits);
        }
        // As XFS looks at whether its by-size lookup lands in the tree's
        // last leaf: are there few enough extents of `max` or more?
        let (fits, walked) = self.fits(max);
        search.visits += walked;
        let found = match fits {
            Fits::None => search.largest(self, min),
            Fits::Few => search.scan_all(self),
            Fits::Many => search.span(self),
        };
        (found.map(|c| (c.start, c.len)), search.visits)
    }
}

/// How many free extents are long enough for a request.
enum Fits {
    None,
    /// At most [`LAST_BLOCK`]: the last block scan looks at them all.
    Few,
    Many,
}

/// Length classes counted: the last holds every extent of 2 GiB or more.
const CLASSES: usize = 32;

/// The length class of `len`: floor(log2(len)), at most the last.
fn length_class(len: u64) -> usize {
    (63 - len.max(1).leading_zeros() as usize).min(CLASSES - 1)
}

/// Extents of the wanted length or more below which the near search looks
/// at all of them (one leaf of an on-disk by-length tree).
const LAST_BLOCK: usize = 64;
/// Steps each cursor of the combined search may take.
const SPAN_STEPS: usize = 32;

/// The state of one near-mode search.
struct NearSearch {
    hint: u64,
    max: u64,
    visits: usize,
    best: Option<Candidate>,
}

impl NearSearch {
    fn new(hint: u64, max: u64) -> NearSearch {
        NearSearch {
            hint,
            max,
            visits: 0,
            best: None,
        }
    }

    /// Reads index entry `(s, l)`: one visit, and a candidate if it gives
    /// all of `max`.
    fn consider(&mut self, s: u64, l: u64) {
        self.visits += 1;
        if l < self.max {
            return;
        }
        let c = Candidate::place(s, l, self.hint, self.max);
        if self.best.is_none_or(|b| c.better_than(&b)) {
            self.best = Some(c);
        }
    }

    /// Whether nothing at distance `d` or more can beat the best so far.
    fn settled_at(&self, d: u64) -> bool {
        self.best.is_some_and(|b| b.distance <= d)
    }

    fn in_hint_extent(&mut self, f: &FreeIndex) -> Option<(u64, u64)> {
        self.visits += 1;
        let (s, l) = f.containing(self.hint)?;
        (s + l - self.hint >= self.max).then_some((self.hint, self.max))
    }

    /// The last block scan: every extent that gives all of `max`.
    fn scan_all(&mut self, f: &FreeIndex) -> Option<Candidate> {
        for &(l, s) in f.by_len.range((self.max, 0)..) {
            self.consider(s, l);
        }
        self.best
    }

    /// Step 3: the by-start cursors and the by-length cursor in turn.
    fn span(&mut self, f: &FreeIndex) -> Option<Candidate> {
        let hint = self.hint;
        let mut left = f.by_start.range(..=hint).rev().map(|(&s, &l)| (s, l));
        let mut right = f.by_start.range(hint + 1..).map(|(&s, &l)| (s, l));
        let (mut left_on, mut right_on, mut by_len_on) = (true, true, true);
        let mut class = self.max;
        for _ in 0..SPAN_STEPS {
            if left_on {
                left_on = match left.next() {
                    Some((s, l)) => {
                        self.consider(s, l);
                        l < self.max && !self.settled_at(hint.saturating_sub(s + l))
                    }
                    None => false,
                };
            }
            if right_on {
                right_on = match right.next() {
                    Some((s, l)) => {
                        self.consider(s, l);
                        l < self.max && !self.settled_at(s - hint)
                    }
                    None => false,
                };
            }
            if by_len_on {
                match self.nearest_in_class(f, class) {
                    Some(len) => class = len.saturating_mul(2),
                    None => by_len_on = false,
                }
            }
            // Each by-start cursor stops at the nearest fit on its side (or
            // once nothing there can be nearer, or at the end): when both
            // have, nothing anywhere beats the best.
            if !(left_on || right_on) {
                break;
            }
        }
        self.best
    }

    /// Considers the extents nearest the hint on each side among those of
    /// the shortest length of at least `class`; returns that length.
    fn nearest_in_class(&mut self, f: &FreeIndex, class: u64) -> Option<u64> {
        let &(len, _) = f.by_len.range((class, 0)..).next()?;
        self.visits += 1;
        let after = f.by_len.range((len, self.hint)..=(len, u64::MAX)).next();
        let before = f.by_len.range((len, 0)..(len, self.hint)).next_back();
        for &(l, s) in after.into_iter().chain(before) {
            self.consider(s, l);
        }
        Some(len)
    }

    /// Nothing gives all of `max`: the largest extents, nearest first, if
    /// they give at least `min`.
    fn largest(&mut self, f: &FreeIndex, min: u64) -> Option<Candidate> {
        let &(len, _) = f.by_len.iter().next_back()?;
        self.visits += 1;
        if len < min {
            return None;
        }
        self.max = len;
        self.nearest_in_class(f, len)?;
        self.best
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
    fn by_size_takes_the_tightest_fit_else_the_largest() {
        let mut f = FreeIndex::default();
        f.insert(0, 64);
        f.insert(100, 16);
        f.insert(200, 32);
        assert_eq!(f.by_size(4, 16), Some((100, 16)));
        assert_eq!(f.by_size(4, 20), Some((200, 20)));
        assert_eq!(f.by_size(4, 100), Some((0, 64)));
        assert_eq!(f.by_size(65, 100), None);
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
