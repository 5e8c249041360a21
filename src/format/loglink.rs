//! Log chain links: how an fsync makes its log root findable without
//! rewriting the superblock.
//!
//! Each commit names, in its superblock, a free block where the next
//! transaction's first log write puts its link, and a nonce
//! (`Superblock::log_chain`, `log_nonce`). A log write puts the log's
//! tree blocks and one link under one barrier; the link names the log
//! root it made durable and where the next link goes, allocated then. So
//! the chain runs from the superblock through every log write of the
//! transaction, and replay walks it to the last link it can read whole.
//!
//! A link is one sector, checksummed, naming its own address, its
//! filesystem, its transaction, its chain's nonce and its place in the
//! chain: a block that was once a link of another chain (or of this chain
//! in a run that crashed before the superblock changed) never passes for
//! one of this chain, whatever it held before.

use super::{crc, le_u64, put_u64, SECTORSIZE};

/// Bytes a link occupies (its block is a tree block's size; the rest is
/// not written).
pub const LINK_BYTES: usize = SECTORSIZE as usize;

const MAGIC: [u8; 8] = *b"CnpyLink";
const OFF_CSUM: usize = 0;
const OFF_MAGIC: usize = 8;
const OFF_FSID: usize = 16;
const OFF_BYTENR: usize = 32;
const OFF_GENERATION: usize = 40;
const OFF_NONCE: usize = 48;
const OFF_SEQ: usize = 56;
const OFF_ROOT: usize = 64;
const OFF_ROOT_GENERATION: usize = 72;
const OFF_ROOT_LEVEL: usize = 80;
const OFF_NEXT: usize = 88;

/// One log write's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLink {
    /// Where it lies.
    pub bytenr: u64,
    /// The transaction whose log it belongs to (the superblock's
    /// generation plus one).
    pub generation: u64,
    /// The chain's nonce, as the superblock names it.
    pub nonce: u64,
    /// Its place in the chain: the superblock's link is 0.
    pub seq: u64,
    /// The log root this write made durable.
    pub root: u64,
    pub root_generation: u64,
    pub root_level: u8,
    /// Where the next log write puts its link.
    pub next: u64,
}

impl LogLink {
    /// The link's sector as written.
    pub fn encode(&self, fsid: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; LINK_BYTES];
        b[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
        b[OFF_FSID..OFF_FSID + 16].copy_from_slice(fsid);
        put_u64(&mut b, OFF_BYTENR, self.bytenr);
        put_u64(&mut b, OFF_GENERATION, self.generation);
        put_u64(&mut b, OFF_NONCE, self.nonce);
        put_u64(&mut b, OFF_SEQ, self.seq);
        put_u64(&mut b, OFF_ROOT, self.root);
        put_u64(&mut b, OFF_ROOT_GENERATION, self.root_generation);
        b[OFF_ROOT_LEVEL] = self.root_level;
        put_u64(&mut b, OFF_NEXT, self.next);
        let sum = crc(&b[OFF_MAGIC..]);
        b[OFF_CSUM..OFF_CSUM + 4].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Whether `b` begins like a link (its magic): for tools and tests
    /// that pick links out of a stream of writes.
    pub fn looks_like_link(b: &[u8]) -> bool {
        b.get(OFF_MAGIC..OFF_MAGIC + 8) == Some(&MAGIC[..])
    }

    /// The link in `b`, read at `bytenr`, if it is whole and of this
    /// filesystem; None for anything else (a block never written as a
    /// link, a torn one, another filesystem's).
    pub fn decode(b: &[u8], bytenr: u64, fsid: &[u8; 16]) -> Option<LogLink> {
        let b = b.get(..LINK_BYTES)?;
        let sum = crc(&b[OFF_MAGIC..]).to_le_bytes();
        if b[OFF_CSUM..OFF_CSUM + 4] != sum
            || b[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC
            || b[OFF_FSID..OFF_FSID + 16] != fsid[..]
            || le_u64(b, OFF_BYTENR) != bytenr
        {
            return None;
        }
        Some(LogLink {
            bytenr,
            generation: le_u64(b, OFF_GENERATION),
            nonce: le_u64(b, OFF_NONCE),
            seq: le_u64(b, OFF_SEQ),
            root: le_u64(b, OFF_ROOT),
            root_generation: le_u64(b, OFF_ROOT_GENERATION),
            root_level: b[OFF_ROOT_LEVEL],
            next: le_u64(b, OFF_NEXT),
        })
    }
}

/// Where a chain starts and what its links must carry.
#[derive(Clone, Copy, Debug)]
pub struct ChainStart {
    pub first: u64,
    pub nonce: u64,
    /// The transaction of its log: the superblock's generation plus one.
    pub generation: u64,
    /// Addresses beyond this are not the filesystem's.
    pub total_bytes: u64,
    /// Every link starts at a multiple of this (the sectorsize, where
    /// tree blocks start).
    pub align: u64,
}

/// The links of the chain from `start`, in order, up to the first block
/// that is not its next link. `read` gives the link at an address if any
/// copy of it decodes ([`LogLink::decode`]). Each link must carry the
/// chain's nonce and transaction and the next place in it, and name a
/// next address inside the filesystem, at a block's start, that no link
/// before it took: a hostile image cannot make the walk run in circles.
pub fn walk_chain(
    start: &ChainStart,
    mut read: impl FnMut(u64) -> Option<LogLink>,
) -> Vec<LogLink> {
    let mut links: Vec<LogLink> = Vec::new();
    let mut at = start.first;
    let mut seen = std::collections::HashSet::new();
    let aligned = |at: u64| start.align != 0 && at.is_multiple_of(start.align);
    while at != 0 && at < start.total_bytes && aligned(at) && seen.insert(at) {
        let Some(link) = read(at) else { break };
        let expected = links.len() as u64;
        if link.nonce != start.nonce || link.generation != start.generation || link.seq != expected
        {
            break;
        }
        at = link.next;
        links.push(link);
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const FSID: [u8; 16] = [7; 16];

    fn link(bytenr: u64, seq: u64, next: u64) -> LogLink {
        LogLink {
            bytenr,
            generation: 9,
            nonce: 77,
            seq,
            root: 1 << 20 | seq << 14,
            root_generation: 9,
            root_level: 0,
            next,
        }
    }

    fn start(first: u64) -> ChainStart {
        ChainStart {
            first,
            nonce: 77,
            generation: 9,
            total_bytes: 1 << 30,
            align: 4096,
        }
    }

    fn disk(links: &[LogLink]) -> HashMap<u64, Vec<u8>> {
        links.iter().map(|l| (l.bytenr, l.encode(&FSID))).collect()
    }

    fn walk(d: &HashMap<u64, Vec<u8>>, first: u64) -> Vec<u64> {
        walk_chain(&start(first), |at| {
            d.get(&at).and_then(|b| LogLink::decode(b, at, &FSID))
        })
        .iter()
        .map(|l| l.seq)
        .collect()
    }

    #[test]
    fn a_link_round_trips_and_any_flipped_byte_is_refused() {
        let l = link(4 << 20, 3, 5 << 20);
        let b = l.encode(&FSID);
        assert_eq!(LogLink::decode(&b, l.bytenr, &FSID), Some(l));
        assert_eq!(LogLink::decode(&b, l.bytenr + 4096, &FSID), None, "moved");
        assert_eq!(LogLink::decode(&b, l.bytenr, &[8; 16]), None, "other fs");
        for at in [0, 9, 20, 40, 64, 90, 4000] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            assert_eq!(LogLink::decode(&bad, l.bytenr, &FSID), None, "byte {at}");
        }
        assert_eq!(LogLink::decode(&b[..100], l.bytenr, &FSID), None, "short");
    }

    #[test]
    fn the_walk_follows_links_to_the_first_that_is_not_next() {
        let a = link(1 << 20, 0, 2 << 20);
        let b = link(2 << 20, 1, 3 << 20);
        let c = link(3 << 20, 2, 4 << 20);
        assert_eq!(walk(&disk(&[a, b, c]), a.bytenr), vec![0, 1, 2]);
        // A torn middle link ends the chain there.
        let mut d = disk(&[a, b, c]);
        if let Some(x) = d.get_mut(&b.bytenr) {
            x[100] ^= 0xff;
        }
        assert_eq!(walk(&d, a.bytenr), vec![0]);
        // Nothing written where the superblock points: no log.
        assert_eq!(walk(&disk(&[b, c]), a.bytenr), Vec::<u64>::new());
    }

    #[test]
    fn stale_links_of_other_chains_are_not_followed() {
        let a = link(1 << 20, 0, 2 << 20);
        // Another chain's (nonce), an older transaction's, one out of place.
        let other = LogLink {
            nonce: 78,
            ..link(2 << 20, 1, 3 << 20)
        };
        assert_eq!(walk(&disk(&[a, other]), a.bytenr), vec![0]);
        let old = LogLink {
            generation: 8,
            ..link(2 << 20, 1, 3 << 20)
        };
        assert_eq!(walk(&disk(&[a, old]), a.bytenr), vec![0]);
        let skipped = link(2 << 20, 2, 3 << 20);
        assert_eq!(walk(&disk(&[a, skipped]), a.bytenr), vec![0]);
    }

    #[test]
    fn a_hostile_chain_ends() {
        // A loop (its seq numbers made to match) and an address past the end.
        let a = link(1 << 20, 0, 2 << 20);
        let b = link(2 << 20, 1, 1 << 20);
        assert_eq!(walk(&disk(&[a, b]), a.bytenr), vec![0, 1]);
        let far = link(1 << 20, 0, 1 << 40);
        assert_eq!(walk(&disk(&[far]), far.bytenr), vec![0]);
        // Inside a block, not at its start.
        let a = link(1 << 20, 0, (2 << 20) + 512);
        let b = link((2 << 20) + 512, 1, 0);
        assert_eq!(walk(&disk(&[a, b]), a.bytenr), vec![0]);
        assert_eq!(walk(&disk(&[]), 1 << 40), Vec::<u64>::new());
    }
}
