//! ratelimit-server's core: everything a decision is made of, with no listener, no file watcher
//! and no network (the layers above: `ratelimit-remote`, `ratelimit-redis`, `ratelimit-replay`,
//! `ratelimit-app`).
//!
//! Module map (dependencies point inward only; `tests/it/architecture.rs` holds what the compiler
//! cannot: which modules stay pure and which never read the wall clock):
//! - time: [`clock`] (time as a value, and waits on it: the one reader of wall time), [`calendar`]
//!   (calendar windows in IANA time zones, pure);
//! - pure: [`config`] (rules files → validated model), [`policy`] (matching tree), [`limiter`]
//!   (algorithms as functions of state, now and hits), [`wire`] (the JSON form of requests, the
//!   record line, RFC 3339, the `/explain` answer), [`redact`] (passwords out of messages);
//! - [`overrides`]: limits set at run time for one descriptor (the quota API), pure;
//! - state: [`store`] (the seam every backend implements, the transaction, the memory backend;
//!   a remote one's guard is the crate `ratelimit-remote`);
//! - decisions: [`engine`] (one ShouldRateLimit, transport-free), [`metrics`] (every Prometheus
//!   series, the per-rule ones installed with the rules);
//! - [`rules_dir`]: reading a rules directory from disk; `testing` (the `testing` feature): request builders shared by
//!   tests, examples and benchmarks.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

pub mod calendar;
pub mod clock;
pub mod config;
pub mod engine;
pub mod lease;
pub mod limiter;
pub mod metrics;
pub mod overrides;
pub mod policy;
pub mod quota;
pub mod redact;
pub mod rules_dir;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wire;
