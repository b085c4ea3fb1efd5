//! Per-rule series against policies built from YAML: created on first hit, carried over by
//! (domain, path), gone with their rule, and counters that never go down.

use super::*;
use crate::metrics::label::MAX_LABEL_LEN;
use crate::policy::Rule;

fn policy(yaml: &str) -> Policy {
    let configs =
        crate::config::parse_files(&[("t.yaml".into(), yaml.to_owned())]).expect("valid rules");
    Policy::new(&configs)
}

fn rule<'p>(policy: &'p Policy, path: &str) -> &'p Rule {
    policy
        .domain("d")
        .and_then(|d| d.rules().into_iter().find(|r| r.path == path))
        .expect("rule exists")
}

/// The per-rule sample lines of the exposition.
fn rule_lines(metrics: &Metrics) -> Vec<String> {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_"))
        .map(str::to_owned)
        .collect()
}

fn total(metrics: &Metrics, rule: &str) -> Option<u64> {
    // The rules of these tests are one level: key1 is the rule's key, no key2.
    let prefix = format!(
        "ratelimit_service_rate_limit_total_hits{{domain=\"d\",rule=\"{rule}\",key1=\"{rule}\"}} "
    );
    metrics.encode().lines().find_map(|l| {
        l.strip_prefix(&prefix)
            .map(|v| v.parse::<f64>().unwrap() as u64)
    })
}

const AB: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
const A: &str =
    "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

fn hit(table: &PolicyMetrics, policy: &Policy, path: &str, hits: u64) {
    table
        .rule("d", rule(policy, path))
        .expect("slot")
        .record(HitSplit::whole(HitOutcome::Within, hits), []);
}

#[test]
fn a_rule_has_no_series_until_hit_then_five() {
    let m = Metrics::new(10);
    let p = policy(AB);
    let table = m.install(&p);
    assert!(rule_lines(&m).is_empty(), "{:?}", rule_lines(&m));
    hit(&table, &p, "a", 2);
    let lines = rule_lines(&m);
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert!(lines.iter().all(|l| l.contains(r#"rule="a",key1="a""#)));
    assert_eq!(total(&m, "a"), Some(2));
}

#[test]
fn a_reload_keeps_the_counts_of_kept_rules_and_drops_the_series_of_removed_ones() {
    let m = Metrics::new(10);
    let old = policy(AB);
    let table = m.install(&old);
    hit(&table, &old, "a", 3);
    hit(&table, &old, "b", 1);
    // `a` changed its limit but kept its path: the same rule as far as its series go.
    let new = policy(A);
    let new_table = m.install(&new);
    assert_eq!(total(&m, "a"), Some(3));
    assert_eq!(total(&m, "b"), None, "b was removed");
    hit(&new_table, &new, "a", 1);
    assert_eq!(total(&m, "a"), Some(4));
    // A request still running on the old snapshot counts into the kept series and cannot
    // bring back the removed one.
    hit(&table, &old, "a", 1);
    hit(&table, &old, "b", 1);
    assert_eq!(total(&m, "a"), Some(5));
    assert_eq!(total(&m, "b"), None);
    assert_eq!(rule_lines(&m).len(), 5);
    // Back again: `b` starts from nothing (its old series were gone, so no counter goes down).
    let again = policy(AB);
    let t = m.install(&again);
    assert_eq!(total(&m, "b"), None, "not hit yet under the new policy");
    hit(&t, &again, "b", 1);
    assert_eq!(total(&m, "b"), Some(1));
    assert_eq!(total(&m, "a"), Some(5));
}

const DETAILED: &str = "domain: d\ndescriptors:\n  - key: t\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

#[test]
fn detailed_series_are_capped_and_released_with_their_rule() {
    let m = Metrics::new(2);
    let p = policy(DETAILED);
    let table = m.install(&p);
    let series = table.rule("d", rule(&p, "t")).unwrap();
    for value in ["x", "y", "z", "w"] {
        series.record(HitSplit::whole(HitOutcome::Within, 1), [("t", value)]);
    }
    assert_eq!(total(&m, "t_x"), Some(1));
    assert_eq!(total(&m, "t_y"), Some(1));
    assert_eq!(total(&m, "t_z"), None);
    assert_eq!(total(&m, "t_overflow"), Some(2));
    assert_eq!(
        total(&m, "t"),
        None,
        "a detailed rule counts per request label only"
    );
    // The rule goes: its series go, and so does their share of the cap.
    let empty = policy("domain: d\n");
    m.install(&empty);
    drop(table);
    assert!(rule_lines(&m).is_empty(), "{:?}", rule_lines(&m));
    let t = m.install(&p);
    let series = t.rule("d", rule(&p, "t")).unwrap();
    for value in ["z", "w"] {
        series.record(HitSplit::whole(HitOutcome::Within, 1), [("t", value)]);
    }
    assert_eq!(total(&m, "t_z"), Some(1), "the cap was given back");
    assert_eq!(total(&m, "t_w"), Some(1));
}

#[test]
fn detailed_labels_are_bounded_in_length() {
    let m = Metrics::new(1000);
    let p = policy(DETAILED);
    let table = m.install(&p);
    let series = table.rule("d", rule(&p, "t")).unwrap();
    for i in 0..50 {
        let value = format!("{i:04}{}", "v".repeat(4092));
        series.record(
            HitSplit::whole(HitOutcome::Within, 1),
            [("t", value.as_str())],
        );
    }
    let lines = rule_lines(&m);
    assert_eq!(lines.len(), 5 * 50, "distinct values stay distinct");
    let longest = lines.iter().map(String::len).max().unwrap();
    // The label twice: as `rule` and as the reference's `key1`.
    assert!(longest < 2 * MAX_LABEL_LEN + 100, "{longest} bytes");
}

#[test]
fn labels_are_stat_names_sanitized_and_keys_that_sanitize_alike_are_one_series() {
    let m = Metrics::new(10);
    let p = policy(
        "domain: d\ndescriptors:\n  - {key: k, value: 'a:b', rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: k, value: 'a|b', rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: ip, value: 10.1.2.3, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: t, detailed_metric: true, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    );
    let table = m.install(&p);
    hit(&table, &p, "k_a:b", 1);
    hit(&table, &p, "k_a|b", 2);
    hit(&table, &p, "ip_10.1.2.3", 1);
    let series = table.rule("d", rule(&p, "t")).unwrap();
    for value in ["10.0.0.1", "x:y", "x|y"] {
        series.record(HitSplit::whole(HitOutcome::Within, 1), [("t", value)]);
    }
    // As the reference's one stat `d.k_a_b`: one series, both rules' hits.
    assert_eq!(total(&m, "k_a_b"), Some(3), "{:?}", rule_lines(&m));
    assert_eq!(total(&m, "ip_10_1_2_3"), Some(1));
    assert_eq!(
        total(&m, "t_10_0_0_1"),
        Some(1),
        "one part: key1 is the whole"
    );
    assert_eq!(total(&m, "t_x_y"), Some(2));
    assert_eq!(rule_lines(&m).len(), 5 * 4, "{:?}", rule_lines(&m));
    // The domain too, as the reference's `domain_not_found` names it.
    m.domain_not_found("10.0.0.9:81", 1);
    assert!(
        m.encode()
            .contains(r#"ratelimit_service_rate_limit_domain_not_found{domain="10_0_0_9_81"} 1"#),
        "{}",
        m.encode()
    );
    let host = policy(
        "domain: h:1\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    );
    let t = m.install(&host);
    let a = host
        .domain("h:1")
        .unwrap()
        .rules()
        .into_iter()
        .next()
        .unwrap();
    t.rule("h:1", a)
        .unwrap()
        .record(HitSplit::whole(HitOutcome::Within, 1), []);
    assert!(
        m.encode()
            .contains(r#"total_hits{domain="h_1",rule="a",key1="a"} 1"#),
        "{}",
        m.encode()
    );
}

#[test]
fn overrides_count_per_domain_and_go_with_their_domain() {
    let m = Metrics::new(10);
    let p = policy(A);
    let table = m.install(&p);
    assert!(
        table.override_counts("other").is_none(),
        "only live domains"
    );
    table
        .override_counts("d")
        .unwrap()
        .record(HitSplit::whole(HitOutcome::Over, 1));
    assert!(
        m.encode()
            .contains(r#"over_limit{domain="d",rule="override",key1="override"} 1"#)
    );
    let t = m.install(&p);
    assert!(
        m.encode()
            .contains(r#"over_limit{domain="d",rule="override",key1="override"} 1"#),
        "kept"
    );
    drop(t);
    m.install(&policy("domain: e\n"));
    assert!(!m.encode().contains("override"), "domain d is gone");
}

#[test]
fn counters_saturate_instead_of_wrapping() {
    let counts = Counts::default();
    let mut last = [0; 5];
    for hits in [u64::MAX, 1 << 63, 1 << 63, 5] {
        for outcome in [HitOutcome::Near, HitOutcome::OverShadowed] {
            counts.record(HitSplit::whole(outcome, hits));
            let now = counts.values();
            assert!(
                now.iter().zip(last).all(|(n, l)| *n >= l),
                "{now:?} < {last:?}"
            );
            last = now;
        }
    }
    assert_eq!(last, [u64::MAX; 5]);
}

#[test]
fn build_info_names_the_cargo_version_and_the_commit_or_unknown() {
    let commit = build_info::COMMIT.unwrap_or(build_info::UNKNOWN_COMMIT);
    let want = format!(
        "ratelimit_build_info{{commit=\"{commit}\",version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let text = Metrics::new(10).encode();
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("ratelimit_build_info"))
            .collect::<Vec<_>>(),
        [want.as_str()],
        "{text}"
    );
    assert!(build_info::long_version().starts_with(env!("CARGO_PKG_VERSION")));
}
