//! Matching tests on hand-built trees (the parser has its own tests).

use super::*;
use crate::config::{Algorithm, PolicyName, Unit};

fn limit(rpu: u32) -> RateLimitSpec {
    RateLimitSpec::Limited(vec![Limit {
        name: None,
        requests_per_unit: rpu,
        unit: Unit::Minute,
        unit_multiplier: 1,
        algorithm: Some(Algorithm::FixedWindow),
        burst: None,
        max_delay: None,
        calendar: None,
        replaces: vec![],
        policy: PolicyName::Derived,
    }])
}

pub(super) fn d(
    key: &str,
    value: Option<&str>,
    rpu: Option<u32>,
    children: Vec<DescriptorConfig>,
) -> DescriptorConfig {
    DescriptorConfig {
        key: key.into(),
        value: value.map(Into::into),
        rate_limit: rpu.map(limit),
        concurrency: None,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        share_threshold: false,
        metadata: None,
        descriptors: children,
        location: Location::default(),
    }
}

pub(super) fn policy(descriptors: Vec<DescriptorConfig>) -> Policy {
    Policy::new(&[DomainConfig {
        domain: "test".into(),
        descriptors,
        source: "test.yaml".into(),
        warnings: vec![],
    }])
}

fn rpu_for(p: &Policy, entries: &[(&str, &str)]) -> Option<u32> {
    let rule = p.domain("test")?.rule_for(entries.iter().copied())?;
    match &rule.kind {
        RuleKind::Limited(l) => Some(l[0].limit.requests_per_unit),
        RuleKind::Unlimited { .. } => Some(u32::MAX),
        RuleKind::Concurrency(c) => Some(c.max_in_flight),
    }
}

#[test]
fn exact_beats_wildcard_beats_any_value() {
    let p = policy(vec![
        d("path", None, Some(1), vec![]),
        d("path", Some("/v1/*"), Some(2), vec![]),
        d("path", Some("/v1/*/x"), Some(3), vec![]),
        d("path", Some("/v1/search"), Some(4), vec![]),
    ]);
    assert_eq!(rpu_for(&p, &[("path", "/v1/search")]), Some(4));
    assert_eq!(
        rpu_for(&p, &[("path", "/v1/a/x")]),
        Some(2),
        "first wildcard in file order"
    );
    assert_eq!(rpu_for(&p, &[("path", "/v2")]), Some(1));
    assert_eq!(
        rpu_for(&p, &[("path", "")]),
        Some(1),
        "value-less key matches the empty value"
    );
    assert_eq!(rpu_for(&p, &[("other", "x")]), None);
}

#[test]
fn depth_must_match_and_parents_do_not_apply_to_longer_descriptors() {
    let p = policy(vec![d(
        "api_key",
        None,
        Some(10),
        vec![d("path", Some("/a"), Some(5), vec![])],
    )]);
    assert_eq!(rpu_for(&p, &[("api_key", "k")]), Some(10));
    assert_eq!(rpu_for(&p, &[("api_key", "k"), ("path", "/a")]), Some(5));
    assert_eq!(rpu_for(&p, &[("api_key", "k"), ("path", "/b")]), None);
    assert_eq!(
        rpu_for(&p, &[("api_key", "k"), ("path", "/a"), ("x", "y")]),
        None,
        "longer than the tree"
    );
}

#[test]
fn no_backtracking_to_a_less_specific_sibling() {
    let p = policy(vec![
        d("k", Some("v"), None, vec![d("a", None, Some(1), vec![])]),
        d("k", None, None, vec![d("b", None, Some(2), vec![])]),
    ]);
    assert_eq!(rpu_for(&p, &[("k", "v"), ("a", "x")]), Some(1));
    assert_eq!(
        rpu_for(&p, &[("k", "v"), ("b", "x")]),
        None,
        "exact branch chosen, no retry"
    );
    assert_eq!(rpu_for(&p, &[("k", "w"), ("b", "x")]), Some(2));
}

#[test]
fn whitelist_entry_has_no_limit_and_unknown_domain_has_no_rules() {
    let p = policy(vec![
        d("api_key", Some("trusted"), None, vec![]),
        d("api_key", None, Some(3), vec![]),
    ]);
    let domain = p.domain("test").unwrap();
    assert_eq!(
        domain.walk([("api_key", "trusted")], |_| {}),
        Outcome::NoLimitOnNode
    );
    assert_eq!(rpu_for(&p, &[("api_key", "other")]), Some(3));
    assert!(p.domain("nope").is_none());
}

#[test]
fn rule_paths_name_values_and_patterns_as_the_reference_does() {
    let p = policy(vec![d(
        "api_key",
        None,
        Some(1),
        vec![d("path", Some("/v1/*"), Some(2), vec![])],
    )]);
    let paths: Vec<_> = p
        .domain("test")
        .unwrap()
        .rules()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(paths, ["api_key", "api_key.path_/v1/*"]);
}

#[test]
fn walk_traces_each_step() {
    let p = policy(vec![d(
        "a",
        None,
        None,
        vec![d("b", Some("1"), Some(1), vec![])],
    )]);
    let mut steps = Vec::new();
    let outcome = p
        .domain("test")
        .unwrap()
        .walk([("a", "x"), ("b", "2")], |s| steps.push(s));
    assert_eq!(outcome, Outcome::Unmatched);
    assert!(matches!(steps[0], Step::Matched { index: 0, .. }));
    assert_eq!(steps[1], Step::NoCandidate { index: 1 });
}

#[test]
fn descriptor_text_parses_pairs_and_rejects_missing_equals() {
    assert_eq!(
        parse_descriptor("a=1,b=,c=x=y").unwrap(),
        [
            ("a".into(), "1".into()),
            ("b".into(), String::new()),
            ("c".into(), "x=y".into())
        ]
    );
    assert!(
        parse_descriptor("a=1,b")
            .unwrap_err()
            .contains("'b' is not key=value")
    );
}

#[test]
fn named_values_are_the_exact_ones_at_every_depth() {
    let p = policy(vec![
        d("path", None, Some(1), vec![]),
        d("path", Some("/v1/*"), Some(2), vec![]),
        d(
            "client",
            Some("acme"),
            None,
            vec![
                d("user", Some("bob"), Some(3), vec![]),
                d("user", None, Some(4), vec![]),
            ],
        ),
    ]);
    let mut named = p.domain("test").unwrap().named_values();
    named.sort();
    assert_eq!(named, [("client", "acme"), ("user", "bob")]);
}

#[test]
fn a_limit_is_advertised_by_its_policy_its_name_or_its_rule_path() {
    let base = match limit(5) {
        RateLimitSpec::Limited(mut l) => l.remove(0),
        RateLimitSpec::Unlimited { .. } => unreachable!(),
    };
    let named = Limit {
        policy: PolicyName::Named("burst".into()),
        name: Some("ignored".into()),
        ..base.clone()
    };
    assert_eq!(policy_name(&named, "k_v", 0, 1).as_deref(), Some("burst"));
    let by_name = Limit {
        name: Some("per user".into()),
        ..base.clone()
    };
    assert_eq!(
        policy_name(&by_name, "k_v", 0, 2).as_deref(),
        Some("per user")
    );
    assert_eq!(
        policy_name(&base, "api_key.path", 0, 1).as_deref(),
        Some("api_key.path")
    );
    assert_eq!(
        policy_name(&base, "api_key", 1, 2).as_deref(),
        Some("api_key#2")
    );
    // Rules may hold any UTF-8: what an sf-string cannot carry is percent-encoded.
    assert_eq!(
        policy_name(&base, "user_café 100%", 0, 1).as_deref(),
        Some("user_caf%C3%A9 100%25")
    );
    let hidden = Limit {
        policy: PolicyName::Unadvertised,
        ..base
    };
    assert_eq!(policy_name(&hidden, "k", 0, 1), None);
}
