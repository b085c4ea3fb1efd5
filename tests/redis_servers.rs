//! Two real server processes (the built binary) sharing one redis-server: racing gRPC traffic
//! against both admits exactly the limit, and a restarted instance keeps its counters.

mod common;

use std::path::Path;

use common::race::{fire, shared_rules};
use common::redis::{RedisServer, ServerProcess};
use common::request;

/// Exactness is Redis' guarantee while it answers: a slow debug build on a shared machine must
/// not fall back to per-instance decisions (REDIS_FAILURE_MODE=local), so a failure here is an
/// error. These tests are about exactness, not speed: with both cores busy, 128 debug-build
/// decisions racing on one key took over 2 s (the first setting) and opened the breaker, so
/// calls may take up to 30 s.
pub fn redis_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_URL", url.into()),
        ("CACHE_KEY_PREFIX", "it:".into()),
        ("REDIS_TIMEOUT", "30s".into()),
        ("REDIS_FAILURE_MODE", "error".into()),
    ]
}

fn instance(rules: &Path, redis: &RedisServer) -> ServerProcess {
    ServerProcess::start(rules, &redis_env(&redis.addr()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_admit_exactly_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = shared_rules();
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
            "it:shared|fw=hot|0.1.3600s",
            "it:shared|sw=hot|0.2.3600s",
            "it:shared|tb=hot|0.0.3600s"
        ]
    );
}

#[tokio::test]
async fn a_restarted_instance_keeps_its_counters() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = shared_rules();
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
    let rules = shared_rules();
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
    let rules = shared_rules();
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_SOCKET_TYPE", "unix".into()),
        ("REDIS_URL", socket.clone()),
        ("CACHE_KEY_PREFIX", "sock:".into()),
    ];
    let mut server = ServerProcess::start(rules.path(), &env);
    assert_eq!(fire(server.client().await, "tb", "u".into(), 3, 1).await, 3);
    assert_eq!(redis.keys("sock:*"), ["sock:shared|tb=u|0.0.3600s"]);
}
