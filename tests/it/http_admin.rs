//! The admin HTTP port over real HTTP: status codes and shapes of every endpoint, metrics that move
//! by exactly the hits sent, and `/json` answering as gRPC does.

use crate::common;

use common::metrics::{labelled, value};
use common::{Code, code, request, start, start_with};
use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimit_server::http::response_json;
use serde_json::{Value, json};

const RULES: &str = r#"
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
"#;

async fn get(url: String) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn health_and_readiness_flip_when_draining() {
    let s = start(&[("web.yaml", RULES)]).await;
    assert_eq!(get(s.http("/healthcheck")).await, (200, "OK".into()));
    assert_eq!(get(s.http("/readyz")).await.0, 200);
    s.server.status.set_draining();
    assert_eq!(get(s.http("/healthcheck")).await.0, 500);
    assert_eq!(get(s.http("/readyz")).await.0, 503);
    assert_eq!(get(s.http("/nope")).await.0, 404);
}

#[tokio::test]
async fn rule_counters_move_by_exactly_the_hits_sent() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    let mut r = request("web", &[&[("user", "u1")]]);
    r.hits_addend = 3;
    for _ in 0..4 {
        s.call(r.clone()).await; // 3, 6, 9 allowed (9 > 8 = near), then 12 > 10 over
    }
    // The reference's split of a request's hits (base_limiter.go): of 6 → 9, only the hit past
    // the near-limit threshold (8) is near; the denied 9 → 12 (not charged, split as if it were)
    // counts 2 over (past 10) and 1 near (9 → 10), none within.
    s.call(request("web", &[&[("shadowed", "a")]])).await;
    s.call(request("web", &[&[("shadowed", "a")]])).await;
    let (status, text) = get(s.http("/metrics")).await;
    assert_eq!(status, 200);
    let user = r#"domain="web",rule="user",key1="user""#;
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_total_hits", user),
        12
    );
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_within_limit", user),
        9
    );
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_near_limit", user),
        2
    );
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_over_limit", user),
        2
    );
    let shadowed = r#"domain="web",rule="shadowed",key1="shadowed""#;
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_total_hits", shadowed),
        2
    );
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_shadow_mode", shadowed),
        1
    );
    assert_eq!(
        labelled(&text, "ratelimit_service_rate_limit_over_limit", shadowed),
        1
    );
    assert_eq!(
        labelled(
            &text,
            "ratelimit_service_total_requests",
            r#"grpc_method="ShouldRateLimit""#
        ),
        6
    );
    assert!(text.contains("ratelimit_service_response_time_seconds_bucket"));
    assert!(
        text.lines().any(|l| l == "ratelimit_store_keys 2"),
        "u1 and a are held"
    );
}

#[tokio::test]
async fn store_keys_and_evictions_are_the_stores_own_counts() {
    // One key per shard (the memory store has 128): of 300 distinct users none of whose windows
    // ends (the clock stands still), every one is either held or evicted.
    let mut s = start_with(&[("web.yaml", RULES)], |st| st.max_keys = 1).await;
    let text = get(s.http("/metrics")).await.1;
    assert_eq!(
        value(&text, "ratelimit_store_evictions").map(|v| v as u64),
        Some(0)
    );
    for i in 0..300 {
        s.call(request("web", &[&[("user", &format!("u{i}"))]]))
            .await;
    }
    let text = get(s.http("/metrics")).await.1;
    assert!(text.contains("# TYPE ratelimit_store_evictions counter"));
    assert!(text.contains("# TYPE ratelimit_store_keys gauge"));
    let keys = value(&text, "ratelimit_store_keys")
        .map(|v| v as u64)
        .unwrap();
    let evictions = value(&text, "ratelimit_store_evictions")
        .map(|v| v as u64)
        .unwrap();
    assert!(keys <= 128, "{keys} keys held");
    assert_eq!(keys + evictions, 300);
    // A scrape reads the count; it does not add to it.
    let again = get(s.http("/metrics")).await.1;
    assert_eq!(
        value(&again, "ratelimit_store_evictions").map(|v| v as u64),
        Some(evictions)
    );
}

#[tokio::test]
async fn detailed_metrics_carry_values_under_a_cap() {
    let mut s = start_with(&[("web.yaml", RULES)], |st| st.detailed_metrics_cap = 2).await;
    for tenant in ["a", "b", "c", "d"] {
        s.call(request("web", &[&[("tenant", tenant)]])).await;
    }
    let text = get(s.http("/metrics")).await.1;
    let total = "ratelimit_service_rate_limit_total_hits";
    assert_eq!(
        labelled(
            &text,
            total,
            r#"domain="web",rule="tenant_a",key1="tenant_a""#
        ),
        1
    );
    assert_eq!(
        labelled(
            &text,
            total,
            r#"domain="web",rule="tenant_b",key1="tenant_b""#
        ),
        1
    );
    assert_eq!(
        labelled(
            &text,
            total,
            r#"domain="web",rule="tenant_c",key1="tenant_c""#
        ),
        0
    );
    assert_eq!(
        labelled(
            &text,
            total,
            r#"domain="web",rule="tenant_overflow",key1="tenant_overflow""#
        ),
        2
    );
}

/// The requests the reference refuses (an empty domain, no descriptors) count under its name,
/// `service_error` (its `call.should_rate_limit.service_error` through its Prometheus mapping);
/// the ones only we refuse (over a bound), under `invalid_argument`.
#[tokio::test]
async fn invalid_requests_are_counted_by_type() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    s.call_err(request("", &[&[("user", "x")]])).await;
    s.call_err(request("web", &[])).await;
    s.call_err(request("web", &[&[("user", &"x".repeat(4097))]]))
        .await;
    let text = get(s.http("/metrics")).await.1;
    let errors = |kind: &str| {
        labelled(
            &text,
            "ratelimit_service_should_rate_limit_error",
            &format!(r#"err_type="{kind}""#),
        )
    };
    assert_eq!(errors("service_error"), 2);
    assert_eq!(errors("invalid_argument"), 1);
}

#[tokio::test]
async fn rlconfig_lists_live_rules_as_json_and_text() {
    let s = start(&[("web.yaml", RULES)]).await;
    let (status, body) = get(s.http("/rlconfig")).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let rules = &v["domains"][0]["rules"];
    assert_eq!(v["domains"][0]["domain"], "web");
    assert_eq!(rules[0]["path"], "user");
    assert_eq!(rules[0]["limits"][0]["requests_per_unit"], 10);
    assert_eq!(rules[0]["limits"][0]["algorithm"], "fixed_window");
    assert_eq!(rules[1]["shadow_mode"], true);
    assert_eq!(v["last_load"]["ok"], true);
    let (_, text) = get(s.http("/rlconfig?format=text")).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("web.user: unit=HOUR requests_per_unit=10,")),
        "{text}"
    );
    assert_eq!(text.lines().count(), 3);
}

async fn post_json(url: String, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn json_endpoint_answers_as_grpc_does() {
    let mut s = start_with(&[("web.yaml", RULES)], |st| {
        st.limit_response_headers_enabled = true
    })
    .await;
    for round in 0..12 {
        let mut grpc_request = request("web", &[&[("user", "grpc")], &[("tenant", "t")]]);
        grpc_request.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
        let grpc = s.call(grpc_request).await;
        let (status, body) = post_json(
            s.http("/json"),
            json!({"domain": "web", "descriptors": [
                {"entries": [{"key": "user", "value": "json"}]},
                {"entries": [{"key": "tenant", "value": "t"}], "hitsAddend": "0"}
            ]}),
        )
        .await;
        assert_eq!(body, response_json(&grpc), "round {round}");
        let expected = if code(grpc.overall_code) == Code::Ok {
            200
        } else {
            429
        };
        assert_eq!(status, expected, "round {round}");
    }
}

#[tokio::test]
async fn json_endpoint_rejects_bad_input_with_400() {
    let s = start(&[("web.yaml", RULES)]).await;
    let client = reqwest::Client::new();
    let r = client
        .post(s.http("/json"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (status, body) = post_json(
        s.http("/json"),
        json!({"domain": "", "descriptors": [{"entries": [{"key": "a"}]}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("domain must not be empty")
    );
    let (status, _) = post_json(s.http("/json"), json!({"domain": "web", "descripters": []})).await;
    assert_eq!(status, 400, "unknown fields are refused");
    let (status, body) = post_json(
        s.http("/json"),
        json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "x"}], "limit": {"requests_per_unit": 1, "unit": "SECOND"}}]}),
    )
    .await;
    assert_eq!(
        status, 200,
        "snake_case names and enum names accepted: {body}"
    );
    assert_eq!(body["statuses"][0]["currentLimit"]["unit"], "SECOND");
}

#[tokio::test]
async fn every_metric_the_grafana_dashboard_uses_is_exported() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    s.call(request("web", &[&[("user", "u")], &[("shadowed", "s")]]))
        .await;
    s.call(request("web", &[&[("shadowed", "s")]])).await;
    s.call_err(request("", &[&[("user", "u")]])).await;
    let text = get(s.http("/metrics")).await.1;
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/grafana-dashboard.json"
    ))
    .unwrap();
    let mut names: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("ratelimit_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let family = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} is not exported"
        );
    }
}

/// The per-rule sample lines of one exposition.
fn rule_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_"))
        .collect()
}

#[tokio::test]
async fn per_rule_series_follow_the_live_rules() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    let text = get(s.http("/metrics")).await.1;
    assert_eq!(rule_lines(&text), Vec::<&str>::new(), "no hits, no series");
    s.call(request("web", &[&[("user", "u")]])).await;
    s.call(request("web", &[&[("shadowed", "a")]])).await;
    let text = get(s.http("/metrics")).await.1;
    let user: Vec<&str> = rule_lines(&text)
        .into_iter()
        .filter(|l| l.contains(r#"{domain="web",rule="user",key1="user"}"#))
        .collect();
    assert_eq!(user.len(), 5, "{user:?}");
    assert_eq!(rule_lines(&text).len(), 10, "user and shadowed only");
    // Reload without `user`; `shadowed` is kept (with a new limit) and keeps its counts.
    let without_user = RULES
        .replace("  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}\n", "")
        .replace("requests_per_unit: 1,", "requests_per_unit: 7,");
    assert!(!without_user.contains("key: user"));
    std::fs::write(s.dir.path().join("web.yaml"), without_user).unwrap();
    s.server.reloader.reload().expect("valid rules");
    let text = get(s.http("/metrics")).await.1;
    assert!(!text.contains(r#"rule="user",key1="user""#), "{text}");
    let shadowed = r#"domain="web",rule="shadowed",key1="shadowed""#;
    let total = "ratelimit_service_rate_limit_total_hits";
    assert_eq!(labelled(&text, total, shadowed), 1);
    s.call(request("web", &[&[("shadowed", "a")]])).await;
    let text = get(s.http("/metrics")).await.1;
    assert_eq!(labelled(&text, total, shadowed), 2, "counted on, no reset");
    assert_eq!(rule_lines(&text).len(), 5);
}

#[tokio::test]
async fn huge_hits_addend_is_over_the_limit_and_never_turns_counters_down() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    let total = "ratelimit_service_rate_limit_total_hits";
    let over = "ratelimit_service_rate_limit_over_limit";
    let user = r#"domain="web",rule="user",key1="user""#;
    let mut last = (0, 0);
    for hits in [u64::MAX, 1 << 63, 1 << 63, 1 << 32, u64::from(u32::MAX)] {
        let mut r = request("web", &[&[("user", "big")]]);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        let response = s.call(r).await;
        assert_eq!(code(response.overall_code), Code::OverLimit, "{hits} hits");
        assert_eq!(response.statuses[0].limit_remaining, 0);
        let text = get(s.http("/metrics")).await.1;
        let now = (labelled(&text, total, user), labelled(&text, over, user));
        assert!(
            now.0 > last.0 && now.1 > last.1,
            "{hits}: {now:?} after {last:?}"
        );
        last = now;
    }
    // Nothing was charged: the full quota is left.
    assert_eq!(s.hit("web", &[("user", "big")]).await, (Code::Ok, 9));
}

#[tokio::test]
async fn detailed_metric_labels_are_bounded_in_length() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    for i in 0..300 {
        let value = format!("{i:04}{}", "v".repeat(4092));
        s.call(request("web", &[&[("tenant", &value)]])).await;
    }
    let text = get(s.http("/metrics")).await.1;
    let lines = rule_lines(&text);
    let longest = lines.iter().map(|l| l.len()).max().unwrap();
    // The bounded label appears twice: as `rule` and as the reference's `key1`.
    assert!(longest <= 700, "a sample line of {longest} bytes");
    assert_eq!(lines.len(), 5 * 300, "distinct values stay distinct series");
    assert!(
        text.len() < 1_100_000,
        "{} bytes for 300 values of 4 KiB",
        text.len()
    );
}

#[tokio::test]
async fn rlconfig_refuses_an_unknown_format() {
    let s = start(&[("web.yaml", RULES)]).await;
    let (status, body) = get(s.http("/rlconfig?format=xml")).await;
    assert_eq!(status, 400);
    assert!(
        body.contains("'xml'") && body.contains("json, text"),
        "{body}"
    );
    let (status, body) = get(s.http("/rlconfig?format=json")).await;
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).is_ok());
}

#[tokio::test]
async fn json_endpoint_names_a_bad_hits_addend() {
    let s = start(&[("web.yaml", RULES)]).await;
    let entries = json!([{"key": "user", "value": "x"}]);
    let cases = [
        (
            json!({"domain": "web", "hitsAddend": -1, "descriptors": [{"entries": entries}]}),
            "hitsAddend must be a whole number from 0 to 4294967295, not -1",
        ),
        (
            json!({"domain": "web", "hitsAddend": 4294967296u64, "descriptors": [{"entries": entries}]}),
            "hitsAddend must be a whole number from 0 to 4294967295, not 4294967296",
        ),
        (
            json!({"domain": "web", "descriptors": [{"entries": entries, "hitsAddend": 1.5}]}),
            "descriptors[0].hitsAddend must be a whole number from 0 to 18446744073709551615, not 1.5",
        ),
        (
            json!({"domain": "web", "descriptors": [{"entries": entries, "hits_addend": "two"}]}),
            r#"descriptors[0].hitsAddend must be a whole number from 0 to 18446744073709551615, not "two""#,
        ),
        (
            json!({"domain": "web", "descriptors": [{"entries": entries, "limit": {"requestsPerUnit": 1, "unit": 1.5}}]}),
            "descriptors[0].limit.unit must be one of",
        ),
    ];
    for (body, message) in cases {
        let (status, answer) = post_json(s.http("/json"), body.clone()).await;
        assert_eq!(status, 400, "{body}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.starts_with(message), "{body}: {error}");
    }
    let (status, _) = post_json(
        s.http("/json"),
        json!({"domain": "web", "hitsAddend": "2", "descriptors": [{"entries": entries, "hitsAddend": 3}]}),
    )
    .await;
    assert_eq!(status, 200, "numbers and numeric strings are accepted");
}

#[tokio::test]
async fn json_refuses_bodies_a_web_page_could_send_cross_site() {
    let mut s = start(&[("web.yaml", RULES)]).await;
    // The request a page could `fetch` without a preflight: a "simple" content type, spending the
    // victim's whole hour in one call.
    let body = r#"{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"victim"}],"hitsAddend":10}]}"#;
    let client = reqwest::Client::new();
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let mut post = client.post(s.http("/json")).body(body);
        if let Some(t) = content_type {
            post = post.header("content-type", t);
        }
        let r = post.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 415, "{content_type:?}");
        let answer: Value = r.json().await.unwrap();
        let message = answer["error"].as_str().unwrap();
        assert!(
            message.contains("Content-Type must be application/json"),
            "{message}"
        );
    }
    // Nothing was charged: the victim has its 10 left.
    assert_eq!(s.hit("web", &[("user", "victim")]).await, (Code::Ok, 9));
    // The same body as JSON is served.
    let r = client
        .post(s.http("/json"))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429, "9 left, 10 asked");
}

/// Sends `head` (request line and headers) on a fresh connection and returns the first thing the
/// server answers (at most 10 s).
async fn first_answer(addr: std::net::SocketAddr, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn a_body_too_large_to_read_gets_413_not_100_continue() {
    let s = start(&[("web.yaml", RULES)]).await;
    let addr = s.server.http_addr;
    for length in ["100000000000", "2097153"] {
        let head = format!(
            "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Expect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
        );
        let answer = first_answer(addr, &head).await;
        assert!(answer.starts_with("HTTP/1.1 413 "), "{length}: {answer}");
        assert!(answer.contains("reads at most 2097152"), "{answer}");
    }
    // Within the bound, the client is told to go on.
    let head = "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Expect: 100-continue\r\nContent-Length: 100\r\n\r\n";
    assert!(
        first_answer(addr, head)
            .await
            .starts_with("HTTP/1.1 100 Continue")
    );
    // A chunked body with no length is cut at the bound as it is read.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
    for _ in 0..40 {
        // The server may answer and close before all is sent.
        if tcp.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = tcp.write_all(b"0\r\n\r\n").await;
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
}

#[tokio::test]
async fn json_decisions_come_through_the_front_door_as_grpc_ones_do() {
    // Counted in the call metrics like a gRPC call, refused ones by their kind.
    let s = start(&[("web.yaml", RULES)]).await;
    let calls = r#"grpc_method="ShouldRateLimit""#;
    for _ in 0..3 {
        let (status, _) = post_json(
            s.http("/json"),
            json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "j"}]}]}),
        )
        .await;
        assert_eq!(status, 200);
    }
    let refused = reqwest::Client::new()
        .post(s.http("/json"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let (_, metrics) = get(s.http("/metrics")).await;
    assert_eq!(
        labelled(&metrics, "ratelimit_service_total_requests", calls),
        4,
        "three decisions and one refusal"
    );
    assert_eq!(
        labelled(
            &metrics,
            "ratelimit_service_should_rate_limit_error",
            r#"err_type="invalid_argument""#
        ),
        1
    );
    assert_eq!(
        labelled(
            &metrics,
            "ratelimit_service_rate_limit_total_hits",
            r#"domain="web",rule="user",key1="user""#
        ),
        3
    );
}

/// The standard process metrics (Envoy Gateway's dashboard reads process_resident_memory_bytes)
/// and the build's version, beside ours.
#[tokio::test]
#[cfg(target_os = "linux")]
async fn process_and_build_metrics_are_exported() {
    let s = start(&[("web.yaml", RULES)]).await;
    let text = get(s.http("/metrics")).await.1;
    for name in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"));
        let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(v >= 0.0, "{line}");
    }
    let resident = value(&text, "process_resident_memory_bytes").unwrap();
    assert!(resident > 0.0);
    assert!(
        text.lines().any(|l| l.starts_with("ratelimit_build_info{")),
        "{text}"
    );
}
