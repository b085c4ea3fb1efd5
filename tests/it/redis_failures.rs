//! When Redis fails: a real redis-server that the test freezes (SIGSTOP), thaws (SIGCONT), kills
//! and restarts on the same port, or starts only after the server. Each failure mode answers as
//! documented, every request is answered (no hang), and decisions go back to Redis on their own,
//! seen on the `ratelimit_store_up` gauge and by keys appearing in Redis. Also the local
//! over-limit cache: Redis calls saved (`INFO commandstats`), and a raised limit admitted at once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::metrics::{scrape, value};
use common::redis::{RedisServer, free_port};
use common::wait::eventually_within;
use common::{Code, TestServer, code, request, start_with};
use ratelimit_server::clock::{Clock, SystemClock};
use ratelimit_server::remote::FailureMode;
use ratelimit_server::settings::BackendType;

const RULES: &str = "\
domain: f
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
  - key: outage
    rate_limit: {unit: day, requests_per_unit: 300}
";

/// Generous bound on anything the test waits for (CI machines are slow and shared).
const DEADLINE: Duration = Duration::from_secs(20);

/// A server on Redis at `redis_addr` with a 100 ms REDIS_TIMEOUT. Its (manual) clock follows the
/// real time, since Redis expires keys by its own clock.
async fn server(redis_addr: &str, mode: FailureMode) -> TestServer {
    server_with(redis_addr, mode, 0).await
}

/// [`server`] with a local over-limit cache of `cache_bytes`.
async fn server_with(redis_addr: &str, mode: FailureMode, cache_bytes: usize) -> TestServer {
    let addr = redis_addr.to_owned();
    let s = start_with(&[("f.yaml", RULES)], move |s| {
        s.store.backend = BackendType::Redis;
        s.store.redis_url = addr;
        s.store.redis_timeout = Duration::from_millis(100);
        s.store.redis_failure_mode = mode;
        s.store.cache_key_prefix = "rf:".into();
        s.store.local_cache_size_in_bytes = cache_bytes;
    })
    .await;
    let clock = s.clock.clone();
    let real = move || clock.set(SystemClock.now());
    real();
    tokio::spawn(async move {
        loop {
            real();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    s
}

/// Waits until `ratelimit_store_up` is `up`; returns how long that took.
async fn store_up_becomes(s: &TestServer, up: bool) -> Duration {
    let want = if up { 1.0 } else { 0.0 };
    let what = format!("ratelimit_store_up becomes {want}");
    eventually_within(&what, DEADLINE, || async {
        present(&scrape(&s.http("/metrics")).await, "ratelimit_store_up") == want
    })
    .await
}

/// One request on `k=value`; the gRPC code or the error.
async fn decide(s: &TestServer, key: &str, value: &str) -> Result<Code, tonic::Code> {
    let mut client = s.client.clone();
    client
        .should_rate_limit(request("f", &[&[(key, value)]]))
        .await
        .map(|r| code(r.into_inner().overall_code))
        .map_err(|e| e.code())
}

/// Waits until a request on a fresh value leaves its key in Redis (decisions are on Redis).
async fn decisions_reach(s: &TestServer, redis: &RedisServer, tag: &str) -> Duration {
    let next = AtomicU64::new(0);
    eventually_within("decisions reach Redis", DEADLINE, || async {
        let value = format!("{tag}-{}", next.fetch_add(1, Ordering::Relaxed));
        assert_eq!(decide(s, "k", &value).await, Ok(Code::Ok));
        !redis.keys(&format!("rf:f|k={value}|*")).is_empty()
    })
    .await
}

/// Waits until the load has had more than `count` answers (fails only if that never happens).
async fn answered_past(tally: &Tally, count: u64, what: &str) {
    let what = format!("{what}: more than {count} answers");
    eventually_within(&what, DEADLINE, || async { tally.answered() > count }).await;
}

/// Answers counted by a background load.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn answered(&self) -> u64 {
        self.ok.load(Ordering::Relaxed) + self.over.load(Ordering::Relaxed)
    }
}

/// `tasks` loops of requests until `stop`; each request must complete (a 5 s client deadline
/// turns a hang into a counted error).
fn load(
    s: &TestServer,
    tasks: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|t| {
            let client = s.client.clone();
            let stop = stop.clone();
            let tally = tally.clone();
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let mut client = client.clone();
                    let value = format!("load-{t}-{}", i % 50);
                    let call = client.should_rate_limit(request("f", &[&[("k", &value)]]));
                    match tokio::time::timeout(Duration::from_secs(5), call).await {
                        Ok(Ok(r)) if code(r.get_ref().overall_code) == Code::Ok => {
                            tally.ok.fetch_add(1, Ordering::Relaxed)
                        }
                        Ok(Ok(_)) => tally.over.fetch_add(1, Ordering::Relaxed),
                        _ => tally.errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn frozen_redis_in_local_mode_every_request_is_answered_then_back_to_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Local).await;
    store_up_becomes(&s, true).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let tasks = load(&s, 16, stop.clone(), tally.clone());
    answered_past(&tally, 0, "the load runs on Redis").await;

    // A loaded machine can miss the 100 ms REDIS_TIMEOUT under this load and switch away (and
    // back) before the freeze: count the freeze's switches from here, with the store up.
    store_up_becomes(&s, true).await;
    let switched = "ratelimit_store_switches{to=\"failure_mode\"}";
    let switches_before = present(&scrape(&s.http("/metrics")).await, switched);
    redis.freeze();
    store_up_becomes(&s, false).await;
    let frozen_at = tally.answered();
    answered_past(&tally, frozen_at + 50, "answered while frozen").await;
    let text = scrape(&s.http("/metrics")).await;
    assert!(present(&text, "ratelimit_redis_errors{kind=\"timeout\"}") >= 1.0);
    assert!(
        present(
            &text,
            "ratelimit_store_failure_mode_decisions{mode=\"local\"}"
        ) >= 1.0
    );
    assert_eq!(
        present(&text, switched) - switches_before,
        1.0,
        "one switch for the freeze, not one per failed call"
    );

    let thawed_at = tally.answered();
    redis.thaw();
    let back = store_up_becomes(&s, true).await;
    decisions_reach(&s, &redis, "after-thaw").await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        tally.errors.load(Ordering::Relaxed),
        0,
        "no gRPC error, no hang"
    );
    assert_eq!(tally.over.load(Ordering::Relaxed), 0);
    let text = scrape(&s.http("/metrics")).await;
    // One switch each way (a slow machine may time out on the backlog Redis works through after
    // SIGCONT and switch again: then as many back as away).
    let away = present(&text, "ratelimit_store_switches{to=\"failure_mode\"}");
    assert_eq!(
        present(&text, "ratelimit_store_switches{to=\"redis\"}"),
        away
    );
    assert_eq!(present(&text, "ratelimit_redis_breaker_state"), 0.0);
    assert!(present(&text, "ratelimit_store_errors") >= 1.0);
    eprintln!(
        "answered {} ({} while frozen); store up again {back:?} after SIGCONT",
        tally.answered(),
        thawed_at - frozen_at
    );
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn frozen_redis_in_deny_mode_answers_over_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Deny).await;
    assert_eq!(decide(&s, "k", "a").await, Ok(Code::Ok));
    redis.freeze();
    // The calls that find Redis frozen open the breaker, each answered by the mode.
    for _ in 0..3 {
        assert_eq!(decide(&s, "k", "a").await, Ok(Code::OverLimit));
    }
    store_up_becomes(&s, false).await;
    assert_eq!(decide(&s, "k", "b").await, Ok(Code::OverLimit));
    redis.thaw();
    store_up_becomes(&s, true).await;
    decisions_reach(&s, &redis, "deny-back").await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn frozen_redis_in_error_mode_answers_unavailable() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Error).await;
    assert_eq!(decide(&s, "k", "a").await, Ok(Code::Ok));
    redis.freeze();
    for _ in 0..3 {
        assert_eq!(decide(&s, "k", "a").await, Err(tonic::Code::Unavailable));
    }
    store_up_becomes(&s, false).await;
    assert_eq!(decide(&s, "k", "b").await, Err(tonic::Code::Unavailable));
    // Counted under the reference's name for them (its mapping's `err_type="redis_error"`).
    let text = scrape(&s.http("/metrics")).await;
    assert_eq!(
        present(
            &text,
            "ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"}"
        ),
        4.0
    );
    redis.thaw();
    store_up_becomes(&s, true).await;
    decisions_reach(&s, &redis, "error-back").await;
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn allow_mode_answers_ok_even_over_the_limit() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Allow).await;
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(decide(&s, "tight", "t").await, Ok(expected));
    }
    redis.kill_now();
    for _ in 0..5 {
        assert_eq!(decide(&s, "tight", "t").await, Ok(Code::Ok));
    }
    store_up_becomes(&s, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn redis_killed_and_restarted_on_the_same_port_is_used_again_without_a_restart() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Local).await;
    decisions_reach(&s, &redis, "before").await;
    redis.kill_now();
    // Local mode: the per-instance limit applies (2 per hour), every request answered.
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(decide(&s, "tight", "gone").await);
    }
    assert_eq!(
        codes,
        [
            Ok(Code::Ok),
            Ok(Code::Ok),
            Ok(Code::OverLimit),
            Ok(Code::OverLimit)
        ]
    );
    store_up_becomes(&s, false).await;
    redis.restart();
    let back = store_up_becomes(&s, true).await;
    decisions_reach(&s, &redis, "restarted").await;
    eprintln!("store up {back:?} after redis-server answered again");
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn redis_down_at_start_up_the_server_starts_then_uses_redis_once_it_appears() {
    if !common::redis::available() {
        return;
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = server(&addr, FailureMode::Deny).await;
    assert_eq!(
        present(&scrape(&s.http("/metrics")).await, "ratelimit_store_up"),
        0.0
    );
    assert_eq!(decide(&s, "k", "early").await, Ok(Code::OverLimit));
    let redis = RedisServer::spawn(port, &[], Vec::new());
    store_up_becomes(&s, true).await;
    decisions_reach(&s, &redis, "appeared").await;
    assert_eq!(
        present(
            &scrape(&s.http("/metrics")).await,
            "ratelimit_store_switches{to=\"redis\"}"
        ),
        1.0
    );
}

/// Round trips of decisions that Redis answered: `MGET`s and scripts, less failed calls (a first
/// `EVALSHA` fails with NOSCRIPT before the script is loaded), and plain compare-and-sets (`SET`s,
/// and denials' `GET`s of counters, sent by a client since [`RedisServer::count_commands`], not
/// those a script runs).
fn decisions_at_redis(redis: &RedisServer) -> u64 {
    ["mget", "evalsha", "eval"]
        .iter()
        .map(|c| command_calls(redis, c) - command_field(redis, c, "failed_calls"))
        .sum::<u64>()
        + redis.commands_sent(&["set"])
        + redis.counter_gets_sent()
}

/// One numeric field of one command in `INFO commandstats` (0 if never called).
fn command_field(redis: &RedisServer, command: &str, field: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    redis
        .info("commandstats")
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
                .map(|n| n.parse().unwrap())
        })
        .unwrap_or(0)
}

/// `calls` of one command in `INFO commandstats` (0 if never called).
fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    redis
        .info("commandstats")
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn the_local_cache_saves_redis_calls_and_a_raised_limit_is_admitted_at_once() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let s = server_with(&redis.addr(), FailureMode::Error, 1 << 20).await;
    redis.count_commands();
    let trips = decisions_at_redis(&redis);
    let mut codes = Vec::new();
    for _ in 0..22 {
        codes.push(decide(&s, "tight", "c").await.unwrap());
    }
    assert_eq!(codes[..3], [Code::Ok, Code::Ok, Code::OverLimit]);
    assert!(codes[2..].iter().all(|c| *c == Code::OverLimit));
    // Two admitted and the first denial went to Redis (one round trip each); the other 19
    // denials did not.
    assert_eq!(decisions_at_redis(&redis) - trips, 3);
    let text = scrape(&s.http("/metrics")).await;
    assert_eq!(
        present(&text, "ratelimit_over_limit_with_local_cache"),
        19.0
    );
    // Other keys still go to Redis.
    assert_eq!(decide(&s, "tight", "other").await, Ok(Code::Ok));
    // A reload raising the limit: the cached denial no longer applies.
    std::fs::write(
        s.dir.path().join("f.yaml"),
        RULES.replace("requests_per_unit: 2,", "requests_per_unit: 5,"),
    )
    .unwrap();
    s.server.reloader.reload().expect("valid rules");
    assert_eq!(decide(&s, "tight", "c").await, Ok(Code::Ok));
}

/// A series that must be on the page.
fn present(page: &str, series: &str) -> f64 {
    value(page, series).unwrap_or_else(|| panic!("{series} is not on /metrics"))
}

/// The count of `series` on `s`'s metrics page (0 when absent).
async fn metric(s: &TestServer, series: &str) -> f64 {
    present(&scrape(&s.http("/metrics")).await, series)
}

/// Admitted answers among `n` requests on `outage=shared` to `s`.
async fn admitted(s: &TestServer, n: usize) -> u64 {
    let mut ok = 0;
    for _ in 0..n {
        if decide(s, "outage", "shared").await == Ok(Code::Ok) {
            ok += 1;
        }
    }
    ok
}

/// An outage does not give every instance the whole limit again. Three
/// instances on one Redis (they count each other by heartbeat) share a 300/day key and use half of
/// it; Redis is frozen; each instance then decides alone from the value it last saw, keeping a
/// third of what was left, so the three together admit about the 150 left. When Redis answers again, what they admitted is written back: Redis
/// holds the whole limit spent and every instance refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn an_outage_in_local_mode_admits_only_what_was_left_and_writes_it_back() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(server(&redis.addr(), FailureMode::Local).await);
    }
    for s in &servers {
        eventually_within("the instances count each other", DEADLINE, || async {
            metric(s, "ratelimit_redis_instances").await >= 3.0
        })
        .await;
    }
    // Half the limit on Redis, taken by turns.
    let mut before = 0;
    for _ in 0..50 {
        for s in &servers {
            before += admitted(s, 1).await;
        }
    }
    assert_eq!(before, 150);
    redis.freeze();
    let mut during = Vec::new();
    for s in &servers {
        during.push(admitted(s, 120).await);
    }
    let outage: u64 = during.iter().sum();
    for s in &servers {
        assert!(metric(s, "ratelimit_outage_keys_handed_over").await >= 1.0);
    }
    redis.thaw();
    for s in &servers {
        store_up_becomes(s, true).await;
    }
    // Each instance counts what it wrote back once, when done.
    let mut written = 0.0;
    for s in &servers {
        eventually_within("each instance writes back", DEADLINE, || async {
            metric(s, "ratelimit_outage_hits_written_back").await > 0.0
        })
        .await;
        written += metric(s, "ratelimit_outage_hits_written_back").await;
    }
    // Each instance's first call into the frozen Redis timed out, but Redis ran it when thawed:
    // up to three hits were in Redis already, and the write-back stops at the limit.
    assert!(
        written >= (outage - 3) as f64,
        "{written} of {outage} written back"
    );
    let mut after = 0;
    for s in &servers {
        after += admitted(s, 5).await;
    }
    eprintln!(
        "300/day: {before} admitted on Redis, {during:?} by the three instances alone while Redis \
         was frozen ({outage} in all), {written} written back, {after} after"
    );
    // Each instance keeps a third of what it saw left: the last value each saw is at most two
    // charges behind, so the three together admit at most what was left plus two.
    assert!(
        (148..=152).contains(&outage),
        "the outage admitted {outage} where 150 were left"
    );
    assert_eq!(
        after, 0,
        "the outage's hits count in Redis: the limit is spent"
    );
}

/// Decides key `k` = `{tag}-{i}` for every i below `keys`, 16 calls at a time; each must be OK.
async fn decide_each(s: &TestServer, tag: &str, keys: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, next, tag) = (s.client.clone(), next.clone(), tag.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= keys {
                        return;
                    }
                    let value = format!("{tag}-{i}");
                    let mut client = client.clone();
                    let reply = client
                        .should_rate_limit(request("f", &[&[("k", &value)]]))
                        .await
                        .unwrap();
                    assert_eq!(code(reply.into_inner().overall_code), Code::Ok);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Once Redis answers again after an outage on thousands of keys, what the local mode admitted
/// is written back a chunk of keys at a time, side by side; a decision on a key the write-back has
/// not reached writes its own key back and goes to Redis. No decision waits for the whole
/// write-back and then falls to the local mode (the write-back used to claim every key at once
/// and write them one after another, two round trips each: the decisions right after an outage
/// waited 8 × `REDIS_TIMEOUT` each, 800 ms, and were then answered locally). Every hit is written
/// back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn after_an_outage_on_many_keys_decisions_go_back_to_redis_without_waiting_for_the_write_back()
 {
    const KEYS: u64 = 4000;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let s = server(&redis.addr(), FailureMode::Local).await;
    decisions_reach(&s, &redis, "warm").await;
    redis.freeze();
    decide_each(&s, "many", KEYS).await;
    assert!(metric(&s, "ratelimit_outage_keys_handed_over").await >= KEYS as f64);
    redis.thaw();
    store_up_becomes(&s, true).await;
    let local_before = metric(&s, "ratelimit_outage_decisions_awaiting_write_back").await;
    decide_each(&s, "many", KEYS).await;
    let local = metric(&s, "ratelimit_outage_decisions_awaiting_write_back").await - local_before;
    eventually_within(
        "every hit of the outage is written back",
        DEADLINE,
        || async { metric(&s, "ratelimit_outage_hits_written_back").await >= KEYS as f64 },
    )
    .await;
    let written = metric(&s, "ratelimit_outage_hits_written_back").await;
    eprintln!(
        "{KEYS} keys: {written} hits written back, {local} decisions after the outage answered \
         locally while their keys awaited the write-back"
    );
    assert_eq!(
        local, 0.0,
        "decisions after the outage waited for the write-back"
    );
    // The calls in flight into the frozen Redis (16 at most) were answered locally and may also
    // have landed on SIGCONT: at most one hit more each.
    assert!(
        (KEYS as f64..=KEYS as f64 + 16.0).contains(&written),
        "{written} hits written back for {KEYS}"
    );
}
