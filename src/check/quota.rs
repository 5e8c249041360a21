//! Quota groups, when quotas are on: every subvolume has its level-0
//! group, every membership is recorded both ways, and every group's
//! referenced and exclusive bytes equal a count made from scratch
//! (`qgroup::compute_usage`, which descends the trees rather than
//! climbing back-references as the commit does).

use super::Report;
use crate::dev::Device;
use crate::format::key_type::QGROUP_RELATION;
use crate::format::qgroup::display;
use crate::format::tree_id::QUOTA;
use crate::format::Key;
use std::collections::BTreeSet;
use std::sync::Arc;

pub(super) fn check_quota(
    dev: Vec<Arc<dyn Device>>,
    space: Option<&crate::txn::SpaceOverride>,
    memory: u64,
    report: &mut Report,
) {
    let engine = match super::open_read_only(dev, space, memory) {
        Ok(e) => e,
        Err(e) => return report.problem("quota tree", format!("cannot open: {e}")),
    };
    let found = engine.read(|r| {
        let mut problems = crate::qgroup::differences(r)?;
        problems.extend(one_sided_relations(&r.range(
            QUOTA,
            &Key::MIN,
            &Key::MAX,
        )?));
        Ok(problems)
    });
    match found {
        Ok(problems) => {
            for p in problems {
                report.problem("quota tree", p);
            }
        }
        Err(e) => report.problem("quota tree", e.to_string()),
    }
}

/// Memberships recorded in one direction only.
fn one_sided_relations(items: &[(Key, Vec<u8>)]) -> Vec<String> {
    let pairs: BTreeSet<(u64, u64)> = items
        .iter()
        .filter(|(k, _)| k.ty == QGROUP_RELATION)
        .map(|(k, _)| (k.objectid, k.offset))
        .collect();
    pairs
        .iter()
        .filter(|&&(a, b)| !pairs.contains(&(b, a)))
        .map(|&(a, b)| {
            format!(
                "relation {} -> {} has no counterpart",
                display(a),
                display(b)
            )
        })
        .collect()
}
