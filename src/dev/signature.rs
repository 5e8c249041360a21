//! Telling whether a device already holds a filesystem, before mkfs or
//! `device add` writes over it.

use super::Device;

/// Known signatures: (offset, magic, name).
const SIGNATURES: [(u64, &[u8], &str); 4] = [
    (1080, &[0x53, 0xef], "ext2/3/4"),
    (0, b"XFSB", "XFS"),
    ((64 << 10) + 64, b"_BHRfS_M", "btrfs"),
    // `format::MAGIC`, which lies above this layer; a test there holds
    // the two together.
    ((64 << 10) + 64, b"_CANOPY_", "Canopy"),
];

/// The filesystem whose signature `dev` carries, if one of those known.
pub fn existing_filesystem(dev: &dyn Device) -> Option<&'static str> {
    SIGNATURES.iter().find_map(|&(off, magic, name)| {
        let mut buf = vec![0u8; magic.len()];
        (off + magic.len() as u64 <= dev.size()
            && dev.read_at(&mut buf, off).is_ok()
            && buf == magic)
            .then_some(name)
    })
}
