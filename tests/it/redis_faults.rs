//! Redis far away, refusing us, or gone: a real redis-server behind a latency proxy
//! (`common::proxy`), and the real server binary, at the defaults a user gets: connecting is
//! bounded per call, not the whole pool by one `REDIS_TIMEOUT`; a refusal stops start-up however
//! far Redis is; while disconnected the server keeps saying so (rate-limited) and counts its
//! attempts; a Redis slower than Envoy's filter waits is counted and warned about; one that turns
//! connections away (`maxclients`) is said to.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::metrics::{labelled, scrape};
use common::process::Served;
use common::proxy::LatencyProxy;
use common::redis::{RedisServer, free_port};
use common::wait::eventually;
use common::{Code, code, request};

const RULES: &str = "domain: far\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: load\n    rate_limit: {unit: hour, requests_per_unit: 100000000}\n";

/// One way, so a round trip is 50 ms: within the default 100 ms `REDIS_TIMEOUT`, but a pool of
/// four connections made one by one (TCP, then the client's set-up commands) is not: Redis at this
/// distance must still be used.
const ONE_WAY: Duration = Duration::from_millis(25);

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("far.yaml"), RULES).unwrap();
    dir
}

fn env(redis: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_URL", redis.into()),
        ("CACHE_KEY_PREFIX", "far:".into()),
    ];
    env.extend_from_slice(extra);
    env
}

fn upstream(redis: &RedisServer) -> SocketAddr {
    redis.addr().parse().unwrap()
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_25_ms_away_at_the_default_timeout_is_connected_and_decides() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let proxy = LatencyProxy::start(upstream(&redis), ONE_WAY);
    let rules = rules();
    let mut server = Served::with_env(rules.path(), &env(&proxy.addr(), &[]));
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = client
            .should_rate_limit(request("far", &[&[("k", "v")]]))
            .await
            .expect("answered")
            .into_inner();
        codes.push(code(r.overall_code));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    let page = scrape(&format!("{}/metrics", server.http)).await;
    assert_eq!(
        common::metrics::count(&page, "ratelimit_store_up"),
        1,
        "decided on Redis"
    );
    assert_eq!(
        common::metrics::sum(&page, "ratelimit_store_failure_mode_decisions"),
        0.0
    );
    assert_eq!(
        labelled(&page, "ratelimit_redis_connects", "outcome=\"connected\""),
        1
    );
    assert_eq!(redis.keys("far:*"), ["far:far|k=v|0.0.3600s"]);
    // 50 ms calls are past Envoy's default 20 ms filter timeout: counted, and said once.
    assert!(common::metrics::count(&page, "ratelimit_redis_slow_calls") >= 4);
    assert_eq!(
        server.log_lines("longer than Envoy's default ratelimit filter timeout"),
        1,
        "{}",
        server.log()
    );
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_wrong_password_stops_start_up_however_far_redis_is() {
    assert!(common::redis::available());
    let redis = RedisServer::spawn(
        free_port(),
        &["--requirepass", "right-pass"],
        ["-a", "right-pass", "--no-auth-warning"]
            .map(String::from)
            .to_vec(),
    );
    let proxy = LatencyProxy::start(upstream(&redis), ONE_WAY);
    let rules = rules();
    let log = Served::refused(
        rules.path(),
        &env(&proxy.addr(), &[("REDIS_AUTH", "wrong-pass".into())]),
    );
    assert!(
        log.contains("Redis refuses this server (authentication)"),
        "{log}"
    );
}

#[tokio::test]
async fn while_redis_is_unreachable_the_server_counts_its_attempts_and_keeps_saying_so() {
    // Nothing listens on the port: every attempt is refused at once.
    let port = free_port();
    let rules = rules();
    let mut server = Served::with_env(
        rules.path(),
        &env(
            &format!("127.0.0.1:{port}"),
            &[("REDIS_FAILURE_MODE", "deny".into())],
        ),
    );
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("far", &[&[("k", "v")]]))
        .await
        .expect("answered by the failure mode")
        .into_inner();
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let metrics = format!("{}/metrics", server.http);
    eventually("four attempts to connect", || async {
        labelled(
            &scrape(&metrics).await,
            "ratelimit_redis_connects",
            "outcome=\"unreachable\"",
        ) >= 4
    })
    .await;
    assert_eq!(server.log_lines("REDIS IS UNREACHABLE AT START-UP"), 1);
    // Said again in the background (at once, then every 30 s), not once per attempt.
    assert_eq!(
        server.log_lines("Redis still unreachable"),
        1,
        "{}",
        server.log()
    );
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn connections_cut_now_and_then_do_not_open_the_breaker_and_are_said_once_a_minute() {
    let _turn = crate::common::race::heavy_load_turn().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Each connection is cut after 25 replies: its calls in flight fail at once, while the
    // pool's other connections keep answering.
    let proxy = LatencyProxy::cutting(upstream(&redis), 25);
    let rules = rules();
    let mut server = Served::with_env(rules.path(), &env(&proxy.addr(), &[]));
    let client = server.client().await;
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let mut client = client.clone();
            tokio::spawn(async move {
                for i in 0..150 {
                    let value = format!("{}", (t * 150 + i) % 40);
                    let _ = client
                        .should_rate_limit(request("far", &[&[("load", value.as_str())]]))
                        .await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let page = scrape(&format!("{}/metrics", server.http)).await;
    let failure_mode = common::metrics::sum(&page, "ratelimit_store_failure_mode_decisions");
    eprintln!(
        "cuts {}, connection errors {}, retries {}, failure-mode answers {failure_mode}",
        proxy.cuts(),
        labelled(&page, "ratelimit_redis_errors", "kind=\"connection\""),
        common::metrics::count(&page, "ratelimit_redis_retries"),
    );
    assert!(
        proxy.cuts() >= 3,
        "the proxy cut {} connections",
        proxy.cuts()
    );
    assert_eq!(
        labelled(&page, "ratelimit_store_switches", "to=\"failure_mode\""),
        0,
        "the breaker opened:\n{}",
        server.log()
    );
    assert_eq!(common::metrics::count(&page, "ratelimit_store_up"), 1);
    // A call on a cut connection is sent once more while the others answer: most of them are
    // then decided by Redis, not the failure mode.
    let errors = labelled(&page, "ratelimit_redis_errors", "kind=\"connection\"");
    assert!(common::metrics::count(&page, "ratelimit_redis_retries") > 0);
    assert!(
        (failure_mode as u64) * 2 < errors,
        "{failure_mode} failure-mode answers for {errors} connection errors"
    );
    // No breaker opened to say it, so the failed calls say it themselves, once a minute.
    assert_eq!(
        server.log_lines("a Redis call failed without an answer"),
        1,
        "{}",
        server.log()
    );
}

/// Redis reaching its `maxclients` while the server runs (another program took the slots; here
/// the test holds the one left) and the server's connections cut: Redis writes `ERR max number of
/// clients reached` on each fresh connection and closes it, which redis-rs reads as a broken pipe.
/// The switch to the failure mode says `broken pipe`; the failed fresh connections then say what
/// Redis wrote (at once, then every 30 s), and decisions are back on Redis once it takes clients.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_at_maxclients_while_serving_is_said_to_turn_connections_away() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let mut server = Served::with_env(rules.path(), &env(&redis.addr(), &[]));
    let mut client = server.client().await;
    let mut decide = async || {
        let r = client
            .should_rate_limit(request("far", &[&[("load", "v")]]))
            .await
            .expect("answered, by Redis or the failure mode")
            .into_inner();
        assert_eq!(code(r.overall_code), Code::Ok);
    };
    decide().await;
    let mut held = redis.hold();
    assert_eq!(held.command(&["CONFIG", "SET", "maxclients", "1"]), "+OK");
    held.command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let said = "Redis turned the connection away: ERR max number of clients reached";
    let started = ratelimit_server::clock::monotonic();
    while server.log_lines(said) == 0 {
        assert!(
            started.elapsed() < common::wait::BOUND,
            "never said:\n{}",
            server.log()
        );
        decide().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.metric("ratelimit_store_up").await, 0);
    assert_eq!(server.log_lines(said), 1, "{}", server.log());
    assert_eq!(
        held.command(&["CONFIG", "SET", "maxclients", "10000"]),
        "+OK"
    );
    server
        .wait_for_metric("ratelimit_store_switches{to=\"redis\"}", 1)
        .await;
    decide().await;
}
