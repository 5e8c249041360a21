//! File data moved outside the state lock: the engine's half of the fs
//! layer's writeback pipeline, and of its reads.
//!
//! **Writes.** A flush allocates its extents in a short transaction and
//! opens a [`Flight`] there; it then writes and checksums the data with no
//! engine lock held ([`Engine::write_flight`]), and joins a second short
//! transaction that inserts the items and ends the flight. Extents
//! allocated in a transaction and not referenced when it commits are freed
//! by that commit, so a commit waits until no flight is open (and new
//! flights wait for a waiting commit, so a stream of flushes cannot starve
//! it). The second transaction is then always the first one's.
//!
//! While a flight is open, the tree items its flush will insert hold their
//! space as buffered data did ([`State::flushing`]), so the second
//! transaction cannot meet ENOSPC.
//!
//! **Reads.** [`Engine::read_unlocked`] finds what to read under the state
//! lock and reads it after letting go. A data extent the plan names may be
//! freed meanwhile, and once its commit is durable its space could be
//! handed to a new flush and overwritten while the read is still going.
//! So unlocked reads are counted by *epoch* ([`ReadEpochs`]): a durable
//! commit retires the space it freed in a new epoch, and the space becomes
//! reusable once every read that started in an earlier epoch has finished.
//! Neither side waits for the other: the last such read, or a later
//! commit, hands the space back. For the same reason data extents are
//! never reused in the transaction that freed them (`extent::apply` pins
//! them like any other).

use super::{Engine, Shared, State, Txn};
use crate::dev::Device;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a commit waiting for flights lets fsync's flushes open new
/// ones ahead of it. Queued behind the commit, an fsync would wait for
/// every other file's flush in flight (a streaming writer's 8 MiB chunk);
/// ahead of it, only for its own. Its flush is one file's, so the commit
/// waits little longer; the bound keeps a stream of fsyncs from starving
/// the commit.
const FSYNC_AHEAD_OF_COMMIT: Duration = Duration::from_millis(500);

/// Unlocked reads in progress per epoch, and freed space waiting for the
/// reads older than it to finish.
#[derive(Default)]
pub(crate) struct ReadEpochs {
    inner: Mutex<Epochs>,
    /// Signalled when retired space becomes reusable.
    released: Condvar,
}

#[derive(Default)]
struct Epochs {
    now: u64,
    /// Epoch → reads that started in it and are still going.
    active: BTreeMap<u64, u64>,
    /// (epoch retired in, extents) not reusable yet.
    retired: Vec<(u64, Vec<(u64, u64)>)>,
}

impl Epochs {
    /// Retired extents no running read can still be reading.
    fn ready(&mut self) -> Vec<(u64, u64)> {
        let oldest = self.active.keys().next().copied().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        self.retired.retain_mut(|(epoch, extents)| {
            // Reads of an earlier epoch planned before this space was freed.
            let safe = *epoch <= oldest;
            if safe {
                out.append(extents);
            }
            !safe
        });
        out
    }
}

impl ReadEpochs {
    fn enter(&self) -> u64 {
        let mut e = crate::sync::lock(&self.inner);
        let now = e.now;
        *e.active.entry(now).or_default() += 1;
        now
    }

    /// A read of `epoch` finished; returns the extents it was holding back.
    fn leave(&self, epoch: u64) -> Vec<(u64, u64)> {
        let mut e = crate::sync::lock(&self.inner);
        if let Some(n) = e.active.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                e.active.remove(&epoch);
            }
        }
        let ready = e.ready();
        if e.retired.is_empty() {
            self.released.notify_all();
        }
        ready
    }

    /// Waits (at most `limit`) until no retired space waits for a read.
    fn wait_settled(&self, limit: std::time::Duration) {
        let e = crate::sync::lock(&self.inner);
        let _ = self
            .released
            .wait_timeout_while(e, limit, |e| !e.retired.is_empty());
    }

    /// Freed space a durable commit hands back; returns what is reusable
    /// at once.
    fn retire(&self, extents: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        let mut e = crate::sync::lock(&self.inner);
        e.now += 1;
        let now = e.now;
        e.retired.push((now, extents));
        e.ready()
    }
}

/// Ends an unlocked read when dropped (also when it panics).
struct ReadTicket<'e> {
    engine: &'e Engine,
    epoch: u64,
}

impl Drop for ReadTicket<'_> {
    fn drop(&mut self) {
        let ready = self.engine.shared.reads.leave(self.epoch);
        self.engine.make_reusable(ready);
    }
}

/// Open flights, and commits waiting for them to end.
#[derive(Default)]
pub(crate) struct Flights {
    count: Mutex<Counts>,
    changed: Condvar,
    /// Data extents flights write into in place (`chattr +C` files), with
    /// how many do; signalled on `changed` when one is done.
    in_place: Mutex<HashMap<u64, usize>>,
    /// Some flight wrote data since [`Engine::barrier_for_unchecked_data`]
    /// last made it durable.
    unflushed_data: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Counts {
    open: u64,
    commits_waiting: u64,
    /// When the first of the waiting commits began to wait.
    waiting_since: Option<Instant>,
}

impl Counts {
    /// Whether a flush for `who` must wait for the waiting commits now.
    fn flush_must_wait(&self, who: Flusher) -> bool {
        if self.commits_waiting == 0 {
            return false;
        }
        match who {
            Flusher::Writeback => true,
            Flusher::Fsync => self
                .waiting_since
                .is_none_or(|t| t.elapsed() >= FSYNC_AHEAD_OF_COMMIT),
        }
    }
}

/// Who a flush runs for, which decides whether it queues behind a
/// waiting commit ([`Engine::wait_for_commits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flusher {
    /// Writeback, a commit's flush, or a writer past the dirty limit.
    Writeback,
    /// fsync(2) of the file: it goes ahead of a waiting commit, within
    /// [`FSYNC_AHEAD_OF_COMMIT`].
    Fsync,
}

/// Data extents allocated by a flush whose items are not in the tree yet.
/// Dropping it ends the flight: end it with [`Txn::end_flight`] in the
/// transaction that inserts its items (or gives up on them).
pub struct Flight {
    flights: Arc<Flights>,
    transid: u64,
    /// Its extents, start → end, touching ones merged: a write may then
    /// cover several allocations laid end to end, and checking that it
    /// stays inside them costs one lookup however many there are.
    extents: BTreeMap<u64, u64>,
    /// Where each of its allocations starts (`DelayedRefs::hold`).
    starts: Vec<u64>,
    /// Bytes of buffered data whose flush items are held (see `space`).
    held: u64,
    /// Extents it writes into in place, until written
    /// ([`Txn::write_in_place`]).
    in_place: Vec<u64>,
}

impl Flight {
    fn add_extent(&mut self, start: u64, len: u64) {
        let mut start = start;
        let mut end = start + len;
        if let Some((&s, &e)) = self.extents.range(..=start).next_back() {
            if e == start {
                start = s;
            }
        }
        if let Some(e) = self.extents.remove(&end) {
            end = e;
        }
        self.extents.insert(start, end);
    }

    /// Whether `[start, end)` lies inside one run of its extents.
    fn covers(&self, start: u64, end: u64) -> bool {
        self.extents
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| end <= e)
    }
}

impl Flight {
    /// Its in-place writes are done (or given up): relocation and
    /// sharing of their extents may go on.
    fn in_place_done(&mut self) {
        if self.in_place.is_empty() {
            return;
        }
        let mut m = crate::sync::lock(&self.flights.in_place);
        for extent in self.in_place.drain(..) {
            if let Some(n) = m.get_mut(&extent) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&extent);
                }
            }
        }
        drop(m);
        // Waiters hold the state lock: take `count`'s lock to wake them
        // in order with their check.
        let _c = crate::sync::lock(&self.flights.count);
        self.flights.changed.notify_all();
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.in_place_done();
        let mut c = crate::sync::lock(&self.flights.count);
        debug_assert!(c.open > 0, "a flight ended that was never counted open");
        c.open = c.open.saturating_sub(1);
        self.flights.changed.notify_all();
    }
}

impl Txn<'_> {
    /// Opens a flight for the flush of `held` bytes of buffered data:
    /// their tree items stay reserved until [`Txn::end_flight`].
    pub fn start_flight(&mut self, held: u64) -> Flight {
        self.st.flushing += held;
        crate::sync::lock(&self.sh.flights.count).open += 1;
        Flight {
            flights: self.sh.flights.clone(),
            transid: self.st.transid,
            extents: BTreeMap::new(),
            starts: Vec::new(),
            held,
            in_place: Vec::new(),
        }
    }

    /// Lets `flight` write `[at, at + len)`, which lies inside the data
    /// extent at `extent`, in place: the file writing it holds that
    /// extent alone and keeps no checksums (`chattr +C`). Until the write
    /// is done ([`Engine::in_place_done`]), whatever would copy the
    /// extent's bytes or share them (relocation, a snapshot, a reflink)
    /// waits in [`Txn::wait_in_place`], so that it never copies bytes the
    /// write is about to change.
    pub fn write_in_place(&mut self, flight: &mut Flight, extent: u64, at: u64, len: u64) {
        *crate::sync::lock(&self.sh.flights.in_place)
            .entry(extent)
            .or_insert(0) += 1;
        flight.in_place.push(extent);
        flight.add_extent(at, len);
    }

    /// Waits until no flight writes in place into the extent at `extent`
    /// (into any extent for None). Every such write was planned under
    /// the state lock, which the caller holds, so none begins meanwhile;
    /// the writes themselves need no engine lock to finish.
    pub fn wait_in_place(&self, extent: Option<u64>) {
        self.sh.flights.wait_in_place(extent);
    }

    /// Whether a flush has a flight open: its extents are allocated and
    /// not referenced yet, so folding references now (as the commit does
    /// once none is open) would free them.
    pub fn flights_open(&self) -> bool {
        crate::sync::lock(&self.sh.flights.count).open > 0
    }

    /// Allocates a data extent of `min` to `max` bytes for `flight` (see
    /// [`Txn::alloc_data_range`]).
    pub fn alloc_flight_data(
        &mut self,
        flight: &mut Flight,
        min: u64,
        max: u64,
        hint: u64,
    ) -> Result<(u64, u64)> {
        let got = self.alloc_data_range(min, max, hint)?;
        self.hold_for_flight(flight, got);
        Ok(got)
    }

    /// The device's unit of writing (`Device::write_unit`; 0: none), for
    /// [`Txn::alloc_flight_data_aligned`].
    pub fn data_write_unit(&self) -> u64 {
        crate::dev::Device::write_unit(&*self.sh.dev)
    }

    /// Allocates a data extent of exactly `len` bytes for `flight`, at
    /// the start of `room` free bytes that begins on a multiple of `unit`,
    /// the device's unit of writing ([`Txn::data_write_unit`]; see
    /// `Allocator::alloc_aligned`). None when no free space is so placed:
    /// the caller allocates with [`Txn::alloc_flight_data`] then.
    pub fn alloc_flight_data_aligned(
        &mut self,
        flight: &mut Flight,
        (len, room): (u64, u64),
        hint: u64,
        unit: u64,
    ) -> Option<(u64, u64)> {
        if !len.is_multiple_of(u64::from(crate::format::SECTORSIZE)) {
            return None;
        }
        let got =
            self.st
                .alloc
                .alloc_aligned(crate::alloc::GroupKind::Data, (len, room), hint, unit)?;
        self.note_new_data(got.0, got.1);
        self.hold_for_flight(flight, got);
        Some(got)
    }

    /// Makes a new data extent `flight`'s: the commit waits for it, and
    /// its references are held until the flight ends.
    fn hold_for_flight(&mut self, flight: &mut Flight, (start, len): (u64, u64)) {
        flight.add_extent(start, len);
        flight.starts.push(start);
        self.st.refs.hold(start, len);
    }

    /// Ends `flight`, giving back the items it held. Its extents are in
    /// the tree by now, or are freed by the commit.
    pub fn end_flight(&mut self, flight: Flight) -> Result<()> {
        // The items a flight holds were added to `flushing` when it opened.
        debug_assert!(
            self.st.flushing >= flight.held,
            "flushing reservations would go negative"
        );
        self.st.flushing = self.st.flushing.saturating_sub(flight.held);
        for &start in &flight.starts {
            self.st.refs.release(start);
        }
        if flight.transid != self.st.transid {
            return Err(Error::corrupt(
                0,
                "a flush outlived its transaction (a commit did not wait for it)",
            ));
        }
        Ok(())
    }
}

/// The device, for data reads outside the state lock.
pub struct DataDevice<'a> {
    pub(in crate::txn) sh: &'a Shared,
}

impl DataDevice<'_> {
    pub fn read_data(&self, bytenr: u64, buf: &mut [u8]) -> Result<()> {
        self.sh.dev.read_at(buf, bytenr)
    }

    /// Starts reading data bytes of inode `ino` the caller expects to
    /// need soon, from the copy its reads will try first.
    pub fn prefetch_data(&self, bytenr: u64, len: u64, ino: u64) {
        let copy = self.sh.dev.preferred_copy(bytenr, len, ino);
        self.sh.dev.prefetch_copy(bytenr, len, copy);
    }
}

impl Engine {
    /// Makes the data flights wrote durable, with a barrier, if any was
    /// written since the last call. fsync of a file that keeps no
    /// checksums (`chattr +C`) needs it before its log: the log's single
    /// barrier lets its chain link reach the disk before the data (see
    /// `sync_log`), which replay finds out through the checksums of
    /// other files' data, and cannot for this one's.
    pub fn barrier_for_unchecked_data(&self) -> Result<()> {
        let f = &self.shared.flights;
        if f.unflushed_data
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            if let Err(e) = self.shared.dev.barrier() {
                f.unflushed_data
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The in-place writes of `flight` are on the device (or failed):
    /// what waits for them in [`Txn::wait_in_place`] goes on. Called
    /// before the flush takes the state lock again.
    pub fn in_place_done(&self, flight: &mut Flight) {
        flight.in_place_done();
    }

    /// Writes data into an extent of `flight`, with no engine lock held.
    /// It reaches the disk before the commit (or log) that references it
    /// writes its barrier, since its items are inserted only afterwards.
    /// A failed write shuts the engine down, as any failed write does.
    pub fn write_flight(&self, flight: &Flight, bytenr: u64, data: &[u8]) -> Result<()> {
        self.flight_write(flight, bytenr, data.len(), |dev| {
            dev.write_data_at(data, bytenr)
        })
    }

    /// [`Engine::write_flight`] with the bytes given away: a device that
    /// keeps writes in flight (RBD) holds them without a copy.
    pub fn write_flight_owned(&self, flight: &Flight, bytenr: u64, data: Bytes) -> Result<()> {
        self.flight_write(flight, bytenr, data.len(), |dev| {
            dev.write_data_owned(data, bytenr)
        })
    }

    fn flight_write(
        &self,
        flight: &Flight,
        bytenr: u64,
        len: usize,
        write: impl FnOnce(&dyn Device) -> Result<()>,
    ) -> Result<()> {
        self.check_alive()?;
        if !flight.covers(bytenr, bytenr + len as u64) {
            return Err(Error::Invalid(format!(
                "data write at {bytenr} outside the flight's extents"
            )));
        }
        let r = write(&*self.shared.dev);
        self.shared
            .flights
            .unflushed_data
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Waits while a commit waits for flights to end: a flush calls it
    /// before it opens one, so flushes cannot starve a commit. An fsync's
    /// flush goes ahead of a commit that began waiting less than
    /// [`FSYNC_AHEAD_OF_COMMIT`] ago, so it never waits for other files'
    /// flushes.
    pub fn wait_for_commits(&self, who: Flusher) {
        let f = &self.shared.flights;
        let mut c = crate::sync::lock(&f.count);
        while c.flush_must_wait(who) {
            let limit = FSYNC_AHEAD_OF_COMMIT;
            c = f
                .changed
                .wait_timeout(c, limit)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Whether a commit is waiting for open flights to end (for tests and
    /// diagnostics).
    pub fn commit_waits_for_flights(&self) -> bool {
        crate::sync::lock(&self.shared.flights.count).commits_waiting > 0
    }

    /// Runs `plan` under the state lock (shared), then `io` with its result
    /// and the device after letting go, so data reads wait for no writer
    /// and no writer waits for them. Space freed meanwhile is not reused
    /// until `io` returns (see the module doc).
    pub fn read_unlocked<P, R>(
        &self,
        plan: impl FnOnce(&super::Reader<'_>) -> Result<P>,
        io: impl FnOnce(P, &DataDevice<'_>) -> Result<R>,
    ) -> Result<R> {
        let _ticket = ReadTicket {
            engine: self,
            epoch: self.shared.reads.enter(),
        };
        self.foreground
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = self.read(plan)?;
        io(p, &DataDevice { sh: &self.shared })
    }

    /// Runs `f` with the device for data reads whose extents the caller
    /// knows cannot be freed meanwhile (a flush reading the old bytes of
    /// the file it holds), taking no state lock.
    pub fn with_data_device<R>(&self, f: impl FnOnce(&DataDevice<'_>) -> Result<R>) -> Result<R> {
        let _ticket = ReadTicket {
            engine: self,
            epoch: self.shared.reads.enter(),
        };
        self.foreground
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f(&DataDevice { sh: &self.shared })
    }

    /// Returns the state lock once no flight is open, waiting (without
    /// the lock) for open ones to end.
    pub(super) fn lock_without_flights(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        let f = &self.shared.flights;
        loop {
            let st = crate::sync::write(&self.state);
            let mut c = crate::sync::lock(&f.count);
            if c.open == 0 {
                return st;
            }
            if c.commits_waiting == 0 {
                c.waiting_since = Some(Instant::now());
            }
            c.commits_waiting += 1;
            drop(st);
            while c.open > 0 && self.check_alive().is_ok() {
                c = f
                    .changed
                    .wait(c)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            c.commits_waiting -= 1;
            if c.commits_waiting == 0 {
                c.waiting_since = None;
            }
            f.changed.notify_all();
            if self.check_alive().is_err() {
                // The state lock comes before the count everywhere else:
                // let go of the count first, or a flush holding the state
                // lock and asking for the count would wait on us forever.
                drop(c);
                return crate::sync::write(&self.state);
            }
        }
    }

    /// Makes space freed by a durable commit reusable, now or once the
    /// unlocked reads that may still be reading it are done.
    pub(super) fn unpin(&self, extents: Vec<(u64, u64)>) {
        let ready = self.shared.reads.retire(extents);
        self.make_reusable(ready);
    }

    /// Waits briefly for the reads that hold back space freed by earlier
    /// commits (a writer that met ENOSPC calls it before asking again).
    pub fn wait_for_freed_space(&self) {
        self.shared
            .reads
            .wait_settled(std::time::Duration::from_secs(5));
    }

    fn make_reusable(&self, extents: Vec<(u64, u64)>) {
        if !extents.is_empty() {
            crate::sync::write(&self.state).alloc.unpin(extents);
        }
    }
}

impl super::Reader<'_> {
    /// [`Txn::wait_in_place`] for a reader: planning an in-place write
    /// takes the state lock for writing, so none begins while a reader
    /// holds it either.
    pub fn wait_in_place(&self, extent: Option<u64>) {
        self.sh.flights.wait_in_place(extent);
    }
}

impl Flights {
    /// See [`Txn::wait_in_place`].
    fn wait_in_place(&self, extent: Option<u64>) {
        let f = self;
        let busy = || {
            let m = crate::sync::lock(&f.in_place);
            match extent {
                Some(e) => m.contains_key(&e),
                None => !m.is_empty(),
            }
        };
        let mut c = crate::sync::lock(&f.count);
        while busy() {
            c = f
                .changed
                .wait_timeout(c, Duration::from_millis(100))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocations laid end to end make one run, so a write across them
    /// is inside the flight; a write over a gap or past the end is not.
    #[test]
    fn touching_extents_merge_and_bound_writes() {
        let mut f = Flight {
            flights: Arc::default(),
            transid: 1,
            extents: BTreeMap::new(),
            starts: Vec::new(),
            held: 0,
            in_place: Vec::new(),
        };
        // As `Txn::start_flight` counts it, so its drop balances.
        crate::sync::lock(&f.flights.count).open = 1;
        f.add_extent(8192, 4096);
        f.add_extent(0, 4096);
        f.add_extent(4096, 4096);
        f.add_extent(20480, 4096);
        assert_eq!(f.extents, BTreeMap::from([(0, 12288), (20480, 24576)]));
        assert!(f.covers(0, 12288));
        assert!(f.covers(4096, 8192));
        assert!(!f.covers(4096, 12289));
        assert!(!f.covers(8192, 24576));
        assert!(f.covers(20480, 24576));
        assert!(!f.covers(16384, 20480));
    }
}
