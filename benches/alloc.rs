//! Cost of one near-mode allocation (`alloc::FreeIndex::near`, seed mail
//! 004) on a clean group and on the worst free-space shapes: issue 40's
//! aim is the worst at most 2x the clean one per allocation. A benchmark,
//! never a test: `cargo bench --bench alloc` (medians in divan's table).

use canopy::alloc::{Allocator, FreeIndex, GroupKind};
use canopy::format::items::BG_DATA;

const UNIT: u64 = 4096;
/// One block group's span.
const GROUP: u64 = 1 << 30;

fn main() {
    divan::main();
}

/// Free space of each shape over one group.
fn shape(name: &str) -> FreeIndex {
    let mut f = FreeIndex::default();
    for_each_extent(name, |s, l| assert!(f.insert(s, l)));
    f
}

/// One data group at `GROUP` with the free space of `name`.
fn allocator(name: &str) -> Allocator {
    let mut a = Allocator::new(4 * GROUP, false);
    a.load_group(
        GROUP,
        GROUP,
        0,
        &canopy::format::items::BlockGroupItem {
            used: 0,
            flags: BG_DATA,
            first: None,
            extra: Vec::new(),
            striped: false,
        },
    )
    .expect("group");
    for_each_extent(name, |s, l| a.load_free(GROUP + s, l).expect("free"));
    a
}

/// Calls `add` with the free extents of shape `name`, in order.
fn for_each_extent(name: &str, mut add: impl FnMut(u64, u64)) {
    match name {
        // A fresh group: a few large extents.
        "clean" => (0..4).for_each(|i| add(i * GROUP / 4, GROUP / 8)),
        // Every other 4 KiB free: no extent holds more than one block.
        "alternating" => (0..GROUP / UNIT / 2).for_each(|i| add(i * 2 * UNIT, UNIT)),
        // Many extents of one size, each enough for the request.
        "equal" => (0..GROUP / (128 * UNIT)).for_each(|i| add(i * 128 * UNIT, 64 * UNIT)),
        // Random sizes from 4 KiB to 256 KiB with random gaps.
        _ => {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut at = 0;
            while at < GROUP - (1 << 20) {
                at += (next() % 64 + 1) * UNIT;
                let len = (next() % 64 + 1) * UNIT;
                add(at, len);
                at += len;
            }
        }
    }
}

/// Hints spread over the group, none in free space of the clean shape's
/// first extent, so every search looks past the hint's own extent.
fn hints() -> impl Iterator<Item = u64> + Clone {
    (0..64u64).map(|i| (i * 7919 % 64) * (GROUP / 64) + GROUP / 8 + UNIT)
}

#[divan::bench(args = ["clean", "alternating", "equal", "random"])]
fn near_64k(bencher: divan::Bencher, name: &str) {
    let f = shape(name);
    let mut hint = hints().cycle();
    bencher.bench_local(|| {
        let h = hint.next().unwrap_or(0);
        divan::black_box(f.near(h, UNIT, 64 * UNIT))
    });
}

/// The whole allocation as a transaction pays for it (groups in order,
/// the near search, taking the space and journalling it), then freeing
/// it again, so every iteration sees the same shape.
#[divan::bench(args = ["clean", "alternating", "equal", "random"])]
fn alloc_and_free_64k(bencher: divan::Bencher, name: &str) {
    let mut a = allocator(name);
    let mut hint = hints().cycle();
    bencher.bench_local(|| {
        let h = GROUP + hint.next().unwrap_or(0);
        let (s, l) = a.alloc(GroupKind::Data, UNIT, 64 * UNIT, h).expect("space");
        a.free(s, l, true).expect("free");
        a.take_journal();
    });
}
