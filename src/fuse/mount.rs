//! Mounting: the FUSE session (options in `options.rs`), periodic commits, and a clean
//! shutdown on unmount, SIGTERM or SIGINT.

use super::{FuseFs, Notifier};
use crate::dev::{Access, Device, FileDevice, OpenHow, Source};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::{Engine, OpenOptions};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use super::options::{MountOptions, DEFAULT_READAHEAD};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

/// Mounts `image` on `mountpoint` and serves requests until the filesystem
/// is unmounted or the process gets SIGTERM/SIGINT. `ready` is called once
/// the mount is live.
pub fn serve(
    image: &Source,
    mountpoint: &Path,
    opts: &MountOptions,
    ready: impl FnOnce(),
) -> Result<()> {
    check_mountpoint(mountpoint)?;
    // Before any thread starts: they inherit it.
    let flusher = super::bdi::become_io_flusher();
    let fs = open_fs(image, opts, flusher)?;
    install_signal_handlers();
    let source = image.to_string();
    let kernel = Arc::new(super::bdi::KernelSide {
        buffer_follows_global: opts.dirty_limit.is_none(),
        max_background: opts.max_background,
        ..Default::default()
    });
    let (session, notifier) = match start_session(&fs, &source, mountpoint, opts, &kernel) {
        Err(Error::Io { context, cause })
            if context == super::uring::REGISTER_FAILED
                && opts.transport == super::Transport::Auto =>
        {
            tracing::warn!(error = %cause, "io_uring failed after INIT; mounting again on /dev/fuse");
            let dev = MountOptions {
                transport: super::Transport::Dev,
                ..opts.clone()
            };
            start_session(&fs, &source, mountpoint, &dev, &kernel)?
        }
        r => r?,
    };
    tracing::info!(image = %source, mountpoint = %mountpoint.display(), "mounted");
    let mount_path = mountpoint
        .canonicalize()
        .unwrap_or(mountpoint.to_path_buf());
    tune_backing_device(&mount_path, opts, session.by_root, &kernel);
    let helpers = Helpers::start(&fs, &mount_path, notifier, opts, kernel);
    ready();
    // After `ready`, so that a daemonized mount's line reaches its log.
    tracing::info!(target: "canopy::transport", mountpoint = %mount_path.display(), "transport: {}", session.running.transport);
    run_until_unmounted(&fs, &session, &mount_path, opts);
    end_session(session, mountpoint);
    helpers.stop(&fs);
    if let Some(why) = fs.engine().shutdown_reason() {
        // Logged as what it was: a shutdown while mounted, not a failure
        // to mount.
        tracing::error!(reason = %why, "unmounted a filesystem that had shut down while mounted; the image keeps its last commit");
        return Err(Error::Aborted(why));
    }
    if !opts.read_only {
        fs.sync()?;
    }
    tracing::info!("unmounted cleanly");
    Ok(())
}

fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    match std::fs::metadata(mountpoint) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Invalid(format!(
            "mount point {} does not exist",
            mountpoint.display()
        ))),
        Err(e) => Err(Error::io(format!("looking at {}", mountpoint.display()), e)),
        Ok(m) if !m.is_dir() => Err(Error::Invalid(format!(
            "mount point {} is not a directory",
            mountpoint.display()
        ))),
        Ok(_) => Ok(()),
    }
}

/// Opens the image (replaying a crash's log unless `nologreplay`) with
/// the mount's settings.
fn open_fs(image: &Source, opts: &MountOptions, io_flusher: bool) -> Result<Arc<Fs>> {
    let mut devs = vec![open_device(image, opts, io_flusher)?];
    for (i, other) in opts.devices.iter().enumerate() {
        devs.push(open_other_device(other, opts, i + 2)?);
    }
    let engine = Engine::open_devices(
        devs,
        &OpenOptions {
            read_only: opts.read_only,
            cache_bytes: opts.cache_bytes,
            replay_log: opts.log_replay,
            degraded: opts.degraded,
            log_writes_in_flight: opts.log_writes_in_flight,
            device_names: std::iter::once(image)
                .chain(&opts.devices)
                .map(|s| s.to_string())
                .collect(),
            ..OpenOptions::default()
        },
    )?;
    let fs = Arc::new(Fs::with_root(Arc::new(engine), &opts.subvolume)?);
    fs.set_dirty_limit(
        opts.dirty_limit
            .unwrap_or_else(super::bdi::buffer_following_global),
    );
    fs.set_log_enabled(opts.treelog);
    fs.set_atime_policy(opts.atime);
    fs.set_dir_atime(opts.dir_atime);
    fs.set_compression(opts.compression);
    if !opts.read_only {
        fs.engine().set_discard(opts.discard)?;
    }
    Ok(fs)
}

/// Opens the device: a writer claims it (taking it over with
/// `takeover`), a read-only mount shares it with other readers.
fn open_device(image: &Source, opts: &MountOptions, io_flusher: bool) -> Result<Arc<dyn Device>> {
    let access = match opts.read_only {
        true => Access::Share,
        false => Access::Write,
    };
    let dev: Arc<dyn Device> = match image.path() {
        None => {
            let how = OpenHow {
                takeover: opts.takeover,
            };
            Arc::from(image.open(access, how)?)
        }
        Some(path) => {
            if opts.takeover {
                return Err(Error::Invalid(format!(
                    "takeover is for RBD images: {} is held by a process on this host, which must end first",
                    path.display()
                )));
            }
            let file = FileDevice::open_as(path, access)?;
            if opts.writeback_cache
                && !opts.read_only
                && !io_flusher
                && !file.write_everything_direct()
            {
                tracing::warn!("under writeback_cache with neither CAP_SYS_RESOURCE nor O_DIRECT on the image, writes may crawl at a small vm.dirty_bytes (see fuse::bdi)");
            }
            Arc::new(file)
        }
    };
    if opts.read_only {
        return Ok(dev);
    }
    // The crash campaign's power-cut mode, when its environment asks.
    crate::dev::powercut::from_env(dev)
}

/// Opens the `nth` device a mount names (2: the first `device=`),
/// claimed like the one mounted, under the crash campaign's power-cut
/// journal of its own when the environment asks.
fn open_other_device(source: &Source, opts: &MountOptions, nth: usize) -> Result<Arc<dyn Device>> {
    let access = match opts.read_only {
        true => Access::Share,
        false => Access::Write,
    };
    let how = OpenHow {
        takeover: opts.takeover && source.path().is_none(),
    };
    let dev: Arc<dyn Device> = Arc::from(source.open(access, how)?);
    match opts.read_only || source.path().is_none() {
        true => Ok(dev),
        false => crate::dev::powercut::from_env_for(dev, nth),
    }
}

/// A live session: the threads serving it, and whether Canopy mounted
/// it itself as root (else fusermount3 did).
struct Mounted {
    running: super::session::Running,
    by_root: bool,
}

/// Mounts and starts serving FUSE requests.
fn start_session(
    fs: &Arc<Fs>,
    source: &str,
    mountpoint: &Path,
    opts: &MountOptions,
    kernel: &Arc<super::bdi::KernelSide>,
) -> Result<(Mounted, Notifier)> {
    let notifier = Notifier::default();
    let handler = FuseFs::new(
        fs.clone(),
        opts.writeback_cache && !opts.read_only,
        notifier.clone(),
        kernel.clone(),
    );
    let by_root = unsafe { libc::geteuid() } == 0;
    let fd = if by_root {
        mount_as_root(source, mountpoint, opts)?
    } else {
        super::fusermount::mount(mountpoint, &opts.fusermount_options(source))?
    };
    let transport = super::session::Config {
        transport: opts.transport,
        threads: opts.threads,
        max_threads: opts.max_threads,
        busy_poll: Duration::from_micros(opts.busy_poll_us),
        max_background: opts.max_background,
    };
    match super::session::start(Arc::new(fd), handler, &transport) {
        Ok(running) => {
            notifier.attach(running.fd.clone());
            Ok((Mounted { running, by_root }, notifier))
        }
        Err(e) => {
            abort_connection(mountpoint);
            unmount(mountpoint, by_root);
            Err(e)
        }
    }
}

/// Ends the kernel's side of the FUSE connection on `mountpoint`
/// (fusectl's `abort`), so that nothing waits on a session that failed
/// to start: once io_uring is agreed, the kernel holds every request
/// until the rings are ready. The path is resolved without looking into
/// the mount itself, which would wait the same way.
fn abort_connection(mountpoint: &Path) {
    let resolved = match (mountpoint.parent(), mountpoint.file_name()) {
        (Some(p), Some(n)) => p
            .canonicalize()
            .map(|p| p.join(n))
            .unwrap_or(mountpoint.to_path_buf()),
        _ => mountpoint.to_path_buf(),
    };
    let Some(dev) = our_mount(&resolved, |f, _| f.get(2).map(|d| d.to_string())) else {
        return;
    };
    let Some(minor) = dev.split(':').nth(1) else {
        return;
    };
    let path = format!("/sys/fs/fuse/connections/{minor}/abort");
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::warn!(error = %e, %path, "could not abort the FUSE connection");
    }
}

/// The daemon's helpers beside the FUSE session: the control socket, the
/// cleaner, and a balance or quota rescan an earlier mount left running.
struct Helpers {
    control: Option<super::control::Server>,
    cleaner: Option<crate::fs::Cleaner>,
}

impl Helpers {
    fn start(
        fs: &Arc<Fs>,
        mount_path: &Path,
        notifier: Notifier,
        opts: &MountOptions,
        kernel: Arc<super::bdi::KernelSide>,
    ) -> Helpers {
        // Commands (`canopy scrub MNT`) reach the daemon here; a mount works
        // without them.
        let policy = super::peer::Policy {
            user_subvol_rm: opts.user_subvol_rm_allowed,
        };
        let control = super::control::Server::start(mount_path, fs.clone(), notifier, kernel, policy)
            .map_err(|e| tracing::warn!(error = %e, "no control socket: scrub and other commands cannot reach this mount"))
            .ok();
        if opts.read_only {
            return Helpers {
                control,
                cleaner: None,
            };
        }
        // Frees deleted subvolumes in the background, carrying on with what
        // an earlier mount left.
        let cleaner = crate::fs::Cleaner::start(fs.clone())
            .map_err(|e| tracing::warn!(error = %e, "no cleaner thread: deleted subvolumes are freed only by `canopy subvolume sync`"))
            .ok();
        // A balance an earlier mount left running carries on.
        if let Err(e) = fs.balance_resume_if_recorded() {
            tracing::warn!(error = %e, "could not carry on the recorded balance");
        }
        if let Err(e) = fs.quota_rescan_resume_if_recorded() {
            tracing::warn!(error = %e, "could not carry on the quota rescan");
        }
        // So does a device replace, its target opened again by name.
        let open_target = |name: &str| -> Result<Arc<dyn Device>> {
            let source: Source = name.parse()?;
            Ok(Arc::from(source.open(Access::Write, OpenHow::default())?))
        };
        if let Err(e) = fs.replace_resume_if_recorded(open_target) {
            tracing::warn!(error = %e, "could not carry on the device replace");
        }
        Helpers { control, cleaner }
    }

    fn stop(self, fs: &Fs) {
        drop(self.control);
        drop(self.cleaner);
        // It carries on at the next mount.
        fs.balance_stop();
        fs.quota_rescan_stop();
    }
}

/// Commits every `commit=` seconds, or sooner once the running
/// transaction changed `dirty_metadata=` bytes of tree blocks, and
/// follows remounts until a signal or an unmount ends the session.
fn run_until_unmounted(fs: &Fs, session: &Mounted, mount_path: &Path, opts: &MountOptions) {
    let mut last_commit = Instant::now();
    let mut last_look = Instant::now();
    // A commit that came due while frozen, made at the thaw.
    let mut deferred = false;
    fs.set_dirty_metadata_limit(opts.dirty_metadata);
    while !STOP.load(Ordering::SeqCst) && !session.running.finished() {
        let wanted = fs.wait_commit_wanted(Duration::from_millis(100)) || deferred;
        if !opts.read_only && last_look.elapsed() >= Duration::from_secs(1) {
            follow_remount(fs, mount_path);
            if opts.dirty_limit.is_none() {
                fs.set_dirty_limit(super::bdi::buffer_following_global());
            }
            last_look = Instant::now();
        }
        let writable = !opts.read_only && !fs.is_remounted_read_only();
        let due = wanted || last_commit.elapsed() >= Duration::from_secs(opts.commit_secs);
        // While frozen nothing reaches the storage: a commit would wait
        // here for the thaw, and an unmount meanwhile (the kernel sends
        // no DESTROY to a plain FUSE mount) would go unseen until the
        // freeze timed out.
        let frozen = fs.engine().frozen_for().is_some();
        deferred = due && frozen;
        if writable && due && !frozen {
            match fs.sync() {
                // The shutdown was logged once, with its cause.
                Ok(()) | Err(Error::Aborted(_)) => {}
                Err(e) => tracing::error!(error = %e, "periodic commit failed"),
            }
            last_commit = Instant::now();
            release_free_memory();
        }
        if writable && !frozen {
            discard_freed(fs);
        }
    }
    // Nothing may wait for a thaw that will not come: the last commit
    // and every request still in flight must reach the storage.
    if fs.engine().frozen_for().is_some() && fs.engine().thaw().is_ok() {
        tracing::warn!("unmounted while frozen: thawed");
    }
}

/// `discard=async`'s turn, once per pass of the mount loop: a few
/// batches of what has stayed free long enough.
fn discard_freed(fs: &Fs) {
    use crate::txn::{DiscardMode, DiscardPass};
    let engine = fs.engine();
    if engine.discard_mode() != DiscardMode::Async {
        return;
    }
    match engine.discard_freed(DiscardPass::ASYNC) {
        Ok(_) | Err(Error::Aborted(_)) => {}
        Err(e) => tracing::warn!(error = %e, "discarding freed space failed"),
    }
}

/// How the program's allocator gives its free pages back to the system
/// (set by the program, which chose the allocator).
static RELEASE_FREE_MEMORY: OnceLock<fn()> = OnceLock::new();

/// Sets what runs after each commit of the mount loop to give the
/// allocator's free pages back to the system. A commit frees the running
/// transaction's blocks in one burst, and an allocator that purges free
/// pages only from inside later allocations (mimalloc) would otherwise
/// keep them resident while the daemon idles: after a million creates in
/// 1,000 directories, up to 100 MB (issue 54).
pub fn set_free_memory_release(release: fn()) {
    let _ = RELEASE_FREE_MEMORY.set(release);
}

fn release_free_memory() {
    if let Some(release) = RELEASE_FREE_MEMORY.get() {
        release();
    }
}

fn end_session(session: Mounted, mountpoint: &Path) {
    if STOP.load(Ordering::SeqCst) {
        tracing::info!("signal received: unmounting");
        unmount(mountpoint, session.by_root);
    }
    session.running.join();
}

/// Notices a `mount -o remount,ro` (or back to rw) of our mount: the
/// kernel changes the flags without telling the daemon, so the daemon
/// looks at its mount now and then.
fn follow_remount(fs: &Fs, mountpoint: &Path) {
    let Some(ro) = mounted_read_only(mountpoint) else {
        return;
    };
    if ro != fs.is_remounted_read_only() {
        tracing::info!(read_only = ro, "remounted");
        if let Err(e) = fs.set_remounted_read_only(ro) {
            tracing::error!(error = %e, "commit at remount read-only failed");
        }
    }
}

/// Gives the mount's backing device its read-ahead and, unless
/// `strict_limit`, the dirty limits of a kernel filesystem's (root only:
/// see `fuse::bdi`), and records which device it is.
fn tune_backing_device(
    mount_path: &Path,
    opts: &MountOptions,
    by_root: bool,
    kernel: &super::bdi::KernelSide,
) {
    let Some(dev) = our_mount(mount_path, |f, _| f.get(2).map(|d| d.to_string())) else {
        return;
    };
    if by_root && opts.readahead > 0 {
        super::bdi::set_readahead(&dev, opts.readahead);
    }
    if by_root && !opts.strict_limit && !opts.read_only {
        super::bdi::follow_global_limit(&dev);
    }
    let _ = kernel.bdi.set(dev);
}

/// Looks up the `fuse.canopy` mount on `mountpoint` in
/// /proc/self/mountinfo (the newest, if stacked) and applies `pick` to its
/// per-mount fields and its superblock fields.
fn our_mount<T>(mountpoint: &Path, pick: impl Fn(&[&str], &[&str]) -> Option<T>) -> Option<T> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    info.lines().rev().find_map(|line| {
        let (mine, sb) = line.split_once(" - ")?;
        let f: Vec<&str> = mine.split(' ').collect();
        let s: Vec<&str> = sb.split(' ').collect();
        if s.first() != Some(&"fuse.canopy") || unescape_mountinfo(f.get(4)?) != want {
            return None;
        }
        pick(&f, &s)
    })
}

/// Whether the `fuse.canopy` mount on `mountpoint` is read-only, from
/// /proc/self/mountinfo; None when no such mount is listed.
pub fn mounted_read_only(mountpoint: &Path) -> Option<bool> {
    our_mount(mountpoint, |f, s| {
        let has_ro = |opts: &str| opts.split(',').any(|o| o == "ro");
        Some(has_ro(f.get(5)?) || s.get(2).is_some_and(|o| has_ro(o)))
    })
}

/// The image the `fuse.canopy` mount on `mountpoint` was made from, as
/// /proc/self/mountinfo names its source; None when no such mount is
/// listed.
pub fn mount_source(mountpoint: &Path) -> Option<String> {
    our_mount(mountpoint, |_, s| Some(unescape_mountinfo(s.get(1)?)))
}

/// mountinfo writes space, tab, newline and backslash as `\NNN` (octal).
fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `mount -o remount,OPTIONS`: changes the flags of the live mount on
/// `mountpoint` (read-only, nosuid, nodev, noexec, atime); the daemon
/// follows within a second (see [`follow_remount`]). A mount that began
/// read-only cannot become writable this way: its daemon opened the image
/// read-only. `compress=`/`compress-force=` and the discard options go
/// to the daemon over its control socket (the kernel never passes them):
/// compression applies to the writes it flushes from then on, discard to
/// the space freed from then on.
pub fn remount(mountpoint: &Path, opts: &MountOptions) -> Result<()> {
    let path = mountpoint
        .canonicalize()
        .map_err(|e| Error::io(format!("finding {}", mountpoint.display()), e))?;
    let Some(now_ro) = mounted_read_only(&path) else {
        return Err(Error::Invalid(format!(
            "{} is not a mounted Canopy filesystem",
            mountpoint.display()
        )));
    };
    let for_daemon: Vec<&str> = [&opts.compression_option, &opts.discard_option]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if !for_daemon.is_empty() {
        let asked = super::control::Request::SetOptions {
            options: for_daemon.join(","),
        };
        let r = super::control::request(&path, &asked)?;
        if !r.ok {
            return Err(Error::Invalid(r.error.unwrap_or_else(|| "refused".into())));
        }
        if !opts.generic_given {
            return Ok(());
        }
    }
    remount_kernel_flags(&path, opts, now_ro)
}

/// The kernel's part of [`remount`]: the generic flags.
fn remount_kernel_flags(path: &Path, opts: &MountOptions, now_ro: bool) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mountpoint = path;
    if now_ro && !opts.read_only && daemon_began_read_only(path) {
        return Err(Error::Invalid(
            "this mount began read-only and cannot become read-write: unmount it and mount it again"
                .into(),
        ));
    }
    let flags = libc::MS_REMOUNT | kernel_flags(opts);
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: valid NUL-terminated strings; no data for a FUSE remount.
    let r = unsafe {
        libc::mount(
            c"".as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(Error::io(
            format!("remounting {}", mountpoint.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Whether the daemon serving `mountpoint` was started read-only. The
/// kernel keeps no trace of that, so look for the daemon among the
/// processes: `canopy mount -f ... [-o OPTS] IMAGE MOUNTPOINT`.
fn daemon_began_read_only(mountpoint: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            return false;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_daemon =
            args.get(1).is_some_and(|a| a == "mount") && args.iter().any(|a| a == "--notify-ready");
        let Some(mnt) = args
            .iter()
            .rev()
            .find(|a| !a.is_empty())
            .filter(|_| is_daemon)
        else {
            return false;
        };
        let opts = args
            .iter()
            .position(|a| a == "-o")
            .and_then(|i| args.get(i + 1))
            .map_or("", String::as_str);
        // Only a daemon's mount point is resolved (through its own cwd).
        MountOptions::parse(opts).is_ok_and(|o| o.read_only)
            && p.path()
                .join("cwd")
                .join(mnt)
                .canonicalize()
                .ok()
                .as_deref()
                == Some(mountpoint)
    })
}

/// Mounts a `fuse.canopy` filesystem directly (as root) so that
/// `/proc/mounts` shows the image as the source and `fuse.canopy` as the
/// type; returns the /dev/fuse descriptor to serve.
fn mount_as_root(
    source: &str,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<std::os::fd::OwnedFd> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| Error::io("opening /dev/fuse (is the fuse module loaded?)", e))?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        dev.as_raw_fd(),
        unsafe { libc::getuid() },
        unsafe { libc::getgid() }
    );
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let flags = kernel_flags(opts);
    let bad = |_| Error::Invalid("path contains a NUL byte".into());
    let c_source = CString::new(source).map_err(bad)?;
    let c_target = CString::new(mountpoint.as_os_str().as_bytes()).map_err(bad)?;
    let c_type = CString::new("fuse.canopy").map_err(bad)?;
    let c_data = CString::new(data).map_err(bad)?;
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let r = unsafe {
        libc::mount(
            c_source.as_ptr(),
            c_target.as_ptr(),
            c_type.as_ptr(),
            flags,
            c_data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(Error::io(
            format!("mounting on {}", mountpoint.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(dev.into())
}

/// The mount(2) flags `opts` ask for (a mount by root: device nodes and
/// set-id bits work unless `nodev` / `nosuid` are given, as on kernel
/// filesystems). The last of a pair given wins.
fn kernel_flags(opts: &MountOptions) -> libc::c_ulong {
    let mut flags: libc::c_ulong = 0;
    // Whether the later of the pair given is `on` (the one that sets
    // the flag).
    let last = |off: &str, on: &str| {
        opts.kernel
            .iter()
            .rev()
            .find(|x| *x == off || *x == on)
            .is_some_and(|x| x == on)
    };
    for (off, on, flag) in [
        ("dev", "nodev", libc::MS_NODEV),
        ("suid", "nosuid", libc::MS_NOSUID),
        ("exec", "noexec", libc::MS_NOEXEC),
        ("symfollow", "nosymfollow", libc::MS_NOSYMFOLLOW),
        ("async", "sync", libc::MS_SYNCHRONOUS),
        ("nolazytime", "lazytime", libc::MS_LAZYTIME),
    ] {
        if last(off, on) {
            flags |= flag;
        }
    }
    let has = |k: &str| opts.kernel.iter().any(|x| x == k);
    for (name, flag) in [
        ("noatime", libc::MS_NOATIME),
        ("strictatime", libc::MS_STRICTATIME),
        ("dirsync", libc::MS_DIRSYNC),
        ("nodiratime", libc::MS_NODIRATIME),
    ] {
        if has(name) {
            flags |= flag;
        }
    }
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    flags
}

/// Unmounts, lazily if the mount is busy.
fn unmount(mountpoint: &Path, by_root: bool) {
    if !by_root {
        return super::fusermount::unmount(mountpoint);
    }
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: c is a valid NUL-terminated path.
    unsafe {
        if libc::umount2(c.as_ptr(), 0) != 0 {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_reject_unknown() {
        let o = MountOptions::parse("ro,noatime,nodev,allow_other,commit=10").unwrap();
        assert!(o.read_only && o.allow_other);
        assert_eq!(o.commit_secs, 10);
        assert_eq!(o.kernel, vec!["noatime", "nodev"]);
        assert!(MountOptions::parse("frobnicate").is_err());
        assert!(MountOptions::parse("commit=x").is_err());
        assert_eq!(
            MountOptions::parse("dirty_limit=10M").unwrap().dirty_limit,
            Some(10 << 20)
        );
        assert!(MountOptions::parse("dirty_limit=lots").is_err());
        assert_eq!(
            MountOptions::parse("dirty_metadata=64M")
                .unwrap()
                .dirty_metadata,
            64 << 20
        );
        assert_eq!(
            MountOptions::default().dirty_metadata,
            super::super::options::DEFAULT_DIRTY_METADATA
        );
        assert!(MountOptions::parse("dirty_metadata").is_err());
        assert_eq!(
            MountOptions::parse("readahead=1M").unwrap().readahead,
            1 << 20
        );
        assert_eq!(MountOptions::default().readahead, DEFAULT_READAHEAD);
        assert!(MountOptions::parse("readahead").is_err());
        assert_eq!(MountOptions::parse("busy_poll=0").unwrap().busy_poll_us, 0);
        assert_eq!(
            MountOptions::default().busy_poll_us,
            super::super::options::DEFAULT_BUSY_POLL_US
        );
        assert!(MountOptions::parse("busy_poll=soon").is_err());
    }

    #[test]
    fn log_writes_in_flight_is_one_unless_told_otherwise() {
        let n = |o: &str| MountOptions::parse(o).map(|o| o.log_writes_in_flight);
        assert_eq!(n("").unwrap(), 1);
        assert_eq!(n("log_writes=2").unwrap(), 2);
        assert_eq!(n("log_writes=1").unwrap(), 1);
        for bad in ["log_writes=0", "log_writes=3", "log_writes", "log_writes=x"] {
            assert!(n(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn discard_is_async_unless_told_otherwise() {
        use crate::txn::DiscardMode;
        let mode = |o: &str| MountOptions::parse(o).map(|o| o.discard);
        assert_eq!(mode("").unwrap(), DiscardMode::Async);
        assert_eq!(mode("discard").unwrap(), DiscardMode::Sync);
        assert_eq!(mode("discard=sync").unwrap(), DiscardMode::Sync);
        assert_eq!(mode("discard=async").unwrap(), DiscardMode::Async);
        assert_eq!(mode("discard,nodiscard").unwrap(), DiscardMode::Off);
        assert!(mode("discard=later").is_err());
        assert!(mode("nodiscard=1").is_err());
        let o = MountOptions::parse("remount,nodiscard").unwrap();
        assert_eq!(o.discard_option.as_deref(), Some("nodiscard"));
    }

    #[test]
    fn generic_vfs_options_are_accepted() {
        let o = MountOptions::parse(
            "nodiratime,iversion,lazytime,sync,dirsync,noexec,nosymfollow,x-gvfs-show,users",
        )
        .unwrap();
        assert!(!o.dir_atime);
        let f = kernel_flags(&o);
        for flag in [
            libc::MS_NODIRATIME,
            libc::MS_LAZYTIME,
            libc::MS_SYNCHRONOUS,
            libc::MS_DIRSYNC,
            libc::MS_NOEXEC,
            libc::MS_NOSYMFOLLOW,
        ] {
            assert_ne!(f & flag, 0, "flag {flag:#x}");
        }
        assert!(MountOptions::parse("diratime").unwrap().dir_atime);
        assert_eq!(
            MountOptions::parse("strictatime").unwrap().atime,
            crate::fs::AtimePolicy::Strict
        );
    }

    #[test]
    fn devices_and_set_id_work_unless_turned_off() {
        let f = kernel_flags(&MountOptions::default());
        assert_eq!(f & (libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC), 0);
        let f = kernel_flags(&MountOptions::parse("nodev,nosuid").unwrap());
        assert_eq!(
            f & (libc::MS_NODEV | libc::MS_NOSUID),
            libc::MS_NODEV | libc::MS_NOSUID
        );
        let f = kernel_flags(&MountOptions::parse("nodev,dev,sync,async").unwrap());
        assert_eq!(
            f & (libc::MS_NODEV | libc::MS_SYNCHRONOUS),
            0,
            "the last one wins"
        );
    }
}
