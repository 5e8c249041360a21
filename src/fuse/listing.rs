//! Directory listings for the kernel: READDIR and READDIRPLUS, each
//! offset carrying where its listing ends (`dircookie`).

use super::convert::err;
use super::handler::{CHUNK, PLUS_CHUNK, TTL};
use super::reply::{Listing, Reply};
use super::{dircookie, FuseFs};

impl FuseFs {
    /// Where a listing of `dir` from kernel offset `offset` ends, and the
    /// index it goes on from: a listing from 0, or from an offset that
    /// carries no bound, ends at the directory's highest index now (see
    /// `dircookie`).
    fn listing_bound(&self, dir: u64, offset: u64) -> crate::Result<(u64, u64)> {
        let resume = dircookie::decode(offset);
        match resume.last {
            Some(last) => Ok((last, resume.next)),
            None => Ok((self.fs.dir_last_index(dir)?, resume.next)),
        }
    }

    /// READDIR of `dir` from kernel offset `offset`, into `size` bytes.
    pub(super) fn list(&self, dir: u64, offset: u64, size: u32) -> Reply {
        let listed = self
            .listing_bound(dir, offset)
            .and_then(|(last, from)| Ok((last, self.fs.readdir_to(dir, from, CHUNK, last)?)));
        match listed {
            Ok((last, entries)) => {
                let mut out = Listing::new(size);
                for (next, child, dtype, name) in entries {
                    let at = dircookie::encode(last, next);
                    if !out.add(self.kernel_node(child), at, u32::from(dtype), &name) {
                        break;
                    }
                }
                out.done()
            }
            Err(e) => Reply::Error(err(e)),
        }
    }

    /// READDIRPLUS of `dir` from kernel offset `offset`, into `size`
    /// bytes.
    pub(super) fn list_plus(&self, dir: u64, offset: u64, size: u32) -> Reply {
        let (last, mut from) = match self.listing_bound(dir, offset) {
            Ok(b) => b,
            Err(e) => return Reply::Error(err(e)),
        };
        let mut out = Listing::new(size);
        // The kernel's buffer holds a getdents' worth (up to ~200
        // entries with attributes): filled chunk by chunk, so no more
        // attributes are read than fit.
        loop {
            let entries = match self.fs.readdir_plus(dir, from, PLUS_CHUNK, last) {
                Ok(e) => e,
                Err(e) => return Reply::Error(err(e)),
            };
            let Some(&(end, _, _)) = entries.last() else {
                break;
            };
            for (next, a, name) in entries {
                // Deleted since it was listed: left out.
                let Some(a) = a else { continue };
                let at = dircookie::encode(last, next);
                if !out.add_plus(&self.attr(&a), a.generation(), TTL, at, &name) {
                    return out.done();
                }
            }
            from = end;
        }
        out.done()
    }
}
