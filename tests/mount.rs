//! Tests through a real FUSE mount: the daemon runs in the test, and every
//! test unmounts (also when it fails) and checks the image afterwards.
//! They need root and /dev/fuse; elsewhere they say so and pass vacuously.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mounted::{can_mount, canopy, canopy_ok, Mounted};

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// Whether this run mounts with the kernel's writeback cache.
fn writeback_cache() -> bool {
    std::env::var("CANOPY_TEST_MOUNT_OPTS").is_ok_and(|o| o.contains("writeback_cache"))
}

#[test]
fn posix_basics_through_the_mount() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.contains(m.mnt.to_str().unwrap()))
        .unwrap();
    assert!(line.starts_with(m.img.to_str().unwrap()), "{line}");
    assert!(line.contains(" fuse.canopy "), "{line}");

    fs::write(m.p("small"), b"hello").unwrap();
    assert_eq!(fs::read(m.p("small")).unwrap(), b"hello");
    fs::create_dir(m.p("dir")).unwrap();
    assert_eq!(errno_of(fs::create_dir(m.p("dir"))), libc::EEXIST);
    assert_eq!(errno_of(fs::read(m.p("nope"))), libc::ENOENT);
    assert_eq!(errno_of(fs::remove_dir(m.p("small"))), libc::ENOTDIR);
    fs::write(m.p("dir/f"), b"x").unwrap();
    assert_eq!(errno_of(fs::remove_dir(m.p("dir"))), libc::ENOTEMPTY);
    let long = "n".repeat(256);
    assert_eq!(errno_of(fs::write(m.p(&long), b"")), libc::ENAMETOOLONG);
    fs::write(m.p(&"n".repeat(255)), b"ok").unwrap();

    // 4 MiB in 1 MiB writes, then partial overwrites and a sparse tail.
    let mut data: Vec<u8> = (0..4 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    {
        let mut f = fs::File::create(m.p("big")).unwrap();
        for chunk in data.chunks(1 << 20) {
            f.write_all(chunk).unwrap();
        }
        f.write_at(b"patch", 12345).unwrap();
        data[12345..12350].copy_from_slice(b"patch");
        f.set_len(10 << 20).unwrap();
        data.resize(10 << 20, 0);
        f.sync_all().unwrap();
    }
    assert!(fs::read(m.p("big")).unwrap() == data);
    let mut f = fs::File::open(m.p("big")).unwrap();
    f.seek(SeekFrom::Start(3 << 20)).unwrap();
    let mut buf = vec![0u8; 100];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, data[3 << 20..(3 << 20) + 100]);
    drop(f);

    // rename, links, symlinks, permissions, times
    fs::rename(m.p("small"), m.p("dir/moved")).unwrap();
    assert_eq!(fs::read(m.p("dir/moved")).unwrap(), b"hello");
    fs::hard_link(m.p("dir/moved"), m.p("hard")).unwrap();
    assert_eq!(fs::metadata(m.p("hard")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("dir/moved", m.p("sym")).unwrap();
    assert_eq!(fs::read_link(m.p("sym")).unwrap(), Path::new("dir/moved"));
    assert_eq!(fs::read(m.p("sym")).unwrap(), b"hello");
    fs::set_permissions(m.p("hard"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(m.p("dir/moved")).unwrap().mode() & 0o777,
        0o640
    );
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_600_000_000, 123_456_789);
    fs::File::options()
        .write(true)
        .open(m.p("hard"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    let md = fs::metadata(m.p("hard")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));

    // A directory of many entries lists each once.
    for i in 0..1000 {
        fs::write(m.p(&format!("dir/e{i}")), b"").unwrap();
    }
    let n = fs::read_dir(m.p("dir")).unwrap().count();
    assert_eq!(n, 1002);

    m.unmount();
    m.check();
    m.mount("");
    assert!(fs::read(m.p("big")).unwrap() == data);
    assert_eq!(fs::read(m.p("hard")).unwrap(), b"hello");
    fs::remove_file(m.p("big")).unwrap();
    m.unmount();
    m.check();
}

#[test]
fn fsynced_data_survives_kill_9() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mut f = fs::File::create(m.p("durable")).unwrap();
    f.write_all(&vec![0x5a; 300_000]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(m.p("maybe"), b"not fsynced").unwrap();
    m.kill9();
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("durable")).unwrap(), vec![0x5a; 300_000]);
    m.unmount();
    m.check();
}

/// fsync through the log tree (no commit: `commit=3600`), then kill -9:
/// every fsynced file comes back with its content and its last name,
/// in new directories too, while a large unfsynced file does not hold
/// the fsync up.
#[test]
fn logged_fsyncs_survive_kill_9() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    m.mount("commit=3600");
    fs::write(m.p("bulk"), vec![1u8; 8 << 20]).unwrap();
    fs::create_dir_all(m.p("d/e")).unwrap();
    let mut want = Vec::new();
    for i in 0..40u32 {
        let path = if i % 3 == 0 {
            format!("d/e/f{i}")
        } else {
            format!("f{i}")
        };
        let data: Vec<u8> = (0..(i * 997 + 10)).map(|b| (b ^ i) as u8).collect();
        let mut f = fs::File::create(m.p(&path)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        if i % 5 == 0 {
            let new = format!("{path}.renamed");
            fs::rename(m.p(&path), m.p(&new)).unwrap();
            f.sync_all().unwrap();
            want.push((new, data));
        } else {
            want.push((path, data));
        }
    }
    m.kill9();
    m.check();
    m.mount("");
    for (path, data) in &want {
        assert_eq!(&fs::read(m.p(path)).unwrap(), data, "{path}");
        if let Some(old) = path.strip_suffix(".renamed") {
            assert!(!m.p(old).exists(), "{old} has both names");
        }
    }
    m.unmount();
    m.check();
}

#[test]
fn mount_errors_are_reported() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    // Second mount of the same image is refused with the reason.
    let other = m._dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let out = canopy()
        .arg("mount")
        .arg(&m.img)
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    let out = canopy()
        .args(["mount", "-o", "bogus"])
        .arg(&m.img)
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mount option"));
    m.unmount();
    let out = canopy()
        .arg("mount")
        .arg(m._dir.path().join("missing.img"))
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Daemonized mount returns once live; SIGTERM unmounts cleanly.
    let st = canopy()
        .arg("mount")
        .arg(&m.img)
        .arg(&m.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    fs::write(m.p("after"), b"1").unwrap();
    assert!(common::mounted::umount(&m.mnt), "umount failed");
    // The daemon commits and exits after the unmount: wait until it lets
    // go of the image lock.
    let img = fs::File::open(&m.img).unwrap();
    let mut free = false;
    for _ in 0..200 {
        if img.try_lock().is_ok() {
            img.unlock().unwrap();
            free = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(free, "daemon did not exit after unmount");
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("after")).unwrap(), b"1");
    m.unmount();
}

#[test]
fn unlinked_open_files_live_until_closed() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mut f = fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.p("tmp"))
        .unwrap();
    f.write_all(&vec![7u8; 200_000]).unwrap();
    fs::remove_file(m.p("tmp")).unwrap();
    assert_eq!(errno_of(fs::metadata(m.p("tmp"))), libc::ENOENT);
    f.write_all(b"more").unwrap();
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 200_004);
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.sync_all().unwrap();
    // A crash while the orphan is open: the next mount deletes it.
    m.kill9();
    drop(f);
    m.mount("");
    m.unmount();
    m.check();
    let out = canopy()
        .args(["check", "--json"])
        .arg(&m.img)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["data_extents"], 0, "orphan's data was freed at mount");
    // And without a crash: closing frees it.
    m.mount("");
    let f = fs::File::create(m.p("tmp2")).unwrap();
    f.write_all_at(&vec![1u8; 100_000], 0).unwrap();
    fs::remove_file(m.p("tmp2")).unwrap();
    drop(f);
    m.unmount();
    let out = canopy()
        .args(["check", "--json"])
        .arg(&m.img)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["data_extents"], 0,
        "closing the last handle freed the data"
    );
    assert!(v["problems"].as_array().unwrap().is_empty());
}

#[test]
fn xattrs_and_seek_through_the_mount() {
    if !can_mount() {
        return;
    }
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    let mut m = Mounted::new();
    let path = m.p("f");
    let f = fs::File::create(&path).unwrap();
    f.write_all_at(&vec![1u8; 1 << 20], 0).unwrap();
    f.set_len(8 << 20).unwrap();
    f.write_all_at(&vec![2u8; 4096], 6 << 20).unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: plain syscalls on an open descriptor.
    let (d, h, d2, h2) = unsafe {
        (
            libc::lseek(fd, 0, libc::SEEK_DATA),
            libc::lseek(fd, 0, libc::SEEK_HOLE),
            libc::lseek(fd, 1 << 20, libc::SEEK_DATA),
            libc::lseek(fd, 6 << 20, libc::SEEK_HOLE),
        )
    };
    if writeback_cache() {
        // The kernel answers alone: all data up to the end of file.
        assert_eq!((d, h, d2, h2), (0, 8 << 20, 1 << 20, 8 << 20));
    } else {
        assert_eq!((d, h, d2, h2), (0, 1 << 20, 6 << 20, (6 << 20) + 4096));
    }
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new("user.color").unwrap();
    // SAFETY: valid C strings and buffers.
    unsafe {
        assert_eq!(
            libc::setxattr(cpath.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0),
            0
        );
        let mut buf = [0u8; 16];
        let n = libc::getxattr(
            cpath.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!(&buf[..n as usize], b"blue");
        let n = libc::listxattr(cpath.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"user.color\0");
        let missing = CString::new("user.none").unwrap();
        assert_eq!(
            libc::getxattr(
                cpath.as_ptr(),
                missing.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len()
            ),
            -1
        );
        assert_eq!(*libc::__errno_location(), libc::ENODATA);
    }
    drop(f);
    m.unmount();
    m.check();
}

#[test]
fn fallocate_and_reflink_copies_through_the_mount() {
    if !can_mount() {
        return;
    }
    use std::os::fd::AsRawFd;
    let mut m = Mounted::new();
    let src = fs::File::create(m.p("src")).unwrap();
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    src.write_all_at(&data, 0).unwrap();
    src.sync_all().unwrap();
    drop(src);
    m.unmount();
    let extents = |m: &Mounted| {
        let out = canopy()
            .args(["check", "--json"])
            .arg(&m.img)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["data_extents"].as_u64().unwrap()
    };
    let before = extents(&m);
    m.mount("");
    let src = fs::File::open(m.p("src")).unwrap();
    let dst = fs::File::create(m.p("dst")).unwrap();
    let mut off_in: i64 = 0;
    let mut off_out: i64 = 0;
    // SAFETY: valid descriptors and offset pointers.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            data.len(),
            0,
        )
    };
    assert_eq!(n, data.len() as isize);
    assert!(fs::read(m.p("dst")).unwrap() == data);
    // fallocate: preallocate past the end, punch a hole, zero a range.
    let f = fs::File::create(m.p("fa")).unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: plain syscalls on an open descriptor.
    unsafe {
        assert_eq!(libc::fallocate(fd, 0, 0, 1 << 20), 0);
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        assert_eq!(
            libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20),
            0
        );
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    }
    f.write_all_at(&[9u8; 8192], 4096).unwrap();
    // SAFETY: as above.
    unsafe {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(libc::fallocate(fd, mode, 5000, 3000), 0);
    }
    let mut want = vec![0u8; 1 << 20];
    want[4096..12288].fill(9);
    want[5000..8000].fill(0);
    assert!(fs::read(m.p("fa")).unwrap() == want);
    drop((src, dst, f));
    m.unmount();
    m.check();
    // The copy shares the source's extents (fa adds its own).
    let after = extents(&m);
    let fa_extents = after - before;
    assert!(
        fa_extents <= 4,
        "copy_file_range copied instead of sharing: {before} -> {after}"
    );
}

#[test]
fn mount_helper_invocations() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    // As mount(8) runs /sbin/mount.fuse.canopy, and as fuse3's mount.fuse
    // runs `canopy IMAGE DIR -o OPTS`.
    let helper = m._dir.path().join("mount.fuse.canopy");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_canopy"), &helper).unwrap();
    let runs: [Command; 2] = [
        Command::new(&helper),
        Command::new(env!("CARGO_BIN_EXE_canopy")),
    ];
    for mut cmd in runs {
        let st = cmd
            .arg(&m.img)
            .arg(&m.mnt)
            .args(["-o", "rw,noatime"])
            .status()
            .unwrap();
        assert!(st.success());
        let mounts = fs::read_to_string("/proc/mounts").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.contains(m.mnt.to_str().unwrap()))
            .unwrap()
            .to_string();
        assert!(
            line.contains("fuse.canopy") && line.contains("noatime"),
            "{line}"
        );
        assert!(common::mounted::umount(&m.mnt), "umount failed");
        let img = fs::File::open(&m.img).unwrap();
        for _ in 0..200 {
            if img.try_lock().is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    m.check();
}

#[test]
fn read_only_mounts() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    // A freshly made image mounts read-only at once.
    assert!(canopy()
        .args(["mkfs", "-f", "-q"])
        .arg(&m.img)
        .status()
        .unwrap()
        .success());
    m.mount("ro");
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0);
    assert_eq!(errno_of(fs::write(m.p("x"), b"1")), libc::EROFS);
    m.unmount();
    m.mount("");
    fs::write(m.p("x"), b"1").unwrap();
    m.unmount();
    m.mount("ro,noexec,nosuid,nodev,noatime");
    assert_eq!(fs::read(m.p("x")).unwrap(), b"1");
    m.unmount();
    m.check();
}

/// The daemon's memory is bounded by its block cache, dirty limit and
/// /dev/fuse readers, not by how much data passes through: rounds of
/// large writes, many small files and reads leave its resident size
/// under a fixed bound.
#[test]
fn daemon_memory_stays_bounded() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    // 512 blocks of 16 KiB (8 MiB) of cache, 4 MiB of buffered data, and
    // at most 8 readers: each keeps a request and a reply buffer of about
    // 1 MiB, and under the kernel's writeback cache the pool grows to its
    // default most (32), 60-80 MB more than the traffic itself costs.
    m.mount("cache_blocks=512,dirty_limit=4M,max_threads=8");
    let chunk = vec![0x5au8; 1 << 20];
    let mut peak = 0;
    for round in 0..3 {
        for f in 0..2 {
            let mut file = fs::File::create(m.p(&format!("big{f}"))).unwrap();
            for _ in 0..80 {
                file.write_all(&chunk).unwrap();
            }
            file.sync_all().unwrap();
        }
        let dir = m.p(&format!("d{round}"));
        fs::create_dir(&dir).unwrap();
        for i in 0..1000 {
            fs::write(dir.join(format!("f{i}")), format!("{i}")).unwrap();
        }
        for f in 0..2 {
            assert_eq!(fs::read(m.p(&format!("big{f}"))).unwrap().len(), 80 << 20);
        }
        peak = peak.max(m.daemon_rss_kib());
    }
    assert!(
        peak < 160 << 10,
        "daemon resident size reached {peak} KiB after ~500 MiB of traffic"
    );
    m.unmount();
    m.check();
}

/// Mounted by root, the filesystem serves other users too, and the kernel
/// enforces permissions for them: EACCES on a private file and in a
/// directory they may not write, EPERM on chmod of a file they do not own.
/// Runs `script` with sh, as root or as nobody (uid and gid 65534, no
/// other groups).
fn shell(script: &str, as_nobody: bool) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).env("LC_ALL", "C");
    if as_nobody {
        c.uid(65534).gid(65534);
    }
    c.output().unwrap()
}

#[test]
fn permissions_apply_to_other_users() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::set_permissions(m._dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(m.p("secret"), b"s").unwrap();
    fs::set_permissions(m.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.p("public"), b"hello").unwrap();
    fs::set_permissions(m.p("public"), fs::Permissions::from_mode(0o644)).unwrap();
    let as_nobody = |script: &str| {
        let out = shell(script, true);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mnt = m.mnt.display().to_string();
    let (ok, out, err) = as_nobody(&format!("cat {mnt}/public"));
    assert!(
        ok && out == "hello",
        "another user reads a public file: {err}"
    );
    let (ok, _, err) = as_nobody(&format!("cat {mnt}/secret"));
    assert!(!ok && err.contains("Permission denied"), "EACCES: {err}");
    let (ok, _, err) = as_nobody(&format!("touch {mnt}/new"));
    assert!(!ok && err.contains("Permission denied"), "EACCES: {err}");
    let (ok, _, err) = as_nobody(&format!("chmod 777 {mnt}/public"));
    assert!(
        !ok && err.contains("Operation not permitted"),
        "EPERM: {err}"
    );
    assert_eq!(
        fs::metadata(m.p("public")).unwrap().permissions().mode() & 0o777,
        0o644
    );
    m.unmount();
    m.check();
}

/// The permission bits `stat(1)` shows for `f`. stat asks statx for the
/// mode only, so the kernel answers from its cache unless it was told the
/// mode changed: this sees what a program would.
fn shown_mode(f: &std::path::Path) -> u32 {
    let out = Command::new("stat")
        .args(["-c", "%a"])
        .arg(f)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    u32::from_str_radix(shown.trim(), 8).unwrap_or(u32::MAX)
}

/// A fresh mount whose root the user nobody may write in (and reach).
fn mounted_for_nobody() -> Mounted {
    let m = Mounted::new();
    fs::set_permissions(m._dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&m.mnt, fs::Permissions::from_mode(0o777)).unwrap();
    m
}

/// Set-user-ID and set-group-ID bits are cleared as on a local kernel
/// filesystem (the daemon does it: FUSE's HANDLE_KILLPRIV_V2), and the
/// mode the kernel shows right after is the new one. The expected modes
/// are what ext4 gives for the same commands.
#[test]
fn set_id_bits_are_cleared_as_the_kernel_clears_them() {
    if !can_mount() {
        return;
    }
    let mut m = mounted_for_nobody();
    let f = m.p("f");
    let path = f.display().to_string();
    // (mode before, command, run as nobody, mode after)
    let cases: &[(u32, &str, bool, u32)] = &[
        (0o6777, "echo x >> {f}", true, 0o777),
        // Not group-executable, and nobody is not in the file's group.
        (0o6767, "echo x >> {f}", true, 0o767),
        (0o6777, "truncate -s 0 {f}", true, 0o777),
        (0o6777, ": > {f}", true, 0o777),
        (0o6777, "fallocate -l 8192 {f}", true, 0o777),
        (0o6777, "fallocate -p -o 0 -l 2 {f}", true, 0o777),
        (0o4757, "echo x >> {f}", true, 0o757),
        // Root holds CAP_FSETID.
        (0o6777, "echo x >> {f}", false, 0o6777),
        (0o6777, "truncate -s 1 {f}", false, 0o6777),
        // chown clears set-user-ID whoever does it.
        (0o6777, "chown 65534 {f}", false, 0o777),
        (0o6767, "chown 65534 {f}", false, 0o2767),
        (0o2777, "chgrp 65534 {f}", false, 0o777),
    ];
    for &(before, cmd, nobody, after) in cases {
        let _ = fs::remove_file(&f);
        fs::write(&f, b"data").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(before)).unwrap();
        let out = shell(&cmd.replace("{f}", &path), nobody);
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mode = shown_mode(&f);
        assert_eq!(
            mode, after,
            "{before:o} then `{cmd}` (as nobody: {nobody}): got {mode:o}, want {after:o}"
        );
    }
    m.unmount();
    m.check();
}

/// A file held open for writing while its owner sets set-id bits: the
/// next write through the open handle by a caller without CAP_FSETID
/// clears them (the daemon remembers per open file whether its mode has
/// set-id bits, so the chmod must reach that note), twice over.
#[test]
fn set_id_bits_set_while_a_writer_holds_the_file_open_are_cleared() {
    if !can_mount() {
        return;
    }
    let mut m = mounted_for_nobody();
    let f = m.p("f");
    fs::write(&f, b"").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
    let go = |n: u32| m._dir.path().join(format!("go{n}"));
    // Writes a line, then one more each time the test says go.
    let script = format!(
        "exec 3>>{f}; echo a >&3; \
         for n in 1 2; do while [ ! -e {dir}/go$n ]; do sleep 0.02; done; echo b >&3; done",
        f = f.display(),
        dir = m._dir.path().display()
    );
    /// The writer, killed if the test fails before it ends (it would
    /// wait for its go files for ever, holding the test's output open).
    struct Writer(std::process::Child);
    impl Drop for Writer {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    use std::os::unix::process::CommandExt;
    let mut writer = Writer(
        Command::new("sh")
            .arg("-c")
            .arg(&script)
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap(),
    );
    let wait_for_size = |len: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::metadata(&f).unwrap().len() < len {
            assert!(Instant::now() < deadline, "the writer did not write");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for_size(2);
    for n in 1..=2 {
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
        assert_eq!(shown_mode(&f), 0o6777);
        fs::write(go(n), b"").unwrap();
        wait_for_size(2 + 2 * n as u64);
        let mode = shown_mode(&f);
        assert_eq!(
            mode, 0o777,
            "after write {n} through the open file: {mode:o}"
        );
    }
    assert!(writer.0.wait().unwrap().success());
    m.unmount();
    m.check();
}

/// chown clears set-id bits of every kind of file but a directory: fifos
/// and device nodes as regular files (the modes are ext4's).
#[test]
fn chown_clears_set_id_bits_of_fifos_and_devices() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let f = m.p("node");
    let path = f.display().to_string();
    let makers = ["mkfifo {f}", "mknod {f} c 1 3", "mknod {f} b 7 200"];
    // (mode before, command as root, mode after)
    let cases: &[(u32, &str, u32)] = &[
        (0o6777, "chown 65534 {f}", 0o777),
        (0o6767, "chown 65534 {f}", 0o2767),
        (0o2777, "chgrp 65534 {f}", 0o777),
        (0o6555, "chown 65534:65532 {f}", 0o555),
    ];
    for maker in makers {
        for &(before, cmd, after) in cases {
            let _ = fs::remove_file(&f);
            let out = shell(&maker.replace("{f}", &path), false);
            assert!(out.status.success(), "{maker}");
            fs::set_permissions(&f, fs::Permissions::from_mode(before)).unwrap();
            let out = shell(&cmd.replace("{f}", &path), false);
            assert!(out.status.success(), "{maker}; {cmd}");
            let mode = shown_mode(&f);
            assert_eq!(
                mode, after,
                "{maker}, {before:o} then `{cmd}`: got {mode:o}, want {after:o}"
            );
        }
    }
    m.unmount();
    m.check();
}

fn remount(m: &Mounted, opts: &str) -> std::process::Output {
    canopy()
        .args(["mount", "-o", opts])
        .arg(&m.img)
        .arg(&m.mnt)
        .output()
        .unwrap()
}

#[test]
fn remount_read_only_commits_and_refuses_changes() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::write(m.p("f"), b"before").unwrap();
    let out = remount(&m, "remount,ro");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(errno_of(fs::write(m.p("g"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(m.p("f"))), libc::EROFS);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"before");
    // The daemon notices within a second and commits: "f" was never
    // fsynced, yet it survives a crash once the remount has taken hold.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    m.kill9();
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"before");
    // ro and back to rw on a mount that began rw.
    assert!(remount(&m, "remount,ro").status.success());
    let out = remount(&m, "remount,rw");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.p("g"), b"after").unwrap();
    m.unmount();
    m.check();
    // A mount that began read-only has a read-only daemon: it stays so.
    m.mount("ro");
    let out = remount(&m, "remount,rw");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("began read-only"));
    assert_eq!(errno_of(fs::write(m.p("h"), b"x")), libc::EROFS);
    assert_eq!(fs::read(m.p("g")).unwrap(), b"after");
    m.unmount();
    m.check();
}

#[test]
fn mount_right_after_umount_waits_for_the_old_daemon() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let data = vec![7u8; 3 << 20];
    fs::write(m.p("f"), &data).unwrap();
    // umount returns before the daemon's last commit; mount at once.
    let mut old = m.umount_returning_daemon();
    m.mount("");
    assert!(fs::read(m.p("f")).unwrap() == data);
    assert!(old.wait().unwrap().success());
    m.unmount();
    m.check();
}

#[test]
fn canopy_sync_makes_everything_durable() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), vec![3u8; 200_000]).unwrap();
    let out = canopy().arg("sync").arg(&m.mnt).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.kill9();
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("d/f")).unwrap(), vec![3u8; 200_000]);
    let out = canopy().arg("sync").arg(m.p("missing")).output().unwrap();
    assert!(!out.status.success());
    m.unmount();
    m.check();
}

#[test]
fn full_disk_gives_enospc_through_the_mount() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("64M");
    let kept = vec![7u8; 100_000];
    fs::write(m.p("keep"), &kept).unwrap();
    let mut f = fs::File::create(m.p("fill")).unwrap();
    let chunk = common::noise(1 << 20, 0xab);
    let mut failed = None;
    for _ in 0..128 {
        if let Err(e) = f.write_all(&chunk) {
            failed = Some(e);
            break;
        }
    }
    // Under the writeback cache the kernel takes the writes into its page
    // cache; the daemon's ENOSPC comes back at fsync instead.
    if failed.is_none() && writeback_cache() {
        failed = f.sync_all().err();
    }
    let e = failed.expect("128 MiB fitted on a 64 MiB filesystem");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    assert_eq!(fs::read(m.p("keep")).unwrap(), kept);
    fs::remove_file(m.p("fill")).unwrap();
    let room = vec![1u8; 16 << 20];
    fs::write(m.p("after"), &room).unwrap();
    fs::File::open(m.p("after")).unwrap().sync_all().unwrap();
    m.unmount();
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("keep")).unwrap(), kept);
    assert_eq!(fs::read(m.p("after")).unwrap(), room);
    m.unmount();
    m.check();
}

/// Under the writeback cache the kernel keeps its own ctime for a file it
/// unlinks and flushes it later; the file being gone must not make syncfs
/// fail.
#[test]
fn syncfs_after_deleting_fresh_files_succeeds() {
    if !can_mount() {
        return;
    }
    use std::os::fd::AsRawFd;
    let mut m = Mounted::new();
    for i in 0..20 {
        let p = m.p(&format!("f{i}"));
        fs::write(&p, vec![i as u8; 10_000 + i * 777]).unwrap();
        fs::remove_file(&p).unwrap();
    }
    fs::create_dir(m.p("d")).unwrap();
    fs::remove_dir(m.p("d")).unwrap();
    let root = fs::File::open(&m.mnt).unwrap();
    // SAFETY: syncfs on an open descriptor.
    let r = unsafe { libc::syncfs(root.as_raw_fd()) };
    assert_eq!(r, 0, "syncfs: {}", std::io::Error::last_os_error());
    drop(root);
    m.unmount();
    m.check();
}

/// The modification time a writer sees is the one kept, also when the
/// kernel caches the write and sends it later.
#[test]
fn mtime_seen_after_a_write_is_kept() {
    if !can_mount() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let mut m = Mounted::new();
    let mut f = fs::File::create(m.p("f")).unwrap();
    f.write_all(&vec![3u8; 300_000]).unwrap();
    let seen = f.metadata().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(f);
    let after_close = fs::metadata(m.p("f")).unwrap();
    assert_eq!(
        (after_close.mtime(), after_close.mtime_nsec()),
        (seen.mtime(), seen.mtime_nsec())
    );
    m.unmount();
    m.mount("");
    let kept = fs::metadata(m.p("f")).unwrap();
    assert_eq!(
        (kept.mtime(), kept.mtime_nsec(), kept.size()),
        (seen.mtime(), seen.mtime_nsec(), 300_000)
    );
    assert_eq!(
        (kept.ctime(), kept.ctime_nsec()),
        (seen.ctime(), seen.ctime_nsec())
    );
    m.unmount();
    m.check();
}

/// A cold sequential read of a file made of many extents with holes between
/// them returns exactly what was written while the daemon reads ahead, and
/// the mount's read-ahead is raised to the `readahead=` option.
#[test]
fn cold_sequential_read_with_read_ahead_returns_the_written_bytes() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("256M");
    let mib = 1u64 << 20;
    let mut want = vec![0u8; (40 * mib) as usize];
    {
        let f = fs::File::create(m.p("striped")).unwrap();
        // 3 MiB of data, then a 1 MiB hole, ten times over.
        for stripe in 0..10u64 {
            let at = stripe * 4 * mib;
            let data: Vec<u8> = (0..3 * mib)
                .map(|i| (((at + i) * 2654435761) >> 13) as u8)
                .collect();
            f.write_all_at(&data, at).unwrap();
            want[at as usize..(at + 3 * mib) as usize].copy_from_slice(&data);
        }
        f.set_len(40 * mib).unwrap();
        f.sync_all().unwrap();
    }
    m.unmount();
    drop_caches();
    m.mount("readahead=8M");
    if unsafe { libc::geteuid() } == 0 {
        let dev = fs::metadata(&m.mnt).unwrap().dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let kb =
            fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb")).unwrap();
        assert_eq!(kb.trim(), "8192");
    }
    let mut got = Vec::new();
    fs::File::open(m.p("striped"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(got == want, "sequential read differs from what was written");
    m.unmount();
    m.check();
}

/// Empties the kernel's page cache, so the next read goes to the image.
fn drop_caches() {
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Inode flags: a new file has none, clearing them all works, a flag
/// Canopy does not keep (`j`, data journaling) is refused, and ioctls of
/// other kinds get ENOTTY (the kept ones: tests/mount_posix.rs).
#[test]
fn inode_flag_ioctls_refuse_what_is_not_kept() {
    use std::os::fd::AsRawFd;
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::write(m.p("f"), b"x").unwrap();
    let f = fs::File::open(m.p("f")).unwrap();
    let fd = f.as_raw_fd();
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    const FS_JOURNAL_DATA_FL: libc::c_int = 0x4000;
    let last_errno = || std::io::Error::last_os_error().raw_os_error();
    let mut flags: libc::c_int = -1;
    assert_eq!(unsafe { libc::ioctl(fd, FS_IOC_GETFLAGS, &mut flags) }, 0);
    assert_eq!(flags, 0);
    let mut none: libc::c_int = 0;
    assert_eq!(unsafe { libc::ioctl(fd, FS_IOC_SETFLAGS, &mut none) }, 0);
    let mut journaled = FS_JOURNAL_DATA_FL;
    assert_eq!(
        unsafe { libc::ioctl(fd, FS_IOC_SETFLAGS, &mut journaled) },
        -1
    );
    assert_eq!(last_errno(), Some(libc::EOPNOTSUPP));
    // FIEMAP: not answered by FUSE daemons.
    let mut buf = [0u8; 64];
    assert_eq!(
        unsafe { libc::ioctl(fd, 0xc020_660b, buf.as_mut_ptr()) },
        -1
    );
    assert!(
        matches!(last_errno(), Some(libc::ENOTTY) | Some(libc::EOPNOTSUPP)),
        "{:?}",
        last_errno()
    );
    drop(f);
    m.unmount();
    m.check();
}

/// Absent names are cached by the kernel as negative entries; every way of
/// creating a name through the mount must still make it visible at once.
#[test]
fn names_looked_up_while_absent_appear_when_created() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    fs::write(m.p("src"), b"data").unwrap();
    let absent = |m: &Mounted, n: &str| {
        assert_eq!(errno_of(fs::metadata(m.p(n))), libc::ENOENT, "{n}");
    };
    for n in ["created", "linked", "renamed", "dir", "sym"] {
        absent(&m, n);
        absent(&m, n);
    }
    fs::write(m.p("created"), b"1").unwrap();
    fs::hard_link(m.p("src"), m.p("linked")).unwrap();
    fs::copy(m.p("src"), m.p("tmp")).unwrap();
    fs::rename(m.p("tmp"), m.p("renamed")).unwrap();
    fs::create_dir(m.p("dir")).unwrap();
    std::os::unix::fs::symlink("src", m.p("sym")).unwrap();
    assert_eq!(fs::read(m.p("created")).unwrap(), b"1");
    assert_eq!(fs::read(m.p("linked")).unwrap(), b"data");
    assert_eq!(fs::read(m.p("renamed")).unwrap(), b"data");
    assert!(fs::metadata(m.p("dir")).unwrap().is_dir());
    assert_eq!(fs::read(m.p("sym")).unwrap(), b"data");
    absent(&m, "tmp");
    fs::remove_file(m.p("created")).unwrap();
    absent(&m, "created");
    fs::write(m.p("created"), b"2").unwrap();
    assert_eq!(fs::read(m.p("created")).unwrap(), b"2");
    m.unmount();
    m.check();
}

/// The issue's reproduction: with the image mounted, a loop device over
/// it must not give a second read-write mount, and files made durable
/// through the first stay there.
#[test]
fn a_loop_device_over_a_mounted_image_is_refused() {
    if !can_mount()
        || !common::require(
            Command::new("losetup").arg("--version").output().is_ok(),
            "needs losetup",
        )
    {
        return;
    }
    let mut m = Mounted::new();
    fs::write(m.p("durable"), b"synced through the first mount").unwrap();
    let st = canopy().arg("sync").arg(&m.mnt).status().unwrap();
    assert!(st.success());
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&m.img)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup failed");
    let lo = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let second = m._dir.path().join("second");
    fs::create_dir(&second).unwrap();
    let out = canopy()
        .args(["mount", "-f"])
        .arg(&lo)
        .arg(&second)
        .output()
        .unwrap();
    let _ = Command::new("losetup").args(["-d", &lo]).status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second mount through {lo} succeeded");
    assert!(err.contains("the file behind"), "{err}");
    m.unmount();
    m.mount("");
    assert_eq!(
        fs::read(m.p("durable")).unwrap(),
        b"synced through the first mount"
    );
    m.unmount();
}

#[test]
fn subvolumes_and_snapshots_through_the_mount() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    canopy_ok(&["subvolume", "create", "home"], &mnt);
    fs::write(m.p("home/f"), vec![5u8; 300_000]).unwrap();
    fs::create_dir(m.p("snaps")).unwrap();
    // Looked up while absent: the kernel caches that, and the snapshot
    // made behind its back must still appear.
    assert!(!m.p("snaps/s1").exists());
    canopy_ok(&["subvolume", "snapshot", "-r", "home", "snaps/s1"], &mnt);
    assert!(m.p("snaps/s1").is_dir());
    fs::write(m.p("home/f"), b"changed").unwrap();
    assert_eq!(fs::read(m.p("snaps/s1/f")).unwrap(), vec![5u8; 300_000]);
    // Distinct inode numbers: tools must not take the copies for links.
    let (a, b) = (
        fs::metadata(m.p("home/f")).unwrap(),
        fs::metadata(m.p("snaps/s1/f")).unwrap(),
    );
    assert_eq!(a.dev(), b.dev());
    assert_ne!(a.ino(), b.ino());
    assert_eq!(errno_of(fs::write(m.p("snaps/s1/f"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::write(m.p("snaps/s1/new"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(fs::hard_link(m.p("home/f"), m.p("f-link"))),
        libc::EXDEV
    );
    let json = canopy_ok(&["subvolume", "list", "--json", "."], &mnt);
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows: Vec<(u64, String, bool)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_u64().unwrap(),
                r["path"].as_str().unwrap().to_string(),
                r["readonly"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![(256, "home".into(), false), (257, "snaps/s1".into(), true)]
    );
    assert!(canopy_ok(&["property", "get", "snaps/s1", "ro"], &mnt).contains("ro=true"));
    canopy_ok(&["property", "set", "snaps/s1", "ro", "false"], &mnt);
    fs::write(m.p("snaps/s1/new"), b"x").unwrap();
    fs::rename(m.p("snaps/s1"), m.p("snaps/s2")).unwrap();
    let show = canopy_ok(&["subvolume", "show", "snaps/s2"], &mnt);
    assert!(show.contains("Subvolume ID: \t\t257"), "{show}");
    m.unmount();
    m.check();
    // A mount of one subvolume.
    m.mount("subvol=snaps/s2");
    assert_eq!(fs::read(m.p("new")).unwrap(), b"x");
    assert_eq!(fs::read(m.p("f")).unwrap(), vec![5u8; 300_000]);
    m.unmount();
    m.mount("");
    canopy_ok(&["subvolume", "delete", "snaps/s2"], &mnt);
    assert!(!m.p("snaps/s2").exists());
    assert_eq!(fs::read(m.p("home/f")).unwrap(), b"changed");
    let out = canopy()
        .args(["subvolume", "delete", "snaps"])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a plain directory is no subvolume");
    m.unmount();
    m.check();
}

/// Free blocks of the mount as statfs reports them.
use common::mounted::free_blocks;

/// A subvolume of `n` small files, each with its own data extent.
fn many_files(m: &Mounted, name: &str, n: usize) {
    canopy_ok(&["subvolume", "create", name], &m.mnt);
    for i in 0..n {
        fs::write(m.p(&format!("{name}/f{i}")), common::noise(8192, i as u64)).unwrap();
    }
    canopy_ok(&["sync", "."], &m.mnt);
}

/// Deleting returns at once; the daemon's cleaner gives the space back in
/// the background, `canopy subvolume sync` waits for it, and a kill -9
/// right after a deletion leaves an image that checks clean and that the
/// next mount finishes freeing (the Fs-level tests in tests/cleaner.rs
/// interrupt the cleaner at every point).
#[test]
fn deleted_subvolumes_are_freed_in_the_background() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let empty = free_blocks(&mnt);
    many_files(&m, "a", 3000);
    let full = free_blocks(&mnt);
    assert!(full + 3000 * 2 < empty, "the files take space");
    canopy_ok(&["subvolume", "delete", "a"], &mnt);
    let started = std::time::Instant::now();
    while free_blocks(&mnt) + 64 < empty {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "space came back within 30 s: {} of {empty} free",
            free_blocks(&mnt)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    many_files(&m, "b", 3000);
    canopy_ok(&["subvolume", "delete", "b"], &mnt);
    canopy_ok(&["subvolume", "sync", "."], &mnt);
    assert!(
        free_blocks(&mnt) + 64 >= empty,
        "subvolume sync waited for the cleaner: {} of {empty} free",
        free_blocks(&mnt)
    );
    many_files(&m, "c", 3000);
    canopy_ok(&["subvolume", "delete", "c"], &mnt);
    m.kill9();
    m.check();
    m.mount("");
    canopy_ok(&["subvolume", "sync", "."], &mnt);
    assert!(
        free_blocks(&mnt) + 64 >= empty,
        "the next mount finished it"
    );
    m.unmount();
    m.check();
}

/// A directory listing read with readdir(3), each entry with the offset
/// telldir(3) gives after it.
struct Listing {
    dir: *mut libc::DIR,
}

impl Listing {
    fn open(path: &Path) -> Listing {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let dir = unsafe { libc::opendir(c.as_ptr()) };
        assert!(!dir.is_null(), "opendir {}", path.display());
        Listing { dir }
    }

    /// The next name and the offset after it, or None at the end (an
    /// error fails the test: readdir must not end a listing silently).
    fn next(&mut self) -> Option<(String, i64)> {
        unsafe { *libc::__errno_location() = 0 };
        let e = unsafe { libc::readdir64(self.dir) };
        if e.is_null() {
            let errno = unsafe { *libc::__errno_location() };
            assert_eq!(errno, 0, "readdir failed");
            return None;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let at = unsafe { libc::telldir(self.dir) };
        Some((name.to_string_lossy().into_owned(), at))
    }

    fn rest(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).map(|(n, _)| n).collect()
    }

    fn seek(&mut self, at: i64) {
        unsafe { libc::seekdir(self.dir, at) };
    }

    /// lseek(2) on the directory's descriptor.
    fn lseek(&mut self, at: i64) -> i64 {
        unsafe { libc::lseek(libc::dirfd(self.dir), at, libc::SEEK_SET) }
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.dir) };
    }
}

/// Issue 41, item 1: every directory offset is a valid file offset
/// (1..2^63-1), so seekdir(telldir()) and lseek resume a listing where it
/// was, also after other entries were renamed and the kernel's cache of
/// the directory was dropped.
#[test]
fn directory_offsets_resume_listings() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    fs::create_dir(m.p("d")).unwrap();
    let names: Vec<String> = (0..1500).map(|i| format!("entry-{i:04}")).collect();
    for n in &names {
        fs::write(m.p(&format!("d/{n}")), b"").unwrap();
    }
    let mut l = Listing::open(&m.p("d"));
    let listed: Vec<(String, i64)> = std::iter::from_fn(|| l.next()).collect();
    assert_eq!(listed.len(), names.len() + 2, "listed each entry once");
    for (name, at) in &listed {
        assert!(*at > 0, "{name}: offset {at} is not a valid file offset");
    }
    // Resume after each of a spread of entries, by seekdir and by lseek.
    for k in (0..listed.len() - 1).step_by(97) {
        let after: Vec<String> = listed[k + 1..].iter().map(|(n, _)| n.clone()).collect();
        l.seek(listed[k].1);
        assert_eq!(l.rest(), after, "seekdir after {}", listed[k].0);
        assert_eq!(
            l.lseek(listed[k].1),
            listed[k].1,
            "lseek to {}",
            listed[k].1
        );
        assert_eq!(l.rest(), after, "lseek after {}", listed[k].0);
    }
    // Entries renamed while the directory is open: a resumed listing
    // shows each unrenamed entry after the offset exactly once, and each
    // renamed one at most once under either name (POSIX leaves open
    // whether it shows names added or removed since opendir; the
    // listing's bound keeps it from meeting renamed entries forever).
    let mid = 700;
    let moved = &names[mid + 10..mid + 20];
    for n in moved {
        fs::rename(m.p(&format!("d/{n}")), m.p(&format!("d/{n}.moved"))).unwrap();
    }
    let _ = fs::write("/proc/sys/vm/drop_caches", b"3");
    l.seek(listed[mid].1);
    let rest = l.rest();
    let count = |n: &str| rest.iter().filter(|r| *r == n).count();
    for (n, _) in &listed[mid + 1..] {
        let times = count(n) + count(&format!("{n}.moved"));
        match moved.contains(n) {
            false => assert_eq!(times, 1, "{n} after renames"),
            true => assert!(times <= 1, "{n} listed twice after its rename"),
        }
    }
    assert_eq!(
        rest.len(),
        rest.iter().collect::<std::collections::HashSet<_>>().len(),
        "a resumed listing showed a name twice"
    );
    drop(l);
    // A fresh listing sees the directory as it is now.
    let now = Listing::open(&m.p("d")).rest();
    assert_eq!(now.len(), names.len() + 2);
    assert_eq!(now.iter().filter(|n| n.ends_with(".moved")).count(), 10);
}

/// Issue 56, item 1, against a model: offsets below, between, at and
/// above handed-out ones, with entries added and removed between seeks. A
/// resumed listing never shows a name twice, shows every entry that was
/// listed at or after the offset and is still there, and nothing listed
/// before it but the one entry just before.
#[test]
fn resumed_listings_follow_the_model() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    fs::create_dir(m.p("d")).unwrap();
    let mut live: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for i in 0..600 {
        let n = format!("e{i}");
        fs::write(m.p(&format!("d/{n}")), b"").unwrap();
        live.insert(n);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound.max(1)
    };
    let mut made = 600;
    for round in 0..60 {
        let mut l = Listing::open(&m.p("d"));
        let listed: Vec<(String, i64)> = std::iter::from_fn(|| l.next()).collect();
        let positions: Vec<i64> = std::iter::once(0)
            .chain(listed.iter().map(|(_, at)| *at))
            .collect();
        let last = *positions.last().unwrap();
        let k = next(listed.len() as u64) as usize;
        let at = match round % 4 {
            0 => positions[k],
            1 => positions[k] + (positions[k + 1] - positions[k]) / 2,
            2 => next(last as u64) as i64,
            _ => last + 1 + next(1 << 40) as i64,
        };
        // Entries come and go before the seek.
        for _ in 0..next(8) {
            let victim = live.iter().nth(next(live.len() as u64) as usize).cloned();
            if let Some(v) = victim {
                fs::remove_file(m.p(&format!("d/{v}"))).unwrap();
                live.remove(&v);
            }
            let n = format!("e{made}");
            made += 1;
            fs::write(m.p(&format!("d/{n}")), b"").unwrap();
            live.insert(n);
        }
        l.seek(at);
        let rest = l.rest();
        let unique: std::collections::HashSet<&String> = rest.iter().collect();
        assert_eq!(unique.len(), rest.len(), "seekdir({at:#x}): a name twice");
        let first = positions.partition_point(|&p| p < at);
        for (j, (name, _)) in listed.iter().enumerate() {
            let shown = unique.contains(name);
            let still = live.contains(name) || name == "." || name == "..";
            if j >= first && still {
                assert!(
                    shown,
                    "seekdir({at:#x}): {name} (entry {j}, from {first}) missing"
                );
            }
            if j + 1 < first {
                assert!(
                    !shown,
                    "seekdir({at:#x}): {name} (entry {j}) is before {first}"
                );
            }
        }
    }
}

/// Issue 56, item 1: a listing resumed at an offset no listing handed out
/// (seekdir to any number below the last offset) goes on from there, at
/// the entry whose position is the first at or after that number or the
/// one before it, through to the end, as on btrfs and ext4.
#[test]
fn directory_listings_resume_at_any_offset() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..4000 {
        fs::write(m.p(&format!("d/f{i}")), b"").unwrap();
        if i % 3 == 0 {
            // Gaps in the indexes, as renames and removals leave.
            fs::rename(m.p(&format!("d/f{i}")), m.p(&format!("d/g{i}"))).unwrap();
        }
    }
    let mut l = Listing::open(&m.p("d"));
    let listed: Vec<(String, i64)> = std::iter::from_fn(|| l.next()).collect();
    assert_eq!(listed.len(), 4002);
    // positions[j]: the offset before entry j.
    let positions: Vec<i64> = std::iter::once(0)
        .chain(listed.iter().map(|(_, at)| *at))
        .collect();
    let end = *positions.last().unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut targets: Vec<i64> = (0..150)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % end as u64) as i64
        })
        .collect();
    // Numbers between two neighbouring offsets, and small ones.
    targets.extend(
        (0..listed.len() - 1)
            .step_by(331)
            .map(|j| positions[j] + (positions[j + 1] - positions[j]) / 2),
    );
    targets.extend([1, 2, 1000, 1 << 31]);
    for at in targets {
        let k = positions.partition_point(|&p| p < at);
        l.seek(at);
        let rest = l.rest();
        let suffix = |from: usize| -> Vec<String> {
            listed[from.min(listed.len())..]
                .iter()
                .map(|(n, _)| n.clone())
                .collect()
        };
        assert!(
            rest == suffix(k) || (k > 0 && rest == suffix(k - 1)),
            "seekdir({at:#x}): {} entries from {:?}, wanted the {} from entry {k}",
            rest.len(),
            rest.first(),
            listed.len() - k.min(listed.len())
        );
    }
}

/// Issue 41, item 2: the fsync log a crash left can be passed over by a
/// read-only mount (`-o ro,nologreplay`, as btrfs) and dropped for good
/// (`canopy rescue zero-log`, as `btrfs rescue zero-log`).
#[test]
fn a_crash_log_can_be_passed_over_or_dropped() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    m.mount("commit=3600");
    fs::write(m.p("committed"), b"old").unwrap();
    canopy_ok(&["sync", m.mnt.to_str().unwrap()], &m.mnt);
    let mut f = fs::File::create(m.p("fsynced")).unwrap();
    f.write_all(&[7u8; 5000]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.kill9();
    let img = m.img.to_str().unwrap().to_string();
    let here = m.img.parent().unwrap().to_path_buf();
    let out = canopy_ok(&["check", &img], &here);
    assert!(out.contains("fsync log pending"), "check: {out}");

    let refused = canopy()
        .args(["mount", "-f", "-o", "nologreplay", &img])
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a writable nologreplay mount");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("nologreplay needs ro"), "{why}");

    m.mount("ro,nologreplay");
    assert_eq!(fs::read(m.p("committed")).unwrap(), b"old");
    assert!(!m.p("fsynced").exists(), "nologreplay replayed the log");
    m.unmount();
    m.mount("ro,rescue=nologreplay");
    assert!(
        !m.p("fsynced").exists(),
        "rescue=nologreplay replayed the log"
    );
    m.unmount();
    // Passed over, not dropped: a read-only mount replays it in memory.
    m.mount("ro");
    assert_eq!(fs::read(m.p("fsynced")).unwrap(), vec![7u8; 5000]);
    m.unmount();

    let out = canopy_ok(&["rescue", "zero-log", &img], &here);
    assert!(out.contains("dropped the fsync log"), "zero-log: {out}");
    assert!(out.contains("1 inode"), "zero-log says what it held: {out}");
    let out = canopy_ok(&["rescue", "zero-log", &img], &here);
    assert!(out.contains("no fsync log"), "zero-log twice: {out}");
    m.mount("");
    assert_eq!(fs::read(m.p("committed")).unwrap(), b"old");
    assert!(!m.p("fsynced").exists(), "the dropped log was replayed");
    m.unmount();
    m.check();
}

/// atime of `f` as stat(2) shows it, in nanoseconds.
fn atime_ns(f: &Path) -> i128 {
    let md = fs::metadata(f).unwrap();
    i128::from(md.atime()) * 1_000_000_000 + i128::from(md.atime_nsec())
}

/// Reads `f` whole through one open, `times` times over.
fn read_through_one_open(f: &Path, times: usize) {
    let mut file = fs::File::open(f).unwrap();
    let mut buf = Vec::new();
    for _ in 0..times {
        file.seek(SeekFrom::Start(0)).unwrap();
        buf.clear();
        file.read_to_end(&mut buf).unwrap();
        assert_eq!(buf, b"ccc\n");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Issue 41, item 4: under strictatime every read gives a new atime,
/// also reads the kernel could serve from its page cache; under relatime
/// a file read again after a change gets one, though its pages stayed
/// cached.
#[test]
fn access_times_follow_the_mount_policy_through_the_cache() {
    if !can_mount() {
        return;
    }
    let pause = || std::thread::sleep(std::time::Duration::from_millis(1100));
    let mut m = Mounted::new();
    m.unmount();
    m.mount("strictatime");
    let f = m.p("f");
    fs::write(&f, b"ccc\n").unwrap();
    pause();
    read_through_one_open(&f, 1);
    let first = atime_ns(&f);
    pause();
    read_through_one_open(&f, 1);
    let second = atime_ns(&f);
    assert!(
        second > first,
        "strictatime: a second open and read kept atime {first}"
    );
    // Within one open, each read again.
    let before = atime_ns(&f);
    read_through_one_open(&f, 3);
    assert!(
        atime_ns(&f) > before,
        "strictatime: reads through one open kept atime"
    );
    m.unmount();

    m.mount("relatime");
    read_through_one_open(&f, 1);
    let read = atime_ns(&f);
    pause();
    read_through_one_open(&f, 1);
    assert_eq!(
        atime_ns(&f),
        read,
        "relatime: a read since the last change updates nothing"
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"ccc\n", 0)
        .unwrap();
    let changed = fs::metadata(&f).unwrap().mtime();
    pause();
    read_through_one_open(&f, 1);
    let after = atime_ns(&f);
    assert!(
        after > read && after / 1_000_000_000 >= i128::from(changed),
        "relatime: the first read after a change (pages cached) kept atime"
    );
    m.unmount();
}

/// Compression through the mount: `-o compress=zstd`, the `compression`
/// property (command and xattr) with inheritance, `canopy filesystem du`
/// in JSON, st_blocks by bytes on disk, and the data intact after a
/// remount.
#[test]
fn compression_through_the_mount() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    m.unmount();
    m.mount("compress=zstd");
    let mnt = m.mnt.clone();
    let text: Vec<u8> = (0..400_000u32)
        .flat_map(|i| format!("entry {i} of the log\n").into_bytes())
        .collect();
    fs::write(m.p("log.txt"), &text).unwrap();
    fs::create_dir(m.p("fast")).unwrap();
    canopy_ok(&["property", "set", "fast", "compression", "lz4"], &mnt);
    assert!(
        canopy_ok(&["property", "get", "fast", "compression"], &mnt).contains("compression=lz4")
    );
    fs::create_dir(m.p("fast/inner")).unwrap();
    fs::write(m.p("fast/inner/log.txt"), &text).unwrap();
    let bad = canopy()
        .args(["property", "set", "fast", "compression", "zlib"])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!bad.status.success(), "zlib is refused");
    canopy_ok(&["sync", "."], &mnt);
    let blocks = fs::metadata(m.p("log.txt")).unwrap().blocks();
    assert!(
        blocks * 512 < text.len() as u64 / 4,
        "st_blocks {blocks} for {} bytes",
        text.len()
    );
    let json = canopy_ok(&["filesystem", "du", "--json", "."], &mnt);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let kinds = report["kinds"].as_array().unwrap();
    let row = |k: &str| kinds.iter().find(|r| r["kind"] == k).cloned();
    let zstd = row("zstd").expect("a zstd row");
    let lz4 = row("lz4").expect("an lz4 row (inherited property)");
    for r in [&zstd, &lz4] {
        assert_eq!(r["uncompressed"].as_u64().unwrap() % 4096, 0);
        assert!(
            r["disk"].as_u64().unwrap() * 3 < r["uncompressed"].as_u64().unwrap(),
            "{r}"
        );
    }
    let table = canopy_ok(&["filesystem", "du", "fast"], &mnt);
    assert!(table.contains("lz4") && table.contains("TOTAL"), "{table}");
    m.unmount();
    m.check();
    m.mount("");
    assert_eq!(fs::read(m.p("log.txt")).unwrap(), text);
    assert_eq!(fs::read(m.p("fast/inner/log.txt")).unwrap(), text);
    m.unmount();
}

/// Issue 56, item 9: `filesystem du` says, as `btrfs filesystem du`, what
/// files reference, what only they hold, and what they share: reflinks
/// and snapshots make bytes shared, each counted once.
#[test]
fn du_shows_exclusive_and_shared_bytes() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let du = |path: &str| -> serde_json::Value {
        canopy_ok(&["sync", "."], &mnt);
        serde_json::from_str(&canopy_ok(&["filesystem", "du", "--json", path], &mnt)).unwrap()
    };
    let field = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    const MIB: u64 = 1 << 20;
    canopy_ok(&["subvolume", "create", "sv"], &mnt);
    fs::write(m.p("sv/a"), common::noise(4 << 20, 1)).unwrap();
    fs::write(m.p("sv/b"), common::noise(2 << 20, 3)).unwrap();
    {
        let src = fs::File::open(m.p("sv/b")).unwrap();
        let dst = fs::File::create(m.p("sv/c")).unwrap();
        assert_eq!(common::mounted::clone_range(&src, &dst, 2 << 20), 2 << 20);
    }
    let v = du("sv");
    assert_eq!(v["total"]["referenced"].as_u64().unwrap(), 8 * MIB);
    assert_eq!(
        (field(&v, "exclusive"), field(&v, "set_shared")),
        (4 * MIB, 2 * MIB)
    );
    let v = du("sv/c");
    assert_eq!(
        (field(&v, "exclusive"), field(&v, "set_shared")),
        (0, 2 * MIB)
    );
    canopy_ok(&["subvolume", "snapshot", "sv", "snap"], &mnt);
    fs::write(m.p("sv/new"), common::noise(1 << 20, 5)).unwrap();
    let v = du("sv");
    assert_eq!(
        (field(&v, "exclusive"), field(&v, "set_shared")),
        (MIB, 6 * MIB)
    );
    let table = canopy_ok(&["filesystem", "du", "sv/new"], &mnt);
    assert!(
        table.contains("Exclusive") && table.contains("Set shared"),
        "{table}"
    );
    m.unmount();
    m.check();
}

/// Issue 56, item 4: `canopy dedupe` makes files that hold the same
/// blocks share them (space comes back, contents stay), leaves alone what
/// differs, and loses nothing a writer writes while it runs.
#[test]
fn dedupe_shares_identical_blocks_and_keeps_concurrent_writes() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("1G");
    let mnt = m.mnt.clone();
    const MIB: usize = 1 << 20;
    let a = common::noise(32 * MIB, 7);
    fs::create_dir(m.p("c")).unwrap();
    // Written, not copied: cp would share them already.
    fs::write(m.p("c/a"), &a).unwrap();
    fs::write(m.p("c/b"), &a).unwrap();
    fs::write(m.p("c/b2"), &a).unwrap();
    let mut shifted = common::noise(MIB, 11);
    shifted.extend_from_slice(&a[..16 * MIB]);
    fs::write(m.p("c/shifted"), &shifted).unwrap();
    fs::write(m.p("c/other"), common::noise(8 * MIB, 13)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    let before = free_blocks(&mnt);
    let dry = canopy_ok(&["dedupe", "-r", "--dry-run", "--json", "c"], &mnt);
    let dry: serde_json::Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["duplicate"].as_u64().unwrap(), 80 * MIB as u64, "{dry}");
    assert_eq!(dry["deduped"].as_u64().unwrap(), 0);
    canopy_ok(&["sync", "."], &mnt);
    assert!(free_blocks(&mnt) <= before + 16, "a dry run shares nothing");

    // A writer rewrites parts of c/b while dedupe runs: a fixed number of
    // writes, paced, so that what they allocate stays small beside what
    // dedupe gives back, however slow the machine.
    let writer = common::mounted::paced_writer(m.p("c/b"), a.clone(), 400, 0, 50);
    for _ in 0..3 {
        let out = canopy_ok(&["dedupe", "-r", "--json", "c"], &mnt);
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(
            r["deduped"].as_u64().unwrap() + r["skipped"].as_u64().unwrap() > 0,
            "{r}"
        );
    }
    let model = writer.join().unwrap();
    assert!(fs::read(m.p("c/b")).unwrap() == model, "c/b lost a write");
    assert!(fs::read(m.p("c/a")).unwrap() == a, "c/a changed");
    assert!(fs::read(m.p("c/b2")).unwrap() == a, "c/b2 changed");
    assert!(
        fs::read(m.p("c/shifted")).unwrap() == shifted,
        "c/shifted changed"
    );
    canopy_ok(&["sync", "."], &mnt);
    let saved = (free_blocks(&mnt) - before) * 4096;
    // c/b2, which nobody writes, gives all its extents back (c/b's stay
    // held where the writer's blocks left them partly in use, as on
    // btrfs); the writer's own blocks take a few MiB.
    assert!(saved >= 24 * MIB as u64, "saved {saved} bytes");
    m.unmount();
    m.check();
    m.mount("");
    assert!(
        fs::read(m.p("c/b")).unwrap() == model,
        "c/b after a remount"
    );
    m.unmount();
}

/// Issue 56, item 3: `canopy filesystem defragment` merges a file's short
/// extents into long ones; what a snapshot and a reflink share stays
/// shared (free space and quota numbers unchanged), a write that lands
/// meanwhile is kept, and the image checks clean (quotas exact).
#[test]
fn defragment_merges_extents_and_keeps_what_is_shared() {
    use std::os::unix::fs::FileExt;
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("1G");
    let mnt = m.mnt.clone();
    const PIECE: u64 = 4096;
    const PIECES: u64 = 4096; // 16 MiB
                              // Compressed extents are left as they are: this test wants plain ones
                              // also in the run that mounts everything with compress-force.
    let out = remount(&m, "remount,compress=no");
    assert!(out.status.success(), "{out:?}");
    canopy_ok(&["quota", "enable", "."], &mnt);
    // Pieces written in a scattered order, fsynced every few: thousands
    // of short extents, as a database's file gets.
    let mut model = vec![0u8; (PIECE * PIECES) as usize];
    {
        let f = fs::File::create(m.p("f")).unwrap();
        f.set_len(PIECE * PIECES).unwrap();
        for n in 0..PIECES {
            let p = (n * 2741) % PIECES;
            let piece = common::noise(PIECE as usize, p + 1);
            f.write_all_at(&piece, p * PIECE).unwrap();
            model[(p * PIECE) as usize..((p + 1) * PIECE) as usize].copy_from_slice(&piece);
            if n % 8 == 7 {
                f.sync_data().unwrap();
            }
        }
    }
    // A reflinked copy (copy_file_range shares) and a snapshot.
    fs::copy(m.p("f"), m.p("g")).unwrap();
    canopy_ok(&["subvolume", "snapshot", ".", "snap"], &mnt);
    canopy_ok(&["sync", "."], &mnt);
    let extents = |name: &str| {
        let out = canopy_ok(&["filesystem", "extents", "--json", name], &mnt);
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        let list = map["extents"].as_array().unwrap().clone();
        // Distinct data extents (items of one extent share its start).
        let starts: std::collections::BTreeSet<u64> = list
            .iter()
            .filter_map(|e| Some(e["physical"].as_u64()? - e["logical"].as_u64()?))
            .collect();
        (list.len(), starts.len())
    };
    let (items_before, _) = extents("f");
    assert!(
        items_before > 1000,
        "only {items_before} extents to begin with"
    );
    let qgroups = || {
        let json = canopy_ok(&["qgroup", "show", "--json", "."], &mnt);
        let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["qgroupid"].clone(),
                    r["referenced"].clone(),
                    r["exclusive"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let (free, groups) = (free_blocks(&mnt), qgroups());

    let out = canopy_ok(
        &["filesystem", "defragment", "-r", "--json", "f", "g", "snap"],
        &mnt,
    );
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["extents_merged"].as_u64().unwrap() > 1000, "{r}");
    canopy_ok(&["sync", "."], &mnt);
    let (items_after, extents_after) = extents("f");
    // 16 MiB in extents of up to 2 MiB; runs end where sharing differs
    // (a few), items where leaves end.
    assert!(extents_after <= 40, "{extents_after} extents after");
    assert!(
        items_after <= items_before / 10,
        "{items_after} items after"
    );
    assert_eq!(extents("snap/f").1, extents_after, "the snapshot follows");
    // Before the reads below, whose access times change the trees.
    assert_eq!(qgroups(), groups, "quota numbers moved");
    assert!(fs::read(m.p("f")).unwrap() == model, "f changed");
    assert!(fs::read(m.p("g")).unwrap() == model, "g changed");
    assert!(fs::read(m.p("snap/f")).unwrap() == model, "snap/f changed");
    // Nothing unshared: the data takes what it took (the trees' blocks
    // may move by a few).
    let now = free_blocks(&mnt);
    assert!(now + 64 >= free, "free blocks {free} -> {now}");
    // Done is not done twice.
    let again = canopy_ok(&["filesystem", "defragment", "--json", "f"], &mnt);
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["extents_merged"].as_u64(), Some(0), "{again}");

    // Far into a sparse file: the holes before it are stepped over, not
    // walked.
    {
        let far = 1u64 << 46;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(m.p("sparse"))
            .unwrap();
        for n in 0..64u64 {
            let p = (n * 37) % 64;
            f.write_all_at(&[p as u8 + 1; PIECE as usize], far + p * PIECE)
                .unwrap();
            f.sync_data().unwrap();
        }
        let out = canopy_ok(&["filesystem", "defragment", "--json", "sparse"], &mnt);
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["extents_merged"].as_u64(), Some(63), "{r}");
        let mut back = vec![0u8; 64 * PIECE as usize];
        f.read_exact_at(&mut back, far).unwrap();
        for p in 0..64usize {
            assert!(back[p * PIECE as usize..(p + 1) * PIECE as usize]
                .iter()
                .all(|&b| b == p as u8 + 1));
        }
    }

    // Fragment it again, then defragment while a writer rewrites parts.
    {
        let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        for n in 0..1024u64 {
            let p = (n * 613) % PIECES;
            let piece = common::noise(PIECE as usize, p + 7);
            f.write_all_at(&piece, p * PIECE).unwrap();
            model[(p * PIECE) as usize..((p + 1) * PIECE) as usize].copy_from_slice(&piece);
            if n % 8 == 7 {
                f.sync_data().unwrap();
            }
        }
    }
    let writer = common::mounted::paced_writer(m.p("f"), model.clone(), 300, 1000, 20);
    for _ in 0..3 {
        canopy_ok(&["filesystem", "defragment", "-q", "f"], &mnt);
    }
    let model = writer.join().unwrap();
    assert!(fs::read(m.p("f")).unwrap() == model, "f lost a write");
    assert!(fs::read(m.p("g")).unwrap() != model, "g follows f");
    m.unmount();
    m.check();
    m.mount("");
    assert!(fs::read(m.p("f")).unwrap() == model, "f after a remount");
    m.unmount();
}

/// Issue 56, item 3's `-c`: `canopy filesystem defragment -c` rewrites a
/// file's data compressed; a snapshot and a reflinked copy follow (the
/// data stays shared, their blocks fall too), what does not compress is
/// left, a second run does nothing, lz4 data can be recompressed with
/// zstd, a `chattr +C` file is left alone, a writer meanwhile loses
/// nothing, and the image checks clean (quotas exact).
#[test]
fn defragment_recompresses_and_keeps_what_is_shared() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("1G");
    let mnt = m.mnt.clone();
    let out = remount(&m, "remount,compress=no");
    assert!(out.status.success(), "{out:?}");
    canopy_ok(&["quota", "enable", "."], &mnt);
    let text: Vec<u8> = (0..400_000u32)
        .flat_map(|i| format!("row {} of ledger {}\n", i % 977, i % 13).into_bytes())
        .collect();
    let noise = common::noise(3 << 20, 56);
    fs::write(m.p("f"), &text).unwrap();
    fs::write(m.p("r"), &noise).unwrap();
    fs::copy(m.p("f"), m.p("g")).unwrap();
    canopy_ok(&["subvolume", "snapshot", ".", "snap"], &mnt);
    canopy_ok(&["sync", "."], &mnt);
    let blocks = |name: &str| fs::metadata(mnt.join(name)).unwrap().blocks();
    let referenced = || {
        let json = canopy_ok(&["qgroup", "show", "--json", "."], &mnt);
        let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["referenced"].as_u64().unwrap())
            .sum::<u64>()
    };
    let (free, refs, f_blocks) = (free_blocks(&mnt), referenced(), blocks("f"));

    let run = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["filesystem", "defragment", "--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&canopy_ok(&all, &mnt)).unwrap()
    };
    let r = run(&["-r", "-clz4", "f", "r"]);
    assert!(r["extents_recompressed"].as_u64().unwrap() >= 4, "{r}");
    assert!(r["extents_incompressible"].as_u64().unwrap() >= 1, "{r}");
    let (before, after) = (
        r["stored_before"].as_u64().unwrap(),
        r["stored_after"].as_u64().unwrap(),
    );
    assert!(after * 3 < before, "{before} bytes stored as {after}");
    // zstd packs what lz4 packed tighter still.
    let r = run(&["-czstd", "f"]);
    assert!(r["extents_recompressed"].as_u64().unwrap() > 0, "{r}");
    // Done is not done twice.
    let r = run(&["-c", "f", "g", "snap/f", "r"]);
    assert_eq!(r["extents_recompressed"].as_u64(), Some(0), "{r}");
    canopy_ok(&["sync", "."], &mnt);

    assert!(fs::read(m.p("f")).unwrap() == text, "f changed");
    assert!(fs::read(m.p("g")).unwrap() == text, "g changed");
    assert!(fs::read(m.p("snap/f")).unwrap() == text, "snap/f changed");
    assert!(fs::read(m.p("r")).unwrap() == noise, "r changed");
    // Every holder follows: the snapshot's and the copy's extents are the
    // file's, compressed.
    let extents = |name: &str| {
        let out = canopy_ok(&["filesystem", "extents", "--json", name], &mnt);
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        map["extents"].as_array().unwrap().clone()
    };
    let f_extents = extents("f");
    assert!(
        f_extents
            .iter()
            .all(|e| e["flags"].to_string().contains("zstd")),
        "{f_extents:?}"
    );
    assert_eq!(extents("snap/f"), f_extents, "the snapshot follows");
    assert_eq!(extents("g"), f_extents, "the copy follows");
    assert!(
        blocks("f") * 3 < f_blocks,
        "blocks {f_blocks} -> {}",
        blocks("f")
    );
    assert_eq!(blocks("snap/f"), blocks("f"));
    // The old extents are given back, and every quota group counts less.
    let now = free_blocks(&mnt);
    assert!(
        (now - free) * 4096 > text.len() as u64 / 2,
        "free blocks {free} -> {now}"
    );
    assert!(referenced() < refs, "referenced {refs} -> {}", referenced());

    // A chattr +C file keeps its plain data.
    let nocow = m.p("nocow");
    fs::File::create(&nocow).unwrap();
    const FS_NOCOW_FL: u32 = 0x0080_0000;
    common::mounted::set_file_flags(&nocow, FS_NOCOW_FL).unwrap();
    fs::write(&nocow, &text).unwrap();
    let r = run(&["-c", "nocow"]);
    assert_eq!(r["extents_recompressed"].as_u64(), Some(0), "{r}");
    assert!(fs::read(&nocow).unwrap() == text);

    // A writer meanwhile: its writes are kept.
    fs::write(m.p("w"), &text).unwrap();
    let writer = common::mounted::paced_writer(m.p("w"), text.clone(), 300, 1000, 20);
    for codec in ["-clz4", "-czstd", "-clz4"] {
        run(&[codec, "w"]);
    }
    let model = writer.join().unwrap();
    assert!(fs::read(m.p("w")).unwrap() == model, "w lost a write");
    m.unmount();
    m.check();
    m.mount("");
    assert!(fs::read(m.p("w")).unwrap() == model, "w after a remount");
    assert!(fs::read(m.p("snap/f")).unwrap() == text);
    m.unmount();
}

/// Issue 57, item 2's `canopy filesystem trim`: space freed by a
/// deletion goes back to the host once the deletion is committed (not
/// before: the last commit still names it), the image file's allocated
/// blocks fall to about what is in use, and everything kept reads back
/// and checks clean.
#[test]
fn trim_gives_freed_space_back_to_the_image_file() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::with_size("1G");
    let mnt = m.mnt.clone();
    let Ok(true) = fs::metadata(&m.img).map(|md| md.is_file()) else {
        // On RBD (CANOPY_TEST_RBD) the image is no file to look at.
        return;
    };
    // The trim alone gives space back (freed_space_goes_back_... tests
    // discarding as space is freed); only the test's own syncs commit.
    m.unmount();
    m.mount("nodiscard,commit=3600");
    let allocated = || fs::metadata(&m.img).unwrap().blocks() * 512;
    let keep = common::noise(8 << 20, 57);
    fs::write(m.p("keep"), &keep).unwrap();
    fs::write(m.p("big"), common::noise(300 << 20, 58)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    let full = allocated();
    assert!(full > 300 << 20, "allocated {full}");

    // Deleted but not committed: the last commit still holds the file,
    // so its space is not discarded.
    fs::remove_file(m.p("big")).unwrap();
    let out = canopy_ok(&["filesystem", "trim", "--json", "."], &mnt);
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["supported"], true, "{t}");
    assert!(allocated() > 290 << 20, "discarded before the commit");
    assert!(fs::read(m.p("keep")).unwrap() == keep);

    canopy_ok(&["sync", "."], &mnt);
    let out = canopy_ok(&["filesystem", "trim", "-v", "-m", "64K", "."], &mnt);
    assert!(out.contains("trimmed"), "{out}");
    let after = allocated();
    // statfs counts 4 KiB blocks.
    let used = common::mounted::used_bytes(&mnt);
    // Within 5% (and a few MiB of tree blocks and headers) of what is used.
    assert!(
        after <= used + used / 20 + (4 << 20),
        "allocated {after} for {used} used (was {full})"
    );
    assert!(fs::read(m.p("keep")).unwrap() == keep);
    m.unmount();
    m.check();
    m.mount("");
    assert!(
        fs::read(m.p("keep")).unwrap() == keep,
        "keep after a remount"
    );
    // Data written into trimmed space reads back.
    fs::write(m.p("again"), common::noise(100 << 20, 59)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert!(fs::read(m.p("again")).unwrap() == common::noise(100 << 20, 59));
    m.unmount();
    m.check();
}

/// Issue 57, item 2: with `discard=async` (the default) a deleted file's
/// space goes back to the image file once the commit that frees it is
/// durable, without a trim, and never before; with `nodiscard` it stays
/// until a trim; a remount turns discarding on and off.
#[test]
fn freed_space_goes_back_to_the_image_file_without_a_trim() {
    if !can_mount() {
        return;
    }
    // The periodic commit (every 5 s by default) would end the 4-second
    // "deleted, not yet committed" windows below at a moment of its
    // choosing: only the test's own syncs commit here.
    // An RBD image is no file to look at.
    if common::mounted::rbd_conf().is_some() {
        return;
    }
    let (dir, img, mnt) = common::mounted::fresh_image("1G");
    let mut m = Mounted::over(dir, img, mnt, "commit=3600");
    let mnt = m.mnt.clone();
    let img = m.img.clone();
    let allocated = move || fs::metadata(&img).unwrap().blocks() * 512;
    let used = common::mounted::used_bytes;
    // Polls for up to 15 s (async discard waits 2 s, then works in
    // batches from the mount's loop).
    let falls_to_used = |mnt: &Path| {
        (0..150).any(|_| {
            let (a, u) = (allocated(), used(mnt));
            if a <= u + u / 20 + (4 << 20) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
            false
        })
    };
    let keep = common::noise(8 << 20, 60);
    fs::write(m.p("keep"), &keep).unwrap();
    fs::write(m.p("big"), common::noise(200 << 20, 61)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert!(allocated() > 200 << 20, "allocated {}", allocated());

    // Deleted, not committed: the last commit still holds the file.
    fs::remove_file(m.p("big")).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert!(allocated() > 190 << 20, "discarded before the commit");
    canopy_ok(&["sync", "."], &mnt);
    assert!(
        falls_to_used(&mnt),
        "allocated {} for {} used",
        allocated(),
        used(&mnt)
    );
    assert!(fs::read(m.p("keep")).unwrap() == keep);

    // nodiscard: the space stays until a trim.
    let out = remount(&m, "remount,nodiscard");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.p("big2"), common::noise(100 << 20, 62)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    fs::remove_file(m.p("big2")).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    std::thread::sleep(Duration::from_secs(4));
    assert!(allocated() > 100 << 20, "discarded under nodiscard");
    canopy_ok(&["filesystem", "trim", "."], &mnt);
    assert!(falls_to_used(&mnt), "after a trim: {}", allocated());

    // discard=sync: discarded as the commit ends.
    let out = remount(&m, "remount,discard");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.p("big3"), common::noise(100 << 20, 63)).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    fs::remove_file(m.p("big3")).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    let (a, u) = (allocated(), used(&mnt));
    assert!(
        a <= u + u / 20 + (4 << 20),
        "discard=sync: {a} for {u} used"
    );
    let out = remount(&m, "remount,discard=later");
    assert!(!out.status.success(), "a bad discard option is refused");

    // Space discarded and taken again holds what is written there.
    let again = common::noise(150 << 20, 64);
    fs::write(m.p("again"), &again).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    m.unmount();
    m.check();
    m.mount("");
    assert!(fs::read(m.p("keep")).unwrap() == keep);
    assert!(fs::read(m.p("again")).unwrap() == again);
    m.unmount();
}

/// Issue 57: `discard=async` holds back the space the fsync log freed
/// while fsyncs keep coming (the next transaction's log takes it again,
/// and on a sparse image a write to a punched hole makes the host
/// allocate inside the fsync), and gives it back at unmount.
#[test]
fn the_log_space_is_held_while_fsyncs_come_and_given_back_at_unmount() {
    if !can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let (dir, img, mnt) = common::mounted::fresh_image("1G");
    let mut m = Mounted::over(dir, img, mnt, "commit=3600");
    let img = m.img.clone();
    let allocated = move || fs::metadata(&img).unwrap().blocks() * 512;
    // A database's journal: 8 KiB appended and fsynced, 3,000 times.
    let mut wal = fs::File::create(m.p("wal")).unwrap();
    for i in 0..3000u64 {
        wal.write_all(&common::noise(8192, i)).unwrap();
        wal.sync_data().unwrap();
    }
    drop(wal);
    canopy_ok(&["sync", "."], &m.mnt);
    canopy_ok(&["sync", "."], &m.mnt);
    // The log's copies of its leaves, freed by that commit: held.
    std::thread::sleep(Duration::from_secs(3));
    let used = common::mounted::used_bytes(&m.mnt);
    let held = allocated();
    assert!(
        held > used + (32 << 20),
        "log space discarded while fsyncs come: {held} allocated for {used} used"
    );
    m.unmount();
    let after = allocated();
    assert!(
        after <= used + used / 20 + (8 << 20),
        "after the unmount: {after} allocated for {used} used ({held} before)"
    );
    m.check();
}

/// Issue 57, item 3: `canopy filesystem freeze` commits and holds every
/// write (readers go on) until `thaw`, so a copy of the image taken
/// meanwhile is a clean filesystem with everything written before; a
/// freeze nobody thaws ends at its timeout; unmounting a frozen mount
/// loses nothing.
#[test]
fn freeze_holds_writes_until_the_thaw_and_a_copy_meanwhile_is_clean() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let before = common::noise(3 << 20, 70);
    fs::write(m.p("before"), &before).unwrap();
    canopy_ok(&["filesystem", "freeze", "--timeout", "60", "."], &mnt);
    let second = canopy()
        .args(["filesystem", "freeze", "."])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!second.status.success(), "frozen twice");
    assert!(String::from_utf8_lossy(&second.stderr).contains("frozen already"));
    // A writer that fsyncs waits; a reader does not.
    let during = common::noise(40 << 20, 71);
    let (path, data) = (m.p("during"), during.clone());
    let writer = std::thread::spawn(move || {
        common::mounted::write_synced(&path, &data).unwrap();
        Instant::now()
    });
    assert!(
        fs::read(m.p("before")).unwrap() == before,
        "a read while frozen"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(!writer.is_finished(), "an fsync went through a freeze");
    let copy = m.img.with_extension("copy");
    let copied = fs::metadata(&m.img).is_ok_and(|md| md.is_file());
    if copied {
        fs::copy(&m.img, &copy).unwrap();
    }
    let thawed = Instant::now();
    canopy_ok(&["filesystem", "thaw", "."], &mnt);
    assert!(
        writer.join().unwrap() >= thawed,
        "the fsync ended before the thaw"
    );
    let again = canopy()
        .args(["filesystem", "thaw", "."])
        .current_dir(&mnt)
        .output()
        .unwrap();
    assert!(!again.status.success(), "thawed twice");
    assert!(fs::read(m.p("during")).unwrap() == during);

    // A freeze nobody thaws ends by itself.
    canopy_ok(&["filesystem", "freeze", "--timeout", "2", "."], &mnt);
    let t = Instant::now();
    common::mounted::write_synced(&m.p("late"), b"after the timeout").unwrap();
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");

    // Unmounted while frozen: the held writes land, and the daemon ends
    // then, not when the freeze would have timed out (it once waited out
    // all 300 s in a commit held at the freeze).
    canopy_ok(&["filesystem", "freeze", "--timeout", "300", "."], &mnt);
    let (path, data) = (m.p("held"), common::noise(1 << 20, 72));
    let held = std::thread::spawn(move || fs::write(&path, &data));
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    m.unmount();
    let ended = t.elapsed();
    assert!(ended < Duration::from_secs(120), "{ended:?}");
    held.join().unwrap().unwrap();
    m.check();
    m.mount("");
    assert!(fs::read(m.p("held")).unwrap() == common::noise(1 << 20, 72));
    assert_eq!(fs::read(m.p("late")).unwrap(), b"after the timeout");
    m.unmount();

    if copied {
        // The copy taken while frozen: the commit the freeze made.
        let check = canopy().arg("check").arg(&copy).output().unwrap();
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stdout)
        );
        let img = std::mem::replace(&mut m.img, copy);
        m.mount("ro");
        assert!(fs::read(m.p("before")).unwrap() == before);
        assert!(
            !m.p("during").exists(),
            "a write held by the freeze is in the copy"
        );
        m.unmount();
        m.img = img;
    }
}

/// Issue 56, item 8: `-o remount,compress=...` changes how later writes
/// compress, and leaves the kernel's flags alone; with other options it
/// changes both.
#[test]
fn remount_changes_compression() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new();
    let mnt = m.mnt.clone();
    let text: Vec<u8> = (0..100_000u32)
        .flat_map(|i| format!("line {i} of the file\n").into_bytes())
        .collect();
    let on_disk = |name: &str| {
        canopy_ok(&["sync", "."], &mnt);
        fs::metadata(mnt.join(name)).unwrap().blocks() * 512
    };
    // From no compression, whatever the test run mounts with.
    let out = remount(&m, "remount,compress=no");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.p("plain"), &text).unwrap();
    assert!(
        on_disk("plain") >= text.len() as u64,
        "no compression at first"
    );
    let out = remount(&m, "remount,compress=zstd:5");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.p("zstd"), &text).unwrap();
    assert!(
        on_disk("zstd") * 4 < text.len() as u64,
        "compressed after the remount"
    );
    let out = remount(&m, "remount,ro,compress=no");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fs::write(m.p("refused"), b"x").is_err(), "read-only now");
    let out = remount(&m, "remount,rw");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The daemon notices the remount within about a second.
    let writable = (0..100).any(|_| {
        let ok = fs::write(m.p("none"), &text).is_ok();
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    });
    assert!(writable, "writable again after remount,rw");
    assert!(on_disk("none") >= text.len() as u64, "compress=no held");
    let bad = remount(&m, "remount,compress=zlib");
    assert!(!bad.status.success(), "zlib is refused");
    m.unmount();
    m.check();
}

/// Another image mounted where one was just unmounted, while the first
/// daemon may still be shutting down: commands reach the new mount, before
/// and after the old daemon exits (it used to remove the new daemon's
/// control socket on its way out).
#[test]
fn a_mount_right_after_an_unmount_answers_commands() {
    if !can_mount() {
        return;
    }
    /// A second daemon on the same mount point, unmounted and killed if
    /// the test fails before it does.
    struct Second(Option<std::process::Child>, std::path::PathBuf);
    impl Drop for Second {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = Command::new("umount").arg("-l").arg(&self.1).status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut first = Mounted::new();
    let (_dir, img, _) = common::mounted::fresh_image("256M");
    for round in 0..3 {
        let old = first.umount_returning_daemon();
        let child = canopy()
            .args(["mount", "-f", "--notify-ready"])
            .arg(&img)
            .arg(&first.mnt)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut new = Second(Some(child), first.mnt.clone());
        let out = new.0.as_mut().and_then(|c| c.stdout.take()).unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).unwrap();
        assert_eq!(line.trim(), "canopy-ready");
        let mut old = old;
        assert!(old.wait().unwrap().success());
        canopy_ok(&["sync", "."], &first.mnt);
        canopy_ok(&["subvolume", "list", "."], &first.mnt);
        assert!(common::mounted::umount(&first.mnt), "round {round}");
        let st = new.0.take().unwrap().wait().unwrap();
        assert!(st.success());
        first.mount("");
    }
}

/// `chattr +C` (btrfs's nodatacow): set on a directory or an empty file
/// only, inherited by what a directory gets, exclusive of `+c`. A file
/// with it overwrites data it holds alone where the data lies (the
/// device addresses stay), writes once to new places where a snapshot
/// shares its data (and in place again after), writes into its own
/// preallocated space in place, copies instead of sharing with a file
/// that keeps checksums, and reads, checks and scrubs clean without
/// checksums.
#[test]
fn no_copy_on_write_files_overwrite_in_place() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    if !can_mount() {
        return;
    }
    use common::mounted::{file_flags as flags_of, set_file_flags};
    const NOCOW: u32 = 0x0080_0000;
    const COMPR: u32 = 0x4;
    let set_flags =
        |p: &std::path::Path, fl: u32| set_file_flags(p, fl).map_err(|e| e.raw_os_error());
    let mut m = Mounted::with_size("1G");
    let mnt = m.mnt.clone();
    let out = remount(&m, "remount,compress=no");
    assert!(out.status.success(), "{out:?}");

    // Who may take the flag.
    fs::write(m.p("full"), b"data").unwrap();
    set_flags(&m.p("full"), NOCOW).unwrap();
    assert_eq!(
        flags_of(&m.p("full")) & NOCOW,
        0,
        "a file with data took +C"
    );
    fs::create_dir(m.p("d")).unwrap();
    set_flags(&m.p("d"), NOCOW).unwrap();
    assert_eq!(set_flags(&m.p("d"), NOCOW | COMPR), Err(Some(libc::EINVAL)));
    fs::create_dir(m.p("d/sub")).unwrap();
    fs::write(m.p("d/sub/x"), b"").unwrap();
    assert_ne!(
        flags_of(&m.p("d/sub")) & NOCOW,
        0,
        "a directory did not inherit +C"
    );
    assert_ne!(
        flags_of(&m.p("d/sub/x")) & NOCOW,
        0,
        "a file did not inherit +C"
    );

    // 4 MiB written once, then pieces overwritten with fsync.
    const PIECE: usize = 4096;
    const PIECES: usize = 1024;
    let mut model = common::noise(PIECE * PIECES, 7);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("d/db"))
        .unwrap();
    f.write_all_at(&model, 0).unwrap();
    f.sync_all().unwrap();
    canopy_ok(&["sync", "."], &mnt);
    let places = |name: &str| {
        let out = canopy_ok(&["filesystem", "extents", "--json", name], &mnt);
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        // Device address of every piece.
        let mut at = vec![0u64; PIECES];
        for e in map["extents"].as_array().unwrap() {
            let (logical, len) = (
                e["logical"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
            );
            let physical = e["physical"].as_u64().unwrap();
            for p in (logical / PIECE as u64)..((logical + len) / PIECE as u64) {
                at[p as usize] = physical + p * PIECE as u64 - logical;
            }
        }
        at
    };
    let before = places("d/db");
    let overwrite = |f: &fs::File, model: &mut Vec<u8>, seed: u64, pieces: &[usize]| {
        for &p in pieces {
            let piece = common::noise(PIECE, seed + p as u64);
            f.write_all_at(&piece, (p * PIECE) as u64).unwrap();
            model[p * PIECE..(p + 1) * PIECE].copy_from_slice(&piece);
            f.sync_data().unwrap();
        }
    };
    let scattered: Vec<usize> = (0..64).map(|n| (n * 389) % PIECES).collect();
    overwrite(&f, &mut model, 100, &scattered);
    // Half a piece, so the flush reads the other half back first.
    f.write_all_at(&[0xAB; 100], 5 * PIECE as u64 + 10).unwrap();
    model[5 * PIECE + 10..5 * PIECE + 110].fill(0xAB);
    f.sync_data().unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert_eq!(places("d/db"), before, "an overwrite moved data");
    assert!(fs::read(m.p("d/db")).unwrap() == model, "d/db reads wrong");

    // A snapshot shares everything: the next write of a piece goes to a
    // new place once, and stays there after.
    canopy_ok(&["subvolume", "snapshot", ".", "snap"], &mnt);
    let frozen = model.clone();
    overwrite(&f, &mut model, 200, &[3, 700]);
    canopy_ok(&["sync", "."], &mnt);
    let moved = places("d/db");
    assert_ne!(
        moved[3], before[3],
        "a write into a snapshot's data stayed in place"
    );
    assert_ne!(moved[700], before[700]);
    assert_eq!(moved[4], before[4]);
    overwrite(&f, &mut model, 300, &[3, 700]);
    canopy_ok(&["sync", "."], &mnt);
    assert_eq!(
        places("d/db"),
        moved,
        "a second write did not stay in place"
    );
    assert!(fs::read(m.p("d/db")).unwrap() == model, "d/db reads wrong");
    assert!(
        fs::read(m.p("snap/d/db")).unwrap() == frozen,
        "the snapshot changed"
    );

    // Preallocated space is written where it lies.
    let pre = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("d/pre"))
        .unwrap();
    assert_eq!(
        unsafe { libc::fallocate(pre.as_raw_fd(), 0, 0, 1 << 20) },
        0
    );
    canopy_ok(&["sync", "."], &mnt);
    let reserved = places("d/pre");
    pre.write_all_at(&[7u8; 3 * PIECE], 8 * PIECE as u64)
        .unwrap();
    pre.sync_data().unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert_eq!(&places("d/pre")[..PIECES / 4], &reserved[..PIECES / 4]);
    // One write over written and preallocated space at once, its edges
    // inside sectors: a place of each kind.
    pre.write_all_at(&[9u8; 2 * PIECE + 300], 10 * PIECE as u64 + 100)
        .unwrap();
    pre.sync_data().unwrap();
    canopy_ok(&["sync", "."], &mnt);
    assert_eq!(&places("d/pre")[..PIECES / 4], &reserved[..PIECES / 4]);
    let mut want = vec![0u8; 1 << 20];
    want[8 * PIECE..11 * PIECE].fill(7);
    want[10 * PIECE + 100..12 * PIECE + 400].fill(9);
    assert!(fs::read(m.p("d/pre")).unwrap() == want, "d/pre reads wrong");

    // Copied, not shared, into a file that keeps checksums.
    fs::copy(m.p("d/db"), m.p("copy")).unwrap();
    canopy_ok(&["sync", "."], &mnt);
    let copied = places("copy");
    assert!(
        copied.iter().all(|p| !moved.contains(p)),
        "a file with checksums shares a +C file's data"
    );
    drop((f, pre));
    m.unmount();
    drop_caches();
    m.check();
    let out = canopy()
        .args(["check", "--check-data-csum"])
        .arg(&m.img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    m.mount("");
    assert!(
        fs::read(m.p("d/db")).unwrap() == model,
        "d/db reads wrong after a remount"
    );
    assert!(fs::read(m.p("snap/d/db")).unwrap() == frozen);
    let out = canopy_ok(&["scrub", "--json", "."], &mnt);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["unsummed_extents"].as_array().unwrap().is_empty(), "{r}");
    assert!(r["bad_data_sectors"].as_array().unwrap().is_empty(), "{r}");
}
