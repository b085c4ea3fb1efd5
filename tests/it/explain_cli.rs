//! `ratelimit-server explain --server`: the offline explanation of a rules directory plus the
//! live state of each limit's key on a running server (its admin `GET /explain`).

use crate::common;

use common::{Code, start};

const RULES: &str = r#"
domain: x
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 4, max_delay: 250ms}
      - {unit: minute, requests_per_unit: 100, unit_multiplier: 5, algorithm: sliding_window, name: slow}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 6}
"#;

fn explain(args: Vec<String>) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("explain")
        .args(args)
        .env_remove("DEFAULT_ALGORITHM")
        .env_remove("DEFAULT_MAX_DELAY")
        .output()
        .expect("run explain");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_algorithms_effective_numbers_and_live_state() {
    let mut s = start(&[("x.yaml", RULES)]).await;
    assert_eq!(s.hit("x", &[("user", "u1")]).await.0, Code::Ok);
    for _ in 0..2 {
        assert_eq!(s.hit("x", &[("plain", "p")]).await.0, Code::Ok);
    }
    let args = vec![
        s.dir.path().display().to_string(),
        "--domain".into(),
        "x".into(),
        "--server".into(),
        format!("http://{}", s.server.http_addr),
        "user=u1".into(),
        "plain=p".into(),
    ];
    let (status, out) = tokio::task::spawn_blocking(move || explain(args))
        .await
        .unwrap();
    assert_eq!(status, 0, "{out}");
    for expected in [
        // offline, from the rules directory
        "10 per 1 second(s), leaky_bucket: drain 1 every 100ms, queue 4, max delay 250ms",
        "100 per 5 minute(s), sliding_window, name 'slow': 100 per sliding window of 5m",
        "6 per 1 minute(s), token_bucket (server default): refill 1 every 10s, burst 6",
        // live, from the server: one leaky turn taken (2 more fit within the 250 ms max delay),
        // one sliding hit, two token-bucket hits
        "live on http://",
        "now: remaining 2, reset in 100ms; state: queue empty in 100ms",
        "now: remaining 99, reset in 590s; state: 1 hit(s) in the window that started 10s ago, 0 in the one before",
        "now: remaining 4, reset in 20s; state: bucket full again in 20s",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reports_a_server_it_cannot_reach() {
    let s = start(&[("x.yaml", RULES)]).await;
    let args = vec![
        s.dir.path().display().to_string(),
        "--domain".into(),
        "x".into(),
        "--server".into(),
        "http://127.0.0.1:1".into(),
        "plain=p".into(),
    ];
    let (status, out) = tokio::task::spawn_blocking(move || explain(args))
        .await
        .unwrap();
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("cannot reach"), "{out}");
    assert!(out.contains("Connection refused"), "names the cause: {out}");
}

/// A descriptor whose entries would match a rule in another order: the explanation says so, with
/// that order and the rule (what an Envoy whose actions are ordered otherwise than the rules nest
/// needs to read); one whose values match no rule in any order says nothing more.
#[test]
fn explain_says_when_another_order_would_match_a_rule() {
    let dir = tempfile::tempdir().unwrap();
    let rules = "domain: edge\ndescriptors:\n  - key: remote_address\n    descriptors:\n      \
        - key: path\n        value: /v1/*\n        rate_limit: {unit: minute, requests_per_unit: 2}\n";
    std::fs::write(dir.path().join("edge.yaml"), rules).unwrap();
    let args = |descriptor: &str| {
        vec![
            dir.path().display().to_string(),
            "--domain".into(),
            "edge".into(),
            descriptor.into(),
        ]
    };
    let (status, out) = explain(args("path=/v1/x,remote_address=10.0.0.1"));
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("=> no rule: OK, no limit"), "{out}");
    assert!(
        out.contains(
            "in another order, remote_address=10.0.0.1,path=/v1/x, it would match rule 'remote_address.path_/v1/*'"
        ),
        "{out}"
    );
    let (_, out) = explain(args("path=/v2,remote_address=10.0.0.1"));
    assert!(
        out.contains("=> no rule") && !out.contains("another order"),
        "{out}"
    );
}
