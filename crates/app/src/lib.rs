//! ratelimit-server's server: the listeners and what they serve, around the core's engine.
//!
//! Module map, lowest first (a module names only modules of lower layers):
//! - `status` (draining, the last load), `health` (gRPC health), `trace_context` (the caller's
//!   span, from W3C or B3 headers), `telemetry` (OpenTelemetry spans), `statsd` (the reference's statsd stats), `record` (`serve --record`: decisions to a file, off the hot path);
//! - `front`: the one front door to a decision (call metrics, span, recorder, engine);
//! - faces: `service` (gRPC `ShouldRateLimit`), `rlqs` (gRPC `StreamRateLimitQuotas`, the Rate
//!   Limit Quota Service), `http` (the admin port), `reload` (rules from files, validated then
//!   swapped);
//! - `net`: listeners (accept with backoff, caps, timeouts, TLS);
//! - `xds`: rules from an xDS management server (`CONFIG_TYPE=GRPC_XDS_SOTW`);
//! - `settings`, `reference_env` (envoyproxy/ratelimit's environment → ours), `logging`;
//! - `server`: the wiring (the one place a backend is chosen), a running server and its shutdown.
//!
//! The modules are private; the root re-exports what the package's CLI, tests, examples and
//! benches use (starting and running a server, its settings, the front door, the admin router,
//! the recorder's pieces, the status), and `unreachable_pub` keeps everything else `pub(crate)`.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod front;
mod health;
mod http;
mod logging;
mod net;
mod record;
mod reference_env;
mod reload;
mod rlqs;
mod server;
mod service;
mod settings;
mod statsd;
mod status;
mod telemetry;
mod trace_context;
mod xds;

pub use front::FrontDoor;
pub use http::{Admin, response_json, router};
pub use logging::init as init_logging;
pub use record::{
    Answer, Decided, DropReason, FileSpec, HashKey, LivePolicy, RecordConfig, Recorder, Values,
    encode,
};
pub use reference_env::{
    invoked_as_reference, reads as reads_reference_setting, translate as translate_reference_env,
};
pub use server::{Server, StartError, run, start};
pub use settings::{
    BackendType, ConfigType, DefaultsArgs, RateLimitHeaders, RulesFilesArgs, ServeSettings,
    parse_algorithm,
};
pub use status::{LoadReport, ServerStatus};
