//! The store the server runs on, chosen at start-up (`--backend`): an enum rather than a trait
//! object, so each call is a branch to statically dispatched code and the memory path keeps its
//! inlined, allocation-free decision.

use super::{
    Charge, FailureMode, GuardedRedis, MemoryKey, MemoryStore, Store, StoreError, StoreKey,
    StoreMetrics, StoreStats, TextKey, Verdicts,
};
use crate::clock::Nanos;
use crate::limiter::{LimitParams, State};

pub enum AnyStore {
    Memory(MemoryStore),
    Redis(GuardedRedis),
}

/// A key of either store. (A store is only ever given keys it built; a memory store handed a
/// text key hashes it, which is what a local fallback for Redis would want.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyKey {
    Memory(StoreKey),
    Text(TextKey),
}

impl MemoryKey for AnyKey {
    #[inline(always)]
    fn id(&self) -> StoreKey {
        match self {
            AnyKey::Memory(k) => *k,
            AnyKey::Text(k) => StoreKey(k.digest()),
        }
    }
}

impl AnyKey {
    fn text(&self) -> TextKey {
        match self {
            AnyKey::Text(k) => k.clone(),
            AnyKey::Memory(k) => TextKey(format!("{:032x}", k.0).into()),
        }
    }
}

fn text_charges(charges: &[Charge<AnyKey>]) -> Vec<Charge<TextKey>> {
    charges
        .iter()
        .map(|c| Charge {
            key: c.key.text(),
            params: c.params,
            hits: c.hits,
            enforced: c.enforced,
            quota: c.quota,
        })
        .collect()
}

impl Store for AnyStore {
    type Key = AnyKey;

    #[inline]
    fn key<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> AnyKey {
        match self {
            AnyStore::Memory(s) => AnyKey::Memory(s.key(domain, entries, slot, params)),
            AnyStore::Redis(s) => AnyKey::Text(s.key(domain, entries, slot, params)),
        }
    }

    async fn apply(&self, charges: &[Charge<AnyKey>], now: Nanos) -> Result<Verdicts, StoreError> {
        match self {
            AnyStore::Memory(s) => Ok(s.apply_sync(charges, now)),
            AnyStore::Redis(s) => s.apply(&text_charges(charges), now).await,
        }
    }

    fn refund(&self, charges: &[Charge<AnyKey>], now: Nanos) {
        match self {
            AnyStore::Memory(s) => s.refund_sync(charges, now),
            AnyStore::Redis(s) => s.refund(&text_charges(charges), now),
        }
    }

    async fn peek(&self, key: &AnyKey) -> Result<Option<State>, StoreError> {
        match self {
            AnyStore::Memory(s) => Ok(s.peek_now(key.id())),
            AnyStore::Redis(s) => s.peek(&key.text()).await,
        }
    }

    fn stats(&self) -> StoreStats {
        match self {
            AnyStore::Memory(s) => s.stats(),
            AnyStore::Redis(s) => s.stats(),
        }
    }

    fn sweep(&self, now: Nanos) -> usize {
        match self {
            AnyStore::Memory(s) => s.sweep(now),
            AnyStore::Redis(s) => s.sweep(now),
        }
    }
}

impl AnyStore {
    /// A memory store holding about `max_keys` keys.
    pub fn memory(max_keys: usize) -> AnyStore {
        AnyStore::Memory(MemoryStore::new(max_keys))
    }

    /// A Redis store whose failures are errors (`REDIS_FAILURE_MODE=error`), for tests and
    /// tools; it starts even if nobody answers yet.
    pub async fn redis(config: &super::RedisConfig) -> Result<AnyStore, StoreError> {
        Self::redis_guarded(
            config,
            FailureMode::Error,
            0,
            0,
            StoreMetrics::unregistered(),
        )
        .await
    }

    /// The Redis store as the server runs it: behind a breaker, `mode` answering while Redis is
    /// unreachable (a `local` memory store holds about `local_max_keys` keys), with an over-limit
    /// cache of `local_cache_bytes` (0: none).
    pub async fn redis_guarded(
        config: &super::RedisConfig,
        mode: FailureMode,
        local_max_keys: usize,
        local_cache_bytes: usize,
        metrics: StoreMetrics,
    ) -> Result<AnyStore, StoreError> {
        let store =
            GuardedRedis::start(config, mode, local_max_keys, local_cache_bytes, metrics).await?;
        Ok(AnyStore::Redis(store))
    }

    /// Which backend this is, for logs and metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "memory",
            AnyStore::Redis(_) => "redis",
        }
    }
}
