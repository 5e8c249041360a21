//! Read-ahead of file data on the device for sequential readers.
//!
//! The kernel asks a FUSE daemon for a file 128 KiB at a time, and each of
//! those reads became one pread of the image, so a cold sequential read
//! waited for the disk once per 128 KiB with almost nothing else queued.
//! Here each open stream of reads is followed; once a file is read in order,
//! the extents up to [`WINDOW`] past the reader are handed to the device's
//! prefetch (posix_fadvise WILLNEED on the image), in steps of [`STEP`], so
//! the disk works on large requests ahead of the reader. Random readers never
//! trigger it: a read that does not continue near where the last one ended
//! starts the stream afresh. Each file's stream lives in its entry of the
//! inode table until the kernel forgets the inode.

/// How far past the reader data is requested: on RBD, eight 4 MiB objects
/// in flight read 6-10% faster than two (8 MiB) on the one-node cluster,
/// and a local image read no slower (docs/benchmarks.md, issue 57).
pub(crate) const WINDOW: u64 = 32 << 20;
/// Fresh read-ahead is requested when the reader is this close to the end
/// of what was requested before, so each request is at least this large.
const STEP: u64 = 4 << 20;
/// Reads this close to the previous end still count as in order: the
/// kernel's own read-ahead sends requests on several threads, which can
/// arrive slightly out of order.
const SLACK: u64 = 1 << 20;
/// In-order reads needed before read-ahead starts.
const RUN: u32 = 2;
/// One file's reader.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Stream {
    /// Furthest byte read so far.
    pub end: u64,
    /// In-order reads seen in a row.
    run: u32,
    /// Read-ahead has been requested up to here.
    ahead: u64,
}

impl Stream {
    /// Records a read of `[offset, offset + len)` from a file of `size`
    /// bytes and returns the file range to prefetch now, if any.
    pub(crate) fn plan(&mut self, offset: u64, len: u64, size: u64) -> Option<(u64, u64)> {
        let s = self;
        let end = offset.saturating_add(len);
        let in_order = offset <= s.end.saturating_add(SLACK) && end.saturating_add(SLACK) >= s.end;
        if in_order && s.run > 0 {
            s.run = s.run.saturating_add(1);
            s.end = s.end.max(end);
        } else {
            *s = Stream {
                end,
                run: 1,
                ahead: end,
            };
        }
        if s.run < RUN || s.ahead >= size || s.ahead > end.saturating_add(WINDOW - STEP) {
            return None;
        }
        let from = s.ahead.max(end);
        let to = end.saturating_add(WINDOW).min(size);
        s.ahead = to;
        (from < to).then_some((from, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K128: u64 = 128 << 10;

    #[test]
    fn a_sequential_reader_gets_a_window_ahead_in_large_steps() {
        let mut ra = Stream::default();
        let size = 1 << 30;
        assert_eq!(ra.plan(0, K128, size), None);
        let first = ra.plan(K128, K128, size).expect("second in-order read");
        assert_eq!(first, (2 * K128, 2 * K128 + WINDOW));
        let mut requested = vec![first];
        let mut off = 2 * K128;
        while off < 64 << 20 {
            if let Some(r) = ra.plan(off, K128, size) {
                requested.push(r);
            }
            off += K128;
        }
        // Contiguous, never overlapping, each at least STEP long.
        for w in requested.windows(2) {
            assert_eq!(w[0].1, w[1].0);
            assert!(w[1].1 - w[1].0 >= STEP);
        }
        assert!(requested.last().is_some_and(|r| r.1 >= 64 << 20));
    }

    #[test]
    fn random_reads_never_prefetch() {
        let mut ra = Stream::default();
        let size = 1 << 40;
        let mut x: u64 = 12345;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) % size;
            assert_eq!(ra.plan(off / 4096 * 4096, 4096, size), None);
        }
    }

    #[test]
    fn slightly_reordered_reads_keep_the_stream() {
        let mut ra = Stream::default();
        let size = 1 << 30;
        let got: Vec<_> = [0, 2, 1, 3]
            .iter()
            .map(|i| ra.plan(i * K128, K128, size))
            .collect();
        assert_eq!(got, [None, Some((3 * K128, 3 * K128 + WINDOW)), None, None]);
    }

    #[test]
    fn nothing_is_requested_past_the_end_of_the_file() {
        let mut ra = Stream::default();
        let size = 3 * K128;
        ra.plan(0, K128, size);
        assert_eq!(ra.plan(K128, K128, size), Some((2 * K128, size)));
        assert_eq!(ra.plan(2 * K128, K128, size), None);
    }
}
