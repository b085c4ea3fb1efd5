//! ratelimit-server's remote-store layer: a backend reached over the network and shared by server
//! instances, run behind [`Guarded`] (every decision bounded in time, a circuit breaker, the
//! operator's failure mode while the backend is away, reconnection, the local over-limit cache).
//! It sits between the core (the `Backend` seam) and the remote backends (`ratelimit-redis`):
//! a backend implements [`Remote`] and [`Connect`] and gets all of this, named after its own
//! `Backend::NAME` in metrics and logs (`names`), with no edit here.
//!
//! Module map, lowest first (a module names only modules of lower layers):
//! - `breaker` (the pure state machine), `every` (at most once per period), `mode` (failure mode,
//!   local share, settings), `names` (the backend's names for operators);
//! - `metrics` (the `ratelimit_<name>_…` and `ratelimit_store_…` series), `outage` (the keys the
//!   local failure mode took over; pure), `shards` (a breaker per shard: a cluster's masters; pure);
//! - `remote` (what the layer needs of a backend: [`Remote`], [`RemoteKey`], [`Connect`]);
//! - `over_limit_cache` (keys known over their limit, answered without a call; pure);
//! - `guarded` ([`Guarded`]: the call under deadline and permit, the failure modes, the outage's
//!   hand-over and write-back, the background tasks).
//!
//! Beside them, `speaks`: whether a server at a TCP address speaks TLS or plaintext HTTP/2, for
//! the Redis store and the xDS client to say which side of a TLS mismatch is which.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod breaker;
mod every;
mod guarded;
mod metrics;
mod mode;
mod names;
mod outage;
mod over_limit_cache;
mod remote;
mod shards;
pub mod speaks;

pub use every::Every;
pub use guarded::Guarded;
pub use metrics::RemoteMetrics;
pub use mode::{FailureMode, GuardSettings, LocalShare};
pub use remote::{Connect, Remote, RemoteKey, Shard};
