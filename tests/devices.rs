//! Filesystems over several devices: mkfs names each device and keeps
//! tree blocks (and with `-d raid1`, data) on two or three of them; a
//! device wiped whole is read around and repaired from the others; a
//! missing one is refused by name unless the open is degraded, where
//! every file still reads back (read-only without device 1; writable
//! otherwise, until `device remove missing` rebuilds the lost copies);
//! devices of another filesystem, or one named twice, are refused;
//! devices are added and removed online; through a real mount, `-o
//! device=` names the others.

mod common;

use canopy::balance::{BalanceArgs, Filter};
use canopy::dev::{Device, MemDevice};
use canopy::format::superblock::Profile;
use canopy::fs::{BalanceState, Fs};
use canopy::{Engine, FormatOptions};
use common::mounted::{canopy, canopy_ok};
use common::multi::*;
use std::sync::Arc;

#[test]
fn raid1_keeps_every_group_on_both_devices_and_survives_either_wiped() {
    let devs = mem_devices(2, 512 * MIB);
    let e = format(&devs, Profile::Raid1, Profile::Raid1);
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    let chunks = fs.engine().mirrors();
    let kinds: Vec<(String, String)> = fs
        .engine()
        .usage()
        .kinds
        .into_iter()
        .map(|k| (k.kind, k.profile))
        .collect();
    for (kind, profile) in &kinds {
        assert_eq!(profile, "raid1", "{kind}: {kinds:?}");
    }
    for c in &chunks {
        assert_eq!(c.extra.len(), 1, "{c:?}");
        assert_eq!(c.extra[0].devid, 2, "{c:?}");
    }
    let show = fs.engine().show();
    assert_eq!(show.devices.len(), 2);
    assert_eq!(show.devices[0].allocated, show.devices[1].allocated);
    drop(fs);
    check_clean(&devs);

    for lost in [2, 1] {
        wipe_copies_on(&devs, &chunks, lost);
        let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
        verify(&fs);
        let ctl = canopy::scrub::Control::default();
        let pace = canopy::scrub::Pace { throttle: false };
        let r = canopy::scrub::run(fs.engine(), &ctl, pace).unwrap();
        assert!(r.bad_tree_blocks.is_empty() && r.bad_data_sectors.is_empty());
        let errors = fs.engine().device_errors();
        let on = |devid: u64| errors.iter().find(|e| e.0 == devid).unwrap().1;
        assert!(
            on(lost)[2] > 0,
            "copies on device {lost} corrected: {errors:?}"
        );
        assert_eq!(
            on(3 - lost)[2],
            0,
            "nothing to correct on the other: {errors:?}"
        );
        fs.engine().reset_device_errors();
        fs.sync().unwrap();
        drop(fs);
        check_clean(&devs);
    }
}

#[test]
fn a_missing_device_is_refused_by_name_unless_the_open_is_degraded() {
    let devs = mem_devices(2, 256 * MIB);
    let e = format(&devs, Profile::Raid1, Profile::Raid1);
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    drop(fs);
    for (given, missing) in [(1, 2), (2, 1)] {
        let only = vec![devs[given - 1].clone() as Arc<dyn Device>];
        let err = open(only.clone(), true, false).map(drop).unwrap_err();
        assert!(
            err.to_string().contains(&format!("device {missing} ")),
            "{err}"
        );
        if missing == 1 {
            // Every group names its first copy: writable without device 1.
            let fs = Fs::new(Arc::new(open(only.clone(), false, true).unwrap())).unwrap();
            verify(&fs);
        }
        let fs = Fs::new(Arc::new(open(only, true, true).unwrap())).unwrap();
        verify(&fs);
        let show = fs.engine().show();
        assert!(show.devices[missing - 1].missing, "{show:?}");
        assert!(!show.devices[given - 1].missing, "{show:?}");
    }
    // Named in either order, the devices make the filesystem.
    let reversed = vec![devs[1].clone() as Arc<dyn Device>, devs[0].clone()];
    let fs = Fs::new(Arc::new(open(reversed, true, false).unwrap())).unwrap();
    verify(&fs);
}

#[test]
fn devices_of_another_filesystem_or_named_twice_are_refused() {
    let devs = mem_devices(2, 256 * MIB);
    drop(format(&devs, Profile::Raid1, Profile::Single));
    let other = mem_devices(2, 256 * MIB);
    drop(format(&other, Profile::Raid1, Profile::Single));
    let mixed = vec![devs[0].clone() as Arc<dyn Device>, other[1].clone()];
    let err = open(mixed, true, false).map(drop).unwrap_err();
    assert!(err.to_string().contains("another filesystem"), "{err}");
    let twice = vec![devs[0].clone() as Arc<dyn Device>, devs[0].clone()];
    let err = open(twice, true, false).map(drop).unwrap_err();
    assert!(err.to_string().contains("again"), "{err}");
    let blank = Arc::new(MemDevice::new(64 * MIB));
    let with_blank = vec![devs[0].clone() as Arc<dyn Device>, devs[1].clone(), blank];
    assert!(open(with_blank, true, false).is_err());
    // Too few devices for the profile.
    let one = mem_devices(1, 256 * MIB);
    let opts = FormatOptions {
        mixed: Some(false),
        metadata_profile: Some(Profile::Raid1),
        ..Default::default()
    };
    let err = Engine::format_devices(as_devices(&one), &opts)
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("needs 2 devices"), "{err}");
}

#[test]
fn raid1c3_reads_everything_with_two_of_three_devices_wiped() {
    let devs = mem_devices(3, 384 * MIB);
    let e = format(&devs, Profile::Raid1c3, Profile::Raid1c3);
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    let chunks = fs.engine().mirrors();
    for c in &chunks {
        let mut on: Vec<u64> = c.stripes().map(|s| s.devid).collect();
        on.sort_unstable();
        assert_eq!(on, vec![1, 2, 3], "{c:?}");
    }
    drop(fs);
    wipe_copies_on(&devs, &chunks, 1);
    wipe_copies_on(&devs, &chunks, 3);
    let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
    verify(&fs);
    let ctl = canopy::scrub::Control::default();
    let pace = canopy::scrub::Pace { throttle: false };
    canopy::scrub::run(fs.engine(), &ctl, pace).unwrap();
    fs.sync().unwrap();
    drop(fs);
    check_clean(&devs);
}

/// `balance -mconvert=raid1 -dconvert=raid1` moves a two-device
/// filesystem made with one device's profiles onto both, and back.
#[test]
fn balance_converts_between_one_device_and_two() {
    let devs = mem_devices(2, 384 * MIB);
    let e = format(&devs, Profile::Dup, Profile::Single);
    let fs = Fs::new(Arc::new(e)).unwrap();
    populate(&fs);
    let to = |m, d| BalanceArgs {
        data: Filter::All,
        metadata: Filter::All,
        data_convert: Some(d),
        metadata_convert: Some(m),
        devid: None,
    };
    for (m, d) in [
        (Profile::Raid1, Profile::Raid1),
        (Profile::Dup, Profile::Single),
    ] {
        fs.balance_start(to(m, d)).unwrap();
        assert_eq!(fs.balance_wait().state, BalanceState::Finished);
        fs.sync().unwrap();
        for k in fs.engine().usage().kinds {
            let want = if k.kind == "data" { d } else { m };
            assert_eq!(k.profile, want.name(), "{k:?}");
        }
        verify(&fs);
    }
    let err = fs
        .balance_start(to(Profile::Raid1c3, Profile::Single))
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("needs 3 devices"), "{err}");
    drop(fs);
    check_clean(&devs);
}

/// Through a real mount: `mkfs A B`, `mount A -o device=B`; the tools
/// name both devices; a mount without B is refused, and `-o degraded,ro`
/// from either device alone reads every file.
#[test]
fn a_mount_names_its_devices_and_mounts_degraded_read_only() {
    if !common::mounted::can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let (mut m, b) = common::mounted::mounted_pair(&["-s", "1G", "-d", "raid1"]);
    let (a, mnt) = (m.img.clone(), m.mnt.clone());
    for i in 0..200 {
        std::fs::write(m.p(&format!("f{i}")), content(i)).unwrap();
    }
    canopy_ok(&["sync", "."], &mnt);
    let show: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", "."], &mnt)).unwrap();
    let paths: Vec<&str> = show["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [a.to_str().unwrap(), b.to_str().unwrap()], "{show}");
    let stats: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["device", "stats", "--json", "."], &mnt)).unwrap();
    assert_eq!(stats.as_array().unwrap().len(), 2, "{stats}");
    m.unmount();
    common::mounted::check_devices(&a, &[&b]);
    let alone = canopy().arg("check").arg(&a).output().unwrap();
    assert_eq!(
        alone.status.code(),
        Some(4),
        "device 2 missing is a problem"
    );

    let refused = canopy()
        .args(["mount", "-f"])
        .args([&a, &mnt])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("device 2") && err.contains("degraded"),
        "{err}"
    );
    for img in [&a, &b] {
        m.img = img.to_path_buf();
        m.mount("degraded,ro");
        for i in 0..200 {
            let got = std::fs::read(m.p(&format!("f{i}"))).unwrap();
            assert!(got == content(i), "f{i} from {}", img.display());
        }
        let text = canopy_ok(&["filesystem", "show", "."], &mnt);
        assert!(text.contains("missing"), "{text}");
        m.unmount();
    }
}

/// `device add`, a conversion onto the new device, and `device remove`
/// of another: every copy follows, the removed device's superblocks are
/// wiped, and what cannot go (device 1, a device raid1 still needs) is
/// refused.
#[test]
fn devices_added_and_removed_carry_every_copy() {
    let devs = mem_devices(3, 384 * MIB);
    let fs = Fs::new(Arc::new(format(&devs[..1], Profile::Dup, Profile::Single))).unwrap();
    populate(&fs);
    let add = |i: usize| fs.device_add(devs[i].clone(), format!("dev{i}"));
    assert_eq!(add(1).unwrap(), 2);
    let err = add(1).map(drop).unwrap_err();
    assert!(err.to_string().contains("already device 2"), "{err}");
    convert_to_raid1(&fs);
    drop(fs);
    let two = || vec![devs[0].clone() as Arc<dyn Device>, devs[1].clone()];
    let err = open(vec![devs[0].clone()], false, false)
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("device 2 "), "{err}");
    let chunks = open(two(), true, false).unwrap().mirrors();
    wipe_copies_on(&devs, &chunks, 1);
    let fs = Fs::new(Arc::new(open(two(), false, false).unwrap())).unwrap();
    verify(&fs);

    assert_eq!(fs.device_add(devs[2].clone(), "dev2".into()).unwrap(), 3);
    fs.device_remove_start(2).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.device_remove_finish(2).unwrap();
    assert!(fs
        .engine()
        .mirrors()
        .iter()
        .all(|c| c.stripes().all(|s| s.devid != 2)));
    assert_eq!(canopy::dev::existing_filesystem(devs[1].as_ref()), None);
    let err = fs.device_remove_start(1).map(drop).unwrap_err();
    assert!(err.to_string().contains("device 1"), "{err}");
    let err = fs.device_remove_start(3).map(drop).unwrap_err();
    assert!(err.to_string().contains("needs 2 devices"), "{err}");
    verify(&fs);
    fs.sync().unwrap();
    drop(fs);
    let left = [devs[0].clone(), devs[2].clone()];
    let reopened = open(as_devices(&left), true, false).unwrap();
    assert_eq!(reopened.devices().len(), 2);
    drop(reopened);
    let r = canopy::check::check_all_devices(as_devices(&left), &|_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    // The removed device is no longer taken for one of the filesystem's.
    assert!(open(as_devices(&devs), true, false).is_err());
}

/// Through a real mount: `device add` (a relative path), a conversion,
/// `device remove` refused while raid1 needs the device and done after
/// converting back; the image then checks clean alone.
#[test]
fn device_add_and_remove_through_a_mount() {
    if !common::mounted::can_mount() || common::mounted::rbd_conf().is_some() {
        return;
    }
    let mut m = common::mounted::Mounted::with_size("1G");
    let dir = m.img.parent().unwrap().to_path_buf();
    std::fs::File::create(dir.join("b.img"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    for i in 0..100 {
        std::fs::write(m.p(&format!("f{i}")), content(i)).unwrap();
    }
    let mnt = m.mnt.to_str().unwrap().to_string();
    let added = canopy_ok(&["device", "add", "b.img", &mnt], &dir);
    assert!(added.contains("device 2"), "{added}");
    canopy_ok(&["balance", "start", "-mconvert=raid1", &mnt], &dir);
    let show: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", &mnt], &dir)).unwrap();
    let b = dir.join("b.img");
    assert_eq!(show["devices"][1]["path"], b.to_str().unwrap(), "{show}");
    assert!(
        show["devices"][1]["allocated"].as_u64().unwrap() > 0,
        "{show}"
    );
    let refused = canopy()
        .args(["device", "remove", "b.img", &mnt])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("needs 2 devices"), "{err}");
    canopy_ok(&["balance", "start", "-mconvert=dup", &mnt], &dir);
    canopy_ok(&["device", "remove", "2", &mnt], &dir);
    let show: serde_json::Value =
        serde_json::from_str(&canopy_ok(&["filesystem", "show", "--json", &mnt], &dir)).unwrap();
    assert_eq!(show["devices"].as_array().unwrap().len(), 1, "{show}");
    for i in 0..100 {
        assert!(std::fs::read(m.p(&format!("f{i}"))).unwrap() == content(i));
    }
    m.unmount();
    m.check();
}

/// A device lost for good: a degraded writable open keeps working on the
/// devices left (new groups there), and `device remove missing` rebuilds
/// the lost copies on them; the filesystem then opens without it.
#[test]
fn a_lost_device_is_removed_from_a_degraded_writable_open() {
    let devs = mem_devices(3, 384 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Raid1, Profile::Raid1))).unwrap();
    populate(&fs);
    drop(fs);
    let left = [devs[0].clone(), devs[1].clone()];
    let err = open(as_devices(&left), false, false).map(drop).unwrap_err();
    assert!(err.to_string().contains("device 3 "), "{err}");
    // The bound layout (mixed groups): device 1 holds every first copy,
    // so a degraded open without it is read-only.
    let bound = mem_devices(2, 256 * MIB);
    drop(format_with(&bound, Profile::Raid1, Profile::Raid1, true));
    let err = open(vec![bound[1].clone() as Arc<dyn Device>], false, true)
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    let fs = Fs::new(Arc::new(open(as_devices(&left), false, true).unwrap())).unwrap();
    verify(&fs);
    let a = fs
        .create(
            ROOT_DIR,
            b"written degraded",
            libc::S_IFREG | 0o644,
            0,
            ME,
            None,
        )
        .unwrap();
    fs.write(a.ino, 0, &content(7777)).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.engine().missing_device(), Some(3));
    fs.device_remove_start(3).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.device_remove_finish(3).unwrap();
    assert_eq!(fs.engine().missing_device(), None);
    for c in fs.engine().mirrors() {
        let mut on: Vec<u64> = c.stripes().map(|s| s.devid).collect();
        on.sort_unstable();
        assert_eq!(on, vec![1, 2], "raid1 on the devices left: {c:?}");
    }
    drop(fs);
    let fs = Fs::new(Arc::new(open(as_devices(&left), false, false).unwrap())).unwrap();
    verify(&fs);
    let a = fs.lookup(ROOT_DIR, b"written degraded").unwrap();
    assert!(fs.read(a.ino, 0, 1 << 20).unwrap() == content(7777));
    drop(fs);
    check_clean(&left);
}

/// Two devices, one lost: the degraded writable open writes new groups
/// with the one copy left, converts to one device's profiles reading
/// the copies left, and then lets the lost device go.
#[test]
fn the_last_mirror_lost_is_converted_away_then_removed() {
    let devs = mem_devices(2, 384 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Raid1, Profile::Raid1))).unwrap();
    populate(&fs);
    drop(fs);
    let one = [devs[0].clone()];
    let fs = Fs::new(Arc::new(open(as_devices(&one), false, true).unwrap())).unwrap();
    let a = fs
        .create(ROOT_DIR, b"new", libc::S_IFREG | 0o644, 0, ME, None)
        .unwrap();
    fs.write(a.ino, 0, &content(4242)).unwrap();
    fs.sync().unwrap();
    let err = fs.device_remove_start(2).map(drop).unwrap_err();
    assert!(err.to_string().contains("needs 2 devices"), "{err}");
    fs.balance_start(BalanceArgs {
        data: Filter::All,
        metadata: Filter::All,
        data_convert: Some(Profile::Single),
        metadata_convert: Some(Profile::Dup),
        devid: None,
    })
    .unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.device_remove_start(2).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.device_remove_finish(2).unwrap();
    drop(fs);
    let fs = Fs::new(Arc::new(open(as_devices(&one), false, false).unwrap())).unwrap();
    verify(&fs);
    let a = fs.lookup(ROOT_DIR, b"new").unwrap();
    assert!(fs.read(a.ino, 0, 1 << 20).unwrap() == content(4242));
    assert_eq!(fs.engine().devices().len(), 1);
    drop(fs);
    check_clean(&one);
}

/// Block group items that name impossible copies, as a hostile or
/// damaged image would: a copy past its device's end, one over another
/// group's space, one on a device the table lacks, profile bits whose
/// copy count the item's length does not match, raid10 over an odd
/// number of devices, two copies overlapping on one device, and an item
/// of the bound layout in a mapped image. Each is refused at
/// open with the group named, and check reports it; nothing panics.
#[test]
fn hostile_block_group_copies_are_refused() {
    use canopy::format::items::{
        BlockGroupItem, BG_DATA, BG_LISTED, BG_RAID1, BG_RAID10, BG_RAID1C3,
    };
    use canopy::format::key_type::BLOCK_GROUP_ITEM;
    use canopy::format::tree_id::BLOCK_GROUP;
    use canopy::format::Key;
    let raw = |used: u64, flags: u64, stripes: &[(u64, u64)]| {
        let mut b = [used.to_le_bytes(), flags.to_le_bytes()].concat();
        for (devid, offset) in stripes {
            b.extend(devid.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b
    };
    // The group's own first copy, then `second` (the mapped layout lists
    // every copy).
    let listed = move |used: u64, flags: u64, g: &BlockGroupItem, second: &[(u64, u64)]| {
        let first = g.first.expect("the mapped layout");
        let all: Vec<(u64, u64)> = std::iter::once((first.devid, first.offset))
            .chain(second.iter().copied())
            .collect();
        raw(used, flags | BG_LISTED, &all)
    };
    let second_devid = |g: &BlockGroupItem| g.extra[0].devid;
    type Hostile = Box<dyn Fn(u64, &BlockGroupItem, u64) -> Vec<u8>>;
    let cases: Vec<(&str, Hostile)> = vec![
        (
            "past the device's end",
            Box::new(move |used, g, _| {
                listed(used, BG_DATA | BG_RAID1, g, &[(second_devid(g), 383 * MIB)])
            }),
        ),
        (
            "over another group",
            Box::new(move |used, g, other| {
                listed(used, BG_DATA | BG_RAID1, g, &[(second_devid(g), other)])
            }),
        ),
        (
            "on a device the table lacks",
            Box::new(move |used, g, _| {
                listed(used, BG_DATA | BG_RAID1, g, &[(7, g.extra[0].offset)])
            }),
        ),
        (
            "three copies in a two-copy item",
            Box::new(move |used, g, _| {
                listed(
                    used,
                    BG_DATA | BG_RAID1C3,
                    g,
                    &[(second_devid(g), g.extra[0].offset)],
                )
            }),
        ),
        (
            "raid10 over an odd number of devices",
            Box::new(move |used, g, _| {
                listed(
                    used,
                    BG_DATA | BG_RAID10,
                    g,
                    &[(second_devid(g), g.extra[0].offset), (3, MIB)],
                )
            }),
        ),
        (
            "both copies on one device, overlapping",
            Box::new(move |used, g, _| {
                let first = g.first.unwrap();
                listed(
                    used,
                    BG_DATA | BG_RAID1,
                    g,
                    &[(first.devid, first.offset + 4096)],
                )
            }),
        ),
        (
            "a bound item in a mapped image",
            Box::new(move |used, g, _| raw(used, BG_DATA | BG_RAID1, &[(2, g.extra[0].offset)])),
        ),
    ];
    for (what, hostile) in cases {
        let devs = mem_devices(2, 384 * MIB);
        let fs = Fs::new(Arc::new(format(&devs, Profile::Raid1, Profile::Raid1))).unwrap();
        populate(&fs);
        fs.engine()
            .write(|tx| {
                let all = tx.range(
                    BLOCK_GROUP,
                    &Key::MIN,
                    &Key::new(u64::MAX, u8::MAX, u64::MAX),
                )?;
                let groups: Vec<(Key, BlockGroupItem)> = all
                    .into_iter()
                    .filter(|(k, _)| k.ty == BLOCK_GROUP_ITEM)
                    .map(|(k, d)| (k, BlockGroupItem::decode(&d).unwrap()))
                    .collect();
                let (key, g) = groups.iter().find(|(_, g)| g.flags & BG_DATA != 0).unwrap();
                let other = groups.iter().find(|(k, _)| k != key).unwrap();
                let bytes = hostile(g.used, g, other.1.extra[0].offset);
                tx.put(BLOCK_GROUP, *key, bytes)?;
                Ok(())
            })
            .unwrap();
        fs.sync().unwrap();
        drop(fs);
        let err = open(as_devices(&devs), false, false)
            .map(drop)
            .expect_err(what);
        let msg = err.to_string();
        assert!(
            msg.contains("block group") || msg.contains("corrupt"),
            "{what}: {msg}"
        );
        let r = canopy::check::check_all_devices(as_devices(&devs), &|_, _| {}).unwrap();
        assert!(!r.is_clean(), "{what}: check found nothing");
    }
}

/// Formats `sizes` (MiB each) with `profiles`, in the mapped layout or
/// the bound one.
fn format_sized(
    sizes: &[u64],
    metadata: Profile,
    data: Profile,
    mapped: bool,
) -> (Vec<Arc<MemDevice>>, Engine) {
    let devs: Vec<Arc<MemDevice>> = sizes
        .iter()
        .map(|&m| Arc::new(MemDevice::new(m * MIB)))
        .collect();
    let opts = FormatOptions {
        mixed: Some(false),
        metadata_profile: Some(metadata),
        data_profile: data,
        mapped: Some(mapped),
        ..Default::default()
    };
    let e = Engine::format_devices(as_devices(&devs), &opts).unwrap();
    (devs, e)
}

/// In the mapped layout (the default on several devices) copies go to
/// the devices with the most room: `-d single` data fills a large second
/// device when device 1 is small, where the bound layout stops at device
/// 1's size; the image checks clean and reads back after a reopen.
#[test]
fn single_data_fills_every_device_not_device_1_alone() {
    let (_, bound) = format_sized(&[128, 512], Profile::Raid1, Profile::Single, false);
    let (_, free_bound) = bound.space();
    assert!(free_bound < 128 * MIB, "the bound layout: {free_bound}");
    drop(bound);

    let (devs, e) = format_sized(&[128, 512], Profile::Raid1, Profile::Single, true);
    let (_, free) = e.space();
    assert!(free > 500 * MIB, "free {free} in the mapped layout");
    let fs = Fs::new(Arc::new(e)).unwrap();
    write_big(&fs, 80);
    let show = fs.engine().show();
    assert!(show.devices[1].allocated > 256 * MIB, "{show:?}");
    for c in fs.engine().mirrors() {
        let devids: Vec<u64> = c.stripes().map(|s| s.devid).collect();
        let mut distinct = devids.clone();
        distinct.dedup();
        assert_eq!(devids, distinct, "copies of one group on one device: {c:?}");
    }
    drop(fs);
    check_clean(&devs);
    let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
    verify_big(&fs, 80);
}

/// raid1 over three devices pairs any two of them, so a small device 1
/// does not bound it; with the copies on any one device wiped, every
/// file still reads back and scrub mends the wiped copies.
#[test]
fn raid1_over_three_devices_pairs_any_two() {
    let (devs, e) = format_sized(&[96, 256, 256], Profile::Raid1, Profile::Raid1, true);
    let fs = Fs::new(Arc::new(e)).unwrap();
    write_big(&fs, 40);
    let chunks = fs.engine().mirrors();
    assert!(
        chunks.iter().any(|c| c.stripes().all(|s| s.devid != 1)),
        "some group pairs devices 2 and 3: {chunks:?}"
    );
    for c in &chunks {
        let mut devids: Vec<u64> = c.stripes().map(|s| s.devid).collect();
        assert_eq!(devids.len(), 2, "{c:?}");
        devids.dedup();
        assert_eq!(devids.len(), 2, "{c:?}");
    }
    drop(fs);
    check_clean(&devs);
    for lost in [1, 3] {
        wipe_copies_on(&devs, &chunks, lost);
        let fs = Fs::new(Arc::new(open(as_devices(&devs), false, false).unwrap())).unwrap();
        verify_big(&fs, 40);
        scrub_finds_nothing_lost(&fs);
        drop(fs);
        check_clean(&devs);
    }
}

/// In the mapped layout device 1 is a device like the others: `device
/// remove` moves every copy off it and takes it out, and the filesystem
/// then opens from the devices left, none missing; in the bound layout
/// the removal is refused.
#[test]
fn device_1_of_the_mapped_layout_is_removed_like_any_other() {
    let devs = mem_devices(3, 384 * MIB);
    let fs = Fs::new(Arc::new(format(&devs, Profile::Raid1, Profile::Raid1))).unwrap();
    populate(&fs);
    fs.device_remove_start(1).unwrap();
    assert_eq!(fs.balance_wait().state, BalanceState::Finished);
    fs.device_remove_finish(1).unwrap();
    let show = fs.engine().show();
    assert_eq!(
        show.devices.iter().map(|d| d.devid).collect::<Vec<_>>(),
        [2, 3],
        "{show:?}"
    );
    write_file(&fs, ROOT_DIR, "after", b"written without device 1");
    fs.sync().unwrap();
    drop(fs);
    assert_eq!(canopy::dev::existing_filesystem(devs[0].as_ref()), None);
    let left = [devs[1].clone(), devs[2].clone()];
    check_clean(&left);
    let fs = Fs::new(Arc::new(open(as_devices(&left), false, false).unwrap())).unwrap();
    verify(&fs);
    let a = fs.lookup(ROOT_DIR, b"after").unwrap();
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"written without device 1");
    drop(fs);

    let bound = mem_devices(3, 384 * MIB);
    let fs = Fs::new(Arc::new(format_with(
        &bound,
        Profile::Raid1,
        Profile::Raid1,
        true,
    )))
    .unwrap();
    let err = fs.device_remove_start(1).map(drop).unwrap_err();
    assert!(err.to_string().contains("device 1"), "{err}");
}
