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
//! An offset with bit 63 set holds the last index in bits 32..63 and the
//! next index to list in bits 0..32; one without is a plain next index
//! (unbounded), used when either number does not fit.

const BOUNDED: u64 = 1 << 63;
const FIELD: u64 = (1 << 31) - 1;

/// The offset to continue a listing bounded by `last` after the entry
/// whose next index is `next`.
pub(super) fn encode(last: u64, next: u64) -> u64 {
    if last > FIELD || next > 0xffff_ffff {
        return next;
    }
    BOUNDED | last << 32 | next
}

/// (last index to list, if bounded; next index to list) of `offset`.
pub(super) fn decode(offset: u64) -> (Option<u64>, u64) {
    if offset & BOUNDED == 0 {
        return (None, offset);
    }
    (Some((offset >> 32) & FIELD), offset & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_carry_the_bound_when_it_fits() {
        for (last, next) in [(1, 1), (2, 3), (FIELD, 0xffff_ffff), (5000, 17)] {
            assert_eq!(decode(encode(last, next)), (Some(last), next));
        }
        assert_eq!(decode(encode(FIELD + 1, 3)), (None, 3));
        assert_eq!(decode(encode(7, 1 << 40)), (None, 1 << 40));
        assert_eq!(decode(encode(u64::MAX, 9)), (None, 9));
        assert_eq!(decode(0), (None, 0));
    }
}
