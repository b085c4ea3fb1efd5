//! What the layer needs of a backend reached over the network: its keys ([`RemoteKey`]), its
//! calls beyond `Backend`'s ([`Remote`]), and how to reach it ([`Connect`]). A backend that
//! implements these runs behind [`crate::Guarded`] with no edit to this crate.
//!
//! The layer is about remote stores *shared by instances*: [`Remote::last_seen`] (the local
//! failure mode starts from what this instance last saw) and [`Remote::heartbeat`] (the registry
//! of live instances that sizes the local share) belong to that, which is why they are here and
//! not on core's `Backend`.

use std::future::Future;
use std::time::{Duration, Instant};

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::store::memory::MemoryKey;
use ratelimit_core::store::{Backend, CounterId, StoreError};

use crate::metrics::RemoteMetrics;

/// What the guard needs of a remote backend's keys: a memory key for the local failure mode, and
/// a size, for the over-limit cache's bound.
pub trait RemoteKey: MemoryKey + std::hash::Hash + Eq + Clone + Send + Sync + 'static {
    /// Bytes the key takes (for `LOCAL_CACHE_SIZE_IN_BYTES`).
    fn bytes(&self) -> usize;
}

/// A part of the backend that fails alone (a Redis Cluster master): the guard keeps a breaker per
/// shard beside the backend's own, so while one shard is away only its keys go to the failure
/// mode. An opaque id; a shard whose server is replaced (a replica promoted) gets a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard(pub u64);

/// A backend reached over the network and shared by server instances.
pub trait Remote: Backend<Key: RemoteKey> {
    /// Checks that it answers, and takes the calls decisions make (a write, not only a `PING`):
    /// the breaker's probe. A backend that answers but refuses decisions' calls fails it.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Whether any call got an answer at or after `since`.
    fn answered_since(&self, since: Instant) -> bool;
    /// The state this instance last saw in `key`, without a call (for the local failure mode's
    /// hand-over), unless the backend has dropped it by `now`.
    fn last_seen(&self, key: &Self::Key, now: Nanos) -> Option<State>;
    /// Says this instance (`id`) is alive in the backend's registry of server instances; the
    /// count of instances alive there, this one included.
    fn heartbeat(&self, id: InstanceId) -> impl Future<Output = Result<usize, StoreError>> + Send;
    /// The shard serving `key`, for a backend whose parts fail alone; `None` (the default): the
    /// backend answers or fails as one.
    fn shard(&self, key: &Self::Key) -> Option<Shard> {
        let _ = key;
        None
    }
}

/// How to reach a remote backend: at start-up, and again in the background while it is away.
pub trait Connect: Clone + Send + Sync + 'static {
    type Backend: Remote;
    /// Connects (failing with `Unreachable` when nobody answered, `Unavailable` when it refused).
    fn connect(
        &self,
        metrics: RemoteMetrics,
    ) -> impl Future<Output = Result<Self::Backend, StoreError>> + Send;
    /// The key of a counter, connected or not.
    fn key(&self, id: &CounterId<'_>) -> <Self::Backend as Backend>::Key;
    /// Where it is, for logs (no credentials).
    fn describe(&self) -> String;
    /// The bound on each call.
    fn timeout(&self) -> Duration;
    /// The longest one decision may take while the backend answers: as many calls as it may make
    /// under contention, each bounded by [`Connect::timeout`]. A safety net: past it, a decision
    /// is answered `UNAVAILABLE`, never by the failure mode.
    fn decision_deadline(&self) -> Duration;
}
