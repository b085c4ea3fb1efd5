//! A Redis that answers but refuses the counters' writes (out of memory under `noeviction`, a
//! read-only replica): the real binary at a user's defaults, a real redis-server reconfigured while
//! the server runs. Decisions go to the failure mode and stay there while it refuses (the
//! breaker's probe is a write, refused as decisions are: a `PING` probe brought them back to Redis
//! at every probe, or kept the breaker from ever opening), the log says what Redis answered, and
//! decisions go back to Redis once it takes writes again. With `REDIS_FAILURE_MODE=error` the
//! answer says what Redis answered, not that it is unreachable.

use crate::common;

use std::time::Duration;

use common::process::Served;
use common::redis::RedisServer;
use common::wait::BOUND;
use common::{Code, code, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;
use tonic::transport::Channel;

const RULES: &str = "domain: refuse\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

const TO_FAILURE_MODE: &str = "ratelimit_store_switches{to=\"failure_mode\"}";
const TO_REDIS: &str = "ratelimit_store_switches{to=\"redis\"}";
const REFUSED: &str = "ratelimit_redis_errors{kind=\"script\"}";

/// Probes refused after the switch before the test looks: about a second of them (a probe
/// refused at once is made again after the breaker's 100 ms).
const PROBES: u64 = 10;

/// The server on `redis` with `REDIS_FAILURE_MODE=mode`, its counters under `rf:`; and its rules
/// directory, to keep while it runs.
fn serve(redis: &RedisServer, mode: &str) -> (Served, tempfile::TempDir) {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("refuse.yaml"), RULES).unwrap();
    let env = [
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_URL", redis.addr()),
        ("REDIS_FAILURE_MODE", mode.to_owned()),
        ("CACHE_KEY_PREFIX", "rf:".to_owned()),
    ];
    (Served::with_env(rules.path(), &env), rules)
}

/// Requests of one descriptor each, with a value of its own (a key of its own in Redis).
struct Requests {
    client: RateLimitServiceClient<Channel>,
    sent: u64,
}

impl Requests {
    /// One request, answered OK (by Redis or the failure mode); the descriptor's value.
    async fn decide(&mut self) -> String {
        self.sent += 1;
        let value = format!("v{}", self.sent);
        let answer = self
            .client
            .should_rate_limit(request("refuse", &[&[("k", &value)]]))
            .await
            .expect("every request is answered")
            .into_inner();
        assert_eq!(code(answer.overall_code), Code::Ok);
        value
    }
}

/// The server on `redis` (the failure mode `local`): deciding on Redis; after
/// `refuse`, answered by the failure mode, switched once and logging `said`, through `PROBES`
/// refused probes, Redis's error said once where it switched and once as an error reply; after
/// `accept`, back on Redis.
async fn refused_then_taken_again(
    redis: &RedisServer,
    refuse: impl FnOnce(),
    said: &str,
    accept: impl FnOnce(),
) {
    let (mut server, rules) = serve(redis, "local");
    let mut requests = Requests {
        client: server.client().await,
        sent: 0,
    };
    let value = requests.decide().await;
    assert_eq!(redis.keys(&format!("rf:*={value}|*")).len(), 1);

    refuse();
    let started = monotonic();
    while server.metric(TO_FAILURE_MODE).await < 1 {
        assert!(
            started.elapsed() < BOUND,
            "never switched:\n{}",
            server.log()
        );
        requests.decide().await;
    }
    let refused = server.metric(REFUSED).await;
    while server.metric(REFUSED).await < refused + PROBES {
        assert!(started.elapsed() < BOUND, "no probes:\n{}", server.log());
        requests.decide().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.metric(TO_REDIS).await,
        0,
        "back on Redis at a probe while Redis refuses writes:\n{}",
        server.log()
    );
    assert_eq!(server.metric(TO_FAILURE_MODE).await, 1);
    assert_eq!(server.metric("ratelimit_store_up").await, 0);
    let log = server.log();
    let switch_said = |line: &&str| line.contains("last_error=") && line.contains(said);
    assert_eq!(log.lines().filter(switch_said).count(), 1, "{log}");
    let error_said =
        |line: &&str| line.contains("answered a call with an error") && line.contains(said);
    assert_eq!(log.lines().filter(error_said).count(), 1, "{log}");

    accept();
    server.wait_for_metric(TO_REDIS, 1).await;
    let value = requests.decide().await;
    assert_eq!(redis.keys(&format!("rf:*={value}|*")).len(), 1);
    drop(rules);
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_out_of_memory_keeps_decisions_on_the_failure_mode_and_says_why() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let config = |field: &str, value: &str| {
        redis.cli(&["CONFIG", "SET", field, value]).unwrap();
    };
    refused_then_taken_again(
        &redis,
        || {
            config("maxmemory-policy", "noeviction");
            config("maxmemory", "1");
        },
        "OOM",
        || config("maxmemory", "0"),
    )
    .await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_turned_read_only_replica_keeps_decisions_on_the_failure_mode_and_says_why() {
    let (Some(redis), Some(master)) = (RedisServer::start(), RedisServer::start()) else {
        return;
    };
    let port = master.addr().rsplit_once(':').unwrap().1.to_owned();
    refused_then_taken_again(
        &redis,
        || {
            redis.cli(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
        },
        "read only replica",
        || {
            redis.cli(&["REPLICAOF", "NO", "ONE"]).unwrap();
        },
    )
    .await;
}

/// With `REDIS_FAILURE_MODE=error`, a call answered while the breaker is open says what Redis
/// answered last (it used to say "Redis is unreachable" of a Redis answering every call).
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn in_error_mode_a_refusing_redis_is_said_to_refuse_not_to_be_unreachable() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (mut server, rules) = serve(&redis, "error");
    let mut client = server.client().await;
    redis
        .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let started = monotonic();
    let message = loop {
        assert!(started.elapsed() < BOUND, "never down:\n{}", server.log());
        let refused = client
            .should_rate_limit(request("refuse", &[&[("k", "v")]]))
            .await
            .expect_err("Redis refuses the call");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        if !refused.message().contains("call failed") {
            break refused.message().to_owned();
        }
    };
    assert!(
        message.contains("is down, its calls failing") && message.contains("OOM"),
        "{message}"
    );
    drop(rules);
}
