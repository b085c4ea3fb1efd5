//! `/explain` shows the counter a decision charges, for every kind of rule, on the memory store
//! and on Redis: after a few decisions, what it says is left is what the next decision reports.

use crate::common;

use common::redis::RedisServer;
use common::{Code, request, start_now};
use ratelimit_server::settings::BackendType;
use serde_json::Value;

const RULES: &str = r#"
domain: kinds
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 20, algorithm: fixed_window}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
  - key: tenant
    rate_limits:
      - {unit: hour, requests_per_unit: 30}
      - {unit: day, requests_per_unit: 8, algorithm: fixed_window}
  - key: user
    descriptors:
      - key: action
        value: upload
        rate_limit: {unit: hour, requests_per_unit: 5, algorithm: leaky_bucket, max_delay: 0s}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// (descriptor sent to decide, as entries; the descriptor /explain is asked about)
const CASES: [(&[(&str, &str)], &str); 6] = [
    (&[("ip", "10.0.0.1")], "ip=10.0.0.1"),
    (&[("plan", "gold")], "plan=gold"),
    // Three values of one share_threshold pattern charge one counter; /explain of a fourth
    // value of the pattern shows it.
    (&[("path", "/api/a")], "path=/api/zzz"),
    (&[("tenant", "t1")], "tenant=t1"),
    (
        &[("user", "u1"), ("action", "upload")],
        "user=u1,action=upload",
    ),
    (&[("trial", "x")], "trial=x"),
];

async fn check(backend: Option<String>) {
    let s = start_now(&[("kinds.yaml", RULES)], |settings| {
        if let Some(url) = backend {
            settings.store.backend = BackendType::Redis;
            settings.store.redis_url = url;
            settings.store.cache_key_prefix = "explain:".into();
        }
    })
    .await;
    let mut s = s;
    for (entries, asked) in CASES {
        let mut remaining = Vec::new();
        for n in 0..3 {
            let mut entries = entries.to_vec();
            if entries[0].0 == "path" {
                let values = ["/api/a", "/api/b", "/api/c"];
                entries[0].1 = values[n];
            }
            let r = s.call(request("kinds", &[&entries])).await;
            assert!(
                r.overall_code == Code::Ok as i32 || entries[0].0 == "user",
                "{asked}: {r:?}"
            );
            remaining = r.statuses.iter().map(|st| st.limit_remaining).collect();
        }
        let url = s.http(&format!("/explain?domain=kinds&descriptor={asked}"));
        let explained: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        assert_eq!(explained["outcome"], "rule", "{asked}: {explained}");
        let limits = explained["limits"].as_array().expect("limits");
        // The tightest limit is what a status reports; /explain lists every limit of the rule.
        let shown: Vec<u64> = limits
            .iter()
            .map(|l| l["remaining"].as_u64().unwrap())
            .collect();
        let tightest = *shown.iter().min().unwrap();
        assert_eq!(
            u64::from(remaining[0]),
            tightest,
            "{asked}: the decisions left {remaining:?}, /explain says {shown:?}"
        );
    }
}

#[tokio::test]
async fn explain_shows_the_counter_the_decisions_charged_on_memory() {
    check(None).await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn explain_shows_the_counter_the_decisions_charged_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    check(Some(redis.addr())).await;
}

const CONCURRENCY: &str = "
domain: slots
descriptors:
  - key: api_key
    concurrency: {max_in_flight: 3, lease: 1m}
";

/// A concurrency rule: `/explain` of the rule's own entries shows the slots the decisions hold
/// (the request id and the release marker are the requests', not the key's).
async fn check_slots(backend: Option<String>) {
    let mut s = start_now(&[("slots.yaml", CONCURRENCY)], |settings| {
        if let Some(url) = backend {
            settings.store.backend = BackendType::Redis;
            settings.store.redis_url = url;
            settings.store.cache_key_prefix = "explain-slots:".into();
        }
    })
    .await;
    let mut remaining = Vec::new();
    for id in ["a", "b"] {
        let r = s
            .call(request(
                "slots",
                &[&[("api_key", "k1"), ("request_id", id)]],
            ))
            .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        remaining.push(r.statuses[0].limit_remaining);
    }
    let released = [
        ("api_key", "k1"),
        ("request_id", "a"),
        ("concurrency", "release"),
    ];
    s.call(request("slots", &[&released])).await;
    let url = s.http("/explain?domain=slots&descriptor=api_key=k1");
    let explained: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    assert_eq!(explained["outcome"], "concurrency", "{explained}");
    assert_eq!(
        (explained["in_use"].as_u64(), explained["free"].as_u64()),
        (Some(1), Some(2)),
        "after 2 taken ({remaining:?} left) and 1 given back: {explained}"
    );
    let r = s
        .call(request(
            "slots",
            &[&[("api_key", "k1"), ("request_id", "c")]],
        ))
        .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "what /explain said, less one"
    );
}

#[tokio::test]
async fn explain_shows_the_slots_the_decisions_hold_on_memory() {
    check_slots(None).await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn explain_shows_the_slots_the_decisions_hold_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    check_slots(Some(redis.addr())).await;
}
