//! The near-mode allocator (`alloc::FreeIndex`, seed mail 004) against a
//! plain model of free space: random shapes and the worst ones (many
//! extents of one size, alternating holes), checking size first, then
//! locality within the search's bound, and a fixed number of index visits
//! whatever the shape.

use canopy::alloc::FreeIndex;
use proptest::prelude::*;

const UNIT: u64 = 4096;
/// The search's constants (see `alloc::freespace`): extents big enough
/// below which every one is looked at, and steps per cursor otherwise.
const LAST_BLOCK: usize = 64;
const SPAN_STEPS: usize = 32;
/// The most index entries one search may visit, whatever the shape.
const VISIT_BOUND: usize = 1 + (LAST_BLOCK + 1) + 5 * SPAN_STEPS;

/// Free extents `(start, len)` in bytes, sorted and apart.
fn shape() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let random = prop::collection::vec((1u64..64, 1u64..256), 1..400);
    let equal = (1u64..8, 1u64..64, 50usize..2000)
        .prop_map(|(gap, len, n)| (0..n).map(|_| (gap, len)).collect::<Vec<_>>());
    let alternating = (1usize..3000).prop_map(|n| (0..n).map(|_| (1, 1)).collect::<Vec<_>>());
    // Many small extents, then more large ones than the last block scan
    // takes.
    let small_then_large = (100usize..3000, 65usize..200).prop_map(|(small, large)| {
        let mut v: Vec<(u64, u64)> = (0..small).map(|_| (1, 1)).collect();
        v.extend((0..large).map(|_| (64, 128)));
        v
    });
    prop_oneof![random, equal, alternating, small_then_large].prop_map(|gaps| {
        let mut at = 0;
        gaps.into_iter()
            .map(|(gap, len)| {
                at += gap * UNIT;
                let e = (at, len * UNIT);
                at += len * UNIT;
                e
            })
            .collect()
    })
}

fn index_of(free: &[(u64, u64)]) -> FreeIndex {
    let mut f = FreeIndex::default();
    for &(s, l) in free {
        assert!(f.insert(s, l));
    }
    f
}

/// Where an allocation of `len` in extent `(s, l)` lands nearest `hint`,
/// and how far from it.
fn placed(s: u64, l: u64, hint: u64, len: u64) -> u64 {
    let start = if hint <= s {
        s
    } else {
        (s + l - len).min(hint)
    };
    start.abs_diff(hint)
}

/// The nearest placement among `extents`.
fn nearest(extents: impl Iterator<Item = (u64, u64)>, hint: u64, len: u64) -> Option<u64> {
    extents.map(|(s, l)| placed(s, l, hint, len)).min()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)))]

    #[test]
    fn near_gives_the_most_it_can_near_the_hint(
        free in shape(),
        hint_at in 0.0f64..1.2,
        min_units in 1u64..64,
        extra in 0u64..128,
    ) {
        let f = index_of(&free);
        let end = free.last().map_or(0, |&(s, l)| s + l);
        let hint = (end as f64 * hint_at) as u64 / UNIT * UNIT;
        let (min, max) = (min_units * UNIT, (min_units + extra) * UNIT);
        let (got, visits) = f.near_counted(hint, min, max);
        prop_assert!(visits <= VISIT_BOUND, "{visits} visits");

        let largest = free.iter().map(|e| e.1).max().unwrap_or(0);
        let Some((start, len)) = got else {
            prop_assert!(largest < min, "nothing found though {largest} bytes are free in one piece");
            return Ok(());
        };
        // Size first: all of max where an extent has it, else the largest.
        prop_assert_eq!(len, max.min(largest));
        prop_assert!(free.iter().any(|&(s, l)| start >= s && start + len <= s + l),
            "({start}, {len}) is not inside free space");
        // Locality among the extents that give `len`.
        let fits: Vec<(u64, u64)> = free.iter().copied().filter(|e| e.1 >= len).collect();
        let distance = start.abs_diff(hint);
        let best = nearest(fits.iter().copied(), hint, len).unwrap_or(0);
        if fits.len() <= LAST_BLOCK || len < max {
            // Every candidate was looked at, or the nearest of the
            // largest class (which is all of them) was.
            prop_assert_eq!(distance, best);
        } else {
            // The bound: no farther than the nearest candidate of the
            // smallest length class that fits, nor than any candidate
            // among the by-start neighbours each cursor reaches.
            let class = fits.iter().map(|e| e.1).min().unwrap_or(0);
            let in_class = nearest(fits.iter().copied().filter(|e| e.1 == class), hint, len);
            let left = free.iter().rev().filter(|e| e.0 <= hint).take(SPAN_STEPS);
            let right = free.iter().filter(|e| e.0 > hint).take(SPAN_STEPS);
            let near_by = nearest(left.chain(right).copied().filter(|e| e.1 >= len), hint, len);
            let bound = in_class.into_iter().chain(near_by).min().unwrap_or(u64::MAX);
            prop_assert!(distance <= bound, "distance {distance} past the bound {bound} (best {best})");
        }
    }

    #[test]
    fn allocations_stay_in_free_space_and_never_overlap(
        free in shape(),
        ops in prop::collection::vec((any::<bool>(), 0.0f64..1.0, 1u64..32, 0u64..64), 1..300),
    ) {
        let mut f = index_of(&free);
        let end = free.last().map_or(0, |&(s, l)| s + l);
        // The model: which units are free.
        let mut unit_free = vec![false; (end / UNIT) as usize];
        for &(s, l) in &free {
            unit_free[(s / UNIT) as usize..((s + l) / UNIT) as usize].fill(true);
        }
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for (alloc, at, min_units, extra) in ops {
            if alloc || taken.is_empty() {
                let hint = (end as f64 * at) as u64 / UNIT * UNIT;
                let (min, max) = (min_units * UNIT, (min_units + extra) * UNIT);
                let Some((s, l)) = f.near(hint, min, max) else { continue };
                prop_assert!(l >= min && l <= max);
                let units = (s / UNIT) as usize..((s + l) / UNIT) as usize;
                prop_assert!(unit_free[units.clone()].iter().all(|&u| u),
                    "({s}, {l}) overlaps used space");
                prop_assert!(f.remove(s, l));
                unit_free[units].fill(false);
                taken.push((s, l));
            } else {
                let (s, l) = taken.swap_remove((at * taken.len() as f64) as usize % taken.len());
                prop_assert!(f.insert(s, l));
                unit_free[(s / UNIT) as usize..((s + l) / UNIT) as usize].fill(true);
            }
            let model_free = unit_free.iter().filter(|&&u| u).count() as u64 * UNIT;
            prop_assert_eq!(f.total(), model_free);
        }
    }
}

/// The worst shapes cost no more visits than a clean one's bound.
#[test]
fn worst_shapes_finish_within_a_fixed_number_of_visits() {
    let equal: Vec<(u64, u64)> = (0..200_000).map(|i| (i * 2 * UNIT, UNIT)).collect();
    let f = index_of(&equal);
    for hint in [0, 1 << 30, 3 << 30] {
        let (got, visits) = f.near_counted(hint, UNIT, UNIT);
        assert!(got.is_some() && visits <= VISIT_BOUND, "{visits}");
        // Asking for more than any extent has: the largest, bounded too.
        let (got, visits) = f.near_counted(hint, UNIT, 16 * UNIT);
        assert_eq!(got.map(|g| g.1), Some(UNIT));
        assert!(visits <= VISIT_BOUND, "{visits}");
    }
    // Small extents all around the hint and the large ones far away: the
    // by-start cursors must stop after their steps.
    let mut far: Vec<(u64, u64)> = (0..100_000).map(|i| (i * 2 * UNIT, UNIT)).collect();
    far.extend((0..100).map(|i| ((300_000 + i * 128) * UNIT, 64 * UNIT)));
    let (got, visits) = index_of(&far).near_counted(50_000 * 2 * UNIT, UNIT, 8 * UNIT);
    assert!(visits <= VISIT_BOUND, "{visits}");
    assert_eq!(got, Some((300_000 * UNIT, 8 * UNIT)));
    // Many large extents: the span search, not a scan of all of them.
    let big: Vec<(u64, u64)> = (0..100_000).map(|i| (i * 64 * UNIT, 32 * UNIT)).collect();
    let (got, visits) = index_of(&big).near_counted(5_000 * 64 * UNIT + 40 * UNIT, UNIT, 8 * UNIT);
    assert!(visits <= VISIT_BOUND, "{visits}");
    // The nearest candidate is the end of the extent before the hint (16
    // units away; the next one starts 24 units away).
    assert_eq!(got, Some((5_000 * 64 * UNIT + 24 * UNIT, 8 * UNIT)));
}
