//! Transparent compression of file data: the codecs (zstd and lz4), the
//! policy that says when to use them, and the cheap test that skips data
//! that will not compress.
//!
//! Writeback cuts a file's flushed ranges into chunks of at most
//! [`CHUNK`] bytes (btrfs's unit), aligned to multiples of it in the file,
//! and compresses each on its own, outside the engine lock. A chunk whose
//! compressed form saves less than one sector is written plain. On disk a
//! compressed extent is a frame: the payload's length (u32, little
//! endian), the codec's payload, zeros up to a whole sector. Checksums
//! cover those bytes as they are on disk, so scrub and balance handle a
//! compressed extent as any other.
//!
//! A read decodes whole extents, and never more than [`CHUNK`] bytes of
//! one: an extent whose item declares more is refused before anything is
//! allocated, and a payload that decodes to more than it declares fails
//! (a decompression bomb costs one 128 KiB buffer).

use crate::format::items::{COMPRESSED_MAX, COMPRESS_LZ4, COMPRESS_NONE, COMPRESS_ZSTD};
use crate::format::SECTORSIZE;
use std::cell::RefCell;

/// Largest decoded length of a compressed extent.
pub const CHUNK: u64 = COMPRESSED_MAX;

/// The xattr that carries a file's or directory's compression property,
/// named as btrfs names it so scripts written for btrfs work unchanged.
pub const PROPERTY: &[u8] = b"btrfs.compression";

/// zstd level when none is given (btrfs's default too).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;
/// Highest zstd level accepted (btrfs accepts 1 to 15).
pub const ZSTD_MAX_LEVEL: i32 = 15;

const SECTOR: usize = SECTORSIZE as usize;
/// Bytes of the frame header: the payload's length.
const HEADER: usize = 4;

/// A compression algorithm, with its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Codec {
    Zstd(i32),
    Lz4,
}

impl Codec {
    /// The name of a file extent item's `compression` byte, as
    /// `compsize` and `filefrag` show it.
    pub fn name_of(kind: u8) -> &'static str {
        match kind {
            COMPRESS_NONE => "none",
            COMPRESS_ZSTD => "zstd",
            COMPRESS_LZ4 => "lz4",
            _ => "unknown",
        }
    }

    /// The `compression` byte of a file extent item.
    pub fn kind(self) -> u8 {
        match self {
            Codec::Zstd(_) => COMPRESS_ZSTD,
            Codec::Lz4 => COMPRESS_LZ4,
        }
    }

    /// How it is written in options and properties: `zstd:5`, `lz4`.
    pub fn name(self) -> String {
        match self {
            Codec::Zstd(ZSTD_DEFAULT_LEVEL) => "zstd".into(),
            Codec::Zstd(l) => format!("zstd:{l}"),
            Codec::Lz4 => "lz4".into(),
        }
    }

    /// Parses `zstd`, `zstd:LEVEL` or `lz4`; `no`, `none` and the empty
    /// string mean no compression (None).
    pub fn parse(s: &str) -> Result<Option<Codec>, String> {
        let (name, level) = s.split_once(':').map_or((s, None), |(n, l)| (n, Some(l)));
        match (name, level) {
            ("" | "no" | "none" | "off", None) => Ok(None),
            ("zstd", None) => Ok(Some(Codec::Zstd(ZSTD_DEFAULT_LEVEL))),
            ("zstd", Some(l)) => match l.parse::<i32>() {
                Ok(l) if (1..=ZSTD_MAX_LEVEL).contains(&l) => Ok(Some(Codec::Zstd(l))),
                _ => Err(format!("zstd level '{l}' is not 1 to {ZSTD_MAX_LEVEL}")),
            },
            ("lz4", None) => Ok(Some(Codec::Lz4)),
            ("zlib" | "lzo", _) => Err(format!(
                "'{name}' is a btrfs algorithm Canopy does not have: use zstd or lz4"
            )),
            _ => Err(format!(
                "unknown compression '{s}' (zstd, zstd:LEVEL, lz4 or none)"
            )),
        }
    }
}

/// When writeback compresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The mount's codec (`-o compress=`), used where no property says
    /// otherwise.
    pub codec: Option<Codec>,
    /// `compress-force=`: every chunk is tried, with no heuristic and no
    /// giving up on a file.
    pub force: bool,
}

/// What a file's property asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Property {
    /// No property: the mount's policy decides.
    Unset,
    /// `none`: never compressed, whatever the mount says.
    Never,
    Use(Codec),
}

impl Property {
    /// The property from the xattr's value; a value that does not parse
    /// (only a damaged or foreign image has one) counts as unset.
    pub fn from_xattr(value: Option<&[u8]>) -> Property {
        let Some(v) = value.filter(|v| !v.is_empty()) else {
            return Property::Unset;
        };
        match std::str::from_utf8(v).map(|s| Codec::parse(s.trim_end_matches('\0'))) {
            Ok(Ok(Some(c))) => Property::Use(c),
            Ok(Ok(None)) => Property::Never,
            _ => Property::Unset,
        }
    }
}

/// The codec for a file's next flush, if any: its property over the
/// mount's policy; a file marked as not compressing (`gave_up`) is tried
/// again only under `compress-force`.
pub fn choose(policy: Policy, property: Property, gave_up: bool) -> Option<Codec> {
    let codec = match property {
        Property::Never => return None,
        Property::Use(c) => Some(c),
        Property::Unset => policy.codec,
    };
    if gave_up && !policy.force {
        return None;
    }
    codec
}

/// Whether a sample of `data` looks worth compressing: the Shannon
/// entropy of bytes taken across it. Compressed or encrypted data sits
/// near 8 bits a byte; text, code and databases well below.
pub fn looks_compressible(data: &[u8]) -> bool {
    /// Bytes taken at each sampling point, and the step between points:
    /// 1/16 of a chunk looked at.
    const TAKE: usize = 32;
    const STEP: usize = 512;
    /// Bits a byte above which data is taken for already compressed.
    const MAX_ENTROPY: f64 = 7.2;
    let mut counts = [0u32; 256];
    let mut n = 0u32;
    for piece in data.chunks(STEP) {
        for &b in &piece[..piece.len().min(TAKE)] {
            counts[usize::from(b)] += 1;
            n += 1;
        }
    }
    if n == 0 {
        return false;
    }
    let total = f64::from(n);
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / total;
            -p * p.log2()
        })
        .sum();
    entropy < MAX_ENTROPY
}

thread_local! {
    static ZSTD_IN: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static ZSTD_OUT: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static ZSTD_PREFIX: RefCell<Option<zstd::stream::raw::Decoder<'static>>> =
        const { RefCell::new(None) };
}

/// The codec's payload for `data`, or None when it is not smaller.
fn compress_payload(codec: Codec, data: &[u8]) -> Option<Vec<u8>> {
    match codec {
        Codec::Lz4 => Some(lz4_flex::block::compress(data)),
        Codec::Zstd(level) => ZSTD_IN.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.as_ref().is_none_or(|(l, _)| *l != level) {
                *cell = Some((level, zstd::bulk::Compressor::new(level).ok()?));
            }
            let (_, c) = cell.as_mut()?;
            c.compress(data).ok()
        }),
    }
}

/// `data` (whole sectors) as an on-disk frame, if that saves at least
/// one sector; None means write it plain.
pub fn encode(codec: Codec, data: &[u8]) -> Option<Vec<u8>> {
    let payload = compress_payload(codec, data)?;
    let framed = (HEADER + payload.len()).next_multiple_of(SECTOR);
    if framed + SECTOR > data.len().next_multiple_of(SECTOR) {
        return None;
    }
    frame(&payload, framed)
}

/// A small file's whole `data` as the frame an inline item stores (no
/// padding: the item knows its length), if that frame is at most `max`
/// bytes and smaller than `data`; None means store it plain.
pub fn encode_inline(codec: Codec, data: &[u8], max: usize) -> Option<Vec<u8>> {
    let payload = compress_payload(codec, data)?;
    let framed = HEADER + payload.len();
    if framed > max || framed >= data.len() {
        return None;
    }
    frame(&payload, framed)
}

/// The frame of `payload`: its length, itself, zeros up to `len` bytes.
fn frame(payload: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&u32::try_from(payload.len()).ok()?.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(len, 0);
    Some(out)
}

/// Decodes an on-disk frame of codec `kind` into the `ram_bytes` bytes
/// its item declares. Every way the frame can lie is an error, and at
/// most [`CHUNK`] bytes are ever allocated.
pub fn decode(kind: u8, frame: &[u8], ram_bytes: u64) -> Result<Vec<u8>, String> {
    if ram_bytes == 0 || ram_bytes > CHUNK {
        return Err(format!(
            "compressed extent declares {ram_bytes} decoded bytes (at most {CHUNK})"
        ));
    }
    let mut out = vec![0u8; ram_bytes as usize];
    decode_into(kind, frame, &mut out)?;
    Ok(out)
}

/// [`decode`] into `out`, whose length is the decoded length the item
/// declares (at most [`CHUNK`]): a read that wants the whole extent
/// decodes it in place.
pub fn decode_into(kind: u8, frame: &[u8], out: &mut [u8]) -> Result<(), String> {
    if out.is_empty() || out.len() as u64 > CHUNK {
        return Err(format!(
            "compressed extent declares {} decoded bytes (at most {CHUNK})",
            out.len()
        ));
    }
    let payload = payload_of(frame)?;
    let got = match kind {
        COMPRESS_LZ4 => {
            lz4_flex::block::decompress_into(payload, out).map_err(|e| format!("lz4: {e}"))?
        }
        COMPRESS_ZSTD => ZSTD_OUT.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
            }
            let d = cell.as_mut().ok_or("zstd: no decoder")?;
            d.decompress_to_buffer(payload, &mut *out)
                .map_err(|e| format!("zstd: {e}"))
        })?,
        COMPRESS_NONE => return Err("extent is not compressed".into()),
        k => return Err(format!("compression type {k} unknown")),
    };
    if got != out.len() {
        return Err(format!(
            "compressed extent decodes to {got} bytes, its item says {}",
            out.len()
        ));
    }
    Ok(())
}

/// The first `out.len()` decoded bytes of a frame whose item declares
/// `ram_bytes`: a read of the start of an extent decodes only as far as
/// it needs (zstd decodes in order and stops when `out` is full; lz4 and
/// a whole extent decode all of it, through [`decode_into`]).
pub fn decode_prefix(kind: u8, frame: &[u8], ram_bytes: u64, out: &mut [u8]) -> Result<(), String> {
    if ram_bytes == 0 || ram_bytes > CHUNK || out.len() as u64 > ram_bytes {
        return Err(format!(
            "compressed extent declares {ram_bytes} decoded bytes (at most {CHUNK})"
        ));
    }
    if kind != COMPRESS_ZSTD || out.len() as u64 == ram_bytes {
        let whole = decode(kind, frame, ram_bytes)?;
        out.copy_from_slice(&whole[..out.len()]);
        return Ok(());
    }
    let payload = payload_of(frame)?;
    ZSTD_PREFIX.with(|cell| {
        use zstd::stream::raw::Operation;
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::stream::raw::Decoder::new().map_err(|e| format!("zstd: {e}"))?);
        }
        let d = cell.as_mut().ok_or("zstd: no decoder")?;
        d.reinit().map_err(|e| format!("zstd: {e}"))?;
        let (mut read, mut written) = (0, 0);
        while written < out.len() {
            let s = d
                .run_on_buffers(&payload[read..], &mut out[written..])
                .map_err(|e| format!("zstd: {e}"))?;
            read += s.bytes_read;
            written += s.bytes_written;
            if s.bytes_read == 0 && s.bytes_written == 0 {
                return Err(format!(
                    "compressed extent decodes to {written} bytes, fewer than the {} read",
                    out.len()
                ));
            }
        }
        Ok(())
    })
}

/// The codec's payload inside a frame.
fn payload_of(frame: &[u8]) -> Result<&[u8], String> {
    let len = frame
        .get(..HEADER)
        .map(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize)
        .ok_or("compressed extent shorter than its header")?;
    frame
        .get(HEADER..HEADER.saturating_add(len))
        .ok_or_else(|| format!("compressed payload of {len} bytes past its extent"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Vec<u8> {
        b"the quick brown fox jumps over the lazy dog 0123456789\n"
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect()
    }

    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn both_codecs_round_trip_whole_sectors() {
        let data = text(CHUNK as usize);
        for codec in [Codec::Zstd(3), Codec::Zstd(15), Codec::Lz4] {
            let frame = encode(codec, &data).expect("text compresses");
            assert_eq!(frame.len() % SECTOR, 0);
            assert!(frame.len() < data.len() / 4);
            assert_eq!(decode(codec.kind(), &frame, CHUNK).unwrap(), data);
        }
    }

    #[test]
    fn noise_is_written_plain_and_skipped_by_the_heuristic() {
        let data = noise(CHUNK as usize);
        assert!(!looks_compressible(&data));
        assert!(looks_compressible(&text(CHUNK as usize)));
        assert!(looks_compressible(&vec![0u8; 4096]));
        assert!(encode(Codec::Zstd(3), &data).is_none());
        assert!(encode(Codec::Lz4, &data).is_none());
    }

    /// A small file's frame is unpadded and decodes back; one that does
    /// not fit the inline limit, or does not shrink, is refused.
    #[test]
    fn inline_frames_round_trip_within_their_limit() {
        let data = text(4000);
        for codec in [Codec::Zstd(3), Codec::Lz4] {
            let frame = encode_inline(codec, &data, 2048).expect("text compresses");
            assert!(frame.len() < 2048 && !frame.len().is_multiple_of(SECTOR));
            assert_eq!(decode(codec.kind(), &frame, 4000).unwrap(), data);
            assert!(encode_inline(codec, &data, 16).is_none(), "over the limit");
        }
        assert!(encode_inline(Codec::Zstd(3), &noise(3000), 4096).is_none());
        assert!(encode_inline(Codec::Zstd(3), b"ab", 2048).is_none());
    }

    /// A frame that lies about its length, its payload or its codec is an
    /// error, and a bomb never gets more than the declared buffer.
    #[test]
    fn lying_frames_are_errors() {
        let data = text(CHUNK as usize);
        let frame = encode(Codec::Zstd(3), &data).unwrap();
        assert!(decode(COMPRESS_ZSTD, &frame, CHUNK * 1024).is_err(), "bomb");
        assert!(
            decode(COMPRESS_ZSTD, &frame, CHUNK / 2).is_err(),
            "too small"
        );
        assert!(decode(COMPRESS_ZSTD, &frame, CHUNK - 4096).is_err());
        assert!(decode(COMPRESS_LZ4, &frame, CHUNK).is_err(), "wrong codec");
        assert!(decode(9, &frame, CHUNK).is_err(), "unknown codec");
        assert!(decode(COMPRESS_ZSTD, &frame[..2], CHUNK).is_err());
        let mut long = frame.clone();
        long[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(COMPRESS_ZSTD, &long, CHUNK).is_err());
        let mut bad = frame.clone();
        for b in &mut bad[8..40] {
            *b ^= 0x5a;
        }
        assert!(decode(COMPRESS_ZSTD, &bad, CHUNK).is_err());
        let lz = encode(Codec::Lz4, &data).unwrap();
        let mut bad = lz.clone();
        for b in &mut bad[4..200] {
            *b = 0xff;
        }
        assert!(decode(COMPRESS_LZ4, &bad, CHUNK).is_err());
    }

    /// A prefix decodes to the extent's first bytes; a frame too short
    /// for the prefix asked is an error.
    #[test]
    fn prefixes_decode_as_far_as_asked() {
        let data = text(CHUNK as usize);
        for codec in [Codec::Zstd(3), Codec::Lz4] {
            let frame = encode(codec, &data).unwrap();
            for n in [1usize, 4096, 70_000, CHUNK as usize] {
                let mut out = vec![0u8; n];
                decode_prefix(codec.kind(), &frame, CHUNK, &mut out).unwrap();
                assert_eq!(out, data[..n], "{codec:?} {n}");
            }
        }
        let small = encode(Codec::Zstd(3), &data[..16384]).unwrap();
        let mut out = vec![0u8; 20_000];
        assert!(decode_prefix(COMPRESS_ZSTD, &small, CHUNK, &mut out).is_err());
        assert!(decode_prefix(COMPRESS_ZSTD, &small, CHUNK * 2, &mut out).is_err());
    }

    #[test]
    fn names_parse_as_btrfs_writes_them() {
        assert_eq!(Codec::parse("zstd"), Ok(Some(Codec::Zstd(3))));
        assert_eq!(Codec::parse("zstd:9"), Ok(Some(Codec::Zstd(9))));
        assert_eq!(Codec::parse("lz4"), Ok(Some(Codec::Lz4)));
        assert_eq!(Codec::parse("no"), Ok(None));
        assert_eq!(Codec::parse(""), Ok(None));
        assert!(Codec::parse("zstd:0").is_err());
        assert!(Codec::parse("zstd:99").is_err());
        assert!(Codec::parse("zlib").is_err());
        assert!(Codec::parse("lz4:3").is_err());
        assert_eq!(Codec::Zstd(3).name(), "zstd");
        assert_eq!(Codec::Zstd(7).name(), "zstd:7");
    }

    #[test]
    fn property_overrides_the_mount_and_force_retries() {
        let mount = Policy {
            codec: Some(Codec::Lz4),
            force: false,
        };
        assert_eq!(choose(mount, Property::Unset, false), Some(Codec::Lz4));
        assert_eq!(choose(mount, Property::Never, false), None);
        let z = Property::Use(Codec::Zstd(3));
        assert_eq!(choose(Policy::default(), z, false), Some(Codec::Zstd(3)));
        assert_eq!(choose(mount, Property::Unset, true), None);
        let forced = Policy {
            force: true,
            ..mount
        };
        assert_eq!(choose(forced, Property::Unset, true), Some(Codec::Lz4));
        assert_eq!(
            Property::from_xattr(Some(b"zstd:2")),
            Property::Use(Codec::Zstd(2))
        );
        assert_eq!(Property::from_xattr(Some(b"none")), Property::Never);
        assert_eq!(Property::from_xattr(Some(b"\xff")), Property::Unset);
    }
}
