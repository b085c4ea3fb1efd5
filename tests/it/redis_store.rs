//! The store contract, run against the memory store and the Redis store (a real redis-server
//! started per test): the same traces give the same verdicts for all four algorithms, with
//! hits_addend, several limits per descriptor, shadow (unenforced) charges, all-or-nothing and
//! expiry. Then what only a shared store has: two store instances racing on one Redis admit exactly
//! the limit, keys expire when their state is gone, clock skew between instances, refunds.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::contract::{charges, key, memory_store, params, redis_store, run, trace};
use common::redis::RedisServer;
use ratelimit_redis::testing::EXPIRY_GRACE_MS;
use ratelimit_server::clock::monotonic;
use ratelimit_server::clock::{Clock, NANOS_PER_SECOND as S, SystemClock};
use ratelimit_server::config::Algorithm;
use ratelimit_server::store::redis::{RedisBackend, RedisConfig};
use ratelimit_server::store::{Backend, Charge, Store};

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn memory_and_redis_give_the_same_verdicts_for_every_algorithm() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for seed in [1u64, 7, 42] {
            let steps = trace(seed * 1000 + i as u64 + 1, algorithm, 120);
            let memory = memory_store(10_000);
            let shared = redis_store(&redis, &format!("t{i}-{seed}:")).await;
            // Each trace from now: Redis expires keys by its own clock (PXAT, with
            // EXPIRY_GRACE_MS), so a trace's times must not fall behind the real time by more
            // than that, as the later traces' would from one start on a slow machine.
            let base = SystemClock.now();
            let expected = run(&memory, base, &steps).await;
            let got = run(&shared, base, &steps).await;
            for (n, (e, g)) in expected.iter().zip(&got).enumerate() {
                assert_eq!(e, g, "{algorithm} seed {seed} step {n}: {:?}", steps[n]);
            }
            let admitted = got.iter().flatten().filter(|v| v.charged).count();
            let denied = got.iter().flatten().filter(|v| !v.allowed).count();
            assert!(
                admitted > 10 && denied > 10,
                "{algorithm}: a trace that says something ({admitted} admitted, {denied} denied)"
            );
        }
    }
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn windows_that_count_denied_hits_count_them_alike_on_memory_and_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        // Each trace from now (Redis expires keys by its own clock; see above).
        let base = SystemClock.now();
        let mut steps = trace(99, algorithm, 120);
        for (_, specs) in &mut steps {
            for spec in specs.iter_mut() {
                spec.2.charge_denied = true;
            }
        }
        let memory = memory_store(10_000);
        let shared = redis_store(&redis, &format!("cd-{algorithm}:")).await;
        let expected = run(&memory, base, &steps).await;
        let got = run(&shared, base, &steps).await;
        for (n, (e, g)) in expected.iter().zip(&got).enumerate() {
            assert_eq!(e, g, "{algorithm} step {n}: {:?}", steps[n]);
        }
        let denied_but_counted = got
            .iter()
            .flatten()
            .filter(|v| !v.allowed && v.charged)
            .count();
        assert!(
            denied_but_counted > 10,
            "{algorithm}: denied hits are counted ({denied_but_counted})"
        );
    }
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn all_or_nothing_shadow_and_hits_addend_on_both_stores() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let now = SystemClock.now();
    // Room for every key: the store caps keys per shard (of 128), and a key evicted by another
    // in its shard would read as untouched.
    all_or_nothing_on(memory_store(10_000), now).await;
    all_or_nothing_on(redis_store(&redis, "aon:").await, now).await;
}

async fn all_or_nothing_on<B: Backend>(store: Store<B>, now: u64) {
    let roomy = params(Algorithm::FixedWindow, 10, 3600, 10);
    let tight = params(Algorithm::FixedWindow, 1, 3600, 1);
    {
        let name = B::NAME;
        let both = [("a", 0, roomy, 1, true), ("b", 0, tight, 1, true)];
        let v = store.apply(&charges(&store, &both), now).await.unwrap();
        assert!(v.iter().all(|v| v.charged), "{name}");
        // b is full: the request is denied and a is not charged.
        let v = store.apply(&charges(&store, &both), now).await.unwrap();
        assert!(
            v[0].allowed && !v[0].charged && !v[1].allowed,
            "{name}: {v:?}"
        );
        assert_eq!(v[0].outlook.remaining, 9, "{name}: a untouched");
        // A shadow (unenforced) denial does not stop the rest.
        let shadow = [("a", 0, roomy, 1, true), ("b", 0, tight, 1, false)];
        let v = store.apply(&charges(&store, &shadow), now).await.unwrap();
        assert!(v[0].charged && !v[1].allowed, "{name}: {v:?}");
        assert_eq!(v[0].outlook.remaining, 8, "{name}");
        // hits_addend: 8 fit exactly, then 1 more does not; 0 only looks.
        let v = store
            .apply(&charges(&store, &[("a", 0, roomy, 8, true)]), now)
            .await
            .unwrap();
        assert!(v[0].charged && v[0].outlook.remaining == 0, "{name}: {v:?}");
        let v = store
            .apply(&charges(&store, &[("a", 0, roomy, 0, true)]), now)
            .await
            .unwrap();
        assert!(v[0].allowed && v[0].outlook.remaining == 0, "{name}: {v:?}");
        let v = store
            .apply(&charges(&store, &[("a", 0, roomy, 1, true)]), now)
            .await
            .unwrap();
        assert!(!v[0].allowed, "{name}");
        // Several limits on one descriptor: slot 1 is a separate counter.
        let v = store
            .apply(&charges(&store, &[("a", 1, roomy, 1, true)]), now)
            .await
            .unwrap();
        assert_eq!(v[0].outlook.remaining, 9, "{name}");
    }
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn keys_are_readable_and_expire_when_their_state_does() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis_store(&redis, "rl:").await;
    let now = SystemClock.now();
    let window = params(Algorithm::FixedWindow, 5, 2, 5);
    store
        .apply(&charges(&store, &[("alice", 0, window, 1, true)]), now)
        .await
        .unwrap();
    let keys = redis.keys("rl:*");
    assert_eq!(keys, ["rl:contract|user=alice|0.1.2s"]);
    // The fixed window's state is gone at the window's end: PXAT = end + grace.
    let expire_ms: u64 = redis
        .cli(&["PEXPIRETIME", &keys[0]])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let end_ms = (now - now % (2 * S) + 2 * S) / 1_000_000;
    assert_eq!(expire_ms, end_ms + EXPIRY_GRACE_MS);
    // The state, then the writer's tag (`;writer.seq`) that makes each write unique to its call,
    // then the key's expiry as set (`;pxat`), with which the script can put the value back as it
    // was.
    let raw = redis.cli(&["GET", &keys[0]]).unwrap();
    let parts: Vec<&str> = raw.trim().split(';').collect();
    let [state, tag, pxat] = parts[..] else {
        panic!("state;writer.seq;pxat, got {raw}")
    };
    assert_eq!(state, format!("{}:1", end_ms * 1_000_000));
    assert!(tag.contains('.'), "{tag}");
    assert_eq!(pxat.parse::<u64>().ok(), Some(expire_ms));
    // A token bucket refills in period/rpu per hit: its key lives that long.
    let bucket = params(Algorithm::TokenBucket, 10, 10, 10);
    store
        .apply(&charges(&store, &[("bob", 0, bucket, 3, true)]), now)
        .await
        .unwrap();
    let pttl: i64 = redis
        .cli(&["PTTL", "rl:contract|user=bob|0.0.10s"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        (2_000..=3_000 + EXPIRY_GRACE_MS as i64).contains(&pttl),
        "3 hits of a 1/s refill: ~3 s + grace, got {pttl} ms"
    );
    tokio::time::sleep(Duration::from_millis(4_000 + EXPIRY_GRACE_MS)).await;
    assert!(redis.keys("rl:*").is_empty(), "idle keys leave Redis");
}

async fn race(redis: &RedisServer, algorithm: Algorithm, limit: u32, per_instance: usize) -> usize {
    let config = RedisConfig::single(&redis.url())
        .unwrap()
        .with_prefix(format!("race-{}:", algorithm.code()));
    let a = Arc::new(Store::new(RedisBackend::connect(&config).await.unwrap()));
    let b = Arc::new(Store::new(RedisBackend::connect(&config).await.unwrap()));
    let p = params(algorithm, limit, 3600, limit);
    let mut tasks = Vec::new();
    for store in [a.clone(), b.clone()] {
        for _ in 0..per_instance {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = key(&store, "race", [("k", "hot")], 0, &p);
                let charge = Charge {
                    key,
                    params: p,
                    hits: 1,
                    enforced: true,
                    quota: None,
                };
                store
                    .apply(&[charge], SystemClock.now())
                    .await
                    .expect("decided")[0]
                    .charged
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    eprintln!(
        "{algorithm}: {admitted} admitted; conflicts retried: {} + {}",
        a.backend().conflicts(),
        b.backend().conflicts()
    );
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn two_store_instances_racing_on_one_redis_admit_exactly_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::LeakyBucket {
            continue; // its turns are delays of up to max_delay: covered by the refund test
        }
        assert_eq!(race(&redis, algorithm, 50, 200).await, 50, "{algorithm}");
    }
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn clock_skew_between_instances_costs_at_most_rate_times_skew() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Two instances whose clocks differ by 300 ms share a 10/s bucket of burst 10: the one ahead
    // sees up to 3 more tokens than the other (0.3 s × 10/s), never more.
    let store = redis_store(&redis, "skew:").await;
    let p = params(Algorithm::TokenBucket, 10, 1, 10);
    let base = SystemClock.now();
    let skew = 300_000_000;
    let mut admitted = 0;
    for i in 0..40u64 {
        // Both instances hit the same key within the same real 10 ms.
        let now = base + i / 2 * 10_000_000 + if i % 2 == 0 { 0 } else { skew };
        let v = store
            .apply(&charges(&store, &[("shared", 0, p, 1, true)]), now)
            .await
            .unwrap();
        admitted += usize::from(v[0].charged);
    }
    // In 0.2 s of real time an exact bucket admits 10 + 2; the skew adds at most 3.
    assert!((11..=15).contains(&admitted), "admitted {admitted}");
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_leaky_bucket_turn_is_given_back_through_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis_store(&redis, "leak:").await;
    let p = params(Algorithm::LeakyBucket, 1, 1, 3);
    let now = SystemClock.now();
    let one = charges(&store, &[("q", 0, p, 1, true)]);
    let delays: Vec<u64> = {
        let mut d = Vec::new();
        for _ in 0..3 {
            d.push(store.apply(&one, now).await.unwrap()[0].delay);
        }
        d
    };
    assert_eq!(delays, [0, S, 2 * S], "queued turns, one per second");
    assert!(
        !store.apply(&one, now).await.unwrap()[0].allowed,
        "queue full"
    );
    store.refund(&one, now);
    // The refund runs in a task of its own; the freed turn comes back.
    let started = monotonic();
    loop {
        let v = store.apply(&one, now).await.unwrap();
        if v[0].allowed {
            assert_eq!(v[0].delay, 2 * S);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "refund never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Calls of `command` since the last `CONFIG RESETSTAT` (INFO commandstats).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info = redis.info("commandstats");
    let Some(line) = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return 0;
    };
    line.split(['=', ','])
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("calls=N")
}

/// Round trips of decisions since the last [`RedisServer::count_commands`]: `MGET`s, scripts and
/// plain compare-and-sets (a `SET` or a denial's `GET` sent by a client, not run by a script).
fn round_trips(redis: &RedisServer) -> u64 {
    redis.commands_sent(&["mget", "evalsha", "eval", "set"]) + redis.counter_gets_sent()
}

async fn decide_one(
    store: &Store<RedisBackend>,
    value: &str,
    p: &ratelimit_server::limiter::LimitParams,
) -> bool {
    let key = key(store, "trips", [("k", value)], 0, p);
    let charge = Charge {
        key,
        params: *p,
        hits: 1,
        enforced: true,
        quota: None,
    };
    store
        .apply(&[charge], SystemClock.now())
        .await
        .expect("decided")[0]
        .charged
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_repeated_key_costs_one_round_trip_per_decision_and_a_stale_cache_stays_exact() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let config = RedisConfig::single(&redis.url())
        .unwrap()
        .with_prefix("trips:");
    let a = Store::new(RedisBackend::connect(&config).await.unwrap());
    let b = Store::new(RedisBackend::connect(&config).await.unwrap());
    // Token bucket, 10 per hour: no refill worth a token during the test.
    let p = params(Algorithm::TokenBucket, 10, 3600, 10);
    // Loads the script; then counts from zero.
    let warm = params(Algorithm::TokenBucket, 10, 3600, 11);
    decide_one(&a, "warm", &warm).await;
    decide_one(&b, "warm", &warm).await;
    redis.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    redis.count_commands();

    // One instance, one in flight: the first decision on a new key expects it absent (right), the
    // rest expect what this instance wrote. Admitted or denied, one round trip each.
    let mut admitted = 0;
    for _ in 0..6 {
        admitted += usize::from(decide_one(&a, "hot", &p).await);
    }
    assert_eq!(admitted, 6);
    assert_eq!(
        round_trips(&redis),
        6,
        "one round trip per admitted decision"
    );
    assert_eq!(calls(&redis, "mget"), 0);

    // Another instance writes in between: each instance's cache is then stale (b's never saw
    // the key). Verdicts stay exact: 4 more admitted in all, then denials, whoever asks.
    let mut verdicts = Vec::new();
    for i in 0..10 {
        let store = if i % 3 == 0 { &a } else { &b };
        verdicts.push(decide_one(store, "hot", &p).await);
    }
    assert_eq!(
        verdicts,
        [
            true, true, true, true, false, false, false, false, false, false
        ]
    );
    let stale = round_trips(&redis) - 6;
    assert!(
        (10..=20).contains(&stale),
        "a stale cache costs one more round trip, not more: {stale}"
    );

    // Denials on a cache that is right cost one round trip too (a check, no write).
    redis.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    redis.count_commands();
    for _ in 0..5 {
        assert!(!decide_one(&b, "hot", &p).await);
    }
    assert_eq!(round_trips(&redis), 5, "one round trip per denied decision");
    assert_eq!(
        redis.counter_gets_sent(),
        5,
        "a denial's check is a plain GET"
    );
    assert_eq!(redis.commands_sent(&["evalsha", "eval"]), 0, "no script");
}

/// A key that holds another type (a list written under the store's prefix) fails only its own
/// decision: its compare-and-set, a plain `SET … NX … GET` here (the key is expected absent), gets
/// Redis's `WRONGTYPE`, and the decisions on other keys made at the same moment, which share its
/// pipelines, are answered.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_key_of_another_type_fails_only_its_own_decision() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = Arc::new(redis_store(&redis, "wt:").await);
    let now = SystemClock.now();
    let window = params(Algorithm::FixedWindow, 5, 2, 5);
    redis
        .cli(&["RPUSH", "wt:contract|user=mallory|0.1.2s", "x"])
        .unwrap();
    const USERS: [&str; 21] = [
        "mallory", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9", "u10", "u11", "u12",
        "u13", "u14", "u15", "u16", "u17", "u18", "u19",
    ];
    let users = USERS;
    let tasks: Vec<_> = users
        .iter()
        .map(|user| {
            let charge = charges(&store, &[(*user, 0, window, 1, true)]);
            let store = store.clone();
            tokio::spawn(async move { store.apply(&charge, now).await })
        })
        .collect();
    for (user, task) in users.iter().zip(tasks) {
        let answer = task.await.unwrap();
        if *user == "mallory" {
            // Failed by the failure mode (`error` here), saying what Redis answered rather than
            // that Redis is unreachable.
            let message = answer.expect_err("a list is no counter").to_string();
            assert!(
                message.contains("WRONGTYPE") && message.contains("REDIS_FAILURE_MODE=error"),
                "{message}"
            );
        } else {
            assert!(answer.expect("answered")[0].allowed, "{user}");
        }
    }
    assert_eq!(
        redis
            .cli(&["TYPE", "wt:contract|user=mallory|0.1.2s"])
            .unwrap()
            .trim(),
        "list",
        "left as it was"
    );
}

/// A counter whose key holds a string no instance writes (an empty one, or another writer's text
/// that is no state), with no expiry, is decided as holding no state and written over: admitted,
/// counted from there, and denied past its limit, none of it failing. An empty string was once
/// read as "absent" by the compare-and-set and never matched: every decision on the key failed
/// (conflicts exhausted) for as long as the key lived.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_key_holding_an_empty_or_foreign_string_is_written_over() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis_store(&redis, "es:").await;
    let window = params(Algorithm::FixedWindow, 3, 60, 3);
    for (user, held) in [("empty", ""), ("junk", "junk"), ("half", "12:x;ab.1")] {
        let key = format!("es:contract|user={user}|0.1.60s");
        redis.cli(&["SET", &key, held]).unwrap();
        // Past the limit without a write first (a denial's check, on the key as it is).
        let over = charges(&store, &[(user, 0, window, 4, true)]);
        let verdicts = store.apply(&over, SystemClock.now()).await;
        assert!(!verdicts.expect(user)[0].allowed, "{user}: 4 of 3");
        let mut admitted = Vec::new();
        for _ in 0..4 {
            let one = charges(&store, &[(user, 0, window, 1, true)]);
            let verdicts = store.apply(&one, SystemClock.now()).await;
            admitted.push(verdicts.expect(user)[0].allowed);
        }
        assert_eq!(admitted, [true, true, true, false], "{user}");
        let now_held = redis.cli(&["GET", &key]).unwrap();
        assert_ne!(now_held.trim(), held, "{user}: written over");
        let ttl: i64 = redis.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
        assert!(ttl > 0, "{user}: it expires now ({ttl})");
    }
}
