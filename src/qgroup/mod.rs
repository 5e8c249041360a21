//! Quota groups: how many bytes each subvolume reaches, and limits on it.
//!
//! As in btrfs, every subvolume has a level-0 group (`0/ID`); groups of
//! higher levels (`1/N`, ...) hold lower ones. A group's *referenced*
//! bytes are those of every extent (tree block or data extent) that one of
//! its subvolumes reaches; its *exclusive* bytes those that only its
//! subvolumes reach. The numbers are exact after every commit.
//!
//! The seed mail (000) is the model of what not to do: btrfs once traced
//! every extent below a modified block, and relocation redid accounting
//! that relocation cannot change. Here the accounting costs what the
//! transaction changed:
//!
//! - The set of subvolumes reaching an extent changes only when a pointer
//!   to it is added or removed for some other reason than a block being
//!   copied. A copy holds what its original held, so its children are
//!   reached by the same trees as before; `BlockWrite::copying_refs`
//!   marks those reference changes, and only the rest are *traced*.
//! - At commit, for each traced extent, [`roots::RootsWalk`] finds who
//!   reached it in the last commit and who reaches it now, by climbing
//!   back-references (each block climbed once per commit), and the
//!   difference moves bytes between groups (`account`).
//! - A snapshot shares its source's whole tree with one reference on the
//!   root: it does not trace the tree. For every extent not traced, the
//!   source reaching it means the snapshot does too, so the snapshot's
//!   referenced bytes are the source's, less the traced extents, and the
//!   source loses its exclusive bytes the same way; a snapshot joins its
//!   source's higher groups, so their numbers do not move.
//! - Deleting a subvolume traces, from its root at the last commit, the
//!   blocks and extents it reached that fewer than two other subvolumes
//!   reach (below a block two others reach, nobody's exclusive bytes
//!   change); with groups of groups, or past a budget, the commit counts
//!   from scratch instead.
//! - What cannot be done by difference (changing which groups hold which,
//!   enabling) is recomputed from scratch in that commit by
//!   [`roots::compute_usage`], the same count `canopy check` makes.
//!
//! Limits are checked where space is reserved (`Txn::reserve`): bytes a
//! write buffers or allocates count against every group holding its
//! subvolume until the commit that accounts them, and an operation that
//! would pass a limit fails with EDQUOT before it changes anything.
//! Deleting never checks.
//!
//! The transaction keeps the groups in its slots and calls [`Quota`] at
//! its fixed points (reservations, tree creation and drops, each commit).

pub(crate) mod account;
pub(crate) mod ops;
pub mod roots;

pub use roots::{compute_usage, Roots, Usage};

use crate::txn::{Mechanism, Reader, Slots, Txn};
use std::sync::LazyLock;

use crate::error::{Error, Result};
use crate::format::key_type::{QGROUP_INFO, QGROUP_LIMIT, QGROUP_RELATION, QGROUP_STATUS};
use crate::format::qgroup::{level_of, qgroupid, QgroupInfo, QgroupLimit, QgroupStatus};
use crate::format::tree_id::QUOTA;
use crate::format::Key;
use crate::tree::{BlockRead, Cursor, RootPtr};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// One group's numbers and limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Group {
    pub referenced: u64,
    pub exclusive: u64,
    pub limit: QgroupLimit,
}

/// What `canopy qgroup show` lists for a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    pub qgroupid: u64,
    pub group: Group,
    pub parents: Vec<u64>,
    pub children: Vec<u64>,
}

/// The quota state of the running transaction (in the engine's state).
#[derive(Default)]
pub struct Qgroups {
    pub(crate) enabled: bool,
    pub(crate) groups: BTreeMap<u64, Group>,
    /// Direct memberships: group -> the higher groups holding it.
    pub(crate) parents: BTreeMap<u64, BTreeSet<u64>>,
    /// Groups whose numbers the next commit writes.
    pub(crate) dirty: BTreeSet<u64>,
    /// Extents whose set of reaching subvolumes may have changed in this
    /// transaction: bytenr -> (length, is data).
    pub(crate) traced: BTreeMap<u64, (u64, bool)>,
    /// Clones made in this transaction: (source, new tree).
    pub(crate) clones: Vec<(u64, u64)>,
    /// Trees created in this transaction.
    pub(crate) created: BTreeSet<u64>,
    /// Subvolumes deleted in this transaction, with their roots at the
    /// last commit: the commit traces what they reached that some other
    /// subvolume may now hold alone (`account`).
    pub(crate) dropped: Vec<(u64, RootPtr)>,
    /// The commit recomputes every number from scratch.
    pub(crate) full: bool,
    /// Commits since open that counted from scratch.
    pub(crate) recounts: u64,
    /// A rescan is under way: the numbers count the extents below this
    /// address (what each commit has counted so far, see `account`).
    pub(crate) rescan: Option<u64>,
    /// Bytes each subvolume holds buffered, and has flushed since the
    /// last commit: (buffered, flushed), counted against limits until a
    /// commit accounts them.
    pub(crate) pending: BTreeMap<u64, (u64, u64)>,
    /// Witnesses earlier commits found (`roots::KeptWitnesses`).
    pub(crate) kept: roots::KeptWitnesses,
}

/// The level-0 group of subvolume `tree`.
pub fn subvol_group(tree: u64) -> u64 {
    qgroupid(0, tree)
}

fn status_key() -> Key {
    Key::new(0, QGROUP_STATUS, 0)
}

fn info_key(q: u64) -> Key {
    Key::new(0, QGROUP_INFO, q)
}

fn limit_key(q: u64) -> Key {
    Key::new(0, QGROUP_LIMIT, q)
}

fn relation_keys(child: u64, parent: u64) -> [Key; 2] {
    [
        Key::new(child, QGROUP_RELATION, parent),
        Key::new(parent, QGROUP_RELATION, child),
    ]
}

fn bad(key: &Key, why: String) -> Error {
    key.bad(why)
}

impl Qgroups {
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Where a rescan under way has got to (None: the numbers are whole).
    pub fn rescan_cursor(&self) -> Option<u64> {
        self.rescan
    }

    /// Reads the quota tree (at open).
    pub fn load<B: BlockRead + ?Sized>(b: &B, root: &RootPtr) -> Result<Qgroups> {
        let mut q = Qgroups::default();
        let mut c = Cursor::seek(b, root, &Key::MIN)?;
        let mut cur = c.item().map(|it| (it.key, it.data.to_vec()));
        while let Some((key, data)) = cur {
            crate::format::qgroup::check(&key, &data).map_err(|e| bad(&key, e))?;
            match key.ty {
                QGROUP_STATUS => {
                    let s = QgroupStatus::decode(&data).map_err(|e| bad(&key, e))?;
                    q.enabled = true;
                    q.rescan = s.rescan_cursor();
                }
                QGROUP_INFO => {
                    let i = QgroupInfo::decode(&data).map_err(|e| bad(&key, e))?;
                    let g = q.groups.entry(key.offset).or_default();
                    g.referenced = i.referenced;
                    g.exclusive = i.exclusive;
                }
                QGROUP_LIMIT => {
                    let l = QgroupLimit::decode(&data).map_err(|e| bad(&key, e))?;
                    q.groups.entry(key.offset).or_default().limit = l;
                }
                QGROUP_RELATION if level_of(key.objectid) < level_of(key.offset) => {
                    q.parents
                        .entry(key.objectid)
                        .or_default()
                        .insert(key.offset);
                }
                _ => {}
            }
            cur = c.next(b)?.map(|it| (it.key, it.data.to_vec()));
        }
        Ok(q)
    }

    /// Every group holding `q`, directly or through others (not `q`).
    pub fn ancestors(&self, q: u64) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        let mut todo = vec![q];
        while let Some(g) = todo.pop() {
            for &p in self.parents.get(&g).into_iter().flatten() {
                if out.insert(p) {
                    todo.push(p);
                }
            }
        }
        out
    }

    /// The groups subvolume `tree` counts in: its own and every one above.
    pub fn groups_of(&self, tree: u64) -> BTreeSet<u64> {
        let own = subvol_group(tree);
        if !self.groups.contains_key(&own) {
            return BTreeSet::new();
        }
        let mut out = self.ancestors(own);
        out.insert(own);
        out
    }

    /// Fails with EDQUOT when `referenced` more bytes referenced and
    /// `exclusive` more held alone by subvolume `tree` would pass a limit
    /// of a group it counts in.
    pub fn check_limits(&self, tree: u64, referenced: u64, exclusive: u64) -> Result<()> {
        if !self.enabled || (referenced == 0 && exclusive == 0) {
            return Ok(());
        }
        for q in self.groups_of(tree) {
            let Some(g) = self.groups.get(&q) else {
                continue;
            };
            if g.limit.is_none() {
                continue;
            }
            let pending = self.pending_in(q);
            let over = |used: u64, more: u64, max: Option<u64>| {
                max.is_some_and(|m| used.saturating_add(pending).saturating_add(more) > m)
            };
            if over(g.referenced, referenced, g.limit.max_referenced)
                || over(g.exclusive, exclusive, g.limit.max_exclusive)
            {
                return Err(Error::Posix(libc::EDQUOT, "disk quota exceeded"));
            }
        }
        Ok(())
    }

    /// Bytes not yet accounted of the subvolumes group `q` holds.
    fn pending_in(&self, q: u64) -> u64 {
        self.pending
            .iter()
            .filter(|(&t, _)| {
                let own = subvol_group(t);
                own == q || self.ancestors(own).contains(&q)
            })
            .map(|(_, &(b, f))| b + f)
            .sum()
    }

    /// Subvolume `tree` buffered `bytes` more.
    pub(crate) fn hold(&mut self, tree: u64, bytes: u64) {
        self.pending.entry(tree).or_insert((0, 0)).0 += bytes;
    }

    /// Subvolume `tree` flushed or dropped `bytes` it buffered: they still
    /// count until the commit has accounted what the flush wrote.
    pub(crate) fn release(&mut self, tree: u64, bytes: u64) {
        let p = self.pending.entry(tree).or_insert((0, 0));
        p.0 = p.0.saturating_sub(bytes);
        p.1 += bytes;
    }

    /// How many commits since open counted every number from scratch
    /// (instead of by what changed).
    pub fn recounts(&self) -> u64 {
        self.recounts
    }

    /// The commit accounted everything flushed before it.
    pub(crate) fn forget_flushed(&mut self) {
        self.pending.retain(|_, p| {
            p.1 = 0;
            p.0 > 0
        });
    }

    /// What the groups say now.
    pub fn list(&self) -> Vec<GroupInfo> {
        let mut children: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (&c, ps) in &self.parents {
            for &p in ps {
                children.entry(p).or_default().push(c);
            }
        }
        self.groups
            .iter()
            .map(|(&q, &g)| GroupInfo {
                qgroupid: q,
                group: g,
                parents: self
                    .parents
                    .get(&q)
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default(),
                children: children.remove(&q).unwrap_or_default(),
            })
            .collect()
    }

    /// Sets every group's numbers from a count made from scratch.
    pub(crate) fn set_from_usage(&mut self, usage: &Usage) {
        let fresh = self.tally(usage);
        for (&q, g) in self.groups.iter_mut() {
            let (r, e) = fresh.get(&q).copied().unwrap_or((0, 0));
            if (g.referenced, g.exclusive) != (r, e) {
                g.referenced = r;
                g.exclusive = e;
                self.dirty.insert(q);
            }
        }
    }

    /// Every group's (referenced, exclusive) bytes in `usage`.
    pub fn tally(&self, usage: &Usage) -> BTreeMap<u64, (u64, u64)> {
        // Extents reached by the same subvolumes mostly share one set
        // (`compute_usage`): add up the bytes of each set first, then give
        // each distinct set's bytes to its groups once.
        let mut by_set: HashMap<*const BTreeSet<u64>, (&Roots, u64)> = HashMap::new();
        for (len, roots) in usage.extents.values() {
            by_set.entry(Arc::as_ptr(roots)).or_insert((roots, 0)).1 += len;
        }
        let mut by_content: BTreeMap<&BTreeSet<u64>, u64> = BTreeMap::new();
        for (roots, len) in by_set.into_values() {
            *by_content.entry(&**roots).or_insert(0) += len;
        }
        let mut memo = BTreeMap::new();
        let mut out: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (roots, len) in by_content {
            for (q, alone) in self.shares(roots, &mut memo) {
                let t = out.entry(q).or_insert((0, 0));
                t.0 += len;
                t.1 += len * u64::from(alone);
            }
        }
        out
    }

    /// Each group some of `roots` count in (it references an extent these
    /// subvolumes reach), with whether it holds it alone (exclusive).
    /// `memo` keeps each subvolume's groups, for callers that ask about
    /// many sets.
    pub(crate) fn shares(
        &self,
        roots: &BTreeSet<u64>,
        memo: &mut BTreeMap<u64, Vec<u64>>,
    ) -> Vec<(u64, bool)> {
        let mut all = Vec::new();
        for &r in roots {
            let groups = memo
                .entry(r)
                .or_insert_with(|| self.groups_of(r).into_iter().collect());
            all.extend_from_slice(groups);
        }
        all.sort_unstable();
        all.chunk_by(|a, b| a == b)
            .map(|run| (run[0], run.len() == roots.len()))
            .collect()
    }
}

/// The quota groups in `slots`: none enabled until a mechanism put them
/// there (a newly formatted image).
fn ledger(slots: &Slots) -> &Qgroups {
    static NONE: LazyLock<Qgroups> = LazyLock::new(Qgroups::default);
    slots.get::<Qgroups>().unwrap_or(&NONE)
}

impl Reader<'_> {
    /// The quota groups as the running transaction has them.
    pub fn qgroups(&self) -> &Qgroups {
        ledger(self.slots())
    }
}

/// Quota groups at the transaction's fixed points.
pub struct Quota;

impl Mechanism for Quota {
    fn open(&self, r: &Reader<'_>, slots: &mut Slots) -> Result<()> {
        if r.tree_exists(QUOTA) {
            slots.set(Qgroups::load(r, &r.root(QUOTA)?)?);
        }
        Ok(())
    }

    fn account(&self, tx: &mut Txn<'_>) -> Result<bool> {
        account::run(tx)
    }

    fn tree_created(&self, tx: &mut Txn<'_>, id: u64) -> Result<()> {
        ops::tree_created(tx, id)
    }

    fn tree_cloned(&self, tx: &mut Txn<'_>, src: u64, dst: u64) -> Result<()> {
        ops::tree_cloned(tx, src, dst)
    }

    fn tree_dropped(&self, tx: &mut Txn<'_>, id: u64) -> Result<()> {
        ops::tree_dropped(tx, id)
    }

    fn admit(&self, slots: &Slots, tree: u64, referenced: u64, exclusive: u64) -> Result<()> {
        ledger(slots).check_limits(tree, referenced, exclusive)
    }

    fn data_held(&self, slots: &mut Slots, tree: u64, bytes: u64) {
        slots.entry::<Qgroups>().hold(tree, bytes);
    }

    fn data_released(&self, slots: &mut Slots, tree: u64, bytes: u64) {
        slots.entry::<Qgroups>().release(tree, bytes);
    }

    fn extent_changed(&self, slots: &mut Slots, bytenr: u64, len: u64, data: bool, owner: u64) {
        account::trace(slots.entry(), bytenr, len, data, owner);
    }
}

/// Writes the numbers of every group that changed (at commit).
pub(crate) fn write_dirty(tx: &mut crate::txn::Txn<'_>) -> Result<bool> {
    let dirty = std::mem::take(&mut tx.qgroups_mut().dirty);
    let generation = tx.transid();
    let mut did = false;
    for q in dirty {
        let Some(g) = tx.qgroups().groups.get(&q).copied() else {
            continue;
        };
        let info = QgroupInfo {
            generation,
            referenced: g.referenced,
            exclusive: g.exclusive,
        };
        tx.put(QUOTA, info_key(q), info.encode())?;
        did = true;
    }
    Ok(did)
}

/// Where the stored numbers differ from a count made from scratch over
/// the trees as `r` sees them, one line each (`canopy check`, and tests
/// right after a commit).
pub fn differences(r: &crate::txn::Reader<'_>) -> Result<Vec<String>> {
    let q = r.qgroups();
    if !q.enabled() {
        return Ok(Vec::new());
    }
    let ids: Vec<u64> = r
        .tree_ids()
        .into_iter()
        .filter(|&t| crate::format::tree_id::is_shareable(t))
        .collect();
    let mut trees = Vec::with_capacity(ids.len());
    for &t in &ids {
        trees.push((t, r.root(t)?));
    }
    let mut usage = compute_usage(r, &trees)?;
    if let Some(cursor) = q.rescan {
        // Mid-rescan the numbers count what lies below the cursor.
        usage.extents.retain(|&bytenr, _| bytenr < cursor);
    }
    let fresh = q.tally(&usage);
    let mut out = Vec::new();
    for t in ids {
        if !q.groups.contains_key(&subvol_group(t)) {
            out.push(format!("subvolume {t} has no qgroup"));
        }
    }
    for (&id, g) in &q.groups {
        let (rf, ex) = fresh.get(&id).copied().unwrap_or((0, 0));
        if (g.referenced, g.exclusive) != (rf, ex) {
            out.push(format!(
                "qgroup {}: referenced {} exclusive {} recorded, {} and {} counted",
                crate::format::qgroup::display(id),
                g.referenced,
                g.exclusive,
                rf,
                ex
            ));
        }
    }
    Ok(out)
}
