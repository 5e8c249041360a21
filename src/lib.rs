//! Canopy: a copy-on-write filesystem in user space.
//!
//! Layers, top to bottom (each uses only those below it; `tests/layers.rs`
//! holds the order and the few upward uses left):
//!
//! | module | owns |
//! |---|---|
//! | [`fuse`] | the FUSE adapter, mount options, the control socket |
//! | [`send`], [`receive`] | `canopy send`: a read-only subvolume as a send stream; `canopy receive`: streams applied in the daemon |
//! | [`fs`] | POSIX semantics: inodes, directories, files, subvolumes |
//! | [`check`], [`scrub`] | the consistency checker; reading back every checksum |
//! | [`balance`] | emptying block groups while mounted |
//! | [`engine`] | the engine assembled: the transaction with its mechanisms |
//! | [`qgroup`] | quota groups and their accounting |
//! | [`extent`] | reference counts and back-references, delayed refs |
//! | [`txn`] | the engine: transactions, commit, open and format, the log's storage |
//! | [`tree`] | the copy-on-write B+tree |
//! | [`alloc`] | block groups and free space (by start and by length) |
//! | [`cache`], [`compress`], [`stream`] | the bounded cache of clean tree blocks; the codecs of compressed extents; the btrfs send stream |
//! | [`format`] | the on-disk format: keys, blocks, superblock, items |
//! | [`volume`] | the copies of each block group (`dup`), a device that writes every copy |
//! | [`dev`] | devices: image files, memory, crash recording |
//! | [`error`], `sync`, [`units`] | errors, lock helpers, sizes |
//!
//! `docs/architecture.md` describes the format and the life of a commit.

pub mod alloc;
pub mod balance;
pub mod cache;
pub mod check;
pub mod compress;
pub mod dev;
pub mod engine;
pub mod error;
pub mod extent;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod qgroup;
pub mod receive;
pub mod replace;
pub mod scrub;
pub mod send;
pub mod stream;
pub(crate) mod sync;
pub mod tree;
pub mod txn;
pub mod units;
pub mod volume;

pub use error::{Error, Result};
pub use format::Key;
pub use txn::{Engine, FormatOptions, OpenOptions};
