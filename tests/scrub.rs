//! `canopy scrub` finds what reads alone would not: a flipped byte of file
//! data (reported by path and byte range) and a damaged tree block, on an
//! unmounted image and through a mount's daemon.

mod common;

use canopy::dev::{Device, FileDevice};
use canopy::format::items::FileExtentItem;
use canopy::format::key_type::EXTENT_DATA;
use canopy::format::tree_id::FS;
use canopy::fs::{Fs, Owner};
use canopy::{Engine, Key, OpenOptions};
use common::mounted::{can_mount, canopy, Mounted};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

const ME: Owner = Owner { uid: 0, gid: 0 };

/// A fresh 64 MiB image in `dir`, made by `canopy mkfs`.
fn mkfs(dir: &Path) -> std::path::PathBuf {
    let img = dir.join("fs.img");
    let st = canopy()
        .args(["mkfs", "-q", "-s", "64M"])
        .arg(&img)
        .status();
    assert!(st.unwrap().success());
    img
}

fn open_ro(img: &Path) -> Engine {
    let dev = Arc::new(FileDevice::open(img, true, false).unwrap());
    let ro = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    Engine::open(dev as Arc<dyn Device>, &ro).unwrap()
}

/// Device address of the data at `offset` of inode `ino`'s first extent.
fn data_address(img: &Path, ino: u64) -> u64 {
    let d = open_ro(img)
        .read(|r| r.get(FS, &Key::new(ino, EXTENT_DATA, 0)))
        .unwrap()
        .expect("an extent at offset 0");
    let fe = FileExtentItem::decode(&d).unwrap();
    fe.disk_bytenr + fe.offset
}

fn flip(img: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    f.sync_all().unwrap();
}

fn scrub_json(args: &[&str]) -> (i32, serde_json::Value) {
    let out = canopy()
        .arg("scrub")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), v)
}

#[test]
fn a_flipped_data_byte_is_reported_with_its_file_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path());
    let ino = {
        let dev = Arc::new(FileDevice::open(&img, false, true).unwrap());
        let e = Engine::open(dev as Arc<dyn Device>, &OpenOptions::default()).unwrap();
        let fs = Fs::new(Arc::new(e)).unwrap();
        let d = fs
            .create(256, b"docs", libc::S_IFDIR | 0o755, 0, ME, None)
            .unwrap();
        let f = fs
            .create(d.ino, b"report.bin", libc::S_IFREG | 0o644, 0, ME, None)
            .unwrap();
        fs.write(f.ino, 0, &vec![7u8; 100_000]).unwrap();
        let g = fs
            .create(256, b"fine", libc::S_IFREG | 0o644, 0, ME, None)
            .unwrap();
        fs.write(g.ino, 0, &vec![9u8; 50_000]).unwrap();
        fs.sync().unwrap();
        f.ino
    };
    let img_s = img.to_str().unwrap();
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["data_extents"], 2);

    flip(&img, data_address(&img, ino) + 70_000);
    // canopy check does not read file data; scrub does.
    let (code, v) = scrub_json(&[img_s]);
    assert_eq!(code, 3, "{v}");
    let files = v["damaged_files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{v}");
    assert_eq!(files[0]["path"], "/docs/report.bin");
    assert_eq!(files[0]["ranges"], serde_json::json!([[69632, 73728]]));

    let out = canopy().arg("scrub").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("damaged file /docs/report.bin (inode"),
        "{text}"
    );
    assert!(text.contains("bytes 69632..73728"), "{text}");
}

#[test]
fn a_damaged_tree_block_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path());
    let sb = {
        let dev = FileDevice::open(&img, true, false).unwrap();
        canopy::txn::read_best_superblock(&dev).unwrap()
    };
    // The root tree's root block: flip a byte in its item area.
    flip(&img, sb.root + 200);
    let (code, v) = scrub_json(&[img.to_str().unwrap()]);
    // The damaged root tree keeps the engine from opening at all.
    assert_ne!(code, 0, "{v}");
    let (code, v) = {
        // A damaged fs leaf leaves the rest scrubbable.
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path());
        let fs_root = open_ro(&img).read(|r| r.root(FS)).unwrap().bytenr;
        flip(&img, fs_root + 300);
        scrub_json(&[img.to_str().unwrap()])
    };
    assert_eq!(code, 3, "{v}");
    let bad = v["bad_tree_blocks"].as_array().unwrap();
    assert_eq!(bad.len(), 1, "{v}");
    assert_eq!(bad[0]["tree"], FS);
}

#[test]
fn a_mount_scrubs_in_its_daemon_with_status_and_cancel() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("256M");
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::write(m.p("d/victim"), vec![5u8; 300_000]).unwrap();
    for i in 0..20 {
        std::fs::write(m.p(&format!("bulk{i}")), vec![i as u8; 4 << 20]).unwrap();
    }
    assert!(canopy().arg("sync").arg(&m.mnt).status().unwrap().success());
    let mnt = m.mnt.to_str().unwrap().to_string();
    let (code, v) = scrub_json(&[&mnt]);
    assert_eq!(code, 0, "{v}");
    assert!(v["data_extents"].as_u64().unwrap() >= 21, "{v}");

    // Damage the image between mounts, then scrub through the daemon.
    m.unmount();
    let victim_ino = {
        let fs = Fs::new(Arc::new(open_ro(&m.img))).unwrap();
        let d = fs.lookup(256, b"d").unwrap();
        fs.lookup(d.ino, b"victim").unwrap().ino
    };
    flip(&m.img, data_address(&m.img, victim_ino) + 8192);
    m.mount("");
    let (code, v) = scrub_json(&[&mnt]);
    assert_eq!(code, 3, "{v}");
    assert_eq!(v["damaged_files"][0]["path"], "/d/victim", "{v}");

    // In the background, then cancelled; status tells which it came to.
    let out = canopy().args(["scrub", "-b", "-q", &mnt]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = canopy().args(["scrub", "cancel", &mnt]).output().unwrap();
    assert!(out.status.success());
    let st = loop {
        let out = canopy()
            .args(["scrub", "status", "--json", &mnt])
            .output()
            .unwrap();
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if st["state"] != "running" {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        st["state"] == "cancelled" || st["state"] == "finished",
        "{st}"
    );
    m.unmount();
}
