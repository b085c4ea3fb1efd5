//! Reading an unordered set of entries (an RLQS `BucketId`) as a descriptor: the order is the
//! rules tree's, at each level the entry whose key that level names, matched as usual (exact
//! value, else the first wildcard in file order, else the value-less key). Where several entries
//! fit one level, the first in file order that leads to a rule over all the entries wins; the
//! search is bounded, so a hostile bucket costs at most [`ORDER_STEPS`] node visits.

use super::{DomainRules, Level};

/// Most node visits one ordering may take.
pub(crate) const ORDER_STEPS: usize = 4096;

impl DomainRules {
    /// The order (indexes into `entries`) in which `entries` match one of this domain's rules
    /// using every entry, or `None` when no order does (or the search ran out of steps).
    pub(crate) fn order_entries(&self, entries: &[(&str, &str)]) -> Option<Vec<usize>> {
        let mut used = vec![false; entries.len()];
        let mut order = Vec::with_capacity(entries.len());
        let mut steps = ORDER_STEPS;
        search(
            &self.root, entries, &mut used, &mut order, &mut steps, false,
        )
        .then_some(order)
    }
}

/// Depth-first: extends `order` from `level`; true once every entry is placed and the last
/// matched node carries a rule (`at_rule`).
fn search(
    level: &Level,
    entries: &[(&str, &str)],
    used: &mut [bool],
    order: &mut Vec<usize>,
    steps: &mut usize,
    at_rule: bool,
) -> bool {
    if order.len() == entries.len() {
        return at_rule && !entries.is_empty();
    }
    // Candidates of this level: the unused entries whose key it names, in the file order of the
    // node each one matches.
    let mut candidates: Vec<(usize, usize)> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| !used[*i])
        .filter_map(|(i, (key, value))| {
            let node = level.candidate(key, value)?;
            let index = level.nodes.iter().position(|n| std::ptr::eq(n, node))?;
            Some((index, i))
        })
        .collect();
    candidates.sort_unstable();
    for (node_index, entry) in candidates {
        if *steps == 0 {
            return false;
        }
        *steps -= 1;
        let node = &level.nodes[node_index];
        used[entry] = true;
        order.push(entry);
        if search(
            &node.children,
            entries,
            used,
            order,
            steps,
            node.rule.is_some(),
        ) {
            return true;
        }
        order.pop();
        used[entry] = false;
    }
    false
}
