//! ratelimit-server: an Envoy-compatible external rate-limit service.
//!
//! Module map (dependencies point inward only):
//! - time: [`clock`] (time as a value, and waits on it: the one reader of wall time);
//! - pure: [`config`] (rules files → validated model), [`policy`]
//!   (matching tree), [`limiter`] (algorithms as functions of state, now and hits);
//! - state: [`store`] (where limiter state lives);
//! - observation: [`metrics`], [`telemetry`] (OpenTelemetry spans);
//! - decisions: [`engine`] (one ShouldRateLimit, transport-free), [`metrics`];
//! - faces: [`service`] (gRPC), [`health`] (gRPC health), [`http`] (admin), [`net`] (listeners), [`reload`] and [`rules_dir`] (files),
//!   [`record`] (`serve --record`: decisions to a file, off the hot path), [`replay`] (recorded requests through rules), [`plot`] (SVG charts);
//! - wiring: [`app`], [`settings`], [`reference_env`], [`status`], [`logging`], [`cli`];
//! - [`testing`]: request builders shared by tests, examples and benchmarks; [`redact`]: passwords
//!   out of messages that repeat an address.
//!
//! No unsafe code: forbidden here and in the binary (the package denies it; see `Cargo.toml`).
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod engine;
pub mod front;
pub mod health;
pub mod http;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod plot;
pub mod policy;
pub mod record;
pub mod redact;
pub mod reference_env;
pub mod reload;
pub mod replay;
pub mod rules_dir;
pub mod service;
pub mod settings;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod testing;
pub mod wire;
