//! From an RLQS bucket to the rules. The usage report's `domain` is the rules domain; the
//! `BucketId`, an unordered map, is read as one descriptor whose entries are ordered by the rules
//! tree (see `DomainRules::order_entries`). The rule it then matches governs the bucket, with
//! the meaning it has for ShouldRateLimit: no rule (or a node without a limit) allows all,
//! `unlimited` allows all, `shadow_mode` (or the server's `SHADOW_MODE`) allows all but is still
//! counted against its pool.

use crate::limiter::LimitDefaults;
use crate::policy::{Outcome, Policy, RuleKind};
use crate::quota::pool::Pool;

/// Most entries a bucket may have; a larger one is served as unruled (allow all).
pub const MAX_BUCKET_ENTRIES: usize = 16;
/// Most bytes of keys and values a bucket may have.
pub const MAX_BUCKET_BYTES: usize = 2048;

/// Why a bucket is governed by no rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unruled {
    UnknownDomain,
    /// No order of its entries matches a rule over all of them (or it ends on a node with no
    /// limit, which allows all as it does for ShouldRateLimit).
    NoRule,
    /// More than [`MAX_BUCKET_ENTRIES`] entries or [`MAX_BUCKET_BYTES`] bytes.
    TooLarge,
}

/// What governs a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Governed {
    /// Allow all, for a long while.
    AllowAll(Unruled),
    /// An `unlimited` rule: allow all.
    Unlimited { rule_id: usize, path: String },
    /// A limited rule; `shadow` (the rule's or the server's): allowed, but counted.
    Limited {
        rule_id: usize,
        path: String,
        shadow: bool,
        pool: Pool,
    },
}

/// A bucket read against the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The bucket's entries as a descriptor: in the matched rule's order, else sorted by key.
    pub descriptor: Vec<(String, String)>,
    pub governed: Governed,
}

impl Mapping {
    /// The rule's id, when a rule governs the bucket.
    pub fn rule_id(&self) -> Option<usize> {
        match &self.governed {
            Governed::AllowAll(_) => None,
            Governed::Unlimited { rule_id, .. } | Governed::Limited { rule_id, .. } => {
                Some(*rule_id)
            }
        }
    }
}

/// The bucket's entries sorted by key then value: one text form per bucket, whatever the order
/// Envoy sent its map in.
pub fn canonical<'a>(
    bucket: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, String)> {
    let mut entries: Vec<_> = bucket
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    entries.sort();
    entries
}

/// Reads `bucket` (its entries in any order) in `domain` on `policy`. `shadow_mode`: the server's
/// `SHADOW_MODE`.
pub fn map_bucket(
    policy: &Policy,
    domain: &str,
    bucket: &[(String, String)],
    defaults: &LimitDefaults,
    shadow_mode: bool,
) -> Mapping {
    let sorted = || canonical(bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let unruled = |why| Mapping {
        descriptor: sorted(),
        governed: Governed::AllowAll(why),
    };
    let bytes: usize = bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bucket.len() > MAX_BUCKET_ENTRIES || bytes > MAX_BUCKET_BYTES {
        return unruled(Unruled::TooLarge);
    }
    let Some(rules) = policy.domain(domain) else {
        return unruled(Unruled::UnknownDomain);
    };
    let entries: Vec<(&str, &str)> = bucket
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some(order) = rules.order_entries(&entries) else {
        return unruled(Unruled::NoRule);
    };
    let ordered: Vec<(&str, &str)> = order.iter().map(|&i| entries[i]).collect();
    let Outcome::Rule(rule) = rules.walk(ordered.iter().copied(), |_| {}) else {
        return unruled(Unruled::NoRule);
    };
    let descriptor = ordered
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let governed = match &rule.kind {
        RuleKind::Unlimited { .. } => Governed::Unlimited {
            rule_id: rule.id,
            path: rule.path.clone(),
        },
        RuleKind::Limited(limits) => {
            let params: Vec<_> = limits.iter().map(|l| l.params(defaults)).collect();
            match Pool::of(&params) {
                Some(pool) => Governed::Limited {
                    rule_id: rule.id,
                    path: rule.path.clone(),
                    shadow: rule.shadow_mode || shadow_mode,
                    pool,
                },
                None => Governed::AllowAll(Unruled::NoRule),
            }
        }
        // A concurrency limit has no pool to share: Envoy's quota filter cannot hold a slot.
        RuleKind::Concurrency(_) => Governed::AllowAll(Unruled::NoRule),
    };
    Mapping {
        descriptor,
        governed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_files;

    fn policy(yaml: &str) -> Policy {
        let files = [("rules.yaml".into(), yaml.to_owned())];
        Policy::new(&parse_files(&files).expect("valid rules"))
    }

    fn bucket(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn map(policy: &Policy, domain: &str, entries: &[(&str, &str)]) -> Mapping {
        map_bucket(
            policy,
            domain,
            &bucket(entries),
            &LimitDefaults::default(),
            false,
        )
    }

    const ISSUE_EXAMPLE: &str = "
domain: rlqs-test
descriptors:
  - key: name
    value: per-api-key
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 10}
";

    #[test]
    fn the_issue_example_governs_each_api_key_whatever_the_map_order() {
        let policy = policy(ISSUE_EXAMPLE);
        for entries in [
            [("name", "per-api-key"), ("api_key", "k1")],
            [("api_key", "k1"), ("name", "per-api-key")],
        ] {
            let m = map(&policy, "rlqs-test", &entries);
            assert_eq!(
                m.descriptor,
                bucket(&[("name", "per-api-key"), ("api_key", "k1")])
            );
            let Governed::Limited {
                path, pool, shadow, ..
            } = m.governed
            else {
                panic!("{m:?}");
            };
            assert_eq!(path, "name_per-api-key.api_key");
            assert_eq!((pool.tokens, pool.period_secs, pool.burst), (10, 60, 10));
            assert!(!shadow);
        }
    }

    #[test]
    fn unmatched_buckets_allow_all() {
        let policy = policy(ISSUE_EXAMPLE);
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Unruled);
        let cases: [Case; 5] = [
            ("other", &[("name", "per-api-key")], Unruled::UnknownDomain),
            ("rlqs-test", &[("name", "per-api-key")], Unruled::NoRule),
            (
                "rlqs-test",
                &[("name", "x"), ("api_key", "k1")],
                Unruled::NoRule,
            ),
            (
                "rlqs-test",
                &[("name", "per-api-key"), ("api_key", "k1"), ("extra", "1")],
                Unruled::NoRule,
            ),
            ("rlqs-test", &[], Unruled::NoRule),
        ];
        for (domain, entries, why) in cases {
            let m = map(&policy, domain, entries);
            assert_eq!(m.governed, Governed::AllowAll(why), "{entries:?}");
            assert_eq!(m.rule_id(), None);
        }
    }

    #[test]
    fn an_oversized_bucket_is_not_searched() {
        let policy = policy(ISSUE_EXAMPLE);
        let keys: Vec<String> = (0..=MAX_BUCKET_ENTRIES).map(|i| format!("k{i}")).collect();
        let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
        let m = map(&policy, "rlqs-test", &entries);
        assert_eq!(m.governed, Governed::AllowAll(Unruled::TooLarge));
    }

    #[test]
    fn siblings_at_one_level_are_tried_until_one_leads_to_a_rule() {
        let policy = policy(
            "
domain: d
descriptors:
  - key: a
    descriptors:
      - key: x
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: y
        rate_limit: {unit: second, requests_per_unit: 2}
",
        );
        let m = map(&policy, "d", &[("y", "1"), ("b", "2"), ("a", "3")]);
        assert_eq!(m.governed, Governed::AllowAll(Unruled::NoRule));
        let m = map(&policy, "d", &[("y", "1"), ("b", "2")]);
        assert_eq!(m.descriptor, bucket(&[("b", "2"), ("y", "1")]));
        assert!(matches!(m.governed, Governed::Limited { ref path, .. } if path == "b.y"));
    }

    #[test]
    fn unlimited_and_shadow_mode_mean_what_they_mean_for_should_rate_limit() {
        let policy = policy(
            "
domain: d
descriptors:
  - key: vip
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        );
        assert!(matches!(
            map(&policy, "d", &[("vip", "1")]).governed,
            Governed::Unlimited { .. }
        ));
        assert!(matches!(
            map(&policy, "d", &[("trial", "1")]).governed,
            Governed::Limited { shadow: true, .. }
        ));
        let global = map_bucket(
            &policy,
            "d",
            &bucket(&[("user", "1")]),
            &LimitDefaults::default(),
            true,
        );
        assert!(matches!(
            global.governed,
            Governed::Limited { shadow: true, .. }
        ));
    }

    #[test]
    fn wildcards_and_exact_values_match_as_usual() {
        let policy = policy(
            "
domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/admin
    rate_limit: {unit: second, requests_per_unit: 1}
",
        );
        let admin = map(&policy, "d", &[("path", "/api/admin")]);
        assert!(matches!(admin.governed, Governed::Limited { pool, .. } if pool.tokens == 1));
        let other = map(&policy, "d", &[("path", "/api/x")]);
        assert!(matches!(other.governed, Governed::Limited { pool, .. } if pool.tokens == 3));
    }
}
