//! Sets of byte ranges, kept merged.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent ranges `[start, end)`: a random writer adds
/// tens of thousands in one transaction, so each insert must cost
/// O(log n), not a sort of all of them.
#[derive(Default)]
pub(crate) struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    pub(crate) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // A range starting at or before `start` that reaches it.
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.0.remove(&s);
            }
        }
        // Ranges starting inside (or right at the end of) the new one.
        while let Some((&s, &e)) = self.0.range(start..=end).next() {
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// Takes `[start, end)` out of the set.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let hit: Vec<(u64, u64)> = self
            .0
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hit {
            self.0.remove(&s);
            if s < start {
                self.0.insert(s, start);
            }
            if e > end {
                self.0.insert(end, e);
            }
        }
    }

    /// Whether some range of the set overlaps `[start, end)`.
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    pub(crate) fn to_vec(&self) -> Vec<(u64, u64)> {
        self.0.iter().map(|(&s, &e)| (s, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        /// The set holds exactly the union of what was inserted, as
        /// disjoint, non-adjacent ranges in order.
        #[test]
        fn range_set_is_the_union_of_its_inserts(
            inserts in proptest::collection::vec((0u64..200, 0u64..40), 0..60)
        ) {
            let mut set = super::RangeSet::default();
            let mut model = [false; 240];
            for &(s, len) in &inserts {
                set.insert(s, s + len);
                model[s as usize..(s + len) as usize].fill(true);
            }
            let got = set.to_vec();
            for w in got.windows(2) {
                proptest::prop_assert!(w[0].1 < w[1].0, "{:?} not disjoint", got);
            }
            let mut covered = [false; 240];
            for &(s, e) in &got {
                proptest::prop_assert!(s < e);
                covered[s as usize..e as usize].fill(true);
            }
            proptest::prop_assert_eq!(covered, model);
        }

        /// Removes take exactly their ranges out, and `overlaps` agrees
        /// with the bytes left.
        #[test]
        fn removes_and_overlaps_follow_the_model(
            ops in proptest::collection::vec((proptest::bool::ANY, 0u64..200, 0u64..40), 0..80),
            probes in proptest::collection::vec((0u64..200, 1u64..40), 0..20)
        ) {
            let mut set = super::RangeSet::default();
            let mut model = [false; 240];
            for &(add, s, len) in &ops {
                match add {
                    true => set.insert(s, s + len),
                    false => set.remove(s, s + len),
                }
                model[s as usize..(s + len) as usize].fill(add);
            }
            let mut covered = [false; 240];
            for &(s, e) in &set.to_vec() {
                proptest::prop_assert!(s < e);
                covered[s as usize..e as usize].fill(true);
            }
            proptest::prop_assert_eq!(covered, model);
            for &(s, len) in &probes {
                let any = model[s as usize..(s + len) as usize].iter().any(|&b| b);
                proptest::prop_assert_eq!(set.overlaps(s, s + len), any);
            }
        }
    }
}
