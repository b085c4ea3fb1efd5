//! ShouldRateLimit over real gRPC: countdowns, matching, rule flags and the reference's statuses.

use crate::common;

use common::{Code, START, code, descriptor, headers, request, start, start_with};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::UInt64Value;

const RULES: &str = r#"
domain: api
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window, name: fixed-3}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: api_key
    value: trusted
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
    descriptors:
      - key: path
        value: "/v1/*"
        rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
      - key: path
        value: "/v1/search"
        rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: internal
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: tier
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: fixed_window
      replaces: [{name: fixed-3}]
"#;

async fn server() -> common::TestServer {
    start(&[("api.yaml", RULES)]).await
}

#[tokio::test]
async fn fixed_window_counts_down_to_over_limit_and_resets_with_the_window() {
    let mut s = server().await;
    for expected in [2, 1, 0] {
        assert_eq!(s.hit("api", &[("fixed", "x")]).await, (Code::Ok, expected));
    }
    let r = s.call(request("api", &[&[("fixed", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let status = &r.statuses[0];
    assert_eq!(code(status.code), Code::OverLimit);
    assert_eq!(status.limit_remaining, 0);
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (3, Unit::Minute as i32, "fixed-3")
    );
    assert_eq!(
        status.duration_until_reset.as_ref().unwrap().seconds,
        50,
        "window ends at the minute"
    );
    s.advance(50);
    assert_eq!(s.hit("api", &[("fixed", "x")]).await, (Code::Ok, 2));
}

#[tokio::test]
async fn token_bucket_refills_at_its_rate() {
    let mut s = server().await;
    assert_eq!(s.hit("api", &[("bucket", "b")]).await, (Code::Ok, 1));
    assert_eq!(s.hit("api", &[("bucket", "b")]).await, (Code::Ok, 0));
    assert_eq!(s.hit("api", &[("bucket", "b")]).await.0, Code::OverLimit);
    s.clock.advance(std::time::Duration::from_millis(500));
    assert_eq!(
        s.hit("api", &[("bucket", "b")]).await,
        (Code::Ok, 0),
        "one token per 500 ms"
    );
    assert_eq!(s.hit("api", &[("bucket", "b")]).await.0, Code::OverLimit);
}

#[tokio::test]
async fn value_less_keys_count_per_value() {
    let mut s = server().await;
    assert_eq!(s.hit("api", &[("api_key", "a")]).await, (Code::Ok, 1));
    assert_eq!(s.hit("api", &[("api_key", "a")]).await, (Code::Ok, 0));
    assert_eq!(s.hit("api", &[("api_key", "a")]).await.0, Code::OverLimit);
    assert_eq!(
        s.hit("api", &[("api_key", "b")]).await,
        (Code::Ok, 1),
        "another value has its own counter"
    );
}

#[tokio::test]
async fn nested_descriptors_match_by_depth_exact_before_wildcard() {
    let mut s = server().await;
    let search = [("api_key", "a"), ("path", "/v1/search")];
    let other = [("api_key", "a"), ("path", "/v1/users")];
    assert_eq!(
        s.hit("api", &search).await,
        (Code::Ok, 4),
        "exact value wins"
    );
    assert_eq!(s.hit("api", &other).await, (Code::Ok, 0), "wildcard");
    assert_eq!(s.hit("api", &other).await.0, Code::OverLimit);
    assert_eq!(
        s.hit("api", &[("api_key", "a"), ("path", "/v1/orders")])
            .await,
        (Code::Ok, 0),
        "each value matched by a wildcard has its own counter"
    );
    assert_eq!(
        s.hit("api", &[("api_key", "a")]).await,
        (Code::Ok, 1),
        "the parent's limit is separate"
    );
}

#[tokio::test]
async fn wildcard_counters_are_per_request_value() {
    let mut s = server().await;
    assert_eq!(
        s.hit("api", &[("api_key", "a"), ("path", "/v1/a")]).await,
        (Code::Ok, 0)
    );
    assert_eq!(
        s.hit("api", &[("api_key", "a"), ("path", "/v1/b")]).await,
        (Code::Ok, 0)
    );
    assert_eq!(
        s.hit("api", &[("api_key", "a"), ("path", "/v1/a")]).await.0,
        Code::OverLimit
    );
}

#[tokio::test]
async fn unmatched_deeper_or_shorter_descriptors_get_no_limit() {
    let mut s = server().await;
    let r = s
        .call(request("api", &[&[("api_key", "a"), ("path", "/v2/x")]]))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let r = s
        .call(request("api", &[&[("fixed", "x"), ("extra", "y")]]))
        .await;
    assert!(
        r.statuses[0].current_limit.is_none(),
        "longer than the rule"
    );
    let r = s.call(request("nope", &[&[("fixed", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok, "unknown domain");
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn whitelisted_value_is_never_limited() {
    let mut s = server().await;
    for _ in 0..5 {
        let r = s.call(request("api", &[&[("api_key", "trusted")]])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert!(r.statuses[0].current_limit.is_none());
    }
}

#[tokio::test]
async fn unlimited_reports_max_remaining() {
    let mut s = server().await;
    for _ in 0..5 {
        let r = s.call(request("api", &[&[("internal", "x")]])).await;
        assert_eq!(code(r.statuses[0].code), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
    }
}

#[tokio::test]
async fn shadow_mode_rule_answers_ok_when_over() {
    let mut s = server().await;
    assert_eq!(s.hit("api", &[("shadow", "x")]).await, (Code::Ok, 0));
    let r = s.call(request("api", &[&[("shadow", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(r.statuses[0].current_limit.is_some());
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let mut s = server().await;
    for _ in 0..5 {
        let r = s
            .call(request("api", &[&[("fixed", "x")], &[("tier", "gold")]]))
            .await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert!(r.statuses[0].current_limit.is_none(), "fixed-3 replaced");
    }
    // Without the replacing descriptor the limit applies, and it was never charged.
    assert_eq!(s.hit("api", &[("fixed", "x")]).await, (Code::Ok, 2));
}

#[tokio::test]
async fn hits_addend_at_request_and_descriptor_level() {
    let mut s = server().await;
    let mut r = request("api", &[&[("fixed", "h")]]);
    r.hits_addend = 2;
    let resp = s.call(r.clone()).await;
    assert_eq!(resp.statuses[0].limit_remaining, 1);
    let resp = s.call(r.clone()).await;
    assert_eq!(
        code(resp.overall_code),
        Code::OverLimit,
        "2 more do not fit in 1"
    );
    // descriptor-level hits_addend overrides the request's; 0 checks without charging
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let resp = s.call(r.clone()).await;
    assert_eq!(
        (code(resp.overall_code), resp.statuses[0].limit_remaining),
        (Code::Ok, 1)
    );
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let resp = s.call(r.clone()).await;
    assert_eq!(
        (code(resp.overall_code), resp.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

#[tokio::test]
async fn request_hits_addend_zero_means_one() {
    let mut s = server().await;
    let r = s.call(request("api", &[&[("fixed", "z")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn limit_override_replaces_the_configured_limit() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let mut s = server().await;
    let mut d = descriptor(&[("anything", "v")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 1,
    });
    let r = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![d],
        hits_addend: 0,
    };
    let first = s.call(r.clone()).await;
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (2, Unit::Second as i32, "")
    );
    assert_eq!(first.statuses[0].limit_remaining, 1);
    s.call(r.clone()).await;
    assert_eq!(code(s.call(r.clone()).await.overall_code), Code::OverLimit);
    // Unknown domain: overrides are ignored, as in the reference.
    let mut unknown = r.clone();
    unknown.domain = "nope".into();
    assert!(s.call(unknown).await.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn a_denied_request_charges_none_of_its_descriptors() {
    let mut s = server().await;
    // Use up the 1-per-minute wildcard limit of key b.
    assert_eq!(
        s.hit("api", &[("api_key", "b"), ("path", "/v1/x")]).await.0,
        Code::Ok
    );
    for _ in 0..3 {
        let r = s
            .call(request(
                "api",
                &[&[("fixed", "q")], &[("api_key", "b"), ("path", "/v1/x")]],
            ))
            .await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        assert_eq!(code(r.statuses[0].code), Code::Ok);
        assert_eq!(
            r.statuses[0].limit_remaining, 3,
            "not charged: the request was denied"
        );
        assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    }
    assert_eq!(
        s.hit("api", &[("fixed", "q")]).await,
        (Code::Ok, 2),
        "full quota left"
    );
}

#[tokio::test]
async fn empty_descriptor_gets_ok_and_no_limit() {
    let mut s = server().await;
    let r = s.call(request("api", &[&[]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn response_headers_come_from_the_tightest_status() {
    let mut s = start_with(&[("api.yaml", RULES)], |st| {
        st.limit_response_headers_enabled = true
    })
    .await;
    let r = s
        .call(request("api", &[&[("api_key", "h")], &[("fixed", "h")]]))
        .await;
    assert_eq!(
        headers(&r),
        [
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "1"),
            ("RateLimit-Reset", "50")
        ]
    );
    s.call(request("api", &[&[("api_key", "h")]])).await;
    let r = s
        .call(request("api", &[&[("fixed", "h")], &[("api_key", "h")]]))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let remaining = r
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "RateLimit-Remaining")
        .unwrap();
    assert_eq!(remaining.value, "0", "the over-limit status wins");
    let r = s.call(request("api", &[&[("internal", "x")]])).await;
    assert!(
        r.response_headers_to_add.is_empty(),
        "no headers without a limited status"
    );
}

#[tokio::test]
async fn header_names_are_configurable() {
    let mut s = start_with(&[("api.yaml", RULES)], |st| {
        st.limit_response_headers_enabled = true;
        st.limit_limit_header = "X-Limit".into();
    })
    .await;
    let r = s.call(request("api", &[&[("fixed", "h")]])).await;
    assert_eq!(r.response_headers_to_add[0].key, "X-Limit");
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_but_statuses_tell_the_truth() {
    let mut s = start_with(&[("api.yaml", RULES)], |st| st.shadow_mode = true).await;
    for _ in 0..3 {
        s.hit("api", &[("fixed", "g")]).await;
    }
    let r = s.call(request("api", &[&[("fixed", "g")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(code(r.statuses[0].code), Code::OverLimit);
}

#[tokio::test]
async fn the_clock_is_the_servers_manual_clock() {
    let s = server().await;
    assert_eq!(ratelimit_server::clock::Clock::now(&s.clock), START);
}

#[tokio::test]
async fn remaining_is_what_the_key_has_now_when_nothing_was_charged() {
    let mut s = server().await;
    // Four hits of one key in one request, against 3 per minute: the fourth does not fit, so
    // nothing is charged, and every status that fits reports the 3 the key still has.
    let q: &[(&str, &str)] = &[("fixed", "q")];
    let r = s.call(request("api", &[q; 4])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let statuses: Vec<(Code, u32)> = r
        .statuses
        .iter()
        .map(|s| (code(s.code), s.limit_remaining))
        .collect();
    assert_eq!(
        statuses,
        [
            (Code::Ok, 3),
            (Code::Ok, 3),
            (Code::Ok, 3),
            (Code::OverLimit, 0)
        ]
    );
    assert_eq!(
        s.hit("api", &[("fixed", "q")]).await,
        (Code::Ok, 2),
        "nothing was taken"
    );
    // A charged request reports what is left after each charge, in descriptor order.
    let r = s.call(request("api", &[q; 2])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    let remaining: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [1, 0]);
    assert_eq!(
        code(
            s.call(request("api", &[&[("fixed", "q")]]))
                .await
                .overall_code
        ),
        Code::OverLimit
    );
}

#[tokio::test]
async fn rules_nested_32_levels_match_a_descriptor_of_32_entries() {
    let mut rules = String::from("domain: deep\ndescriptors:\n");
    for level in 1..=32 {
        let indent = " ".repeat(2 + 4 * (level - 1));
        rules += &format!("{indent}- key: k{level}\n");
        if level < 32 {
            rules += &format!("{indent}  descriptors:\n");
        } else {
            rules += &format!("{indent}  rate_limit: {{unit: hour, requests_per_unit: 5}}\n");
        }
    }
    let mut s = start(&[("deep.yaml", &rules)]).await;
    let keys: Vec<String> = (1..=32).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    assert_eq!(s.hit("deep", &entries).await, (Code::Ok, 4));
    let r = s.call(request("deep", &[&entries[..31]])).await;
    assert!(r.statuses[0].current_limit.is_none(), "31 entries: no rule");
}

const RETRY_RULES: &str = r#"
domain: retry
descriptors:
  - key: algo
    value: token
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket, policy: token}
  - key: algo
    value: fixed
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: algo
    value: sliding
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window, name: sliding-2}
  - key: algo
    value: leaky
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: leaky_bucket, max_delay: 0s}
  - key: algo
    value: internal
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window, advertise: false}
"#;

/// `--rate-limit-headers ietf` on the manual clock (10 s into a minute): each algorithm's
/// Retry-After is the exact wait until the request would pass, and `t` of the denied policy too.
#[tokio::test]
async fn ietf_headers_say_when_each_algorithm_lets_the_request_through() {
    let mut s = start_with(&[("retry.yaml", RETRY_RULES)], |st| {
        st.rate_limit_headers = Some(ratelimit_server::settings::RateLimitHeaders::Ietf);
    })
    .await;
    // (value, policy as advertised, hits that pass, then the wait in seconds)
    let cases = [
        ("token", "token", 2, 30),
        ("fixed", "algo_fixed", 2, 50),
        // The next window, once the 2 hits of this one weigh less than 1: 50 s + 30 s.
        ("sliding", "sliding-2", 2, 80),
        // No queue (max_delay 0): one hit per 30 s.
        ("leaky", "algo_leaky", 1, 30),
    ];
    for (value, policy, passing, wait) in cases {
        for left in (0..passing).rev() {
            let r = s.call(request("retry", &[&[("algo", value)]])).await;
            assert_eq!(code(r.overall_code), Code::Ok, "{value}");
            let h = headers(&r);
            assert_eq!(
                h[0],
                ("RateLimit-Policy", &*format!("\"{policy}\";q=2;w=60"))
            );
            assert_eq!(h[1].0, "RateLimit");
            assert!(
                h[1].1.starts_with(&format!("\"{policy}\";r={left};t=")),
                "{h:?}"
            );
            assert_eq!(h.len(), 2, "no Retry-After on OK: {h:?}");
        }
        let r = s.call(request("retry", &[&[("algo", value)]])).await;
        assert_eq!(code(r.overall_code), Code::OverLimit, "{value}");
        assert_eq!(
            headers(&r),
            [
                ("RateLimit-Policy", &*format!("\"{policy}\";q=2;w=60")),
                ("RateLimit", &*format!("\"{policy}\";r=0;t={wait}")),
                ("Retry-After", &*wait.to_string()),
            ],
            "{value}"
        );
    }
    // An internal limit shows nothing, but its Retry-After is still given.
    s.hit("retry", &[("algo", "internal")]).await;
    let r = s.call(request("retry", &[&[("algo", "internal")]])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(headers(&r), [("Retry-After", "50")]);
}
