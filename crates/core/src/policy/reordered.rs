//! Whether a descriptor that matched no rule would match one with its entries in another order.
//! Envoy sends a descriptor's entries in the order of the route's `rate_limits` actions; a rules
//! tree nested in another order matches none of them, and the requests go unlimited with nothing
//! said. Each rule path's keys are kept as an order-free digest, built with the rules, so the check
//! on a descriptor that matched nothing is one hash per key; only one whose keys are some rule's
//! looks for the order (`order_entries`, bounded).

use std::collections::HashSet;
use std::hash::BuildHasher;

use super::{DomainRules, Level, Outcome, Rule};

/// The order-free digests of the keys along each rule's path in one domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeySets(HashSet<u64>);

impl KeySets {
    /// The digests of the paths of `root`'s rules.
    pub(crate) fn of(root: &Level) -> KeySets {
        fn collect(level: &Level, above: u64, depth: usize, out: &mut HashSet<u64>) {
            for node in &level.nodes {
                let digest = above.wrapping_add(key_hash(&node.key));
                // One entry matches in one order only.
                if node.rule.is_some() && depth >= 1 {
                    out.insert(digest);
                }
                collect(&node.children, digest, depth + 1, out);
            }
        }
        let mut out = HashSet::new();
        collect(root, 0, 0, &mut out);
        KeySets(out)
    }
}

/// A key's hash, the same in every build of the rules.
fn key_hash(key: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6b65_7973).hash_one(key)
}

/// The digest of `keys` in whatever order (a sum: repeats count).
fn digest<'e>(keys: impl Iterator<Item = &'e str>) -> u64 {
    keys.fold(0, |sum, key| sum.wrapping_add(key_hash(key)))
}

impl DomainRules {
    /// Whether `keys` (a descriptor's, which matched no rule) are, in some order, the keys of a
    /// rule's path: worth [`DomainRules::reordered`]. Cheap, with rare false positives.
    pub(crate) fn may_match_reordered<'e>(&self, keys: impl Iterator<Item = &'e str>) -> bool {
        !self.key_sets.0.is_empty() && self.key_sets.0.contains(&digest(keys))
    }

    /// The rule `entries` would match in another order, with that order (indexes into
    /// `entries`); `None` when no other order reaches a rule.
    pub fn reordered(&self, entries: &[(&str, &str)]) -> Option<(Vec<usize>, &Rule)> {
        let order = self.order_entries(entries)?;
        if order.iter().enumerate().all(|(place, &i)| place == i) {
            return None;
        }
        match self.walk(order.iter().map(|&i| entries[i]), |_| {}) {
            Outcome::Rule(rule) => Some((order, rule)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::tests::{d, policy};

    #[test]
    fn entries_in_another_order_than_the_rules_are_found_with_the_rule_they_would_match() {
        let p = policy(vec![d(
            "remote_address",
            None,
            None,
            vec![d("path", Some("/v1/*"), Some(5), vec![])],
        )]);
        let rules = p.domain("test").unwrap();
        let sent = [("path", "/v1/search"), ("remote_address", "10.0.0.1")];
        assert!(rules.may_match_reordered(sent.iter().map(|e| e.0)));
        let (order, rule) = rules.reordered(&sent).expect("the other order matches");
        assert_eq!(order, [1, 0]);
        assert_eq!(rule.path, "remote_address.path_/v1/*");

        // In the rules' order it matches as it is: nothing to say.
        assert_eq!(rules.reordered(&[sent[1], sent[0]]), None);
        // The keys, but a value no rule takes: no other order matches either.
        assert_eq!(
            rules.reordered(&[("path", "/v2"), ("remote_address", "10.0.0.1")]),
            None
        );
        // Other keys, or one key more or fewer: not even looked for.
        for keys in [
            &["path", "user"][..],
            &["path"],
            &["path", "remote_address", "x"],
        ] {
            assert!(!rules.may_match_reordered(keys.iter().copied()), "{keys:?}");
        }
    }

    #[test]
    fn a_single_entry_rule_is_no_candidate() {
        let p = policy(vec![d("a", None, Some(1), vec![])]);
        let rules = p.domain("test").unwrap();
        assert!(!rules.may_match_reordered(["a"].into_iter()));
    }
}
