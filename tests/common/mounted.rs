//! A Canopy daemon mounted for a test; unmounted (lazily) on drop.

use std::fs;
use std::io::BufRead;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

/// lsattr's flags of `p`.
pub fn file_flags(p: &Path) -> u32 {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p).unwrap();
    let mut fl: libc::c_int = 0;
    // SAFETY: an open descriptor and an int to fill.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut fl) };
    assert_eq!(r, 0, "GETFLAGS: {}", std::io::Error::last_os_error());
    fl as u32
}

/// chattr's FS_IOC_SETFLAGS on `p`.
pub fn set_file_flags(p: &Path, fl: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p)?;
    let fl = fl as libc::c_int;
    // SAFETY: an open descriptor and the flags to set.
    match unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS, &fl) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A thread that rewrites parts of the file at `path` while a test runs
/// a command over it: `writes` writes of 6,000 bytes at scattered offsets
/// (`shift` moves them off sector boundaries), paced a millisecond
/// apart, with an fsync every `sync_every`. Returns `model` with the
/// writes laid over it: what the file must hold afterwards.
pub fn paced_writer(
    path: PathBuf,
    mut model: Vec<u8>,
    writes: u64,
    shift: u64,
    sync_every: u64,
) -> std::thread::JoinHandle<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    std::thread::spawn(move || {
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        for n in 0..writes {
            let at = (n * 7919 * 4096 + shift) % (model.len() as u64 - 8192);
            let chunk = vec![(n % 251) as u8; 6000];
            f.write_all_at(&chunk, at).unwrap();
            model[at as usize..at as usize + chunk.len()].copy_from_slice(&chunk);
            if n.is_multiple_of(sync_every) {
                f.sync_all().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        f.sync_all().unwrap();
        model
    })
}

/// copy_file_range of the first `len` bytes of `src` to the start of
/// `dst` (on Canopy a reflink: the extents are shared); the bytes copied,
/// or -1.
pub fn clone_range(src: &fs::File, dst: &fs::File, len: u64) -> isize {
    use std::os::fd::AsRawFd;
    let (mut a, mut b) = (0i64, 0i64);
    // SAFETY: descriptors the caller holds and offsets we own.
    unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut a,
            dst.as_raw_fd(),
            &mut b,
            len as usize,
            0,
        )
    }
}

pub fn canopy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_canopy"))
}

/// Runs `canopy ARGS` in `cwd`, requires success, returns its output.
pub fn canopy_ok(args: &[&str], cwd: &Path) -> String {
    let out = canopy().args(args).current_dir(cwd).output().unwrap();
    assert!(
        out.status.success(),
        "canopy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `canopy mkfs -q ARGS DEVICES...`, which must succeed.
pub fn mkfs_ok(args: &[&str], devices: &[&Path]) {
    let out = canopy()
        .args(["mkfs", "-q"])
        .args(args)
        .args(devices)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `canopy check FIRST --device OTHER...`, which must find nothing.
pub fn check_devices(first: &Path, others: &[&Path]) {
    let mut cmd = canopy();
    cmd.arg("check").arg(first);
    for o in others {
        cmd.arg("--device").arg(o);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A filesystem made by `mkfs ARGS A B` over two images in a fresh
/// directory, mounted from A with `-o device=B`; B's path beside it.
pub fn mounted_pair(args: &[&str]) -> (Mounted, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkfs_ok(args, &[&a, &b]);
    let opts = format!("device={}", b.display());
    (Mounted::over(dir, a, mnt, &opts), b)
}

/// Whether FUSE mount tests can run here (root, /dev/fuse, fusermount3).
/// When they cannot, the test is recorded as skipped (see
/// [`super::skip`]), or fails where `CANOPY_REQUIRE_ALL=1` says it must run.
pub fn can_mount() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    let helper = Command::new("fusermount3")
        .arg("--version")
        .output()
        .is_ok();
    super::require(
        root && fuse && helper,
        "FUSE mount tests need root, /dev/fuse and fusermount3",
    )
}

/// Unmounts `mnt`, trying again for a few seconds while it is busy: a
/// test thread that forks a command while another test's file in the
/// mount is open hands the child a copy of that descriptor until the
/// child's exec, and an unmount in that moment fails with EBUSY. A mount
/// still busy after that is detached (`umount -l`) so that no test leaves
/// it behind, and the call returns false.
pub fn umount(mnt: &Path) -> bool {
    for _ in 0..50 {
        let out = Command::new("umount").arg(mnt).output().unwrap();
        if out.status.success() {
            return true;
        }
        if !String::from_utf8_lossy(&out.stderr).contains("busy") {
            eprintln!(
                "umount {}: {}",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = Command::new("umount").arg("-l").arg(mnt).status();
    false
}

/// The ceph.conf of the cluster the mount tests run on instead of image
/// files (`CANOPY_TEST_RBD`, set by scripts/test.sh for its RBD pass).
pub fn rbd_conf() -> Option<String> {
    std::env::var("CANOPY_TEST_RBD")
        .ok()
        .filter(|c| !c.is_empty())
}

/// A name for a new RBD image on that cluster, unique to this test.
pub fn rbd_name(conf: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    PathBuf::from(format!(
        "rbd:rbd/t-{}-{t}-{n}?conf={conf}",
        std::process::id()
    ))
}

/// Removes, when dropped, an RBD image a test made: the cluster's space is
/// the test machine's disk. An image a killed client still watches (for
/// 30 s) is removed by a detached `rbd rm` after that.
pub struct RbdImage(pub PathBuf);

/// The `pool/image` and the ceph.conf an `rbd:` name holds.
pub fn rbd_parts(name: &Path) -> Option<(String, String)> {
    let name = name.to_str()?;
    let (image, query) = name.strip_prefix("rbd:")?.split_once('?')?;
    let conf = query.split('&').find_map(|p| p.strip_prefix("conf="))?;
    Some((image.to_string(), conf.to_string()))
}

impl Drop for RbdImage {
    fn drop(&mut self) {
        let Some((image, conf)) = rbd_parts(&self.0) else {
            return;
        };
        let rm = |delay: u32| {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "sleep {delay}; rbd -c '{conf}' snap purge --no-progress '{image}' >/dev/null 2>&1; \
                     rbd -c '{conf}' rm --no-progress '{image}' >/dev/null 2>&1"
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            c
        };
        if !rm(0).status().is_ok_and(|s| s.success()) {
            let _ = rm(35).spawn();
        }
    }
}

/// Free 4 KiB blocks of the filesystem holding `path` (statvfs's f_bfree).
#[allow(dead_code)]
pub fn free_blocks(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid value to fill.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bfree
}

/// Bytes the filesystem mounted on `mnt` has in use (statfs: total
/// less free).
#[allow(dead_code)]
pub fn used_bytes(mnt: &Path) -> u64 {
    statfs_total(mnt) - free_blocks(mnt) * 4096
}

/// statfs's total bytes of the filesystem mounted on `mnt`.
pub fn statfs_total(mnt: &Path) -> u64 {
    let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_blocks * s.f_frsize
}

/// Creates `path` holding `data` and fsyncs it.
pub fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Writes files PREFIX0, PREFIX1, ... in `dir`, each holding `data` and
/// fsynced, until one fails (the filesystem is full); their paths.
pub fn fill_until_full(dir: &Path, prefix: &str, data: &[u8]) -> Vec<PathBuf> {
    let mut made = Vec::new();
    loop {
        let p = dir.join(format!("{prefix}{}", made.len()));
        if write_synced(&p, data).is_err() {
            let _ = fs::remove_file(&p);
            return made;
        }
        made.push(p);
    }
}

/// A new image of `size` (as `mkfs -s` takes it) and an empty mount
/// point beside it, in a directory that goes when the first value is
/// dropped. Under `CANOPY_TEST_RBD` the image is a new RBD image.
pub fn fresh_image(size: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let img = match rbd_conf() {
        Some(conf) => rbd_name(&conf),
        None => dir.path().join("fs.img"),
    };
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let st = canopy()
        .args(["mkfs", "-q", "-s", size])
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success());
    (dir, img, mnt)
}

/// A mounted image; unmounts on drop.
pub struct Mounted {
    pub _dir: tempfile::TempDir,
    pub img: PathBuf,
    pub mnt: PathBuf,
    daemon: Option<Child>,
    /// The RBD image under `CANOPY_TEST_RBD`, removed after the daemon.
    _rbd: Option<RbdImage>,
    /// The daemon was killed: on RBD its lock is still held by a client
    /// the cluster has not yet timed out (30 s), so the next mount takes
    /// it over, as an operator would after a crash.
    killed: bool,
}

impl Mounted {
    pub fn new() -> Mounted {
        Mounted::with_size("512M")
    }

    /// A fresh image of `size` (as `mkfs -s` takes it), mounted.
    pub fn with_size(size: &str) -> Mounted {
        let (dir, img, mnt) = fresh_image(size);
        let mut m = Mounted {
            _dir: dir,
            _rbd: rbd_conf().map(|_| RbdImage(img.clone())),
            img,
            mnt,
            daemon: None,
            killed: false,
        };
        m.mount("");
        m
    }

    /// Mounts `img` (made by the caller in `dir`) on `mnt` with `opts`:
    /// for images `with_size` cannot make (several devices).
    #[allow(dead_code)]
    pub fn over(dir: tempfile::TempDir, img: PathBuf, mnt: PathBuf, opts: &str) -> Mounted {
        let mut m = Mounted {
            _dir: dir,
            _rbd: None,
            img,
            mnt,
            daemon: None,
            killed: false,
        };
        m.mount(opts);
        m
    }

    /// Mounts with `opts` and, after them, the options in
    /// `CANOPY_TEST_MOUNT_OPTS` (scripts/test.sh runs the mount tests once
    /// more with `writeback_cache` there).
    pub fn mount(&mut self, opts: &str) {
        let mut cmd = canopy();
        cmd.args(["mount", "-f", "--notify-ready"]);
        let extra = std::env::var("CANOPY_TEST_MOUNT_OPTS").unwrap_or_default();
        let takeover = match std::mem::take(&mut self.killed) && rbd_conf().is_some() {
            true => "takeover",
            false => "",
        };
        let all: Vec<&str> = [opts, extra.as_str(), takeover]
            .into_iter()
            .filter(|o| !o.is_empty())
            .collect();
        if !all.is_empty() {
            cmd.args(["-o", &all.join(",")]);
        }
        let mut child = cmd
            .arg(&self.img)
            .arg(&self.mnt)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "canopy-ready", "daemon did not come up");
        self.daemon = Some(child);
    }

    /// Resident memory of the daemon in KiB.
    pub fn daemon_rss_kib(&self) -> u64 {
        let pid = self.daemon.as_ref().expect("mounted").id();
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts and waits for the daemon to exit cleanly.
    pub fn unmount(&mut self) {
        assert!(umount(&self.mnt), "umount failed");
        let st = self.daemon.take().unwrap().wait().unwrap();
        assert!(st.success(), "daemon exited with {st}");
    }

    /// Runs `umount` and returns the daemon without waiting for it: it may
    /// still be writing its last commit.
    pub fn umount_returning_daemon(&mut self) -> Child {
        assert!(umount(&self.mnt), "umount failed");
        self.daemon.take().unwrap()
    }

    /// Kills the daemon as a crash would and clears the dead mount.
    pub fn kill9(&mut self) {
        let mut d = self.daemon.take().unwrap();
        d.kill().unwrap();
        d.wait().unwrap();
        self.killed = true;
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }

    pub fn check(&self) {
        let out = canopy().arg("check").arg(&self.img).output().unwrap();
        assert!(
            out.status.success(),
            "check: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}
