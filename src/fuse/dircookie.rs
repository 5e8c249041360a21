//! Directory offsets that say where their listing ends.
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
//! resumed from a saved cookie would end early. An offset with bit 62 set
//! holds the last index in bits 32..62 and the next index to list in bits
//! 0..32; one without is a plain next index (unbounded), used when either
//! number does not fit. Directory indexes count the names ever made in a
//! directory and stay far below 2^62; the item checker refuses any above
//! `format::checker::MAX_DIR_INDEX` (2^62-2), so the next index always
//! fits the unbounded form and no listing can hand out one offset twice.

const BOUNDED: u64 = 1 << 62;
const LAST_FIELD: u64 = (1 << 30) - 1;
const NEXT_FIELD: u64 = 0xffff_ffff;
/// The largest offset the kernel lets a directory `lseek` to.
const MAX_OFFSET: u64 = i64::MAX as u64;

/// The offset to continue a listing bounded by `last` after the entry
/// whose next index is `next` (at least 1: 0 means the start).
pub(super) fn encode(last: u64, next: u64) -> u64 {
    if last > LAST_FIELD || next > NEXT_FIELD {
        return next.min(BOUNDED - 1);
    }
    BOUNDED | last << 32 | next
}

/// (last index to list, if bounded; next index to list) of `offset`. An
/// offset no listing handed out (above 2^63-1) lists nothing.
pub(super) fn decode(offset: u64) -> (Option<u64>, u64) {
    if offset > MAX_OFFSET {
        return (Some(0), u64::MAX);
    }
    if offset & BOUNDED == 0 {
        return (None, offset);
    }
    (Some((offset >> 32) & LAST_FIELD), offset & NEXT_FIELD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_carry_the_bound_when_it_fits() {
        for (last, next) in [(1, 1), (2, 3), (LAST_FIELD, NEXT_FIELD), (5000, 17)] {
            assert_eq!(decode(encode(last, next)), (Some(last), next));
        }
        assert_eq!(decode(encode(LAST_FIELD + 1, 3)), (None, 3));
        assert_eq!(decode(encode(7, 1 << 40)), (None, 1 << 40));
        assert_eq!(decode(encode(u64::MAX, 9)), (None, 9));
        assert_eq!(decode(0), (None, 0));
    }

    /// seekdir and a directory lseek take offsets up to 2^63-1 only.
    #[test]
    fn every_offset_is_a_valid_file_offset() {
        for (last, next) in [
            (1, 1),
            (LAST_FIELD, NEXT_FIELD),
            (LAST_FIELD + 1, NEXT_FIELD + 1),
            (u64::MAX, u64::MAX),
        ] {
            let at = encode(last, next);
            assert!((1..=MAX_OFFSET).contains(&at), "{last} {next} -> {at:#x}");
        }
        assert_eq!(decode(u64::MAX).1, u64::MAX);
    }
}
