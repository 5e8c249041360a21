//! Who sent a request, as far as the set-id rules need it. FUSE passes
//! only the caller's uid, gid and thread id; its capabilities and
//! supplementary groups are read from `/proc` when a rule needs them,
//! which is only for files that carry set-id bits.

use super::request::Header;
use std::sync::OnceLock;

/// CAP_FSETID's bit in the capability sets.
const CAP_FSETID: u32 = 4;

pub struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
    /// `/proc/<tid>/status`, read at most once per request.
    status: OnceLock<Option<String>>,
}

impl Caller {
    pub fn of(h: &Header) -> Caller {
        Caller {
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
            status: OnceLock::new(),
        }
    }

    /// The caller's `/proc/<tid>/status` line starting with `key`.
    fn status_line(&self, key: &str) -> Option<String> {
        let text = self.status.get_or_init(|| {
            (self.pid != 0)
                .then(|| std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok())
                .flatten()
        });
        text.as_deref()?
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
    }

    /// Whether the caller may change a file and keep its set-id bits
    /// (CAP_FSETID). When the caller is gone, root is assumed to hold it.
    pub fn may_keep_set_id(&self) -> bool {
        match self
            .status_line("CapEff:")
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
        {
            Some(caps) => caps & (1 << CAP_FSETID) != 0,
            None => self.uid == 0,
        }
    }

    /// Whether `gid` is the caller's group or one of its supplementary
    /// groups.
    pub fn in_group(&self, gid: u32) -> bool {
        gid == self.gid
            || self.status_line("Groups:").is_some_and(|v| {
                v.split_whitespace()
                    .any(|g| g.parse::<u32>().ok() == Some(gid))
            })
    }
}
