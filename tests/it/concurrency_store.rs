//! Concurrency leases at the store seam: the memory and Redis backends give the same answers to
//! the same calls (the pure rules in `ratelimit_core::lease`), and on Redis several instances
//! share one limit exactly: a slot taken through one is given back through another, and leases
//! end by their lease there too.

use crate::common;

use std::time::Duration;

use common::contract::{memory_store, redis_store};
use common::redis::RedisServer;
use common::wait::eventually_within;
use ratelimit_server::clock::{Clock, NANOS_PER_SECOND as S, SystemClock};
use ratelimit_server::lease::{LeaseAction, LeaseAnswer, LeaseOutcome, LeaseParams};
use ratelimit_server::store::{Backend, Entries, LeaseCall, Store, concurrency_counter};

const PARAMS: LeaseParams = LeaseParams {
    max_in_flight: 3,
    lease: 10 * S,
};

/// The concurrency key of `api_key=<value>` in `store`.
fn key_of<B: Backend>(store: &Store<B>, value: &str) -> B::Key {
    let entries = [("api_key", value)];
    store.key(&concurrency_counter("d", Entries::from(&entries)))
}

async fn call<B: Backend>(
    store: &Store<B>,
    key: &B::Key,
    action: LeaseAction,
    id: &str,
    now: u64,
) -> LeaseAnswer {
    store
        .lease(LeaseCall {
            key,
            id,
            action,
            params: PARAMS,
            now,
            watch: None,
        })
        .await
        .expect("a lease call")
}

/// A trace of calls on two keys, with time moving on: (key, action, request id, seconds later).
fn trace() -> Vec<(&'static str, LeaseAction, String, u64)> {
    use LeaseAction::{Acquire, Peek, Release};
    let mut steps = Vec::new();
    let mut seed = 7u64;
    for n in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = if seed >> 63 == 0 { "k1" } else { "k2" };
        let action = match (seed >> 40) % 7 {
            0..=3 => Acquire,
            4 | 5 => Release,
            _ => Peek,
        };
        // Releases name one of the recent ids (held, denied, expired or released already), and
        // some acquisitions do too (a retried call renews its lease).
        let recent = format!("r{}", n - ((seed >> 20) % 6).min(n));
        let id = match action {
            Release => recent,
            Acquire if (seed >> 30).is_multiple_of(4) => recent,
            _ => format!("r{n}"),
        };
        steps.push((key, action, id, (seed >> 10) % 3));
    }
    steps
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn memory_and_redis_give_the_same_lease_answers() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let memory = memory_store(1000);
    let shared = redis_store(&redis, "lease:").await;
    // Whole milliseconds: Redis keeps lease ends in ms.
    let mut now = SystemClock.now() / 1_000_000 * 1_000_000;
    let mut outcomes = [0usize; 6];
    for (n, (value, action, id, later)) in trace().into_iter().enumerate() {
        now += later * S;
        let m = call(&memory, &key_of(&memory, value), action, &id, now).await;
        let r = call(&shared, &key_of(&shared, value), action, &id, now).await;
        assert_eq!(m, r, "step {n}: {value} {action:?} {id}");
        outcomes[LeaseOutcome::ALL
            .iter()
            .position(|o| *o == m.outcome)
            .unwrap()] += 1;
    }
    assert!(
        outcomes.iter().all(|n| *n > 3),
        "a trace that says something: {outcomes:?} (taken, renewed, denied, released, unknown, peeked)"
    );
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn instances_on_one_redis_share_the_slots_and_release_each_others() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (
        redis_store(&redis, "two:").await,
        redis_store(&redis, "two:").await,
    );
    let now = SystemClock.now();
    let (ka, kb) = (key_of(&a, "k1"), key_of(&b, "k1"));
    use LeaseAction::{Acquire, Release};
    assert_eq!(
        call(&a, &ka, Acquire, "x", now).await.outcome,
        LeaseOutcome::Taken
    );
    assert_eq!(
        call(&b, &kb, Acquire, "y", now).await.outcome,
        LeaseOutcome::Taken
    );
    assert_eq!(
        call(&a, &ka, Acquire, "z", now).await.outcome,
        LeaseOutcome::Taken
    );
    let full = call(&b, &kb, Acquire, "w", now).await;
    assert_eq!((full.outcome, full.in_use), (LeaseOutcome::Denied, 3));
    // x was taken through a, and is given back through b.
    assert_eq!(
        call(&b, &kb, Release, "x", now).await.outcome,
        LeaseOutcome::Released
    );
    assert_eq!(
        call(&a, &ka, Release, "x", now).await.outcome,
        LeaseOutcome::Unknown
    );
    assert_eq!(
        call(&a, &ka, Acquire, "w", now).await.outcome,
        LeaseOutcome::Taken
    );
    assert_eq!(redis.keys("two:*").len(), 1, "{:?}", redis.keys("two:*"));
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn redis_drops_a_key_whose_leases_all_ended() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis_store(&redis, "ttl:").await;
    let key = key_of(&store, "k1");
    let short = LeaseParams {
        max_in_flight: 3,
        lease: S / 5,
    };
    let answer = store
        .lease(LeaseCall {
            key: &key,
            id: "lost",
            action: LeaseAction::Acquire,
            params: short,
            now: SystemClock.now(),
            watch: None,
        })
        .await
        .unwrap();
    assert_eq!(answer.outcome, LeaseOutcome::Taken);
    assert_eq!(redis.keys("ttl:*").len(), 1);
    // Its release never comes: Redis drops the set when the lease has ended.
    eventually_within(
        "the key expires in Redis",
        Duration::from_secs(30),
        || async { redis.keys("ttl:*").is_empty() },
    )
    .await;
}
