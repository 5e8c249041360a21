//! Reading the back-references of one extent, and the bound on climbing
//! them: the commit's quota accounting and balance both walk from an
//! extent up through its holders to the trees above it.

use crate::error::{Error, Result};
use crate::format::items::decode_ref_count;
use crate::format::key_type::{SHARED_BLOCK_REF, SHARED_DATA_REF, TREE_BLOCK_REF};
use crate::format::Key;
use crate::tree::{BlockRead, Cursor, RootPtr};
use crate::txn::RefHolder;
use std::ops::ControlFlow;

/// Tree levels a climb may pass before the extent tree is taken for
/// corrupt (a cycle of back-references).
const MAX_CLIMB: usize = 2 * crate::format::node::MAX_LEVEL as usize + 2;

/// Every holder of the extent at `bytenr` recorded in the extent tree at
/// `extent_root`, with its count (items of a leaf pointing at a data
/// extent; 1 for a tree holder).
pub fn backrefs<B: BlockRead + ?Sized>(
    b: &B,
    extent_root: &RootPtr,
    bytenr: u64,
) -> Result<Vec<(RefHolder, i64)>> {
    let mut out = Vec::new();
    for_each_backref(b, extent_root, bytenr, |holder, count| {
        out.push((holder, count));
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(out)
}

/// Calls `f` with the holders of the extent at `bytenr` in key order
/// (roots, parent blocks, data leaves) until it breaks. A block under
/// many snapshots has a holder per snapshot: a caller that needs only
/// a few of them reads only those.
pub fn for_each_backref<B: BlockRead + ?Sized>(
    b: &B,
    extent_root: &RootPtr,
    bytenr: u64,
    mut f: impl FnMut(RefHolder, i64) -> Result<ControlFlow<()>>,
) -> Result<()> {
    let mut c = Cursor::seek(b, extent_root, &Key::new(bytenr, TREE_BLOCK_REF, 0))?;
    while let Some(it) = c.item() {
        let k = it.key;
        if k.objectid != bytenr || k.ty > SHARED_DATA_REF {
            break;
        }
        let holder = match k.ty {
            TREE_BLOCK_REF => Some((RefHolder::TreeRoot(k.offset), 1)),
            SHARED_BLOCK_REF => Some((RefHolder::TreeParent(k.offset), 1)),
            SHARED_DATA_REF => {
                let n = decode_ref_count(it.data).map_err(|e| Error::corrupt(bytenr, e))?;
                Some((RefHolder::DataLeaf(k.offset), i64::from(n)))
            }
            _ => None,
        };
        if let Some((holder, count)) = holder {
            if f(holder, count)?.is_break() {
                break;
            }
        }
        if c.next(b)?.is_none() {
            break;
        }
    }
    Ok(())
}

/// Refuses a climb `depth` levels above its start at `bytenr`: no tree is
/// that tall, so the back-references loop.
pub fn check_climb(bytenr: u64, depth: usize) -> Result<()> {
    if depth > MAX_CLIMB {
        return Err(Error::corrupt(
            bytenr,
            "back-references climb higher than any tree",
        ));
    }
    Ok(())
}
