//! The Redis backend: counters shared by every instance, surviving restarts.
//!
//! One decision in flight per key and instance (`queue`): a request whose keys are idle goes at
//! once; requests arriving while a call holds one of their keys wait, and are decided together in
//! the next call, in arrival order, each all-or-nothing (`batch`). So a hot key costs one call
//! per round trip per instance however many requests are in flight, and instances contend only
//! with each other.
//!
//! One source of truth for the arithmetic: a call runs the same Rust decision as the memory store
//! (`store::decide`, i.e. `limiter`) on the states this instance last saw in its keys (`seen`; a
//! key not seen is expected absent), and sends one compare-and-set (`cas`) straight away: a Lua
//! script, or for one key expected absent the plain `SET … NX … GET` (and for one key held, on a
//! server with a conditional `SET`, `SET … IFEQ … GET`). Every key must hold the
//! expected value, else nothing is written and the reply holds the keys' current values, on which the batch is decided again, with no separate read. A batch that
//! writes nothing (denied, check-only) is verified the same way (on one key, a plain `GET`), so
//! no verdict rests on a stale guess. On success each changed key is `SET … PXAT` the instant its state equals no state
//! (plus a second's grace, for clocks apart).
//!
//! Keys are hashed whole on a Redis Cluster (no hash tag), so one domain's counters spread over
//! every master. A request whose keys land in one slot is one script call; one whose keys span
//! slots is decided by `spread`: a compare-and-set per slot, and a charge taken back where
//! another slot could not follow.
//!
//! Time: the instance's clock (`now` is passed in, as for the memory store); see docs/redis.md for
//! the skew tolerance. Values are `state;writer.seq;pxat`: `a` or `a:b`, the two words of
//! `limiter::State` in decimal, then the writer's tag and the key's expiry (`cas`).
//!
//! Beside the counters, the RLQS demand exchange (`demand`): each instance's demand per bucket in
//! a hash with a TTL, so instances can split a bucket's pool (docs/rlqs.md "Several servers").
//!
//! The modules, from the connection up:
//!
//! - `settings`: `REDIS_URL`, `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS*`… checked into a
//!   [`RedisConfig`]; `conn`: connections by topology; `refusal`: a failure to connect sorted
//!   into a refusal (start-up stops) or unreachable (`greeting`: what Redis wrote on a
//!   connection it turned away; `speaks`: whether it speaks TLS or plain Redis, when the store
//!   connects the other way); `mode`: whether the server runs as `REDIS_TYPE` says (a
//!   Sentinel or a cluster node named as a single server is a refusal); `version`: whether it
//!   takes the script's commands (a Redis before 6.2 is a refusal naming its version); `io`: Redis I/O on the request workers, and a timeout that takes a reply already there; `dispatch`:
//!   compare-and-sets sent together, pipelined (`pack`: several in one script call; one key
//!   expected absent as a plain command, and one held as a plain `SET … IFEQ` where the server
//!   has it, `conditional`).
//! - `calls`: every call bounded by `REDIS_TIMEOUT` and counted; `cas`: the compare-and-set script
//!   and the text of a state; `seen`: last-seen values; `writer`: compare-and-set calls through
//!   the seen-value cache; `retry`: attempts and backoff.
//! - `key`: text keys; `slot`: CRC16 cluster slots; `masters`: each slot's master (a key's shard,
//!   for the guard's breaker per master); `queue`: one call in flight per key;
//!   `pending`: a request waiting for a call; `batch`: a batch's pure decision; `attempts`: a
//!   batch decided by compare-and-set until no other instance got in between; `spread`: a request
//!   across slots.
//! - `demand`: the RLQS demand exchange ([`DemandRound`]).
//! - `backend`: [`RedisBackend`], the store; `connect`: [`RedisConnect`] and the store under
//!   core's remote-store guard; `admin`: the quota API's calls (a scan of a domain's counters, a
//!   reset, the overrides every instance reads).
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod admin;
mod attempts;
mod backend;
mod batch;
mod calls;
mod cas;
mod conditional;
mod conn;
mod connect;
mod demand;
mod dispatch;
mod eviction;
mod greeting;
mod io;
mod key;
mod lease;
mod masters;
mod mode;
mod pack;
mod pending;
mod queue;
mod refusal;
mod retry;
mod seen;
mod settings;
mod slot;
mod speaks;
mod spread;
#[cfg(test)]
mod test_redis;
mod version;
mod writer;

pub use admin::{ScanStep, ScannedCounter};
pub use backend::RedisBackend;
pub use conn::RedisConfig;
pub use connect::RedisConnect;
pub use demand::{Beat, BucketCall, DemandRound, Snapshot};
pub use key::TextKey;
pub use settings::{InvalidSetting, RedisSettings, RedisType, SocketType};

/// What integration tests look at beyond the store's answers (the `testing` feature).
#[cfg(feature = "testing")]
pub mod testing {
    /// Kept past the instant a state equals no state (what a key's `PXAT` adds).
    pub const EXPIRY_GRACE_MS: u64 = crate::cas::EXPIRY_GRACE_MS;
}
