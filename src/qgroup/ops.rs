//! Changes to the set of groups, inside a transaction: enabling and
//! disabling quotas, groups, memberships, limits, and what creating,
//! cloning and dropping a subvolume's tree does to them. Each writes its
//! items at once; the numbers follow at commit (`account`).

use super::{info_key, limit_key, relation_keys, status_key, subvol_group, Group, Qgroups};
use crate::error::{Error, Result};
use crate::format::qgroup::{
    level_of, QgroupInfo, QgroupLimit, QgroupStatus, STATUS_ON, STATUS_RESCAN,
};
use crate::format::tree_id::{self, QUOTA};
use crate::format::Key;
use crate::txn::Txn;

fn not_enabled() -> Error {
    Error::Posix(libc::ENOTCONN, "quotas are not enabled")
}

impl Txn<'_> {
    /// The quota groups as the running transaction has them.
    pub fn qgroups(&self) -> &Qgroups {
        super::ledger(self.slots())
    }

    /// The quota groups, to change them.
    pub(crate) fn qgroups_mut(&mut self) -> &mut Qgroups {
        self.slots_mut().entry()
    }

    fn quota_on(&self) -> Result<()> {
        if self.qgroups().enabled {
            Ok(())
        } else {
            Err(not_enabled())
        }
    }

    /// Turns quotas on: a group for every subvolume, counted from scratch
    /// at the next commit.
    pub fn quota_enable(&mut self) -> Result<()> {
        if self.qgroups().enabled {
            return Ok(());
        }
        let status = QgroupStatus {
            version: 1,
            generation: self.transid(),
            flags: STATUS_ON,
            rescan: 0,
        };
        self.put(QUOTA, status_key(), status.encode())?;
        *self.qgroups_mut() = Qgroups {
            enabled: true,
            full: true,
            ..Qgroups::default()
        };
        let trees: Vec<u64> = self
            .tree_ids()
            .into_iter()
            .filter(|&t| tree_id::is_shareable(t))
            .collect();
        for t in trees {
            add_group(self, subvol_group(t))?;
        }
        Ok(())
    }

    /// Turns quotas off and removes every quota item.
    pub fn quota_disable(&mut self) -> Result<()> {
        let items = self.range(QUOTA, &Key::MIN, &Key::MAX)?;
        for (k, _) in items {
            self.delete(QUOTA, &k)?;
        }
        *self.qgroups_mut() = Qgroups::default();
        Ok(())
    }

    /// Starts counting every group again from nothing: each commit from
    /// now on counts a batch of extents in address order (`account`),
    /// so the count never holds the state lock for long. Until it is
    /// done the numbers cover the extents below the rescan's cursor.
    pub fn quota_rescan(&mut self) -> Result<()> {
        self.quota_on()?;
        let q = self.qgroups_mut();
        for (&id, g) in q.groups.iter_mut() {
            g.referenced = 0;
            g.exclusive = 0;
            q.dirty.insert(id);
        }
        q.rescan = Some(0);
        write_status(self)
    }

    /// Makes the next commit run even with nothing else to write, so a
    /// rescan under way counts its next batch.
    pub fn quota_rescan_touch(&mut self) -> Result<()> {
        self.quota_on()?;
        write_status(self)
    }

    /// A new empty group of level 1 or higher.
    pub fn qgroup_create(&mut self, q: u64) -> Result<()> {
        self.quota_on()?;
        if level_of(q) == 0 {
            return Err(Error::Invalid(
                "level-0 groups come and go with their subvolumes".into(),
            ));
        }
        if self.qgroups().groups.contains_key(&q) {
            return Err(Error::Exists);
        }
        add_group(self, q)
    }

    /// Removes a group of level 1 or higher that holds no other group.
    pub fn qgroup_destroy(&mut self, q: u64) -> Result<()> {
        self.quota_on()?;
        if !self.qgroups().groups.contains_key(&q) {
            return Err(Error::NotFound);
        }
        if level_of(q) == 0 && self.tree_exists(crate::format::qgroup::id_of(q)) {
            return Err(Error::Posix(libc::EBUSY, "the subvolume still exists"));
        }
        if self.qgroups().parents.values().any(|ps| ps.contains(&q)) {
            return Err(Error::Posix(
                libc::ENOTEMPTY,
                "the group holds other groups",
            ));
        }
        remove_group(self, q)
    }

    /// Makes group `child` a member of the higher group `parent`.
    pub fn qgroup_assign(&mut self, child: u64, parent: u64) -> Result<()> {
        self.check_relation(child, parent)?;
        if self.qgroups().ancestors(child).contains(&parent) {
            // Directly or through another group: counted once either way.
            return Err(Error::Exists);
        }
        add_relation(self, child, parent)?;
        self.qgroups_mut().full = true;
        Ok(())
    }

    /// Takes group `child` out of `parent`.
    pub fn qgroup_remove(&mut self, child: u64, parent: u64) -> Result<()> {
        self.check_relation(child, parent)?;
        let held = self
            .qgroups()
            .parents
            .get(&child)
            .is_some_and(|p| p.contains(&parent));
        if !held {
            return Err(Error::NotFound);
        }
        remove_relation(self, child, parent)?;
        self.qgroups_mut().full = true;
        Ok(())
    }

    fn check_relation(&self, child: u64, parent: u64) -> Result<()> {
        self.quota_on()?;
        let groups = &self.qgroups().groups;
        if !groups.contains_key(&child) || !groups.contains_key(&parent) {
            return Err(Error::NotFound);
        }
        if level_of(child) >= level_of(parent) {
            return Err(Error::Invalid(
                "a group can only be held by a group of a higher level".into(),
            ));
        }
        Ok(())
    }

    /// Sets or clears group `q`'s limits.
    pub fn qgroup_limit(&mut self, q: u64, limit: QgroupLimit) -> Result<()> {
        self.quota_on()?;
        let Some(g) = self.qgroups_mut().groups.get_mut(&q) else {
            return Err(Error::NotFound);
        };
        g.limit = limit;
        if limit.is_none() {
            match self.delete(QUOTA, &limit_key(q)) {
                Ok(_) | Err(Error::NotFound) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            self.put(QUOTA, limit_key(q), limit.encode()).map(drop)
        }
    }

    /// Checks limits for `referenced` and `exclusive` more bytes in
    /// subvolume `tree` (reflinks: see `Need::shared`).
    pub fn qgroup_check(&self, tree: u64, referenced: u64, exclusive: u64) -> Result<()> {
        self.qgroups().check_limits(tree, referenced, exclusive)
    }
}

fn add_group(tx: &mut Txn<'_>, q: u64) -> Result<()> {
    tx.insert(QUOTA, info_key(q), QgroupInfo::default().encode())?;
    tx.qgroups_mut().groups.insert(q, Group::default());
    Ok(())
}

fn remove_group(tx: &mut Txn<'_>, q: u64) -> Result<()> {
    let parents: Vec<u64> = tx
        .qgroups()
        .parents
        .get(&q)
        .map(|p| p.iter().copied().collect())
        .unwrap_or_default();
    for p in parents {
        remove_relation(tx, q, p)?;
    }
    tx.delete(QUOTA, &info_key(q))?;
    if tx
        .qgroups()
        .groups
        .get(&q)
        .is_some_and(|g| !g.limit.is_none())
    {
        tx.delete(QUOTA, &limit_key(q))?;
    }
    tx.qgroups_mut().groups.remove(&q);
    tx.qgroups_mut().dirty.remove(&q);
    Ok(())
}

fn add_relation(tx: &mut Txn<'_>, child: u64, parent: u64) -> Result<()> {
    for k in relation_keys(child, parent) {
        tx.insert(QUOTA, k, Vec::new())?;
    }
    tx.qgroups_mut()
        .parents
        .entry(child)
        .or_default()
        .insert(parent);
    Ok(())
}

fn remove_relation(tx: &mut Txn<'_>, child: u64, parent: u64) -> Result<()> {
    for k in relation_keys(child, parent) {
        tx.delete(QUOTA, &k)?;
    }
    if let Some(ps) = tx.qgroups_mut().parents.get_mut(&child) {
        ps.remove(&parent);
        if ps.is_empty() {
            tx.qgroups_mut().parents.remove(&child);
        }
    }
    Ok(())
}

/// Quota items a subvolume's creation, snapshot or deletion may write
/// (its group's info and limit, and two per membership it inherits or
/// loses), for reservations.
pub fn items_for_subvolume(q: &Qgroups, source: Option<u64>) -> u64 {
    if !q.enabled {
        return 0;
    }
    let inherited = source.map_or(0, |s| {
        q.parents
            .get(&subvol_group(s))
            .map_or(0, |p| p.len() as u64)
    });
    2 + 2 * inherited
}

/// A new fs tree `id` (an empty subvolume) gets its group.
pub(crate) fn tree_created(tx: &mut Txn<'_>, id: u64) -> Result<()> {
    if !tx.qgroups().enabled || !tree_id::is_shareable(id) {
        return Ok(());
    }
    tx.qgroups_mut().created.insert(id);
    let q = subvol_group(id);
    if tx.qgroups().groups.contains_key(&q) {
        // Left by a subvolume of that id whose group was kept.
        return remove_group(tx, q).and_then(|()| add_group(tx, q));
    }
    add_group(tx, q)
}

/// Tree `dst` was cloned from `src`: its group joins the groups holding
/// `src`'s, and the commit gives it `src`'s numbers (see the module
/// essay).
pub(crate) fn tree_cloned(tx: &mut Txn<'_>, src: u64, dst: u64) -> Result<()> {
    if !tx.qgroups().enabled {
        return Ok(());
    }
    tree_created(tx, dst)?;
    tx.qgroups_mut().created.remove(&dst);
    let parents: Vec<u64> = tx
        .qgroups()
        .parents
        .get(&subvol_group(src))
        .map(|p| p.iter().copied().collect())
        .unwrap_or_default();
    for p in parents {
        add_relation(tx, subvol_group(dst), p)?;
    }
    tx.qgroups_mut().clones.push((src, dst));
    Ok(())
}

/// Tree `id` was dropped: its group goes, and the commit finds what it
/// shared that may now belong to one subvolume alone (from its root at
/// the last commit; one made or cloned in this transaction has none to
/// start from, and the commit counts from scratch).
pub(crate) fn tree_dropped(tx: &mut Txn<'_>, id: u64) -> Result<()> {
    if !tx.qgroups().enabled {
        return Ok(());
    }
    let q = subvol_group(id);
    if tx.qgroups().groups.contains_key(&q) {
        remove_group(tx, q)?;
    }
    let then = tx.committed_root(id);
    let qg = tx.qgroups_mut();
    qg.pending.remove(&id);
    let made_here = qg.created.contains(&id) || qg.clones.iter().any(|&(s, d)| s == id || d == id);
    match then {
        Some(root) if !made_here => qg.dropped.push((id, root)),
        _ => qg.full = true,
    }
    Ok(())
}

/// Writes the status item as the quota state has it (on, and where a
/// rescan has got to).
pub(crate) fn write_status(tx: &mut Txn<'_>) -> Result<()> {
    let rescan = tx.qgroups().rescan;
    let status = QgroupStatus {
        version: 1,
        generation: tx.transid(),
        flags: STATUS_ON | if rescan.is_some() { STATUS_RESCAN } else { 0 },
        rescan: rescan.unwrap_or(0),
    };
    tx.put(QUOTA, status_key(), status.encode()).map(drop)
}
