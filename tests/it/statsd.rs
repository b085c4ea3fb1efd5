//! `USE_STATSD=true`: the reference's statsd stats over TCP to a listener in the test, under names
//! the statsd-exporter mapping that Envoy Gateway (and the reference's docs) ship matches
//! (`ratelimit.service.rate_limit.*.*.total_hits` → `ratelimit_service_rate_limit_total_hits`
//! {domain, key1}; three levels → {domain, key1, key2}), counting exactly the hits sent.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

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
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    let mut t = common::start_with(&[("web.yaml", RULES)], |s| {
        s.statsd.use_statsd = true;
        s.statsd.statsd_host = "127.0.0.1".into();
        s.statsd.statsd_port = port;
        s.statsd.stats_flush_interval = Duration::from_millis(20);
    })
    .await;
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
