//! Real server processes (the built binary) sharing one redis-server: racing gRPC traffic against
//! two and three of them admits exactly the limit, with the defaults a user gets, also while busy
//! loops hold every core; and a restarted instance keeps its counters.

use crate::common;

use std::path::Path;

use common::metrics;
use common::process::Served;
use common::race::{BusyLoops, SHARED_LIMITS, fire, shared_rules};
use common::redis::RedisServer;
use common::request;

/// The Redis settings of these tests: everything else (REDIS_TIMEOUT 100 ms, REDIS_FAILURE_MODE
/// local) is the default a user gets, so an answer from the failure mode shows as an admission
/// over the limit, and is counted.
pub fn redis_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_URL", url.into()),
        ("CACHE_KEY_PREFIX", "it:".into()),
    ]
}

fn instance(rules: &Path, redis: &RedisServer) -> Served {
    Served::with_env(rules, &redis_env(&redis.addr()))
}

async fn race(instances: usize) {
    race_with(instances, RedisServer::start, || ()).await;
}

/// `instances` servers on one Redis (as `start` starts it), each sent 1000 requests per key of
/// `SHARED_RULES`, 256 in flight, while what `during` starts runs: together they admit exactly
/// each key's limit, and nothing was answered by the failure mode or failed. Returns the server.
pub async fn race_with<T>(
    instances: usize,
    start: fn() -> Option<RedisServer>,
    during: impl FnOnce() -> T,
) -> Option<RedisServer> {
    // One heavy load at a time: each race is several server processes with hundreds of calls in
    // flight.
    let _turn = crate::common::race::heavy_load_turn().await;
    let redis = start()?;
    let _during = during();
    let rules = shared_rules();
    let mut servers: Vec<Served> = (0..instances)
        .map(|_| instance(rules.path(), &redis))
        .collect();
    let mut clients = Vec::new();
    for s in &mut servers {
        clients.push(s.client().await);
    }
    // Each counts the others (their heartbeat), so that an answer of the failure mode, were
    // one to happen, would keep only this instance's share of what is left.
    for s in &servers {
        s.wait_for_metric("ratelimit_redis_instances", instances as u64)
            .await;
    }
    for (key, limit) in SHARED_LIMITS {
        let runs = clients
            .iter()
            .map(|c| tokio::spawn(fire(c.clone(), key, "hot".into(), 1000, 256)));
        let mut admitted = Vec::new();
        for run in runs.collect::<Vec<_>>() {
            admitted.push(run.await.unwrap());
        }
        eprintln!("{key}: admitted per instance {admitted:?}");
        if admitted.iter().sum::<usize>() != limit {
            let mut why = Vec::new();
            for s in &servers {
                let page = metrics::scrape(&format!("{}/metrics", s.http)).await;
                why.push(format!(
                    "failure-mode decisions {}, Redis errors {}",
                    metrics::sum(&page, "ratelimit_store_failure_mode_decisions"),
                    metrics::sum(&page, "ratelimit_redis_errors"),
                ));
            }
            // Said in the panic's own line: CI keeps a log's head and tail, not the middle.
            panic!(
                "{key}: {instances} × 1000 racing requests, 256 in flight each, admitted \
                 {admitted:?} of {limit}; per instance: {why:?}"
            );
        }
    }
    for s in &servers {
        let page = metrics::scrape(&format!("{}/metrics", s.http)).await;
        for name in [
            "ratelimit_store_failure_mode_decisions",
            "ratelimit_store_errors",
            "ratelimit_redis_errors",
            "ratelimit_redis_decisions_over_budget",
        ] {
            assert_eq!(metrics::sum(&page, name), 0.0, "{name}");
        }
        assert!(
            metrics::sum(&page, "ratelimit_redis_batch_requests_count")
                < metrics::sum(&page, "ratelimit_redis_batch_requests_sum"),
            "requests on the hot key were decided together"
        );
    }
    let mut keys = redis.keys("it:*");
    keys.sort();
    assert_eq!(
        keys,
        [
            "it:shared|fw=hot|0.1.3600s",
            "it:shared|lb=hot|0.3.86400s",
            "it:shared|sw=hot|0.2.3600s",
            "it:shared|tb=hot|0.0.3600s"
        ]
    );
    Some(redis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_admit_exactly_the_limit() {
    race(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_racing_admit_exactly_the_limit() {
    race(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn two_instances_racing_while_busy_loops_hold_every_core_admit_exactly_the_limit() {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    race_with(2, RedisServer::start, || BusyLoops::start(cores)).await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
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
        let mut served = Served::with_env(
            rules.path(),
            &[
                ("BACKEND_TYPE", "redis".to_owned()),
                ("REDIS_TLS", "true".to_owned()),
                (env.0, env.1.to_owned()),
            ],
        );
        assert!(!served.wait_exit().success(), "{env:?}");
        let stderr = served.log();
        assert!(
            stderr.contains(named) || stderr.contains(&named.to_lowercase().replace('_', "-")),
            "{env:?}: {stderr}"
        );
    }
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
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
    let mut server = Served::with_env(rules.path(), &env);
    assert_eq!(fire(server.client().await, "tb", "u".into(), 3, 1).await, 3);
    assert_eq!(redis.keys("sock:*"), ["sock:shared|tb=u|0.0.3600s"]);
}
