//! Layouts of the quota tree's items (tree 8), as in btrfs:
//!
//! - `(0, QGROUP_STATUS, 0)`: [`QgroupStatus`], present exactly while
//!   quotas are enabled;
//! - `(0, QGROUP_INFO, qgroupid)`: [`QgroupInfo`], the group's numbers;
//! - `(0, QGROUP_LIMIT, qgroupid)`: [`QgroupLimit`], present when the
//!   group has a limit;
//! - `(child, QGROUP_RELATION, parent)` and `(parent, QGROUP_RELATION,
//!   child)`: empty, one pair per membership of a group in a higher one.
//!
//! A qgroup id is `level << 48 | id`: level 0 groups are subvolumes (0/ID
//! for subvolume ID), higher levels are groups of groups (`1/N`).

use super::{le_u64, put_u64};

type DecodeResult<T> = std::result::Result<T, String>;

/// Bits of a qgroup id that hold its level.
pub const LEVEL_SHIFT: u32 = 48;
/// Highest level a qgroup may have.
pub const MAX_LEVEL: u64 = 7;

/// The qgroup id `level/id`.
pub fn qgroupid(level: u64, id: u64) -> u64 {
    level << LEVEL_SHIFT | id
}

/// The level of a qgroup id.
pub fn level_of(qgroupid: u64) -> u64 {
    qgroupid >> LEVEL_SHIFT
}

/// The id part of a qgroup id (a subvolume id at level 0).
pub fn id_of(qgroupid: u64) -> u64 {
    qgroupid & ((1 << LEVEL_SHIFT) - 1)
}

/// `level/id`, as btrfs-progs prints it.
pub fn display(qgroupid: u64) -> String {
    format!("{}/{}", level_of(qgroupid), id_of(qgroupid))
}

/// Parses `level/id`; a bare number is a level-0 group.
pub fn parse(s: &str) -> Option<u64> {
    let (level, id) = match s.split_once('/') {
        Some((l, i)) => (l.parse::<u64>().ok()?, i.parse::<u64>().ok()?),
        None => (0, s.parse::<u64>().ok()?),
    };
    (level <= MAX_LEVEL && id < 1 << LEVEL_SHIFT).then(|| qgroupid(level, id))
}

/// Status flag: quotas are on (the status item exists only then).
pub const STATUS_ON: u64 = 1;
/// Status flag: a rescan is under way; the numbers count the extents
/// below `rescan` only.
pub const STATUS_RESCAN: u64 = 2;

/// `(0, QGROUP_STATUS, 0)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QgroupStatus {
    /// Layout version of the quota items (1).
    pub version: u64,
    /// Generation of the commit that last wrote the numbers.
    pub generation: u64,
    pub flags: u64,
    /// With [`STATUS_RESCAN`]: the address the rescan counts from next.
    pub rescan: u64,
}

pub const QGROUP_STATUS_SIZE: usize = 32;

impl QgroupStatus {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; QGROUP_STATUS_SIZE];
        put_u64(&mut b, 0, self.version);
        put_u64(&mut b, 8, self.generation);
        put_u64(&mut b, 16, self.flags);
        put_u64(&mut b, 24, self.rescan);
        b
    }

    /// Where a rescan under way has got to.
    pub fn rescan_cursor(&self) -> Option<u64> {
        (self.flags & STATUS_RESCAN != 0).then_some(self.rescan)
    }

    pub fn decode(b: &[u8]) -> DecodeResult<QgroupStatus> {
        if b.len() != QGROUP_STATUS_SIZE {
            return Err(format!("qgroup status item of {} bytes", b.len()));
        }
        let s = QgroupStatus {
            version: le_u64(b, 0),
            generation: le_u64(b, 8),
            flags: le_u64(b, 16),
            rescan: le_u64(b, 24),
        };
        if s.version != 1 {
            return Err(format!("qgroup status version {}", s.version));
        }
        if s.flags & !(STATUS_ON | STATUS_RESCAN) != 0 || s.flags & STATUS_ON == 0 {
            return Err(format!("qgroup status flags {:#x}", s.flags));
        }
        Ok(s)
    }
}

/// `(0, QGROUP_INFO, qgroupid)`: bytes reachable from the group's
/// subvolumes (`referenced`) and from them alone (`exclusive`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QgroupInfo {
    pub generation: u64,
    pub referenced: u64,
    pub exclusive: u64,
}

pub const QGROUP_INFO_SIZE: usize = 24;

impl QgroupInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; QGROUP_INFO_SIZE];
        put_u64(&mut b, 0, self.generation);
        put_u64(&mut b, 8, self.referenced);
        put_u64(&mut b, 16, self.exclusive);
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<QgroupInfo> {
        if b.len() != QGROUP_INFO_SIZE {
            return Err(format!("qgroup info item of {} bytes", b.len()));
        }
        let i = QgroupInfo {
            generation: le_u64(b, 0),
            referenced: le_u64(b, 8),
            exclusive: le_u64(b, 16),
        };
        if i.exclusive > i.referenced {
            return Err(format!(
                "qgroup exclusive {} above referenced {}",
                i.exclusive, i.referenced
            ));
        }
        Ok(i)
    }
}

/// `(0, QGROUP_LIMIT, qgroupid)`: the most bytes the group may reference
/// or hold exclusively (None: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QgroupLimit {
    pub max_referenced: Option<u64>,
    pub max_exclusive: Option<u64>,
}

pub const QGROUP_LIMIT_SIZE: usize = 24;
const LIMIT_REFERENCED: u64 = 1;
const LIMIT_EXCLUSIVE: u64 = 2;

impl QgroupLimit {
    pub fn is_none(&self) -> bool {
        self.max_referenced.is_none() && self.max_exclusive.is_none()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; QGROUP_LIMIT_SIZE];
        let mut flags = 0;
        if self.max_referenced.is_some() {
            flags |= LIMIT_REFERENCED;
        }
        if self.max_exclusive.is_some() {
            flags |= LIMIT_EXCLUSIVE;
        }
        put_u64(&mut b, 0, flags);
        put_u64(&mut b, 8, self.max_referenced.unwrap_or(0));
        put_u64(&mut b, 16, self.max_exclusive.unwrap_or(0));
        b
    }

    pub fn decode(b: &[u8]) -> DecodeResult<QgroupLimit> {
        if b.len() != QGROUP_LIMIT_SIZE {
            return Err(format!("qgroup limit item of {} bytes", b.len()));
        }
        let flags = le_u64(b, 0);
        if flags & !(LIMIT_REFERENCED | LIMIT_EXCLUSIVE) != 0 {
            return Err(format!("qgroup limit flags {flags:#x}"));
        }
        Ok(QgroupLimit {
            max_referenced: (flags & LIMIT_REFERENCED != 0).then(|| le_u64(b, 8)),
            max_exclusive: (flags & LIMIT_EXCLUSIVE != 0).then(|| le_u64(b, 16)),
        })
    }
}

/// What the item checker requires of a quota tree item.
pub fn check(key: &super::Key, data: &[u8]) -> DecodeResult<()> {
    use super::key_type::{QGROUP_INFO, QGROUP_LIMIT, QGROUP_RELATION, QGROUP_STATUS};
    let valid_id = |q: u64| level_of(q) <= MAX_LEVEL;
    match key.ty {
        QGROUP_STATUS if key.objectid == 0 && key.offset == 0 => {
            QgroupStatus::decode(data).map(drop)
        }
        QGROUP_INFO if key.objectid == 0 && valid_id(key.offset) => {
            QgroupInfo::decode(data).map(drop)
        }
        QGROUP_LIMIT if key.objectid == 0 && valid_id(key.offset) => {
            QgroupLimit::decode(data).map(drop)
        }
        QGROUP_RELATION
            if valid_id(key.objectid)
                && valid_id(key.offset)
                && level_of(key.objectid) != level_of(key.offset) =>
        {
            match data.len() {
                0 => Ok(()),
                n => Err(format!("qgroup relation of {n} bytes")),
            }
        }
        _ => Err(format!("quota item with key {key} is not valid")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse_as_btrfs_does() {
        assert_eq!(display(qgroupid(1, 100)), "1/100");
        assert_eq!(parse("1/100"), Some(qgroupid(1, 100)));
        assert_eq!(parse("256"), Some(256));
        assert_eq!(parse("8/1"), None);
        assert_eq!(parse("x/1"), None);
    }

    #[test]
    fn items_round_trip_and_reject_nonsense() {
        let l = QgroupLimit {
            max_referenced: Some(5),
            max_exclusive: None,
        };
        assert_eq!(QgroupLimit::decode(&l.encode()), Ok(l));
        let i = QgroupInfo {
            generation: 3,
            referenced: 10,
            exclusive: 4,
        };
        assert_eq!(QgroupInfo::decode(&i.encode()), Ok(i));
        let bad = QgroupInfo { exclusive: 11, ..i };
        assert!(QgroupInfo::decode(&bad.encode()).is_err());
        assert!(QgroupStatus::decode(&[0u8; 24]).is_err());
    }
}
