//! ratelimit-server: an Envoy-compatible external rate-limit service.
//!
//! This package is the binary (`src/main.rs`), its commands ([`cli`]) and the integration tests,
//! examples and benchmarks. The service itself is five crates, which are its layers (the compiler
//! keeps the arrows pointing down): `ratelimit-core` (rules, algorithms, the store seam and the
//! memory backend, the engine, metrics, the wire forms) ← `ratelimit-remote` (any remote store
//! behind a deadline, a breaker and a failure mode) ← `ratelimit-redis` (the Redis backend);
//! `ratelimit-replay` (the offline analyser) on core; `ratelimit-app` (listeners, faces, reload,
//! record, settings, wiring) on all. This library re-exports their modules under one name, so that
//! tests, examples and benchmarks read `ratelimit_server::engine`, `ratelimit_server::remote`,
//! `ratelimit_server::store::redis`.
#![forbid(unsafe_code)]

pub mod cli;

pub use ratelimit_app::{front, http, logging, record, reference_env, server, settings, status};
pub use ratelimit_core::{
    clock, config, engine, limiter, metrics, policy, quota, redact, rules_dir, wire,
};
pub use ratelimit_remote as remote;
pub use ratelimit_replay as replay;

/// Where limiter state lives: the core's seam and the memory backend, and the Redis backend.
pub mod store {
    pub use ratelimit_core::store::*;
    pub use ratelimit_redis as redis;
}
