//! The Redis store under core's remote-store guard (`Guarded<RedisConnect>`): [`RedisConnect`],
//! how to reach Redis and the keys of its counters, and the `Connect` and `Remote` impls that give
//! the store the breaker, the failure mode and the over-limit cache.

use std::time::{Duration, Instant};

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::store::{CounterId, StoreError};
use ratelimit_remote::RemoteMetrics;
use ratelimit_remote::{Connect, Remote, RemoteKey, Shard};

use crate::backend::RedisBackend;
use crate::conn::RedisConfig;
use crate::key::{TextKey, TextKeyBuilder};
use crate::retry::MAX_ATTEMPTS;

impl RemoteKey for TextKey {
    fn bytes(&self) -> usize {
        self.as_str().len()
    }
}

impl Remote for RedisBackend {
    async fn probe(&self) -> Result<(), StoreError> {
        RedisBackend::probe(self).await
    }

    fn last_seen(&self, key: &TextKey, now: Nanos) -> Option<State> {
        RedisBackend::last_seen(self, key, now)
    }

    async fn heartbeat(&self, id: InstanceId) -> Result<usize, StoreError> {
        RedisBackend::heartbeat(self, id).await
    }

    fn answered_since(&self, since: Instant) -> bool {
        RedisBackend::answered_since(self, since)
    }

    fn shard(&self, key: &TextKey) -> Option<Shard> {
        RedisBackend::shard(self, key)
    }
}

/// Reaching Redis as `RedisConfig` says, and the keys of its counters (`CACHE_KEY_PREFIX`).
#[derive(Debug, Clone)]
pub struct RedisConnect {
    config: RedisConfig,
    keys: TextKeyBuilder,
}

impl RedisConnect {
    pub fn new(config: RedisConfig) -> RedisConnect {
        RedisConnect {
            keys: TextKeyBuilder::new(config.prefix.clone()),
            config,
        }
    }
}

impl Connect for RedisConnect {
    type Backend = RedisBackend;

    async fn connect(&self, metrics: RemoteMetrics) -> Result<RedisBackend, StoreError> {
        RedisBackend::connect_observed(&self.config, metrics).await
    }

    fn key(&self, id: &CounterId<'_>) -> TextKey {
        self.keys.key(id)
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Its own calls and the one ahead of it on its keys, each up to `MAX_ATTEMPTS` attempts.
    fn decision_deadline(&self) -> Duration {
        self.config.timeout * (2 * MAX_ATTEMPTS as u32)
    }
}
