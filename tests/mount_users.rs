//! Users without root (issue 56, item 7): on a mount root made, a second
//! user's subvolume commands follow btrfs's rules over the control socket;
//! and a user makes, mounts and uses an image of their own. They need
//! root (to act as the second user) and /dev/fuse; elsewhere they say so
//! and pass vacuously.

mod common;

use common::mounted::{can_mount, canopy, canopy_ok, Mounted};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

const NOBODY: u32 = 65534;

/// `canopy ARGS` as uid/gid 65534 in `cwd`, without a runtime directory.
fn canopy_as_nobody(args: &[&str], cwd: &Path) -> Output {
    Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["env", "-u", "XDG_RUNTIME_DIR", "HOME=/tmp"])
        .arg(env!("CARGO_BIN_EXE_canopy"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn refused(o: &Output, what: &str, why: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{what} was allowed");
    assert!(err.contains(why), "{what}: wanted '{why}' in: {err}");
}

/// A second user on a mount made by root: subvolumes they create are
/// theirs; they snapshot only what they own and may read; deleting needs
/// `user_subvol_rm_allowed` and rmdir's rights; quota, scrub, balance,
/// devices and send need root, and say so.
#[test]
fn a_second_user_follows_btrfs_rules() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::set_permissions(m._dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&m.mnt, fs::Permissions::from_mode(0o1777)).unwrap();
    let mnt = m.mnt.clone();
    canopy_ok(&["subvolume", "create", "rootsub"], &mnt);
    canopy_ok(&["subvolume", "create", "private"], &mnt);
    fs::set_permissions(m.p("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir(m.p("closed")).unwrap();

    ok(
        &canopy_as_nobody(&["subvolume", "create", "mine"], &mnt),
        "create",
    );
    assert_eq!(fs::metadata(m.p("mine")).unwrap().uid(), NOBODY, "theirs");
    fs::write(m.p("mine/f"), b"data").unwrap();
    ok(
        &canopy_as_nobody(&["subvolume", "snapshot", "-r", "mine", "mine.ro"], &mnt),
        "snapshot",
    );
    assert_eq!(fs::read(m.p("mine.ro/f")).unwrap(), b"data");
    refused(
        &canopy_as_nobody(&["subvolume", "snapshot", "rootsub", "theirs"], &mnt),
        "snapshot of root's subvolume",
        "owner",
    );
    refused(
        &canopy_as_nobody(&["subvolume", "snapshot", "private", "peek"], &mnt),
        "snapshot of an unreadable subvolume",
        "ermission denied",
    );
    refused(
        &canopy_as_nobody(&["subvolume", "create", "closed/sub"], &mnt),
        "create where they may not write",
        "ermission denied",
    );
    // Defragment, as btrfs: whoever may write the file.
    fs::write(m.p("mine/g"), b"more").unwrap();
    fs::set_permissions(m.p("mine/g"), fs::Permissions::from_mode(0o666)).unwrap();
    ok(
        &canopy_as_nobody(&["filesystem", "defragment", "mine/g"], &mnt),
        "defragment of a file they may write",
    );
    refused(
        &canopy_as_nobody(&["filesystem", "defragment", "mine/f"], &mnt),
        "defragment of a file they may not write",
        "ermission denied",
    );
    let list = canopy_as_nobody(&["subvolume", "list", "."], &mnt);
    ok(&list, "list");
    assert!(String::from_utf8_lossy(&list.stdout).contains("mine.ro"));
    ok(&canopy_as_nobody(&["sync", "."], &mnt), "sync");
    ok(
        &canopy_as_nobody(&["property", "set", "mine", "ro", "true"], &mnt),
        "ro on their own",
    );
    refused(
        &canopy_as_nobody(&["property", "set", "rootsub", "ro", "true"], &mnt),
        "ro on root's",
        "owner",
    );
    refused(
        &canopy_as_nobody(&["subvolume", "delete", "mine.ro"], &mnt),
        "delete without the option",
        "user_subvol_rm_allowed",
    );
    for cmd in [
        &["quota", "enable", "."][..],
        &["scrub", "."],
        &["balance", "start", "."],
        &["send", "mine.ro"],
    ] {
        refused(
            &canopy_as_nobody(cmd, &mnt),
            &format!("{cmd:?}"),
            "needs root",
        );
    }

    m.unmount();
    m.mount("user_subvol_rm_allowed");
    ok(
        &canopy_as_nobody(&["subvolume", "delete", "mine.ro"], &mnt),
        "delete with the option",
    );
    // The mount's root is sticky: root's subvolume is not theirs to remove.
    refused(
        &canopy_as_nobody(&["subvolume", "delete", "rootsub"], &mnt),
        "delete of root's subvolume",
        "sticky",
    );
    m.unmount();
    m.check();
}

/// Opens /dev/fuse to every user while it lives, as a machine whose users
/// mount their own images would; restores its mode after.
struct FuseOpen(u32);

impl FuseOpen {
    fn new() -> FuseOpen {
        let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode();
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        FuseOpen(mode)
    }
}

impl Drop for FuseOpen {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0 & 0o7777));
    }
}

/// A user makes an image, mounts it and uses it: the root directory is
/// theirs, `canopy sync` and subvolume commands find the daemon (its
/// socket in their own directory), a snapshot goes out by send and back
/// in by receive.
#[test]
fn a_user_mounts_and_uses_their_own_image() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    let img = home.join("fs.img");
    let mnt = home.join("mnt");
    let _open = FuseOpen::new();
    let (i, mt) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    ok(
        &canopy_as_nobody(&["mkfs", "-q", "-s", "512M", i], &home),
        "mkfs",
    );
    fs::create_dir(&mnt).unwrap();
    std::os::unix::fs::chown(&mnt, Some(NOBODY), Some(NOBODY)).unwrap();
    ok(&canopy_as_nobody(&["mount", i, mt], &home), "mount");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let guard = Unmount(&mnt);
    let sh = |script: &str| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["env", "-u", "XDG_RUNTIME_DIR", "HOME=/tmp", "sh", "-c"])
            .arg(format!("cd '{}' && {script}", mnt.display()))
            .env("CANOPY", env!("CARGO_BIN_EXE_canopy"))
            .output()
            .unwrap()
    };
    // Only its user reaches a FUSE mount made without allow_other.
    let owner = sh("stat -c %u:%g .");
    assert_eq!(
        String::from_utf8_lossy(&owner.stdout).trim(),
        "65534:65534",
        "the root directory is theirs"
    );
    ok(
        &sh("echo hello > f && mkdir d && $CANOPY sync ."),
        "write and sync",
    );
    ok(
        &sh("$CANOPY subvolume create s && echo inside > s/g"),
        "create",
    );
    ok(&sh("$CANOPY subvolume snapshot -r s s.snap"), "snapshot");
    ok(
        &sh("$CANOPY send s.snap > ../stream && mkdir back && $CANOPY receive back < ../stream"),
        "send | receive",
    );
    let back = sh("cat back/s.snap/g && $CANOPY subvolume list .");
    let back = String::from_utf8_lossy(&back.stdout);
    assert!(
        back.starts_with("inside\n") && back.contains("back/s.snap"),
        "{back}"
    );
    let un = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "fusermount3",
            "-u",
            mt,
        ])
        .status()
        .unwrap();
    assert!(un.success(), "fusermount3 -u");
    drop(guard);
    // The daemon exits after the unmount; wait for it to let the image go.
    let mut clean = false;
    for _ in 0..50 {
        let out = canopy().arg("check").arg(&img).output().unwrap();
        if out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("in use") {
            clean = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(clean, "check after the user's unmount");
}
