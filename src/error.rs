//! Errors of the library.
//!
//! Each variant belongs to one POSIX errno class (see [`Error::errno`]) so that
//! only the FUSE edge ever deals in bare errno values. Corruption is an error
//! carrying the location, never a panic.

use std::io;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cause is part of the message and deliberately not a `source`:
    /// error chains (`{:#}`) would print it twice.
    #[error("I/O error while {context}: {cause}")]
    Io { context: String, cause: io::Error },
    #[error("corrupt metadata at byte {bytenr}: {reason}")]
    Corrupt { bytenr: u64, reason: String },
    /// An item the item checker rejected: EIO for the inode it belongs to.
    /// The key is shown as `Key` displays it (`Key::bad` makes one).
    #[error("bad item {key}: {reason}")]
    BadItem { key: String, reason: String },
    #[error("not a Canopy image: {0}")]
    NotCanopy(String),
    #[error("no space left on device")]
    NoSpace,
    #[error("item not found")]
    NotFound,
    #[error("item already exists")]
    Exists,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("the filesystem was shut down after an earlier failure: {0}")]
    Aborted(String),
    #[error("the filesystem is read-only")]
    ReadOnly,
    /// A POSIX error with no richer description (ENOTEMPTY, EISDIR, ...).
    #[error("{1} (errno {0})")]
    Posix(i32, &'static str),
}

impl Error {
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause: source,
        }
    }

    pub fn corrupt(bytenr: u64, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            bytenr,
            reason: reason.into(),
        }
    }

    /// The errno class this error maps to at the POSIX edge.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { .. } | Error::Corrupt { .. } | Error::NotCanopy(_) => libc::EIO,
            Error::BadItem { .. } | Error::Aborted(_) => libc::EIO,
            Error::NoSpace => libc::ENOSPC,
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::Invalid(_) => libc::EINVAL,
            Error::ReadOnly => libc::EROFS,
            Error::Posix(errno, _) => *errno,
        }
    }
}
