//! Two real server processes (the built binary) sharing one redis-server: racing gRPC traffic
//! against both admits exactly the limit, and a restarted instance keeps its counters.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::redis::{RedisServer, ServerProcess};
use common::{Code, code, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

const RULES: &str = "\
domain: shared
descriptors:
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: token_bucket}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: sliding_window}
";

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shared.yaml"), RULES).unwrap();
    dir
}

/// Exactness is Redis' guarantee while it answers: a slow debug build on a shared machine must
/// not fall back to per-instance decisions (REDIS_FAILURE_MODE=local), so a failure here is an
/// error, and calls may take up to 2 s.
pub fn redis_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_URL", url.into()),
        ("CACHE_KEY_PREFIX", "it:".into()),
        ("REDIS_TIMEOUT", "2s".into()),
        ("REDIS_FAILURE_MODE", "error".into()),
    ]
}

fn instance(rules: &Path, redis: &RedisServer) -> ServerProcess {
    ServerProcess::start(rules, &redis_env(&redis.addr()))
}

/// `count` requests on `key=value`, `in_flight` at a time; returns how many were OK.
async fn fire(
    client: RateLimitServiceClient<Channel>,
    key: &'static str,
    value: String,
    count: usize,
    in_flight: usize,
) -> usize {
    let gate = Arc::new(Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let mut client = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let r = client
                .should_rate_limit(request("shared", &[&[(key, value.as_str())]]))
                .await
                .expect("answered")
                .into_inner();
            drop(permit);
            code(r.overall_code) == Code::Ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap());
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_admit_exactly_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let mut a = instance(rules.path(), &redis);
    let mut b = instance(rules.path(), &redis);
    let (ca, cb) = (a.client().await, b.client().await);
    for key in ["tb", "fw", "sw"] {
        let (oa, ob) = tokio::join!(
            fire(ca.clone(), key, "hot".into(), 1000, 64),
            fire(cb.clone(), key, "hot".into(), 1000, 64),
        );
        eprintln!("{key}: instance a admitted {oa}, instance b {ob}");
        assert_eq!(
            oa + ob,
            300,
            "{key}: 2 × 1000 racing requests against 300/hour"
        );
        assert!(oa > 0 && ob > 0, "{key}: both instances decided");
    }
    let keys = redis.keys("it:*");
    assert_eq!(
        keys,
        [
            "it:{shared}|fw=hot|0.1.3600s",
            "it:{shared}|sw=hot|0.2.3600s",
            "it:{shared}|tb=hot|0.0.3600s"
        ]
    );
}

#[tokio::test]
async fn a_restarted_instance_keeps_its_counters() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let mut first = instance(rules.path(), &redis);
    let client = first.client().await;
    assert_eq!(fire(client, "fw", "user".into(), 7, 1).await, 7);
    first.stop();
    let mut second = instance(rules.path(), &redis);
    let mut client = second.client().await;
    let r = client
        .should_rate_limit(request("shared", &[&[("fw", "user")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 300 - 8, "the count went on");
}

#[tokio::test]
async fn a_bad_redis_setting_stops_the_server_naming_it() {
    let rules = rules();
    for (env, named) in [
        (("REDIS_TYPE", "ring"), "REDIS_TYPE"),
        (("REDIS_URL", "nohostport"), "REDIS_URL"),
        (("REDIS_TLS_CACERT", "/nonexistent.pem"), "REDIS_TLS_CACERT"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
            .args([
                "serve",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .arg("--config")
            .arg(rules.path())
            .env("BACKEND_TYPE", "redis")
            .env("REDIS_TLS", "true")
            .env(env.0, env.1)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?}");
        assert!(
            stderr.contains(named) || stderr.contains(&named.to_lowercase().replace('_', "-")),
            "{env:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn a_unix_socket_with_redis_socket_type_unix() {
    if !common::redis::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock").display().to_string();
    let redis = RedisServer::spawn(
        common::redis::free_port(),
        &["--port", "0", "--unixsocket", &socket],
        vec!["-s".into(), socket.clone()],
    );
    let rules = rules();
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_SOCKET_TYPE", "unix".into()),
        ("REDIS_URL", socket.clone()),
        ("CACHE_KEY_PREFIX", "sock:".into()),
    ];
    let mut server = ServerProcess::start(rules.path(), &env);
    assert_eq!(fire(server.client().await, "tb", "u".into(), 3, 1).await, 3);
    assert_eq!(redis.keys("sock:*"), ["sock:{shared}|tb=u|0.0.3600s"]);
}
