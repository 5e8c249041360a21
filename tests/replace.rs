//! `device replace`: a new device takes an old one's place, online. The
//! target ends up holding every copy the source held, whatever was
//! written during the copy: with the source and the other devices it
//! opens without the old one, alone (degraded) it reads every file, and
//! the old device no longer looks like part of the filesystem. A bad
//! source is read around; a missing one is rebuilt from the other
//! copies; device 1 (a single-device filesystem too) can be replaced;
//! a cancelled replace leaves everything on the source. Also here: a
//! mixed-groups filesystem of two devices opens degraded without
//! device 1, because the superblock names its mixed groups' copies.

mod common;

use canopy::dev::{Device, MemDevice};
use canopy::format::superblock::Profile;
use canopy::fs::replace::{ReplaceState, ReplaceStatus};
use canopy::fs::Fs;
use canopy::replace::Options;
use common::mounted::canopy_ok;
use common::multi::*;
use std::sync::Arc;
use std::time::Duration;

/// Two devices of raid1 data and metadata, populated.
fn populated_raid1() -> (Vec<Arc<MemDevice>>, Fs) {
    let devs = mem_devices(2, 384 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Raid1, Profile::Raid1))).unwrap();
    populate(&fs);
    (devs, fs)
}

fn wait(fs: &Fs) -> ReplaceStatus {
    loop {
        let st = fs.replace_status();
        if st.state != ReplaceState::Running {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Files `extra{i}` in the root directory, written and committed.
fn write_more(fs: &Fs, range: std::ops::Range<usize>) {
    for i in range {
        write_file(fs, ROOT_DIR, &format!("extra{i}"), &content(1000 + i));
    }
    fs.sync().unwrap();
}

fn verify_more(fs: &Fs, range: std::ops::Range<usize>) {
    for i in range {
        let a = fs.lookup(ROOT_DIR, format!("extra{i}").as_bytes()).unwrap();
        let want = content(1000 + i);
        let got = fs
            .read(a.ino, 0, want.len() as u32 + 10)
            .unwrap_or_else(|e| {
                panic!(
                    "extra{i}: {e}: {:?} {:?}",
                    fs.engine().mirrors(),
                    fs.engine().usage().kinds
                )
            });
        assert!(got == want, "extra{i} reads back different bytes");
    }
}

fn replace(fs: &Fs, source: u64, target: &Arc<MemDevice>, avoid_source: bool) -> ReplaceStatus {
    let opts = Options { avoid_source };
    fs.replace_start(source, target.clone(), "new".into(), opts)
        .unwrap();
    wait(fs)
}

#[test]
fn the_target_holds_every_copy_including_what_was_written_meanwhile() {
    let (devs, fs) = populated_raid1();
    // Enough to copy that files are written while the copy runs.
    let big_bytes = common::noise(48 << 20, 99);
    write_file(&fs, ROOT_DIR, "big", &big_bytes);
    fs.sync().unwrap();
    let target = Arc::new(MemDevice::new(512 * MIB));
    fs.replace_start(2, target.clone(), "new".into(), Options::default())
        .unwrap();
    let err = fs.device_remove_start(2).map(drop).unwrap_err();
    assert!(err.to_string().contains("replace is running"), "{err}");
    let mut written = 0;
    while written < 200 && (written < 5 || fs.replace_status().state == ReplaceState::Running) {
        write_more(&fs, written..written + 5);
        written += 5;
    }
    let st = wait(&fs);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    let report = st.report.unwrap();
    assert!(
        report.bytes_copied > 48 << 20 && report.uncorrectable.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.from_other_copies, 0, "{report:?}");
    assert!(fs.engine().replace_source().is_none());
    write_more(&fs, written..written + 20);
    written += 20;
    verify(&fs);
    drop(fs);
    assert_eq!(canopy::dev::existing_filesystem(devs[1].as_ref()), None);
    let now = [devs[0].clone(), target.clone()];
    check_clean(&now);
    // Alone, the target reads everything.
    let fs = Fs::new(Arc::new(open(vec![target.clone()], true, true).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..written);
    let big = fs.lookup(ROOT_DIR, b"big").unwrap();
    assert!(fs.read(big.ino, 0, 48 << 20).unwrap() == big_bytes);
    drop(fs);
    let fs = Fs::new(Arc::new(open(as_devices(&now), false, false).unwrap())).unwrap();
    let ctl = canopy::scrub::Control::default();
    let r = canopy::scrub::run(fs.engine(), &ctl, canopy::scrub::Pace { throttle: false }).unwrap();
    assert!(r.is_clean() && r.bad_copies.is_empty(), "{r:?}");
}

#[test]
fn a_bad_source_is_read_around_and_minus_r_prefers_the_other_copies() {
    let (devs, fs) = populated_raid1();
    let chunks = fs.engine().mirrors();
    drop(fs);
    wipe_copies_on(&devs, &chunks, 2);
    let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
    let target = Arc::new(MemDevice::new(384 * MIB));
    let st = replace(&fs, 2, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    let report = st.report.unwrap();
    assert!(
        report.from_other_copies > 0 && report.uncorrectable.is_empty(),
        "{report:?}"
    );
    // With -r on a healthy source, the other copies are read first.
    let second = Arc::new(MemDevice::new(384 * MIB));
    let st = replace(&fs, 2, &second, true);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    let report = st.report.unwrap();
    assert!(report.from_other_copies > 0, "{report:?}");
    drop(fs);
    // Device 1's copies wiped: everything reads from the second target.
    let now = [devs[0].clone(), second.clone()];
    wipe_copies_on(&now, &chunks, 1);
    let fs = Fs::new(Arc::new(open(as_devices(&now), true, false).unwrap())).unwrap();
    verify(&fs);
}

#[test]
fn device_1_of_a_single_device_filesystem_is_replaced_by_a_larger_one() {
    let devs = mem_devices(1, 256 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Dup, Profile::Single))).unwrap();
    populate(&fs);
    let small = Arc::new(MemDevice::new(128 * MIB));
    let err = fs
        .replace_start(1, small, "small".into(), Options::default())
        .unwrap_err();
    assert!(err.to_string().contains("at least as many"), "{err}");
    let target = Arc::new(MemDevice::new(320 * MIB));
    let st = replace(&fs, 1, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    verify(&fs);
    write_more(&fs, 0..20);
    drop(fs);
    assert_eq!(canopy::dev::existing_filesystem(devs[0].as_ref()), None);
    common::assert_posix_clean_in_place(target.clone());
    let fs = Fs::new(Arc::new(open(vec![target.clone()], false, false).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..20);
}

#[test]
fn a_missing_device_is_rebuilt_on_its_replacement() {
    let (devs, fs) = populated_raid1();
    drop(fs);
    let one = [devs[0].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&one), false, true).unwrap())).unwrap();
    assert_eq!(fs.engine().missing_device(), Some(2));
    // Written degraded: into new groups with one copy.
    write_more(&fs, 0..10);
    let target = Arc::new(MemDevice::new(384 * MIB));
    let st = replace(&fs, 2, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    assert_eq!(fs.engine().missing_device(), None);
    write_more(&fs, 10..30);
    // A convert gives the groups made degraded their second copy.
    convert_to_raid1(&fs);
    drop(fs);
    let now = [devs[0].clone(), target.clone()];
    check_clean(&now);
    let fs = Fs::new(Arc::new(open(vec![target.clone()], true, true).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..30);
}

#[test]
fn a_cancelled_replace_leaves_the_filesystem_on_the_source() {
    let (devs, fs) = populated_raid1();
    let target = Arc::new(MemDevice::new(384 * MIB));
    fs.replace_start(2, target.clone(), "new".into(), Options::default())
        .unwrap();
    let _ = fs.replace_cancel();
    let st = wait(&fs);
    assert!(
        matches!(st.state, ReplaceState::Cancelled | ReplaceState::Finished),
        "{st:?}"
    );
    assert!(fs.engine().replace_source().is_none());
    // A new replace may start; this one is left running at the drop,
    // which gives it up.
    if st.state == ReplaceState::Cancelled {
        assert_eq!(canopy::dev::existing_filesystem(target.as_ref()), None);
        fs.replace_start(2, target.clone(), "new".into(), Options::default())
            .unwrap();
        drop(fs);
        check_clean(&devs);
        verify(&Fs::new(Arc::new(open(as_devices(&devs), true, false).unwrap())).unwrap());
    }
}

/// A crash right after a replace began (the devices as its first commit
/// left them, the target part-filled): the next mount opens the target
/// again by its recorded name and resumes; a target without the
/// replace's marker is refused and the replace given up, the filesystem
/// staying on the source.
#[test]
fn a_replace_cut_short_by_a_crash_resumes_at_the_next_mount() {
    // The crash: the devices as the replace's first commit left them,
    // before the copy wrote anything to the target.
    let crash = |avoid_source: bool| {
        let (devs, fs) = populated_raid1();
        let target = Arc::new(MemDevice::new(384 * MIB));
        let t = target.clone() as Arc<dyn Device>;
        fs.engine()
            .replace_begin(2, t, "new.img", avoid_source)
            .unwrap();
        let crashed: Vec<Arc<MemDevice>> = [&devs[0], &devs[1], &target]
            .iter()
            .map(|d| Arc::new(MemDevice::from_bytes(d.snapshot())))
            .collect();
        drop(fs);
        crashed
    };

    // A stranger given for the target: refused, the replace given up.
    let crashed = crash(true);
    let pair = [crashed[0].clone(), crashed[1].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&pair), false, false).unwrap())).unwrap();
    let record = fs.engine().recorded_replace().unwrap().expect("recorded");
    assert_eq!((record.source, &record.name[..]), (2, &b"new.img"[..]));
    assert!(record.avoid_source);
    let stranger = Arc::new(MemDevice::new(384 * MIB));
    fs.replace_resume_if_recorded(|_| Ok(stranger.clone() as Arc<dyn Device>))
        .unwrap();
    assert!(fs.engine().recorded_replace().unwrap().is_none());
    assert!(fs.engine().replace_source().is_none());
    drop(fs);
    check_clean(&pair);

    // The target itself, opened by its recorded name: the copy resumes.
    let crashed = crash(false);
    let pair = [crashed[0].clone(), crashed[1].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&pair), false, false).unwrap())).unwrap();
    let named = std::sync::Mutex::new(String::new());
    fs.replace_resume_if_recorded(|name| {
        *named.lock().unwrap() = name.to_string();
        Ok(crashed[2].clone() as Arc<dyn Device>)
    })
    .unwrap();
    assert_eq!(*named.lock().unwrap(), "new.img");
    let st = wait(&fs);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    verify(&fs);
    drop(fs);
    let now = [crashed[0].clone(), crashed[2].clone()];
    check_clean(&now);
    let fs = Fs::new(Arc::new(
        open(vec![crashed[2].clone()], true, true).unwrap(),
    ))
    .unwrap();
    verify(&fs);
}

/// An unmount during a replace keeps it for the next mount.
#[test]
fn an_unmount_keeps_a_running_replace_recorded() {
    let (devs, fs) = populated_raid1();
    write_file(&fs, ROOT_DIR, "big", &common::noise(48 << 20, 8));
    fs.sync().unwrap();
    let target = Arc::new(MemDevice::new(384 * MIB));
    fs.replace_start(2, target.clone(), "t".into(), Options::default())
        .unwrap();
    drop(fs);
    // The copy may have won the race with the unmount: then the swap is
    // done and the old device wiped.
    let finished = canopy::dev::existing_filesystem(devs[1].as_ref()).is_none();
    let now = match finished {
        true => [devs[0].clone(), target.clone()],
        false => [devs[0].clone(), devs[1].clone()],
    };
    let fs = Fs::new(Arc::new(open(as_devices(&now), false, false).unwrap())).unwrap();
    let recorded = fs.engine().recorded_replace().unwrap();
    assert_eq!(recorded.is_some(), !finished);
    fs.replace_resume_if_recorded(|_| Ok(target.clone() as Arc<dyn Device>))
        .unwrap();
    assert!(matches!(
        wait(&fs).state,
        ReplaceState::Finished | ReplaceState::Idle
    ));
    verify(&fs);
    drop(fs);
    check_clean(&[devs[0].clone(), target.clone()]);
}

#[test]
fn a_mixed_filesystem_opens_degraded_without_device_1() {
    let devs = mem_devices(2, 256 * MIB);
    let fs = Fs::new(Arc::new(format_with(
        &devs,
        Profile::Raid1,
        Profile::Raid1,
        true,
    )))
    .unwrap();
    populate(&fs);
    drop(fs);
    check_clean(&devs);
    let fs = Fs::new(Arc::new(open(vec![devs[1].clone()], true, true).unwrap())).unwrap();
    verify(&fs);
}

/// Through a real mount: `device replace start -B` of device 2, then the
/// filesystem mounts with the new device and checks clean.
/// A mounted 1 GiB image with b.img added as device 2 and everything
/// converted to raid1, and c.img (1 GiB, empty) beside them; returns the
/// mount, their directory and the mount point.
fn raid1_mount_with_a_spare() -> Option<(common::mounted::Mounted, std::path::PathBuf, String)> {
    if !common::mounted::can_mount() || common::mounted::rbd_conf().is_some() {
        return None;
    }
    let m = common::mounted::Mounted::with_size("1G");
    let dir = m.img.parent().unwrap().to_path_buf();
    for name in ["b.img", "c.img"] {
        std::fs::File::create(dir.join(name))
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
    }
    let mnt = m.mnt.to_str().unwrap().to_string();
    canopy_ok(&["device", "add", "b.img", &mnt], &dir);
    let convert = [
        "balance",
        "start",
        "-mconvert=raid1",
        "-dconvert=raid1",
        &mnt,
    ];
    canopy_ok(&convert, &dir);
    Some((m, dir, mnt))
}

#[test]
fn device_replace_through_a_mount() {
    let Some((mut m, dir, mnt)) = raid1_mount_with_a_spare() else {
        return;
    };
    for i in 0..100 {
        std::fs::write(m.p(&format!("f{i}")), content(i)).unwrap();
    }
    let out = canopy_ok(
        &["device", "replace", "start", "-B", "2", "c.img", &mnt],
        &dir,
    );
    assert!(out.contains("finished"), "{out}");
    let st: serde_json::Value = serde_json::from_str(&canopy_ok(
        &["device", "replace", "status", "--json", &mnt],
        &dir,
    ))
    .unwrap();
    assert_eq!(st["state"], "finished", "{st}");
    let show: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", &mnt], &dir)).unwrap();
    let c = dir.join("c.img");
    assert_eq!(show["devices"][1]["path"], c.to_str().unwrap(), "{show}");
    // `filesystem usage` lists the devices too, with what groups take.
    let usage: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "usage", "--json", &mnt], &dir)).unwrap();
    assert_eq!(usage["devices"][1]["path"], c.to_str().unwrap(), "{usage}");
    assert!(
        usage["devices"][1]["allocated"].as_u64().unwrap() > 0,
        "{usage}"
    );
    let text = canopy_ok(&["filesystem", "usage", &mnt], &dir);
    assert!(
        text.contains("Devices:") && text.contains("devid  2"),
        "{text}"
    );
    for i in 0..100 {
        assert!(std::fs::read(m.p(&format!("f{i}"))).unwrap() == content(i));
    }
    m.unmount();
    let img = m.img.to_str().unwrap().to_string();
    let checked = canopy_ok(&["check", &img, "--device", "c.img"], &dir);
    assert!(checked.contains("clean"), "{checked}");
    let old = common::mounted::canopy()
        .args(["check", "b.img"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        !old.status.success(),
        "the replaced device no longer holds the filesystem"
    );
}

/// Device 2 of a raid1 pair, which fails every read, write and barrier
/// once it has died (a disk pulled out, a cable gone).
struct Dying {
    inner: Arc<MemDevice>,
    dead: std::sync::atomic::AtomicBool,
}

impl Dying {
    fn check(&self) -> canopy::Result<()> {
        match self.dead.load(std::sync::atomic::Ordering::SeqCst) {
            true => Err(canopy::Error::io(
                "device 2",
                std::io::Error::from_raw_os_error(libc::EIO),
            )),
            false => Ok(()),
        }
    }
}

impl Device for Dying {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> canopy::Result<()> {
        self.check()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> canopy::Result<()> {
        self.check()?;
        self.inner.write_at(buf, offset)
    }
    fn barrier(&self) -> canopy::Result<()> {
        self.check()?;
        self.inner.barrier()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// A device lost mid-write: the filesystem stops cleanly (a write it
/// could not make shuts it down, keeping the last commit and fsyncs);
/// opened degraded it shows every acknowledged file; `replace missing`
/// rebuilds the device on a new one, and the pair checks and scrubs
/// clean.
#[test]
fn a_device_lost_mid_write_is_replaced_and_nothing_acknowledged_is_lost() {
    let devs = mem_devices(2, 384 * MIB);
    drop(format(&devs, Profile::Raid1, Profile::Raid1));
    let dying = Arc::new(Dying {
        inner: devs[1].clone(),
        dead: Default::default(),
    });
    let e = open(vec![devs[0].clone(), dying.clone()], false, false).unwrap();
    let fs = Fs::new(Arc::new(e)).unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..400 {
        if i == 150 {
            dying.dead.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let name = format!("extra{i}");
        let mode = libc::S_IFREG | 0o644;
        let done = fs
            .create(ROOT_DIR, name.as_bytes(), mode, 0, ME, None)
            .and_then(|a| fs.write(a.ino, 0, &content(1000 + i)).map(|_| a.ino))
            .and_then(|ino| fs.fsync(ino));
        match done {
            Ok(()) => acknowledged.push(i),
            Err(_) => break,
        }
    }
    assert!(
        acknowledged.len() >= 150,
        "{} acknowledged",
        acknowledged.len()
    );
    assert!(acknowledged.len() < 400, "the lost device went unnoticed");
    drop(fs);
    let one = [devs[0].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&one), false, true).unwrap())).unwrap();
    for &i in &acknowledged {
        verify_more(&fs, i..i + 1);
    }
    let target = Arc::new(MemDevice::new(384 * MIB));
    let st = replace(&fs, 2, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    drop(fs);
    let now = [devs[0].clone(), target.clone()];
    check_clean(&now);
    let fs = Fs::new(Arc::new(open(as_devices(&now), false, false).unwrap())).unwrap();
    for &i in &acknowledged {
        verify_more(&fs, i..i + 1);
    }
    let ctl = canopy::scrub::Control::default();
    let r = canopy::scrub::run(fs.engine(), &ctl, canopy::scrub::Pace { throttle: false }).unwrap();
    assert!(r.is_clean(), "{r:?}");
}

/// Through a real mount: the daemon killed while a replace copies; the
/// next mount (naming the devices as before) opens the target again by
/// the path the replace was given and finishes it.
#[test]
fn a_replace_killed_with_its_daemon_resumes_at_the_next_mount() {
    let Some((mut m, dir, mnt)) = raid1_mount_with_a_spare() else {
        return;
    };
    let big = common::noise(64 << 20, 3);
    for i in 0..3 {
        std::fs::write(m.p(&format!("big{i}")), &big).unwrap();
    }
    canopy_ok(&["sync", &mnt], &dir);
    canopy_ok(&["device", "replace", "start", "2", "c.img", &mnt], &dir);
    m.kill9();
    // Still on b.img unless the copy won the race with the kill.
    let b =
        canopy::dev::FileDevice::open_as(&dir.join("b.img"), canopy::dev::Access::Peek).unwrap();
    let on_b = canopy::dev::existing_filesystem(&b).is_some();
    drop(b);
    let second = dir.join(if on_b { "b.img" } else { "c.img" });
    m.mount(&format!("device={}", second.display()));
    let state = loop {
        let out = canopy_ok(&["device", "replace", "status", "--json", &mnt], &dir);
        let st: serde_json::Value = serde_json::from_str(&out).unwrap();
        if st["state"] != "running" {
            break st["state"].clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(state == "finished" || !on_b && state == "idle", "{state}");
    let show: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", &mnt], &dir)).unwrap();
    let c = dir.join("c.img");
    assert_eq!(show["devices"][1]["path"], c.to_str().unwrap(), "{show}");
    for i in 0..3 {
        assert!(std::fs::read(m.p(&format!("big{i}"))).unwrap() == big);
    }
    m.unmount();
    let img = m.img.to_str().unwrap().to_string();
    let checked = canopy_ok(&["check", &img, "--device", "c.img"], &dir);
    assert!(checked.contains("clean"), "{checked}");
}

/// RAID10 over four devices: every data and metadata group goes round
/// all four in 64 KiB units (system groups keep raid1, which the
/// superblock can name), every device takes a share; with one device's
/// copies wiped everything reads back and scrub mends them; a missing
/// device is rebuilt on its replacement unit by unit, and the
/// filesystem then opens on the replacement with the other three alone
/// missing one of them.
#[test]
fn raid10_goes_round_every_device_and_a_lost_one_is_rebuilt() {
    let devs = mem_devices(4, 256 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Raid10, Profile::Raid10))).unwrap();
    populate(&fs);
    write_more(&fs, 0..40);
    // Extents of many units, crossing from pair to pair.
    write_big(&fs, 6);
    let kinds = fs.engine().usage().kinds;
    for k in &kinds {
        let want = if k.kind == "system" {
            "raid1"
        } else {
            "raid10"
        };
        assert_eq!(k.profile, want, "{kinds:?}");
    }
    let chunks = fs.engine().mirrors();
    for c in chunks.iter().filter(|c| c.striped) {
        assert_eq!(c.stripes().count(), 4, "{c:?}");
        assert_eq!(c.stripe_len() * 2, c.len, "{c:?}");
    }
    let show = fs.engine().show();
    assert!(show.devices.iter().all(|d| d.allocated > 0), "{show:?}");
    drop(fs);
    check_clean(&devs);

    wipe_copies_on(&devs, &chunks, 3);
    let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..40);
    verify_big(&fs, 6);
    scrub_finds_nothing_lost(&fs);
    drop(fs);
    check_clean(&devs);

    let three = [devs[0].clone(), devs[1].clone(), devs[3].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&three), false, true).unwrap())).unwrap();
    assert_eq!(fs.engine().missing_device(), Some(3));
    verify_more(&fs, 0..40);
    let target = Arc::new(MemDevice::new(256 * MIB));
    let st = replace(&fs, 3, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    write_more(&fs, 40..50);
    drop(fs);
    let now = [
        devs[0].clone(),
        devs[1].clone(),
        target.clone(),
        devs[3].clone(),
    ];
    check_clean(&now);
    let without_4 = [devs[0].clone(), devs[1].clone(), target.clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&without_4), true, true).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..50);
    verify_big(&fs, 6);
}

/// In the mapped layout device 1 is a device like the others: a
/// degraded open without it writes (new groups on the devices left),
/// and `replace` rebuilds it on a new device.
#[test]
fn a_missing_device_1_is_written_around_and_rebuilt() {
    let (devs, fs) = populated_raid1();
    drop(fs);
    let two = [devs[1].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&two), false, true).unwrap())).unwrap();
    assert_eq!(fs.engine().missing_device(), Some(1));
    write_more(&fs, 0..10);
    let target = Arc::new(MemDevice::new(384 * MIB));
    let st = replace(&fs, 1, &target, false);
    assert_eq!(st.state, ReplaceState::Finished, "{st:?}");
    write_more(&fs, 10..20);
    convert_to_raid1(&fs);
    drop(fs);
    let now = [target.clone(), devs[1].clone()];
    check_clean(&now);
    let fs = Fs::new(Arc::new(open(vec![target.clone()], true, true).unwrap())).unwrap();
    verify(&fs);
    verify_more(&fs, 0..20);
}
