//! `canopy mount`: mount an image through FUSE.

use anyhow::{bail, Context, Result};
use canopy::dev::Source;
use canopy::fuse::mount::{serve, MountOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(clap::Args)]
pub struct Args {
    /// Stay in the foreground (do not daemonize).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Mount options, comma-separated: ro, rw, relatime (default), noatime,
    /// strictatime, nodev, nosuid, noexec, allow_other,
    /// default_permissions, commit=SECONDS, cache_size=SIZE (memory for
    /// decoded tree blocks; default 64M; cache_blocks=N asks for N blocks
    /// of 16 KiB), threads=N, max_threads=N (on /dev/fuse, more threads
    /// start while all are busy, up to N; default 32), busy_poll=USECS
    /// (on /dev/fuse, the longest the first thread keeps asking for the
    /// next request before it sleeps; default 2000, 0 never),
    /// transport=auto|uring|dev (how requests reach the daemon: auto, the
    /// default, uses FUSE over io_uring when the kernel offers it, which
    /// root turns on with `echo 1 > /sys/module/fuse/parameters/enable_uring`
    /// on Linux 6.14 or later; uring refuses to mount without it),
    /// dirty_limit=SIZE (written data buffered before it is flushed;
    /// default 64M), dirty_metadata=SIZE (changed tree blocks a
    /// transaction gathers before it is committed early; default 32M),
    /// readahead=SIZE (how far the kernel reads ahead of a
    /// sequential reader; default 4M, 0 keeps the kernel's 128K),
    /// log_writes=1|2 (fsync log writes in flight at once; default 1),
    /// writeback_cache (the kernel buffers writes; ENOSPC then shows at
    /// fsync or close, see README), compress=zstd[:LEVEL]|lz4|no (compress
    /// file data as it is written; zstd levels 1 to 15, default 3; data
    /// that does not look compressible is written plain, and a file whose
    /// data does not compress stops being tried), compress-force=... (try
    /// every chunk; a file's `compression` property overrides both),
    /// nologreplay (with ro: the last commit, without replaying a crash's
    /// fsync log), user_subvol_rm_allowed (users may delete subvolumes
    /// they could rmdir). With remount, changes the flags of the live mount on
    /// MOUNTPOINT (ro, nosuid, nodev, noexec, atime options; a read-only
    /// mount stays read-only) and its compression for later writes.
    /// Unknown options are an error.
    #[arg(short = 'o', long, default_value = "")]
    options: String,
    /// Take the image over from a writer that holds it, on another host
    /// that is gone or hung (`-o takeover`): for an RBD image, its lock is
    /// broken and its client blocklisted first, so it can never write
    /// again (failover).
    #[arg(long)]
    break_lock: bool,
    /// Internal: report readiness on stdout (used when daemonizing).
    #[arg(long, hide = true)]
    notify_ready: bool,
    /// Image file, block device, or rbd:POOL/IMAGE[?conf=PATH&id=CLIENT&keyring=PATH].
    #[arg(value_parser = crate::image_arg())]
    image: Source,
    /// Directory to mount on.
    mountpoint: PathBuf,
}

const READY: &str = "canopy-ready";

pub fn run(a: Args) -> Result<()> {
    let mut opts = MountOptions::parse(&a.options)?;
    opts.takeover |= a.break_lock;
    if opts.remount {
        return canopy::fuse::mount::remount(&a.mountpoint, &opts)
            .with_context(|| format!("remounting {}", a.mountpoint.display()));
    }
    if !a.image.exists() {
        bail!("image {} does not exist", a.image);
    }
    // The daemon must outlive a command that goes away mid-answer (`canopy
    // send | head`): a write to its closed socket is an error, not death.
    // SAFETY: changing a signal's disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    if a.foreground {
        let notify = a.notify_ready;
        return serve(&a.image, &a.mountpoint, &opts, move || {
            if notify {
                println!("{READY}");
                let _ = std::io::stdout().flush();
                detach_output();
            }
        })
        .with_context(|| format!("serving {} on {}", a.image, a.mountpoint.display()));
    }
    daemonize(&a)
}

/// Points stdout at /dev/null once the parent has gone, and stderr (the
/// daemon's log) at the kernel log when we may write there, as a kernel
/// filesystem would log: `dmesg` shows Canopy's warnings and errors.
fn detach_output() {
    use std::os::fd::AsRawFd;
    let open = |p: &str| std::fs::OpenOptions::new().write(true).open(p).ok();
    let Some(null) = open("/dev/null") else {
        return;
    };
    let log = open("/dev/kmsg");
    let log_fd = log.as_ref().map_or(null.as_raw_fd(), |f| f.as_raw_fd());
    // SAFETY: dup2 on valid descriptors; replaces our own stdout/stderr.
    unsafe {
        libc::dup2(null.as_raw_fd(), 1);
        libc::dup2(log_fd, 2);
    }
}

/// Starts the daemon and returns once it reports the mount live, or fails
/// with what it printed.
fn daemonize(a: &Args) -> Result<()> {
    let exe = std::env::current_exe().context("finding the canopy executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("-f").arg("--notify-ready");
    if !a.options.is_empty() {
        cmd.arg("-o").arg(&a.options);
    }
    if a.break_lock {
        cmd.arg("--break-lock");
    }
    cmd.arg(a.image.to_arg()).arg(&a.mountpoint);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the
    // terminal's session so closing the terminal does not kill it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the canopy daemon")?;
    let stdout = child.stdout.take().context("daemon stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() == READY {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    let err = err.trim().trim_start_matches("canopy: error: ");
    bail!(
        "{}",
        if err.is_empty() {
            "the daemon exited before the mount was live"
        } else {
            err
        }
    )
}
