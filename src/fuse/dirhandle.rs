//! Open directory handles: where each listing ends.
//!
//! Every rename gives the entry a new, higher index, so a listing that
//! follows the indexes would meet the entries it renamed again and never
//! end (`for f in *; do mv $f $f.x; done` on a huge directory). Like btrfs,
//! a listing stops at the highest index the directory had when it began:
//! taken at the first read from offset 0 (after opendir, or after
//! rewinddir, which must see the directory as it is then).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub(super) struct DirHandles {
    next: AtomicU64,
    /// Handle → the last index its listing shows.
    last: Mutex<HashMap<u64, u64>>,
}

impl DirHandles {
    /// A new handle (never 0); its bound is set by its first listing.
    pub fn open(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The last index the listing on `fh` from `offset` shows: read anew
    /// by `now` at offset 0, remembered after.
    pub fn bound(
        &self,
        fh: u64,
        offset: u64,
        now: impl FnOnce() -> crate::Result<u64>,
    ) -> crate::Result<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if offset == 0 {
            let at = now()?;
            last.insert(fh, at);
            return Ok(at);
        }
        // A handle whose start was never read here (none should be) lists
        // to the end.
        Ok(last.get(&fh).copied().unwrap_or(u64::MAX))
    }

    pub fn release(&self, fh: u64) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_taken_at_offset_zero_and_kept() {
        let h = DirHandles::default();
        let fh = h.open();
        assert_ne!(fh, 0);
        assert_eq!(h.bound(fh, 0, || Ok(10)).unwrap(), 10);
        assert_eq!(h.bound(fh, 5, || Ok(99)).unwrap(), 10, "kept");
        assert_eq!(h.bound(fh, 0, || Ok(20)).unwrap(), 20, "rewound");
        h.release(fh);
        assert_eq!(h.bound(fh, 5, || Ok(1)).unwrap(), u64::MAX);
        assert!(h.bound(fh, 0, || Err(crate::Error::NotFound)).is_err());
    }
}
