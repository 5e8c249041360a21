//! `canopy send` and `canopy receive` through real mounts: chains of
//! snapshots over random changes sent whole and incrementally and
//! received on another filesystem, compared entry by entry (names,
//! contents, holes, modes, owners, times, xattrs, ACLs, hard links,
//! special files); the rename orderings incremental sends must get
//! right; and streams that are cut, damaged or hostile.

mod common;

use common::mounted::{can_mount, canopy, canopy_ok, Mounted};
use common::tree::{assert_same, Compare};
use common::Rng;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// A read-only snapshot of the mount's top level as `name`.
fn snap(m: &Mounted, name: &str) -> PathBuf {
    canopy_ok(&["subvolume", "snapshot", "-r", ".", name], &m.mnt);
    m.p(name)
}

/// Sends `snapshot` (incrementally from `parent`) into a file.
fn send(m: &Mounted, snapshot: &str, parent: Option<&str>, proto: &str) -> PathBuf {
    let out = m._dir.path().join(format!("{snapshot}.stream"));
    let mut args = vec!["send", "-q", "--proto", proto, "-f"];
    let out_s = out.to_str().unwrap().to_string();
    args.push(&out_s);
    if let Some(p) = parent {
        args.extend(["-p", p]);
    }
    args.push(snapshot);
    canopy_ok(&args, &m.mnt);
    out
}

fn receive(dir: &Path, stream: &Path) -> std::process::Output {
    canopy()
        .args(["receive", "-q", "-f"])
        .arg(stream)
        .arg(dir)
        .output()
        .unwrap()
}

fn receive_ok(dir: &Path, stream: &Path) {
    let out = receive(dir, stream);
    assert!(
        out.status.success(),
        "receive {}: {}",
        stream.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An access ACL granting user 1000 read (the kernel's xattr form).
fn acl_bytes() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid strings and buffer.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {name} on {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// Random changes under `root/w`, as the exerciser makes them: files
/// made, written (sparse too), truncated, cloned, linked, renamed over
/// others, deleted; directories made, moved and removed; symlinks, fifos,
/// devices; modes, owners, xattrs and ACLs.
fn churn(root: &Path, rng: &mut Rng, ops: usize) {
    let base = root.join("w");
    fs::create_dir_all(&base).unwrap();
    for _ in 0..ops {
        let all = entries(&base);
        let dirs: Vec<&PathBuf> = all.iter().filter(|p| is_dir(p)).collect();
        let dir = match dirs.is_empty() || rng.below(4) == 0 {
            true => base.clone(),
            false => dirs[rng.below(dirs.len() as u64) as usize].clone(),
        };
        let new = dir.join(format!("n{}", rng.below(40)));
        let some = (!all.is_empty()).then(|| all[rng.below(all.len() as u64) as usize].clone());
        change_one(rng, &new, some);
    }
}

fn is_dir(p: &Path) -> bool {
    p.is_dir() && !p.is_symlink()
}

fn is_file(p: &Path) -> bool {
    p.is_file() && !p.is_symlink()
}

/// One random change: `new` is a name that may exist, `some` an entry.
fn change_one(rng: &mut Rng, new: &Path, some: Option<PathBuf>) {
    // Opening a fifo for writing would wait for a reader forever.
    let plain = new.symlink_metadata().map_or(true, |m| m.is_file());
    let file = some.clone().filter(|p| is_file(p));
    let op = rng.below(14);
    match (op, some) {
        (0 | 1, _) if plain => {
            let len = rng.below(300_000) as usize;
            let _ = fs::write(new, common::noise(len, rng.next()));
        }
        (2, _) if plain => write_at(new, rng),
        (3, _) => {
            if let Some(p) = file {
                let f = fs::OpenOptions::new().write(true).open(&p);
                let _ = f.and_then(|f| f.set_len(rng.below(200_000)));
            }
        }
        (4, _) => drop(fs::create_dir(new)),
        (5, Some(p)) => drop(fs::rename(&p, new)),
        (6, _) => drop(file.map(|p| fs::hard_link(&p, new))),
        (7, Some(p)) if is_dir(&p) => drop(fs::remove_dir(&p)),
        (7, Some(p)) => drop(fs::remove_file(&p)),
        (8, _) => drop(symlink(format!("target-{}", rng.below(9)), new)),
        (9, _) => special(new, rng),
        (10, Some(p)) if !p.is_symlink() => mode_and_owner(&p, rng),
        (11, Some(p)) if is_file(&p) || is_dir(&p) => match rng.below(3) {
            0 => setxattr(&p, "system.posix_acl_access", &acl_bytes()),
            _ => setxattr(
                &p,
                &format!("user.k{}", rng.below(3)),
                &common::noise(rng.below(200) as usize, rng.next()),
            ),
        },
        (12, _) if plain => {
            if let Some(p) = file {
                reflink(&p, new);
            }
        }
        (13, _) => {
            if let Some(p) = file {
                punch(&p, rng);
            }
        }
        _ => {}
    }
}

fn write_at(p: &Path, rng: &mut Rng) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p);
    if let Ok(f) = f {
        let _ = f.write_at(&common::noise(5000, rng.next()), rng.below(4 << 20));
    }
}

fn special(p: &Path, rng: &mut Rng) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let modes = [
        libc::S_IFIFO | 0o640,
        libc::S_IFCHR | 0o600,
        libc::S_IFSOCK | 0o644,
    ];
    // SAFETY: a valid path.
    unsafe {
        libc::mknod(
            c.as_ptr(),
            modes[rng.below(3) as usize],
            libc::makedev(1, 7),
        )
    };
}

fn mode_and_owner(p: &Path, rng: &mut Rng) {
    let mode = [0o600, 0o755, 0o4755, 0o2750, 0o1777][rng.below(5) as usize];
    let _ = fs::set_permissions(p, fs::Permissions::from_mode(mode));
    let (uid, gid) = (rng.below(3) as u32 * 1000, rng.below(3) as u32 * 100);
    let _ = std::os::unix::fs::lchown(p, Some(uid), Some(gid));
}

/// A copy that shares the extents (copy_file_range: Canopy reflinks);
/// the bytes copied, or -1.
fn reflink(from: &Path, to: &Path) -> isize {
    let src = fs::File::open(from).unwrap();
    let dst = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(to);
    let Ok(dst) = dst else { return -1 };
    let len = src.metadata().unwrap().len();
    common::mounted::clone_range(&src, &dst, len)
}

fn punch(p: &Path, rng: &mut Rng) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = fs::OpenOptions::new().write(true).open(p) {
        let (off, len) = (
            rng.below(100) as i64 * 4096,
            rng.below(20) as i64 * 4096 + 4096,
        );
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: a descriptor we hold.
        unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) };
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.clone());
        if p.is_dir() && !p.is_symlink() {
            out.extend(entries(&p));
        }
    }
    out
}

/// A chain of five snapshots over random changes, sent (first whole,
/// then each from the one before) and received on another filesystem:
/// each received snapshot equals its source.
fn chain(proto: &str, seed: u64) {
    if !can_mount() {
        return;
    }
    let src = Mounted::with_size("1G");
    let dst = Mounted::with_size("1G");
    let mut rng = Rng(seed);
    let mut prev: Option<String> = None;
    for i in 1..=5 {
        churn(&src.mnt, &mut rng, 120);
        let name = format!("s{i}");
        snap(&src, &name);
        let stream = send(&src, &name, prev.as_deref(), proto);
        receive_ok(&dst.mnt, &stream);
        let how = Compare {
            ignore_holes: proto == "1" && i > 1,
        };
        if std::env::var("DEBUG_SEND").is_ok() {
            let keep = format!("/tmp/dbg-{seed:x}-{name}.stream");
            let _ = fs::copy(&stream, keep);
        }
        let compared = assert_same(&src.p(&name), &dst.p(&name), how);
        assert!(compared > 10 * i, "only {compared} entries in {name}");
        prev = Some(name);
    }
    let list = canopy_ok(&["subvolume", "list", "-R", "."], &dst.mnt);
    assert_eq!(list.matches("(readonly)").count(), 5, "{list}");
    drop(dst);
}

#[test]
fn chains_of_snapshots_round_trip_in_version_2() {
    // CANOPY_SEND_SEEDS=N runs N more chains (a soak).
    for seed in [0x5e_4d_00_01, 0x5e_4d_00_03]
        .into_iter()
        .chain(seeds(0x5e_4d_00_04))
    {
        chain("2", seed);
    }
}

#[test]
fn chains_of_snapshots_round_trip_in_version_1() {
    for seed in seeds(0x5e_4d_00_02) {
        chain("1", seed);
    }
}

/// Builds `before` in a fresh mount, snapshots it, applies `after`,
/// snapshots again, sends both (the second incrementally) and receives
/// them elsewhere: the received second snapshot must equal the source.
fn incremental_case(before: impl Fn(&Path), after: impl Fn(&Path)) {
    if !can_mount() {
        return;
    }
    let src = Mounted::with_size("256M");
    let dst = Mounted::with_size("256M");
    before(&src.mnt);
    snap(&src, "snap_a");
    after(&src.mnt);
    snap(&src, "snap_b");
    let full = send(&src, "snap_a", None, "2");
    let incremental = send(&src, "snap_b", Some("snap_a"), "2");
    receive_ok(&dst.mnt, &full);
    receive_ok(&dst.mnt, &incremental);
    assert_same(&src.p("snap_b"), &dst.p("snap_b"), Compare::default());
    assert_same(&src.p("snap_a"), &dst.p("snap_a"), Compare::default());
    // The same streams through kernel btrfs's receive.
    if let Some(b) = Btrfs::new() {
        for stream in [&full, &incremental] {
            b.run(&["receive", "-f", stream.to_str().unwrap(), "."]);
        }
        let how = Compare { ignore_holes: true };
        assert_same(&src.p("snap_b"), &b.mnt.join("snap_b"), how);
    }
}

#[test]
fn a_directory_renamed_over_a_name_still_in_use() {
    incremental_case(
        |m| {
            fs::create_dir_all(m.join("A/in_a")).unwrap();
            fs::create_dir_all(m.join("B/in_b")).unwrap();
        },
        |m| {
            fs::rename(m.join("B"), m.join("D")).unwrap();
            fs::rename(m.join("A"), m.join("B")).unwrap();
        },
    );
}

#[test]
fn swapped_names_of_files_and_of_directories() {
    incremental_case(
        |m| {
            fs::write(m.join("x"), b"x").unwrap();
            fs::write(m.join("y"), b"yy").unwrap();
            fs::create_dir_all(m.join("p/q")).unwrap();
            fs::create_dir_all(m.join("r/s")).unwrap();
        },
        |m| {
            fs::rename(m.join("x"), m.join("t")).unwrap();
            fs::rename(m.join("y"), m.join("x")).unwrap();
            fs::rename(m.join("t"), m.join("y")).unwrap();
            fs::rename(m.join("p"), m.join("t")).unwrap();
            fs::rename(m.join("r"), m.join("p")).unwrap();
            fs::rename(m.join("t"), m.join("r")).unwrap();
        },
    );
}

#[test]
fn a_directory_moved_into_its_own_former_child() {
    incremental_case(
        |m| {
            fs::create_dir_all(m.join("a/b/c")).unwrap();
            fs::write(m.join("a/b/c/f"), b"f").unwrap();
        },
        |m| {
            fs::rename(m.join("a/b"), m.join("b")).unwrap();
            fs::rename(m.join("a"), m.join("b/c/a")).unwrap();
        },
    );
}

#[test]
fn a_file_replaced_by_a_directory_and_hard_links_moved_away() {
    incremental_case(
        |m| {
            fs::write(m.join("n"), b"file").unwrap();
            fs::create_dir(m.join("d")).unwrap();
            fs::write(m.join("d/h"), b"linked").unwrap();
            fs::hard_link(m.join("d/h"), m.join("h2")).unwrap();
        },
        |m| {
            fs::remove_file(m.join("n")).unwrap();
            fs::create_dir(m.join("n")).unwrap();
            fs::rename(m.join("d/h"), m.join("n/h")).unwrap();
            fs::remove_file(m.join("h2")).unwrap();
            fs::remove_dir(m.join("d")).unwrap();
        },
    );
}

/// A stream made here, command by command.
fn crafted(dir: &Path, name: &str, cmds: &[canopy::stream::Command]) -> PathBuf {
    let path = dir.join(name);
    let f = fs::File::create(&path).unwrap();
    let mut w = canopy::stream::Writer::new(f, 2).unwrap();
    for c in cmds {
        w.put(c).unwrap();
    }
    w.flush().unwrap();
    path
}

/// The receive fails with a message containing `what`, and leaves no
/// subvolume and nothing else behind.
fn refused(m: &Mounted, stream: &Path, what: &str) {
    let dir = m.p("in");
    fs::create_dir_all(&dir).unwrap();
    let out = receive(&dir, stream);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "receive of {} succeeded",
        stream.display()
    );
    assert!(err.contains(what), "expected {what:?} in: {err}");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "left behind: {err}");
    let list = canopy_ok(&["subvolume", "list", "."], &m.mnt);
    assert!(!list.contains("in/"), "a subvolume is left: {list}");
}

#[test]
fn cut_damaged_and_huge_streams_are_refused_and_leave_nothing() {
    if !can_mount() {
        return;
    }
    let (mut m, good) = with_a_stream();
    let dir = m._dir.path();
    // Cut short, and one byte changed.
    fs::write(dir.join("cut"), &good[..good.len() - 100]).unwrap();
    refused(&m, &dir.join("cut"), "truncated");
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    fs::write(dir.join("crc"), &bad).unwrap();
    refused(&m, &dir.join("crc"), "checksum");
    // A declared length of 4 GiB.
    let mut huge = good[..17].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[1, 0, 0, 0, 0, 0]);
    fs::write(dir.join("huge"), &huge).unwrap();
    refused(&m, &dir.join("huge"), "declares");
    // Not a stream at all.
    fs::write(dir.join("junk"), b"this is not a send stream at all").unwrap();
    refused(&m, &dir.join("junk"), "not a send stream");
    m.unmount();
    m.check();
}

/// A mount holding a snapshot "s", and its full stream.
fn with_a_stream() -> (Mounted, Vec<u8>) {
    let m = Mounted::with_size("256M");
    fs::write(m.p("f"), common::noise(200_000, 7)).unwrap();
    snap(&m, "s");
    let good = fs::read(send(&m, "s", None, "2")).unwrap();
    (m, good)
}

#[test]
fn a_stream_whose_parent_is_unknown_is_refused() {
    use canopy::stream::Command as C;
    if !can_mount() {
        return;
    }
    let m = Mounted::with_size("256M");
    let dir = m._dir.path();
    let orphan = crafted(
        dir,
        "orphan",
        &[
            C::Snapshot {
                path: b"x".to_vec(),
                uuid: [1; 16],
                ctransid: 5,
                clone_uuid: [9; 16],
                clone_ctransid: 4,
            },
            C::End,
        ],
    );
    refused(&m, &orphan, "cannot find the parent");
}

#[test]
fn paths_that_leave_the_subvolume_are_refused() {
    use canopy::stream::Command as C;
    if !can_mount() {
        return;
    }
    let m = Mounted::with_size("256M");
    let dir = m._dir.path();
    let outside = m.p("outside");
    fs::create_dir(&outside).unwrap();
    let sub = |cmds: Vec<C>| {
        [
            vec![C::Subvol {
                path: b"x".to_vec(),
                uuid: [2; 16],
                ctransid: 1,
            }],
            cmds,
            vec![C::End],
        ]
        .concat()
    };
    let dotdot = crafted(
        dir,
        "dotdot",
        &sub(vec![C::Mkfile {
            path: b"../../outside/evil".to_vec(),
            ino: 257,
        }]),
    );
    refused(&m, &dotdot, "outside the subvolume");
    let abs = format!("{}/evil", outside.display()).into_bytes();
    let absolute = crafted(
        dir,
        "absolute",
        &sub(vec![C::Mkfile {
            path: abs,
            ino: 257,
        }]),
    );
    refused(&m, &absolute, "absolute path");
    let via = crafted(
        dir,
        "symlink",
        &sub(vec![
            C::Symlink {
                path: b"l".to_vec(),
                ino: 257,
                target: outside.as_os_str().as_encoded_bytes().to_vec(),
            },
            C::Mkfile {
                path: b"l/evil".to_vec(),
                ino: 258,
            },
        ]),
    );
    refused(&m, &via, "opening directory l");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "something was written outside"
    );
}

#[test]
fn an_interrupted_or_killed_receive_leaves_nothing() {
    if !can_mount() {
        return;
    }
    let (m, good) = with_a_stream();
    // SIGTERM, then SIGKILL, while the stream still comes.
    for (i, signal) in [libc::SIGTERM, libc::SIGKILL].into_iter().enumerate() {
        let dir_in = m.p(&format!("in{i}"));
        fs::create_dir_all(&dir_in).unwrap();
        let mut child = canopy()
            .args(["receive", "-q"])
            .arg(&dir_in)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, &good[..good.len() / 2]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(
            fs::read_dir(&dir_in).unwrap().count(),
            1,
            "nothing received yet"
        );
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let st = child.wait().unwrap();
        drop(stdin);
        assert!(!st.success());
        // A killed command cannot wait for the daemon's deletion.
        let gone = || fs::read_dir(&dir_in).unwrap().count() == 0;
        for _ in 0..100 {
            if gone() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(gone(), "receive stopped by signal {signal} left something");
        let list = canopy_ok(&["subvolume", "list", "."], &m.mnt);
        assert!(
            !list.contains(&format!("in{i}/")),
            "a subvolume is left: {list}"
        );
    }
}

#[test]
fn dump_lists_the_commands_and_send_refuses_writable_subvolumes() {
    if !can_mount() {
        return;
    }
    let m = Mounted::with_size("256M");
    fs::write(m.p("hello"), b"hi").unwrap();
    // A file deleted while open is in the snapshot without a name: not sent.
    let open = fs::File::create(m.p("gone")).unwrap();
    fs::remove_file(m.p("gone")).unwrap();
    snap(&m, "s");
    drop(open);
    let stream = send(&m, "s", None, "2");
    let out = canopy()
        .args(["receive", "--dump", "-f"])
        .arg(&stream)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("subvol"), "{text}");
    assert!(
        text.contains("mkfile") && text.contains("./s/hello"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("end"), "{text}");
    let out = canopy()
        .args(["send", "-q", "-f", "/dev/null", "."])
        .current_dir(&m.mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    // A reader that goes away mid-stream (`canopy send | head`) ends the
    // send, not the daemon.
    fs::write(m.p("big"), common::noise(8 << 20, 3)).unwrap();
    snap(&m, "s2");
    let mut child = canopy()
        .args(["send", "-q", "s2"])
        .current_dir(&m.mnt)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 100];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut head).unwrap();
    drop(child.stdout.take());
    let _ = child.wait();
    std::thread::sleep(std::time::Duration::from_millis(300));
    canopy_ok(&["sync", "."], &m.mnt);
    let again = send(&m, "s2", None, "2");
    assert!(fs::metadata(again).unwrap().len() > 8 << 20);
    let show = canopy_ok(&["subvolume", "show", "s"], &m.mnt);
    assert!(
        show.contains("UUID:") && !show.contains("UUID: \t\t\t-"),
        "{show}"
    );
}

#[test]
fn clone_sources_turn_shared_extents_into_clones() {
    if !can_mount() {
        return;
    }
    let src = Mounted::with_size("256M");
    let dst = Mounted::with_size("256M");
    fs::write(src.p("base"), common::noise(1 << 20, 11)).unwrap();
    snap(&src, "s1");
    assert_eq!(reflink(&src.p("base"), &src.p("copy")), 1 << 20);
    snap(&src, "s2");
    let first = send(&src, "s1", None, "2");
    let out = src._dir.path().join("s2-c.stream");
    canopy_ok(
        &["send", "-q", "-c", "s1", "-f", out.to_str().unwrap(), "s2"],
        &src.mnt,
    );
    let dump = canopy_ok(
        &["receive", "--dump", "-f", out.to_str().unwrap()],
        &src.mnt,
    );
    assert!(dump.contains("clone"), "{dump}");
    assert!(
        fs::metadata(&out).unwrap().len() < (3 << 20) / 2,
        "the shared data went whole"
    );
    receive_ok(&dst.mnt, &first);
    receive_ok(&dst.mnt, &out);
    assert_same(&src.p("s2"), &dst.p("s2"), Compare::default());
}

/// Kernel btrfs on a loop device, when this machine has it.
struct Btrfs {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Btrfs {
    fn new() -> Option<Btrfs> {
        let have = unsafe { libc::geteuid() } == 0
            && std::process::Command::new("mkfs.btrfs")
                .arg("--version")
                .output()
                .is_ok()
            && fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("btrfs"));
        if !common::require(
            have,
            "interchange tests need root, mkfs.btrfs and kernel btrfs",
        ) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("btrfs.img");
        fs::File::create(&img).unwrap().set_len(1 << 30).unwrap();
        let ok = std::process::Command::new("mkfs.btrfs")
            .args(["-q", "-f"])
            .arg(&img)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success());
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(ok.success(), "mount -o loop of a btrfs image");
        Some(Btrfs { _dir: dir, mnt })
    }

    fn run(&self, args: &[&str]) {
        let out = std::process::Command::new("btrfs")
            .args(args)
            .current_dir(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "btrfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

#[test]
fn canopy_streams_land_on_kernel_btrfs() {
    for seed in seeds(0xb7f5) {
        canopy_to_btrfs(seed);
    }
}

/// `first`, then CANOPY_SEND_SEEDS more (a soak).
fn seeds(first: u64) -> Vec<u64> {
    let more: u64 = std::env::var("CANOPY_SEND_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::iter::once(first)
        .chain((1..=more).map(|i| first + (i << 20)))
        .collect()
}

fn canopy_to_btrfs(seed: u64) {
    if !can_mount() {
        return;
    }
    let Some(b) = Btrfs::new() else { return };
    let src = Mounted::with_size("1G");
    let mut rng = Rng(seed);
    let mut prev: Option<String> = None;
    for i in 1..=3 {
        churn(&src.mnt, &mut rng, 50);
        let name = format!("s{i}");
        snap(&src, &name);
        let stream = send(&src, &name, prev.as_deref(), "2");
        b.run(&["receive", "-f", stream.to_str().unwrap(), "."]);
        assert_same(
            &src.p(&name),
            &b.mnt.join(&name),
            Compare { ignore_holes: true },
        );
        prev = Some(name);
    }
}

#[test]
fn btrfs_streams_land_on_canopy() {
    for seed in seeds(0xb7f6) {
        btrfs_to_canopy(seed);
    }
}

fn btrfs_to_canopy(seed: u64) {
    if !can_mount() {
        return;
    }
    let Some(b) = Btrfs::new() else { return };
    let dst = Mounted::with_size("1G");
    b.run(&["subvolume", "create", "src"]);
    let mut rng = Rng(seed);
    let mut prev: Option<String> = None;
    for i in 1..=3 {
        churn(&b.mnt.join("src"), &mut rng, 50);
        let name = format!("b{i}");
        b.run(&["subvolume", "snapshot", "-r", "src", &name]);
        let stream = b._dir.path().join(format!("{name}.stream"));
        let mut args = vec!["send", "-q", "-f", stream.to_str().unwrap()];
        if let Some(p) = &prev {
            args.extend(["-p", p]);
        }
        args.push(&name);
        b.run(&args);
        receive_ok(&dst.mnt, &stream);
        assert_same(
            &b.mnt.join(&name),
            &dst.p(&name),
            Compare { ignore_holes: true },
        );
        prev = Some(name);
    }
}
