//! The counts of what no rule matched: `ratelimit_service_rate_limit_no_rule{domain}`, the
//! descriptors of a known domain that no entry matched (one series per domain of the rules,
//! resolved when a policy is installed), and `ratelimit_service_rate_limit_domain_not_found
//! {domain}`, the descriptors of calls to a domain with no rules (the reference's stat). A domain
//! with no rules is whatever a client sends, so its series are bounded: the first
//! [`UNKNOWN_DOMAINS_CAP`] distinct domains get their own (the label bounded in length as a
//! detailed one is), every later one counts under [`OTHER_DOMAINS`]. Each domain that gets its
//! own series is also warned of once, when it is first seen: a filter's `domain` that matches no
//! rules file limits nothing, and would otherwise go unsaid. So is a descriptor that nearly
//! matches a rule ([`NearMisses`]): in another order, or with more entries than its branch.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError, RwLock};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use prometheus::IntCounterVec;

use super::label::{bounded_label, bounded_text};
use crate::policy::DomainRules;

/// Most unknown domains with a series of their own.
pub const UNKNOWN_DOMAINS_CAP: usize = 100;
/// The `domain` label of the unknown domains past the cap (a client sending this very domain is
/// counted here too).
pub const OTHER_DOMAINS: &str = "(other)";

/// `domain_not_found`'s series and the unknown domains that have one.
#[derive(Debug)]
pub(crate) struct UnknownDomains {
    counter: IntCounterVec,
    labelled: RwLock<HashSet<String>>,
    cap: usize,
}

impl UnknownDomains {
    pub(crate) fn new(counter: IntCounterVec, cap: usize) -> Self {
        UnknownDomains {
            counter,
            labelled: RwLock::new(HashSet::new()),
            cap,
        }
    }

    /// Counts `descriptors` descriptors of a call to `domain`, which has no rules.
    pub(crate) fn count(&self, domain: &str, descriptors: u64) {
        let label = self.label(domain);
        self.counter
            .with_label_values(&[&label])
            .inc_by(descriptors);
    }

    /// Notes `domain`, which has no rules, without counting it: warned of if it is new.
    pub(crate) fn seen(&self, domain: &str) {
        let _ = self.label(domain);
    }

    /// `domain`'s label: its own (sanitized as the reference's `domain_not_found` stat name is,
    /// and bounded) while it has one or there is room, else [`OTHER_DOMAINS`].
    fn label(&self, domain: &str) -> String {
        let label = bounded_label([(domain, None)]);
        if label == OTHER_DOMAINS {
            return label;
        }
        let known = |set: &HashSet<String>| set.contains(&label);
        if known(&self.labelled.read().unwrap_or_else(PoisonError::into_inner)) {
            return label;
        }
        let mut set = self
            .labelled
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if known(&set) || set.len() < self.cap {
            if set.insert(label.clone()) {
                tracing::warn!(
                    // As sent (bounded), to compare with the rules files' `domain:`.
                    domain = bounded_text([(domain, None)]).as_str(),
                    "a call for a domain that no rules file defines: its descriptors (or RLQS \
                     buckets) are allowed and nothing is limited for it. Does the `domain` of \
                     Envoy's filter (ratelimit or rate_limit_quota) equal a rules file's \
                     `domain:`? (GET /rlconfig lists the domains with rules.) Said once per \
                     domain; ShouldRateLimit's descriptors are counted in \
                     ratelimit_service_rate_limit_domain_not_found"
                );
            }
            label
        } else {
            OTHER_DOMAINS.to_owned()
        }
    }
}

/// Most (domain, key order) pairs looked into for [`NearMisses`] until the next reload.
const LOOKED_CAP: usize = 64;

/// Descriptors of a known domain that matched no rule though they nearly match one: their keys in
/// another order are a rule's, or they go on past a rule without nested descriptors. Each domain
/// and key order is looked into once (the first [`LOOKED_CAP`], again after a reload) and warned
/// of if it is so. Envoy sends the entries in its `rate_limits` actions' order: ordered otherwise
/// than the rules nest, or more of them than a branch has, they limit nothing.
#[derive(Debug, Default)]
pub(crate) struct NearMisses {
    looked: Mutex<HashSet<u64>>,
    hasher: foldhash::fast::RandomState,
}

impl NearMisses {
    /// `entries` of a call to `rules`' domain as the rules match them, if their key order is to
    /// be looked into: not yet looked into (and there is room).
    fn first_look<'e>(
        &self,
        rules: &DomainRules,
        entries: &'e [Entry],
    ) -> Option<Vec<(&'e str, &'e str)>> {
        let order = self.hasher.hash_one((
            &rules.name,
            entries.iter().map(|e| &e.key).collect::<Vec<_>>(),
        ));
        let mut looked = self.looked.lock().unwrap_or_else(PoisonError::into_inner);
        let first = looked.len() < LOOKED_CAP && looked.insert(order);
        first.then(|| {
            entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
    }

    /// Looks into `entries` (they matched no rule as they came) for another order that matches.
    pub(crate) fn another_order(&self, rules: &DomainRules, entries: &[Entry]) {
        let Some(pairs) = self.first_look(rules, entries) else {
            return;
        };
        let Some((order, rule)) = rules.reordered(&pairs) else {
            return;
        };
        // The keys are the rule's own (no client text but the rule's keys).
        let sent: Vec<&str> = pairs.iter().map(|(key, _)| *key).collect();
        let rules_order: Vec<&str> = order.iter().map(|&i| pairs[i].0).collect();
        tracing::warn!(
            domain = rules.name.as_str(),
            sent = sent.join(", "),
            rule = rule.path.as_str(),
            rule_order = rules_order.join(", "),
            "a descriptor's entries came in another order than the rules nest them: as sent they \
             match no rule, and in the rule's order they would match it. Envoy sends a \
             descriptor's entries in the order of the route's `rate_limits` actions: put the \
             actions in the rules' order, or nest the rules as the actions come. Until then these \
             requests are not limited by that rule. Said once per domain and order (again after a \
             reload); counted in ratelimit_service_rate_limit_no_rule"
        );
    }

    /// Looks into `entries` (they matched no rule) for a rule without nested descriptors that
    /// their first entries match.
    pub(crate) fn longer_than_a_rule(&self, rules: &DomainRules, entries: &[Entry]) {
        let Some(pairs) = self.first_look(rules, entries) else {
            return;
        };
        let Some((matched, rule)) = rules.longer_than_its_rule(&pairs) else {
            return;
        };
        // The first keys are the rule's own; the rest is the client's, shown bounded.
        let sent: Vec<String> = pairs
            .iter()
            .map(|(key, _)| bounded_text([(*key, None)]))
            .collect();
        tracing::warn!(
            domain = rules.name.as_str(),
            sent = sent.join(", "),
            rule = rule.path.as_str(),
            rule_entries = matched,
            "a descriptor goes on past the rule its first entries match: that rule has no nested \
             descriptors, so the whole descriptor matches nothing (as in envoyproxy/ratelimit) and \
             these requests are not limited by it. Nest the next entries under the rule, or send \
             the rule's entries alone (one `rate_limits` entry per descriptor). Said once per \
             domain and key order (again after a reload); counted in \
             ratelimit_service_rate_limit_no_rule"
        );
    }

    /// Forgets what was looked into (the rules changed).
    pub(crate) fn forget(&self) {
        self.looked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;
    use prometheus::core::Collector;

    #[test]
    fn past_the_cap_unknown_domains_fold_into_one_series() {
        let counter = IntCounterVec::new(Opts::new("c", "h"), &["domain"]).unwrap();
        let unknown = UnknownDomains::new(counter.clone(), 2);
        for domain in ["a", "b", "c", "a", "d", "b"] {
            unknown.count(domain, 2);
        }
        let value = |d: &str| counter.with_label_values(&[d]).get();
        assert_eq!((value("a"), value("b")), (4, 4));
        assert_eq!(value(OTHER_DOMAINS), 4, "c and d");
        assert_eq!(value("c"), 0);
        // A long domain gets a bounded label of its own.
        let unknown = UnknownDomains::new(counter.clone(), 10);
        let long = "x".repeat(10_000);
        unknown.count(&long, 1);
        let labels = counter.collect()[0]
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].value().len())
            .max()
            .unwrap();
        assert!(labels < 300, "{labels}");
    }
}
