//! ratelimit-server's server: the listeners and what they serve, around the core's engine.
//!
//! Module map, lowest first (a module names only modules of lower layers):
//! - [`status`] (draining, the last load), `health` (gRPC health), `telemetry`
//!   (OpenTelemetry spans), [`statsd`] (the reference's statsd stats), [`record`] (`serve --record`: decisions to a file, off the hot path);
//! - [`front`]: the one front door to a decision (call metrics, span, recorder, engine);
//! - faces: `service` (gRPC `ShouldRateLimit`), `rlqs` (gRPC `StreamRateLimitQuotas`, the Rate
//!   Limit Quota Service), [`http`] (the admin port), `reload` (rules from files, validated then
//!   swapped);
//! - `net`: listeners (accept with backoff, caps, timeouts, TLS);
//! - [`xds`]: rules from an xDS management server (`CONFIG_TYPE=GRPC_XDS_SOTW`);
//! - [`settings`], [`reference_env`] (envoyproxy/ratelimit's environment → ours), [`logging`];
//! - [`server`]: the wiring (the one place a backend is chosen), a running server and its shutdown.
#![forbid(unsafe_code)]

pub mod front;
mod health;
pub mod http;
pub mod logging;
mod net;
pub mod record;
pub mod reference_env;
mod reload;
mod rlqs;
pub mod server;
mod service;
pub mod settings;
pub mod statsd;
pub mod status;
mod telemetry;
pub mod xds;
