mod common;

use canopy::dev::Device;
use canopy::format::tree_id::FS;
use canopy::{Engine, Key, OpenOptions};
use std::sync::Arc;

/// A key type the item checker does not know: engine tests store
/// arbitrary payloads under it.
const TEST_ITEM: u8 = 2;

#[test]
fn insert_commit_reopen_and_check() {
    let (dev, e) = common::mem_engine(128 << 20, 4096);
    common::assert_clean(dev.as_ref());
    e.write(|tx| {
        for i in 0..5000u64 {
            tx.insert(
                FS,
                Key::new(i, TEST_ITEM, 0),
                vec![(i % 251) as u8; (i % 100) as usize],
            )?;
        }
        Ok(())
    })
    .unwrap();
    e.commit().unwrap();
    common::assert_clean(dev.as_ref());
    e.write(|tx| {
        for i in (0..5000u64).step_by(3) {
            tx.delete(FS, &Key::new(i, TEST_ITEM, 0))?;
        }
        Ok(())
    })
    .unwrap();
    e.commit().unwrap();
    drop(e);
    common::assert_clean(dev.as_ref());
    let e = Engine::open(dev.clone() as Arc<dyn Device>, &OpenOptions::default()).unwrap();
    e.read(|r| {
        let all = r.range(FS, &Key::MIN, &Key::MAX)?;
        let want: Vec<u64> = (0..5000u64).filter(|i| i % 3 != 0).collect();
        assert_eq!(all.len(), want.len());
        for ((k, d), i) in all.iter().zip(want) {
            assert_eq!(k.objectid, i);
            assert_eq!(d.len(), (i % 100) as usize);
        }
        Ok(())
    })
    .unwrap();
}
