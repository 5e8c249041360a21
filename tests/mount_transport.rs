//! The FUSE transports: a mount is served by the one asked for (threads
//! named `fuse-dev-N` read /dev/fuse; `fuse-ring-Q-N` serve io_uring
//! queue Q), or refused with a clear error when the kernel does not
//! offer io_uring; `auto` picks io_uring exactly when it is offered.
//! Every other mount test runs once per transport (scripts/test.sh).

mod common;

use common::mounted::{can_mount, canopy, fresh_image};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// Whether the kernel offers FUSE over io_uring to new mounts.
fn uring_offered() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| matches!(v.trim(), "Y" | "1"))
}

/// The names of the daemon's threads, once every thread but the main
/// one has named itself (a thread sets its name when it first runs,
/// which on a loaded machine can be after the mount is ready).
fn threads(pid: u32) -> Vec<String> {
    let read = || {
        let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect();
        names.sort();
        names
    };
    for _ in 0..100 {
        let names = read();
        if names.iter().filter(|n| *n == "canopy").count() <= 1 {
            return names;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    read()
}

fn is_mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == mnt.to_str())
}

/// A mounted daemon; a test that fails leaves no mount behind: on drop
/// the mount is detached and the daemon killed.
struct Daemon {
    child: Child,
    mnt: PathBuf,
}

impl std::ops::Deref for Daemon {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Mounts `img` on `mnt` with `opts`: the daemon once it is ready, or
/// its error output.
fn mount(img: &Path, mnt: &Path, opts: &str) -> Result<Daemon, String> {
    let mut child = canopy()
        .args(["mount", "-f", "--notify-ready", "-o", opts])
        .arg(img)
        .arg(mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if line.trim() == "canopy-ready" {
        return Ok(Daemon {
            child,
            mnt: mnt.to_path_buf(),
        });
    }
    let out = child.wait_with_output().unwrap();
    Err(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Writes and reads back a file through the mount, unmounts, and waits
/// for a clean exit.
fn use_and_unmount(mut daemon: Daemon, mnt: &Path) {
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(mnt.join("f"), &data).unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    // Not kept: an entry holds its directory open.
    let listed = std::fs::read_dir(mnt)
        .unwrap()
        .flatten()
        .any(|e| e.file_name() == "f");
    assert!(listed, "f is not listed");
    assert!(common::mounted::umount(mnt));
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn each_transport_serves_what_was_asked_or_refuses_clearly() {
    if !can_mount() {
        return;
    }
    let (_dir, img, mnt) = fresh_image("256M");

    let d = mount(&img, &mnt, "transport=dev,threads=3").expect("dev mount");
    let t = threads(d.id());
    let dev = t.iter().filter(|n| n.starts_with("fuse-dev-")).count();
    assert_eq!(dev, 3, "{t:?}");
    assert!(!t.iter().any(|n| n.starts_with("fuse-ring-")), "{t:?}");
    use_and_unmount(d, &mnt);

    match mount(&img, &mnt, "transport=uring") {
        Ok(d) => {
            assert!(
                uring_offered(),
                "mounted on io_uring the kernel does not offer"
            );
            let t = threads(d.id());
            // One /dev/fuse reader for FORGET and INTERRUPT, and rings.
            assert_eq!(t.iter().filter(|n| n.starts_with("fuse-dev-")).count(), 1);
            assert!(t.iter().filter(|n| n.starts_with("fuse-ring-")).count() >= 1);
            use_and_unmount(d, &mnt);
        }
        Err(e) => {
            assert!(!uring_offered(), "io_uring was offered but: {e}");
            assert!(e.contains("enable_uring"), "no way out in: {e}");
            assert!(!is_mounted(&mnt), "a refused mount stayed mounted");
        }
    }

    let d = mount(&img, &mnt, "transport=auto").expect("auto mount");
    let rings = threads(d.id()).iter().any(|n| n.starts_with("fuse-ring-"));
    assert_eq!(
        rings,
        uring_offered(),
        "auto picks io_uring exactly when offered"
    );
    use_and_unmount(d, &mnt);
    assert!(canopy().arg("check").arg(&img).status().unwrap().success());
}

/// CPU time (user and system, clock ticks) the process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th fields of the line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A /dev/fuse reader polls for the next request only briefly after
/// each (`busy_poll=`): a busy mount serves every request, and a mount
/// left idle uses no CPU, whichever the setting, also after writes
/// spaced a millisecond apart have grown the poll past a millisecond.
#[test]
fn busy_polling_serves_and_stops_when_idle() {
    if !can_mount() {
        return;
    }
    let (_dir, img, mnt) = fresh_image("256M");
    for opts in [
        "transport=dev",
        "transport=dev,busy_poll=10000",
        "transport=dev,busy_poll=0",
    ] {
        let d = mount(&img, &mnt, opts).expect(opts);
        let pid = d.id();
        let dir = mnt.join("many");
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..2_000 {
            std::fs::write(dir.join(format!("f{i}")), i.to_string()).unwrap();
        }
        for i in 0..2_000 {
            let got = std::fs::read_to_string(dir.join(format!("f{i}"))).unwrap();
            assert_eq!(got, i.to_string(), "{opts}");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2_000, "{opts}");
        // A write reaches the daemon every time (no writeback cache).
        let mut f = std::fs::File::create(dir.join("spaced")).unwrap();
        for i in 0..500u32 {
            use std::io::Write;
            f.write_all(&i.to_le_bytes()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(f);
        assert_eq!(std::fs::metadata(dir.join("spaced")).unwrap().len(), 2_000);
        // Past the last request's poll and the commit it starts.
        std::thread::sleep(std::time::Duration::from_secs(1));
        let before = cpu_ticks(pid);
        std::thread::sleep(std::time::Duration::from_secs(3));
        let used = cpu_ticks(pid) - before;
        // Ticks are 10 ms: a poller that never slept would show ~300.
        assert!(used <= 10, "{opts}: an idle mount used {used} ticks in 3 s");
        std::fs::remove_dir_all(&dir).unwrap();
        use_and_unmount(d, &mnt);
    }
    assert!(canopy().arg("check").arg(&img).status().unwrap().success());
}

/// A reader thread reads file data into the same reply buffer request
/// after request: a read of holes after one of data must still see
/// zeros, and a short file only its own bytes.
#[test]
fn reads_into_a_reused_buffer_see_no_earlier_bytes() {
    if !can_mount() {
        return;
    }
    let (_dir, img, mnt) = fresh_image("256M");
    let full = vec![0xabu8; 8 << 20];
    let marks: Vec<u64> = (0..8).map(|i| (i << 20) + 4097).collect();
    for opts in transports() {
        let d = mount(&img, &mnt, opts).expect(opts);
        std::fs::write(mnt.join("full"), &full).unwrap();
        let sparse = std::fs::File::create(mnt.join("sparse")).unwrap();
        sparse.set_len(full.len() as u64).unwrap();
        for &at in &marks {
            use std::os::unix::fs::FileExt;
            sparse.write_all_at(b"x", at).unwrap();
        }
        drop(sparse);
        std::fs::write(mnt.join("short"), b"short").unwrap();
        use_and_unmount(d, &mnt);
        // Remounted, so every read below reaches the daemon.
        let d = mount(&img, &mnt, opts).expect(opts);
        assert!(std::fs::read(mnt.join("full")).unwrap() == full, "{opts}");
        let got = std::fs::read(mnt.join("sparse")).unwrap();
        let mut want = vec![0u8; full.len()];
        for &at in &marks {
            want[at as usize] = b'x';
        }
        assert!(got == want, "{opts}: a hole read back other bytes");
        assert_eq!(
            std::fs::read(mnt.join("short")).unwrap(),
            b"short",
            "{opts}"
        );
        for f in ["full", "sparse", "short"] {
            std::fs::remove_file(mnt.join(f)).unwrap();
        }
        use_and_unmount(d, &mnt);
    }
}

/// Readers that all wait (fsyncs held by a freeze) do not stop the
/// mount: more start, up to `max_threads`, and a listing from another
/// program is answered meanwhile.
#[test]
fn more_readers_start_while_every_one_waits() {
    if !can_mount() {
        return;
    }
    let (_dir, img, mnt) = fresh_image("256M");
    let opts = "transport=dev,threads=2,max_threads=8,busy_poll=0";
    let d = mount(&img, &mnt, opts).expect(opts);
    let frozen = canopy()
        .args(["filesystem", "freeze", "--timeout", "60"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(frozen.success());
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let path = mnt.join(format!("f{i}"));
            std::thread::spawn(move || common::mounted::write_synced(&path, b"held"))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "an fsync went through a freeze"
    );
    let mut ls = std::process::Command::new("ls")
        .arg(&mnt)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let listed = ends_within(&mut ls, 10, "a listing while every reader waits");
    let started = threads(d.id())
        .iter()
        .filter(|n| n.starts_with("fuse-dev-"))
        .count();
    let thawed = canopy()
        .args(["filesystem", "thaw"])
        .arg(&mnt)
        .status()
        .unwrap();
    for w in writers {
        w.join().unwrap().unwrap();
    }
    assert!(thawed.success());
    assert!(listed.success());
    assert!((5..=8).contains(&started), "{started} readers");
    for i in 0..4 {
        assert_eq!(std::fs::read(mnt.join(format!("f{i}"))).unwrap(), b"held");
    }
    use_and_unmount(d, &mnt);
}

/// The transports to try: /dev/fuse always, io_uring when offered.
fn transports() -> Vec<&'static str> {
    let mut t = vec!["transport=dev"];
    if uring_offered() {
        t.push("transport=uring");
    }
    t
}

/// Waits up to `secs` for `child` to end; kills it and fails if it does
/// not.
fn ends_within(child: &mut Child, secs: u64, what: &str) -> std::process::ExitStatus {
    for _ in 0..secs * 10 {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not end within {secs} s");
}

/// Writers and listers busy on the mount: requests in flight.
fn busy(mnt: &Path) -> Vec<Child> {
    let m = mnt.display();
    let loops = [
        format!("while :; do dd if=/dev/zero of={m}/w bs=1M count=64 conv=fsync status=none; done"),
        format!("while :; do find {m} > /dev/null; stat {m}/w > /dev/null; done"),
    ];
    loops
        .iter()
        .map(|l| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(l)
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn lazy_unmount_and_kill_with_requests_in_flight_never_hang() {
    if !can_mount() {
        return;
    }
    for t in transports() {
        let (_dir, img, mnt) = fresh_image("512M");

        // umount -l while busy: the clients finish with the detached
        // mount, then the daemon ends cleanly.
        let mut d = mount(&img, &mnt, t).expect("mount");
        let mut clients = busy(&mnt);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(std::process::Command::new("umount")
            .arg("-l")
            .arg(&mnt)
            .status()
            .unwrap()
            .success());
        for c in &mut clients {
            let _ = c.kill();
            ends_within(c, 30, &format!("a client after umount -l ({t})"));
        }
        let st = ends_within(&mut d, 30, &format!("the daemon after umount -l ({t})"));
        assert!(st.success(), "{t}: daemon after umount -l: {st}");

        // kill -9 while busy: the clients get errors, nothing hangs, and
        // the image mounts again and checks clean.
        let mut d = mount(&img, &mnt, t).expect("mount again");
        let mut clients = busy(&mnt);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        d.kill().unwrap();
        ends_within(&mut d, 10, &format!("the killed daemon ({t})"));
        for c in &mut clients {
            let _ = c.kill();
            ends_within(c, 30, &format!("a client of a killed daemon ({t})"));
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mnt)
            .status();
        let d = mount(&img, &mnt, t).expect("mount after kill -9");
        use_and_unmount(d, &mnt);
        assert!(canopy().arg("check").arg(&img).status().unwrap().success());
    }
}
