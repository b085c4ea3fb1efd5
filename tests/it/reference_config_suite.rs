//! envoyproxy/ratelimit's own rules-file suite, `test/config/config_test.go` (31 test functions
//! and the fixtures under `test/config/`), held against this server: one test here per function
//! there, named after it (`TestValueToMetric_MidLevelOnly` → `value_to_metric_mid_level_only`),
//! on fixtures of our own, written inline, of the shape of the reference's.
//!
//! - Loading: `ratelimit-server check DIR` accepts what the reference loads and refuses what it
//!   panics on. Our messages differ from its; each test asks only that ours names the cause.
//! - Matching, over gRPC: the limit a descriptor gets (requests_per_unit, unit, name), none for a
//!   whitelisted or unmatched one, 2^32-1 remaining for an unlimited one; shadow_mode,
//!   share_threshold (one counter for every matching value) and metadata as its service applies
//!   them.
//! - Names: the reference counts a rule's hits under a stats key, `<domain>.<key>_<value>.<key2>`
//!   (`.total_hits`, `.within_limit`, `.near_limit`, `.over_limit`, `.shadow_mode`). Here that
//!   key, less the domain, is the `rule` label of `ratelimit_service_rate_limit_*{domain, rule,
//!   key1, key2}`, and `key1`, `key2` are its first two dot-separated parts, as the reference's
//!   default Prometheus mapping labels them (statsd names are made from the same label). Each
//!   stats test also checks that no other series counted the hit.
//!
//! Where the reference's test reads a counter it incremented itself (`rl.Stats.TotalHits.Inc()`),
//! this reads the counter a real request moved: the reference's service drops an unlimited
//! descriptor before counting, so it has no stats, here as there.
//!
//! What differs from the reference is a test marked `#[ignore]` saying what differs:
//! `config_limit_override_counts_under_the_descriptor_s_stats_key` and
//! `stats_keys_are_sanitized_as_the_reference_sanitizes_them`.

use std::process::Command;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use ratelimit_server::policy::parse_descriptor;

use crate::common::metrics::{labelled, scrape, sum};
use crate::common::{Code, TestServer, code, request, start, start_with};

// ---- loading -------------------------------------------------------------------------------

/// `ratelimit-server check` on a directory holding `files` (name, YAML): its exit code and what
/// it printed. `merge` is the reference's `MERGE_DOMAIN_CONFIG`, given either way so that the
/// environment cannot set it.
fn check(files: &[(&str, &str)], merge: bool) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("check")
        .arg(dir.path())
        .arg(format!("--merge-domain-config={merge}"))
        .output()
        .expect("run ratelimit-server check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .replace(&format!("{}/", dir.path().display()), "");
    (out.status.code().unwrap_or(-1), text)
}

/// The reference panics on these files: `check` must refuse them with an error on `file` that
/// says `cause`.
fn refused(files: &[(&str, &str)], merge: bool, file: &str, cause: &str) {
    let (code, text) = check(files, merge);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{file}:")) && l.contains(cause)),
        "no error on {file} saying {cause:?} in:\n{text}"
    );
}

/// The reference panics on this one file: `check` must refuse it, saying `cause`.
fn refused_alone(text: &str, cause: &str) {
    refused(&[("rules.yaml", text)], false, "rules.yaml", cause);
}

/// The reference loads these files: so must `check`.
fn accepted(files: &[(&str, &str)], merge: bool) {
    let (code, text) = check(files, merge);
    assert_eq!(code, 0, "{text}");
}

// ---- matching and names --------------------------------------------------------------------

/// A one-descriptor request to `domain`, its descriptor written as the CLI and `/explain` write
/// one: `k=v,k2=v2` (`k=` for an empty value; "" for no entries).
fn one(domain: &str, descriptor: &str) -> RateLimitRequest {
    let entries = match descriptor {
        "" => Vec::new(),
        text => parse_descriptor(text).expect("k=v,k2=v2"),
    };
    let entries: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    request(domain, &[&entries])
}

/// The status of one hit of `descriptor`.
async fn status(s: &mut TestServer, domain: &str, descriptor: &str) -> DescriptorStatus {
    s.call(one(domain, descriptor)).await.statuses.remove(0)
}

/// The limit one allowed hit of `descriptor` gets: (requests_per_unit, unit, name), None when no
/// limit applies.
async fn limit(s: &mut TestServer, domain: &str, descriptor: &str) -> Option<(u32, Unit, String)> {
    let st = status(s, domain, descriptor).await;
    assert_eq!(code(st.code), Code::Ok, "{domain} {descriptor}: {st:?}");
    st.current_limit
        .map(|l| (l.requests_per_unit, Unit::try_from(l.unit).unwrap(), l.name))
}

/// The limit, without its name.
async fn rate(s: &mut TestServer, domain: &str, descriptor: &str) -> Option<(u32, Unit)> {
    limit(s, domain, descriptor)
        .await
        .map(|(n, unit, _)| (n, unit))
}

/// The labels of the series the reference names `<domain>.<key>`: `rule` (ours) is the key, and
/// `key1`, `key2` its first two dot-separated parts, as the reference's default Prometheus
/// mapping (`src/stats/prom/default_mapper.yaml`) labels them.
fn labels(domain: &str, key: &str) -> String {
    let mut out = format!(r#"domain="{domain}",rule="{key}""#);
    for (label, part) in ["key1", "key2"].iter().zip(key.split('.')) {
        out.push_str(&format!(r#",{label}="{part}""#));
    }
    out
}

/// The value of `<domain>.<key>.<stat>` on a `/metrics` page.
fn stat(page: &str, domain: &str, key: &str, stat: &str) -> u64 {
    labelled(
        page,
        &format!("ratelimit_service_rate_limit_{stat}"),
        &labels(domain, key),
    )
}

async fn metrics(s: &TestServer) -> String {
    scrape(&s.http("/metrics")).await
}

/// (stats key, hits counted under it).
type Counted<'a> = &'a [(&'a str, u64)];

/// Every hit counted, each under the stats key the reference gives it, and no other series
/// counted any.
fn assert_counted(page: &str, domain: &str, counted: Counted<'_>) {
    let hits_series = || {
        page.lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (key, hits) in counted {
        assert_eq!(
            stat(page, domain, key, "total_hits"),
            *hits,
            "{domain}.{key}.total_hits in:\n{}",
            hits_series()
        );
    }
    let all: u64 = counted.iter().map(|(_, n)| n).sum();
    assert_eq!(
        sum(page, "ratelimit_service_rate_limit_total_hits") as u64,
        all,
        "hits counted elsewhere than {counted:?}:\n{}",
        hits_series()
    );
}

/// Starts a server on `rules` (which `check` must accept too), sends one hit of each of
/// `descriptors` to `domain`, each of which must get a limit, and returns the `/metrics` page.
async fn hit_each(rules: &str, domain: &str, descriptors: &[&str]) -> String {
    accepted(&[("rules.yaml", rules)], false);
    let mut s = start(&[("rules.yaml", rules)]).await;
    for descriptor in descriptors {
        assert!(
            rate(&mut s, domain, descriptor).await.is_some(),
            "{descriptor} got no limit"
        );
    }
    metrics(&s).await
}

// ---- TestBasicConfig, TestDomainMerge, TestConfigLimitOverride ------------------------------

const BASIC: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}
      - {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}
  - {key: key2, value: value3}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: key4, rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - {key: subkey5, value: subvalue5, rate_limit: {unit: day, requests_per_unit: 25}}
  - {key: key6, rate_limit: {unlimited: true}}
  - {key: key7, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 70}}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config() {
    accepted(&[("basic.yaml", BASIC)], false);
    let mut s = start(&[("basic.yaml", BASIC)]).await;
    let d = "test-domain";

    // An unknown domain: no limit, counted once per descriptor; a known one is never counted.
    assert_eq!(rate(&mut s, "foo_domain", "").await, None);
    assert_eq!(rate(&mut s, d, "").await, None);
    // No match (an unknown value, a descriptor longer than its branch, a second level that
    // matches nothing), or a match without rate_limit (key1_value1 itself, the whitelisted
    // key2_value3): no limit.
    for none in [
        "key1=something",
        "key1=value1",
        "key2=value2,subkey=subvalue",
        "key5=value5,subkey5=subvalue",
        "key2=value3",
    ] {
        assert_eq!(rate(&mut s, d, none).await, None, "{none}");
    }
    for (descriptor, want) in [
        ("key1=value1,subkey1=something", (5, Unit::Second)),
        ("key1=value1,subkey1=subvalue1", (10, Unit::Second)),
        ("key2=something", (20, Unit::Minute)),
        ("key2=value2", (30, Unit::Minute)),
        // detailed_metric: one stats key per value.
        ("key7=unspecified_value", (70, Unit::Minute)),
        ("key7=another_value", (70, Unit::Minute)),
    ] {
        assert_eq!(
            rate(&mut s, d, descriptor).await,
            Some(want),
            "{descriptor}"
        );
    }
    // No name in the rules: none in the answer; a name: that name.
    let key3 = limit(&mut s, d, "key3=foo").await;
    assert_eq!(key3, Some((1, Unit::Hour, String::new())));
    let key4 = limit(&mut s, d, "key4=foo").await;
    assert_eq!(key4, Some((1, Unit::Day, "key4_rate_limit".into())));
    // Unlimited: matched, no limit, everything remaining.
    let key6 = status(&mut s, d, "key6=foo").await;
    assert_eq!(
        (code(key6.code), key6.current_limit, key6.limit_remaining),
        (Code::Ok, None, u32::MAX)
    );

    let page = metrics(&s).await;
    assert_counted(
        &page,
        d,
        &[
            ("key1_value1.subkey1", 1),
            ("key1_value1.subkey1_subvalue1", 1),
            ("key2", 1),
            ("key2_value2", 1),
            ("key3", 1),
            ("key4", 1),
            ("key7_unspecified_value", 1),
            ("key7_another_value", 1),
        ],
    );
    for key in ["key1_value1.subkey1", "key2", "key7_another_value"] {
        assert_eq!(stat(&page, d, key, "within_limit"), 1, "{key}");
    }
    // 1 of 1/hour is past the near-limit threshold (floor(1 × 0.8) = 0), there as here.
    assert_eq!(stat(&page, d, "key3", "near_limit"), 1);
    // `<domain>.domain_not_found` there: only the unknown domain's, once.
    let not_found = "ratelimit_service_rate_limit_domain_not_found";
    assert_eq!(labelled(&page, not_found, r#"domain="foo_domain""#), 1);
    assert_eq!(sum(&page, not_found), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_merge() {
    let files = [
        (
            "merge_key1.yaml",
            "domain: test-domain\ndescriptors:\n  \
             - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
        ),
        (
            "merge_key2.yaml",
            "domain: test-domain\ndescriptors:\n  \
             - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
        ),
    ];
    accepted(&files, true);
    let duplicate = "duplicate domain 'test-domain'";
    refused(&files, false, "merge_key2.yaml", duplicate);
    let mut s = start_with(&files, |settings| {
        settings.rules_files.merge_domain_config = true;
    })
    .await;
    let d = "test-domain";
    assert_eq!(rate(&mut s, "foo_domain", "").await, None);
    assert_eq!(rate(&mut s, d, "").await, None);
    assert_eq!(
        rate(&mut s, d, "key1=value1").await,
        Some((10, Unit::Minute))
    );
    assert_eq!(
        rate(&mut s, d, "key2=value2").await,
        Some((20, Unit::Minute))
    );
}

/// One hit of `descriptor` carrying the limit override `requests_per_unit` per `unit`.
async fn overridden(
    s: &mut TestServer,
    domain: &str,
    descriptor: &str,
    (requests_per_unit, unit): (u32, RateLimitUnit),
) -> DescriptorStatus {
    let mut r = one(domain, descriptor);
    r.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    s.call(r).await.statuses.remove(0)
}

/// The overridden hits of the reference's test, on its basic rules; returns the server.
async fn three_overrides() -> TestServer {
    let mut s = start(&[("basic.yaml", BASIC)]).await;
    let something = "key1=value1,subkey1=something";
    // An unknown domain: no limit, override or not.
    let unknown = overridden(&mut s, "foo_domain", something, (10, RateLimitUnit::Day)).await;
    assert_eq!(unknown.current_limit, None);
    // The request's limit, not the rules' (5/second), without a name.
    for (descriptor, (n, unit), want) in [
        (something, (10, RateLimitUnit::Day), Unit::Day),
        (something, (42, RateLimitUnit::Hour), Unit::Hour),
        (
            "key1=value1,subkey1=something_else",
            (42, RateLimitUnit::Hour),
            Unit::Hour,
        ),
    ] {
        let st = overridden(&mut s, "test-domain", descriptor, (n, unit)).await;
        let got = st.current_limit.expect("the override's limit");
        assert_eq!(
            (
                code(st.code),
                got.requests_per_unit,
                Unit::try_from(got.unit),
                got.name
            ),
            (Code::Ok, n, Ok(want), String::new()),
            "{descriptor}"
        );
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_limit_override() {
    let s = three_overrides().await;
    // Counted under our one series per domain (docs/operations.md); the reference's names are
    // the ignored test below.
    assert_counted(&metrics(&s).await, "test-domain", &[("override", 3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "stated difference (docs/compatibility.md): an overridden descriptor counts under rule=\"override\", \
            the reference under its entries' key (test-domain.key1_value1.subkey1_something)"]
async fn config_limit_override_counts_under_the_descriptor_s_stats_key() {
    let s = three_overrides().await;
    // A changed override keeps counting on the same key; another value counts on its own.
    assert_counted(
        &metrics(&s).await,
        "test-domain",
        &[
            ("key1_value1.subkey1_something", 2),
            ("key1_value1.subkey1_something_else", 1),
        ],
    );
}

// ---- the files the reference refuses -------------------------------------------------------

#[test]
fn empty_domain() {
    refused_alone("descriptors:\n", "missing required field 'domain'");
    refused_alone("domain: \"\"\ndescriptors:\n", "'domain' must not be empty");
}

#[test]
fn duplicate_domain() {
    let files = [
        ("basic.yaml", BASIC),
        ("duplicate.yaml", "domain: test-domain\ndescriptors:\n"),
    ];
    let cause = "duplicate domain 'test-domain'";
    refused(&files, false, "duplicate.yaml", cause);
    // Alone, or merged (no descriptor to collide): loaded.
    accepted(&files[1..], false);
    accepted(&files, true);
}

#[test]
fn empty_key() {
    let no_key = "domain: test-domain\ndescriptors:\n  - value: value1\n";
    refused_alone(no_key, "descriptor is missing required field 'key'");
    let empty = "domain: test-domain\ndescriptors:\n  - {key: \"\", value: value1}\n";
    refused_alone(empty, "'key' must not be empty");
}

#[test]
fn duplicate_key() {
    let twice = "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1}\n  \
                 - {key: key1, value: value1}\n";
    let cause = "duplicate descriptor with key 'key1' and value 'value1'";
    refused_alone(twice, cause);
}

#[test]
fn duplicate_key_domain_merge() {
    // The same file twice there; two files of the same text here.
    let text = "domain: test-domain\ndescriptors:\n  \
                - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}\n";
    let cause = "duplicate descriptor with key 'key1' and value 'value1' in domain 'test-domain'";
    refused(&[("a.yaml", text), ("b.yaml", text)], true, "b.yaml", cause);
}

/// One descriptor `key1: value1` with `fields` (indented by 4).
fn key1_value1(fields: &str) -> String {
    format!("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n{fields}")
}

#[test]
fn bad_limit_unit() {
    let text = key1_value1("    rate_limit: {unit: foo, requests_per_unit: 5}\n");
    refused_alone(&text, "invalid rate limit unit 'foo'");
}

/// A nested limit named `self` whose `replaces` is `- name:<name>`.
fn replacing(name: &str) -> String {
    key1_value1(&format!(
        "    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          \
         replaces:\n            - name:{name}\n          unit: second\n          \
         requests_per_unit: 5\n"
    ))
}

#[test]
fn replaces_self() {
    let cause = "replaces should not contain the name of its own limit 'self'";
    refused_alone(&replacing(" self"), cause);
}

#[test]
fn replaces_empty() {
    // `- name:` (null), the reference's file, and `- name: ""`: both an empty name there.
    refused_alone(&replacing(""), "'name' must be a string, found null");
    let cause = "a replaces entry must not have an empty name";
    refused_alone(&replacing(" \"\""), cause);
}

#[test]
fn bad_yaml() {
    refused_alone("'''\n", "YAML syntax error");
}

#[test]
fn misspelled_key() {
    let on_descriptor = key1_value1("    ratelimit: {unit: day, requests_per_unit: 5}\n");
    refused_alone(&on_descriptor, "unknown field 'ratelimit'");
    let under_rate_limit = key1_value1("    rate_limit: {unit: day, requestsperunit: 5}\n");
    refused_alone(&under_rate_limit, "unknown field 'requestsperunit'");
}

#[test]
fn non_string_key() {
    let text = "0.25: test-domain\ndescriptors:\n  \
                - {key: key1, value: value1, rate_limit: {unit: day, requests_per_unit: 5}}\n";
    refused_alone(text, "field names must be strings, found a float '0.25'");
}

#[test]
fn non_map_list() {
    let text = "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n";
    let cause = "each entry of 'descriptors' must be a mapping, found a string";
    refused_alone(text, cause);
}

#[test]
fn unlimited_with_rate_limit_unit() {
    let text = "domain: test-domain\ndescriptors:\n  \
                - {key: foo, rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}}\n";
    refused_alone(text, "should not specify rate limit unit when unlimited");
}

// ---- TestShadowModeConfig, TestWildcardConfig ----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_config() {
    let rules = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}
      - key: subkey1
        value: subvalue1
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - {key: key2, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}
";
    accepted(&[("shadow.yaml", rules)], false);
    let mut s = start(&[("shadow.yaml", rules)]).await;
    let d = "test-domain";
    // (descriptor, its stats key, limit, unit, shadow_mode): each hit until one past its limit.
    let cases = [
        (
            "key1=value1,subkey1=something",
            "key1_value1.subkey1",
            5,
            Unit::Second,
            false,
        ),
        (
            "key1=value1,subkey1=subvalue1",
            "key1_value1.subkey1_subvalue1",
            10,
            Unit::Second,
            true,
        ),
        ("key2=something", "key2", 20, Unit::Minute, true),
        ("key2=value2", "key2_value2", 30, Unit::Minute, false),
    ];
    for (descriptor, _, n, unit, shadow) in cases {
        for _ in 0..n {
            assert_eq!(rate(&mut s, d, descriptor).await, Some((n, unit)));
        }
        let over = status(&mut s, d, descriptor).await;
        let want = if shadow { Code::Ok } else { Code::OverLimit };
        assert_eq!(code(over.code), want, "{descriptor}");
    }
    let page = metrics(&s).await;
    let counted: Vec<(&str, u64)> = cases
        .iter()
        .map(|(_, key, n, ..)| (*key, u64::from(*n) + 1))
        .collect();
    assert_counted(&page, d, &counted);
    for (_, key, n, _, shadow) in cases {
        // Hits 1..=n within, the last 20 % of them near, hit n + 1 over (and let through by
        // shadow mode where it is on), as the reference counts single hits.
        let near = u64::from(n - n * 4 / 5);
        let got = ["within_limit", "near_limit", "over_limit", "shadow_mode"]
            .map(|name| stat(&page, d, key, name));
        assert_eq!(got, [u64::from(n), near, 1, u64::from(shadow)], "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_config() {
    let rules = "
domain: test-domain
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 20}}
";
    accepted(&[("wildcard.yaml", rules)], false);
    let mut s = start(&[("wildcard.yaml", rules)]).await;
    let d = "test-domain";
    // Matched: 20/minute (multiWild 10), a stats key shared by every value matched, but a
    // counter per value (no share_threshold).
    for descriptor in [
        "noVal=foo1",
        "noVal=foo2",
        "wild=foo1",
        "wild=foo2",
        "nestedWild=val1,wild=goo2",
        // `*` in the middle matches zero characters too.
        "midWild=barab",
        "midWild=bar123b",
        "midWild=barb",
        "multiWild=foo123bar456baz",
        "multiWild=foobarbaz",
    ] {
        let n = if descriptor.starts_with("multiWild") {
            10
        } else {
            20
        };
        let st = status(&mut s, d, descriptor).await;
        let got = st.current_limit.map(|l| (l.requests_per_unit, l.unit));
        assert_eq!(got, Some((n, Unit::Minute as i32)), "{descriptor}");
        assert_eq!(st.limit_remaining, n - 1, "{descriptor}");
    }
    // Not matched: another prefix, an exact value (no eager match), a missing prefix, suffix or
    // middle part.
    for descriptor in [
        "wild=bar",
        "noWild=foo1",
        "midWild=bara",
        "midWild=xbarb",
        "multiWild=foo123baz",
        "multiWild=bar456baz",
    ] {
        assert_eq!(rate(&mut s, d, descriptor).await, None, "{descriptor}");
    }
    assert_counted(
        &metrics(&s).await,
        d,
        &[
            ("noVal", 2),
            ("wild_foo*", 2),
            ("nestedWild_val1.wild_goo*", 1),
            ("midWild_bar*b", 3),
            ("multiWild_foo*bar*baz", 2),
        ],
    );
}

// ---- TestDetailedMetric --------------------------------------------------------------------

/// `key-1` (100/minute) over `key-2` (5/minute), with or without detailed_metric on each.
fn nested(detailed_1: bool, detailed_2: bool) -> String {
    format!(
        "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {detailed_1}\n    \
         rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      \
         - {{key: key-2, detailed_metric: {detailed_2}, \
         rate_limit: {{unit: minute, requests_per_unit: 5}}}}\n"
    )
}

const REALISTIC: &str = "
domain: nested
descriptors:
  - {key: key_1, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 500}}
  - {key: key_1, value: some-value-for-key-1, rate_limit: {unit: minute, requests_per_unit: 500}}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric() {
    let (one, two) = ("key-1=value-1", "key-1=value-1,key-2=value-2");
    let (key_2, key_2_3) = (
        "key_2=key-2-value",
        "key_2=key-2-value,key_3=requested-key3-value",
    );
    // (rules, descriptor, the reference's stats key less `nested.`), its cases in order.
    for (rules, descriptor, key) in [
        (nested(true, false), one, "key-1_value-1"),
        (nested(false, false), one, "key-1"),
        (nested(true, true), two, "key-1_value-1.key-2_value-2"),
        (nested(false, false), two, "key-1.key-2"),
        (
            REALISTIC.into(),
            "key_1=value-for-key-1",
            "key_1_value-for-key-1",
        ),
        (REALISTIC.into(), key_2, "key_2_key-2-value"),
        (
            REALISTIC.into(),
            key_2_3,
            "key_2_key-2-value.key_3_requested-key3-value",
        ),
    ] {
        let page = hit_each(&rules, "nested", &[descriptor]).await;
        assert_counted(&page, "nested", &[(key, 1)]);
    }
}

// ---- TestValueToMetric_* -------------------------------------------------------------------

/// `route` → `http_method` → `subject_id` (60/minute) in `domain`, with value_to_metric on the
/// first two levels when `flags`, detailed_metric on the last when `detailed`.
fn route_method_subject(domain: &str, flags: bool, detailed: bool) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: route\n    value_to_metric: {flags}\n    \
         descriptors:\n      - key: http_method\n        value_to_metric: {flags}\n        \
         descriptors:\n          - key: subject_id\n            detailed_metric: {detailed}\n            \
         rate_limit: {{unit: minute, requests_per_unit: 60}}\n"
    )
}

const DRAW_GET_123: &str = "route=draw,http_method=GET,subject_id=123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_uses_runtime_values_in_stats() {
    let rules = route_method_subject("domain", true, false);
    let page = hit_each(&rules, "domain", &[DRAW_GET_123]).await;
    let key = "route_draw.http_method_GET.subject_id";
    assert_counted(&page, "domain", &[(key, 1)]);
    assert_eq!(stat(&page, "domain", key, "within_limit"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_default_key_includes_value_at_that_level() {
    let rules = "domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    \
                 descriptors:\n      - {key: k2, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let page = hit_each(rules, "d", &["k1=A,k2=foo"]).await;
    assert_counted(&page, "d", &[("k1_A.k2", 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_mid_level_only() {
    let rules = "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        \
                 value_to_metric: true\n        descriptors:\n          \
                 - {key: k3, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let page = hit_each(rules, "d", &["k1=X,k2=Y,k3=Z"]).await;
    assert_counted(&page, "d", &[("k1.k2_Y.k3", 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_no_flag_unchanged() {
    let rules = "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      \
                 - {key: k2, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let page = hit_each(rules, "d", &["k1=X,k2=Y"]).await;
    assert_counted(&page, "d", &[("k1.k2", 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_does_not_override_detailed_metric() {
    let rules = route_method_subject("domain", true, true);
    let page = hit_each(&rules, "domain", &[DRAW_GET_123]).await;
    let key = "route_draw.http_method_GET.subject_id_123";
    assert_counted(&page, "domain", &[(key, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_with_configured_values() {
    let rules = "
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 30}}
";
    accepted(&[("rules.yaml", rules)], false);
    let mut s = start(&[("rules.yaml", rules)]).await;
    let d = "test-domain";
    let get = "route=api,http_method=GET,subject_id=user123";
    assert_eq!(rate(&mut s, d, get).await, Some((60, Unit::Minute)));
    let post = "route=api,http_method=POST,subject_id=user456";
    assert_eq!(rate(&mut s, d, post).await, Some((30, Unit::Minute)));
    assert_counted(
        &metrics(&s).await,
        d,
        &[
            ("route_api.http_method_GET.subject_id", 1),
            ("route_api.http_method_POST.subject_id", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_with_wildcard() {
    let rules = "
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - {key: resource, rate_limit: {unit: minute, requests_per_unit: 100}}
";
    accepted(&[("rules.yaml", rules)], false);
    let mut s = start(&[("rules.yaml", rules)]).await;
    for descriptor in [
        "user=alice,action=readfile,resource=documents",
        "user=bob,action=readdata,resource=database",
    ] {
        let got = rate(&mut s, "domain", descriptor).await;
        assert_eq!(got, Some((100, Unit::Minute)), "{descriptor}");
    }
    // The wildcard's runtime value, not its pattern.
    assert_counted(
        &metrics(&s).await,
        "domain",
        &[
            ("user_alice.action_readfile.resource", 1),
            ("user_bob.action_readdata.resource", 1),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_with_empty_value() {
    let rules = route_method_subject("domain", true, false);
    let page = hit_each(
        &rules,
        "domain",
        &[
            "route=,http_method=GET,subject_id=123",
            "route=draw,http_method=,subject_id=123",
            "route=,http_method=,subject_id=123",
        ],
    )
    .await;
    // An empty value adds neither `_` nor a value.
    let key = "route.http_method.subject_id";
    assert_counted(
        &page,
        "domain",
        &[
            ("route.http_method_GET.subject_id", 1),
            ("route_draw.http_method.subject_id", 1),
            (key, 1),
        ],
    );
    assert_eq!(stat(&page, "domain", key, "within_limit"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_full_key_matches_stats_key() {
    // The reference's FullKey (what its debug logs name) is its stats key; here the one name is
    // the rule label, so this checks the three stats keys.
    let api = "route=api,http_method=GET,subject_id=user123";
    for (domain, flags, detailed, key) in [
        (
            "test-domain",
            true,
            false,
            "route_api.http_method_GET.subject_id",
        ),
        (
            "test-domain-2",
            false,
            false,
            "route.http_method.subject_id",
        ),
        (
            "test-domain-3",
            false,
            true,
            "route_api.http_method_GET.subject_id_user123",
        ),
    ] {
        let rules = route_method_subject(domain, flags, detailed);
        let page = hit_each(&rules, domain, &[api]).await;
        assert_counted(&page, domain, &[(key, 1)]);
    }
}

// ---- TestShareThreshold --------------------------------------------------------------------

const SHARE: &str = "
domain: test-domain
descriptors:
  - {key: files, value: files/*, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 100}}
  - key: nested
    value: parent
    descriptors:
      - {key: files, value: nested/*, share_threshold: true,
         rate_limit: {unit: minute, requests_per_unit: 200}}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - {key: files, value: nested/*, share_threshold: true,
         rate_limit: {unit: minute, requests_per_unit: 300}}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - {key: method, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - {key: endpoint, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - {key: type, rate_limit: {unit: minute, requests_per_unit: 120}}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - {key: action, rate_limit: {unit: minute, requests_per_unit: 150}}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: test*, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: midpath, value: /api*v1, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: midroute, value: /api*v2, share_threshold: true, value_to_metric: true,
     rate_limit: {unit: minute, requests_per_unit: 80}}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - {key: resource, value: res*v2, share_threshold: true,
         rate_limit: {unit: minute, requests_per_unit: 60}}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold() {
    accepted(&[("share.yaml", SHARE)], false);
    let mut s = start(&[("share.yaml", SHARE)]).await;
    let d = "test-domain";
    // (descriptors that share one counter, their limit, their stats key), its cases in order.
    let shared: [(&[&str], u32, &str); 13] = [
        (
            &[
                "files=files/a.pdf",
                "files=files/b.csv",
                "files=files/c.txt",
            ],
            100,
            "files_files/*",
        ),
        // share_threshold names the pattern over value_to_metric and detailed_metric.
        (&["route=api/v1,method=GET"], 60, "route_api/*.method"),
        (
            &["service=svc/user,endpoint=get"],
            80,
            "service_svc/*.endpoint_get",
        ),
        // Nested patterns; a wildcard without share_threshold keeps its pattern too.
        (
            &["nested=parent,files=nested/file1.txt"],
            200,
            "nested_parent.files_nested/*",
        ),
        (
            &["files=top/file1.txt,files=nested/file1.txt"],
            300,
            "files_top/*.files_nested/*",
        ),
        (
            &["path=path/foo,file=file/doc1,type=pdf"],
            120,
            "path_path/*.file_file/*.type",
        ),
        (
            &["user=user/alice,resource=res/file1,action=read"],
            150,
            "user_user/*.resource_res/*.action",
        ),
        // An exact value is preferred to the wildcard, and has its own counter.
        (&["file=test1"], 50, "file_test1"),
        (
            &["file=test2", "file=test23", "file=test123"],
            100,
            "file_test*",
        ),
        // `*` in the middle, several of them, with value_to_metric, nested.
        (
            &[
                "midpath=/api/v1",
                "midpath=/api-beta-v1",
                "midpath=/apiXYZv1",
            ],
            100,
            "midpath_/api*v1",
        ),
        (
            &[
                "multiroute=svcAepBrpc",
                "multiroute=svcXXXepYYYrpc",
                "multiroute=svceprpc",
            ],
            50,
            "multiroute_svc*ep*rpc",
        ),
        (
            &["midroute=/api/v2", "midroute=/api-beta-v2"],
            80,
            "midroute_/api*v2",
        ),
        (
            &[
                "tenant=t1prod,resource=resAv2",
                "tenant=t99prod,resource=resBBBv2",
            ],
            60,
            "tenant_t*prod.resource_res*v2",
        ),
    ];
    for (descriptors, n, key) in shared {
        for (i, descriptor) in descriptors.iter().enumerate() {
            let st = status(&mut s, d, descriptor).await;
            let got = st.current_limit.map(|l| l.requests_per_unit);
            assert_eq!(got, Some(n), "{descriptor}");
            // Every value the pattern matches takes from one counter.
            assert_eq!(st.limit_remaining, n - 1 - i as u32, "{key}: {descriptor}");
        }
    }
    for descriptor in ["midpath=/api/v2", "multiroute=svcABCrpc"] {
        assert_eq!(rate(&mut s, d, descriptor).await, None, "{descriptor}");
    }
    let counted: Vec<(&str, u64)> = shared
        .iter()
        .map(|(descriptors, _, key)| (*key, descriptors.len() as u64))
        .collect();
    assert_counted(&metrics(&s).await, d, &counted);
}

// ---- TestWildcardStatsBehavior -------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_stats_behavior() {
    let wild = |value, flags: &str| {
        format!(
            "domain: test-domain\ndescriptors:\n  - {{key: wild, value: \"{value}\",{flags} \
             rate_limit: {{unit: minute, requests_per_unit: 20}}}}\n"
        )
    };
    let other = "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    \
                 descriptors:\n      - key: other\n        value_to_metric: true\n        \
                 descriptors:\n          \
                 - {key: limit, rate_limit: {unit: minute, requests_per_unit: 20}}\n";
    let (vtm, share) = (" value_to_metric: true,", " share_threshold: true,");
    let foo = &["wild=foo1", "wild=foo2"][..];
    let foo_bar = &["wild=foo123bar456", "wild=fooXbarY"][..];
    // (rules, descriptors, the stats keys they count under), its cases in order.
    let cases: [(String, &[&str], Counted<'_>); 7] = [
        (wild("foo*", ""), foo, &[("wild_foo*", 2)]),
        (
            wild("foo*", vtm),
            foo,
            &[("wild_foo1", 1), ("wild_foo2", 1)],
        ),
        (wild("foo*", share), foo, &[("wild_foo*", 2)]),
        (
            wild("foo*", &format!("{share}{vtm}")),
            foo,
            &[("wild_foo*", 2)],
        ),
        (
            other.into(),
            &["wild=foo1,other=bar,limit=X"],
            &[("wild_foo*.other_bar.limit", 1)],
        ),
        (wild("foo*bar*", ""), foo_bar, &[("wild_foo*bar*", 2)]),
        (
            wild("foo*bar*", vtm),
            foo_bar,
            &[("wild_foo123bar456", 1), ("wild_fooXbarY", 1)],
        ),
    ];
    for (rules, descriptors, counted) in cases {
        let page = hit_each(&rules, "test-domain", descriptors).await;
        assert_counted(&page, "test-domain", counted);
    }
}

// ---- TestMetadata --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata() {
    let rules = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata: {name: service_1}
      - {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota: {name: service_2}
";
    accepted(&[("metadata.yaml", rules)], false);
    let mut s = start_with(&[("metadata.yaml", rules)], |settings| {
        settings.response_dynamic_metadata = true;
    })
    .await;
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let object = |fields: &[(&str, Value)]| Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).into(), v.clone()))
                .collect(),
        })),
    };
    let service_1 = object(&[("name", text("service_1"))]);
    let service_2 = object(&[("service_with_quota", object(&[("name", text("service_2"))]))]);
    // The answer's dynamic metadata holds the matched rule's `metadata`, none for a rule
    // without.
    for (descriptor, n, want) in [
        ("key1=value1,subkey1=something", 5, Some(service_1)),
        ("key2=something", 20, Some(service_2)),
        ("key1=value1,subkey1=subvalue1", 10, None),
    ] {
        let answer = s.call(one("test-domain", descriptor)).await;
        let got = answer.statuses[0].current_limit.as_ref();
        assert_eq!(got.map(|l| l.requests_per_unit), Some(n), "{descriptor}");
        let metadata = answer.dynamic_metadata.expect("dynamic metadata");
        assert_eq!(
            metadata.fields.get("metadata"),
            want.as_ref(),
            "{descriptor}"
        );
    }
    assert_counted(
        &metrics(&s).await,
        "test-domain",
        &[
            ("key1_value1.subkey1", 1),
            ("key2", 1),
            ("key1_value1.subkey1_subvalue1", 1),
        ],
    );
}

// ---- beyond the reference's tests: how its stats manager writes every key ------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_keys_are_sanitized_as_the_reference_sanitizes_them() {
    let rules = "
domain: ip
descriptors:
  - {key: remote_address, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 60}}
  - {key: client, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 60}}
  - {key: fixed, value: 10.1.2.3, rate_limit: {unit: minute, requests_per_unit: 60}}
  - {key: hostport, value: 'a:b|c', rate_limit: {unit: minute, requests_per_unit: 60}}
";
    let page = hit_each(
        rules,
        "ip",
        &[
            "remote_address=10.0.0.1",
            "remote_address=2001:db8::1",
            "client=192.168.1.20",
            "fixed=10.1.2.3",
            "hostport=a:b|c",
        ],
    )
    .await;
    assert_counted(
        &page,
        "ip",
        &[
            ("remote_address_10_0_0_1", 1),
            ("remote_address_2001_db8__1", 1),
            ("client_192_168_1_20", 1),
            ("fixed_10_1_2_3", 1),
            ("hostport_a_b_c", 1),
        ],
    );
}
