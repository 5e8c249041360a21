//! `canopy receive`: read-only subvolumes from send streams (Canopy's or
//! kernel btrfs's), after `btrfs receive`.
//!
//! The daemon of the mount applies the streams itself (see the library's
//! `receive`): this command copies its input to it over the control
//! socket and shows what it reports. A receive that fails, is
//! interrupted or whose command is killed leaves no partial subvolume:
//! the daemon deletes it.

use anyhow::{bail, Context, Result};
use canopy::fuse::receive::{Interrupter, Session};
use canopy::receive::{Event, Request};
use canopy::stream::{dump_line, Command, Reader};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

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
    let result = receive(&a);
    let signal = SIGNALLED.load(Ordering::SeqCst);
    match result {
        Ok(()) if signal == 0 => ExitCode::SUCCESS,
        Ok(()) => ExitCode::from(128 + signal as u8),
        Err(e) => {
            eprintln!("ERROR: {e:#}");
            match signal {
                0 => ExitCode::FAILURE,
                s => ExitCode::from(128 + s as u8),
            }
        }
    }
}

fn input(a: &Args) -> Result<Box<dyn std::io::Read + Send>> {
    Ok(match &a.file {
        Some(f) => {
            Box::new(std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?)
        }
        None => Box::new(std::io::stdin()),
    })
}

/// The signal that interrupted the receive (0: none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

/// SIGINT, SIGTERM and SIGHUP go to a thread of their own, which ends
/// the input the daemon reads: it deletes the subvolume being made and
/// answers, and the command then exits with 128 + the signal.
fn interrupt_on_signals(stop: Interrupter) {
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
            SIGNALLED.store(sig, Ordering::SeqCst);
            stop.interrupt();
        });
    }
}

fn receive(a: &Args) -> Result<()> {
    if a.dump {
        return dump(&mut Reader::new(input(a)?)?);
    }
    let dir = a.dir.as_deref().context("no DIR given")?;
    if !dir.is_dir() {
        bail!("{}: not a directory", dir.display());
    }
    let mnt = crate::subvolume::mount_of(dir)?;
    let req = Request {
        dir: crate::subvolume::node_of(dir)?,
        stop_at_end: a.stop_at_end,
    };
    let input = input(a)?;
    let session = Session::start(&mnt, &req)?;
    interrupt_on_signals(session.interrupter()?);
    let bar = crate::send::progress_bar(a.quiet);
    let result = session.run(input, &mut |e| match e {
        Event::Progress { bytes, files } => bar.set_message(format!(
            "{} received, {files} files",
            canopy::units::shown(bytes)
        )),
        Event::Received(r) => {
            bar.suspend(|| {
                let path = dir.join(&r.name);
                if a.json {
                    print_json(&path, &r);
                } else if !a.quiet {
                    eprintln!("At subvol {}: {} files", path.display(), r.files);
                }
            });
        }
    });
    bar.finish_and_clear();
    Ok(result?)
}

/// A received subvolume as `--json` shows it.
fn print_json(path: &std::path::Path, r: &canopy::receive::Report) {
    let line = serde_json::json!({
        "path": path.display().to_string(),
        "uuid": r.uuid,
        "parent_uuid": r.parent_uuid,
        "bytes": r.bytes,
        "commands": r.commands,
        "files": r.files,
    });
    println!("{line}");
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
