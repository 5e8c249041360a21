//! Canopy on Ceph RBD images (issue 42), against the real cluster
//! scripts/ceph-dev.sh starts: scripts/test.sh's Ceph step sets
//! `CANOPY_TEST_CEPH` to its ceph.conf and runs these. Without it they
//! return at once (that step reports a missing Ceph, and fails under
//! `CANOPY_REQUIRE_ALL=1`).
//!
//! The POSIX subset and the exerciser with kill -9 run on RBD in that step
//! too, through `CANOPY_TEST_RBD` (see `common::mounted`).

mod common;

use common::mounted::{
    can_mount, canopy, canopy_ok, fill_until_full, rbd_name, rbd_parts, statfs_total, umount,
    write_synced, RbdImage,
};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ceph_conf() -> Option<String> {
    let conf = std::env::var("CANOPY_TEST_CEPH")
        .ok()
        .filter(|c| !c.is_empty());
    if conf.is_none() {
        eprintln!("no cluster: scripts/test.sh's Ceph step runs these (CANOPY_TEST_CEPH)");
    }
    conf.filter(|_| can_mount())
}

/// `rbd -c CONF ARGS`, required to succeed; its output.
fn rbd(conf: &str, args: &[&str]) -> Vec<u8> {
    cluster_tool("rbd", conf, args)
}

/// `ceph -c CONF ARGS`, required to succeed; its output.
fn ceph(conf: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&cluster_tool("ceph", conf, args)).into_owned()
}

fn cluster_tool(program: &str, conf: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(program)
        .arg("-c")
        .arg(conf)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A new RBD image of `size`, formatted by `canopy mkfs` (which creates
/// it), and a mount point in a directory; both go with the first value.
fn fresh(conf: &str, size: &str) -> ((tempfile::TempDir, RbdImage), PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let img = rbd_name(conf);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = canopy()
        .args(["mkfs", "-q", "-s", size])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ((dir, RbdImage(img.clone())), img, mnt)
}

/// A daemon in the foreground whose log goes to `log`; unmounted and
/// killed on drop.
struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Daemon {
    /// Mounts `img` on `mnt` with `opts`, or returns the daemon's error.
    /// The daemon keeps its log on stderr (with `--notify-ready` it would
    /// move it to the kernel log once mounted).
    fn mount(img: &Path, mnt: &Path, opts: &str, log: &Path) -> Result<Daemon, String> {
        let mut cmd = canopy();
        cmd.args(["mount", "-f"]);
        if !opts.is_empty() {
            cmd.args(["-o", opts]);
        }
        let log_file = std::fs::File::create(log).unwrap();
        let mut child = cmd
            .arg(img)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if is_mounted(mnt) {
                return Ok(Daemon {
                    child: Some(child),
                    mnt: mnt.to_path_buf(),
                });
            }
            if child.try_wait().unwrap().is_some() {
                return Err(std::fs::read_to_string(log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{} not mounted after 90 s", mnt.display());
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Unmounts and requires a clean exit.
    fn unmount(mut self) {
        assert!(umount(&self.mnt), "umount failed");
        let st = self.child.take().unwrap().wait().unwrap();
        assert!(st.success(), "daemon exited with {st}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_str().unwrap();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want) && l.contains("fuse.canopy"))
}

fn check_clean(img: &Path) {
    let out = canopy().arg("check").arg(img).output().unwrap();
    assert!(
        out.status.success(),
        "check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_rbd_image_is_made_mounted_checked_and_read_back() {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "256M");
    let log = dir.0.path().join("log");
    let d = Daemon::mount(&img, &mnt, "", &log).unwrap();
    let big = common::noise(24 << 20, 7);
    write_synced(&mnt.join("big"), &big).unwrap();
    write_synced(&mnt.join("small"), b"hello").unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    d.unmount();
    check_clean(&img);
    let d = Daemon::mount(&img, &mnt, "ro", &log).unwrap();
    assert!(std::fs::read(mnt.join("big")).unwrap() == big);
    assert_eq!(std::fs::read(mnt.join("small")).unwrap(), b"hello");
    assert!(mnt.join("d").is_dir());
    d.unmount();
}

/// A quota on pool `rbd`, lifted when dropped (also when the test fails:
/// the other tests share the pool).
struct PoolQuota(String);

impl PoolQuota {
    fn set_bytes(conf: &str, bytes: u64) -> PoolQuota {
        ceph(
            conf,
            &[
                "osd",
                "pool",
                "set-quota",
                "rbd",
                "max_bytes",
                &bytes.to_string(),
            ],
        );
        PoolQuota(conf.to_string())
    }
}

impl Drop for PoolQuota {
    fn drop(&mut self) {
        ceph_unchecked(
            &self.0,
            &["osd", "pool", "set-quota", "rbd", "max_bytes", "0"],
        );
    }
}

/// `ceph -c CONF ARGS` for a guard's drop: not the asserting [`ceph`], as a
/// panic inside a drop during a failing test would abort the run.
fn ceph_unchecked(conf: &str, args: &[&str]) {
    let _ = Command::new("ceph").arg("-c").arg(conf).args(args).output();
}

/// A full pool holds every write until space is freed (librbd waits, as
/// the kernel's rbd does, rather than fail): the daemon says so in its
/// log after 30 s instead of leaving the waiting fsync silent, and once
/// the quota is lifted the write and its fsync finish, nothing lost.
/// Meanwhile the filesystem still answers what needs no write (a listing,
/// a read), with a discard of space freed just before likely under way.
/// (Engine-level, `a_discard_in_flight_blocks_no_other_operation` holds a
/// discard for certain: a pool over its quota here did not always hold
/// one.)
#[test]
fn a_full_pool_holds_an_fsync_and_the_daemon_says_why() {
    a_held_fsync_is_named_and_then_finishes(true, |conf| {
        // Anything in the pool passes a quota of one byte.
        let quota = PoolQuota::set_bytes(conf, 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ceph(conf, &["health", "detail"]).contains("POOL_FULL") {
            assert!(Instant::now() < deadline, "the pool was not marked full");
            std::thread::sleep(Duration::from_millis(500));
        }
        quota
    });
}

/// A mounted image with a committed file; `hold` makes the cluster hold
/// requests until the guard it returns drops. An fsync then waits, the
/// daemon's log names the held request, and once the guard drops the
/// fsync finishes: every file written reads back, check clean. With
/// `answers`, a listing and a read answer while the write is held.
fn a_held_fsync_is_named_and_then_finishes<G>(answers: bool, hold: impl FnOnce(&str) -> G) {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "256M");
    let log = dir.0.path().join("log");
    let d = Daemon::mount(&img, &mnt, "", &log).unwrap();
    write_synced(&mnt.join("before"), b"committed").unwrap();
    // Freed, committed and due for discard 2 s later, about when the
    // cluster starts holding requests.
    std::fs::write(mnt.join("freed"), common::noise(32 << 20, 7)).unwrap();
    canopy_ok(&["sync", mnt.to_str().unwrap()], dir.0.path());
    std::fs::remove_file(mnt.join("freed")).unwrap();
    canopy_ok(&["sync", mnt.to_str().unwrap()], dir.0.path());
    let held = hold(&conf);
    let (writer, written) = a_held_write_named_in(&log, &mnt);
    if answers {
        assert_answers_while_held(&mnt);
    }
    drop(held);
    writer
        .join()
        .unwrap()
        .expect("the held write once the cluster takes it");
    d.unmount();
    check_clean(&img);
    let d = Daemon::mount(&img, &mnt, "ro", &log).unwrap();
    for (path, data) in &written {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }
    assert_eq!(std::fs::read(mnt.join("before")).unwrap(), b"committed");
    d.unmount();
}

/// A listing and a read of `mnt` answer within 20 s while the cluster
/// holds a write: nothing that needs no write waits for one.
fn assert_answers_while_held(mnt: &Path) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mnt = mnt.to_path_buf();
    std::thread::spawn(move || {
        let listed = std::fs::read_dir(&mnt).map(|d| d.count());
        let before = std::fs::read(mnt.join("before"));
        let _ = tx.send((listed, before));
    });
    let (listed, before) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a listing and a read while the cluster holds a write");
    assert!(listed.unwrap() >= 2);
    assert_eq!(before.unwrap(), b"committed");
}

/// A thread writing and fsyncing a file.
type Writer = std::thread::JoinHandle<std::io::Result<()>>;

/// Starts writing 4 MiB to a file in `mnt` and fsyncing it on a thread
/// the cluster will hold, waits until the daemon's `log` names the held
/// request (at most 90 s), and asserts the write is still held. Returns
/// the writer and every file written with what it holds.
///
/// The monitors report a full pool a moment before the OSDs and the
/// client act on the map that says so, and a write sent meanwhile goes
/// through (3 runs of 11 here, one at 644367d: each write finished
/// within a second of the report). A write that finishes within 5 s of
/// the hold is therefore followed by another, up to three.
fn a_held_write_named_in(log: &Path, mnt: &Path) -> (Writer, Vec<(PathBuf, Vec<u8>)>) {
    let mut written = Vec::new();
    let mut writer = None;
    for attempt in 0..3u64 {
        let path = mnt.join(format!("held{attempt}"));
        let data = common::noise(4 << 20, 11 + attempt);
        written.push((path.clone(), data.clone()));
        let w = std::thread::spawn(move || write_synced(&path, &data));
        let early = Instant::now() + Duration::from_secs(5);
        while !w.is_finished() && Instant::now() < early {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !w.is_finished() {
            writer = Some(w);
            break;
        }
        w.join().unwrap().expect("a write sent before the hold");
        eprintln!("write {attempt} went through before the hold reached it: another");
    }
    let writer = writer.expect("the cluster held none of three writes");
    let said = "the Ceph cluster has not answered a request yet";
    let deadline = Instant::now() + Duration::from_secs(90);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(said)
    {
        assert!(
            !writer.is_finished(),
            "the write finished on a held cluster"
        );
        assert!(
            Instant::now() < deadline,
            "the daemon said nothing of the wait"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        !writer.is_finished(),
        "the write finished on a held cluster"
    );
    (writer, written)
}

/// `ceph osd pause` holds every request, and librbd's own calls with them
/// (the writer's look at its exclusive lock too): the daemon's watchdog
/// thread still names the held request after 30 s, and once the cluster
/// is unpaused the write and its fsync finish, nothing lost.
#[test]
fn a_paused_cluster_holds_an_fsync_and_the_daemon_says_why() {
    // Reads wait on a paused cluster too: not asked for.
    a_held_fsync_is_named_and_then_finishes(false, OsdsPaused::pause);
}

/// The cluster's OSDs paused (`ceph osd pause`) until this drops, also
/// when a test fails.
struct OsdsPaused(String);

impl OsdsPaused {
    fn pause(conf: &str) -> OsdsPaused {
        ceph(conf, &["osd", "pause"]);
        OsdsPaused(conf.to_string())
    }
}

impl Drop for OsdsPaused {
    fn drop(&mut self) {
        ceph_unchecked(&self.0, &["osd", "unpause"]);
    }
}

#[test]
fn a_second_writer_is_refused_and_told_who_holds_the_image() {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "128M");
    let other = dir.0.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let a = Daemon::mount(&img, &mnt, "", &dir.0.path().join("a.log")).unwrap();
    write_synced(&mnt.join("f"), b"one").unwrap();
    let t = Instant::now();
    let err = Daemon::mount(&img, &other, "", &dir.0.path().join("b.log"))
        .err()
        .expect("a second writer mounted");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(err.contains("in use by another writer"), "{err}");
    assert!(err.contains("--break-lock"), "{err}");
    assert!(err.contains("127.0.0.1"), "the holder's address: {err}");
    let err = Daemon::mount(&img, &other, "ro", &dir.0.path().join("c.log"))
        .err()
        .expect("a reader mounted beside a writer");
    assert!(err.contains("read-write elsewhere"), "{err}");
    // The holder is untouched.
    write_synced(&mnt.join("g"), b"two").unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"one");
    a.unmount();
    check_clean(&img);
}

/// A keyring for `client.NAME` with the caps an RBD user gets (`profile
/// rbd`), which include blocklisting a lock holder it breaks.
fn client_keyring(conf: &str, name: &str, dir: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.keyring"));
    let out = Command::new("ceph")
        .args([
            "-c",
            conf,
            "auth",
            "get-or-create",
            &format!("client.{name}"),
        ])
        .args(["mon", "profile rbd", "osd", "profile rbd pool=rbd"])
        .arg("-o")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ceph auth: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// `img` as client `name` with its own keyring ("another host").
fn as_client(img: &Path, name: &str, keyring: &Path) -> PathBuf {
    PathBuf::from(format!(
        "{}&id={name}&keyring={}",
        img.display(),
        keyring.display()
    ))
}

#[test]
fn a_takeover_fences_a_paused_writer() {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt_a) = fresh(&conf, "256M");
    let mnt_b = dir.0.path().join("b");
    std::fs::create_dir(&mnt_b).unwrap();
    let img_a = as_client(
        &img,
        "canopy-a",
        &client_keyring(&conf, "canopy-a", dir.0.path()),
    );
    let img_b = as_client(
        &img,
        "canopy-b",
        &client_keyring(&conf, "canopy-b", dir.0.path()),
    );
    let log_a = dir.0.path().join("a.log");
    let a = Daemon::mount(&img_a, &mnt_a, "", &log_a).unwrap();
    write_synced(&mnt_a.join("before"), b"acknowledged by A").unwrap();
    // A file A has open, to write through after it wakes.
    let late = std::fs::File::create(mnt_a.join("late")).unwrap();
    unsafe { libc::kill(a.pid(), libc::SIGSTOP) };
    let t = Instant::now();
    let b = Daemon::mount(&img_b, &mnt_b, "takeover", &dir.0.path().join("b.log"))
        .expect("take over from a paused writer");
    write_synced(&mnt_b.join("from-b"), b"written by B").unwrap();
    let failover = t.elapsed();
    eprintln!("takeover to B's first fsynced write: {failover:?}");
    assert!(failover < Duration::from_secs(30), "{failover:?}");
    unsafe { libc::kill(a.pid(), libc::SIGCONT) };
    // A's writes can no longer reach the image.
    let r = late
        .write_all_at(&[7u8; 65536], 0)
        .and_then(|()| late.sync_all());
    assert!(r.is_err(), "a fenced writer's fsync succeeded");
    let log = std::fs::read_to_string(&log_a).unwrap();
    assert!(log.contains("blocklisted"), "A's log says why: {log}");
    drop(late);
    drop(a);
    assert_eq!(
        std::fs::read(mnt_b.join("before")).unwrap(),
        b"acknowledged by A"
    );
    assert_eq!(
        std::fs::read(mnt_b.join("from-b")).unwrap(),
        b"written by B"
    );
    // A may have committed the empty file before it was paused; none of
    // what it wrote after can be there.
    let late_len = std::fs::metadata(mnt_b.join("late")).map_or(0, |m| m.len());
    assert_eq!(late_len, 0);
    b.unmount();
    check_clean(&img);
}

/// Writes `chunk`-sized files until the filesystem is full; their names.
fn fill(mnt: &Path, prefix: &str, chunk: usize) -> Vec<PathBuf> {
    fill_until_full(mnt, prefix, &common::noise(chunk, 3))
}

#[test]
fn a_full_filesystem_grows_after_rbd_resize() {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "96M");
    let d = Daemon::mount(&img, &mnt, "", &dir.0.path().join("log")).unwrap();
    let before = statfs_total(&mnt);
    let first = fill(&mnt, "a", 4 << 20);
    assert!(!first.is_empty());
    rbd(
        &conf,
        &["resize", "--size", "384M", &rbd_parts(&img).unwrap().0],
    );
    let resize = ["filesystem", "resize", "--json", "max", "."];
    let grown: serde_json::Value = serde_json::from_str(&canopy_ok(&resize, &mnt)).unwrap();
    assert_eq!(grown["new_bytes"], 384u64 << 20);
    assert!(
        statfs_total(&mnt) > before + (200 << 20),
        "statfs shows the new space at once"
    );
    let second = fill(&mnt, "b", 4 << 20);
    assert!(second.len() > 50, "only {} more files", second.len());
    d.unmount();
    check_clean(&img);
    let d = Daemon::mount(&img, &mnt, "ro", &dir.0.path().join("log2")).unwrap();
    let data = common::noise(4 << 20, 3);
    for p in first.iter().chain(&second) {
        assert!(std::fs::read(p).unwrap() == data, "{}", p.display());
    }
    d.unmount();
}

/// Bytes of `img` the cluster stores (`rbd du`'s used size).
fn rbd_used(conf: &str, img: &Path) -> u64 {
    let image = rbd_parts(img).unwrap().0;
    let out = rbd(conf, &["du", "--format", "json", &image]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    v["images"][0]["used_size"].as_u64().unwrap()
}

/// Issue 57, item 2: on RBD, deleted files' objects go back to the
/// cluster once the commit that frees them is durable, with
/// `discard=async` (the default) and with `canopy filesystem trim` under
/// `nodiscard`: `rbd du` falls to within 5% of what is in use, plus the
/// 4 MiB objects that hold a live tree block or a superblock (an object
/// with any live byte stays whole: about 13 on this image, both copies of
/// the metadata and system groups and the superblocks' objects).
#[test]
fn freed_space_goes_back_to_the_rbd_image() {
    let Some(conf) = ceph_conf() else { return };
    // 4 GiB, so that the trim's unallocated range is over 2 GiB, which
    // one rbd_discard cannot take.
    let (dir, img, mnt) = fresh(&conf, "4G");
    let d = Daemon::mount(&img, &mnt, "", &dir.0.path().join("log")).unwrap();
    let keep = common::noise(16 << 20, 21);
    write_synced(&mnt.join("keep"), &keep).unwrap();
    write_synced(&mnt.join("big"), &common::noise(400 << 20, 22)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert!(rbd_used(&conf, &img) > 400 << 20);
    let near_used = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (stored, used) = (rbd_used(&conf, &img), common::mounted::used_bytes(&mnt));
            if stored <= used + used / 20 + (64 << 20) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: rbd du {stored} for {used} in use"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    std::fs::remove_file(mnt.join("big")).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    near_used("discard=async");
    d.unmount();
    check_clean(&img);

    let d = Daemon::mount(&img, &mnt, "nodiscard", &dir.0.path().join("log2")).unwrap();
    write_synced(&mnt.join("big"), &common::noise(400 << 20, 23)).unwrap();
    std::fs::remove_file(mnt.join("big")).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        rbd_used(&conf, &img) > 300 << 20,
        "discarded under nodiscard"
    );
    let t = Instant::now();
    canopy_ok(&["filesystem", "trim", "."], &mnt);
    near_used("trim");
    eprintln!("trim took {:?}", t.elapsed());
    assert!(std::fs::read(mnt.join("keep")).unwrap() == keep);
    d.unmount();
    check_clean(&img);
}

/// One file the writer of the snapshot test wrote: its number, and when
/// its write began and its fsync returned.
type Written = (usize, Instant, Instant);

fn snapshot_file(i: usize) -> Vec<u8> {
    common::noise(64 << 10 | (i % 7) << 14, 1000 + i as u64)
}

/// Issue 57, item 3: a writer under load; three times `filesystem
/// freeze`, `rbd snap create`, `filesystem thaw`; then the three
/// snapshots mounted read-only at once, each by another client (another
/// host), while the writer goes on. Each holds exactly the files fsynced
/// before its freeze, none begun after its thaw (one in flight may be
/// there in part), checks and scrubs clean, and sends a subvolume.
#[test]
fn snapshots_taken_between_freeze_and_thaw_mount_read_only_on_other_clients() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "1G");
    let base = dir.0.path().to_path_buf();
    let d = Daemon::mount(&img, &mnt, "", &base.join("log")).unwrap();
    let image = rbd_parts(&img).unwrap().0;
    canopy_ok(&["subvolume", "create", "sv"], &mnt);
    let in_sv = common::noise(300 << 10, 77);
    write_synced(&mnt.join("sv/file"), &in_sv).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written: Arc<Mutex<Vec<Written>>> = Arc::default();
    let writer = {
        let (stop, written, mnt) = (stop.clone(), written.clone(), mnt.clone());
        std::thread::spawn(move || {
            for i in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let began = Instant::now();
                write_synced(&mnt.join(format!("w{i}")), &snapshot_file(i)).unwrap();
                written.lock().unwrap().push((i, began, Instant::now()));
            }
        })
    };
    let mut snaps = Vec::new();
    for n in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        let freezing = Instant::now();
        canopy_ok(&["filesystem", "freeze", "."], &mnt);
        rbd(&conf, &["snap", "create", &format!("{image}@s{n}")]);
        let thawing = Instant::now();
        canopy_ok(&["filesystem", "thaw", "."], &mnt);
        snaps.push((n, freezing, thawing));
    }
    let readers: Vec<(Daemon, PathBuf)> = snaps
        .iter()
        .map(|&(n, ..)| {
            let spec = img.to_str().unwrap().replacen('?', &format!("@s{n}?"), 1);
            let name = format!("canopy-snap-{n}");
            let spec = as_client(
                Path::new(&spec),
                &name,
                &client_keyring(&conf, &name, &base),
            );
            let at = base.join(format!("s{n}"));
            std::fs::create_dir(&at).unwrap();
            let log = base.join(format!("s{n}.log"));
            (Daemon::mount(&spec, &at, "ro", &log).unwrap(), spec)
        })
        .collect();
    let done = written.lock().unwrap().clone();
    assert!(
        done.len() > 20,
        "the writer wrote only {} files",
        done.len()
    );
    for ((n, freezing, thawing), (reader, spec)) in snaps.iter().zip(&readers) {
        let mut held = 0;
        for &(i, began, fsynced) in &done {
            let got = std::fs::read(reader.mnt.join(format!("w{i}")));
            let want = snapshot_file(i);
            if fsynced < *freezing {
                assert!(got.unwrap() == want, "snapshot {n}: w{i} differs");
                held += 1;
            } else if began > *thawing {
                assert!(
                    got.is_err(),
                    "snapshot {n}: w{i}, begun after the thaw, is there"
                );
            } else if let Ok(got) = got {
                assert!(want.starts_with(&got), "snapshot {n}: w{i} is not a prefix");
            }
        }
        assert!(held > 0, "snapshot {n} holds no file");
        assert!(std::fs::read(reader.mnt.join("sv/file")).unwrap() == in_sv);
        check_clean(Path::new(spec));
        let scrub = canopy().arg("scrub").arg(spec).output().unwrap();
        assert!(
            scrub.status.success(),
            "scrub of snapshot {n}: {}",
            String::from_utf8_lossy(&scrub.stderr)
        );
        // Any subvolume sends from a read-only mount: nothing can change.
        let send = canopy()
            .args(["send", "-q", "sv"])
            .current_dir(&reader.mnt)
            .output()
            .unwrap();
        assert!(
            send.status.success() && send.stdout.len() > in_sv.len(),
            "send from snapshot {n}: {}",
            String::from_utf8_lossy(&send.stderr)
        );
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    for (reader, _) in readers {
        reader.unmount();
    }
    d.unmount();
    check_clean(&img);
}

/// `canopy mount SPEC` with a timeout; its exit status, stderr and time.
fn mount_fails(spec: &str, mnt: &Path) -> (String, Duration) {
    let t = Instant::now();
    let out = canopy().args(["mount", spec]).arg(mnt).output().unwrap();
    assert!(!out.status.success(), "mounted {spec}");
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

#[test]
fn bad_names_credentials_and_a_down_cluster_fail_clearly() {
    let Some(conf) = ceph_conf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let (e, _) = mount_fails(&format!("rbd:nopool/x?conf={conf}"), &mnt);
    assert!(
        e.contains("pool nopool") && e.contains("does not exist"),
        "{e}"
    );
    let (e, _) = mount_fails(&format!("rbd:rbd/no-such-image?conf={conf}"), &mnt);
    assert!(e.contains("no such image"), "{e}");
    let (e, t) = mount_fails(&format!("rbd:rbd/x?conf={conf}&id=nobody"), &mnt);
    assert!(e.contains("client.nobody"), "{e}");
    assert!(t < Duration::from_secs(30), "{t:?}");
    let (e, _) = mount_fails("rbd:rbd", &mnt);
    assert!(e.contains("rbd:POOL/IMAGE"), "{e}");
    // A cluster that is down: its monitors do not answer.
    let down = dir.path().join("down.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let text: String = text
        .lines()
        .map(|l| match l.trim_start().starts_with("mon host") {
            true => "mon host = [v2:127.0.0.1:3999,v1:127.0.0.1:3998]".to_string(),
            false => l.to_string(),
        })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&down, text).unwrap();
    let (e, t) = mount_fails(&format!("rbd:rbd/x?conf={}", down.display()), &mnt);
    assert!(t <= Duration::from_secs(30), "a down cluster took {t:?}");
    assert!(e.contains("no monitor answered"), "{e}");
    let out = canopy()
        .args([
            "mkfs",
            &format!("rbd:rbd/missing-{}?conf={conf}", std::process::id()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size"));
}

/// The cluster's directory (where scripts/ceph-dev.sh keeps it).
fn cluster_dir(conf: &str) -> PathBuf {
    Path::new(conf).parent().unwrap().to_path_buf()
}

fn ceph_dev(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ceph-dev.sh");
    let st = Command::new("bash")
        .arg(script)
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "ceph-dev.sh {args:?}");
}

#[test]
fn an_osd_killed_during_writes_loses_nothing() {
    let Some(conf) = ceph_conf() else { return };
    let (dir, img, mnt) = fresh(&conf, "256M");
    let d = Daemon::mount(&img, &mnt, "", &dir.0.path().join("log")).unwrap();
    let cdir = cluster_dir(&conf);
    let cdir = cdir.to_str().unwrap();
    let mut written = Vec::new();
    for i in 0..24 {
        if i == 4 {
            ceph_dev(&["kill-osd", cdir, "2"]);
        }
        let data = common::noise(1 << 20, i);
        write_synced(&mnt.join(format!("f{i}")), &data).unwrap();
        written.push(data);
    }
    ceph_dev(&["start-osd", cdir, "2"]);
    d.unmount();
    check_clean(&img);
    let d = Daemon::mount(&img, &mnt, "ro", &dir.0.path().join("log2")).unwrap();
    for (i, data) in written.iter().enumerate() {
        assert!(
            std::fs::read(mnt.join(format!("f{i}"))).unwrap() == *data,
            "f{i}"
        );
    }
    d.unmount();
}
