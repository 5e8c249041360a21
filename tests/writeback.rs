//! The writeback pipeline and unlocked reads: file data goes to and comes
//! from the device with no engine lock held, so a stuck data write or read
//! stalls neither metadata operations nor other files; a commit waits for
//! a flush whose data is still being written; and readers racing flushes
//! and commits always see whole writes.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::fs::{Fs, Owner};
use canopy::{Engine, FormatOptions};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

const ROOT: u64 = canopy::format::inode::ROOT_DIR_INO;
const ME: Owner = Owner { uid: 0, gid: 0 };
/// Long enough that only a deadlock misses it.
const PATIENCE: Duration = Duration::from_secs(20);

/// A device that, once armed, holds file data writes (or reads of exactly
/// `read_len` bytes) until the test opens the gate.
struct GatedDevice {
    inner: Arc<MemDevice>,
    hold_data_writes: AtomicBool,
    hold_reads_of: AtomicUsize,
    open: Mutex<bool>,
    cv: Condvar,
    entered: Mutex<Option<mpsc::Sender<()>>>,
}

impl GatedDevice {
    fn new(inner: Arc<MemDevice>) -> (Arc<GatedDevice>, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        let dev = Arc::new(GatedDevice {
            inner,
            hold_data_writes: AtomicBool::new(false),
            hold_reads_of: AtomicUsize::new(0),
            open: Mutex::new(false),
            cv: Condvar::new(),
            entered: Mutex::new(Some(tx)),
        });
        (dev, rx)
    }

    fn wait_at_gate(&self) {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }

    fn open_gate(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Device for GatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        if buf.len() == self.hold_reads_of.load(Ordering::SeqCst) {
            self.wait_at_gate();
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_data_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        if self.hold_data_writes.load(Ordering::SeqCst) {
            self.wait_at_gate();
        }
        self.inner.write_data_at(buf, offset)
    }
    fn barrier(&self) -> canopy::Result<()> {
        self.inner.barrier()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

fn new_fs(dev: Arc<dyn Device>) -> Arc<Fs> {
    let e = Engine::format(dev, &FormatOptions::default()).unwrap();
    Arc::new(Fs::new(Arc::new(e)).unwrap())
}

fn new_file(fs: &Fs, name: &str) -> u64 {
    fs.create(ROOT, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap()
        .ino
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 4096) as u8))
        .collect()
}

/// Runs `f` on another thread; its result if it finished in time.
fn finishes<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE).ok()
}

#[test]
fn a_stuck_data_write_stalls_neither_metadata_nor_other_files_and_the_commit_waits() {
    let mem = Arc::new(MemDevice::new(256 << 20));
    let (dev, entered) = GatedDevice::new(mem.clone());
    let fs = new_fs(dev.clone());
    let other = new_file(&fs, "other");
    fs.write(other, 0, &pattern(9, 300_000)).unwrap();
    fs.sync().unwrap();
    let big = new_file(&fs, "big");
    fs.write(big, 0, &pattern(1, 3 << 20)).unwrap();
    dev.hold_data_writes.store(true, Ordering::SeqCst);
    let flushing = {
        let fs = fs.clone();
        thread::spawn(move || fs.fsync(big))
    };
    entered
        .recv_timeout(PATIENCE)
        .expect("the flush reached its data write");
    // While the data write is stuck: metadata, buffered writes and reads
    // of committed data of another file all proceed.
    let other_work = {
        let fs = fs.clone();
        finishes(move || {
            let a = fs.getattr(big).unwrap();
            let n = new_file(&fs, "new");
            fs.write(n, 0, b"hello").unwrap();
            fs.rename(ROOT, b"new", ROOT, b"renamed", false, false)
                .unwrap();
            let got = fs.read(other, 0, 300_000).unwrap();
            (a.size, got == pattern(9, 300_000))
        })
    };
    // A commit cannot finish while extents it would free are being written.
    let commit = {
        let fs = fs.clone();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || tx.send(fs.engine().commit()).unwrap());
        rx
    };
    let early = commit.recv_timeout(Duration::from_millis(500));
    dev.open_gate();
    assert_eq!(
        other_work.expect("other work finished during the stuck data write"),
        (3 << 20, true)
    );
    assert!(
        early.is_err(),
        "the commit finished while a flush was writing"
    );
    commit
        .recv_timeout(PATIENCE)
        .expect("the commit finished once the flush did")
        .unwrap();
    flushing.join().unwrap().unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(big, 0, 3 << 20).unwrap(), pattern(1, 3 << 20));
    drop(fs);
    common::assert_fs_clean(&mem);
}

#[test]
fn a_stuck_data_read_stalls_no_writer() {
    const LEN: usize = 192 << 10;
    let mem = Arc::new(MemDevice::new(256 << 20));
    let (dev, entered) = GatedDevice::new(mem.clone());
    let fs = new_fs(dev.clone());
    let f = new_file(&fs, "f");
    fs.write(f, 0, &pattern(3, LEN)).unwrap();
    fs.sync().unwrap();
    dev.hold_reads_of.store(LEN, Ordering::SeqCst);
    let reading = {
        let fs = fs.clone();
        thread::spawn(move || fs.read(f, 0, LEN as u32))
    };
    entered
        .recv_timeout(PATIENCE)
        .expect("the read reached the device");
    let writers = {
        let fs = fs.clone();
        finishes(move || {
            // The whole file is rewritten: its old extent is freed, and
            // after the commit a new file may be given its space.
            fs.write(f, 0, &pattern(5, LEN)).unwrap();
            fs.sync().unwrap();
            let g = new_file(&fs, "g");
            fs.write(g, 0, &pattern(6, LEN)).unwrap();
            fs.sync().unwrap();
            g
        })
    };
    dev.hold_reads_of.store(0, Ordering::SeqCst);
    dev.open_gate();
    let g = writers.expect("writes and commits finished during the stuck read");
    // The read began before the overwrite and its commit: it returns the
    // old bytes, whose extent was not reused under it.
    assert_eq!(reading.join().unwrap().unwrap(), pattern(3, LEN));
    assert_eq!(fs.read(f, 0, LEN as u32).unwrap(), pattern(5, LEN));
    assert_eq!(fs.read(g, 0, LEN as u32).unwrap(), pattern(6, LEN));
    drop(fs);
    common::assert_fs_clean(&mem);
}

/// Writers replace whole files while a small dirty limit keeps flushes
/// running and another thread commits: every read sees one write whole.
#[test]
fn readers_racing_flushes_and_commits_see_whole_writes() {
    const LEN: usize = 256 << 10;
    let mem = Arc::new(MemDevice::new(512 << 20));
    let fs = new_fs(mem.clone());
    fs.set_dirty_limit(512 << 10);
    let files: Vec<u64> = (0..3).map(|i| new_file(&fs, &format!("f{i}"))).collect();
    for &f in &files {
        fs.write(f, 0, &vec![0u8; LEN]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The writers start once every reader has read: on a loaded machine
    // they could otherwise all finish before a reader ran at all.
    const READERS: usize = 2;
    let start = Arc::new(std::sync::Barrier::new(READERS + files.len()));
    let writers: Vec<_> = files
        .iter()
        .map(|&f| {
            let (fs, start) = (fs.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for round in 1..=120u8 {
                    fs.write(f, 0, &vec![round; LEN]).unwrap();
                    if round % 17 == 0 {
                        fs.fsync(f).unwrap();
                    }
                }
            })
        })
        .collect();
    let committer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fs.sync().unwrap();
                thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (fs, stop, files, start) = (fs.clone(), stop.clone(), files.clone(), start.clone());
            thread::spawn(move || {
                let read_whole = |reads: u64| -> Result<(), String> {
                    let f = files[(reads as usize + r) % files.len()];
                    let got = fs.read(f, 0, LEN as u32).map_err(|e| e.to_string())?;
                    if got.len() != LEN {
                        return Err(format!("file {f}: {} bytes read of {LEN}", got.len()));
                    }
                    if !got.iter().all(|&b| b == got[0]) {
                        return Err(format!(
                            "file {f} read half of one write and half of another"
                        ));
                    }
                    Ok(())
                };
                // The first read lets the writers go whatever it found, so
                // a failure fails the test rather than leaving them waiting.
                let first = read_whole(0);
                start.wait();
                first.unwrap();
                let mut reads = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    read_whole(reads).unwrap();
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    committer.join().unwrap();
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    for &f in &files {
        assert_eq!(fs.read(f, 0, LEN as u32).unwrap(), vec![120u8; LEN]);
    }
    fs.sync().unwrap();
    drop(fs);
    common::assert_fs_clean(&mem);
}

/// Counts file data writes on their way to a memory device.
struct CountingDevice {
    inner: Arc<MemDevice>,
    data_writes: AtomicUsize,
}

impl Device for CountingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_data_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.data_writes.fetch_add(1, Ordering::SeqCst);
        self.inner.write_data_at(buf, offset)
    }
    fn barrier(&self) -> canopy::Result<()> {
        self.inner.barrier()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Random writes flushed together are laid end to end on the device and
/// written with a few device writes, not one per write, and read back
/// right before and after a commit and a reopen (one of them unaligned,
/// so its sectors' old edges are read back and kept).
#[test]
fn random_writes_flushed_together_are_written_as_one_run() {
    const BLOCKS: u64 = 1024;
    let mem = Arc::new(MemDevice::new(256 << 20));
    let dev = Arc::new(CountingDevice {
        inner: mem.clone(),
        data_writes: AtomicUsize::new(0),
    });
    let split = FormatOptions {
        mixed: Some(false),
        ..FormatOptions::default()
    };
    let e = Engine::format(dev.clone(), &split).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(e)).unwrap());
    let f = new_file(&fs, "f");
    let mut model = pattern(1, (BLOCKS * 4096) as usize);
    fs.write(f, 0, &model).unwrap();
    fs.sync().unwrap();
    // Every seventh block (a step prime to the count, so each once), in a
    // scattered order, and one write across a block edge.
    let mut rewrites: Vec<(u64, Vec<u8>)> = (0..BLOCKS / 4)
        .map(|i| ((i * 7 % BLOCKS) * 4096, vec![(i % 250) as u8 + 3; 4096]))
        .collect();
    rewrites.push((4096 * 5 + 1000, vec![0xEE; 5000]));
    let before = dev.data_writes.load(Ordering::SeqCst);
    for (at, data) in &rewrites {
        fs.write(f, *at, data).unwrap();
        model[*at as usize..*at as usize + data.len()].copy_from_slice(data);
    }
    fs.fsync(f).unwrap();
    let writes = dev.data_writes.load(Ordering::SeqCst) - before;
    assert!(
        writes <= 4,
        "{} scattered writes took {writes} device writes",
        rewrites.len()
    );
    assert_eq!(fs.read(f, 0, model.len() as u32).unwrap(), model);
    fs.sync().unwrap();
    drop(fs);
    let e = Engine::open(mem.clone() as Arc<dyn Device>, &Default::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    assert_eq!(fs.read(f, 0, model.len() as u32).unwrap(), model);
    drop(fs);
    common::assert_fs_clean(&mem);
}

/// A file written all the time, with no engine lock per write, still
/// gets its fsyncs and the commit through: a flush takes what was
/// buffered when it began and leaves later writes for the next one
/// (one that took whatever it found would chase the writer for ever, and
/// the commit would wait for its flush lock). Then every write is there,
/// in the file and after a reopen, and no space stays held for writes.
#[test]
fn flushes_of_a_file_written_all_along_end() {
    const SPAN: u64 = 16 << 20;
    let mem = Arc::new(MemDevice::new(512 << 20));
    let fs = new_fs(mem.clone());
    let f = new_file(&fs, "f");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        thread::spawn(move || {
            let mut model = vec![0u8; SPAN as usize];
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let (mut n, mut end) = (0u32, 0u64);
            while !stop.load(Ordering::SeqCst) || n < 1000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = x % (SPAN / 4096) * 4096;
                let data = vec![(n % 251) as u8 + 1; 4096];
                fs.write(f, at, &data).unwrap();
                model[at as usize..at as usize + 4096].copy_from_slice(&data);
                end = end.max(at + 4096);
                n += 1;
            }
            model.truncate(end as usize);
            model
        })
    };
    for round in 0..4 {
        let (a, b) = (fs.clone(), fs.clone());
        assert!(
            finishes(move || a.fsync(f)).is_some_and(|r| r.is_ok()),
            "fsync {round} did not end while the file was written"
        );
        assert!(
            finishes(move || b.sync()).is_some_and(|r| r.is_ok()),
            "sync {round} did not end while the file was written"
        );
    }
    stop.store(true, Ordering::SeqCst);
    let model = writer.join().unwrap();
    fs.sync().unwrap();
    assert_eq!(
        fs.engine().data_reserved(),
        0,
        "space still held for buffered writes after a sync"
    );
    let size = model.len();
    assert_eq!(fs.getattr(f).unwrap().size as usize, size);
    assert_eq!(fs.read(f, 0, size as u32).unwrap(), model);
    drop(fs);
    let e = Engine::open(mem.clone() as Arc<dyn Device>, &Default::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size as usize, size);
    assert_eq!(fs.read(f, 0, size as u32).unwrap(), model);
    drop(fs);
    common::assert_fs_clean(&mem);
}

/// Buffered writes keep the size and times they set in memory until a
/// flush stores them; what a truncate or an explicit time sets must still
/// win over them, before and after the data reaches the tree.
#[test]
fn truncate_and_explicit_times_win_over_buffered_writes() {
    use canopy::format::inode::Timespec;
    use canopy::fs::SetAttr;
    let mem = Arc::new(MemDevice::new(64 << 20));
    let fs = new_fs(mem.clone());
    let f = new_file(&fs, "f");
    // Enough writes that the later ones are paid from the file's credit.
    for i in 0..64u64 {
        fs.write(f, i * 4096, &pattern(i as u8, 4096)).unwrap();
    }
    assert_eq!(fs.getattr(f).unwrap().size, 64 * 4096);
    let past = Timespec {
        sec: 1_000_000_000,
        nsec: 5,
    };
    let set = SetAttr {
        mtime: Some(past),
        ..Default::default()
    };
    fs.setattr(f, &set).unwrap();
    assert_eq!(fs.getattr(f).unwrap().mtime, past, "explicit mtime lost");
    fs.write(f, 64 * 4096, b"tail").unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, 64 * 4096 + 4);
    assert!(a.mtime.sec > past.sec, "a later write sets the mtime");
    let shrink = SetAttr {
        size: Some(100),
        ..Default::default()
    };
    fs.setattr(f, &shrink).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 100);
    fs.write(f, 50, b"0123456789").unwrap();
    assert_eq!(
        fs.getattr(f).unwrap().size,
        100,
        "a write inside stays inside"
    );
    fs.setattr(f, &set).unwrap();
    let mut want = pattern(0, 100);
    want[50..60].copy_from_slice(b"0123456789");
    assert_eq!(fs.read(f, 0, 4096).unwrap(), want);
    fs.sync().unwrap();
    drop(fs);
    let e = Engine::open(mem.clone() as Arc<dyn Device>, &Default::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.mtime), (100, past));
    assert_eq!(fs.read(f, 0, 4096).unwrap(), want);
    drop(fs);
    common::assert_fs_clean(&mem);
}

/// On a device that writes in units (an RBD image's 4 MiB objects), a
/// sequential writer's flushes cover whole units: its 1 MiB writes grow
/// ranges of 8 MiB, each flushed as one write, and each data write of a
/// unit or more starts on a unit boundary, also after a short flush left
/// the file's last extent ending inside one (the bytes up to the next
/// boundary stay free). The file reads back whole, before and after a
/// reopen, and check finds the image clean.
#[test]
fn a_sequential_writers_flushes_cover_whole_units_of_the_device() {
    const UNIT: u64 = 4 << 20;
    const MIB: usize = 1 << 20;
    let rec = Arc::new(
        canopy::dev::crash::RecordingDevice::new(vec![0; 512 << 20]).with_write_unit(UNIT),
    );
    let split = FormatOptions {
        mixed: Some(false),
        ..FormatOptions::default()
    };
    let e = Engine::format(rec.clone() as Arc<dyn Device>, &split).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(e)).unwrap());
    let f = new_file(&fs, "f");
    // In 1 MiB writes, as FUSE sends them: 12 MiB, then 5 MiB and a
    // sector flushed alone (it ends inside a unit), then 8 MiB more (all
    // below the superblock copy at 64 MiB, which splits free space).
    let fill = |i: usize| vec![0xA0 | ((i % 15) as u8 + 1); MIB];
    let mut model = Vec::new();
    let append = |model: &mut Vec<u8>, data: &[u8]| {
        fs.write(f, model.len() as u64, data).unwrap();
        model.extend(data);
    };
    for i in 0..12 {
        append(&mut model, &fill(i));
    }
    fs.sync().unwrap();
    for _ in 0..5 {
        append(&mut model, &[0xB1; MIB]);
    }
    append(&mut model, &[0xB1; 4096]);
    fs.fsync(f).unwrap();
    for i in 0..8 {
        append(&mut model, &fill(i));
    }
    fs.sync().unwrap();
    assert_eq!(fs.read(f, 0, model.len() as u32).unwrap(), model);
    // File data is the only thing written that is all 0xA1..0xAF or 0xB1.
    let data_writes: Vec<(u64, u64)> = rec
        .ops()
        .iter()
        .filter_map(|op| match op {
            canopy::dev::crash::Op::Write { offset, data }
                if data.len() >= 1 << 16 && data.iter().all(|&b| b > 0xA0 && b <= 0xB1) =>
            {
                Some((*offset, data.len() as u64))
            }
            _ => None,
        })
        .collect();
    let written: u64 = data_writes.iter().map(|w| w.1).sum();
    assert!(written >= model.len() as u64, "{data_writes:x?}");
    for &(offset, len) in data_writes.iter().filter(|w| w.1 >= UNIT) {
        assert_eq!(
            offset % UNIT,
            0,
            "a write of {len} bytes at {offset:#x}: {data_writes:x?}"
        );
    }
    // The appends grow ranges of 8 MiB, each flushed alone: only the
    // fsync of 5 MiB and a sector writes part of a unit.
    let partial = data_writes.iter().filter(|w| w.1 % UNIT != 0).count();
    assert_eq!(partial, 1, "writes of part of a unit: {data_writes:x?}");
    drop(fs);
    let dev = Arc::new(MemDevice::from_bytes(rec.contents()));
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &Default::default()).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    assert_eq!(fs.read(f, 0, model.len() as u32).unwrap(), model);
    drop(fs);
    common::assert_fs_clean(&dev);
}
