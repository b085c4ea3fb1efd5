//! ratelimit-server: an Envoy-compatible external rate-limit service.
//!
//! This package is the binary (`src/main.rs`), its commands ([`cli`]) and the integration tests,
//! examples and benchmarks. The service itself is five crates, which are its layers (the compiler
//! keeps the arrows pointing down): `ratelimit-core` (rules, algorithms, the store seam and the
//! memory backend, the engine, metrics, the wire forms) ← `ratelimit-remote` (any remote store
//! behind a deadline, a breaker and a failure mode) ← `ratelimit-redis` (the Redis backend);
//! `ratelimit-replay` (the offline analyser) on core; `ratelimit-app` (listeners, faces, reload,
//! record, settings, wiring) on all. This library is a facade: the core's modules as they are, and
//! for the other crates a chosen list of items under the module paths that tests, examples and
//! benchmarks read (`ratelimit_server::server::start`, `ratelimit_server::remote::Guarded`,
//! `ratelimit_server::store::redis::RedisBackend`).
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

pub mod cli;

/// The one front door to a decision.
pub mod front {
    pub use ratelimit_app::FrontDoor;
}

/// The admin port.
pub mod http {
    pub use ratelimit_app::{Admin, response_json, router};
}

/// Logging setup.
pub mod logging {
    pub use ratelimit_app::init_logging as init;
}

/// `serve --record`: decisions to a file.
pub mod record {
    pub use ratelimit_app::{
        Answer, Decided, DropReason, FileSpec, HashKey, LivePolicy, RecordConfig, Recorder, Values,
        encode,
    };
}

/// envoyproxy/ratelimit's environment, read as ours.
pub mod reference_env {
    pub use ratelimit_app::{
        invoked_as_reference, reads_reference_setting as reads,
        translate_reference_env as translate,
    };
}

/// Starting and running the server.
pub mod server {
    pub use ratelimit_app::{Server, StartError, run, start};
}

/// The server's settings (flags and environment).
pub mod settings {
    pub use ratelimit_app::{
        BackendType, ConfigType, DefaultsArgs, RateLimitHeaders, RulesFilesArgs, ServeSettings,
        parse_algorithm,
    };
}

/// Draining and the last rules load.
pub mod status {
    pub use ratelimit_app::{LoadReport, ServerStatus};
}
pub use ratelimit_core::{
    calendar, clock, config, engine, lease, limiter, metrics, overrides, policy, quota, redact,
    rules_dir, wire,
};

/// The remote-store layer: a remote backend behind a deadline, a breaker and a failure mode.
pub mod remote {
    pub use ratelimit_remote::{FailureMode, GuardSettings, Guarded, LocalShare, RemoteMetrics};
}

/// The offline analyser: replaying recorded requests, and the house style of its charts.
pub mod replay {
    pub use ratelimit_replay::{RecordLines, Run, Side, chart, replay};

    /// Reading the replayed lines.
    pub mod input {
        pub use ratelimit_replay::{Merged, Problems};
    }
}

/// Where limiter state lives: the core's seam and the memory backend, and the Redis backend.
pub mod store {
    pub use ratelimit_core::store::*;

    /// The Redis backend (its `testing` module is the crate's own: `ratelimit_redis::testing`).
    pub mod redis {
        pub use ratelimit_redis::{RedisBackend, RedisConfig, RedisConnect, TextKey};
    }
}
