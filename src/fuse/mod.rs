//! The FUSE front: Canopy's own session layer over the kernel's FUSE
//! protocol, and the handler that turns requests into
//! [`crate::fs::Fs`] calls.
//!
//! Thin by design: no on-disk knowledge here. Node ids map one to one
//! (see `fs::node`), except that FUSE's root (1) is the root directory of
//! the subvolume the mount shows. `proto` holds the protocol's numbers,
//! `request` and `reply` its encodings, `session` the handshake, and
//! `dev` and `uring` the two transports; `handler` answers requests.

pub mod bdi;
mod caller;
pub mod control;
mod convert;
mod dev;
mod dircookie;
mod fusermount;
mod handler;
mod listing;
pub mod mount;
mod notify;
mod options;
mod peer;
mod proto;
pub mod receive;
mod reply;
mod request;
pub mod send;
mod session;
mod uring;

pub use handler::FuseFs;
pub use notify::Notifier;
pub use session::Transport;

/// Largest write the kernel sends in one request, and largest read
/// reply (`max_pages`).
pub const MAX_WRITE: u32 = 1 << 20;
