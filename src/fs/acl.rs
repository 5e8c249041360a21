//! POSIX ACLs, kept as the xattrs `system.posix_acl_access` and
//! `system.posix_acl_default` in the kernel's xattr form (a version word,
//! then entries of tag u16, permissions u16, id u32, little-endian).
//!
//! The kernel enforces them (FUSE_POSIX_ACL) and caches them per inode;
//! what it leaves to the filesystem is keeping them and the mode in step:
//! setting an access ACL sets the mode's permission bits from it (and an
//! ACL the mode says all of is not stored), chmod rewrites the ACL's
//! owner, mask (or group) and other entries, and a new file or directory
//! in a directory with a default ACL gets its ACL from it, masked by the
//! mode asked for instead of by the umask.

use super::errno;
use crate::error::Result;

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of entries that name no user or group.
const NO_ID: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid ACL: entries in the order the kernel keeps them (owner, named
/// users by id, owning group, named groups by id, mask, other).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

fn invalid(what: &'static str) -> crate::Error {
    errno(libc::EINVAL, what)
}

impl Acl {
    /// Reads and checks an ACL in xattr form.
    pub fn decode(v: &[u8]) -> Result<Acl> {
        let body = match v.split_first_chunk::<4>() {
            Some((version, body)) if u32::from_le_bytes(*version) == VERSION => body,
            _ => return Err(invalid("not a version 2 ACL")),
        };
        if body.len() % 8 != 0 {
            return Err(invalid("ACL entries are 8 bytes"));
        }
        let entries = body
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl(entries);
        acl.check()?;
        Ok(acl)
    }

    /// The kernel's rules: one owner, owning group and other entry; named
    /// entries in id order, each id once; a mask exactly when there are
    /// named entries; permissions rwx at most.
    fn check(&self) -> Result<()> {
        let mut last: Option<(u16, u32)> = None;
        let mut named = false;
        for e in &self.0 {
            if e.perm & !7 != 0 {
                return Err(invalid("ACL permissions beyond rwx"));
            }
            let id = match e.tag {
                USER | GROUP => {
                    named = true;
                    e.id
                }
                USER_OBJ | GROUP_OBJ | MASK | OTHER => 0,
                _ => return Err(invalid("unknown ACL tag")),
            };
            if last.is_some_and(|l| l >= (e.tag, id)) {
                return Err(invalid("ACL entries out of order or repeated"));
            }
            last = Some((e.tag, id));
        }
        let has = |tag| self.0.iter().any(|e| e.tag == tag);
        if !has(USER_OBJ) || !has(GROUP_OBJ) || !has(OTHER) {
            return Err(invalid("ACL without owner, group or other entry"));
        }
        if named && !has(MASK) {
            return Err(invalid("ACL with named entries needs a mask"));
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            let id = if e.tag == USER || e.tag == GROUP {
                e.id
            } else {
                NO_ID
            };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    fn perm(&self, tag: u16) -> Option<u32> {
        self.0
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| u32::from(e.perm))
    }

    /// The entry that stands for the mode's group bits: the mask if there
    /// is one, else the owning group.
    fn group_class(&self) -> u16 {
        if self.perm(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        }
    }

    /// Whether the ACL grants `want` (rwx bits, 4/2/1) to a caller with
    /// uid `uid` in groups `in_group` on a file owned by `owner`: the
    /// POSIX.1e check (the owner entry for the owner, else a named user
    /// entry under the mask, else any matching group entry under the
    /// mask, else other). The kernel makes it for file access; the
    /// daemon needs it for requests that come over its control socket.
    pub fn permits(
        &self,
        uid: u32,
        in_group: &dyn Fn(u32) -> bool,
        owner: (u32, u32),
        want: u32,
    ) -> bool {
        let masked = |perm: u32| perm & self.perm(MASK).unwrap_or(7);
        if uid == owner.0 {
            return self.perm(USER_OBJ).unwrap_or(0) & want == want;
        }
        if let Some(e) = self.0.iter().find(|e| e.tag == USER && e.id == uid) {
            return masked(u32::from(e.perm)) & want == want;
        }
        let groups: Vec<u32> = self
            .0
            .iter()
            .filter(|e| match e.tag {
                GROUP_OBJ => in_group(owner.1),
                GROUP => in_group(e.id),
                _ => false,
            })
            .map(|e| u32::from(e.perm))
            .collect();
        if !groups.is_empty() {
            return groups.iter().any(|&p| masked(p) & want == want);
        }
        self.perm(OTHER).unwrap_or(0) & want == want
    }

    /// The mode's permission bits this ACL implies, and whether the ACL
    /// says no more than they do (it has only the three base entries).
    pub fn mode_bits(&self) -> (u32, bool) {
        let p = |tag| self.perm(tag).unwrap_or(0);
        let bits = p(USER_OBJ) << 6 | p(self.group_class()) << 3 | p(OTHER);
        (bits, self.0.len() == 3)
    }

    /// Applies `f(entry's permissions, the mode's matching 3 bits)` to the
    /// owner, group class and other entries (the ones the mode stands for).
    fn with_mode_bits(&mut self, mode: u32, f: impl Fn(u16, u16) -> u16) {
        let class = self.group_class();
        for e in &mut self.0 {
            let shift = match e.tag {
                USER_OBJ => 6,
                t if t == class => 3,
                OTHER => 0,
                _ => continue,
            };
            e.perm = f(e.perm, ((mode >> shift) & 7) as u16);
        }
    }

    /// chmod: the owner, group class and other entries take the mode's
    /// bits; named entries stay (the mask limits them).
    pub fn chmod(&mut self, mode: u32) {
        self.with_mode_bits(mode, |_, bits| bits);
    }

    /// The access ACL and mode of a new inode asked for with `mode`, made
    /// in a directory with this default ACL: the ACL's owner, group class
    /// and other entries are cut down to the mode's bits, and the mode to
    /// the ACL's. None when the result says no more than the mode.
    pub fn inherit(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        acl.with_mode_bits(mode, |perm, bits| perm & bits);
        let (bits, plain) = acl.mode_bits();
        let mode = (mode & !0o777) | bits;
        (mode, (!plain).then_some(acl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    fn extended() -> Acl {
        acl(&[
            (USER_OBJ, 7, NO_ID),
            (USER, 6, 1000),
            (GROUP_OBJ, 5, NO_ID),
            (MASK, 6, NO_ID),
            (OTHER, 4, NO_ID),
        ])
    }

    #[test]
    fn decode_round_trips_and_checks() {
        let a = extended();
        assert_eq!(Acl::decode(&a.encode()).unwrap(), a);
        let no_mask = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 6, 1000),
            (GROUP_OBJ, 5, 0),
            (OTHER, 4, 0),
        ]);
        assert!(Acl::decode(&no_mask.encode()).is_err());
        let unordered = acl(&[(GROUP_OBJ, 5, 0), (USER_OBJ, 7, 0), (OTHER, 4, 0)]);
        assert!(Acl::decode(&unordered.encode()).is_err());
        let twice = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 6, 1000),
            (USER, 4, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 4, 0),
        ]);
        assert!(Acl::decode(&twice.encode()).is_err());
        assert!(Acl::decode(b"\x02\0\0\0\x01\0").is_err());
        assert!(Acl::decode(&[]).is_err());
    }

    #[test]
    fn mode_follows_the_mask_and_chmod_follows_the_mode() {
        let mut a = extended();
        assert_eq!(a.mode_bits(), (0o764, false));
        a.chmod(0o750);
        assert_eq!(a.mode_bits(), (0o750, false));
        assert_eq!(a.perm(GROUP_OBJ), Some(5), "the owning group stays");
        assert_eq!(a.perm(USER), Some(6), "named entries stay");
        let mut plain = acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert_eq!(plain.mode_bits(), (0o644, true));
        plain.chmod(0o600);
        assert_eq!(plain.mode_bits(), (0o600, true));
    }

    #[test]
    fn inheritance_masks_by_the_mode_asked_for() {
        let (mode, got) = extended().inherit(libc::S_IFREG | 0o666);
        assert_eq!(mode, libc::S_IFREG | 0o664);
        let got = got.unwrap();
        assert_eq!(got.perm(USER_OBJ), Some(6));
        assert_eq!(got.perm(MASK), Some(6));
        assert_eq!(got.perm(USER), Some(6));
        let plain = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]);
        assert_eq!(plain.inherit(0o777), (0o750, None));
    }
}
