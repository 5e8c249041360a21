//! Log writes that overlap: which roots a log write's superblock names.
//!
//! A log write sends its blocks and a superblock naming its root, then
//! waits for a barrier. Waiting for the barrier before the next write may
//! be sent (one log write at a time) left the device idle for the whole
//! barrier; on RBD that is most of an fsync. So the next write is sent
//! while the barrier before it is out, and the superblock may reach the
//! disk before the blocks of its own write or of the write before it.
//! Replay takes the newest root it finds whole among those the superblock
//! names, so each superblock names:
//!
//! - its own root;
//! - the roots sent before it whose barrier has not returned (one at
//!   most: [`MAX_IN_FLIGHT`]), any of which may have returned to its
//!   fsync by the time of a crash;
//! - the newest root whose barrier had returned when it was sent, which
//!   is whole on the disk whatever else is lost.
//!
//! An fsync returns only after a barrier that followed its own write, so
//! every root that returned is one of those, or older than one that is
//! whole. Superblock writes never overlap each other (a device finishes
//! a write before one over the same bytes begins), so the superblock on
//! the disk is the newest one sent, or one before it that names roots
//! no older.

use crate::tree::RootPtr;

/// Most log writes whose barrier has not returned. With two, a
/// superblock names three roots, as many as it has room for.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// The log writes of one transaction's log.
#[derive(Default)]
pub(crate) struct LogWrites {
    /// The transaction whose log these are.
    transid: u64,
    /// The newest root known durable, with its take (`State::log_takes`).
    durable: Option<(u64, RootPtr)>,
    /// Roots sent whose barrier has not returned, oldest first.
    in_flight: Vec<(u64, RootPtr)>,
}

impl LogWrites {
    /// Log writes of transaction `transid` sent and not yet durable.
    pub fn in_flight(&self, transid: u64) -> usize {
        match self.transid == transid {
            true => self.in_flight.len(),
            false => 0,
        }
    }

    /// The roots a superblock naming `ptr`, a root of transaction
    /// `transid`'s log, must name after it, newest first (see the module).
    pub fn older_roots(&mut self, transid: u64, ptr: &RootPtr) -> Vec<RootPtr> {
        if self.transid != transid {
            *self = LogWrites {
                transid,
                ..LogWrites::default()
            };
        }
        let mut out: Vec<RootPtr> = Vec::new();
        let newest_first = self.in_flight.iter().rev().chain(self.durable.iter());
        for (_, p) in newest_first {
            let same_log = p.generation == ptr.generation;
            if same_log && p.bytenr != ptr.bytenr && out.iter().all(|o| o.bytenr != p.bytenr) {
                out.push(*p);
            }
        }
        out
    }

    /// Take `take`'s root `ptr` was sent (after [`LogWrites::older_roots`]).
    pub fn sent(&mut self, take: u64, ptr: RootPtr) {
        self.in_flight.push((take, ptr));
    }

    /// A barrier after take `take` of transaction `transid` returned: it,
    /// and every take sent before it, is durable.
    pub fn settled(&mut self, transid: u64, take: u64) {
        if self.transid != transid {
            return;
        }
        let newest = self
            .in_flight
            .iter()
            .filter(|(t, _)| *t <= take)
            .max_by_key(|(t, _)| *t)
            .copied();
        if let Some((t, p)) = newest {
            if self.durable.is_none_or(|(d, _)| d < t) {
                self.durable = Some((t, p));
            }
        }
        self.in_flight.retain(|(t, _)| *t > take);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(bytenr: u64) -> RootPtr {
        RootPtr {
            bytenr,
            generation: 7,
            level: 0,
        }
    }

    /// With one write in flight, the next superblock names it and the
    /// durable root before it; once its barrier returns, only it.
    #[test]
    fn a_superblock_names_the_roots_in_flight_and_the_durable_one() {
        let mut w = LogWrites::default();
        assert!(w.older_roots(7, &root(100)).is_empty());
        w.sent(1, root(100));
        w.settled(7, 1);
        assert_eq!(w.older_roots(7, &root(200)), vec![root(100)]);
        w.sent(2, root(200));
        assert_eq!(w.in_flight(7), 1);
        assert_eq!(w.older_roots(7, &root(300)), vec![root(200), root(100)]);
        w.sent(3, root(300));
        // The later barrier returns first: both are durable.
        w.settled(7, 3);
        assert_eq!(w.in_flight(7), 0);
        w.settled(7, 2);
        assert_eq!(w.older_roots(7, &root(400)), vec![root(300)]);
        // The same root again is not named twice.
        assert!(w.older_roots(7, &root(300)).is_empty());
    }

    /// A new transaction's log starts with nothing behind it.
    #[test]
    fn another_transaction_starts_afresh() {
        let mut w = LogWrites::default();
        w.older_roots(7, &root(100));
        w.sent(1, root(100));
        w.settled(7, 1);
        let next = RootPtr {
            bytenr: 500,
            generation: 8,
            level: 0,
        };
        assert!(w.older_roots(8, &next).is_empty());
        assert_eq!(w.in_flight(7), 0);
        // A late barrier of the old log changes nothing.
        w.settled(7, 1);
        assert!(w.older_roots(8, &next).is_empty());
    }
}
