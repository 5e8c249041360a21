//! The `canopy` command: create, mount, check and inspect Canopy images.
//!
//! Subcommands follow btrfs-progs conventions; each has `--help`. Exit codes
//! of `check` follow fsck(8): 0 clean, 4 problems found, 8 operational error;
//! `scrub` follows btrfs-progs: 0 clean, 3 damage found, 1 could not scrub;
//! other subcommands exit 0 on success and 1 on error; usage errors exit 2.

mod balance;
mod check;
mod dedupe;
mod defrag;
mod device;
mod filesystem;
mod generate;
mod inspect;
mod mkfs;
mod mount;
mod quota;
mod receive;
mod rescue;
mod scrub;
mod send;
mod subvolume;
mod sync;
mod walk;
mod xattr;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: the daemon allocates a buffer per
/// write on one thread and frees it on another, and tree edits allocate
/// an item at a time; glibc's malloc took an eighth of all CPU time under
/// 4 random writers, which ran 10-15% faster on mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in the `mimalloc.h` (v3) that `libmimalloc-sys`
/// 0.1.49 builds; the Rust crate names no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the allocator (see [`tune_allocator`]).
const PURGE_DELAY_MS: libc::c_long = 1000;

/// Returns freed memory to the system after a second, not at once: a
/// buffer freed by a flush is taken again by the next writes within
/// milliseconds, and memory the system took back is faulted in and
/// cleared a page at a time. With 1 ms, faults took 42% of the daemon's
/// CPU in a 1 GiB sequential write on RBD (the writes' buffers and the
/// flushes' segments); with 1 s, 14%, and the write ran 5-20% faster
/// (three interleaved pairs).
/// What the daemon holds at rest is still bounded by the forced collect
/// after each commit ([`collect_free_pages`]): after the traffic of the
/// test `daemon_memory_stays_bounded` it held 54 MiB at its peak, against
/// 39 MiB with 1 ms. With 10 s, a 1 GiB write on RBD faulted 44,000
/// pages instead of 66,000-78,000 and the daemon spent 0.76-0.78 CPU-s
/// on it instead of 0.82-0.87, for no throughput beyond the noise, but
/// `cp -a` of /usr/share peaked 40 MB higher (329-334 MB against
/// 287-292): 1 s stays. The environment variable `MIMALLOC_PURGE_DELAY`
/// still wins.
///
/// Transparent huge pages are off for the process (unless
/// `MIMALLOC_ALLOW_THP=1`): with them, memory returned comes back as a
/// fresh 2 MiB page to fault in and zero. After a cold `find`
/// and `tar` over a copy of /usr/share (3 runs each way, interleaved)
/// the daemon held 95-96 MiB instead of 113-122 MiB, for the same
/// times (find 0.32-0.33 s both; tar 2.62-2.67 against 2.69-2.83 s).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option of the allocator.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    canopy::fuse::mount::set_free_memory_release(collect_free_pages);
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none_or(|v| v != "1") {
        // SAFETY: a prctl with integer arguments; it affects only this
        // process's later page faults.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// A forced collect: purges every free page of mimalloc's arenas,
/// whichever thread freed it (an unforced one purged nothing here). Run
/// after each commit of a mount: with it the daemon held 238-243 MB after
/// `sync` following a million creates, against 243-435 MB without.
fn collect_free_pages() {
    // SAFETY: takes and returns no pointers; any thread may collect.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[derive(Parser)]
#[command(
    name = "canopy",
    version,
    about = "Canopy: a copy-on-write filesystem in user space"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new Canopy filesystem on an image file or block device.
    Mkfs(mkfs::Args),
    /// Mount an image through FUSE (daemonizes unless -f).
    Mount(mount::Args),
    /// Check an unmounted image read-only: tree block checksums, trees,
    /// items, reference counts, free space, names and links, checksum
    /// coverage, quotas and a pending fsync log. File data is read only
    /// with --check-data-csum (scrub reads it too).
    Check(check::Args),
    /// Read back every tree block and data extent and verify its checksum,
    /// on an unmounted image or a mount point; lists damaged files.
    Scrub(scrub::Args),
    /// Make everything written to a mounted filesystem durable (sync(1)
    /// does not reach FUSE daemons).
    Sync(sync::Args),
    /// Create, snapshot, delete and list subvolumes of a mounted
    /// filesystem.
    #[command(subcommand)]
    Subvolume(subvolume::Command),
    /// Read or set properties (`ro`) of a subvolume.
    #[command(subcommand)]
    Property(subvolume::PropertyCommand),
    /// Turn quota accounting on or off, or recount it.
    #[command(subcommand)]
    Quota(quota::QuotaCommand),
    /// Show quota groups, make groups of groups, set limits.
    #[command(subcommand)]
    Qgroup(quota::QgroupCommand),
    /// Empty block groups by moving their extents into others, online.
    #[command(subcommand)]
    Balance(balance::Command),
    /// Show how a mounted filesystem's device is carved into block groups.
    #[command(subcommand)]
    Filesystem(filesystem::Command),
    /// Error counters of a mounted filesystem's devices.
    #[command(subcommand)]
    Device(device::Command),
    /// Write a read-only subvolume as a btrfs send stream (whole, or the
    /// difference from a parent snapshot with -p).
    Send(send::Args),
    /// Make a read-only subvolume from a send stream (Canopy's or
    /// btrfs's) under DIR.
    Receive(receive::Args),
    /// Make files that hold the same blocks share them, as duperemove
    /// does on btrfs (each range compared byte for byte first).
    Dedupe(dedupe::Args),
    /// Show internals of an unmounted image.
    #[command(subcommand)]
    Inspect(inspect::Command),
    /// Repairs of an unmounted image that give something up (as btrfs
    /// rescue).
    #[command(subcommand)]
    Rescue(rescue::Command),
    /// Man pages and shell completions, for installing (see
    /// scripts/install.sh).
    #[command(subcommand)]
    Generate(generate::Command),
}

fn main() -> ExitCode {
    tune_allocator();
    // Like other Unix tools, end quietly when the reader of our output
    // goes away (`canopy scrub status --json MNT | head`).
    // SAFETY: restoring the default disposition of one signal at start-up.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Warnings and errors, and the one line that says which
                // FUSE transport serves a mount.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,canopy::transport=info")
                }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match mount_helper_args(std::env::args_os().collect()) {
        Some(args) => Cli::parse_from(args),
        None => Cli::parse_from(defrag::glue_codec(balance::glue_filters(
            std::env::args_os().collect(),
        ))),
    };
    let r = match cli.command {
        Command::Mkfs(a) => mkfs::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Check(a) => return check::run(a),
        Command::Scrub(a) => return scrub::run(a),
        Command::Sync(a) => sync::run(a),
        Command::Inspect(c) => inspect::run(c),
        Command::Send(a) => send::run(a),
        Command::Receive(a) => return receive::run(a),
        Command::Dedupe(a) => dedupe::run(a),
        Command::Rescue(c) => rescue::run(c),
        Command::Generate(c) => generate::run(c, <Cli as clap::CommandFactory>::command()),
        Command::Subvolume(c) => subvolume::run(c),
        Command::Property(c) => subvolume::run_property(c),
        Command::Quota(c) => quota::run_quota(c),
        Command::Qgroup(c) => quota::run_qgroup(c),
        Command::Balance(c) => balance::run(c),
        Command::Filesystem(c) => filesystem::run(c),
        Command::Device(c) => match device::run(c) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("canopy: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Whether `name` is one of the subcommands (clap's own list, so a new
/// subcommand is never taken for an image to mount).
fn is_subcommand(name: &str) -> bool {
    name == "help"
        || <Cli as clap::CommandFactory>::command()
            .get_subcommands()
            .any(|c| c.get_name() == name)
}

/// Mount helpers: `mount -t fuse.canopy IMAGE DIR` runs
/// `mount.fuse.canopy IMAGE DIR -o OPTS` (a link to this binary), and
/// fuse3's `mount.fuse3` runs `canopy IMAGE DIR -o OPTS`. Both become
/// `canopy mount -o OPTS IMAGE DIR`.
/// Arguments stay `OsString`s: an image or mount point may have any
/// bytes in its name.
fn mount_helper_args(argv: Vec<OsString>) -> Option<Vec<OsString>> {
    let name = std::path::Path::new(argv.first()?)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let as_helper = name.starts_with("mount.");
    let first = argv.get(1)?.to_string_lossy().into_owned();
    let bare = !first.starts_with('-') && !is_subcommand(&first) && argv.len() >= 3;
    if !as_helper && !bare {
        return None;
    }
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let mut it = argv.into_iter().skip(1);
    while let Some(a) = it.next() {
        let text = a.to_string_lossy().into_owned();
        match text.as_str() {
            "-o" => opts.extend(it.next().map(|o| o.to_string_lossy().into_owned())),
            "-r" => opts.push("ro".into()),
            "-w" => opts.push("rw".into()),
            // mount(8) flags with no meaning here: no mtab, sloppy, fake, verbose.
            "-n" | "-s" | "-f" | "-v" => {}
            _ if text.starts_with("-o") => opts.push(text[2..].to_string()),
            _ => positional.push(a),
        }
    }
    let mut out: Vec<OsString> = vec!["canopy".into(), "mount".into()];
    let opts: Vec<String> = opts.into_iter().filter(|o| !o.is_empty()).collect();
    if !opts.is_empty() {
        out.push("-o".into());
        out.push(opts.join(",").into());
    }
    out.extend(positional);
    Some(out)
}

pub use canopy::units::parse_size;

/// Parses an image argument: a path, which may be any bytes, or
/// `rbd:POOL/IMAGE[?...]`.
pub fn image_arg() -> impl clap::builder::TypedValueParser<Value = canopy::dev::Source> {
    use clap::builder::TypedValueParser;
    clap::builder::OsStringValueParser::new().try_map(|s| canopy::dev::Source::from_arg(&s))
}

/// The devices of a filesystem an offline command works on: `image`
/// (usually device 1) and the others it names with `--device`, each
/// opened with `access`.
pub struct Devices {
    pub devs: Vec<std::sync::Arc<dyn canopy::dev::Device>>,
    /// What the user called them, in the same order.
    pub names: Vec<String>,
}

impl Devices {
    pub fn open(
        image: &canopy::dev::Source,
        others: &[canopy::dev::Source],
        access: canopy::dev::Access,
    ) -> canopy::Result<Devices> {
        let mut d = Devices {
            devs: Vec::new(),
            names: Vec::new(),
        };
        for source in std::iter::once(image).chain(others) {
            let dev = source.open(access, canopy::dev::OpenHow::default())?;
            d.devs.push(std::sync::Arc::from(dev));
            d.names.push(source.to_string());
        }
        Ok(d)
    }

    /// Open options that name the devices as the user did.
    pub fn options(&self, base: canopy::OpenOptions) -> canopy::OpenOptions {
        canopy::OpenOptions {
            device_names: self.names.clone(),
            ..base
        }
    }
}
