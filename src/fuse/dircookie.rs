//! Directory offsets that say where their listing ends, ordered as the
//! listing is.
//!
//! Every rename gives the entry a new, higher index, so a listing that
//! follows the indexes would meet the entries it renamed again and never
//! end (`for f in *; do mv $f $f.x; done` on a huge directory). Like btrfs,
//! a listing stops at the highest index the directory had when it began:
//! taken at a read from offset 0 (opendir or rewinddir, which must see the
//! directory as it is then) and carried in every offset handed to the
//! kernel after it, which gives each back to continue. So no state is
//! kept per open directory, and the kernel need not open directories at
//! all (zero-message opendir: two round trips fewer per directory).
//!
//! Offsets stay in 1..2^63-1: the kernel's directory `lseek` refuses any
//! above the largest file offset, so `seekdir(telldir())` and a listing
//! resumed from a saved cookie would end early.
//!
//! Programs also seek to offsets no listing handed out (a position between
//! two they were given, or any number below the last), and expect the
//! listing to go on from there as btrfs's and ext4's do. So offsets grow
//! with the index they continue from, whatever the bound: the next index
//! is in the high bits and the bound in the low ones.
//!
//! - Bit 62 clear: bits 31..62 hold the next index (below 2^31), bits
//!   0..23 how far the bound lies past it (`gap`: exact below 2^17, above
//!   that rounded up, which only lets a listing see a few entries made
//!   after it began) and bits 23..31 a check of both. An offset whose check
//!   fails was never handed out: it continues from its next index, bounded
//!   at the directory's highest index now, as a listing begun there would.
//! - Bit 62 set: bits 0..62 are the next index itself (2^31 and above),
//!   with no bound. Directory indexes count the names ever made in a
//!   directory and stay far below 2^62; the item checker refuses any above
//!   `format::checker::MAX_DIR_INDEX` (2^62-2), so every next index fits.

/// Where a listing resumed at an offset goes on.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Resume {
    /// The highest index to list, or None: the directory's highest now.
    pub last: Option<u64>,
    /// The first index to list (0 and 1 are "." and "..").
    pub next: u64,
}

const WIDE: u64 = 1 << 62;
const NEXT_SHIFT: u32 = 31;
const NARROW_NEXT_LIMIT: u64 = 1 << 31;
const GAP_BITS: u32 = 23;
const CHECK_SHIFT: u32 = GAP_BITS;
const CHECK_MASK: u64 = 0xff;
/// The gap's form: a mantissa of 17 bits shifted by an exponent of 6.
const MANTISSA_BITS: u32 = 17;
const MANTISSA_MASK: u64 = (1 << MANTISSA_BITS) - 1;

/// The offset to continue a listing bounded by `last` after the entry
/// whose next index is `next` (at least 1: 0 means the start).
pub(super) fn encode(last: u64, next: u64) -> u64 {
    if next >= NARROW_NEXT_LIMIT {
        return WIDE | next.min(WIDE - 1);
    }
    let gap = encode_gap((last + 1).saturating_sub(next));
    next << NEXT_SHIFT | check(next, gap) << CHECK_SHIFT | gap
}

/// Where a listing resumed at `offset` goes on. An offset above 2^63-1
/// (which the kernel never passes) lists nothing.
pub(super) fn decode(offset: u64) -> Resume {
    if offset > WIDE | (WIDE - 1) {
        return Resume {
            last: Some(0),
            next: u64::MAX,
        };
    }
    if offset & WIDE != 0 {
        return Resume {
            last: None,
            next: offset & (WIDE - 1),
        };
    }
    let next = offset >> NEXT_SHIFT;
    let gap = offset & ((1 << GAP_BITS) - 1);
    let handed_out = next > 0 && offset >> CHECK_SHIFT & CHECK_MASK == check(next, gap);
    Resume {
        last: handed_out.then(|| next.saturating_add(decode_gap(gap)).saturating_sub(1)),
        next,
    }
}

/// `gap` rounded up to the 23-bit form.
fn encode_gap(gap: u64) -> u64 {
    let mut exponent = 0u32;
    while gap.div_ceil(1 << exponent) > MANTISSA_MASK {
        exponent += 1;
    }
    u64::from(exponent) << MANTISSA_BITS | gap.div_ceil(1 << exponent)
}

fn decode_gap(code: u64) -> u64 {
    (code & MANTISSA_MASK).saturating_mul(1 << (code >> MANTISSA_BITS))
}

/// Eight bits that an offset handed out for (`next`, `gap`) carries, so
/// that a number a program made up is rarely taken for a bound.
fn check(next: u64, gap: u64) -> u64 {
    let mixed = (next << GAP_BITS | gap).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed >> 56 & CHECK_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest offset the kernel lets a directory `lseek` to.
    const MAX_OFFSET: u64 = i64::MAX as u64;

    #[test]
    fn offsets_carry_the_bound() {
        for (last, next) in [(1, 1), (2, 3), (5000, 17), ((1 << 31) - 2, (1 << 31) - 1)] {
            let r = decode(encode(last, next));
            assert_eq!(
                r,
                Resume {
                    last: Some(last),
                    next
                }
            );
        }
        // A far bound is rounded up, never down.
        for (last, next) in [(1 << 40, 5), (u64::MAX - 1, 3), (300_001, 2)] {
            let r = decode(encode(last, next));
            assert_eq!(r.next, next);
            let got = r.last.unwrap();
            assert!(
                got >= last && got - last <= (last - next) >> 16,
                "{last} -> {got}"
            );
        }
        assert_eq!(
            decode(encode(7, 1 << 40)),
            Resume {
                last: None,
                next: 1 << 40
            }
        );
        assert_eq!(
            decode(0),
            Resume {
                last: None,
                next: 0
            }
        );
    }

    /// seekdir and a directory lseek take offsets up to 2^63-1 only.
    #[test]
    fn every_offset_is_a_valid_file_offset() {
        for (last, next) in [
            (1, 1),
            ((1 << 31) - 1, (1 << 31) - 1),
            (1 << 62, (1 << 62) - 1),
        ] {
            let at = encode(last, next);
            assert!((1..=MAX_OFFSET).contains(&at), "{last} {next} -> {at:#x}");
        }
        assert_eq!(decode(u64::MAX).next, u64::MAX);
    }

    /// Offsets sort as the entries they continue after, so any number
    /// between two offsets continues at or before the later one.
    #[test]
    fn offsets_grow_with_the_index() {
        let lasts = [3u64, 900, 1 << 20, 1 << 33];
        let mut prev = 0;
        for next in (1..5000u64).chain([(1 << 31) - 1, 1 << 31, 1 << 40]) {
            let lowest = lasts.iter().map(|&l| encode(l, next)).min().unwrap();
            assert!(lowest > prev, "next {next}");
            prev = lasts.iter().map(|&l| encode(l, next)).max().unwrap();
        }
    }

    /// A number no listing handed out is rarely taken for a bound, and
    /// then one past the listing's entries.
    #[test]
    fn made_up_offsets_list_on() {
        let mut state = 0x1234_5678u64;
        let mut bounded = 0;
        for _ in 0..100_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let r = decode(state >> 33);
            if let Some(last) = r.last {
                bounded += 1;
                assert!(last + 1 >= r.next);
            }
        }
        assert!(bounded < 1_000, "{bounded} made-up offsets taken as bounds");
    }
}
