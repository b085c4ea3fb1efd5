//! Where limiter state lives. `Store` applies one request's charges atomically: every charge is
//! evaluated, and the request is charged on every key only if every enforced charge fits
//! (all-or-nothing), so denied traffic never eats quota. Each store builds its own keys
//! (`Store::key`): the memory store 16-byte keyed hashes, the Redis store readable text shared
//! by every instance. Nothing outside this module names a concrete store: the server runs on
//! [`AnyStore`].

mod any;
pub mod breaker;
mod decide;
mod guarded;
mod key;
mod memory;
mod metrics;
mod over_limit_cache;
pub mod redis;
mod text_key;

use std::fmt::Debug;
use std::future::Future;

use smallvec::SmallVec;

pub use any::{AnyKey, AnyStore};
pub use decide::{Decision, decide};
pub use guarded::{FailureMode, GuardedRedis};
pub use key::{KeyBuilder, StoreKey};
pub use memory::{MemoryKey, MemoryStore};
pub use metrics::StoreMetrics;
pub use redis::{RedisConfig, RedisStore, RedisTls, Topology};
pub use text_key::{MAX_KEY, TextKey, TextKeyBuilder};

use crate::clock::Nanos;
use crate::limiter::{LimitParams, Outlook, State};

/// One limit to check and charge for one descriptor of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge<K = StoreKey> {
    pub key: K,
    pub params: LimitParams,
    pub hits: u64,
    /// False for shadow-mode rules: their denial does not stop the request from being charged.
    pub enforced: bool,
    /// `quota_mode`: the request's descriptor this charge belongs to. A quota descriptor is over
    /// when any of its enforced charges is denied, and quota descriptors stop the request only
    /// when every one of them is over (the reference's rule).
    pub quota: Option<u32>,
}

/// The answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the charge fit its limit.
    pub allowed: bool,
    /// The limit as the client now sees it (after the charge if the request was charged).
    pub outlook: Outlook,
    /// Whether this charge was written (the whole request fit, and this charge did).
    pub charged: bool,
    /// How long the answer must wait for this charge's turn (leaky bucket; 0 when not charged).
    pub delay: Nanos,
}

/// One verdict per charge, in order. Inline up to two (most requests have one or two descriptors), so the common request allocates nothing.
pub type Verdicts = SmallVec<[Verdict; 2]>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Nobody answered (connection refused, no answer within `REDIS_TIMEOUT`).
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// Other instances kept changing the request's keys between our read and our write.
    #[error("store contention: gave up after {0} attempts")]
    Contention(usize),
}

/// Counts for metrics. `keys` and `evictions` are the memory store's; a Redis store reports none
/// (its keys expire in Redis: see `INFO keyspace`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub keys: usize,
    pub evictions: u64,
    pub expired: u64,
}

/// A place where counters live.
pub trait Store: Send + Sync + 'static {
    /// The identity of one counter / bucket in this store.
    type Key: Clone + Debug + PartialEq + Send + Sync + 'static;

    /// The key of limit number `slot` (with `params`' algorithm and period) of a descriptor.
    /// Limit values (requests per unit, burst) are not part of the key, so editing a limit keeps
    /// the counter; a new algorithm or window starts a new one.
    fn key<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> Self::Key;

    /// Evaluates all `charges` at `now` and, iff every enforced one fits, charges them all.
    /// Returns one verdict per charge, in order.
    fn apply(
        &self,
        charges: &[Charge<Self::Key>],
        now: Nanos,
    ) -> impl Future<Output = Result<Verdicts, StoreError>> + Send;

    /// Gives back what `charges` took (they were charged, but their answers were never delivered:
    /// the caller cancelled while waiting for its turn). Only leaky-bucket queue slots are given
    /// back; see `limiter::refund`. Called from a drop guard, so it must not block or fail: a
    /// remote store sends it from a task of its own.
    fn refund(&self, charges: &[Charge<Self::Key>], now: Nanos);

    /// The stored state of a key, charging nothing (for `/explain`).
    fn peek(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Option<State>, StoreError>> + Send;

    /// Counts for `/metrics`.
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    /// Drops idle keys (a store whose keys expire by themselves does nothing). Returns how many.
    fn sweep(&self, _now: Nanos) -> usize {
        0
    }
}

impl Store for MemoryStore {
    type Key = StoreKey;

    #[inline]
    fn key<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> StoreKey {
        self.key_builder().key(domain, entries, slot, params)
    }

    async fn apply(&self, charges: &[Charge], now: Nanos) -> Result<Verdicts, StoreError> {
        Ok(self.apply_sync(charges, now))
    }

    fn refund(&self, charges: &[Charge], now: Nanos) {
        self.refund_sync(charges, now)
    }

    async fn peek(&self, key: &StoreKey) -> Result<Option<State>, StoreError> {
        Ok(self.peek_now(*key))
    }

    fn stats(&self) -> StoreStats {
        MemoryStore::stats(self)
    }

    fn sweep(&self, now: Nanos) -> usize {
        MemoryStore::sweep(self, now)
    }
}
