//! Readers and writers from many threads: readers never see half of a
//! change, and a commit's I/O does not block readers or new writers.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::format::tree_id::FS;
use canopy::{Engine, FormatOptions, Key, OpenOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// A key type the item checker does not know: engine tests store
/// arbitrary payloads under it.
const TEST_ITEM: u8 = 2;

#[test]
fn readers_see_whole_changes_while_commits_run() {
    let (_dev, e) = common::mem_engine(128 << 20, 4096);
    let e = Arc::new(e);
    let stop = Arc::new(AtomicBool::new(false));
    // Reads done so far: the writer goes on until the readers have read
    // while it wrote, however a loaded machine schedules them.
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    const BATCH: u64 = 40;
    let writer = {
        let (e, reads) = (e.clone(), reads.clone());
        thread::spawn(move || {
            let started = std::time::Instant::now();
            let more = |b: u64| {
                b < 150
                    || (reads.load(Ordering::Relaxed) < 30
                        && started.elapsed() < std::time::Duration::from_secs(60))
            };
            for b in (0..).take_while(|&b| more(b)) {
                e.write(|tx| {
                    for i in 0..BATCH {
                        tx.put(FS, Key::new(b, TEST_ITEM, i), vec![b as u8; 64])?;
                    }
                    if b >= 3 {
                        for i in 0..BATCH {
                            tx.delete(FS, &Key::new(b - 3, TEST_ITEM, i))?;
                        }
                    }
                    Ok(())
                })
                .unwrap();
                if b % 10 == 0 {
                    e.commit().unwrap();
                }
            }
        })
    };
    let committer = {
        let (e, stop) = (e.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                e.commit().unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (e, stop, reads) = (e.clone(), stop.clone(), reads.clone());
            thread::spawn(move || {
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) {
                    let items = e.read(|r| r.range(FS, &Key::MIN, &Key::MAX)).unwrap();
                    let mut per_batch = std::collections::BTreeMap::new();
                    for (k, v) in &items {
                        assert_eq!(v[0], k.objectid as u8);
                        *per_batch.entry(k.objectid).or_insert(0u64) += 1;
                    }
                    for (b, n) in per_batch {
                        assert_eq!(n, BATCH, "batch {b} seen half-written");
                    }
                    seen += 1;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                seen
            })
        })
        .collect();
    writer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    committer.join().unwrap();
    let seen: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(
        seen >= 30,
        "the readers read {seen} times while the writer wrote"
    );
    e.commit().unwrap();
}

/// A device whose barrier waits until the test opens a gate.
struct GatedDevice {
    inner: MemDevice,
    armed: AtomicBool,
    gate: Mutex<bool>,
    cv: Condvar,
    entered: Mutex<Option<mpsc::Sender<()>>>,
}

impl Device for GatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn barrier(&self) -> canopy::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            if let Some(tx) = self.entered.lock().unwrap().take() {
                tx.send(()).unwrap();
            }
            let mut open = self.gate.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

#[test]
fn commit_io_does_not_block_readers_or_writers() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let dev = Arc::new(GatedDevice {
        inner: MemDevice::new(64 << 20),
        armed: AtomicBool::new(false),
        gate: Mutex::new(false),
        cv: Condvar::new(),
        entered: Mutex::new(Some(entered_tx)),
    });
    let e = Arc::new(
        Engine::format(dev.clone() as Arc<dyn Device>, &FormatOptions::default()).unwrap(),
    );
    e.write(|tx| tx.insert(FS, Key::new(1, TEST_ITEM, 0), vec![1]))
        .unwrap();
    dev.armed.store(true, Ordering::SeqCst);
    let committing = {
        let e = e.clone();
        thread::spawn(move || e.commit().unwrap())
    };
    // The commit is now stuck in its barrier.
    entered_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("commit reached its barrier");
    let (done_tx, done_rx) = mpsc::channel();
    {
        let (e, done_tx) = (e.clone(), done_tx.clone());
        thread::spawn(move || {
            let v = e.read(|r| r.get(FS, &Key::new(1, TEST_ITEM, 0))).unwrap();
            e.write(|tx| tx.insert(FS, Key::new(2, TEST_ITEM, 0), vec![2]))
                .unwrap();
            done_tx.send(v).unwrap();
        });
    }
    let got = done_rx.recv_timeout(Duration::from_secs(20));
    *dev.gate.lock().unwrap() = true;
    dev.cv.notify_all();
    assert_eq!(
        got.expect("read and write finished during the commit's I/O"),
        Some(vec![1])
    );
    let g = committing.join().unwrap();
    assert!(e.commit().unwrap() > g);
}

/// Commits prepared by several threads at once reach the disk in
/// generation order: the newest superblock is the last one written, and
/// every commit call returns only once its generation is durable.
#[test]
fn concurrent_commits_write_in_generation_order() {
    let (dev, e) = common::mem_engine(128 << 20, 4096);
    let e = Arc::new(e);
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (e, dev) = (e.clone(), dev.clone());
            thread::spawn(move || {
                for i in 0..200u64 {
                    e.write(|tx| tx.put(FS, Key::new(t, TEST_ITEM, i % 50), vec![i as u8; 300]))
                        .unwrap();
                    let g = e.commit().unwrap();
                    let on_disk = canopy::txn::read_best_superblock(dev.as_ref())
                        .unwrap()
                        .generation;
                    assert!(on_disk >= g, "commit {g} returned, disk has {on_disk}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let last = e.committed_generation();
    drop(e);
    let ro = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let reopened = Engine::open(dev.clone() as Arc<dyn Device>, &ro).unwrap();
    assert_eq!(reopened.committed_generation(), last);
    drop(reopened);
    common::assert_clean(dev.as_ref());
}

/// A writer that takes the running transaction past its bound on changed
/// tree blocks wakes a committer waiting for it, once; a small
/// transaction asks for nothing.
#[test]
fn a_transaction_past_its_metadata_bound_asks_for_a_commit() {
    let (_dev, e) = common::mem_engine(128 << 20, 4096);
    let e = Arc::new(e);
    let limit = 16 * 4096;
    e.set_dirty_metadata_limit(limit);
    let waiter = {
        let e = e.clone();
        thread::spawn(move || e.wait_commit_wanted(Duration::from_secs(60)))
    };
    let mut batches = 0;
    while e.dirty_metadata_bytes() < limit {
        e.write(|tx| {
            for i in 0..50 {
                tx.put(FS, Key::new(batches, TEST_ITEM, i), vec![7; 200])?;
            }
            Ok(())
        })
        .unwrap();
        batches += 1;
        assert!(batches < 1000, "the tree never grew past the bound");
    }
    assert!(
        waiter.join().unwrap(),
        "the waiting committer was not woken"
    );
    assert!(
        !e.wait_commit_wanted(Duration::ZERO),
        "one crossing is one request, taken by the waiter"
    );
    e.commit().unwrap();
    e.write(|tx| tx.put(FS, Key::new(0, TEST_ITEM, 0), vec![1; 8]).map(drop))
        .unwrap();
    assert!(e.dirty_metadata_bytes() < limit);
    assert!(
        !e.wait_commit_wanted(Duration::ZERO),
        "a small transaction asked"
    );
}

/// A device whose discards wait until the test opens a gate, as an RBD
/// discard waits for its round trips (or for room on a full cluster).
struct SlowDiscardDevice {
    inner: MemDevice,
    gate: Mutex<bool>,
    cv: Condvar,
    entered: Mutex<Option<mpsc::Sender<()>>>,
}

impl Device for SlowDiscardDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn barrier(&self) -> canopy::Result<()> {
        self.inner.barrier()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn discard(&self, offset: u64, len: u64) -> canopy::Result<bool> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
        let mut open = self.gate.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        drop(open);
        self.inner.discard(offset, len)
    }
}

/// While a discard of freed space waits for the storage, other
/// operations go on: a listing, a write with its commit, a read. What
/// they allocate never lands in the range being discarded (the discard,
/// which zeroes, would wipe it), and the filesystem checks clean after.
#[test]
fn a_discard_in_flight_blocks_no_other_operation() {
    use canopy::fs::{Fs, Owner};
    use canopy::txn::{DiscardMode, DiscardPass};
    let (entered_tx, entered_rx) = mpsc::channel();
    let dev = Arc::new(SlowDiscardDevice {
        inner: MemDevice::new(256 << 20),
        gate: Mutex::new(false),
        cv: Condvar::new(),
        entered: Mutex::new(Some(entered_tx)),
    });
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &FormatOptions::default()).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(e)).unwrap());
    let me = Owner { uid: 0, gid: 0 };
    let file = move |fs: &Fs, name: &[u8]| {
        fs.create(256, name, libc::S_IFREG | 0o644, 0, me, None)
            .unwrap()
            .ino
    };
    let old = file(&fs, b"old");
    fs.write(old, 0, &vec![7u8; 32 << 20]).unwrap();
    fs.sync().unwrap();
    fs.engine().set_discard(DiscardMode::Async).unwrap();
    fs.remove(256, b"old", false).unwrap();
    fs.sync().unwrap();
    let discarding = {
        let fs = fs.clone();
        thread::spawn(move || fs.engine().discard_freed(DiscardPass::ALL))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the discard reached the device");
    let (done_tx, done_rx) = mpsc::channel();
    {
        let fs = fs.clone();
        thread::spawn(move || {
            let new = file(&fs, b"new");
            let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
            fs.write(new, 0, &data).unwrap();
            fs.sync().unwrap();
            let listed = fs.readdir(256, 2, 100).unwrap().len();
            done_tx.send((new, data, listed)).unwrap();
        });
    }
    let got = done_rx.recv_timeout(Duration::from_secs(20));
    *dev.gate.lock().unwrap() = true;
    dev.cv.notify_all();
    let (new, data, listed) = got.expect("a write, commit and listing during the discard");
    assert_eq!(listed, 1);
    let discarded = discarding.join().unwrap().unwrap();
    assert!(
        discarded.bytes >= 16 << 20,
        "discarded {} bytes",
        discarded.bytes
    );
    assert!(fs.read(new, 0, data.len() as u32).unwrap() == data);
    fs.sync().unwrap();
    drop(Arc::try_unwrap(fs).ok().expect("one owner left"));
    common::assert_posix_clean(&dev.inner);
}
