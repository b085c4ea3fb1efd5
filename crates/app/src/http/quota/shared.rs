//! Where the quota API keeps what every instance must see, when counters are shared: the
//! overrides (each instance asks every [`POLL_INTERVAL`] whether they changed, and reads them
//! back when they did, or [`FULL_READ_EVERY`] whatever) and the walk over a domain's
//! counter keys. With Redis, through the store's connections and breaker ([`Guarded::call`]); with
//! the memory store there is nothing to share (the overrides live in the process, the counters
//! are listed from the engine's names).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ratelimit_core::overrides::Override;
use ratelimit_core::store::StoreError;
use ratelimit_redis::{RedisConnect, ScanStep};
use ratelimit_remote::Guarded;

/// How often an instance reads the overrides back from the shared store: a change made on
/// another instance applies here within this (and a call's time).
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often an instance reads the overrides back even though their count of changes did not
/// move: what the count cannot tell (an override written by hand, the keys of expired ones still
/// listed in the set, which a read takes out) is seen within this.
pub(crate) const FULL_READ_EVERY: Duration = Duration::from_secs(30);

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The shared store's part of the quota API.
pub(crate) trait Shared: Send + Sync + 'static {
    /// Stores `o` for every instance, until `ttl_ms` from now.
    fn put(&self, o: Override, ttl_ms: u64) -> Answer<'_, ()>;
    /// Removes a descriptor's override; whether there was one.
    fn delete(&self, domain: String, entries: Vec<(String, String)>) -> Answer<'_, bool>;
    /// Every override stored.
    fn load(&self) -> Answer<'_, Vec<Override>>;
    /// The count of the overrides' changes: when it has not moved, neither have they.
    fn version(&self) -> Answer<'_, u64>;
    /// One step of the walk over `domain`'s counters whose entries start with `start`.
    fn scan(
        &self,
        domain: String,
        start: Vec<(String, Option<String>)>,
        cursor: u64,
        count: usize,
    ) -> Answer<'_, ScanStep>;
}

/// The Redis store's part.
pub(crate) struct RedisShared {
    pub(crate) store: Guarded<RedisConnect>,
}

impl Shared for RedisShared {
    fn put(&self, o: Override, ttl_ms: u64) -> Answer<'_, ()> {
        Box::pin(async move {
            self.store
                .call(|redis| async move { redis.put_override(&o, ttl_ms).await })
                .await
        })
    }

    fn delete(&self, domain: String, entries: Vec<(String, String)>) -> Answer<'_, bool> {
        Box::pin(async move {
            self.store
                .call(|redis| async move { redis.delete_override(&domain, &entries).await })
                .await
        })
    }

    fn load(&self) -> Answer<'_, Vec<Override>> {
        Box::pin(async move {
            self.store
                .call(|redis| async move { redis.overrides().await })
                .await
        })
    }

    fn version(&self) -> Answer<'_, u64> {
        Box::pin(async move {
            self.store
                .call(|redis| async move { redis.overrides_version().await })
                .await
        })
    }

    fn scan(
        &self,
        domain: String,
        start: Vec<(String, Option<String>)>,
        cursor: u64,
        count: usize,
    ) -> Answer<'_, ScanStep> {
        Box::pin(async move {
            self.store
                .call(|redis| async move {
                    redis.scan_counters(&domain, &start, cursor, count).await
                })
                .await
        })
    }
}
