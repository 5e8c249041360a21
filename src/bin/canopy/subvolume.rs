//! `canopy subvolume` and `canopy property`: subvolumes and snapshots of a
//! mounted filesystem, after `btrfs subvolume` and `btrfs property`.
//!
//! Paths are resolved here: a path's directory is named to the daemon by
//! its inode number (st_ino is the node id, unique across subvolumes) and
//! the request goes over the mount's control socket. `list` and `sync`
//! also take an unmounted image, opened here (read-only for `list`).

use anyhow::{bail, Context, Result};
use canopy::fs::SubvolInfo;
use canopy::fuse::control::{self, Request};
use clap::Subcommand;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum Command {
    /// Create an empty subvolume at PATH.
    Create {
        /// Where the new subvolume appears (its parent directory must exist).
        path: PathBuf,
    },
    /// Snapshot subvolume SOURCE as DEST: O(1), and atomic (everything
    /// written to SOURCE before the command is in it, nothing after).
    Snapshot {
        /// Make the snapshot read-only.
        #[arg(short = 'r')]
        readonly: bool,
        /// A subvolume (its root directory, e.g. the mount point).
        source: PathBuf,
        /// The snapshot's path, or an existing directory to put it in
        /// under SOURCE's name.
        dest: PathBuf,
    },
    /// Delete the subvolume at PATH and everything in it.
    Delete {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List the subvolumes of the filesystem mounted at PATH, or of an
    /// unmounted image.
    List {
        /// One JSON array: id, generation, parent, path, readonly, uuids.
        #[arg(long)]
        json: bool,
        /// Show each subvolume's uuid.
        #[arg(short = 'u')]
        uuid: bool,
        /// Show the uuid of what each is a snapshot of.
        #[arg(short = 'q')]
        parent_uuid: bool,
        /// Show the uuid each was received from.
        #[arg(short = 'R')]
        received_uuid: bool,
        path: PathBuf,
    },
    /// Show one subvolume.
    Show {
        #[arg(long)]
        json: bool,
        path: PathBuf,
    },
    /// Make subvolume ID the one mounts show when none is asked for
    /// (5: the top level).
    SetDefault { id: u64, path: PathBuf },
    /// Wait until the blocks of deleted subvolumes are freed (the cleaner
    /// frees them in the background after `delete`), then commit. On an
    /// unmounted image, free them here.
    Sync {
        /// A mount point, or an unmounted image.
        path: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum PropertyCommand {
    /// Print a property: `ro` of the subvolume at PATH, or `compression`
    /// of the file or directory at PATH (empty when unset).
    Get { path: PathBuf, name: String },
    /// Set a property: `ro true|false` of the subvolume at PATH, or
    /// `compression zstd|zstd:LEVEL|lz4|none|""` of a file or directory
    /// (new files and directories in it inherit it; "" unsets it; kept in
    /// the `btrfs.compression` xattr, as btrfs keeps it).
    Set {
        path: PathBuf,
        name: String,
        value: String,
    },
}

pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Create { path } => create(&path),
        Command::Snapshot {
            readonly,
            source,
            dest,
        } => snapshot(&source, dest, readonly),
        Command::Delete { paths } => paths.iter().try_for_each(|p| delete(p)),
        Command::List {
            json,
            uuid,
            parent_uuid,
            received_uuid,
            path,
        } => list(&path, json, [uuid, parent_uuid, received_uuid]),
        Command::Show { json, path } => show_one(&path, json),
        Command::Sync { path } if is_image(&path) => clean_image(&path),
        Command::Sync { path } => {
            let r = control::request(&mount_of(&path)?, &Request::SubvolSync)?;
            if !r.ok {
                bail!("{}", r.error.unwrap_or_else(|| "failed".into()));
            }
            Ok(())
        }
        Command::SetDefault { id, path } => {
            ask(&mount_of(&path)?, &Request::SubvolSetDefault { id })
                .with_context(|| format!("making subvolume {id} the default"))?;
            Ok(())
        }
    }
}

fn create(path: &Path) -> Result<()> {
    let (mnt, parent, name) = parent_and_name(path)?;
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let req = Request::SubvolCreate {
        parent,
        name,
        uid,
        gid,
    };
    ask(&mnt, &req).with_context(|| format!("creating {}", path.display()))?;
    println!("Create subvolume '{}'", path.display());
    Ok(())
}

fn snapshot(source: &Path, dest: PathBuf, readonly: bool) -> Result<()> {
    let dest = match dest.is_dir() {
        true => dest.join(source.canonicalize()?.file_name().unwrap_or_default()),
        false => dest,
    };
    let (mnt, parent, name) = parent_and_name(&dest)?;
    let req = Request::SubvolSnapshot {
        source: node_of(source)?,
        parent,
        name,
        readonly,
    };
    ask(&mnt, &req).with_context(|| format!("snapshotting {}", source.display()))?;
    let ro = if readonly { "readonly " } else { "" };
    println!(
        "Create {ro}snapshot of '{}' in '{}'",
        source.display(),
        dest.display()
    );
    Ok(())
}

fn delete(path: &Path) -> Result<()> {
    let (mnt, parent, name) = parent_and_name(path)?;
    let req = Request::SubvolDelete { parent, name };
    ask(&mnt, &req).with_context(|| format!("deleting {}", path.display()))?;
    println!("Delete subvolume '{}'", path.display());
    Ok(())
}

/// `columns`: whether to show the uuid, parent uuid and received uuid.
fn list(path: &Path, json: bool, columns: [bool; 3]) -> Result<()> {
    let list = if is_image(path) {
        let fs = open_image(path, true)?;
        fs.list_subvolumes()
            .with_context(|| format!("listing {}", path.display()))?
    } else {
        ask(&mount_of(path)?, &Request::SubvolList)?
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let dash = |u: &Option<String>| u.clone().unwrap_or_else(|| "-".into());
    for s in list {
        let mut uuids = String::new();
        for (on, label, u) in [
            (columns[0], "uuid", &s.uuid),
            (columns[1], "parent_uuid", &s.parent_uuid),
            (columns[2], "received_uuid", &s.received_uuid),
        ] {
            if on {
                uuids.push_str(&format!(" {label} {}", dash(u)));
            }
        }
        println!(
            "ID {} gen {} parent {} top level {}{uuids} path {}{}",
            s.id,
            s.generation,
            s.parent,
            s.parent,
            s.path,
            if s.readonly { " (readonly)" } else { "" }
        );
    }
    Ok(())
}

fn show_one(path: &Path, json: bool) -> Result<()> {
    let req = Request::SubvolShow {
        node: node_of(path)?,
    };
    let list =
        ask(&mount_of(path)?, &req).with_context(|| format!("showing {}", path.display()))?;
    let Some(s) = list.into_iter().next() else {
        bail!("{}: no such subvolume", path.display());
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        show(&s);
    }
    Ok(())
}

pub fn run_property(c: PropertyCommand) -> Result<()> {
    match c {
        PropertyCommand::Get { path, name } if name == "compression" => {
            let value = crate::xattr::get(&path, "btrfs.compression")?;
            println!("compression={}", value.unwrap_or_default());
        }
        PropertyCommand::Set { path, name, value } if name == "compression" => {
            crate::xattr::set(&path, "btrfs.compression", &value)
                .with_context(|| format!("setting compression of {}", path.display()))?;
        }
        PropertyCommand::Get { path, name } => {
            check_property(&name)?;
            let req = Request::SubvolShow {
                node: node_of(&path)?,
            };
            let list = ask(&mount_of(&path)?, &req)
                .with_context(|| format!("reading {name} of {}", path.display()))?;
            let ro = list.first().is_some_and(|s| s.readonly);
            println!("ro={ro}");
        }
        PropertyCommand::Set { path, name, value } => {
            check_property(&name)?;
            let readonly = match value.as_str() {
                "true" => true,
                "false" => false,
                v => bail!("ro takes true or false, not '{v}'"),
            };
            let req = Request::SubvolSetReadOnly {
                node: node_of(&path)?,
                readonly,
            };
            ask(&mount_of(&path)?, &req)
                .with_context(|| format!("setting {name} of {}", path.display()))?;
        }
    }
    Ok(())
}

fn check_property(name: &str) -> Result<()> {
    if name != "ro" {
        bail!("unknown property '{name}' (subvolumes have ro; files and directories compression)");
    }
    Ok(())
}

fn show(s: &SubvolInfo) {
    println!(
        "{}",
        if s.path.is_empty() {
            "<FS_TREE>"
        } else {
            &s.path
        }
    );
    println!("\tName: \t\t\t{}", s.path.rsplit('/').next().unwrap_or(""));
    let dash = |u: &Option<String>| u.clone().unwrap_or_else(|| "-".into());
    println!("\tUUID: \t\t\t{}", dash(&s.uuid));
    println!("\tParent UUID: \t\t{}", dash(&s.parent_uuid));
    println!("\tReceived UUID: \t\t{}", dash(&s.received_uuid));
    println!("\tSubvolume ID: \t\t{}", s.id);
    println!("\tGeneration: \t\t{}", s.generation);
    println!("\tGen at creation: \t{}", s.created);
    println!("\tParent ID: \t\t{}", s.parent);
    let origin = s.snapshot_of.map_or("-".to_string(), |o| o.to_string());
    println!("\tSnapshot of: \t\t{origin}");
    println!(
        "\tFlags: \t\t\t{}",
        if s.readonly { "readonly" } else { "-" }
    );
    println!("\tSend transid: \t\t{}", s.ctransid);
    if s.received_uuid.is_some() {
        println!("\tReceive transid: \t{}", s.stransid);
    }
}

/// Whether `path` names an image (a file or block device) rather than a
/// place in a mounted filesystem.
fn is_image(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_dir())
}

/// The filesystem on the unmounted image at `path` (refused while the
/// image is mounted).
fn open_image(path: &Path, read_only: bool) -> Result<canopy::fs::Fs> {
    let dev = canopy::dev::FileDevice::open(path, read_only, true)
        .with_context(|| format!("opening {}", path.display()))?;
    let opts = canopy::OpenOptions {
        read_only,
        ..Default::default()
    };
    let engine = canopy::Engine::open(std::sync::Arc::new(dev), &opts)
        .with_context(|| format!("opening {}", path.display()))?;
    canopy::fs::Fs::new(std::sync::Arc::new(engine))
        .with_context(|| format!("opening {}", path.display()))
}

/// Runs the cleaner on an unmounted image until deleted subvolumes are
/// freed. The queue's length is no measure of the work left (a released
/// block queues its children), so progress is a spinner with the count.
fn clean_image(path: &Path) -> Result<()> {
    let fs = open_image(path, false)?;
    let bar = indicatif::ProgressBar::new_spinner();
    let mut left = fs.queued_drops();
    while left > 0 {
        bar.set_message(format!(
            "freeing deleted subvolumes: {left} tree blocks queued"
        ));
        bar.tick();
        left = fs
            .clean_step()
            .with_context(|| format!("freeing deleted subvolumes of {}", path.display()))?;
    }
    bar.finish_and_clear();
    fs.sync()
        .with_context(|| format!("committing {}", path.display()))
}

/// Sends `req` to the daemon of `mnt`; the subvolumes it answers with.
fn ask(mnt: &Path, req: &Request) -> Result<Vec<SubvolInfo>> {
    let r = control::request(mnt, req)?;
    if !r.ok {
        bail!("{}", r.error.unwrap_or_else(|| "failed".into()));
    }
    Ok(r.subvolumes.unwrap_or_default())
}

/// The node id (st_ino) of `path`.
pub(crate) fn node_of(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("opening {}", path.display()))?
        .ino())
}

pub(crate) fn mount_of(path: &Path) -> Result<PathBuf> {
    let canon = path
        .canonicalize()
        .with_context(|| format!("opening {}", path.display()))?;
    crate::sync::mount_point(&canon)
}

/// The mount, parent directory's node id and last name of `path`, which
/// must not exist yet (or, to delete, be a subvolume link).
pub(crate) fn parent_and_name(path: &Path) -> Result<(PathBuf, u64, Vec<u8>)> {
    let name = path
        .file_name()
        .filter(|n| *n != "." && *n != "..")
        .with_context(|| format!("{}: no name to give", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mnt = mount_of(&parent)?;
    Ok((mnt, node_of(&parent)?, name.as_bytes().to_vec()))
}
