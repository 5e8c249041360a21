//! Helpers shared by the integration tests.
#![allow(dead_code)]

use canopy::dev::{Device, MemDevice};
use canopy::{Engine, FormatOptions};
use std::sync::Arc;

pub fn mem_engine(size: u64, nodesize: u32) -> (Arc<MemDevice>, Engine) {
    let dev = Arc::new(MemDevice::new(size));
    let opts = FormatOptions {
        nodesize,
        fsid: Some([0x42; 16]),
        ..Default::default()
    };
    let e = Engine::format(dev.clone() as Arc<dyn Device>, &opts).expect("format");
    (dev, e)
}

/// Runs `canopy::check` and panics with the problems if any.
pub fn assert_clean(dev: &dyn Device) {
    let r = canopy::check::check(dev, &|_, _| {}).expect("check ran");
    assert!(r.is_clean(), "check found problems: {:#?}", r.problems);
}

/// Structural and POSIX-level check of an image in memory.
pub fn assert_fs_clean(dev: &canopy::dev::MemDevice) {
    let copy = Arc::new(canopy::dev::MemDevice::from_bytes(dev.snapshot()));
    let r = canopy::check::check_all(copy, &|_, _| {}).expect("check ran");
    assert!(r.is_clean(), "check found problems: {:#?}", r.problems);
}
pub mod model;
pub mod mounted;

/// A small deterministic xorshift generator for workloads.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
