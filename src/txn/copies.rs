//! Reading a tree block from a good copy and repairing the bad ones.
//!
//! A block of a `dup` group has two copies (see `volume`). A read checks
//! the first; when it cannot be read, fails its checks (checksum, address,
//! filesystem) or is older than its parent says (a lost write), the next
//! copy is tried, and the good bytes are written back over every bad copy
//! at once. The block is reachable from the state the caller holds, so it
//! cannot be freed and reused meanwhile, and the bytes written are the
//! ones its parent's checksum and generation vouch for.

use super::Shared;
use crate::error::{Error, Result};
use crate::format::node::Node;
use std::sync::atomic::Ordering;

/// Reads the block at `bytenr` that its parent expects at `generation`.
pub(super) fn read_tree_block(sh: &Shared, bytenr: u64, generation: u64) -> Result<Node> {
    let len = sh.nodesize as u64;
    let copies = sh.dev.copies(bytenr, len);
    let mut buf = vec![0u8; sh.nodesize];
    let mut bad: Vec<(usize, Error)> = Vec::new();
    let mut missing: Option<usize> = None;
    for copy in 0..copies {
        // A copy on a device a degraded open lacks is neither read nor
        // bad: it is just not there.
        if !sh.dev.copy_present(bytenr, len, copy) {
            missing.get_or_insert(copy);
            continue;
        }
        match read_copy(sh, &mut buf, bytenr, generation, copy) {
            Ok(node) => {
                repair(sh, &buf, &node, &bad, copy);
                return Ok(node);
            }
            Err(e) => bad.push((copy, e)),
        }
    }
    match (bad.into_iter().next(), missing) {
        (Some((_, e)), _) => Err(e),
        (None, Some(_)) => Err(Error::io(
            format!("reading tree block {bytenr}"),
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "every copy lies on a missing device (a degraded mount)",
            ),
        )),
        (None, None) => Err(Error::corrupt(bytenr, "block has no copy")),
    }
}

/// Copy `copy` of the block, checked.
fn read_copy(
    sh: &Shared,
    buf: &mut [u8],
    bytenr: u64,
    generation: u64,
    copy: usize,
) -> Result<Node> {
    sh.dev.read_copy(buf, bytenr, copy)?;
    let checked = checked_node(sh, buf, bytenr, |g| {
        (g != generation)
            .then(|| format!("block has generation {g}, its parent expected {generation}"))
    });
    if checked.is_err() {
        sh.dev.note_corrupt(bytenr, buf.len() as u64, copy);
    }
    checked
}

/// Writes the good copy's bytes over each bad copy, and says so (unless
/// the volume takes no repairs: a read-only open).
fn repair(sh: &Shared, good: &[u8], node: &Node, bad: &[(usize, Error)], good_copy: usize) {
    let what = format!("tree block (tree {})", node.owner);
    for (copy, why) in bad {
        rewrite_copy(sh, node.bytenr, good, (*copy, good_copy), &what, why);
    }
}

/// Rewrites bad copy `copies.0` of `[logical, logical + good.len())`
/// with `good`, read from copy `copies.1`, and logs one line naming the
/// device, both addresses, the copy, `what` it is and `why` it was bad.
/// Nothing is written when the volume takes no repairs. Returns whether
/// the copy was rewritten.
fn rewrite_copy(
    sh: &Shared,
    logical: u64,
    good: &[u8],
    (copy, good_copy): (usize, usize),
    what: &str,
    why: &dyn std::fmt::Display,
) -> bool {
    let dev = &sh.dev;
    let len = good.len() as u64;
    let (devid, physical) = dev
        .stripe(logical, len, copy)
        .map_or((0, 0), |s| (s.devid, s.offset));
    if !dev.repairs() {
        tracing::warn!(
            devid,
            logical,
            copy,
            physical,
            "{what} read from copy {good_copy}, copy {copy} is bad ({why}); read-only, not repaired"
        );
        return false;
    }
    match dev.write_copy(good, logical, copy) {
        Ok(()) => {
            dev.errors(devid).corrected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                devid,
                logical,
                copy,
                physical,
                "repaired {what} from copy {good_copy}: {why}"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                devid,
                logical,
                copy,
                physical,
                "could not repair {what} ({why}): {e}"
            );
            false
        }
    }
}

/// What scrub found of a tree block's copies.
#[derive(Debug)]
pub struct CopiesVerdict {
    /// Copies the block has.
    pub copies: usize,
    /// The bad copies, and what was wrong with each.
    pub bad: Vec<(usize, Error)>,
    /// Whether the bad copies were rewritten from a good one (there was
    /// one, and the volume takes repairs).
    pub repaired: bool,
}

impl CopiesVerdict {
    /// Every copy is bad: the block is lost.
    pub fn lost(&self) -> bool {
        self.bad.len() == self.copies
    }
}

/// Copy `copy` of the tree block at `bytenr`, read into `buf` and checked
/// as a first read would, with a generation no older than `generation`
/// (the one its extent item records: an older one is a lost write).
fn read_since(
    sh: &Shared,
    buf: &mut [u8],
    bytenr: u64,
    generation: u64,
    copy: usize,
) -> Result<Node> {
    sh.dev.read_copy(buf, bytenr, copy)?;
    checked_node(sh, buf, bytenr, |g| {
        (g < generation).then(|| {
            format!("block has generation {g}, older than its allocation in {generation} (a lost write)")
        })
    })
}

/// The tree block at `bytenr` in `buf`, checked as a first read would
/// (checksum, fsid, own address, layout); `stale` says what is wrong
/// with the generation it has, if anything.
fn checked_node(
    sh: &Shared,
    buf: &[u8],
    bytenr: u64,
    stale: impl FnOnce(u64) -> Option<String>,
) -> Result<Node> {
    let n = Node::decode(buf, bytenr, &sh.fsid)?;
    match stale(n.generation) {
        None => Ok(n),
        Some(why) => Err(Error::corrupt(bytenr, why)),
    }
}

/// Reads every copy of the tree block at `bytenr` and checks each as a
/// first read would, with a generation no older than `generation` (the
/// one its extent item records: an older one is a lost write); rewrites
/// the bad copies from a good one.
pub(super) fn verify_copies(sh: &Shared, bytenr: u64, generation: u64) -> CopiesVerdict {
    let copies = sh.dev.copies(bytenr, sh.nodesize as u64);
    let mut buf = vec![0u8; sh.nodesize];
    let mut good: Option<(usize, Vec<u8>, Node)> = None;
    let mut bad = Vec::new();
    for copy in 0..copies {
        match read_since(sh, &mut buf, bytenr, generation, copy) {
            Ok(n) if good.is_none() => good = Some((copy, buf.clone(), n)),
            Ok(_) => {}
            Err(e) => {
                sh.dev.note_corrupt(bytenr, sh.nodesize as u64, copy);
                bad.push((copy, e));
            }
        }
    }
    let repaired = match &good {
        Some((copy, bytes, node)) if !bad.is_empty() && sh.dev.repairs() => {
            repair(sh, bytes, node, &bad, *copy);
            true
        }
        _ => false,
    };
    CopiesVerdict {
        copies,
        bad,
        repaired,
    }
}

/// The bytes of the first copy, in `order`, of the tree block at
/// `bytenr` that passes a first read's checks with a generation no older
/// than `generation`, and which copy it was; the first copy's error when
/// none does. Nothing is repaired: the caller (a device replace) puts the
/// bytes elsewhere.
pub(super) fn first_good_copy(
    sh: &Shared,
    bytenr: u64,
    generation: u64,
    order: &[usize],
) -> Result<(usize, Vec<u8>)> {
    let mut buf = vec![0u8; sh.nodesize];
    let mut first_error = None;
    for &copy in order {
        match read_since(sh, &mut buf, bytenr, generation, copy) {
            Ok(_) => return Ok((copy, buf)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| Error::corrupt(bytenr, "block has no copy")))
}

/// Data bytes at `bytenr` as copy `copy` holds them, and how many copies
/// they have: for readers that verify checksums themselves (`fs`'s file
/// reads, scrub) and fall back to another copy.
pub(crate) trait DataCopies {
    fn shared(&self) -> &Shared;

    /// `[bytenr, bytenr + len)` in pieces that each lie whole on their
    /// devices (cut where RAID10 units end).
    fn data_pieces(&self, bytenr: u64, len: u64) -> Vec<(u64, u64)> {
        self.shared().dev.map().pieces(bytenr, len)
    }

    /// How many copies `[bytenr, bytenr + len)` has.
    fn data_copies(&self, bytenr: u64, len: u64) -> usize {
        self.shared().dev.copies(bytenr, len)
    }

    /// The copy a read of `[bytenr, bytenr + len)` for inode `ino` tries
    /// first (`volume::Volume::preferred_copy`).
    fn preferred_data_copy(&self, bytenr: u64, len: u64, ino: u64) -> usize {
        self.shared().dev.preferred_copy(bytenr, len, ino)
    }

    /// Whether copy `copy` lies on a present device.
    fn data_copy_present(&self, bytenr: u64, len: u64, copy: usize) -> bool {
        self.shared().dev.copy_present(bytenr, len, copy)
    }

    /// Reads `buf.len()` data bytes at `bytenr` from a copy that matches
    /// `sums` (any copy does when there are none): first the copy reads
    /// for inode `ino` prefer, then the others in turn. Bad copies read on
    /// the way are rewritten from the good one; a copy on a device a
    /// degraded mount lacks is not bad. With no good copy, the error is
    /// the first copy's.
    fn read_good_data(
        &self,
        bytenr: u64,
        buf: &mut [u8],
        sums: &[u8],
        ino: Option<u64>,
    ) -> Result<()> {
        let len = buf.len() as u64;
        let copies = self.data_copies(bytenr, len).max(1);
        let first = self.preferred_data_copy(bytenr, len, ino.unwrap_or(0));
        let mut bad = Vec::new();
        let mut error = None;
        for copy in (0..copies).map(|i| (first + i) % copies) {
            let read = self
                .read_data_copy(bytenr, buf, copy)
                .and_then(|()| verify_sums(bytenr, buf, sums));
            match read {
                Ok(()) => {
                    for b in bad {
                        self.repair_data_copy(bytenr, buf, (b, copy), ino);
                    }
                    return Ok(());
                }
                Err(e) => {
                    if self.data_copy_present(bytenr, len, copy) {
                        bad.push(copy);
                    }
                    error.get_or_insert(e);
                }
            }
        }
        Err(error.unwrap_or_else(|| Error::corrupt(bytenr, "data extent has no copy")))
    }

    /// Reads `buf.len()` data bytes at `bytenr` that have no checksums
    /// (a `chattr +C` file's): the first copy that reads without an I/O
    /// error, in the order of [`DataCopies::read_good_data`]. Nothing
    /// tells a bad copy from a good one, so none is rewritten.
    fn read_unchecked_data(&self, bytenr: u64, buf: &mut [u8], ino: Option<u64>) -> Result<()> {
        let len = buf.len() as u64;
        let copies = self.data_copies(bytenr, len).max(1);
        let first = self.preferred_data_copy(bytenr, len, ino.unwrap_or(0));
        let mut error = None;
        for copy in (0..copies).map(|i| (first + i) % copies) {
            match self.read_data_copy(bytenr, buf, copy) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        Err(error.unwrap_or_else(|| Error::corrupt(bytenr, "data extent has no copy")))
    }

    /// Starts reading copy `copy` of `[bytenr, bytenr + len)` ahead.
    fn prefetch_data_copy(&self, bytenr: u64, len: u64, copy: usize) {
        self.shared().dev.prefetch_copy(bytenr, len, copy);
    }

    /// Where copy `copy` of `[bytenr, bytenr + len)` lies.
    fn copy_stripe(&self, bytenr: u64, len: u64, copy: usize) -> Option<crate::volume::Stripe> {
        self.shared().dev.stripe(bytenr, len, copy).ok()
    }

    /// Writes `buf` at physical `offset` of the device a replace is
    /// filling (`replace`'s copy of what the source holds there).
    fn write_replace_target(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.shared().dev.write_replace_target(buf, offset)
    }

    /// Reads copy `copy` of `buf.len()` data bytes at `bytenr`.
    fn read_data_copy(&self, bytenr: u64, buf: &mut [u8], copy: usize) -> Result<()> {
        self.shared().dev.read_copy(buf, bytenr, copy)
    }

    /// Notes a copy found bad, and rewrites it from `good` (the bytes
    /// another copy holds, which matched their checksums) unless the
    /// volume takes no repairs; `copies` is (bad copy, good copy), `ino`
    /// the file read, when the reader knows it. The extent cannot be
    /// freed meanwhile: the caller holds the state or a data read epoch
    /// (see `flight`). Returns whether the copy was rewritten.
    fn repair_data_copy(
        &self,
        bytenr: u64,
        good: &[u8],
        copies: (usize, usize),
        ino: Option<u64>,
    ) -> bool {
        let sh = self.shared();
        sh.dev.note_corrupt(bytenr, good.len() as u64, copies.0);
        let what = match ino {
            Some(ino) => format!("data of inode {ino}"),
            None => "data".to_string(),
        };
        rewrite_copy(sh, bytenr, good, copies, &what, &"checksum mismatch")
    }
}

/// Checks every sector of `buf`, read from `bytenr`, against `sums`.
fn verify_sums(bytenr: u64, buf: &[u8], sums: &[u8]) -> Result<()> {
    match crate::format::first_bad_sector(buf, sums) {
        None => Ok(()),
        Some(i) => {
            let at = bytenr + (i as u64) * u64::from(crate::format::SECTORSIZE);
            tracing::error!(bytenr = at, "data checksum mismatch");
            Err(Error::corrupt(at, "data checksum mismatch"))
        }
    }
}

impl DataCopies for super::Reader<'_> {
    fn shared(&self) -> &Shared {
        self.sh
    }
}

impl DataCopies for super::Txn<'_> {
    fn shared(&self) -> &Shared {
        self.sh
    }
}

impl DataCopies for super::DataDevice<'_> {
    fn shared(&self) -> &Shared {
        self.sh
    }
}
