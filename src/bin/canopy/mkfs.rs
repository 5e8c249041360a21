//! `canopy mkfs`: format an image file, block device or RBD image.

use anyhow::{bail, Context, Result};
use canopy::dev::{Access, Device, OpenHow, Source};
use canopy::format::superblock::Profile;
use canopy::{Engine, FormatOptions};

fn parse_profile(s: &str) -> std::result::Result<Profile, String> {
    Profile::parse(s).ok_or_else(|| {
        format!("unknown profile {s:?}: single or dup (one device), raid1 (two or more), raid1c3 (three or more), raid10 (four or more)")
    })
}
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Size of the image to create (e.g. 1G, 512M); required when the image
    /// does not exist yet. An existing regular file smaller than this is
    /// grown (sparsely); a missing RBD image is created with the cluster's
    /// default features (exclusive-lock among them).
    #[arg(short = 's', long, value_parser = crate::parse_size)]
    size: Option<u64>,
    /// Tree block size in bytes: a power of two from 4096 to 65536
    /// (default 16384; 4096 with mixed groups, which need it).
    #[arg(short = 'n', long)]
    nodesize: Option<u32>,
    /// Filesystem label (up to 255 bytes).
    #[arg(short = 'L', long, default_value = "")]
    label: String,
    /// Mixed block groups: data and tree blocks share every group (the
    /// default below 1 GiB, where separate groups strand space).
    #[arg(short = 'M', long, conflicts_with = "no_mixed")]
    mixed: bool,
    /// Separate data and metadata block groups, whatever the size.
    #[arg(long)]
    no_mixed: bool,
    /// Profile of tree blocks: `dup` (two copies on the device, so a bad
    /// sector is repaired from the other; the default with separate
    /// groups on one device, as mkfs.btrfs), `raid1` (two copies on two
    /// devices; the default with several), `raid1c3` (three on three),
    /// `raid10` (two copies striped in 64 KiB units over four or more), or
    /// `single` (the default with mixed groups, where a second copy would
    /// double the data too).
    #[arg(short = 'm', long = "metadata", value_name = "PROFILE", value_parser = parse_profile)]
    metadata: Option<Profile>,
    /// Profile of file data: `single` (the default), `dup`, `raid1`,
    /// `raid1c3` or `raid10`.
    #[arg(short = 'd', long = "data", value_name = "PROFILE", value_parser = parse_profile)]
    data: Option<Profile>,
    /// Overwrite an existing filesystem.
    #[arg(short = 'f', long)]
    force: bool,
    /// Print nothing on success.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Owner of the root directory, UID:GID (default: whoever runs mkfs,
    /// so a user who makes and mounts their own image can write in it;
    /// mke2fs's root_owner).
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner)]
    owner: Option<(u32, u32)>,
    /// Image files, block devices, or rbd:POOL/IMAGE[?conf=PATH&id=CLIENT&keyring=PATH]:
    /// the filesystem's devices, devid 1, 2, ... in this order. Copies go
    /// to the devices with the most unallocated space (as mkfs.btrfs), so
    /// `-d single` data fills them all and raid1 uses any two; with mixed
    /// groups (devices under 1 GiB) device 1 holds the first copy of
    /// every group instead, and its size bounds the filesystem's.
    #[arg(value_parser = crate::image_arg(), required = true, num_args = 1..)]
    images: Vec<Source>,
}

pub fn run(a: Args) -> Result<()> {
    for image in &a.images {
        if !image.exists() && a.size.is_none() {
            bail!("{image} does not exist; give --size to create it");
        }
    }
    if let Some(size) = a.size.filter(|&s| s < canopy::txn::MIN_DEVICE_BYTES) {
        bail!(
            "--size {size} is below the smallest Canopy filesystem, {} bytes (32M)",
            canopy::txn::MIN_DEVICE_BYTES
        );
    }
    let mut created = Vec::new();
    let mut r = Ok(());
    for image in &a.images {
        match a.size.map(|size| image.create(size)) {
            Some(Ok(true)) => created.push(image),
            Some(Err(e)) => {
                r = Err(e.into());
                break;
            }
            _ => {}
        }
    }
    if r.is_ok() {
        r = format_images(&a, &created);
    }
    if r.is_err() {
        // Leave nothing behind that this run created.
        for image in created {
            image.remove_created();
        }
    }
    r
}

/// The tree block size: as asked, or the default. Mixed groups need tree
/// blocks of one sector (as btrfs requires): data is allocated sector by
/// sector there, and on a nearly full image the holes it leaves between
/// extents would hold no larger tree block although the free bytes add
/// up, so a commit could find no room that the reservations promised.
fn nodesize_for(asked: Option<u32>, mixed: bool) -> Result<u32> {
    let sector = canopy::format::SECTORSIZE;
    match (asked, mixed) {
        (Some(n), true) if n != sector => bail!(
            "mixed block groups (the default below 1 GiB) need --nodesize {sector}; \
             use --no-mixed for larger tree blocks"
        ),
        (Some(n), _) => Ok(n),
        (None, true) => Ok(sector),
        (None, false) => Ok(canopy::format::DEFAULT_NODESIZE),
    }
}

/// Opens every device to write, refusing one that holds a filesystem
/// (unless `--force`) or is smaller than `--size`.
fn open_images(a: &Args, created: &[&Source]) -> Result<Vec<Arc<dyn Device>>> {
    let mut devs: Vec<Arc<dyn Device>> = Vec::new();
    for image in &a.images {
        let dev = image.open(Access::Write, OpenHow::default())?;
        if let Some(size) = a.size {
            if dev.size() < size {
                bail!("{image} holds only {} bytes", dev.size());
            }
        }
        if !created.contains(&image) && !a.force {
            if let Some(fs) = canopy::dev::existing_filesystem(dev.as_ref()) {
                bail!("{image} already holds a {fs} filesystem; use --force to overwrite it");
            }
        }
        devs.push(Arc::from(dev));
    }
    Ok(devs)
}

fn format_images(a: &Args, created: &[&Source]) -> Result<()> {
    let devs = open_images(a, created)?;
    let dev = devs[0].clone();
    let names: Vec<String> = a.images.iter().map(|i| i.to_string()).collect();
    let name = names.join(", ");
    let mixed = match (a.mixed, a.no_mixed) {
        (true, _) => true,
        (_, true) => false,
        _ => dev.size() < canopy::txn::MIXED_BELOW_BYTES,
    };
    let opts = FormatOptions {
        nodesize: nodesize_for(a.nodesize, mixed)?,
        label: a.label.clone(),
        fsid: None,
        mixed: Some(mixed),
        // Mixed groups hold both: one profile named sets the other.
        metadata_profile: a.metadata.or(a.data.filter(|_| mixed)),
        data_profile: a
            .data
            .or(a.metadata.filter(|_| mixed))
            .unwrap_or(Profile::Single),
        mapped: None,
    };
    let engine = Arc::new(
        Engine::format_devices(devs.clone(), &opts)
            .with_context(|| format!("formatting {name}"))?,
    );
    // The root directory, so that even a first read-only mount works.
    let fs = canopy::fs::Fs::new(engine.clone()).context("creating the root directory")?;
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = a
        .owner
        .unwrap_or_else(|| unsafe { (libc::getuid(), libc::getgid()) });
    if (uid, gid) != (0, 0) {
        let owner = canopy::fs::SetAttr {
            uid: Some(uid),
            gid: Some(gid),
            ..Default::default()
        };
        fs.setattr(fs.root_node(), &owner)
            .and_then(|_| fs.sync())
            .context("giving the root directory its owner")?;
    }
    drop(fs);
    let fsid = engine.fsid();
    let (used, free) = engine.space();
    let mixed = engine.is_mixed();
    let (metadata, data) = engine.profiles();
    drop(engine);
    if !a.quiet {
        println!("Created Canopy filesystem on {name}");
        println!(
            "  label:     {}",
            if a.label.is_empty() {
                "(none)"
            } else {
                &a.label
            }
        );
        println!("  uuid:      {}", canopy::format::uuid::shown(&fsid));
        // Every device's bytes, as mkfs.btrfs's "Filesystem size".
        let size: u64 = devs.iter().map(|d| d.size()).sum();
        println!("  size:      {size} bytes");
        if devs.len() > 1 {
            for (i, (d, n)) in devs.iter().zip(&names).enumerate() {
                println!("  device {}:  {n} ({} bytes)", i + 1, d.size());
            }
        }
        println!("  nodesize:  {}", opts.nodesize);
        println!(
            "  groups:    {}",
            if mixed {
                "mixed (data and metadata together)"
            } else {
                "separate data, metadata and system"
            }
        );
        println!("  metadata:  {}", metadata.name());
        println!("  data:      {}", data.name());
        println!("  used:      {used} bytes, free: {free} bytes");
    }
    Ok(())
}

/// `UID:GID`, numbers as mke2fs's root_owner takes them.
fn parse_owner(s: &str) -> std::result::Result<(u32, u32), String> {
    let bad = || format!("'{s}': want UID:GID, two numbers");
    let (u, g) = s.split_once(':').ok_or_else(bad)?;
    Ok((u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?))
}
