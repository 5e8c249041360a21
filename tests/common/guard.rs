//! An allocator for the hostile-image tests: any single allocation over
//! [`ALLOC_LIMIT`] aborts the process, so a size taken from the disk fails
//! the test. A test binary installs it with
//! `#[global_allocator] static GUARD: common::guard::Guard = common::guard::Guard;`.

use std::alloc::{GlobalAlloc, Layout, System};

/// No single allocation may come near the images' size (32 MiB): the
/// largest legitimate one is a read buffer or an image copy.
pub const ALLOC_LIMIT: usize = 256 << 20;

pub struct Guard;

// SAFETY: forwards to the system allocator; only refuses (by aborting) the
// allocations the test forbids.
unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            disk_sized(layout.size());
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            disk_sized(layout.size());
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        if new > ALLOC_LIMIT {
            disk_sized(new);
        }
        unsafe { System.realloc(ptr, layout, new) }
    }
}

/// Reports without allocating, then aborts: an allocator may not unwind.
fn disk_sized(size: usize) -> ! {
    let mut msg = *b"FAIL: allocation of 0x0000000000000000 bytes sized by the disk\n";
    let hex = b"0123456789abcdef";
    for i in 0..16 {
        msg[22 + i] = hex[(size >> (60 - 4 * i)) & 15];
    }
    // SAFETY: writing a stack buffer to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort()
}
