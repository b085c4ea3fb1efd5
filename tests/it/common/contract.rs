//! The store contract's shared parts: deterministic traces of requests, run against any store.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

use ratelimit_server::clock::NANOS_PER_SECOND as S;
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::LimitParams;
use ratelimit_server::remote::{FailureMode, GuardSettings, Guarded, LocalShare, RemoteMetrics};
use ratelimit_server::store::memory::MemoryBackend;
use ratelimit_server::store::redis::{RedisConfig, RedisConnect};
use ratelimit_server::store::{Backend, Charge, CounterId, Store, Verdicts};

use super::redis::RedisServer;

pub fn params(algorithm: Algorithm, rpu: u32, period_s: u64, burst: u32) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: rpu,
        period: period_s * S,
        burst,
        max_delay: 2 * S,
        charge_denied: false,
    }
}

/// The Redis backend as the server runs it (behind its guard), failures as errors.
pub type Redis = Guarded<RedisConnect>;

pub async fn redis_store(redis: &RedisServer, prefix: &str) -> Store<Redis> {
    let config = RedisConfig::single(&redis.url())
        .expect("url")
        .with_prefix(prefix);
    guarded(config).await
}

/// A guarded Redis backend on `config` whose failures are errors (`REDIS_FAILURE_MODE=error`).
pub async fn guarded(config: RedisConfig) -> Store<Redis> {
    let settings = GuardSettings {
        mode: FailureMode::Error,
        local_max_keys: 0,
        local_cache_bytes: 0,
        local_share: LocalShare::Auto,
    };
    let backend = Guarded::start(
        RedisConnect::new(config),
        settings,
        RemoteMetrics::unregistered("redis"),
    )
    .await
    .expect("connects");
    Store::new(backend)
}

pub fn memory_store(max_keys: usize) -> Store<MemoryBackend> {
    Store::new(MemoryBackend::new(max_keys))
}

/// The key of limit `slot` of a descriptor in `store`.
pub fn key<'e, B: Backend>(
    store: &Store<B>,
    domain: &'e str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    slot: usize,
    params: &LimitParams,
) -> B::Key {
    let entries: Vec<(&str, &str)> = entries.into_iter().collect();
    store.key(&CounterId::new(domain, &entries[..], slot, params))
}

/// One charge of a trace step: (descriptor value, limit slot, params, hits, enforced).
pub type Spec = (&'static str, usize, LimitParams, u64, bool);

pub fn charges<B: Backend>(store: &Store<B>, specs: &[Spec]) -> Vec<Charge<B::Key>> {
    specs
        .iter()
        .map(|(value, slot, params, hits, enforced)| Charge {
            key: key(store, "contract", [("user", *value)], *slot, params),
            params: *params,
            hits: *hits,
            enforced: *enforced,
            quota: None,
        })
        .collect()
}

/// A small deterministic generator (xorshift), so a failing trace can be replayed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A trace: at increasing instants, requests of 1–3 charges over a few keys and limits.
pub fn trace(seed: u64, algorithm: Algorithm, steps: usize) -> Vec<(u64, Vec<Spec>)> {
    let mut rng = Rng(seed);
    let limits = [
        params(algorithm, 5, 10, 3),
        params(algorithm, 20, 60, 8),
        params(algorithm, 2, 1, 2),
    ];
    let values = ["alice", "bob", "carol"];
    let mut at = 0;
    (0..steps)
        .map(|_| {
            at += rng.below(1500) * 1_000_000; // up to 1.5 s between requests
            let n = 1 + rng.below(3) as usize;
            let specs = (0..n)
                .map(|_| {
                    let slot = rng.below(limits.len() as u64) as usize;
                    (
                        values[rng.below(3) as usize],
                        slot,
                        limits[slot],
                        rng.below(4), // 0 = check only
                        rng.below(5) != 0,
                    )
                })
                .collect();
            (at, specs)
        })
        .collect()
}

pub async fn run<B: Backend>(
    store: &Store<B>,
    base: u64,
    steps: &[(u64, Vec<Spec>)],
) -> Vec<Verdicts> {
    let mut out = Vec::new();
    for (at, specs) in steps {
        out.push(
            store
                .apply(&charges(store, specs), base + at)
                .await
                .expect("store answers"),
        );
    }
    out
}
