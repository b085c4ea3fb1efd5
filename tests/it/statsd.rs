//! `USE_STATSD=true`: the reference's statsd stats over TCP to a listener in the test, under names
//! the statsd-exporter mapping that Envoy Gateway (and the reference's docs) ship matches
//! (`ratelimit.service.rate_limit.*.*.total_hits` → `ratelimit_service_rate_limit_total_hits`
//! {domain, key1}; three levels → {domain, key1, key2}), counting exactly the hits sent.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::common::process::Served;
use crate::common::{self, Code};

const RULES: &str = "
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    value: free
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 10}
";

/// The statsd-exporter mapping's match patterns (`*`: one dot-separated part).
const MAPPINGS: &[&str] = &[
    "ratelimit.service.rate_limit.*.*.total_hits",
    "ratelimit.service.rate_limit.*.*.over_limit",
    "ratelimit.service.rate_limit.*.*.near_limit",
    "ratelimit.service.rate_limit.*.*.within_limit",
    "ratelimit.service.rate_limit.*.*.*.total_hits",
    "ratelimit.service.rate_limit.*.*.*.over_limit",
    "ratelimit.service.rate_limit.*.*.*.near_limit",
    "ratelimit.service.rate_limit.*.*.*.within_limit",
    "ratelimit.service.config_load_success",
    "ratelimit.service.config_load_error",
];

/// A server on `files` sending statsd every 20 ms over TCP to the listener returned with it.
async fn sending_statsd(files: &[(&str, &str)]) -> (TcpListener, common::TestServer) {
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    let t = common::start_with(files, |s| {
        s.statsd.use_statsd = true;
        s.statsd.statsd_host = "127.0.0.1".into();
        s.statsd.statsd_port = port;
        s.statsd.stats_flush_interval = Duration::from_millis(20);
    })
    .await;
    (sink, t)
}

fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), name.split('.').collect());
    p.len() == n.len() && p.iter().zip(&n).all(|(p, n)| *p == "*" || p == n)
}

/// Adds up `name:value|c` lines per name.
fn totals(text: &str) -> HashMap<String, f64> {
    let mut totals = HashMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let value: f64 = rest.trim_end_matches("|c").parse().unwrap();
        *totals.entry(name.to_owned()).or_insert(0.0) += value;
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_s_statsd_names_over_tcp_count_the_hits_sent() {
    let (sink, mut t) = sending_statsd(&[("web.yaml", RULES)]).await;
    for _ in 0..3 {
        t.hit("web", &[("user", "a")]).await;
    }
    assert_eq!(
        t.hit("web", &[("plan", "free"), ("path", "/x")]).await.0,
        Code::Ok
    );
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(30), sink.accept())
        .await
        .expect("the server connects to the sink")
        .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let want = |text: &str| {
        let t = totals(text);
        t.get("ratelimit.service.rate_limit.web.user.total_hits") == Some(&3.0)
            && t.get("ratelimit.service.rate_limit.web.user.over_limit") == Some(&1.0)
            && t.contains_key("ratelimit.service.rate_limit.web.plan_free.path.total_hits")
    };
    while !want(&text) {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("not all stats after 30 s:\n{text}"))
            .unwrap();
        assert!(n > 0, "the server closed the sink connection:\n{text}");
        text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    eprintln!("--- statsd lines received ---\n{text}");
    let totals = totals(&text);
    assert_eq!(
        totals["ratelimit.service.rate_limit.web.user.within_limit"],
        2.0
    );
    assert_eq!(totals["ratelimit.service.config_load_success"], 1.0);
    for name in totals.keys() {
        assert!(
            MAPPINGS.iter().any(|p| matches(p, name)),
            "{name} is matched by no mapping of the statsd-exporter config"
        );
    }
    t.server.shutdown().await;
}

/// `PROMETHEUS_MAPPER_YAML`: the admin page shows the reference's stats as the mapping names
/// them (here a rule of two levels → {domain, key1, key2}; what no mapping matches keeps its
/// escaped statsd name; a dropped stat is gone), and every family of ours stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_file_names_the_reference_s_stats_on_the_metrics_page() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), RULES).unwrap();
    let mapping = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        mapping.path(),
        r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.*.total_hits"
    name: "rl_hits"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    action: drop
"#,
    )
    .unwrap();
    let mut server = Served::with_env(
        dir.path(),
        &[(
            "PROMETHEUS_MAPPER_YAML",
            mapping.path().display().to_string(),
        )],
    );
    let mut client = server.client().await;
    for entries in [&[("plan", "free"), ("path", "/x")][..], &[("user", "a")]] {
        client
            .should_rate_limit(common::request("web", &[entries]))
            .await
            .unwrap();
    }
    let page = common::metrics::scrape(&format!("{}/metrics", server.http)).await;
    for series in [
        r#"rl_hits{domain="web",key1="plan_free",key2="path"} 1"#,
        // One level: not matched by the three-part glob, so its statsd name, escaped.
        "ratelimit_service_rate_limit_web_user_total_hits 1",
        // Not matched by any mapping: escaped as statsd-exporter escapes it.
        "ratelimit_service_config_load_success 1",
        // Ours stay.
        "ratelimit_service_total_requests{",
    ] {
        assert!(page.contains(series), "no {series} in:\n{page}");
    }
    // Dropped: the one-level rule's within_limit (the drop's glob is `*.*`, one key level).
    assert!(!page.contains("web_user_within_limit"), "dropped:\n{page}");
    assert!(
        page.contains("ratelimit_service_rate_limit_web_plan_free_path_within_limit 1"),
        "{page}"
    );
    assert!(
        !page.contains("ratelimit_service_rate_limit_total_hits"),
        "{page}"
    );
}

#[test]
fn a_broken_mapping_file_stops_start_up_naming_the_mapping_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), RULES).unwrap();
    let mapping = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(mapping.path(), "mappings:\n  - name: x\n").unwrap();
    let mut server = Served::with_env(
        dir.path(),
        &[(
            "PROMETHEUS_MAPPER_YAML",
            mapping.path().display().to_string(),
        )],
    );
    assert!(!server.wait_exit().success(), "the server must not start");
    let log = server.log();
    assert!(
        log.contains("invalid PROMETHEUS_MAPPER_YAML")
            && log.contains("mappings[0]: match is required"),
        "{log}"
    );
}

/// Descriptors no rule matched, per domain with rules (`no_rule`), and the descriptors of calls to
/// a domain with none (the reference's `domain_not_found`, one per descriptor), in /metrics and
/// statsd; unknown domains past 100 fold into `domain="(other)"`. A whitelisted descriptor and a
/// matched one are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_descriptors_and_unknown_domains_are_counted_per_domain() {
    let rules = format!("{RULES}  - key: user\n    value: admin\n");
    let (sink, mut t) = sending_statsd(&[("web.yaml", &rules)]).await;
    // Matched; whitelisted; ending on an entry without a limit (as whitelisted: the rules name
    // it); then two that no rule matches: an unknown key, a descriptor longer than its branch.
    let descriptors: &[&[(&str, &str)]] = &[
        &[("user", "a")],
        &[("user", "admin")],
        &[("plan", "free")],
        &[("team", "x")],
        &[("user", "a"), ("path", "/x")],
    ];
    t.call(common::request("web", descriptors)).await;
    // Two calls to a domain with no rules: 3 descriptors.
    t.call(common::request("nope", &[&[("a", "1")], &[("b", "2")]]))
        .await;
    t.call(common::request("nope", &[&[("a", "1")]])).await;
    for i in 0..105 {
        t.call(common::request(&format!("typo-{i}"), &[&[("a", "1")]]))
            .await;
    }
    let page = common::metrics::scrape(&t.http("/metrics")).await;
    let no_rule = "ratelimit_service_rate_limit_no_rule";
    let not_found = "ratelimit_service_rate_limit_domain_not_found";
    assert_eq!(
        common::metrics::labelled(&page, no_rule, r#"domain="web""#),
        2
    );
    assert_eq!(common::metrics::sum(&page, no_rule), 2.0, "{page}");
    assert_eq!(
        common::metrics::labelled(&page, not_found, r#"domain="nope""#),
        3
    );
    assert_eq!(
        common::metrics::labelled(&page, not_found, r#"domain="typo-0""#),
        1
    );
    // "nope" took one of the 100 own series: typo-0..98 have theirs, the last 6 are folded.
    assert_eq!(
        common::metrics::labelled(&page, not_found, r#"domain="typo-98""#),
        1
    );
    assert_eq!(
        common::metrics::labelled(&page, not_found, r#"domain="typo-99""#),
        0
    );
    assert_eq!(
        common::metrics::labelled(&page, not_found, r#"domain="(other)""#),
        6
    );
    let series = page
        .lines()
        .filter(|l| l.starts_with(&format!("{not_found}{{")))
        .count();
    assert_eq!(series, 101, "100 domains and (other)");
    assert_eq!(common::metrics::sum(&page, not_found), 108.0);

    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(30), sink.accept())
        .await
        .expect("the server connects to the sink")
        .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let want = |text: &str| {
        let t = totals(text);
        t.get("ratelimit.service.rate_limit.web.no_rule") == Some(&2.0)
            && t.get("ratelimit.service.rate_limit.nope.domain_not_found") == Some(&3.0)
            && t.get("ratelimit.service.rate_limit.(other).domain_not_found") == Some(&6.0)
    };
    while !want(&text) {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("not all stats after 30 s:\n{text}"))
            .unwrap();
        assert!(n > 0, "the server closed the sink connection:\n{text}");
        text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    t.server.shutdown().await;
}

/// The reference sanitizes every stat name (`utils.SanitizeStatName`): `:` and `|` become `_`, and
/// so do the dots of IPv4 addresses, so a client's address is one part of the name and the
/// mapping's `*.*.total_hits` gives `key1="remote_address_10_0_0_1"`. The domain of
/// `domain_not_found` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_names_are_sanitized_as_the_reference_s() {
    let rules = "
domain: ip
descriptors:
  - {key: remote_address, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 60}}
  - {key: hostport, value: 'a:b|c', rate_limit: {unit: minute, requests_per_unit: 60}}
";
    let (sink, mut t) = sending_statsd(&[("ip.yaml", rules)]).await;
    for entry in [
        ("remote_address", "10.0.0.1"),
        ("remote_address", "2001:db8::1"),
        ("hostport", "a:b|c"),
    ] {
        assert_eq!(t.hit("ip", &[entry]).await.0, Code::Ok);
    }
    t.call(common::request("10.0.0.9:81", &[&[("a", "1")]]))
        .await;
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(30), sink.accept())
        .await
        .expect("the server connects to the sink")
        .unwrap();
    let wanted = [
        "ratelimit.service.rate_limit.ip.remote_address_10_0_0_1.total_hits",
        "ratelimit.service.rate_limit.ip.remote_address_2001_db8__1.total_hits",
        "ratelimit.service.rate_limit.ip.hostport_a_b_c.total_hits",
        "ratelimit.service.rate_limit.10_0_0_9_81.domain_not_found",
    ];
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    // Whole lines only: a read may end inside one.
    let lines = |text: &str| totals(&text[..text.rfind('\n').map_or(0, |i| i + 1)]);
    while !wanted
        .iter()
        .all(|name| lines(&text).get(*name) == Some(&1.0))
    {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("not all stats after 30 s:\n{text}"))
            .unwrap();
        assert!(n > 0, "the server closed the sink connection:\n{text}");
        text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    for name in lines(&text).keys() {
        assert!(
            name.ends_with("domain_not_found") || MAPPINGS.iter().any(|p| matches(p, name)),
            "{name} is matched by no mapping of the statsd-exporter config"
        );
    }
    t.server.shutdown().await;
}
