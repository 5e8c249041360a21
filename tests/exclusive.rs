//! One writer per piece of storage, whatever path names it: an image file
//! and a loop device backed by it exclude each other, a loop device held
//! by someone else (as a kernel mount holds it) keeps writers off the file,
//! and read-only opens share. Needs root and losetup for the loop cases.

mod common;

use canopy::dev::FileDevice;
use std::path::{Path, PathBuf};
use std::process::Command;

fn image(dir: &Path) -> PathBuf {
    let img = dir.join("fs.img");
    FileDevice::create_image(&img, 64 << 20).unwrap();
    img
}

fn refusal(r: canopy::Result<FileDevice>) -> String {
    match r {
        Ok(_) => panic!("a second claim on the same storage was granted"),
        Err(e) => e.to_string(),
    }
}

/// A loop device over `img`, detached on drop.
struct Loop(PathBuf);

impl Loop {
    fn attach(img: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(img)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Some(Loop(PathBuf::from(dev)))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn can_loop() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let tool = Command::new("losetup").arg("--version").output().is_ok();
    let probe = tempfile::tempdir().unwrap();
    let works = root && tool && Loop::attach(&image(probe.path())).is_some();
    common::require(works, "loop device tests need root and a working losetup")
}

#[test]
fn two_writers_on_one_file_are_refused_and_readers_share() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let w = FileDevice::open(&img, false, true).unwrap();
    let msg = refusal(FileDevice::open(&img, false, true));
    assert!(msg.contains("in use by another Canopy"), "{msg}");
    let msg = refusal(FileDevice::open(&img, true, true));
    assert!(msg.contains("mounted read-write"), "{msg}");
    // A tool that only looks still may.
    FileDevice::open(&img, true, false).unwrap();
    drop(w);
    let r1 = FileDevice::open(&img, true, true).unwrap();
    let r2 = FileDevice::open(&img, true, true).unwrap();
    let msg = refusal(FileDevice::open(&img, false, true));
    assert!(msg.contains("in use"), "{msg}");
    drop((r1, r2));
    FileDevice::open(&img, false, true).unwrap();
}

#[test]
fn a_file_and_its_loop_device_exclude_each_other() {
    if !can_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let lo = Loop::attach(&img).expect("losetup");

    let through_file = FileDevice::open(&img, false, true).unwrap();
    let msg = refusal(FileDevice::open(&lo.0, false, true));
    assert!(msg.contains("the file behind"), "{msg}");
    drop(through_file);

    let through_loop = FileDevice::open(&lo.0, false, true).unwrap();
    let msg = refusal(FileDevice::open(&img, false, true));
    assert!(msg.contains("in use"), "{msg}");
    // Read-only mounts are kept off a writer through the other name too.
    let msg = refusal(FileDevice::open(&img, true, true));
    assert!(msg.contains("mounted read-write"), "{msg}");
    drop(through_loop);

    // Readers share across names.
    let r1 = FileDevice::open(&lo.0, true, true).unwrap();
    let r2 = FileDevice::open(&img, true, true).unwrap();
    drop((r1, r2));
}

#[test]
fn a_file_whose_loop_device_is_held_exclusively_is_refused() {
    if !can_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let lo = Loop::attach(&img).expect("losetup");
    // What a kernel mount of the loop device does: hold it with O_EXCL.
    use std::os::unix::fs::OpenOptionsExt;
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&lo.0)
        .unwrap();
    let msg = refusal(FileDevice::open(&img, false, true));
    assert!(
        msg.contains(&format!("in use through {}", lo.0.display())),
        "{msg}"
    );
    let msg = refusal(FileDevice::open(&lo.0, false, true));
    assert!(msg.contains("in use"), "{msg}");
    // Nor may a read-only mount read under a writer on the device.
    let msg = refusal(FileDevice::open(&lo.0, true, true));
    assert!(msg.contains("in use by a writer"), "{msg}");
    drop(held);
    FileDevice::open(&img, false, true).unwrap();
}
