//! The fsync log a crash left: what replay would make of it.
//!
//! Nothing here judges the log by rules of its own: `check` runs the
//! mount's replay, in memory on a read-only engine, and reports what it
//! did. First the examination the engine makes at open before it trusts
//! a log root (`txn::log`): every block as its parent names it, every item
//! through the checker, everything it names inside block groups of the
//! last commit and free there, the data under its checksums. Then the
//! replay itself (`fs::log`), which leaves out the inodes it cannot use
//! and says why. `check` reports a pending log and what it would replay,
//! a root that did not reach the disk whole (a warning: an fsync that
//! never returned), a root that is wrong as written, every inode replay
//! would leave out, and a replay that would fail (problems).

use super::Report;
use crate::dev::Device;
use std::sync::Arc;

/// Adds the verdict on the log `dev`'s superblock names, if any.
pub(super) fn check_log(
    dev: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    memory: u64,
    report: &mut Report,
) {
    let engine = match super::open_read_only(dev, space, memory) {
        Ok(e) => Arc::new(e),
        // The POSIX checks report an image that does not open.
        Err(_) => return,
    };
    if engine.log_found().is_none() {
        return;
    }
    if let Err(e) = crate::fs::Fs::new(engine.clone()) {
        report.problem("fsync log", format!("replaying it fails: {e}"));
    }
    let Some(v) = engine.log_found() else {
        return;
    };
    for d in &v.dropped {
        let message = format!(
            "the {} root of the fsync log cannot be replayed: {}",
            d.which, d.reason
        );
        let location = format!("log root {}", d.root);
        if d.torn {
            report.warning(location, message);
        } else {
            report.problem(location, message);
        }
    }
    for s in &v.skipped {
        report.problem(
            format!("log inode {}", s.node),
            format!(
                "replay would leave this inode as the last commit has it: {}",
                s.reason
            ),
        );
    }
    report.log = Some(v);
}
