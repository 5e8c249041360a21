//! The namespace side of a send: which inodes changed, and the commands
//! that take the receiver's names from the old tree's to the new tree's
//! (see the module comment of `send` for the three phases).

use super::{Progress, Sender};
use crate::error::{Error, Result};
use crate::format::inode::{InodeItem, ROOT_DIR_INO};
use crate::fs::SubvolView;
use crate::stream::{Command, Time};
use std::collections::{HashMap, HashSet};

/// (directory, name)
pub(crate) type Name = (u64, Vec<u8>);

/// An inode as one tree holds it.
#[derive(Clone, Debug)]
pub(crate) struct Side {
    pub(crate) item: InodeItem,
    pub(crate) names: Vec<Name>,
}

/// An inode that differs between the trees.
pub(crate) struct Change {
    pub(crate) ino: u64,
    pub(crate) old: Option<Side>,
    pub(crate) new: Option<Side>,
}

impl Change {
    /// The old and new inodes are one file: same type and birth time (an
    /// inode number may be reused by a file made after the parent).
    fn same_file(&self) -> bool {
        match (&self.old, &self.new) {
            (Some(o), Some(n)) => {
                o.item.mode & libc::S_IFMT == n.item.mode & libc::S_IFMT
                    && o.item.otime == n.item.otime
            }
            _ => false,
        }
    }
}

fn is_dir(i: &InodeItem) -> bool {
    i.mode & libc::S_IFMT == libc::S_IFDIR
}

/// Inodes read per batch of a full send's walk.
const BATCH: usize = 4096;

/// The receiver's names as the stream has left them: the old tree's,
/// except for inodes the stream has renamed, linked, unlinked or created.
#[derive(Default)]
pub(crate) struct Names {
    changed: HashMap<u64, Vec<Name>>,
    old_names: HashMap<u64, Vec<Name>>,
    /// Inodes that live on under an orphan name until phase 2 names them.
    orphans: HashSet<u64>,
    /// Whether an orphan name was used: the root directory's times then
    /// changed on the receiver, and are sent even if the root did not
    /// change.
    used_orphans: bool,
}

impl Names {
    fn current(&mut self, old: Option<&SubvolView>, ino: u64) -> Result<&mut Vec<Name>> {
        if !self.changed.contains_key(&ino) && !self.old_names.contains_key(&ino) {
            let names = match old {
                Some(o) => o.names(ino)?,
                None => Vec::new(),
            };
            self.old_names.insert(ino, names);
        }
        Ok(match self.changed.get_mut(&ino) {
            Some(n) => n,
            None => self.old_names.get_mut(&ino).ok_or(Error::NotFound)?,
        })
    }

    /// Takes `ino`'s names over from the old tree's, to change them.
    fn own(&mut self, old: Option<&SubvolView>, ino: u64) -> Result<&mut Vec<Name>> {
        if !self.changed.contains_key(&ino) {
            let names = self.current(old, ino)?.clone();
            self.changed.insert(ino, names);
        }
        self.changed.get_mut(&ino).ok_or(Error::NotFound)
    }

    /// The path of `ino` on the receiver now, from the subvolume's root.
    pub(crate) fn path(&mut self, old: Option<&SubvolView>, ino: u64) -> Result<Vec<u8>> {
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT_DIR_INO {
            if parts.len() > 4096 {
                return Err(Error::corrupt(ino, "a directory loop in send's names"));
            }
            let (dir, name) = self
                .current(old, at)?
                .first()
                .cloned()
                .ok_or_else(|| Error::corrupt(at, "send lost track of an inode's name"))?;
            parts.push(name);
            at = dir;
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }

    fn path_of(&mut self, old: Option<&SubvolView>, (dir, name): &Name) -> Result<Vec<u8>> {
        let mut p = self.path(old, *dir)?;
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        Ok(p)
    }
}

impl Sender<'_> {
    /// Sends every difference between the trees.
    pub(crate) fn run(&mut self, progress: Progress<'_>) -> Result<()> {
        let candidates = self.candidates()?;
        let mut changes = Vec::new();
        for ino in candidates {
            if let Some(c) = self.load_change(ino)? {
                changes.push(c);
            }
        }
        self.summary.inodes = changes.len() as u64;
        let mut names = Names::default();
        let mut gone_dirs = self.free_names(&changes, &mut names)?;
        self.place(&changes, &mut names, progress)?;
        gone_dirs.sort_by_key(|(_, depth)| std::cmp::Reverse(*depth));
        for (path, _) in gone_dirs {
            self.put(&Command::Rmdir { path })?;
        }
        self.times(&changes, &mut names)
    }

    /// Every inode (full send) or those whose items differ (incremental).
    fn candidates(&self) -> Result<Vec<u64>> {
        if let Some(old) = &self.old {
            return Ok(self.new.differing_inodes(old)?.into_iter().collect());
        }
        let mut out = Vec::new();
        let mut from = ROOT_DIR_INO;
        loop {
            let batch = self.new.inodes_from(from, BATCH)?;
            let Some(&last) = batch.last() else {
                return Ok(out);
            };
            out.extend_from_slice(&batch);
            from = last + 1;
        }
    }

    /// The inode as `v` holds it; None if absent, or if it has no name
    /// (deleted while open when the snapshot was taken: nothing a
    /// receiver could reach, so not sent, as btrfs does not).
    fn side(v: &SubvolView, ino: u64) -> Result<Option<Side>> {
        let Some(item) = v.inode(ino)? else {
            return Ok(None);
        };
        let names = v.names(ino)?;
        if names.is_empty() && ino != ROOT_DIR_INO {
            return Ok(None);
        }
        Ok(Some(Side { item, names }))
    }

    /// The inode as both trees hold it; None when nothing send carries
    /// differs (a leaf copied for a neighbour's change).
    fn load_change(&self, ino: u64) -> Result<Option<Change>> {
        let new = Self::side(&self.new, ino)?;
        let old = match &self.old {
            Some(o) => Self::side(o, ino)?,
            None => None,
        };
        let c = Change { ino, old, new };
        if (c.old.is_none() && c.new.is_none()) || (c.same_file() && self.unchanged(&c)?) {
            return Ok(None);
        }
        Ok(Some(c))
    }

    fn unchanged(&self, c: &Change) -> Result<bool> {
        let (Some(o), Some(n), Some(old)) = (&c.old, &c.new, &self.old) else {
            return Ok(false);
        };
        let (oi, ni) = (&o.item, &n.item);
        let same_item = (
            oi.size, oi.uid, oi.gid, oi.mode, oi.rdev, oi.mtime, oi.ctime,
        ) == (
            ni.size, ni.uid, ni.gid, ni.mode, ni.rdev, ni.mtime, ni.ctime,
        ) && oi.atime == ni.atime;
        Ok(same_item
            && o.names == n.names
            && old.xattrs(c.ino)? == self.new.xattrs(c.ino)?
            && old.extents(c.ino)? == self.new.extents(c.ino)?)
    }

    /// Phase 1: frees every name that goes away. Returns the orphan paths
    /// of directories that go, with their depth, for phase 3.
    fn free_names(
        &mut self,
        changes: &[Change],
        names: &mut Names,
    ) -> Result<Vec<(Vec<u8>, usize)>> {
        let mut order: Vec<&Change> = changes.iter().filter(|c| c.old.is_some()).collect();
        // Files first, then directories deepest first: a name is freed
        // while the path to it is still the old tree's.
        let mut depth = HashMap::new();
        for c in &order {
            let d = self.old_depth(c.ino, names)?;
            depth.insert(c.ino, d);
        }
        order.sort_by_key(|c| {
            let dir = c.old.as_ref().is_some_and(|o| is_dir(&o.item));
            (dir, std::cmp::Reverse(depth[&c.ino]))
        });
        let mut gone = Vec::new();
        for c in order {
            if let Some(path) = self.free_names_of(c, names)? {
                gone.push((path, depth[&c.ino]));
            }
        }
        Ok(gone)
    }

    fn old_depth(&self, ino: u64, names: &mut Names) -> Result<usize> {
        let old = self.old.as_deref();
        let mut d = 0;
        let mut at = ino;
        while at != ROOT_DIR_INO && d <= 4096 {
            match names.current(old, at)?.first() {
                Some((dir, _)) => at = *dir,
                None => break,
            }
            d += 1;
        }
        Ok(d)
    }

    /// Frees `c`'s leaving names; for a directory that goes, its orphan
    /// path.
    fn free_names_of(&mut self, c: &Change, names: &mut Names) -> Result<Option<Vec<u8>>> {
        let Some(o) = &c.old else { return Ok(None) };
        let old_view = self.old.clone();
        let old = old_view.as_deref();
        let survives = c.same_file();
        let keep: Vec<Name> = match (&c.new, survives) {
            (Some(n), true) => n.names.clone(),
            _ => Vec::new(),
        };
        let current = names.current(old, c.ino)?.clone();
        let leaving: Vec<Name> = current
            .iter()
            .filter(|n| !keep.contains(n))
            .cloned()
            .collect();
        if leaving.is_empty() {
            return Ok(None);
        }
        if is_dir(&o.item) {
            let orphan = self.orphan_name(c.ino, o.item.transid, names)?;
            let from = names.path(old, c.ino)?;
            self.put(&Command::Rename {
                from,
                to: orphan.clone(),
            })?;
            *names.own(old, c.ino)? = vec![(ROOT_DIR_INO, orphan.clone())];
            if !survives {
                names.changed.remove(&c.ino);
                names.old_names.insert(c.ino, Vec::new());
                return Ok(Some(orphan));
            }
            names.orphans.insert(c.ino);
            return Ok(None);
        }
        let keeps_one = current.len() > leaving.len();
        for (i, name) in leaving.iter().enumerate() {
            let path = names.path_of(old, name)?;
            if survives && !keeps_one && i == 0 {
                let orphan = self.orphan_name(c.ino, o.item.transid, names)?;
                self.put(&Command::Rename {
                    from: path,
                    to: orphan.clone(),
                })?;
                let own = names.own(old, c.ino)?;
                own.retain(|n| n != name);
                own.insert(0, (ROOT_DIR_INO, orphan));
                names.orphans.insert(c.ino);
            } else {
                self.put(&Command::Unlink { path })?;
                names.own(old, c.ino)?.retain(|n| n != name);
            }
        }
        if !survives {
            names.changed.remove(&c.ino);
            names.old_names.insert(c.ino, Vec::new());
            names.orphans.remove(&c.ino);
        }
        Ok(None)
    }

    /// A name in the root no tree uses: `o<ino>-<transid>-<n>`.
    fn orphan_name(&self, ino: u64, transid: u64, names: &mut Names) -> Result<Vec<u8>> {
        names.used_orphans = true;
        for n in 0.. {
            let name = format!("o{ino}-{transid}-{n}").into_bytes();
            let in_old = match &self.old {
                Some(o) => o.has_entry(ROOT_DIR_INO, &name)?,
                None => false,
            };
            if !in_old && !self.new.has_entry(ROOT_DIR_INO, &name)? {
                return Ok(name);
            }
        }
        unreachable!("an unused orphan name exists")
    }

    /// Phase 2: creates or places every inode of the new tree, parents
    /// first, and brings its contents up to date.
    fn place(
        &mut self,
        changes: &[Change],
        names: &mut Names,
        progress: Progress<'_>,
    ) -> Result<()> {
        let mut depth_cache = HashMap::new();
        let mut order = Vec::new();
        for (i, c) in changes.iter().enumerate() {
            if c.new.is_some() {
                order.push((self.new_depth(c.ino, &mut depth_cache)?, i));
            }
        }
        order.sort_unstable();
        for (n, &(_, i)) in order.iter().enumerate() {
            self.place_one(&changes[i], names)?;
            self.summary.done = n as u64 + 1;
            if n % 256 == 0 {
                self.summary.bytes = self.w.written();
                progress(&self.summary);
            }
        }
        for &(_, i) in &order {
            if let Some(n) = &changes[i].new {
                self.add_names(changes[i].ino, &n.names, names)?;
            }
        }
        Ok(())
    }

    fn new_depth(&self, ino: u64, cache: &mut HashMap<u64, usize>) -> Result<usize> {
        let mut chain = Vec::new();
        let mut at = ino;
        let base = loop {
            if at == ROOT_DIR_INO {
                break 0;
            }
            if let Some(&d) = cache.get(&at) {
                break d;
            }
            if chain.len() > 4096 {
                return Err(Error::corrupt(ino, "a directory loop"));
            }
            chain.push(at);
            match self.new.names(at)?.first() {
                Some((dir, _)) => at = *dir,
                None => break 0,
            }
        };
        for (k, i) in chain.iter().rev().enumerate() {
            cache.insert(*i, base + k + 1);
        }
        Ok(cache.get(&ino).copied().unwrap_or(0))
    }

    fn place_one(&mut self, c: &Change, names: &mut Names) -> Result<()> {
        let Some(n) = &c.new else { return Ok(()) };
        let old_view = self.old.clone();
        let old = old_view.as_deref();
        let created = c.ino != ROOT_DIR_INO && !c.same_file();
        if created {
            let first = n
                .names
                .first()
                .ok_or_else(|| Error::corrupt(c.ino, "an inode without a name"))?;
            let path = names.path_of(old, first)?;
            self.create(c.ino, &n.item, path)?;
            *names.own(old, c.ino)? = vec![first.clone()];
        }
        // The first name's directory is placed (it is shallower); the
        // others may not be yet, so they come after every inode is placed.
        self.add_names(c.ino, &n.names[..n.names.len().min(1)], names)?;
        let path = names.path(old, c.ino)?;
        let before = if created { None } else { c.old.as_ref() };
        self.contents(c.ino, &path, before, n, names)
    }

    /// Gives inode `ino` those of `wanted` it does not have: by renaming
    /// it from its orphan name, or by a link.
    fn add_names(&mut self, ino: u64, wanted: &[Name], names: &mut Names) -> Result<()> {
        let old_view = self.old.clone();
        let old = old_view.as_deref();
        for name in wanted {
            let current = names.current(old, ino)?.clone();
            if current.contains(name) {
                continue;
            }
            let to = names.path_of(old, name)?;
            let from = names.path(old, ino)?;
            if names.orphans.remove(&ino) {
                self.put(&Command::Rename { from, to })?;
                names.own(old, ino)?[0] = name.clone();
            } else {
                self.put(&Command::Link {
                    path: to,
                    target: from,
                })?;
                names.own(old, ino)?.push(name.clone());
            }
        }
        Ok(())
    }

    fn create(&mut self, ino: u64, i: &InodeItem, path: Vec<u8>) -> Result<()> {
        let cmd = match i.mode & libc::S_IFMT {
            libc::S_IFREG => Command::Mkfile { path, ino },
            libc::S_IFDIR => Command::Mkdir { path, ino },
            libc::S_IFIFO => Command::Mkfifo { path, ino },
            libc::S_IFSOCK => Command::Mksock { path, ino },
            libc::S_IFLNK => Command::Symlink {
                path,
                ino,
                target: self.new.readlink(ino)?,
            },
            _ => Command::Mknod {
                path,
                ino,
                mode: u64::from(i.mode),
                rdev: i.rdev,
            },
        };
        self.put(&cmd)
    }

    /// Phase 3's end: every changed inode's times, once nothing more
    /// changes it.
    fn times(&mut self, changes: &[Change], names: &mut Names) -> Result<()> {
        let old_view = self.old.clone();
        let old = old_view.as_deref();
        let mut items: Vec<(u64, InodeItem)> = changes
            .iter()
            .filter_map(|c| c.new.as_ref().map(|n| (c.ino, n.item.clone())))
            .collect();
        if names.used_orphans && !items.iter().any(|(ino, _)| *ino == ROOT_DIR_INO) {
            if let Some(root) = self.new.inode(ROOT_DIR_INO)? {
                items.push((ROOT_DIR_INO, root));
            }
        }
        for (ino, i) in items {
            let path = names.path(old, ino)?;
            self.put(&Command::Utimes {
                path,
                atime: time(i.atime),
                mtime: time(i.mtime),
                ctime: time(i.ctime),
            })?;
        }
        Ok(())
    }
}

fn time(t: crate::format::inode::Timespec) -> Time {
    Time {
        sec: t.sec,
        nsec: t.nsec,
    }
}
