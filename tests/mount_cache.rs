//! The kernel's page cache over a real FUSE mount: pages a reader brought
//! in stay cached through writes and later opens, while relatime still
//! records the first read after a change. (Opens used to drop every
//! cached page of a file changed since its last access, so a database
//! re-read its whole working set after each write and reopen.)

mod common;

use common::mounted::{can_mount, Mounted};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

const PAGE: usize = 4096;

/// Pages of `f`'s first `len` bytes in the page cache (mincore over a
/// shared read-only mapping, which reads nothing).
fn resident_pages(f: &Path, len: usize) -> usize {
    let file = fs::File::open(f).unwrap();
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open
    // file, unmapped below; mincore writes one byte per page into `vec`.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        let rc = libc::mincore(map, len, vec.as_mut_ptr());
        libc::munmap(map, len);
        assert_eq!(rc, 0, "mincore");
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }
}

fn atime_ns(f: &Path) -> i128 {
    let md = fs::metadata(f).unwrap();
    i128::from(md.atime()) * 1_000_000_000 + i128::from(md.atime_nsec())
}

#[test]
fn cached_pages_survive_a_write_and_a_reopen() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new();
    let f = m.p("db");
    let len = 8 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
    fs::write(&f, &data).unwrap();
    let mut all = Vec::new();
    fs::File::open(&f).unwrap().read_to_end(&mut all).unwrap();
    assert_eq!(all, data);
    let pages = len / PAGE;
    assert!(resident_pages(&f, len) * 10 >= pages * 9, "read whole");

    // A change, then an open for reading: the access is due and recorded,
    // and the pages stay.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let w = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(&[0xaa; PAGE], 0).unwrap();
    w.sync_all().unwrap();
    drop(w);
    let changed = fs::metadata(&f).unwrap().mtime();
    let mut r = fs::File::open(&f).unwrap();
    let resident = resident_pages(&f, len);
    assert!(
        resident * 10 >= pages * 9,
        "an open after a write dropped the cache: {resident} of {pages} pages left"
    );
    let mut head = [0u8; 8];
    r.read_exact(&mut head).unwrap();
    assert_eq!(head, [0xaa; 8], "the write shows through the cache");
    assert!(
        atime_ns(&f) / 1_000_000_000 >= i128::from(changed),
        "relatime: the read after the change is recorded"
    );
}
