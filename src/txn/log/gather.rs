//! Whom the next log write waits for, so that one write serves every
//! program that fsyncs in turn.
//!
//! Log writes go out one at a time (`log_writes=1`). When one returns, the
//! callers it served go back to their programs, and a program that fsyncs
//! in a loop (a database's backends, fio's jobs) is back within a round
//! trip or two. Meanwhile a caller that queued behind the write sends the
//! next one at once, so the returning callers miss it: they wait for the
//! whole of that write and then for their own. With four such programs the
//! callers settle into two halves taking turns, and each fsync costs about
//! two log writes (issue 57's profile on RBD: 1.5 fsyncs per write, a
//! cycle of 2.7 write times).
//!
//! So a caller about to send the next write may first wait for callers
//! the last write served to come back, but only while waiting pays:
//!
//! - only while such callers usually come back within half a write's time
//!   (`return_time`: a caller that has not come back when the next write
//!   returns counts as that late). A program that cannot come back while
//!   the others wait (a database backend behind the WAL lock the waiting
//!   caller holds) stops the waiting at once;
//! - for no longer than a log write takes on average, from the last one's
//!   return (the rule jbd2 gives its commit);
//! - and only while callers keep coming: one more caller is worth waiting
//!   for while it would raise the write's fsyncs per unit of time, so the
//!   wait for the next one is the cycle so far (a write's time and the
//!   wait) over the callers the write would carry now.
//!
//! A caller comes back as soon as it enters `sync_log` again. A program
//! alone never waits, since it is the one the last write served; nor does
//! a caller not named (0: the engine's own callers and tests), which is
//! never waited for either. Callers are named by the thread that asked
//! (the FUSE request's pid), not by the file: one program that fsyncs
//! file after file must not wait for the files it is done with.

use std::time::{Duration, Instant};

/// The longest a log write waits for the callers of the last one, however
/// slow the device's writes are.
const GATHER_MAX: Duration = Duration::from_millis(10);

/// The weight of a new sample in an average, as 1/N.
const AVERAGE_OVER: u32 = 8;

/// One caller waiting in `sync_log` for a take that holds its blocks.
struct Waiter {
    ticket: u64,
    caller: u64,
    /// The take that holds its blocks (`State::log_takes` + 1 when it came).
    needed: u64,
}

/// Kept under the commit I/O lock (`IoState`).
#[derive(Default)]
pub(crate) struct Gather {
    next_ticket: u64,
    waiting: Vec<Waiter>,
    /// Callers the last log write served that have not come back since.
    released: Vec<u64>,
    /// When the last log write's barrier returned.
    released_at: Option<Instant>,
    /// When a caller last came back since then.
    came_back_at: Option<Instant>,
    /// A log write's average time, from its send to its barrier's return.
    write_time: Duration,
    /// How long after its write returned a caller comes back, on average.
    return_time: Duration,
}

impl Gather {
    /// Notes `caller` waiting for take `needed`; returns its ticket for
    /// [`Gather::leave`], and whether a caller holding the next write
    /// should look again (this one was due back).
    pub fn arrive(&mut self, caller: u64, needed: u64, now: Instant) -> (u64, bool) {
        let due = self.released.iter().position(|&c| c == caller);
        if let Some(i) = due {
            self.released.swap_remove(i);
            self.came_back_at = Some(now);
            if let Some(at) = self.released_at {
                self.return_time = average(self.return_time, now.saturating_duration_since(at));
            }
        }
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.waiting.push(Waiter {
            ticket,
            caller,
            needed,
        });
        (ticket, due.is_some())
    }

    /// Forgets the caller of `ticket`, if a write has not served it yet
    /// (it committed instead, or failed).
    pub fn leave(&mut self, ticket: u64) {
        self.waiting.retain(|w| w.ticket != ticket);
    }

    /// Until when a caller about to send a log write, which would take
    /// every take after `sent`, should wait for the last write's callers
    /// to come back; None: send now.
    pub fn hold_until(&self, now: Instant, sent: u64) -> Option<Instant> {
        let released_at = self.released_at?;
        if self.released.is_empty() || self.return_time * 2 > self.write_time {
            return None;
        }
        let last = self.came_back_at.unwrap_or(released_at).max(released_at);
        let carried = self.waiting.iter().filter(|w| w.needed > sent).count();
        let cycle = self.write_time + last.saturating_duration_since(released_at);
        let next_due = last + cycle / carried.max(1) as u32;
        let until = next_due.min(released_at + self.write_time.min(GATHER_MAX));
        (now < until).then_some(until)
    }

    /// A log write that held takes up to `take` returned after `took`
    /// (None: it needed no barrier, and its time says nothing of the
    /// device's): the callers it served are the ones the next write waits
    /// for, and those the last one served still out came back late.
    pub fn written(&mut self, take: u64, took: Option<Duration>, now: Instant) {
        if let Some(at) = self.released_at {
            let late = now.saturating_duration_since(at);
            for _ in 0..self.released.len() {
                self.return_time = average(self.return_time, late);
            }
        }
        self.released.clear();
        let released = &mut self.released;
        self.waiting.retain(|w| {
            let served = w.needed <= take;
            if served && w.caller != 0 {
                released.push(w.caller);
            }
            !served
        });
        self.released_at = Some(now);
        self.came_back_at = None;
        if let Some(took) = took {
            self.write_time = average(self.write_time, took);
        }
    }
}

/// `avg` moved 1/[`AVERAGE_OVER`] of the way to `sample` (the first
/// sample whole).
fn average(avg: Duration, sample: Duration) -> Duration {
    match avg.is_zero() {
        true => sample,
        false => (avg * (AVERAGE_OVER - 1) + sample) / AVERAGE_OVER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A gather whose last write (take 1, 4 ms) served `callers` at `t0`.
    fn served(callers: &[u64], t0: Instant) -> Gather {
        let mut g = Gather::default();
        for &c in callers {
            g.arrive(c, 1, t0);
        }
        g.written(1, Some(4 * MS), t0);
        g
    }

    /// Four programs the last write served: the first back waits for the
    /// others, each arrival gives the next a shorter while, and the last
    /// of them ends the wait.
    #[test]
    fn the_next_write_waits_for_callers_coming_back() {
        let t0 = Instant::now();
        let mut g = served(&[1, 2, 3, 4], t0);
        assert!(g.arrive(1, 2, t0 + MS / 10).1, "it was due back");
        // Alone, the write's cycle is worth a whole write's time.
        assert_eq!(g.hold_until(t0 + MS / 5, 1), Some(t0 + 4 * MS));
        g.arrive(2, 2, t0 + MS / 5);
        // Two: (4 + 0.2) / 2 ms after the second came.
        let until = t0 + MS / 5 + (4 * MS + MS / 5) / 2;
        assert_eq!(g.hold_until(t0 + MS / 5, 1), Some(until.min(t0 + 4 * MS)));
        g.arrive(3, 2, t0 + MS / 2);
        g.arrive(4, 2, t0 + MS);
        assert_eq!(g.hold_until(t0 + MS, 1), None, "all are back");
    }

    /// One program alone is the caller the last write served: it never
    /// waits, nor does a caller without a name.
    #[test]
    fn a_lone_caller_and_unnamed_callers_never_wait() {
        let t0 = Instant::now();
        let mut g = served(&[7, 0], t0);
        g.arrive(7, 2, t0);
        assert_eq!(g.hold_until(t0, 1), None);
    }

    /// Callers that stop coming end the wait: one more is worth the
    /// cycle so far over the callers the write would carry.
    #[test]
    fn the_wait_ends_when_callers_stop_coming() {
        let t0 = Instant::now();
        let mut g = served(&[1, 2, 3, 4, 5], t0);
        for (i, c) in [1, 2, 3, 4].into_iter().enumerate() {
            g.arrive(c, 2, t0 + MS * i as u32 / 4);
        }
        // Four carried, the last came at 0.75 ms: (4 + 0.75) / 4 after it.
        let until = t0 + 3 * MS / 4 + (4 * MS + 3 * MS / 4) / 4;
        assert_eq!(g.hold_until(t0 + MS, 1), Some(until));
        assert_eq!(g.hold_until(until, 1), None);
    }

    /// Never longer than a write's average time, nor than the cap.
    #[test]
    fn the_wait_is_bounded_by_a_write_time_and_the_cap() {
        let t0 = Instant::now();
        let mut g = served(&[1, 2], t0);
        g.arrive(1, 2, t0);
        assert_eq!(g.hold_until(t0, 1), Some(t0 + 4 * MS));
        assert_eq!(g.hold_until(t0 + 4 * MS, 1), None);
        let mut g = Gather::default();
        g.arrive(1, 1, t0);
        g.arrive(2, 1, t0);
        g.written(1, Some(500 * MS), t0);
        g.arrive(1, 2, t0);
        assert_eq!(g.hold_until(t0, 1), Some(t0 + GATHER_MAX));
    }

    /// A caller that cannot come back while the others wait (it waits on
    /// a lock the waiting caller holds) counts late when the next write
    /// returns without it, which stops the waiting.
    #[test]
    fn a_caller_that_comes_back_late_stops_the_waiting() {
        let t0 = Instant::now();
        let mut g = served(&[1], t0);
        g.arrive(2, 2, t0 + MS);
        assert!(g.hold_until(t0 + MS, 1).is_some(), "1 may be back soon");
        g.written(2, Some(4 * MS), t0 + 5 * MS);
        assert_eq!(g.return_time, 5 * MS, "1 was not back after 5 ms");
        g.arrive(3, 3, t0 + 6 * MS);
        assert_eq!(g.hold_until(t0 + 6 * MS, 2), None);
    }

    /// Only callers whose take a write held are released by it; one that
    /// left (it committed instead) is not waited for.
    #[test]
    fn only_callers_a_write_served_are_released() {
        let t0 = Instant::now();
        let mut g = Gather::default();
        let (a, _) = g.arrive(1, 1, t0);
        g.arrive(2, 2, t0);
        let (c, _) = g.arrive(3, 2, t0);
        g.leave(c);
        g.written(1, Some(MS), t0);
        g.leave(a);
        assert_eq!(g.released, vec![1]);
        g.written(2, None, t0);
        assert_eq!(g.released, vec![2]);
        assert_eq!(g.write_time, MS, "a write without a barrier is not timed");
    }

    #[test]
    fn the_average_moves_an_eighth_towards_each_sample() {
        assert_eq!(average(Duration::ZERO, 8 * MS), 8 * MS);
        assert_eq!(average(8 * MS, 16 * MS), 9 * MS);
    }
}
