//! Whether a descriptor that matched no rule is longer than the rule its first entries reach. A
//! rule with no nested descriptors ends a branch: a descriptor with more entries matches nothing
//! there (as in envoyproxy/ratelimit), which reads as "the parent's limit applies" to whoever
//! added a `rate_limits` action, and the requests go unlimited with nothing said. The ordered
//! digests of the paths of such rules are kept when the rules are built, so the check on a
//! descriptor that matched nothing is one hash per key; only one whose first entries' keys end on
//! such a rule is walked again.

use std::collections::HashSet;
use std::hash::BuildHasher;

use super::{DomainRules, Level, Rule, Step};

/// The ordered digests of the key paths of a domain's rules that have no nested descriptors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LeafPaths(HashSet<u64>);

impl LeafPaths {
    /// The digests of the paths of `root`'s rules without nested descriptors.
    pub(crate) fn of(root: &Level) -> LeafPaths {
        fn collect(level: &Level, above: u64, out: &mut HashSet<u64>) {
            for node in &level.nodes {
                let digest = step(above, &node.key);
                if node.rule.is_some() && node.children.nodes.is_empty() {
                    out.insert(digest);
                }
                collect(&node.children, digest, out);
            }
        }
        let mut out = HashSet::new();
        collect(root, 0, &mut out);
        LeafPaths(out)
    }
}

/// The digest of a key path extended by `key` (order matters).
fn step(above: u64, key: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6c65_6166).hash_one((above, key))
}

impl DomainRules {
    /// Whether the keys of some first entries of `keys` (not all of them) are the path of a rule
    /// without nested descriptors: worth [`DomainRules::longer_than_its_rule`]. Cheap, with rare
    /// false positives.
    pub(crate) fn may_be_longer_than_a_rule<'e>(
        &self,
        keys: impl ExactSizeIterator<Item = &'e str>,
    ) -> bool {
        if self.leaf_paths.0.is_empty() {
            return false;
        }
        let last = keys.len().saturating_sub(1);
        let mut digest = 0;
        keys.take(last).any(|key| {
            digest = step(digest, key);
            self.leaf_paths.0.contains(&digest)
        })
    }

    /// The rule `entries`' first entries match, with how many they are, where the descriptor
    /// goes on past that rule's path and so matches nothing; `None` otherwise.
    pub fn longer_than_its_rule(&self, entries: &[(&str, &str)]) -> Option<(usize, &Rule)> {
        let mut reached: Option<&Rule> = None;
        let mut longer_at = None;
        self.walk(entries.iter().copied(), |step| match step {
            Step::Matched { node, .. } => reached = node.rule.as_ref(),
            Step::TooLong { index } => longer_at = Some(index),
            Step::NoCandidate { .. } => {}
        });
        Some((longer_at?, reached?))
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::tests::{d, policy};

    #[test]
    fn a_descriptor_past_a_rule_without_nested_entries_is_found_with_that_rule() {
        let p = policy(vec![
            d("remote_address", None, Some(5), vec![]),
            d(
                "user",
                None,
                Some(1),
                vec![d("path", None, Some(2), vec![])],
            ),
        ]);
        let rules = p.domain("test").unwrap();
        let sent = [("remote_address", "10.0.0.1"), ("path", "/v1")];
        assert!(rules.may_be_longer_than_a_rule(sent.iter().map(|e| e.0)));
        let (matched, rule) = rules.longer_than_its_rule(&sent).expect("longer");
        assert_eq!((matched, rule.path.as_str()), (1, "remote_address"));

        // A rule with nested entries whose next entry differs is no leaf: not this case.
        let under_user = [("user", "u"), ("method", "GET")];
        assert!(!rules.may_be_longer_than_a_rule(under_user.iter().map(|e| e.0)));
        // As long as the rule, or another first key: nothing to say.
        assert!(!rules.may_be_longer_than_a_rule(["remote_address"].into_iter()));
        assert!(!rules.may_be_longer_than_a_rule(["path", "remote_address"].into_iter()));
        assert_eq!(
            rules.longer_than_its_rule(&[("user", "u"), ("path", "/")]),
            None
        );
    }
}
