//! Quota groups as `canopy quota` and `canopy qgroup` see them: each
//! change is one transaction, committed before it returns, so the
//! numbers shown afterwards include it (see `qgroup` for the accounting).

use super::{errno, split_node, Core, Fs};
use crate::error::{Error, Result};
use crate::format::inode::ROOT_DIR_INO;
use crate::format::qgroup::{display, level_of};
use crate::format::tree_id::QUOTA;
use crate::txn::{Need, Txn};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// A change to quotas or qgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaChange {
    Enable,
    Disable,
    Rescan,
    Create(u64),
    Destroy(u64),
    Assign {
        child: u64,
        parent: u64,
    },
    Remove {
        child: u64,
        parent: u64,
    },
    /// Sets (Some) or clears (None) one of group `qgroupid`'s limits.
    Limit {
        qgroupid: u64,
        bytes: Option<u64>,
        exclusive: bool,
    },
}

/// One row of `canopy qgroup show`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QgroupRow {
    /// `level/id`, as btrfs-progs prints it.
    pub qgroupid: String,
    /// The subvolume's path for a level-0 group (None for higher levels
    /// and for a subvolume that no longer exists).
    pub path: Option<String>,
    pub referenced: u64,
    pub exclusive: u64,
    pub max_referenced: Option<u64>,
    pub max_exclusive: Option<u64>,
    /// The groups holding this one, and those it holds.
    pub parents: Vec<String>,
    pub children: Vec<String>,
}

/// How far a quota rescan has got (`canopy quota rescan -s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescanStatus {
    /// A rescan is under way: the numbers count the extents below
    /// `cursor` only.
    pub running: bool,
    /// A thread is committing to carry it on (false with `running`: it
    /// stopped, see the daemon's log; starting a rescan again restarts it).
    #[serde(default)]
    pub thread: bool,
    /// The address the rescan counts from next, of `total` bytes.
    pub cursor: u64,
    pub total: u64,
}

/// Quota items one change may write (disabling deletes them all, which
/// a deletion's reservation covers).
const CHANGE_ITEMS: u64 = 4;

impl Fs {
    /// Applies `change` and commits. A rescan goes on in the background
    /// (one batch of extents per commit, driven by a thread): see
    /// [`Fs::quota_rescan_status`] and [`Fs::quota_rescan_wait`].
    pub fn quota(&self, change: QuotaChange) -> Result<()> {
        self.core.quota(change)?;
        if change == QuotaChange::Rescan {
            self.core.spawn_rescan()?;
        }
        Ok(())
    }

    pub fn quota_rescan_status(&self) -> Result<RescanStatus> {
        let cursor = self.core.engine.read(|r| Ok(r.qgroups().rescan_cursor()))?;
        let thread = self.core.rescan_thread.is_running();
        Ok(RescanStatus {
            running: cursor.is_some(),
            thread,
            cursor: cursor.unwrap_or(0),
            total: self.core.engine.space_for_statfs().0,
        })
    }

    /// Returns once no rescan is under way (counting on this thread if
    /// no rescan thread runs).
    pub fn quota_rescan_wait(&self) -> Result<()> {
        self.core.rescan_thread.join();
        self.core.rescan_until_done(&AtomicBool::new(false))
    }

    /// At mount: carries on a rescan an earlier mount left.
    pub fn quota_rescan_resume_if_recorded(&self) -> Result<()> {
        if self.quota_rescan_status()?.running {
            tracing::info!("carrying on the quota rescan an earlier mount left");
            self.core.spawn_rescan()?;
        }
        Ok(())
    }

    /// Stops the rescan thread (unmount); the rescan stays recorded.
    pub fn quota_rescan_stop(&self) {
        self.core.rescan_thread.stop();
    }

    /// The qgroup id of the subvolume whose root directory is `node`.
    pub fn qgroup_of_node(&self, node: u64) -> Result<u64> {
        let (tree, ino) = split_node(node);
        if ino != ROOT_DIR_INO {
            return Err(errno(libc::EINVAL, "not a subvolume"));
        }
        Ok(crate::qgroup::subvol_group(tree))
    }

    /// Every group with its numbers, after writing out everything
    /// buffered and committing, so the numbers include every write made
    /// before the call.
    pub fn qgroup_show(&self) -> Result<Vec<QgroupRow>> {
        self.core.sync()?;
        self.core.engine.read(|r| {
            let q = r.qgroups();
            if !q.enabled() {
                return Err(errno(libc::ENOTCONN, "quotas are not enabled"));
            }
            q.list()
                .into_iter()
                .map(|g| {
                    let path = if level_of(g.qgroupid) == 0 {
                        let id = crate::format::qgroup::id_of(g.qgroupid);
                        r.tree_exists(id)
                            .then(|| super::subvol::path_of(r, id))
                            .transpose()?
                    } else {
                        None
                    };
                    Ok(QgroupRow {
                        qgroupid: display(g.qgroupid),
                        path,
                        referenced: g.group.referenced,
                        exclusive: g.group.exclusive,
                        max_referenced: g.group.limit.max_referenced,
                        max_exclusive: g.group.limit.max_exclusive,
                        parents: g.parents.iter().map(|&p| display(p)).collect(),
                        children: g.children.iter().map(|&c| display(c)).collect(),
                    })
                })
                .collect()
        })
    }
}

impl Core {
    fn quota(&self, change: QuotaChange) -> Result<()> {
        if self.remounted_ro.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly);
        }
        if change == QuotaChange::Rescan {
            // Buffered data first, so the count includes it.
            self.flush_all()?;
        }
        self.engine.write(|tx| {
            let need = Need::items(QUOTA, CHANGE_ITEMS);
            let deleting = matches!(
                change,
                QuotaChange::Disable | QuotaChange::Destroy(_) | QuotaChange::Remove { .. }
            );
            tx.reserve(&if deleting { need.deleting() } else { need })?;
            apply(tx, change)
        })?;
        self.engine.commit().map(drop)
    }
}

fn apply(tx: &mut Txn<'_>, change: QuotaChange) -> Result<()> {
    match change {
        QuotaChange::Enable => tx.quota_enable(),
        QuotaChange::Disable => tx.quota_disable(),
        QuotaChange::Rescan => tx.quota_rescan(),
        QuotaChange::Create(q) => tx.qgroup_create(q),
        QuotaChange::Destroy(q) => tx.qgroup_destroy(q),
        QuotaChange::Assign { child, parent } => tx.qgroup_assign(child, parent),
        QuotaChange::Remove { child, parent } => tx.qgroup_remove(child, parent),
        QuotaChange::Limit {
            qgroupid,
            bytes,
            exclusive,
        } => {
            if !tx.qgroups().enabled() {
                return Err(errno(libc::ENOTCONN, "quotas are not enabled"));
            }
            let mut limit = tx
                .qgroups()
                .groups
                .get(&qgroupid)
                .map(|g| g.limit)
                .ok_or(Error::NotFound)?;
            if exclusive {
                limit.max_exclusive = bytes;
            } else {
                limit.max_referenced = bytes;
            }
            tx.qgroup_limit(qgroupid, limit)
        }
    }
}
