//! `canopy mount -o` options: mount(8)'s generic ones, FUSE's, and
//! Canopy's own, and the FUSE mount options they become.

use crate::error::{Error, Result};

/// Options accepted by `canopy mount -o`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    pub read_only: bool,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// Flags passed through to the kernel (nodev, nosuid, noexec, atime...).
    pub kernel: Vec<String>,
    /// Seconds between automatic commits.
    pub commit_secs: u64,
    /// Log writes (fsyncs) in flight at once (`log_writes=N`; see
    /// `OpenOptions::log_writes_in_flight`).
    pub log_writes_in_flight: usize,
    /// Memory the clean block cache may hold, in bytes (`cache_size`;
    /// `cache_blocks=N` asks for N blocks of 16 KiB).
    pub cache_bytes: usize,
    /// Request-serving threads (under io_uring spread over the kernel's
    /// queues, at least one each).
    pub threads: usize,
    /// The most /dev/fuse threads: more start while every one is busy
    /// (`max_threads=N`; see `dev::Pool`).
    pub max_threads: usize,
    /// The longest a /dev/fuse reader keeps asking for the next request
    /// before it sleeps (`busy_poll=`, microseconds; 0 never polls).
    pub busy_poll_us: u64,
    /// How requests reach the daemon (`transport=auto|uring|dev`).
    pub transport: super::Transport,
    /// Bytes of written file data buffered before writers flush; None
    /// (no `dirty_limit=`) follows the kernel's global dirty limit, at
    /// most 64 MiB (see `fuse::bdi`).
    pub dirty_limit: Option<u64>,
    /// Bytes of changed tree blocks a transaction may gather before it is
    /// committed early (`dirty_metadata=`): a commit holds its blocks in
    /// memory until they are written, so this bounds the daemon's memory
    /// under metadata work, as `commit=` bounds its time.
    pub dirty_metadata: u64,
    /// Keep the kernel's strict per-mount dirty limit for FUSE (1% of
    /// the global limit; `strict_limit`) instead of the share a kernel
    /// filesystem gets (see `fuse::bdi`).
    pub strict_limit: bool,
    /// FUSE requests the kernel keeps in the background at once
    /// (writeback and read-ahead; INIT's `max_background`).
    pub max_background: u16,
    /// When reads update access times.
    pub atime: crate::fs::AtimePolicy,
    /// Whether listing a directory updates its access time (`nodiratime`
    /// turns it off; the atime policy still applies when on).
    pub dir_atime: bool,
    /// Change the options of a live mount (`mount -o remount,...`).
    pub remount: bool,
    /// Users may delete subvolumes they could `rmdir` (btrfs's option of
    /// that name); otherwise only root may.
    pub user_subvol_rm_allowed: bool,
    /// A generic option besides `remount` was given: a remount passes the
    /// flags to the kernel (one with `compress=` alone leaves them).
    pub generic_given: bool,
    /// Let the kernel buffer writes in its page cache and send them in
    /// large batches (FUSE's writeback cache). Off unless asked for: the
    /// daemon then sees writes only at writeback, so a full disk or quota
    /// shows at fsync or close rather than at write, st_blocks lags, and
    /// SEEK_DATA/SEEK_HOLE cannot see unflushed data (so they report no
    /// holes).
    pub writeback_cache: bool,
    /// How far ahead the kernel reads a file sequentially read, in bytes
    /// (the mount's read_ahead_kb); 0 leaves the kernel's default. FUSE
    /// mounts start at 128 KiB, which keeps a cold read waiting on small
    /// requests; like btrfs, Canopy asks for at least 4 MiB.
    pub readahead: u64,
    /// fsync writes the log tree (btrfs's `treelog`, the default); off
    /// (`notreelog`), every fsync commits the whole filesystem.
    pub treelog: bool,
    /// The subvolume shown as the mount's root (`subvol=`, `subvolid=`).
    pub subvolume: crate::fs::Shown,
    /// Replays the fsync log a crash left (off: `nologreplay`, read-only
    /// mounts only, as btrfs: the last commit without the log).
    pub log_replay: bool,
    /// How writeback compresses file data (`compress=zstd[:LEVEL]|lz4|no`,
    /// `compress-force=`); a file's `compression` property overrides it.
    pub compression: crate::compress::Policy,
    /// The last `compress=`/`compress-force=` option as given: what a
    /// remount hands the daemon (the kernel never sees it).
    pub compression_option: Option<String>,
    /// Take the image from a writer that holds it (`takeover`, what
    /// `canopy mount --break-lock` sets): for RBD images, break its lock
    /// and blocklist it first, so a paused writer can never write again.
    pub takeover: bool,
    /// The filesystem's other devices (`device=PATH`, once each, as btrfs
    /// takes them), beside the one mounted.
    pub devices: Vec<crate::dev::Source>,
    /// Mount although devices are missing, reading the copies left
    /// (`degraded`; read-only without device 1).
    pub degraded: bool,
    /// How freed space reaches the storage (`discard=async`, the
    /// default; `discard`/`discard=sync`; `nodiscard`): see
    /// `txn::discard`.
    pub discard: crate::txn::DiscardMode,
    /// The last discard option as given: what a remount hands the daemon.
    pub discard_option: Option<String>,
}

/// Default for the `max_background=` option (the kernel's own is 12).
pub const DEFAULT_MAX_BACKGROUND: u16 = 16;

/// Default for the `dirty_metadata=` option: about 2,000 blocks of 16
/// KiB, a few seconds of creates in large directories.
pub const DEFAULT_DIRTY_METADATA: u64 = 32 << 20;

/// Default for the `busy_poll=` option, in microseconds: the longest the
/// polling reader's window may grow (`dev::Window`, which starts at 50
/// µs). PostgreSQL's requests under pgbench come a few hundred
/// microseconds to a few milliseconds apart; polling up to 2 ms caught
/// them (docs/benchmarks.md), and requests more than 2 ms apart shrink
/// the window back towards 50 µs.
pub const DEFAULT_BUSY_POLL_US: u64 = 2_000;

/// How many /dev/fuse threads may serve at once by default: enough for
/// sixteen programs each waiting on an fsync with requests of others
/// still served; each costs its stack and buffers only once started.
pub const DEFAULT_MAX_THREADS: usize = 32;

/// Default for the `readahead=` option.
pub const DEFAULT_READAHEAD: u64 = 4 << 20;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            // Mounted by root, Canopy serves every user as a kernel
            // filesystem would; the kernel still checks permissions
            // (default_permissions). Others need user_allow_other in
            // /etc/fuse.conf to ask for it.
            allow_other: unsafe { libc::geteuid() } == 0,
            default_permissions: true,
            kernel: Vec::new(),
            commit_secs: 5,
            log_writes_in_flight: 1,
            cache_bytes: crate::cache::DEFAULT_BYTES,
            threads: 4,
            max_threads: DEFAULT_MAX_THREADS,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            transport: super::Transport::Auto,
            dirty_limit: None,
            dirty_metadata: DEFAULT_DIRTY_METADATA,
            strict_limit: false,
            max_background: DEFAULT_MAX_BACKGROUND,
            atime: crate::fs::AtimePolicy::Relative,
            dir_atime: true,
            remount: false,
            user_subvol_rm_allowed: false,
            generic_given: false,
            writeback_cache: false,
            readahead: DEFAULT_READAHEAD,
            treelog: true,
            subvolume: crate::fs::Shown::Default,
            log_replay: true,
            compression: crate::compress::Policy::default(),
            compression_option: None,
            takeover: false,
            devices: Vec::new(),
            degraded: false,
            discard: crate::txn::DiscardMode::Async,
            discard_option: None,
        }
    }
}

impl MountOptions {
    /// Parses a comma-separated list; an unknown option is an error.
    pub fn parse(s: &str) -> Result<MountOptions> {
        let mut o = MountOptions::default();
        for opt in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (name, value) = opt
                .split_once('=')
                .map_or((opt, None), |(n, v)| (n, Some(v)));
            if !o.generic_option(name) && !o.canopy_option(opt, name, value)? {
                return Err(Error::Invalid(format!("unknown mount option '{opt}'")));
            }
        }
        if !o.log_replay && !o.read_only {
            return Err(Error::Invalid(
                "nologreplay needs ro: a writable mount would commit over the fsync log \
                 (use 'canopy rescue zero-log' to drop it)"
                    .into(),
            ));
        }
        Ok(o)
    }

    /// Applies one of mount(8)'s generic options, or one FUSE or an LSM
    /// passes; false if `name` is none of them.
    fn generic_option(&mut self, name: &str) -> bool {
        let o = self;
        o.generic_given |= name != "remount";
        match name {
            "ro" => o.read_only = true,
            "remount" => o.remount = true,
            "rw" => o.read_only = false,
            "allow_other" => o.allow_other = true,
            "default_permissions" => o.default_permissions = true,
            "noatime" => {
                o.atime = crate::fs::AtimePolicy::Never;
                o.kernel.push(name.to_string());
            }
            "strictatime" => {
                o.atime = crate::fs::AtimePolicy::Strict;
                o.kernel.push(name.to_string());
            }
            "relatime" | "atime" | "norelatime" | "nostrictatime" => {
                o.atime = crate::fs::AtimePolicy::Relative
            }
            "nodiratime" => {
                o.dir_atime = false;
                o.kernel.push(name.to_string());
            }
            "diratime" => o.dir_atime = true,
            "nodev" | "dev" | "nosuid" | "suid" | "noexec" | "exec" | "sync" | "async"
            | "dirsync" | "lazytime" | "nolazytime" | "nosymfollow" | "symfollow" => {
                o.kernel.push(name.to_string())
            }
            // Generic options with nothing to do here: Canopy keeps an
            // inode version in every change anyway (iversion), mandatory
            // locks are gone from Linux, and the rest are mount(8)'s or
            // an LSM's.
            "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "_netdev"
            | "nofail"
            | "iversion"
            | "noiversion"
            | "mand"
            | "nomand"
            | "silent"
            | "loud"
            | "context"
            | "fscontext"
            | "defcontext"
            | "rootcontext"
            | "x-systemd.automount" => {}
            _ if name.starts_with("x-") || name.starts_with("comment") => {}
            // FUSE's own, which Canopy sets itself; mount(8) passes them
            // back from /proc/mounts on a remount.
            "user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fsname" | "subtype" => {
            }
            _ => return false,
        }
        true
    }

    /// Applies one of Canopy's own options; false if `name` is none of
    /// them, an error if its value is wrong.
    fn canopy_option(&mut self, opt: &str, name: &str, value: Option<&str>) -> Result<bool> {
        let o = self;
        let num = |v: Option<&str>| -> Result<u64> {
            v.and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::Invalid(format!("option {name} needs a number")))
        };
        match name {
            "nologreplay" => o.log_replay = false,
            "rescue" => match value {
                Some("nologreplay") => o.log_replay = false,
                _ => {
                    return Err(Error::Invalid(format!(
                        "unknown rescue option in '{opt}' (Canopy has rescue=nologreplay)"
                    )))
                }
            },
            "compress" | "compress-force" => {
                let codec = crate::compress::Codec::parse(value.unwrap_or("zstd"))
                    .map_err(|why| Error::Invalid(format!("'{opt}': {why}")))?;
                o.compression = crate::compress::Policy {
                    codec,
                    force: name == "compress-force" && codec.is_some(),
                };
                o.compression_option = Some(opt.to_string());
            }
            "discard" | "nodiscard" => {
                use crate::txn::DiscardMode;
                o.discard = match (name, value) {
                    ("nodiscard", None) => DiscardMode::Off,
                    ("discard", None | Some("sync")) => DiscardMode::Sync,
                    ("discard", Some("async")) => DiscardMode::Async,
                    _ => {
                        return Err(Error::Invalid(format!(
                            "'{opt}': discard is discard[=sync|async] or nodiscard"
                        )))
                    }
                };
                o.discard_option = Some(opt.to_string());
            }
            "writeback_cache" => o.writeback_cache = true,
            "takeover" => o.takeover = true,
            "degraded" => o.degraded = true,
            "device" => {
                let v = value.ok_or_else(|| Error::Invalid("device needs a path".into()))?;
                o.devices.push(v.parse()?);
            }
            "strict_limit" => o.strict_limit = true,
            "nostrict_limit" => o.strict_limit = false,
            "max_background" => o.max_background = num(value)?.clamp(1, u16::MAX.into()) as u16,
            "treelog" => o.treelog = true,
            "user_subvol_rm_allowed" => o.user_subvol_rm_allowed = true,
            "notreelog" => o.treelog = false,
            "no_writeback_cache" => o.writeback_cache = false,
            "subvol" => {
                let v = value.ok_or_else(|| Error::Invalid("subvol needs a path".into()))?;
                o.subvolume = crate::fs::Shown::Path(v.as_bytes().to_vec());
            }
            "subvolid" => o.subvolume = crate::fs::Shown::Id(num(value)?),
            "commit" => o.commit_secs = num(value)?.max(1),
            "log_writes" => {
                let most = crate::format::superblock::LOG_WRITES_IN_FLIGHT_MAX as u64;
                let n = num(value)?;
                if !(1..=most).contains(&n) {
                    return Err(Error::Invalid(format!(
                        "'{opt}': log_writes is 1 to {most} (log writes in flight at once)"
                    )));
                }
                o.log_writes_in_flight = n as usize;
            }
            "cache_blocks" => o.cache_bytes = (num(value)? as usize).saturating_mul(16 << 10),
            "cache_size" => {
                let v = value.ok_or_else(|| Error::Invalid("cache_size needs a size".into()))?;
                o.cache_bytes = crate::units::parse_size(v).map_err(Error::Invalid)? as usize;
            }
            "threads" => o.threads = num(value)?.clamp(1, 64) as usize,
            "max_threads" => o.max_threads = num(value)?.clamp(1, 256) as usize,
            "busy_poll" => o.busy_poll_us = num(value)?.min(10_000),
            "transport" => {
                o.transport = match value {
                    Some("auto") => super::Transport::Auto,
                    Some("uring" | "io_uring") => super::Transport::Uring,
                    Some("dev") => super::Transport::Dev,
                    _ => {
                        return Err(Error::Invalid(format!(
                            "'{opt}': transport is auto, uring or dev"
                        )))
                    }
                }
            }
            "readahead" => {
                let v = value.ok_or_else(|| Error::Invalid("readahead needs a size".into()))?;
                o.readahead = crate::units::parse_size(v).map_err(Error::Invalid)?;
            }
            "dirty_metadata" => {
                let v =
                    value.ok_or_else(|| Error::Invalid("dirty_metadata needs a size".into()))?;
                o.dirty_metadata = crate::units::parse_size(v)
                    .map_err(Error::Invalid)?
                    .max(1 << 20);
            }
            "dirty_limit" => {
                let v = value.ok_or_else(|| Error::Invalid("dirty_limit needs a size".into()))?;
                o.dirty_limit = Some(
                    crate::units::parse_size(v)
                        .map_err(Error::Invalid)?
                        .max(4096),
                );
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The options fusermount3 takes for a mount by a user other than
    /// root (it forces nosuid and nodev itself).
    pub(super) fn fusermount_options(&self, source: &str) -> String {
        let mut o = vec![
            format!("fsname={}", source.replace(',', "\\,")),
            "subtype=canopy".to_string(),
            if self.read_only { "ro" } else { "rw" }.to_string(),
        ];
        if self.default_permissions {
            o.push("default_permissions".into());
        }
        if self.allow_other {
            o.push("allow_other".into());
        }
        let passed = [
            "noexec",
            "exec",
            "noatime",
            "sync",
            "async",
            "dirsync",
            "nodiratime",
        ];
        o.extend(
            self.kernel
                .iter()
                .filter(|k| passed.contains(&k.as_str()))
                .cloned(),
        );
        o.join(",")
    }
}
