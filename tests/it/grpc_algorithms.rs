//! The four algorithms, custom windows and several limits per descriptor over real gRPC, on the
//! server's manual clock (held leaky-bucket answers wait on it too): statuses, resets for the real
//! window, tightest-status selection and all-or-nothing charging across limits.

use crate::common;

use std::time::Duration;

use common::{Code, code, headers, request, start, start_with, wait_remaining};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use ratelimit_server::config::Algorithm;

const RULES: &str = r#"
domain: algos
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: leaky
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 3}
  - key: default
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: fixed5m
    rate_limit: {unit: minute, requests_per_unit: 3, unit_multiplier: 5, algorithm: fixed_window}
  - key: bucket5m
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5}
  - key: sliding5m
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5, algorithm: sliding_window}
  - key: leaky5m
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5, algorithm: leaky_bucket}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: per-second}
      - {unit: minute, requests_per_unit: 3, algorithm: fixed_window, name: per-minute}
"#;

fn reset(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> i64 {
    r.statuses[0].duration_until_reset.as_ref().unwrap().seconds
}

#[tokio::test]
async fn sliding_window_weighs_the_previous_window_across_the_edge() {
    let mut s = start(&[("a.yaml", RULES)]).await;
    for expected in (0..10).rev() {
        assert_eq!(
            s.hit("algos", &[("sliding", "x")]).await,
            (Code::Ok, expected)
        );
    }
    let r = s.call(request("algos", &[&[("sliding", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        reset(&r),
        110,
        "the hits are forgotten when the next window ends"
    );
    // At the minute edge a fixed window would start again; the last minute still weighs 10.
    s.advance(50);
    assert_eq!(s.hit("algos", &[("sliding", "x")]).await.0, Code::OverLimit);
    // Half way into the next minute the previous one weighs 5.
    s.advance(30);
    assert_eq!(s.hit("algos", &[("sliding", "x")]).await, (Code::Ok, 4));
}

#[tokio::test]
async fn leaky_bucket_queues_then_rejects_without_waiting() {
    let mut s = start(&[("a.yaml", RULES)]).await;
    // The manual clock stands still, so the queue of 3 fills: turns at 0, 100 and 200 ms, and the
    // held answers are not released until the clock moves.
    let mut calls = Vec::new();
    for left in [2, 1, 0] {
        let mut client = s.client.clone();
        calls.push(tokio::spawn(async move {
            let r = client
                .should_rate_limit(request("algos", &[&[("leaky", "x")]]))
                .await
                .unwrap()
                .into_inner();
            (code(r.overall_code), r.statuses[0].limit_remaining)
        }));
        wait_remaining(&s.client, "algos", &[("leaky", "x")], left).await;
    }
    // Answered while the clock stands still: a denial does not wait (bounded only so that a held
    // denial fails instead of hanging).
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        s.call(request("algos", &[&[("leaky", "x")]])),
    )
    .await
    .expect("a denial is answered without waiting for the clock");
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert!(
        !calls[1].is_finished() && !calls[2].is_finished(),
        "the queued answers wait for their turns"
    );
    s.clock.advance(Duration::from_millis(200));
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    assert_eq!(answers, [(Code::Ok, 2), (Code::Ok, 1), (Code::Ok, 0)]);
}

#[tokio::test]
async fn rules_without_an_algorithm_use_the_server_default() {
    let mut s = start_with(&[("a.yaml", RULES)], |st| {
        st.defaults.default_algorithm = Algorithm::SlidingWindow
    })
    .await;
    for _ in 0..4 {
        assert_eq!(s.hit("algos", &[("default", "x")]).await.0, Code::Ok);
    }
    s.advance(50 + 15); // a quarter into the next minute: 4 × 3/4 = 3 still count
    assert_eq!(s.hit("algos", &[("default", "x")]).await, (Code::Ok, 0));
    assert_eq!(s.hit("algos", &[("default", "x")]).await.0, Code::OverLimit);
    // A rule that names its algorithm keeps it.
    for expected in [2, 1, 0] {
        assert_eq!(
            s.hit("algos", &[("fixed5m", "y")]).await,
            (Code::Ok, expected)
        );
    }
}

#[tokio::test]
async fn unit_multiplier_reports_the_unit_and_resets_with_the_real_window() {
    let mut s = start(&[("a.yaml", RULES)]).await;
    // fixed window of 5 minutes, epoch-aligned: it started at 00:00:00 and ends at 00:05:00.
    for expected in [2, 1, 0] {
        assert_eq!(
            s.hit("algos", &[("fixed5m", "x")]).await,
            (Code::Ok, expected)
        );
    }
    let r = s.call(request("algos", &[&[("fixed5m", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Minute as i32)
    );
    assert_eq!(reset(&r), 290);
    s.advance(289);
    assert_eq!(s.hit("algos", &[("fixed5m", "x")]).await.0, Code::OverLimit);
    s.advance(1);
    assert_eq!(s.hit("algos", &[("fixed5m", "x")]).await, (Code::Ok, 2));

    // token bucket, 2 per 5 minutes: one token back every 150 s.
    let r = s.call(request("algos", &[&[("bucket5m", "x")]])).await;
    assert_eq!((r.statuses[0].limit_remaining, reset(&r)), (1, 150));
    // sliding window of 5 minutes: gone when the next 5-minute window ends.
    let r = s.call(request("algos", &[&[("sliding5m", "x")]])).await;
    assert_eq!((r.statuses[0].limit_remaining, reset(&r)), (1, 600));
    // leaky bucket, 2 per 5 minutes: the next turn is 150 s away, past the 1 s default max_delay.
    let r = s.call(request("algos", &[&[("leaky5m", "x")]])).await;
    assert_eq!((code(r.overall_code), reset(&r)), (Code::Ok, 150));
    let r = s.call(request("algos", &[&[("leaky5m", "x")]])).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    s.advance(150);
    assert_eq!(s.hit("algos", &[("leaky5m", "x")]).await.0, Code::Ok);
}

#[tokio::test]
async fn several_limits_all_must_pass_and_the_tightest_is_reported() {
    let mut s = start_with(&[("a.yaml", RULES)], |st| {
        st.limit_response_headers_enabled = true
    })
    .await;
    let status = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        let st = &r.statuses[0];
        let l = st.current_limit.as_ref().unwrap();
        (code(st.code), l.name.clone(), st.limit_remaining)
    };
    let m = || request("algos", &[&[("multi", "x")]]);
    // 2 per second is tighter than 3 per minute.
    assert_eq!(
        status(&s.call(m()).await),
        (Code::Ok, "per-second".into(), 1)
    );
    assert_eq!(
        status(&s.call(m()).await),
        (Code::Ok, "per-second".into(), 0)
    );
    // The per-second limit denies: the per-minute one is not charged either.
    let r = s.call(m()).await;
    assert_eq!(status(&r), (Code::OverLimit, "per-second".into(), 0));
    s.advance(1);
    // Now the minute is the tightest (0 left after this hit): it sets the status and headers.
    let r = s.call(m()).await;
    assert_eq!(status(&r), (Code::Ok, "per-minute".into(), 0));
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Minute as i32
    );
    assert_eq!(reset(&r), 49, "the minute's window ends at 00:01:00");
    assert_eq!(
        headers(&r),
        [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "49")
        ]
    );
    // The minute denies although the second still has a token.
    let r = s.call(m()).await;
    assert_eq!(status(&r), (Code::OverLimit, "per-minute".into(), 0));
    s.advance(49);
    assert_eq!(
        status(&s.call(m()).await),
        (Code::Ok, "per-second".into(), 1)
    );
}
