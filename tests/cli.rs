//! The `canopy` command as a user runs it: exit codes and output.

use std::process::Command;

fn canopy(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args(args)
        .output()
        .expect("run canopy");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mkfs_check_and_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let img = img.to_str().unwrap();

    let (code, _, err) = canopy(&["mkfs", img]);
    assert_eq!(code, 1, "mkfs without --size on a missing image: {err}");

    let (code, out, _) = canopy(&["mkfs", "-s", "256M", "-L", "test", img]);
    assert_eq!(code, 0);
    assert!(out.contains("Created Canopy filesystem"));

    let (code, _, err) = canopy(&["mkfs", "-s", "256M", img]);
    assert_eq!(code, 1);
    assert!(err.contains("--force"), "{err}");
    assert_eq!(canopy(&["mkfs", "-f", "-q", "-L", "test", img]).0, 0);

    let (code, out, _) = canopy(&["check", img]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clean"));

    let (code, out, _) = canopy(&["check", "--json", img]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    // mkfs commits the empty trees, then the root directory.
    assert!(v["generation"].as_u64().unwrap() >= 1);

    let (code, out, _) = canopy(&["inspect", "super", "--json", img]);
    assert_eq!(code, 0);
    let sb: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sb["label"], "test");

    // Corrupt the root tree's root block.
    let root = sb["root"].as_u64().unwrap();
    let mut bytes = std::fs::read(img).unwrap();
    bytes[root as usize + 200] ^= 0x10;
    std::fs::write(img, &bytes).unwrap();
    let (code, out, _) = canopy(&["check", "--json", img]);
    assert_eq!(code, 4, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert!(problems
        .iter()
        .any(|p| p["message"].as_str().unwrap().contains("checksum")));

    let (code, _, _) = canopy(&["check", "/nonexistent/image"]);
    assert_eq!(code, 8);
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        &["mkfs", "--help"][..],
        &["check", "--help"],
        &["inspect", "--help"],
        &["inspect", "freesp", "--help"],
    ] {
        let (code, out, _) = canopy(sub);
        assert_eq!(code, 0);
        assert!(out.contains("Usage"));
    }
    assert_eq!(canopy(&["frobnicate"]).0, 2);
}

/// Misuse gets a message that names the actual mistake, once, and a
/// failed mkfs leaves nothing it created.
#[test]
fn misuse_is_reported_precisely_and_failed_mkfs_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();

    let (code, _, err) = canopy(&["mkfs", "--size", "1M", &p("small.img")]);
    assert_eq!(code, 1);
    assert!(err.contains("below the smallest"), "{err}");
    assert!(!dir.path().join("small.img").exists(), "mkfs left a file");

    std::fs::create_dir(p("adir")).unwrap();
    for cmd in [vec!["mkfs", "-f"], vec!["check"], vec!["inspect", "super"]] {
        let mut args = cmd.clone();
        let d = p("adir");
        args.push(&d);
        let (code, _, err) = canopy(&args);
        assert_ne!(code, 0, "{cmd:?} on a directory");
        assert!(
            err.contains("is a directory, not an image"),
            "{cmd:?}: {err}"
        );
        assert_eq!(err.matches("directory").count(), 1, "cause repeated: {err}");
    }

    assert_eq!(canopy(&["mkfs", "-q", "-s", "64M", &p("fs.img")]).0, 0);
    let (code, _, err) = canopy(&["mount", &p("fs.img"), &p("missing")]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    std::fs::write(p("plain"), b"").unwrap();
    let (code, _, err) = canopy(&["mount", &p("fs.img"), &p("plain")]);
    assert_eq!(code, 1);
    assert!(err.contains("is not a directory"), "{err}");

    // defragment: a directory needs -r; a file elsewhere has no daemon.
    let (code, _, err) = canopy(&["filesystem", "defragment", &p("adir")]);
    assert_eq!(code, 1);
    assert!(err.contains("-r descends"), "{err}");
    let (code, _, err) = canopy(&["filesystem", "defragment", "-t", "lots", &p("plain")]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = canopy(&["filesystem", "defragment", &p("plain")]);
    assert_eq!(code, 1);
    assert!(err.contains("Canopy"), "{err}");
    // -c takes its codec glued to it, as btrfs's: `-c FILE` is a file,
    // `-cnone` and `-cbrotli` are usage errors.
    for codec in ["-cnone", "-cbrotli", "--compress=zstd:99"] {
        let (code, _, err) = canopy(&["filesystem", "defragment", codec, &p("plain")]);
        assert_eq!(code, 2, "{codec}: {err}");
    }
    for codec in ["-c", "-clz4", "-czstd:5", "--compress=lz4"] {
        let (code, _, err) = canopy(&["filesystem", "defragment", codec, &p("plain")]);
        assert_eq!(code, 1, "{codec}: {err}");
        assert!(err.contains("Canopy"), "{codec}: {err}");
    }
}

/// `canopy subvolume list` and `sync` on an unmounted image: an image left
/// with deleted subvolumes still queued (as after a crash) is listed
/// without them, `check` says what waits for the cleaner, and `sync`
/// frees it all offline.
#[test]
fn subvolume_list_and_sync_on_an_image() {
    use canopy::fs::{Fs, Owner};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let path = img.to_str().unwrap();
    assert_eq!(canopy(&["mkfs", "-q", "-s", "256M", path]).0, 0);
    let me = Owner { uid: 0, gid: 0 };
    {
        let dev = canopy::dev::FileDevice::open(&img, false, true).expect("open image");
        let e = canopy::Engine::open(Arc::new(dev), &Default::default()).expect("engine");
        let fs = Fs::new(Arc::new(e)).expect("fs");
        let root = fs.root_node();
        for name in ["keep", "gone"] {
            let sv = fs
                .create_subvolume(root, name.as_bytes(), me)
                .expect("subvolume");
            for i in 0..400 {
                let a = fs
                    .create(
                        sv.ino,
                        format!("f{i}").as_bytes(),
                        libc::S_IFREG | 0o644,
                        0,
                        me,
                        None,
                    )
                    .expect("create");
                fs.write(a.ino, 0, &[i as u8; 5000]).expect("write");
            }
        }
        fs.sync().expect("sync");
        fs.delete_subvolume(root, b"gone").expect("delete");
        assert!(fs.queued_drops() > 0);
    }
    let (code, out, err) = canopy(&["subvolume", "list", "--json", path]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let paths: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["keep"]);
    let (code, out, _) = canopy(&["check", path]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("wait for the cleaner"), "{out}");
    let (code, _, err) = canopy(&["subvolume", "sync", path]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = canopy(&["check", path]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("wait for the cleaner"), "{out}");
    let (code, _, err) = canopy(&[
        "subvolume",
        "list",
        dir.path().join("missing").to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "a missing path is an error: {err}");
}

#[test]
fn arguments_that_are_not_utf8_are_paths_like_any_other() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let img = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"img-\xff\xfe"));
    for args in [
        vec![
            "mkfs".as_ref(),
            "-q".as_ref(),
            "-s".as_ref(),
            "64M".as_ref(),
            img.as_os_str(),
        ],
        vec!["check".as_ref(), "-q".as_ref(), img.as_os_str()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_canopy"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Missing: an error, not a panic (the mount helper and balance
    // argument rewriting read every argument).
    let missing = dir.path().join(std::ffi::OsStr::from_bytes(b"none-\xff"));
    let out = Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args([
            "balance".as_ref(),
            "start".as_ref(),
            "-dusage=5".as_ref(),
            missing.as_os_str(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 56, item 10: man pages for the command and every subcommand,
/// and completions, made from the command definitions.
#[test]
fn man_pages_and_completions_come_from_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let (code, _, err) = canopy(&["generate", "man", path]);
    assert_eq!(code, 0, "{err}");
    for page in [
        "canopy.8",
        "canopy-mount.8",
        "canopy-subvolume-snapshot.8",
        "canopy-check.8",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_default();
        assert!(
            text.contains(".TH") && text.contains(".SH NAME"),
            "{page}: {text:.200}"
        );
    }
    let text = std::fs::read_to_string(dir.path().join("canopy-mkfs.8")).unwrap();
    assert!(text.contains("nodesize"), "mkfs's page lists its options");
    let (_, bash, _) = canopy(&["generate", "completions", "bash"]);
    assert!(
        bash.contains("complete") && bash.contains("snapshot"),
        "{bash:.300}"
    );
    let (_, zsh, _) = canopy(&["generate", "completions", "zsh"]);
    assert!(zsh.starts_with("#compdef canopy"), "{zsh:.100}");
    let (code, _, _) = canopy(&["generate", "completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
}
