//! Property tests of the tree, references and allocator against a model.
//! `PROPTEST_CASES` sets the number of cases; see docs/testing.md for the
//! long soak (`soak_million_ops`).

mod common;

use common::model::{Harness, Op};
use proptest::prelude::*;

/// A key type the item checker does not know: engine tests store
/// arbitrary payloads under it.
const TEST_ITEM: u8 = 2;

fn op() -> impl Strategy<Value = Op> {
    let tree = 0usize..6;
    let key = 0u16..1500;
    let len = prop_oneof![8 => 0u16..80, 3 => 80u16..600, 1 => 1000u16..16000];
    prop_oneof![
        20 => (tree.clone(), key.clone(), len.clone()).prop_map(|(tree, key, len)| Op::Insert { tree, key, len }),
        8 => (tree.clone(), key.clone(), len).prop_map(|(tree, key, len)| Op::Put { tree, key, len }),
        12 => (tree.clone(), key.clone()).prop_map(|(tree, key)| Op::Delete { tree, key }),
        3 => (tree.clone(), key.clone(), any::<u8>(), 1u8..8)
            .prop_map(|(tree, from, count, step)| Op::DeleteSorted { tree, from, count, step }),
        3 => (tree.clone(), key.clone(), 1u8..60, any::<bool>())
            .prop_map(|(tree, key, count, backward)| Op::Scan { tree, key, count, backward }),
        3 => (tree.clone(), key.clone(), any::<u8>()).prop_map(|(tree, key, blocks)| Op::NewData { tree, key, blocks }),
        2 => (tree.clone(), key.clone(), key).prop_map(|(tree, from, to)| Op::Reflink { tree, from, to }),
        1 => tree.clone().prop_map(|tree| Op::Clone { tree }),
        1 => tree.prop_map(|tree| Op::Drop { tree }),
        2 => Just(Op::Commit),
        1 => Just(Op::Clean),
        1 => Just(Op::Reopen),
    ]
}

fn run(nodesize: u32, ops: &[Op]) {
    let mut h = Harness::new(nodesize);
    for op in ops {
        h.apply(op);
    }
    h.finish();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn model_4k(ops in proptest::collection::vec(op(), 1..400)) {
        run(4096, &ops);
    }

    #[test]
    fn model_16k(ops in proptest::collection::vec(op(), 1..400)) {
        run(16384, &ops);
    }
}

/// Bulk sequential and reverse insertion, then deletion of everything: the
/// tree must grow several levels and shrink back to one empty leaf.
#[test]
fn grow_and_shrink() {
    let mut h = Harness::new(4096);
    for k in 0..1500u16 {
        h.apply(&Op::Insert {
            tree: 0,
            key: k,
            len: 200,
        });
    }
    h.apply(&Op::Commit);
    for k in (0..1500u16).rev() {
        h.apply(&Op::Delete { tree: 0, key: k });
    }
    h.apply(&Op::Commit);
    h.finish();
}

/// Snapshots: a clone shares everything, diverges independently, and
/// dropping either frees exactly what only it held.
#[test]
fn clones_diverge_and_drop() {
    let mut h = Harness::new(4096);
    for k in 0..800u16 {
        h.apply(&Op::Insert {
            tree: 0,
            key: k,
            len: 150,
        });
        if k % 10 == 0 {
            h.apply(&Op::NewData {
                tree: 0,
                key: k,
                blocks: 2,
            });
        }
    }
    h.apply(&Op::Commit);
    h.apply(&Op::Clone { tree: 0 });
    for k in (0..800u16).step_by(7) {
        h.apply(&Op::Delete { tree: 1, key: k });
        h.apply(&Op::Put {
            tree: 0,
            key: k + 1,
            len: 90,
        });
    }
    h.apply(&Op::Commit);
    h.apply(&Op::Clone { tree: 1 });
    h.apply(&Op::Drop { tree: 1 });
    h.apply(&Op::Commit);
    h.apply(&Op::Reopen);
    h.apply(&Op::Drop { tree: 1 });
    h.apply(&Op::Commit);
    h.finish();
}

/// A long random run. Ignored by default; run it in release mode:
/// `CANOPY_SOAK_OPS=1000000 cargo test --release --test tree_model -- --ignored`.
#[test]
#[ignore]
fn soak_million_ops() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let total: usize = std::env::var("CANOPY_SOAK_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut runner = TestRunner::deterministic();
    let strategy = op();
    let mut done = 0;
    while done < total {
        let mut h = Harness::new(if done % 2 == 0 { 4096 } else { 16384 });
        h.check_every_commit = false;
        for i in 0..20_000 {
            let op = strategy.new_tree(&mut runner).expect("op").current();
            h.apply(&op);
            if i % 2000 == 1999 {
                h.apply(&Op::Commit);
                common::assert_clean(h.dev.as_ref());
            }
        }
        h.finish();
        done += 20_000;
        eprintln!("soak: {done} operations");
    }
}

/// Cases per property: `PROPTEST_CASES` or a quick default for CI.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

/// Walking leaf by leaf forward and backward visits every item once.
#[test]
fn leaf_by_leaf_walk() {
    use canopy::format::tree_id::FS;
    use canopy::tree::Cursor;
    use canopy::Key;
    let (_dev, e) = common::mem_engine(64 << 20, 4096);
    e.write(|tx| {
        for i in 0..3000u64 {
            tx.insert(FS, Key::new(i, TEST_ITEM, 0), vec![7; 60])?;
        }
        Ok(())
    })
    .unwrap();
    e.commit().unwrap();
    e.read(|r| {
        let root = r.root(FS)?;
        let mut c = Cursor::seek(r, &root, &Key::MIN)?;
        let (mut forward, mut leaves) = (Vec::new(), 0);
        loop {
            let (leaf, _) = c.leaf().expect("leaf");
            forward.extend(leaf.items().iter().map(|it| it.key.objectid));
            leaves += 1;
            if c.next_leaf(r)?.is_none() {
                break;
            }
        }
        assert!(leaves > 20);
        assert_eq!(forward, (0..3000).collect::<Vec<_>>());
        let mut backward_leaves = 1;
        while c.prev_leaf(r)?.is_some() {
            backward_leaves += 1;
        }
        assert_eq!(backward_leaves, leaves);
        assert_eq!(c.item().map(|i| i.key.objectid), Some(0));
        Ok(())
    })
    .unwrap();
}

/// Leaves of the tree `FS` as the last commit has it.
fn committed_leaves(e: &canopy::Engine) -> usize {
    use canopy::format::tree_id::FS;
    use canopy::tree::Cursor;
    use canopy::Key;
    e.read(|r| {
        let root = r.root(FS)?;
        let mut c = Cursor::seek(r, &root, &Key::MIN)?;
        let mut leaves = 1;
        while c.next_leaf(r)?.is_some() {
            leaves += 1;
        }
        Ok(leaves)
    })
    .unwrap()
}

/// Ascending inserts (new inodes, new extents, relocated extents) fill
/// leaves: an overflowing leaf shifts entries into its neighbour instead of
/// leaving a half-full leaf behind every split. Descending ones too.
#[test]
fn ascending_inserts_fill_leaves() {
    use canopy::format::node::{HEADER_SIZE, ITEM_HEADER_SIZE};
    use canopy::format::tree_id::FS;
    use canopy::Key;
    const ITEMS: u64 = 3000;
    const LEN: usize = 60;
    let fewest = (ITEMS as usize * (ITEM_HEADER_SIZE + LEN)).div_ceil(4096 - HEADER_SIZE);
    for descending in [false, true] {
        let (_dev, e) = common::mem_engine(64 << 20, 4096);
        e.write(|tx| {
            for i in 0..ITEMS {
                let k = if descending { ITEMS - i } else { i };
                tx.insert(FS, Key::new(k, TEST_ITEM, 0), vec![7; LEN])?;
            }
            Ok(())
        })
        .unwrap();
        e.commit().unwrap();
        let leaves = committed_leaves(&e);
        assert!(
            leaves * 100 <= fewest * 110,
            "descending {descending}: {leaves} leaves where {fewest} would do"
        );
    }
}
