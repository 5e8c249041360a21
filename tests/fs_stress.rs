//! Many threads using one filesystem at once, the way dbench or a build
//! does: small files created, written, read back, renamed, fsynced and
//! deleted while other threads commit. Every read must return what its own
//! thread wrote, no operation may fail, and the image must check clean.

mod common;

use canopy::fs::{Fs, Owner};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

const ROOT: u64 = canopy::format::inode::ROOT_DIR_INO;
const ME: Owner = Owner { uid: 0, gid: 0 };

fn worker(fs: &Fs, id: u64, rounds: u64) {
    let mut rng = common::Rng(id * 7919 + 1);
    let dir = fs
        .create(
            ROOT,
            format!("d{id}").as_bytes(),
            libc::S_IFDIR | 0o755,
            0,
            ME,
            None,
        )
        .unwrap()
        .ino;
    let mut files: Vec<(Vec<u8>, u64, Vec<u8>)> = Vec::new();
    for r in 0..rounds {
        match rng.below(10) {
            0..=3 => {
                let name = format!("f{r}").into_bytes();
                let ino = fs
                    .create(dir, &name, libc::S_IFREG | 0o644, 0, ME, None)
                    .unwrap()
                    .ino;
                fs.open(ino);
                let len = 1 + rng.below(200_000) as usize;
                let byte = rng.below(256) as u8;
                let data = vec![byte; len];
                for (i, chunk) in data.chunks(65536).enumerate() {
                    fs.write(ino, i as u64 * 65536, chunk).unwrap();
                }
                fs.release(ino).unwrap();
                files.push((name, ino, data));
            }
            4 | 5 if !files.is_empty() => {
                let (_, ino, data) = &files[rng.below(files.len() as u64) as usize];
                let got = fs.read(*ino, 0, data.len() as u32 + 100).unwrap();
                assert!(got == *data, "thread {id}: file {ino} reads back wrong");
            }
            6 if !files.is_empty() => {
                let i = rng.below(files.len() as u64) as usize;
                let new = format!("r{r}").into_bytes();
                fs.rename(dir, &files[i].0, dir, &new, false, false)
                    .unwrap();
                files[i].0 = new;
            }
            7 if !files.is_empty() => {
                let i = rng.below(files.len() as u64) as usize;
                let (name, _, _) = files.swap_remove(i);
                fs.remove(dir, &name, false).unwrap();
            }
            8 => fs.sync().unwrap(),
            _ if !files.is_empty() => {
                // Overwrite part of a file.
                let i = rng.below(files.len() as u64) as usize;
                let (_, ino, data) = &mut files[i];
                let off = rng.below(data.len() as u64) as usize;
                let len = (1 + rng.below(10_000) as usize).min(data.len() - off);
                let patch = vec![rng.below(256) as u8; len];
                fs.write(*ino, off as u64, &patch).unwrap();
                data[off..off + len].copy_from_slice(&patch);
            }
            _ => {}
        }
    }
}

#[test]
fn threads_with_fsync_and_commits_match_their_writes() {
    for nodesize in [4096u32, 16384] {
        let (dev, e) = common::mem_engine(512 << 20, nodesize);
        let fs = Arc::new(Fs::new(Arc::new(e)).unwrap());
        fs.set_dirty_limit(1 << 20);
        let stop = Arc::new(AtomicBool::new(false));
        let committer = {
            let (fs, stop) = (fs.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    fs.sync().unwrap();
                    thread::sleep(std::time::Duration::from_millis(2));
                }
            })
        };
        let rounds = std::env::var("CANOPY_STRESS_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300);
        let workers: Vec<_> = (0..3)
            .map(|id| {
                let fs = fs.clone();
                thread::spawn(move || worker(&fs, id, rounds))
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        committer.join().unwrap();
        fs.sync().unwrap();
        drop(fs);
        common::assert_fs_clean(&dev);
    }
}
