//! The contents side of a send: file data (writes, clones, holes), size,
//! owner, mode and xattrs of one inode, from what the receiver has to
//! what the new tree holds.

use super::names::{Names, Side};
use super::{stream_ident, Sender};
use crate::error::Result;
use crate::format::items::FileExtentItem;
use crate::fs::SubvolView;
use crate::stream::{Command, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, WRITE_V1, WRITE_V2};
use std::collections::HashMap;

const SECTOR: u64 = 4096;

/// What a range of a file is, as far as the receiver's copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// Reads as zeros: no extent, or a preallocated one.
    Zero,
    /// Bytes of a regular extent: its address, the offset into its
    /// decoded bytes at the range's start, its compression.
    Disk {
        bytenr: u64,
        at: u64,
        compression: u8,
    },
    /// Inline data (small; always sent when it differs at all).
    Inline(u64),
}

/// A file's ranges, sorted: (start, end, what).
type Layout = Vec<(u64, u64, Src)>;

fn layout(items: &[(u64, FileExtentItem)]) -> Layout {
    let mut out = Vec::with_capacity(items.len());
    for (i, (off, fe)) in items.iter().enumerate() {
        let (len, src) = match fe.kind {
            0 => (
                fe.ram_bytes.max(fe.inline_data.len() as u64),
                Src::Inline(i as u64 + 1),
            ),
            2 => (fe.num_bytes, Src::Zero),
            _ if fe.disk_bytenr == 0 => (fe.num_bytes, Src::Zero),
            _ => (
                fe.num_bytes,
                Src::Disk {
                    bytenr: fe.disk_bytenr,
                    at: fe.offset,
                    compression: fe.compression,
                },
            ),
        };
        out.push((*off, off + len, src));
    }
    out
}

/// What `l` holds at `pos`, and up to where that lasts.
fn at(l: &Layout, pos: u64) -> (Src, u64) {
    let i = l.partition_point(|&(_, end, _)| end <= pos);
    match l.get(i) {
        Some(&(start, end, src)) if start <= pos => (shift(src, pos - start), end),
        Some(&(start, _, _)) => (Src::Zero, start),
        None => (Src::Zero, u64::MAX),
    }
}

fn shift(s: Src, by: u64) -> Src {
    match s {
        Src::Disk {
            bytenr,
            at,
            compression,
        } => Src::Disk {
            bytenr,
            at: at + by,
            compression,
        },
        other => other,
    }
}

/// The ranges below `size` where `new` differs from `old`, each with
/// what `new` holds there.
fn differing(old: &Layout, new: &Layout, size: u64) -> Vec<(u64, u64, Src)> {
    let mut out: Vec<(u64, u64, Src)> = Vec::new();
    let mut pos = 0;
    while pos < size {
        let (a, a_end) = at(old, pos);
        let (b, b_end) = at(new, pos);
        let end = a_end.min(b_end).min(size);
        let inline = matches!(a, Src::Inline(_)) || matches!(b, Src::Inline(_));
        if a != b || inline {
            match out.last_mut() {
                Some(last) if last.1 == pos && last.2 == Src::Zero && b == Src::Zero => {
                    last.1 = end
                }
                _ => out.push((pos, end, b)),
            }
        }
        pos = end;
    }
    out
}

/// Where a file holds part of an extent.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// None: the subvolume being sent; Some(i): source i (the parent is
    /// the last).
    source: Option<usize>,
    ino: u64,
    /// The file offset where the extent's decoded byte 0 would be.
    base: u64,
    /// The decoded bytes `[lo, hi)` of the extent the file holds.
    lo: u64,
    hi: u64,
}

/// Extents already sent in this stream, by address.
#[derive(Default)]
pub(crate) struct SentExtents(HashMap<u64, Vec<Held>>);

/// Where clone sources (and the parent) hold each extent, by address.
pub(crate) struct CloneIndex(HashMap<u64, Vec<Held>>);

/// Where to clone a range from.
struct Origin {
    /// None: the subvolume being sent; Some(i): source i (the parent is
    /// the last).
    source: Option<usize>,
    ino: u64,
    offset: u64,
}

impl Sender<'_> {
    /// Brings inode `ino` at `path` from `before` (None: just made) to `n`.
    pub(crate) fn contents(
        &mut self,
        ino: u64,
        path: &[u8],
        before: Option<&Side>,
        n: &Side,
        names: &mut Names,
    ) -> Result<()> {
        let (ni, oi) = (&n.item, before.map(|b| &b.item));
        if ni.mode & libc::S_IFMT == libc::S_IFREG {
            self.file_data(
                ino,
                path,
                before.is_some(),
                oi.map_or(0, |o| o.size),
                ni.size,
                names,
            )?;
        }
        if oi.is_none_or(|o| (o.uid, o.gid) != (ni.uid, ni.gid)) {
            self.put(&Command::Chown {
                path: path.to_vec(),
                uid: u64::from(ni.uid),
                gid: u64::from(ni.gid),
            })?;
        }
        let is_link = ni.mode & libc::S_IFMT == libc::S_IFLNK;
        if !is_link && oi.is_none_or(|o| o.mode != ni.mode) {
            self.put(&Command::Chmod {
                path: path.to_vec(),
                mode: u64::from(ni.mode & 0o7777),
            })?;
        }
        self.xattrs(ino, path, before.is_some())
    }

    fn xattrs(&mut self, ino: u64, path: &[u8], existed: bool) -> Result<()> {
        let new = self.new.xattrs(ino)?;
        let old = match (&self.old, existed) {
            (Some(o), true) => o.xattrs(ino)?,
            _ => Vec::new(),
        };
        for (name, _) in old.iter().filter(|(k, _)| !new.iter().any(|(n, _)| n == k)) {
            self.put(&Command::RemoveXattr {
                path: path.to_vec(),
                name: name.clone(),
            })?;
        }
        for (name, data) in new.iter().filter(|kv| !old.contains(kv)) {
            self.put(&Command::SetXattr {
                path: path.to_vec(),
                name: name.clone(),
                data: data.clone(),
            })?;
        }
        Ok(())
    }

    fn file_data(
        &mut self,
        ino: u64,
        path: &[u8],
        existed: bool,
        old_size: u64,
        size: u64,
        names: &mut Names,
    ) -> Result<()> {
        let new_items = self.new.extents(ino)?;
        let old_items = match (&self.old, existed) {
            (Some(o), true) => o.extents(ino)?,
            _ => Vec::new(),
        };
        let (old, new) = (layout(&old_items), layout(&new_items));
        // When each extent was written: an extent newer than every clone
        // source cannot be in one.
        let generations: HashMap<u64, u64> = new_items
            .iter()
            .map(|(_, fe)| (fe.disk_bytenr, fe.generation))
            .collect();
        // A file that changes size gets it first: a hole punched across
        // the old end then lies wholly inside the file, where it stays a
        // hole (at the end of a file a partial block would be zeroed).
        if existed && old_size != size {
            self.put(&Command::Truncate {
                path: path.to_vec(),
                size,
            })?;
        }
        let mut data_end = 0;
        for (start, end, src) in differing(&old, &new, size) {
            if src != Src::Zero {
                data_end = end;
            }
            match src {
                Src::Zero if existed => self.zero(path, start, end)?,
                Src::Zero => {}
                Src::Disk { bytenr, at, .. } => {
                    self.data_range(ino, path, (start, end), (bytenr, at), names, &generations)?
                }
                Src::Inline(_) => self.write(ino, path, start, end)?,
            }
        }
        // A new file ends where its data does, or holes follow.
        if !existed && size > data_end {
            self.put(&Command::Truncate {
                path: path.to_vec(),
                size,
            })?;
        }
        Ok(())
    }

    /// A range that now reads as zeros: a hole punched (version 2) or
    /// zeros written (version 1 has no other way).
    fn zero(&mut self, path: &[u8], start: u64, end: u64) -> Result<()> {
        if self.w.version() >= 2 {
            // To the end of the sector: a punch ending inside the last
            // block (at the end of the file) would zero it, not free it.
            return self.put(&Command::Fallocate {
                path: path.to_vec(),
                mode: FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE,
                offset: start,
                size: end.next_multiple_of(SECTOR) - start,
            });
        }
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(WRITE_V1 as u64);
            self.put(&Command::Write {
                path: path.to_vec(),
                offset: pos,
                data: vec![0; n as usize],
            })?;
            pos += n;
        }
        Ok(())
    }

    fn write(&mut self, ino: u64, path: &[u8], start: u64, end: u64) -> Result<()> {
        let chunk = match self.w.version() {
            1 => WRITE_V1,
            _ => WRITE_V2,
        } as u64;
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(chunk);
            let data = self.new.read(ino, pos, n as u32)?;
            if data.is_empty() {
                break;
            }
            pos += data.len() as u64;
            self.summary.data_bytes += data.len() as u64;
            self.put(&Command::Write {
                path: path.to_vec(),
                offset: pos - data.len() as u64,
                data,
            })?;
        }
        Ok(())
    }

    /// A range of a regular extent: cloned where the receiver already
    /// holds those bytes, written otherwise; remembered for later clones.
    fn data_range(
        &mut self,
        ino: u64,
        path: &[u8],
        (start, end): (u64, u64),
        (bytenr, at): (u64, u64),
        names: &mut Names,
        generations: &HashMap<u64, u64>,
    ) -> Result<()> {
        let len = end - start;
        let generation = generations.get(&bytenr).copied().unwrap_or(u64::MAX);
        let origin = self.find_origin(bytenr, at, len, generation)?;
        let sent = self.sent.0.entry(bytenr).or_default();
        sent.push(Held {
            source: None,
            ino,
            base: start - at,
            lo: at,
            hi: at + len,
        });
        match origin {
            Some(o) if self.clonable(ino, start, len, &o)? => {
                self.clone_from(path, start, len, o, names)
            }
            _ => self.write(ino, path, start, end),
        }
    }

    /// Where the receiver holds decoded bytes `[at, at + len)` of extent
    /// `bytenr`: sent earlier in this stream, or in a clone source. The
    /// sources are indexed (once per send) only for an extent old enough
    /// to be in one.
    fn find_origin(
        &mut self,
        bytenr: u64,
        at: u64,
        len: u64,
        generation: u64,
    ) -> Result<Option<Origin>> {
        let covers = |h: &&Held| h.lo <= at && at + len <= h.hi;
        let origin = |h: &Held| Origin {
            source: h.source,
            ino: h.ino,
            offset: h.base + at,
        };
        if let Some(h) = self.sent.0.get(&bytenr).and_then(|v| v.iter().find(covers)) {
            return Ok(Some(origin(h)));
        }
        if self
            .sources_ctransid
            .is_none_or(|newest| generation > newest)
        {
            return Ok(None);
        }
        if self.clone_index.is_none() {
            self.clone_index = Some(self.build_clone_index()?);
        }
        let index = self.clone_index.as_ref().and_then(|i| i.0.get(&bytenr));
        Ok(index.and_then(|v| v.iter().find(covers)).map(origin))
    }

    /// The clone sources, then the parent.
    pub(crate) fn source_views(&self) -> Vec<&SubvolView> {
        let mut v: Vec<&SubvolView> = self.sources.iter().collect();
        if let Some(p) = &self.old {
            v.push(p);
        }
        v
    }

    fn build_clone_index(&self) -> Result<CloneIndex> {
        let mut map: HashMap<u64, Vec<Held>> = HashMap::new();
        for (s, view) in self.source_views().into_iter().enumerate() {
            let mut from = crate::format::inode::ROOT_DIR_INO;
            loop {
                let inodes = view.inodes_from(from, 1024)?;
                let Some(&last) = inodes.last() else { break };
                for ino in inodes {
                    for (off, fe) in view.extents(ino)? {
                        if fe.kind == 1 && fe.disk_bytenr != 0 {
                            map.entry(fe.disk_bytenr).or_default().push(Held {
                                source: Some(s),
                                ino,
                                base: off - fe.offset,
                                lo: fe.offset,
                                hi: fe.offset + fe.num_bytes,
                            });
                        }
                    }
                }
                from = last + 1;
            }
        }
        Ok(CloneIndex(map))
    }

    /// Whether a clone of `len` bytes at `start` from `o` lies within the
    /// source and lines up with sectors (or ends at the end of both
    /// files), as a clone must.
    fn clonable(&self, ino: u64, start: u64, len: u64, o: &Origin) -> Result<bool> {
        let aligned = |x: u64| x.is_multiple_of(SECTOR);
        if !aligned(start) || !aligned(o.offset) {
            return Ok(false);
        }
        let size_of = |v: &SubvolView, i: u64| v.inode(i).map(|it| it.map_or(0, |it| it.size));
        let src_size = match o.source {
            None => size_of(&self.new, o.ino)?,
            Some(s) => size_of(self.source_views()[s], o.ino)?,
        };
        if o.offset + len > src_size {
            return Ok(false);
        }
        Ok(aligned(len) || (start + len == size_of(&self.new, ino)? && o.offset + len == src_size))
    }

    fn clone_from(
        &mut self,
        path: &[u8],
        start: u64,
        len: u64,
        o: Origin,
        names: &mut Names,
    ) -> Result<()> {
        let (clone_uuid, clone_ctransid, clone_path) = match o.source {
            None => {
                let old = self.old.clone();
                (self.uuid, self.ctransid, names.path(old.as_deref(), o.ino)?)
            }
            Some(s) => {
                let view = self.source_views()[s];
                let (u, t) = stream_ident(view)?;
                (u, t, source_path(view, o.ino)?)
            }
        };
        self.summary.cloned_bytes += len;
        self.put(&Command::Clone {
            path: path.to_vec(),
            offset: start,
            len,
            clone_uuid,
            clone_ctransid,
            clone_path,
            clone_offset: o.offset,
        })
    }
}

/// The path of `ino` in a subvolume the receiver holds unchanged.
fn source_path(v: &SubvolView, ino: u64) -> Result<Vec<u8>> {
    let mut parts = Vec::new();
    let mut at = ino;
    while at != crate::format::inode::ROOT_DIR_INO && parts.len() <= 4096 {
        let Some((dir, name)) = v.names(at)?.into_iter().next() else {
            break;
        };
        parts.push(name);
        at = dir;
    }
    parts.reverse();
    Ok(parts.join(&b'/'))
}
