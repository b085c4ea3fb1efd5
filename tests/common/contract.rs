//! The store contract's shared parts: deterministic traces of requests, run against any store.
#![allow(
    dead_code,
    reason = "shared by several test binaries; each uses a part"
)]

use ratelimit_server::clock::NANOS_PER_SECOND as S;
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::LimitParams;
use ratelimit_server::store::{AnyKey, AnyStore, Charge, RedisConfig, Store, Verdicts};

use super::redis::RedisServer;

pub fn params(algorithm: Algorithm, rpu: u32, period_s: u64, burst: u32) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: rpu,
        period: period_s * S,
        burst,
        max_delay: 2 * S,
    }
}

pub async fn redis_store(redis: &RedisServer, prefix: &str) -> AnyStore {
    let mut config = RedisConfig::single(&redis.url()).expect("url");
    config.prefix = prefix.into();
    AnyStore::redis(&config).await.expect("connects")
}

/// One charge of a trace step: (descriptor value, limit slot, params, hits, enforced).
pub type Spec = (&'static str, usize, LimitParams, u64, bool);

pub fn charges(store: &AnyStore, specs: &[Spec]) -> Vec<Charge<AnyKey>> {
    specs
        .iter()
        .map(|(value, slot, params, hits, enforced)| Charge {
            key: store.key("contract", [("user", *value)], *slot, params),
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

pub async fn run(store: &AnyStore, base: u64, steps: &[(u64, Vec<Spec>)]) -> Vec<Verdicts> {
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
