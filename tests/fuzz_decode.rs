//! Fuzzing the decoders with proptest: arbitrary bytes, and valid blocks
//! with random bytes changed and the checksum recomputed (so the structural
//! checks behind the checksum are reached). Decoding must return an error
//! or a node that encodes back to the same bytes; it must never panic.
//! `PROPTEST_CASES` raises the case count for a longer run.

use canopy::format::node::{Body, Item, Node, Ptr};
use canopy::format::superblock::Superblock;
use canopy::format::Key;
use proptest::prelude::*;

const FSID: [u8; 16] = [9; 16];

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

fn sample_leaf(n: usize, ns: usize) -> Vec<u8> {
    let items = (0..n as u64)
        .map(|i| Item {
            key: Key::new(i, 1, i * 3),
            data: vec![i as u8; (i % 40) as usize],
        })
        .collect();
    let node = Node {
        bytenr: 1 << 20,
        generation: 7,
        owner: 5,
        flags: 0,
        level: 0,
        body: Body::Leaf(items),
    };
    node.encode(&FSID, ns)
}

fn sample_internal(n: usize, ns: usize) -> Vec<u8> {
    let ptrs = (0..n as u64)
        .map(|i| Ptr {
            key: Key::new(i * 10, 1, 0),
            bytenr: (2 << 20) + i * 4096,
            generation: 6,
        })
        .collect();
    let node = Node {
        bytenr: 1 << 20,
        generation: 7,
        owner: 5,
        flags: 0,
        level: 1,
        body: Body::Internal(ptrs),
    };
    node.encode(&FSID, ns)
}

fn recompute_checksum(b: &mut [u8]) {
    let sum = canopy::format::crc(&b[32..]);
    b[0..4].copy_from_slice(&sum.to_le_bytes());
}

fn decode_roundtrip(b: &[u8]) {
    if let Ok(n) = Node::decode(b, 1 << 20, &FSID) {
        assert!(n.used_bytes() <= b.len());
        // A block that decodes re-encodes to a block that decodes the same.
        let again = n.encode(&FSID, b.len());
        assert_eq!(Node::decode(&again, 1 << 20, &FSID).unwrap(), n);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        decode_roundtrip(&bytes);
        let _ = Superblock::decode(&bytes, 65536);
    }

    #[test]
    fn mutated_blocks_with_valid_checksum(
        leaf in any::<bool>(),
        n in 1usize..120,
        edits in proptest::collection::vec((32usize..4096, any::<u8>()), 1..8),
    ) {
        let mut b = if leaf { sample_leaf(n, 4096) } else { sample_internal(n, 4096) };
        for (at, v) in edits {
            b[at] = v;
        }
        recompute_checksum(&mut b);
        decode_roundtrip(&b);
    }

    #[test]
    fn mutated_superblocks(
        edits in proptest::collection::vec((32usize..4096, any::<u8>()), 1..8),
        devices in any::<bool>(),
    ) {
        use canopy::format::items::Stripe;
        use canopy::format::superblock::{DeviceItem, INCOMPAT_DEVICES};
        let mut sb = Superblock {
            fsid: FSID, flags: 0, generation: 9, root: 1 << 20, root_generation: 9, root_level: 1,
            log_root: 0, log_root_generation: 0, log_root_level: 0,
            log_prev_root: 0,
            log_prev_generation: 0,
            log_prev_level: 0,
            log_nonce: 0, log_chain: 0, total_bytes: 1 << 30,
            bytes_used: 1 << 20, nodesize: 16384, sectorsize: 4096, compat: 0, compat_ro: 0,
            incompat: canopy::format::superblock::INCOMPAT_DUP, label: "x".into(),
            metadata_profile: canopy::format::superblock::Profile::Dup,
            data_profile: canopy::format::superblock::Profile::Single,
            system_chunks: vec![canopy::format::superblock::SystemChunk {
                start: 1 << 20, len: 1 << 20, first: None, extra: vec![Stripe { devid: 1, offset: 4 << 20 }],
            }],
            devid: 1,
            devices: vec![DeviceItem { devid: 1, bytes: 1 << 30, uuid: [0; 16] }],
        };
        if devices {
            sb.incompat |= INCOMPAT_DEVICES;
            sb.metadata_profile = canopy::format::superblock::Profile::Raid1c3;
            sb.devid = 2;
            sb.devices = (1..=3).map(|devid| DeviceItem { devid, bytes: 1 << 30, uuid: [devid as u8; 16] }).collect();
            sb.system_chunks[0].extra = vec![Stripe { devid: 2, offset: 1 << 20 }, Stripe { devid: 3, offset: 1 << 20 }];
        }
        let b0 = sb.encode(65536);
        prop_assert_eq!(Superblock::decode(&b0, 65536).expect("round trip"), sb.clone());
        let mut b = b0;
        for (at, v) in edits {
            b[at] = v;
        }
        let sum = canopy::format::crc(&b[32..]);
        b[0..4].copy_from_slice(&sum.to_le_bytes());
        let _ = Superblock::decode(&b, 65536);
    }
}
