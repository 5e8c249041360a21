//! `canopy receive`: read-only subvolumes from send streams (Canopy's or
//! kernel btrfs's), after `btrfs receive`.
//!
//! A stream starts with `subvol` (a new subvolume) or `snapshot` (a
//! writable snapshot of the parent it names, found among the
//! filesystem's subvolumes by the uuid it was received from, or its own);
//! its commands are then carried out through the mount, each path
//! resolved beneath the new subvolume (`paths`); at its end the
//! subvolume records the uuid it was received from and becomes read-only.
//! A receive that fails or is interrupted deletes the subvolume it was
//! making: no half subvolume is left (btrfs leaves it writable; Canopy
//! does not).

mod apply;
mod paths;

use anyhow::{bail, Context, Result};
use apply::Target;
use canopy::format::uuid::shown as format_uuid;
use canopy::fs::SubvolInfo;
use canopy::fuse::control::{self, Request};
use canopy::stream::{dump_line, Command, Reader};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Print the stream's commands instead of carrying them out (as
    /// `btrfs receive --dump`); DIR is not needed.
    #[arg(long)]
    dump: bool,
    /// Stop after the first stream's end (more may follow in the input).
    #[arg(short = 'e')]
    stop_at_end: bool,
    /// No progress on standard error.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// One JSON line per subvolume received, on standard output.
    #[arg(long)]
    json: bool,
    /// The directory (on a Canopy mount) the subvolumes appear in.
    #[arg(required_unless_present = "dump")]
    dir: Option<PathBuf>,
}

pub fn run(a: Args) -> ExitCode {
    match receive(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ERROR: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn input(a: &Args) -> Result<Box<dyn std::io::Read>> {
    Ok(match &a.file {
        Some(f) => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?,
        )),
        None => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::io::stdin().lock(),
        )),
    })
}

/// The subvolume being made, as (mount, path): deleted by whoever takes
/// it first, the receive failing or a signal interrupting it.
static MAKING: std::sync::Mutex<Option<(PathBuf, PathBuf)>> = std::sync::Mutex::new(None);

fn take_making() -> Option<(PathBuf, PathBuf)> {
    MAKING.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Deletes the partial subvolume, saying so.
fn delete_partial(mnt: &Path, path: &Path) {
    let removed = crate::subvolume::parent_and_name(path)
        .and_then(|(_, parent, name)| ask(mnt, &Request::SubvolDelete { parent, name }));
    match removed {
        Ok(_) => eprintln!(
            "receive failed: deleted the partial subvolume {}",
            path.display()
        ),
        Err(e) => eprintln!(
            "receive failed, and deleting the partial subvolume {} failed too: {e:#}",
            path.display()
        ),
    }
}

/// SIGINT, SIGTERM and SIGHUP go to a thread of their own, which deletes
/// the subvolume being made before the process ends (SIGKILL cannot be
/// caught: it leaves a writable subvolume without a received uuid).
fn delete_partial_on_signals() {
    // SAFETY: plain signal-set calls on a local set; the set is blocked in
    // this thread before any other exists, so every thread inherits it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            if let Some((mnt, path)) = take_making() {
                delete_partial(&mnt, &path);
            }
            std::process::exit(128 + sig);
        });
    }
}

fn receive(a: &Args) -> Result<()> {
    let mut r = Reader::new(input(a)?)?;
    if a.dump {
        return dump(&mut r);
    }
    delete_partial_on_signals();
    let dir = a.dir.as_deref().context("no DIR given")?;
    if !dir.is_dir() {
        bail!("{}: not a directory", dir.display());
    }
    let mnt = crate::subvolume::mount_of(dir)?;
    let mut received = 0;
    loop {
        let Some(first) = r.read_command()? else {
            if received == 0 {
                bail!("the stream holds no subvolume");
            }
            return Ok(());
        };
        let bar = crate::send::progress_bar(a.quiet);
        let one = Receiving::start(&mnt, dir, first)?;
        let done = one.fill(&mut r, &mnt, &bar);
        bar.finish_and_clear();
        let report = done?;
        received += 1;
        if a.json {
            println!("{}", serde_json::to_string(&report)?);
        } else if !a.quiet {
            eprintln!("At subvol {}: {} files", report.path, report.files);
        }
        if a.stop_at_end {
            return Ok(());
        }
    }
}

fn dump<R: std::io::Read>(r: &mut Reader<R>) -> Result<()> {
    let mut subvol = Vec::new();
    while let Some(c) = r.read_command()? {
        if let Command::Subvol { path, .. } | Command::Snapshot { path, .. } = &c {
            subvol = [b"./".to_vec(), path.clone()].concat();
        }
        println!("{}", dump_line(&c, &subvol));
    }
    Ok(())
}

/// What one received subvolume amounted to.
#[derive(Default, serde::Serialize)]
struct Report {
    path: String,
    uuid: String,
    parent_uuid: Option<String>,
    bytes: u64,
    commands: u64,
    files: u64,
}

/// A subvolume being received: deleted unless it is finished.
struct Receiving {
    mnt: PathBuf,
    path: PathBuf,
    target: Option<Target>,
    /// The sender's transid of the subvolume, recorded at the end.
    stransid: u64,
    report: Report,
}

impl Receiving {
    /// Creates the subvolume the stream's first command asks for.
    fn start(mnt: &Path, dir: &Path, first: Command) -> Result<Receiving> {
        let (name, uuid, ctransid, parent) = match first {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => (path, uuid, ctransid, None),
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                ..
            } => (path, uuid, ctransid, Some(clone_uuid)),
            c => bail!(
                "the stream starts with {} instead of subvol or snapshot",
                c.name()
            ),
        };
        if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
            bail!(
                "the stream names its subvolume {:?}",
                String::from_utf8_lossy(&name)
            );
        }
        let path = dir.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name));
        if path.symlink_metadata().is_ok() {
            bail!("{} exists already", path.display());
        }
        let (_, parent_dir, leaf) = crate::subvolume::parent_and_name(&path)?;
        let req = match parent {
            None => Request::SubvolCreate {
                parent: parent_dir,
                name: leaf,
                uid: 0,
                gid: 0,
            },
            Some(p) => Request::SubvolSnapshot {
                source: crate::subvolume::node_of(&find_subvolume(mnt, &p)?)?,
                parent: parent_dir,
                name: leaf,
                readonly: false,
            },
        };
        ask(mnt, &req).with_context(|| format!("creating {}", path.display()))?;
        *MAKING.lock().unwrap_or_else(|e| e.into_inner()) = Some((mnt.to_path_buf(), path.clone()));
        let mut me = Receiving {
            mnt: mnt.to_path_buf(),
            path: path.clone(),
            target: None,
            stransid: ctransid,
            report: Report {
                path: path.display().to_string(),
                uuid: format_uuid(&uuid),
                parent_uuid: parent.map(|p| format_uuid(&p)),
                bytes: 0,
                commands: 0,
                files: 0,
            },
        };
        me.target = Some(Target::new(paths::Tree::new(open_dir(&path)?), uuid));
        Ok(me)
    }

    /// Carries out the stream's commands up to its end, then makes the
    /// subvolume read-only and records where it came from.
    fn fill<R: std::io::Read>(
        mut self,
        r: &mut Reader<R>,
        mnt: &Path,
        bar: &indicatif::ProgressBar,
    ) -> Result<Report> {
        let start = r.bytes_read();
        let mut find = |u: &[u8; 16]| open_dir(&find_subvolume(mnt, u)?);
        loop {
            let Some(c) = r.read_command()? else {
                bail!("the stream ends before its end command (truncated?)");
            };
            self.report.commands += 1;
            if c == Command::End {
                break;
            }
            let target = self.target.as_mut().context("no subvolume")?;
            target.apply(c, &mut find)?;
            if self.report.commands.is_multiple_of(1024) {
                bar.set_message(format!(
                    "{} received, {} files",
                    canopy::units::shown(r.bytes_read() - start),
                    target.files
                ));
            }
        }
        self.report.bytes = r.bytes_read() - start;
        self.report.files = self.target.as_ref().map_or(0, |t| t.files);
        self.target = None;
        let req = Request::SetReceived {
            node: crate::subvolume::node_of(&self.path)?,
            received_uuid: self.report.uuid.clone(),
            stransid: self.stransid,
        };
        ask(&self.mnt, &req).with_context(|| format!("finishing {}", self.path.display()))?;
        // Finished: nothing for Drop to delete.
        take_making();
        Ok(std::mem::take(&mut self.report))
    }
}

impl Drop for Receiving {
    /// A receive that did not finish deletes what it made (a finished one
    /// has taken it out of MAKING).
    fn drop(&mut self) {
        self.target = None;
        if let Some((mnt, path)) = take_making() {
            delete_partial(&mnt, &path);
        }
    }
}

fn ask(mnt: &Path, req: &Request) -> Result<Vec<SubvolInfo>> {
    let r = control::request(mnt, req)?;
    if !r.ok {
        bail!("{}", r.error.unwrap_or_else(|| "failed".into()));
    }
    Ok(r.subvolumes.unwrap_or_default())
}

/// The path of the subvolume received from `uuid` (or whose own uuid it
/// is), as btrfs receive looks for a parent.
fn find_subvolume(mnt: &Path, uuid: &[u8; 16]) -> Result<PathBuf> {
    let want = format_uuid(uuid);
    let list = ask(mnt, &Request::SubvolList)?;
    let hit = list
        .iter()
        .find(|s| s.received_uuid.as_deref() == Some(&want))
        .or_else(|| list.iter().find(|s| s.uuid.as_deref() == Some(&want)));
    let Some(s) = hit else {
        bail!("cannot find the parent subvolume {want}: receive its stream first (or send without -p)");
    };
    let path = mnt.join(&s.path);
    if !path.is_dir() {
        bail!(
            "the subvolume {want} ({}) is not reachable from this mount",
            s.path
        );
    }
    Ok(path)
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!(
            "opening {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
