//! The control socket: how `canopy` commands reach the daemon serving a
//! mount: scrub, sync, subvolumes and quotas.
//!
//! Each daemon listens on a Unix socket named by a hash of its canonical
//! mount point, so a command given the mount point finds it: under
//! `/run/canopy` for a daemon run by root, open to every user (mode 0666:
//! `peer` checks each request against who sent it, as btrfs checks its
//! ioctls); under the user's runtime directory (`$XDG_RUNTIME_DIR/canopy`,
//! else `/tmp/canopy-UID`, mode 0700) for a daemon a user runs on their
//! own image. A request is one JSON object on one line; so is the answer.

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::scrub::{self, Control, Progress, Report};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest request line read (a receive's stream follows its line,
/// unbounded).
const MAX_REQUEST: u64 = 1 << 20;

/// Where root's daemons listen.
const ROOT_DIR: &str = "/run/canopy";

/// The directory this process's daemon listens in: root's, or the
/// user's own.
fn own_dir() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from(ROOT_DIR);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(&d).join("canopy"),
        None => PathBuf::from(format!("/tmp/canopy-{uid}")),
    }
}

/// The socket's file name for `mountpoint`.
fn socket_name(mountpoint: &Path) -> String {
    let canon = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    let bytes = canon.as_os_str().as_encoded_bytes();
    let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
    let h = (u64::from(crate::format::crc(bytes)) << 32) | u64::from(crate::format::crc(&reversed));
    format!("mount-{h:016x}.sock")
}

/// Where the daemon serving `mountpoint` listens: in root's directory,
/// in the caller's own, or (for root asking about a user's mount) in a
/// user's; where this process's daemon would listen if none is found.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let name = socket_name(mountpoint);
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    // A daemon started from a shell without XDG_RUNTIME_DIR listens in
    // /tmp: a command from one with it still finds it. Each directory
    // with the user it must belong to.
    let mut dirs = vec![
        (own_dir(), uid),
        (PathBuf::from(ROOT_DIR), 0),
        (PathBuf::from(format!("/tmp/canopy-{uid}")), uid),
    ];
    if uid == 0 {
        let numbered = |parent: &str, prefix: &str| -> Vec<(PathBuf, u32)> {
            std::fs::read_dir(parent)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let n = name.strip_prefix(prefix)?.parse().ok()?;
                    Some((e.path(), n))
                })
                .collect()
        };
        let users = numbered("/run/user", "").into_iter();
        dirs.extend(users.map(|(p, n)| (p.join("canopy"), n)));
        dirs.extend(numbered("/tmp", "canopy-"));
    }
    dirs.iter()
        .filter(|(d, owner)| trusted_dir(d, *owner))
        .map(|(d, _)| d.join(&name))
        .find(|p| p.exists())
        .unwrap_or_else(|| own_dir().join(&name))
}

/// Whether a socket found in `dir` can be trusted to be the daemon of
/// user `owner`: the directory is theirs and nobody else may write in
/// it, so no other user can plant a socket that answers for a mount.
fn trusted_dir(dir: &Path, owner: u32) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == owner && m.permissions().mode() & 0o022 == 0)
}

/// Makes the directory a daemon listens in: root's readable by all, a
/// user's private to them (and refused if someone else owns it).
fn make_own_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = own_dir();
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mode = if uid == 0 { 0o755 } else { 0o700 };
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true).mode(mode);
    b.create(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let m = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    if !m.is_dir() || m.uid() != uid {
        return Err(Error::Invalid(format!(
            "{} is not a directory of this user's",
            dir.display()
        )));
    }
    if uid != 0 && m.permissions().mode() & 0o077 != 0 {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    Ok(dir)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    ScrubStart,
    ScrubStatus,
    ScrubCancel,
    /// Commit everything (`canopy sync`): fsync makes only its file
    /// durable, and syncfs does not reach FUSE daemons.
    Sync,
    /// `-o remount,...` with options only the daemon knows: how later
    /// writes compress (`compress=`, `compress-force=`) and how freed
    /// space is discarded (`discard`, `nodiscard`), as given.
    SetOptions {
        options: String,
    },
    /// How the device is carved into block groups (`canopy filesystem
    /// usage`).
    Usage,
    /// `canopy filesystem resize`: grow into a larger device.
    Resize {
        to: crate::txn::GrowTo,
        /// The device to grow (device 1 when absent).
        #[serde(default)]
        devid: Option<u64>,
    },
    /// `canopy filesystem trim`: discard free ranges of at least
    /// `min_len` bytes (what FITRIM does).
    Trim {
        min_len: u64,
    },
    /// `canopy filesystem freeze`: commit, then hold every write until
    /// a thaw or `timeout_ms` (what FIFREEZE does).
    Freeze {
        timeout_ms: u64,
    },
    /// `canopy filesystem thaw` (FITHAW).
    Thaw,
    /// `canopy filesystem extents`: where regular file `node`'s bytes lie.
    Extents {
        node: u64,
    },
    /// What decides how much written data the mount buffers (`canopy
    /// filesystem usage`, see `fuse::bdi`).
    Writeback,
    /// `canopy filesystem du`: bytes on disk, decoded and referenced per
    /// compression type of everything under `node`.
    Compsize {
        node: u64,
    },
    /// `canopy dedupe`: make the regular files `nodes` share what they
    /// hold alike (only report it with `dry_run`).
    Dedupe {
        nodes: Vec<u64>,
        dry_run: bool,
    },
    /// `canopy filesystem defragment`: one bounded piece of regular file
    /// `node`'s defragmentation (the answer says where to go on).
    Defragment {
        node: u64,
        args: crate::fs::defrag::DefragArgs,
    },
    /// `canopy subvolume create`: `name` in directory `parent` (a node id,
    /// the st_ino the command saw), owned by `uid`:`gid`.
    SubvolCreate {
        parent: u64,
        name: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    /// `canopy subvolume snapshot [-r]`: `source` is a subvolume's root.
    SubvolSnapshot {
        source: u64,
        parent: u64,
        name: Vec<u8>,
        readonly: bool,
    },
    /// `canopy subvolume delete`.
    SubvolDelete {
        parent: u64,
        name: Vec<u8>,
    },
    /// `canopy subvolume list`.
    SubvolList,
    /// `canopy send`: the answer is the stream (see `fuse::send`).
    Send(crate::send::Request),
    /// `canopy receive`: the streams follow the request line (see
    /// `fuse::receive`).
    Receive(crate::receive::Request),
    /// The end of `canopy receive`: the subvolume whose root is `node`
    /// was received from `received_uuid` (hex, as `subvolume show` prints
    /// it) at the sender's `stransid`; it becomes read-only.
    SetReceived {
        node: u64,
        received_uuid: String,
        stransid: u64,
    },
    /// `canopy subvolume show`: the subvolume whose root is `node`.
    SubvolShow {
        node: u64,
    },
    /// `canopy subvolume set-default`.
    SubvolSetDefault {
        id: u64,
    },
    /// `canopy subvolume sync`: free everything deleted subvolumes still
    /// hold, then commit.
    SubvolSync,
    /// `canopy property set PATH ro true|false`.
    SubvolSetReadOnly {
        node: u64,
        readonly: bool,
    },
    /// `canopy quota enable|disable|rescan`, `canopy qgroup
    /// create|destroy|assign|remove|limit`.
    Quota {
        change: crate::fs::QuotaChange,
    },
    /// `canopy qgroup limit SIZE|none PATH`: the limit of the group of the
    /// subvolume whose root is `node`.
    QgroupLimitNode {
        node: u64,
        bytes: Option<u64>,
        exclusive: bool,
    },
    /// `canopy qgroup show`.
    QgroupShow,
    /// `canopy quota rescan -s|-w`: how far the rescan has got.
    QuotaRescanStatus,
    /// `canopy balance start`: records a balance and starts it in the
    /// daemon's balance thread.
    BalanceStart {
        args: crate::balance::BalanceArgs,
    },
    BalanceStatus,
    BalancePause,
    BalanceResume,
    BalanceCancel,
    /// `canopy device stats [-z]`: the error counters, then zeroed if
    /// `reset`.
    DeviceStats {
        reset: bool,
    },
    /// `canopy device add DEV`: the daemon opens `path` (an absolute
    /// path or an `rbd:` name) and adds it; `force` writes over another
    /// filesystem's signature.
    DeviceAdd {
        path: String,
        force: bool,
    },
    /// `canopy device remove`, first step: stop new copies going to the
    /// device (`device`: a devid or a path it was named by) and start the
    /// balance that moves the others off; answers its devid and the
    /// balance.
    DeviceRemoveStart {
        device: String,
    },
    /// Last step, once that balance has finished.
    DeviceRemoveFinish {
        devid: u64,
    },
    /// Gives the removal up: the device takes new copies again.
    DeviceRemoveAbort {
        devid: u64,
    },
    /// `canopy device replace start`: the daemon opens `target` (an
    /// absolute path or an `rbd:` name) and starts copying `source` (a
    /// devid, a path it was named by, or `missing`) to it; `avoid_source`
    /// reads other copies first (`-r`); `force` writes over another
    /// filesystem's signature.
    ReplaceStart {
        source: String,
        target: String,
        avoid_source: bool,
        force: bool,
    },
    ReplaceStatus,
    ReplaceCancel,
}

/// One device's error counters (`canopy device stats`), as btrfs names
/// them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceStats {
    pub devid: u64,
    pub read_io_errs: u64,
    pub write_io_errs: u64,
    /// Copies read whole but wrong: checksum, address or generation.
    pub corruption_errs: u64,
    /// Bad copies rewritten from a good one.
    pub corrected_errs: u64,
}

impl DeviceStats {
    fn of(devid: u64, counts: [u64; 4]) -> DeviceStats {
        let [read, corrupt, corrected, write] = counts;
        DeviceStats {
            devid,
            read_io_errs: read,
            write_io_errs: write,
            corruption_errs: corrupt,
            corrected_errs: corrected,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ScrubState {
    Idle,
    Running,
    Finished,
    Cancelled,
    Failed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScrubStatus {
    pub state: ScrubState,
    pub progress: Progress,
    /// The result once the scrub has ended.
    pub report: Option<Report>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    pub error: Option<String>,
    pub scrub: Option<ScrubStatus>,
    /// Subvolumes listed or shown.
    #[serde(default)]
    pub subvolumes: Option<Vec<crate::fs::SubvolInfo>>,
    /// Quota groups shown.
    #[serde(default)]
    pub qgroups: Option<Vec<crate::fs::QgroupRow>>,
    /// The balance, after any balance request.
    #[serde(default)]
    pub balance: Option<crate::fs::BalanceStatus>,
    /// The quota rescan, after a rescan status request.
    #[serde(default)]
    pub rescan: Option<crate::fs::RescanStatus>,
    /// Block groups per kind, after a usage request.
    #[serde(default)]
    pub usage: Option<crate::alloc::SpaceUsage>,
    /// A file's extent map, after an extents request.
    #[serde(default)]
    pub extents: Option<crate::fs::extents::FileMap>,
    /// The kernel's and Canopy's dirty limits, after a writeback request.
    #[serde(default)]
    pub writeback: Option<super::bdi::WritebackLimits>,
    /// Bytes on disk per compression type, after a compsize request.
    #[serde(default)]
    pub compsize: Option<crate::fs::compression::Compsize>,
    /// What a dedupe found and shared.
    #[serde(default)]
    pub dedupe: Option<crate::fs::dedupe::DedupeReport>,
    /// What a defragment request did, and where the next goes on.
    #[serde(default)]
    pub defrag: Option<crate::fs::defrag::DefragReport>,
    /// What a send wrote.
    #[serde(default)]
    pub send: Option<crate::send::Summary>,
    /// The sizes before and after, after a resize request.
    #[serde(default)]
    pub grown: Option<crate::txn::Grown>,
    /// What a trim discarded.
    #[serde(default)]
    pub trimmed: Option<crate::txn::Trimmed>,
    /// How a receive goes (every answer but its last).
    #[serde(default)]
    pub receive: Option<crate::receive::Event>,
    /// Error counters per device, after a device stats request.
    #[serde(default)]
    pub devices: Option<Vec<DeviceStats>>,
    /// The filesystem and its devices, after a usage request.
    #[serde(default)]
    pub show: Option<crate::alloc::FilesystemShow>,
    /// The device added, or being removed.
    #[serde(default)]
    pub devid: Option<u64>,
    /// The device replace's status, after a replace request.
    #[serde(default)]
    pub replace: Option<crate::fs::replace::ReplaceStatus>,
}

impl Response {
    /// Success, with nothing to report yet.
    pub(super) fn ok() -> Response {
        Response {
            ok: true,
            error: None,
            scrub: None,
            subvolumes: None,
            qgroups: None,
            balance: None,
            rescan: None,
            usage: None,
            writeback: None,
            extents: None,
            compsize: None,
            dedupe: None,
            defrag: None,
            send: None,
            grown: None,
            trimmed: None,
            receive: None,
            devices: None,
            show: None,
            devid: None,
            replace: None,
        }
    }

    pub(super) fn failed(e: Error) -> Response {
        Response {
            ok: false,
            error: Some(e.to_string()),
            ..Response::ok()
        }
    }

    /// Success or the error.
    pub(super) fn of_unit(r: Result<()>) -> Response {
        Response::of(r.map(|()| None))
    }

    fn of(r: Result<Option<Vec<crate::fs::SubvolInfo>>>) -> Response {
        match r {
            Ok(subvolumes) => Response {
                subvolumes,
                ..Response::ok()
            },
            Err(e) => Response::failed(e),
        }
    }
}

/// Sends one request to the daemon serving `mountpoint`.
pub fn request(mountpoint: &Path, req: &Request) -> Result<Response> {
    Client::new(mountpoint).request(req)
}

/// The daemon of one mount, its socket found once: a command that sends
/// a request per file (defragment, thousands of them) does not search
/// the socket directories again for each.
pub struct Client {
    mountpoint: PathBuf,
    socket: PathBuf,
}

impl Client {
    pub fn new(mountpoint: &Path) -> Client {
        Client {
            mountpoint: mountpoint.to_path_buf(),
            socket: socket_path(mountpoint),
        }
    }

    /// Sends one request and reads its answer.
    pub fn request(&self, req: &Request) -> Result<Response> {
        let s = connect_and_send(&self.mountpoint, &self.socket, req)?;
        let mut answer = String::new();
        BufReader::new(s)
            .read_line(&mut answer)
            .map_err(|e| talking(&self.mountpoint, e))?;
        parse_response(&self.mountpoint, &answer)
    }
}

/// Connects to the daemon serving `mountpoint` and sends `req`'s line;
/// what follows on the socket is the request's own (answers, a stream).
pub(super) fn open_request(mountpoint: &Path, req: &Request) -> Result<UnixStream> {
    connect_and_send(mountpoint, &socket_path(mountpoint), req)
}

fn connect_and_send(mountpoint: &Path, path: &Path, req: &Request) -> Result<UnixStream> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        Error::Invalid(format!(
            "no Canopy daemon answers for {} ({}: {e}); is it a Canopy mount point?",
            mountpoint.display(),
            path.display()
        ))
    })?;
    let mut line = serde_json::to_string(req).map_err(|e| Error::Invalid(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| talking(mountpoint, e))?;
    Ok(s)
}

/// An I/O error on the socket to the daemon of `mountpoint`.
pub(super) fn talking(mountpoint: &Path, e: std::io::Error) -> Error {
    Error::io(
        format!("talking to the daemon of {}", mountpoint.display()),
        e,
    )
}

/// One answer line of the daemon of `mountpoint`, parsed.
pub(super) fn parse_response(mountpoint: &Path, line: &str) -> Result<Response> {
    serde_json::from_str(line).map_err(|e| {
        Error::Invalid(format!(
            "the daemon of {} answered {line:?}: {e}",
            mountpoint.display()
        ))
    })
}

/// Writes `resp` as one answer line.
pub(super) fn write_response(mut s: &UnixStream, resp: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).unwrap_or_else(|_| "{}".into());
    line.push('\n');
    s.write_all(line.as_bytes())
}

/// A background scrub in the daemon.
#[derive(Default)]
struct ScrubJob {
    /// The running scrub: its control and its thread.
    running: Option<(Arc<Control>, JoinHandle<Result<Report>>)>,
    /// How the last one ended.
    last: Option<ScrubStatus>,
}

impl ScrubJob {
    fn start(&mut self, fs: &Arc<Fs>) -> Result<()> {
        self.reap();
        if self.running.is_some() {
            return Err(Error::Invalid("a scrub is already running".into()));
        }
        let ctl = Arc::new(Control::default());
        let (c, engine) = (ctl.clone(), fs.engine().clone());
        let handle = std::thread::Builder::new()
            .name("scrub".into())
            .spawn(move || scrub::run(&engine, &c, scrub::Pace { throttle: true }))
            .map_err(|e| Error::io("starting the scrub thread", e))?;
        self.running = Some((ctl, handle));
        self.last = None;
        Ok(())
    }

    /// Collects a finished scrub's result.
    fn reap(&mut self) {
        if !self.running.as_ref().is_some_and(|(_, h)| h.is_finished()) {
            return;
        }
        let Some((ctl, h)) = self.running.take() else {
            return;
        };
        let progress = ctl.progress();
        self.last = Some(match h.join() {
            Ok(Ok(report)) => ScrubStatus {
                state: if report.cancelled {
                    ScrubState::Cancelled
                } else {
                    ScrubState::Finished
                },
                progress,
                report: Some(report),
                error: None,
            },
            Ok(Err(e)) => ScrubStatus {
                state: ScrubState::Failed,
                progress,
                report: None,
                error: Some(e.to_string()),
            },
            Err(_) => ScrubStatus {
                state: ScrubState::Failed,
                progress,
                report: None,
                error: Some("the scrub thread panicked".into()),
            },
        });
    }

    fn status(&mut self) -> ScrubStatus {
        self.reap();
        match (&self.running, &self.last) {
            (Some((ctl, _)), _) => ScrubStatus {
                state: ScrubState::Running,
                progress: ctl.progress(),
                report: None,
                error: None,
            },
            (None, Some(last)) => last.clone(),
            (None, None) => ScrubStatus {
                state: ScrubState::Idle,
                progress: Progress::default(),
                report: None,
                error: None,
            },
        }
    }

    fn cancel(&mut self) {
        if let Some((ctl, _)) = &self.running {
            ctl.cancel();
        }
    }

    /// Cancels a running scrub and waits for it (at unmount).
    fn stop(&mut self) {
        self.cancel();
        if let Some((_, h)) = self.running.take() {
            let _ = h.join();
        }
    }
}

/// The daemon's listener; stops (cancelling a running scrub) when dropped.
pub struct Server {
    path: PathBuf,
    /// The socket file's inode number: only ours is removed at the end.
    ino: u64,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    scrub: Arc<Mutex<ScrubJob>>,
}

impl Server {
    /// Listens for the mount at `mountpoint`. A failure only loses the
    /// commands, not the mount, so the caller may go on without it.
    pub fn start(
        mountpoint: &Path,
        fs: Arc<Fs>,
        notifier: super::Notifier,
        kernel: Arc<super::bdi::KernelSide>,
        policy: super::peer::Policy,
    ) -> Result<Server> {
        let path = make_own_dir()?.join(socket_name(mountpoint));
        // The session is up, so the mount point shows this mount: a socket
        // there is a dead daemon's, or that of the daemon of a mount just
        // unmounted from here and still shutting down (which removes only
        // its own file, see Drop).
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::io(format!("listening on {}", path.display()), e))?;
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // Root's socket is open to all (each request is checked against
        // its sender, `peer`); a user's lies in their private directory.
        let mode = if path.starts_with(ROOT_DIR) {
            0o666
        } else {
            0o600
        };
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        let ino = std::fs::metadata(&path).map_or(0, |m| m.ino());
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("configuring the control socket", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let scrub = Arc::new(Mutex::new(ScrubJob::default()));
        let (st, sc) = (stop.clone(), scrub.clone());
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                serve(
                    listener,
                    &st,
                    &sc,
                    &Daemon {
                        fs,
                        notifier,
                        kernel,
                        policy,
                    },
                )
            })
            .map_err(|e| Error::io("starting the control thread", e))?;
        Ok(Server {
            path,
            ino,
            stop,
            thread: Some(thread),
            scrub,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        crate::sync::lock(&self.scrub).stop();
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What requests act on: the filesystem, and the kernel's caches of it.
struct Daemon {
    fs: Arc<Fs>,
    notifier: super::Notifier,
    kernel: Arc<super::bdi::KernelSide>,
    policy: super::peer::Policy,
}

impl Daemon {
    /// The kernel may hold `name` in `parent` (as absent or as what it
    /// was) and the directory's attributes: a change made here, not
    /// through it, must drop them.
    fn changed_entry(&self, parent: u64, name: &[u8]) {
        let n = &self.notifier;
        let node = if parent == self.fs.root_node() {
            1
        } else {
            parent
        };
        if let Err(e) = n.inval_entry(node, name) {
            tracing::debug!(parent, error = %e, "entry invalidation");
        }
        if let Err(e) = n.inval_inode(node, -1, 0) {
            tracing::debug!(parent, error = %e, "attribute invalidation");
        }
    }

    /// The kernel caches files' attributes: a change made here (the
    /// blocks a file holds, after defragment -c or dedupe) must drop them.
    fn changed_attributes(&self, nodes: impl IntoIterator<Item = u64>) {
        for node in nodes {
            if let Err(e) = self.notifier.inval_inode(node, -1, 0) {
                tracing::debug!(node, error = %e, "attribute invalidation");
            }
        }
    }

    /// The node id `fs` knows for an inode number a command saw: the
    /// mount's root shows as FUSE's root, 1.
    fn node(&self, seen: u64) -> u64 {
        if seen == 1 {
            self.fs.root_node()
        } else {
            seen
        }
    }

    fn quota(&self, req: Request) -> Result<()> {
        match req {
            Request::Quota { change } => self.fs.quota(change),
            Request::QgroupLimitNode {
                node,
                bytes,
                exclusive,
            } => {
                let qgroupid = self.fs.qgroup_of_node(self.node(node))?;
                self.fs.quota(crate::fs::QuotaChange::Limit {
                    qgroupid,
                    bytes,
                    exclusive,
                })
            }
            _ => Err(Error::Invalid("not a quota request".into())),
        }
    }

    fn subvolume(&self, req: Request) -> Result<Option<Vec<crate::fs::SubvolInfo>>> {
        let fs = &self.fs;
        match req {
            Request::SubvolCreate {
                parent,
                name,
                uid,
                gid,
            } => {
                let parent = self.node(parent);
                fs.create_subvolume(parent, &name, crate::fs::Owner { uid, gid })?;
                self.changed_entry(parent, &name);
                Ok(None)
            }
            Request::SubvolSnapshot {
                source,
                parent,
                name,
                readonly,
            } => {
                let parent = self.node(parent);
                fs.snapshot(self.node(source), parent, &name, readonly)?;
                self.changed_entry(parent, &name);
                Ok(None)
            }
            Request::SubvolDelete { parent, name } => {
                let parent = self.node(parent);
                fs.delete_subvolume(parent, &name)?;
                self.changed_entry(parent, &name);
                Ok(None)
            }
            Request::SubvolList => fs.list_subvolumes().map(Some),
            Request::SubvolShow { node } => {
                let (id, ino) = crate::fs::split_node(self.node(node));
                if ino != crate::format::inode::ROOT_DIR_INO {
                    return Err(Error::Posix(libc::EINVAL, "not a subvolume"));
                }
                fs.subvolume_info(id).map(|i| Some(vec![i]))
            }
            Request::SubvolSetDefault { id } => fs.set_default_subvolume(id).map(|()| None),
            Request::SubvolSetReadOnly { node, readonly } => fs
                .set_subvolume_read_only(self.node(node), readonly)
                .map(|()| None),
            Request::SetReceived {
                node,
                received_uuid,
                stransid,
            } => {
                let uuid = crate::format::uuid::parse(&received_uuid)
                    .ok_or_else(|| Error::Invalid(format!("bad uuid {received_uuid:?}")))?;
                fs.set_received(self.node(node), uuid, stransid)
                    .map(|()| None)
            }
            _ => Err(Error::Invalid("not a subvolume request".into())),
        }
    }
}

/// How often the control thread looks at its stop flag while idle.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Waits until a connection is pending on `listener` or `timeout` passed:
/// a command is answered at once, and the thread still notices a stop.
fn wait_readable(listener: &UnixListener, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut fds, 1, ms) };
}

fn serve(listener: UnixListener, stop: &AtomicBool, scrub: &Mutex<ScrubJob>, d: &Daemon) {
    // A request may wait long (a sync or a trim while the filesystem is
    // frozen): up to HANDLERS are answered at once, so a thaw still gets
    // through.
    let busy = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((s, _)) => {
                    let answer_one = |s| {
                        if let Err(e) = answer(s, scrub, d) {
                            tracing::warn!(error = %e, "control request failed");
                        }
                    };
                    if busy.fetch_add(1, Ordering::SeqCst) >= HANDLERS {
                        answer_one(s);
                        busy.fetch_sub(1, Ordering::SeqCst);
                        continue;
                    }
                    let busy = &busy;
                    let spawned = std::thread::Builder::new()
                        .name("control-request".into())
                        .spawn_scoped(scope, move || {
                            answer_one(s);
                            busy.fetch_sub(1, Ordering::SeqCst);
                        });
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "no thread for a control request");
                        busy.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_readable(&listener, STOP_POLL);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control socket");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    });
}

/// Control requests answered at once, each on its own thread.
const HANDLERS: usize = 8;

/// A scrub command: the job's status after it.
fn scrub_request(req: Request, scrub: &Mutex<ScrubJob>, fs: &Arc<Fs>) -> Response {
    let mut job = crate::sync::lock(scrub);
    let r = match req {
        Request::ScrubStart => job.start(fs),
        Request::ScrubCancel => {
            job.cancel();
            Ok(())
        }
        _ => Ok(()),
    };
    Response {
        scrub: Some(job.status()),
        ..Response::of(r.map(|()| None))
    }
}

/// A device command: the devid it is about, and after a removal's
/// first step the balance moving the copies off.
fn device_request(req: Request, fs: &Fs) -> Response {
    let r = match req {
        Request::DeviceAdd { path, force } => add_device(fs, &path, force),
        Request::DeviceRemoveStart { device } => {
            device_of(fs, &device).and_then(|devid| fs.device_remove_start(devid).map(|_| devid))
        }
        Request::DeviceRemoveFinish { devid } => fs.device_remove_finish(devid).map(|()| devid),
        Request::DeviceRemoveAbort { devid } => fs.device_remove_abort(devid).map(|()| devid),
        _ => Err(Error::Invalid("not a device request".into())),
    };
    match r {
        Ok(devid) => Response {
            devid: Some(devid),
            balance: Some(fs.balance_status()),
            ..Response::ok()
        },
        Err(e) => Response::failed(e),
    }
}

/// Opens `path` to write and adds it, refusing one that holds a
/// filesystem unless `force`.
fn add_device(fs: &Fs, path: &str, force: bool) -> Result<u64> {
    let (dev, name) = open_new_device(path, force)?;
    fs.device_add(dev, name)
}

/// Opens `path` to write as a device new to the filesystem, refusing one
/// that holds a filesystem unless `force`; returns it and its name.
fn open_new_device(path: &str, force: bool) -> Result<(Arc<dyn crate::dev::Device>, String)> {
    let source: crate::dev::Source = path.parse()?;
    let dev = source.open(crate::dev::Access::Write, crate::dev::OpenHow::default())?;
    if !force {
        if let Some(what) = crate::dev::existing_filesystem(dev.as_ref()) {
            return Err(Error::Invalid(format!(
                "{path} holds a {what} filesystem; use --force to overwrite it"
            )));
        }
    }
    Ok((Arc::from(dev), source.to_string()))
}

/// A replace command: the replace's status after it.
fn replace_request(req: Request, fs: &Fs) -> Response {
    let r = match req {
        Request::ReplaceStart {
            source,
            target,
            avoid_source,
            force,
        } => device_of(fs, &source).and_then(|devid| {
            let (dev, name) = open_new_device(&target, force)?;
            let opts = crate::replace::Options { avoid_source };
            fs.replace_start(devid, dev, name, opts)
        }),
        Request::ReplaceCancel => fs.replace_cancel(),
        _ => Ok(()),
    };
    Response {
        replace: Some(fs.replace_status()),
        ..Response::of_unit(r)
    }
}

/// The devid `device` names: a number, `missing` (the first device a
/// degraded mount lacks), or a path (or `rbd:` name) the device was named
/// by at mount or when it was added.
fn device_of(fs: &Fs, device: &str) -> Result<u64> {
    if let Ok(devid) = device.parse::<u64>() {
        return Ok(devid);
    }
    if device == "missing" {
        return fs
            .engine()
            .missing_device()
            .ok_or_else(|| Error::Invalid("no device is missing".into()));
    }
    let canon = |s: &str| {
        std::fs::canonicalize(s).map_or_else(|_| s.to_string(), |p| p.display().to_string())
    };
    let want = canon(device);
    fs.engine()
        .device_names()
        .into_iter()
        .find(|(_, name)| canon(name) == want)
        .map(|(devid, _)| devid)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{device} is none of the filesystem's devices (see canopy filesystem show)"
            ))
        })
}

/// A balance command: the balance's status after it.
fn balance_request(req: Request, fs: &Fs) -> Response {
    let r = match req {
        Request::BalanceStart { args } => fs.balance_start(args).map(drop),
        Request::BalancePause => fs.balance_pause(),
        Request::BalanceResume => fs.balance_resume(),
        Request::BalanceCancel => fs.balance_cancel(),
        _ => Ok(()),
    };
    Response {
        balance: Some(fs.balance_status()),
        ..Response::of(r.map(|()| None))
    }
}

fn answer(s: UnixStream, scrub: &Mutex<ScrubJob>, d: &Daemon) -> std::io::Result<()> {
    let fs = &d.fs;
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    let mut r = BufReader::new(&s);
    // Any user may connect: a request line is small, and one that is not
    // is cut off (and then fails to parse) rather than held in memory.
    std::io::Read::take(std::io::Read::by_ref(&mut r), MAX_REQUEST).read_line(&mut line)?;
    // A receive's stream follows its line: what was read past the line
    // is its start.
    let read_ahead = r.buffer().to_vec();
    let parsed = serde_json::from_str::<Request>(&line);
    let send = matches!(parsed, Ok(Request::Send(_)));
    let asked = parsed
        .map_err(|e| Error::Invalid(format!("bad request: {e}")))
        .and_then(|req| {
            let peer =
                super::peer::Peer::of(&s).map_err(|e| Error::io("asking who sent a request", e))?;
            super::peer::authorize(req, &peer, fs, d.policy, |n| d.node(n))
        });
    if send && asked.is_err() {
        // A send's answer follows its (here empty) stream.
        (&s).write_all(&0u32.to_le_bytes())?;
    }
    let resp = match asked {
        Ok(Request::Send(mut req)) => {
            req.snapshot = d.node(req.snapshot);
            req.parent = req.parent.map(|p| d.node(p));
            req.clone_sources = req.clone_sources.iter().map(|&c| d.node(c)).collect();
            super::send::serve(s, fs.clone(), req);
            return Ok(());
        }
        Ok(Request::Receive(mut req)) => {
            req.dir = d.node(req.dir);
            super::receive::serve(s, read_ahead, fs.clone(), d.notifier.clone(), req);
            return Ok(());
        }
        Err(e) => Response::of(Err(e)),
        Ok(Request::Sync) => Response::of(fs.sync().map(|()| None)),
        Ok(Request::SetOptions { options }) => {
            let set = super::options::MountOptions::parse(&options).and_then(|o| {
                tracing::info!(%options, "remounted");
                if o.compression_option.is_some() {
                    fs.set_compression(o.compression);
                }
                match o.discard_option {
                    Some(_) => fs.engine().set_discard(o.discard),
                    None => Ok(()),
                }
            });
            Response::of_unit(set)
        }
        Ok(Request::Freeze { timeout_ms }) => {
            Response::of_unit(fs.freeze(Duration::from_millis(timeout_ms)))
        }
        Ok(Request::Thaw) => Response::of_unit(fs.engine().thaw()),
        Ok(Request::Trim { min_len }) => match fs.engine().trim(min_len) {
            Ok(t) => Response {
                trimmed: Some(t),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(Request::Resize { to, devid }) => match fs
            .engine()
            .grow(devid.unwrap_or(crate::volume::PRIMARY_DEVID), to)
        {
            Ok(g) => Response {
                grown: Some(g),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(Request::Usage) => Response {
            usage: Some(fs.engine().usage()),
            show: Some(fs.engine().show()),
            ..Response::of(Ok(None))
        },
        Ok(Request::Extents { node }) => match fs.extent_map(d.node(node)) {
            Ok(map) => Response {
                extents: Some(map),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(Request::Writeback) => Response {
            writeback: Some(d.kernel.limits(fs.dirty_limit())),
            ..Response::of(Ok(None))
        },
        Ok(Request::Dedupe { nodes, dry_run }) => {
            let nodes: Vec<u64> = nodes.iter().map(|&n| d.node(n)).collect();
            let done = fs.dedupe(&nodes, dry_run);
            // Files that now share extents hold fewer blocks.
            d.changed_attributes(nodes.iter().copied());
            match done {
                Ok(report) => Response {
                    dedupe: Some(report),
                    ..Response::ok()
                },
                Err(e) => Response::failed(e),
            }
        }
        Ok(Request::Defragment { node, args }) => match fs.defragment(d.node(node), args) {
            Ok(report) => {
                d.changed_attributes(report.changed.iter().copied());
                Response {
                    defrag: Some(report),
                    ..Response::ok()
                }
            }
            Err(e) => Response::failed(e),
        },
        Ok(Request::Compsize { node }) => match fs.compsize(d.node(node)) {
            Ok(report) => Response {
                compsize: Some(report),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(Request::SubvolSync) => Response::of(fs.clean_deleted().map(|()| None)),
        Ok(Request::DeviceStats { reset }) => {
            let engine = fs.engine();
            let stats = engine
                .device_errors()
                .into_iter()
                .map(|(devid, counts)| DeviceStats::of(devid, counts))
                .collect();
            if reset {
                engine.reset_device_errors();
            }
            Response {
                devices: Some(stats),
                ..Response::ok()
            }
        }
        Ok(
            req @ (Request::DeviceAdd { .. }
            | Request::DeviceRemoveStart { .. }
            | Request::DeviceRemoveFinish { .. }
            | Request::DeviceRemoveAbort { .. }),
        ) => device_request(req, fs),
        Ok(
            req @ (Request::ReplaceStart { .. } | Request::ReplaceStatus | Request::ReplaceCancel),
        ) => replace_request(req, fs),
        Ok(req @ (Request::ScrubStart | Request::ScrubStatus | Request::ScrubCancel)) => {
            scrub_request(req, scrub, fs)
        }
        Ok(Request::QgroupShow) => match fs.qgroup_show() {
            Ok(rows) => Response {
                qgroups: Some(rows),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(
            req @ (Request::BalanceStart { .. }
            | Request::BalanceStatus
            | Request::BalancePause
            | Request::BalanceResume
            | Request::BalanceCancel),
        ) => balance_request(req, fs),
        Ok(Request::QuotaRescanStatus) => match fs.quota_rescan_status() {
            Ok(st) => Response {
                rescan: Some(st),
                ..Response::of(Ok(None))
            },
            Err(e) => Response::of(Err(e)),
        },
        Ok(req @ (Request::Quota { .. } | Request::QgroupLimitNode { .. })) => {
            Response::of(d.quota(req).map(|()| None))
        }
        Ok(req) => Response::of(d.subvolume(req)),
    };
    write_response(&s, &resp)
}
