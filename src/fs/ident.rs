//! Subvolume identities: the uuids and transids send streams name
//! subvolumes by (see `format::items::SubvolIdent`). A subvolume gets one
//! when it is created or snapshotted; one made before the feature gets one
//! the first time it is made read-only or sent.

use super::subvol::ROOT_READONLY;
use super::{errno, Core, Fs};
use crate::error::{Error, Result};
use crate::format::items::SubvolIdent;
use crate::format::tree_id;
use crate::txn::{Need, Txn};

/// The random bytes a filesystem id is made of, shaped as a version-4
/// uuid.
fn random_uuid() -> [u8; 16] {
    let mut u = crate::txn::random_fsid();
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Subvolume `id`'s identity, given one in `tx` if it has none yet.
pub(crate) fn ensure(tx: &mut Txn<'_>, id: u64) -> Result<SubvolIdent> {
    let item = tx.root_item(id)?;
    if let Some(ident) = item.ident {
        return Ok(ident);
    }
    let ident = SubvolIdent {
        uuid: random_uuid(),
        parent_uuid: match item.parent_id {
            0 => [0; 16],
            p if tx.tree_exists(p) => ensure(tx, p)?.uuid,
            _ => [0; 16],
        },
        ctransid: tx.transid(),
        ..Default::default()
    };
    tx.set_root_ident(id, ident)?;
    Ok(ident)
}

/// Gives a new subvolume `id` its identity: a fresh uuid, and the
/// source's as parent for a snapshot.
pub(crate) fn assign_new(tx: &mut Txn<'_>, id: u64, source: Option<u64>) -> Result<()> {
    let parent_uuid = match source {
        Some(s) => ensure(tx, s)?.uuid,
        None => [0; 16],
    };
    let ident = SubvolIdent {
        uuid: random_uuid(),
        parent_uuid,
        ctransid: tx.transid(),
        ..Default::default()
    };
    tx.set_root_ident(id, ident)
}

/// On a change of the read-only flag: made read-only, the subvolume's
/// contents are what send will see from now on (ctransid); made writable,
/// it no longer matches what it was received from (btrfs clears
/// received_uuid then too).
pub(crate) fn read_only_changed(tx: &mut Txn<'_>, id: u64, ro: bool) -> Result<()> {
    let mut ident = ensure(tx, id)?;
    if ro {
        ident.ctransid = tx.transid();
    } else {
        ident.received_uuid = [0; 16];
        ident.stransid = 0;
        ident.rtransid = 0;
    }
    tx.set_root_ident(id, ident)
}

impl Core {
    /// Subvolume `id`'s identity, given one (and committed) if it has none.
    pub(crate) fn subvolume_ident(&self, id: u64) -> Result<SubvolIdent> {
        if let Some(ident) = self.engine.read(|r| Ok(r.root_item(id)?.ident))? {
            return Ok(ident);
        }
        if self.engine.is_read_only() {
            return Err(Error::Invalid(
                "this subvolume has no uuid yet, and a read-only filesystem cannot give it one \
                 (snapshots and subvolumes made by `canopy subvolume` have one)"
                    .into(),
            ));
        }
        let ident = self.write_reserved(|tx| {
            tx.reserve(&Need::items(tree_id::ROOT, 2))?;
            ensure(tx, id)
        })?;
        self.engine.commit()?;
        Ok(ident)
    }
}

impl Fs {
    /// The end of `canopy receive`: subvolume `node` (its root) was made
    /// from the stream of subvolume `received_uuid` at the sender's
    /// `stransid`; it becomes read-only, and later incremental streams
    /// find it as their parent by that uuid.
    pub fn set_received(&self, node: u64, received_uuid: [u8; 16], stransid: u64) -> Result<()> {
        let (tree, ino) = super::split_node(node);
        if ino != crate::format::inode::ROOT_DIR_INO || tree == tree_id::FS {
            return Err(errno(libc::EINVAL, "not a subvolume"));
        }
        let sv = self.core.subvol(tree)?;
        sv.flush_own()?;
        self.core.write_reserved(|tx| {
            tx.reserve(&Need::items(tree_id::ROOT, 2))?;
            let flags = tx.root_item(tree)?.flags | ROOT_READONLY;
            tx.set_root_flags(tree, flags)?;
            let mut ident = ensure(tx, tree)?;
            ident.received_uuid = received_uuid;
            ident.stransid = stransid;
            ident.rtransid = tx.transid();
            ident.ctransid = tx.transid();
            tx.set_root_ident(tree, ident)
        })?;
        sv.readonly
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.core.engine.commit().map(drop)
    }
}
