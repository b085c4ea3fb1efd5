//! Rules from an xDS management server (`CONFIG_TYPE=GRPC_XDS_SOTW`), as envoyproxy/ratelimit
//! takes them from Envoy Gateway: an ADS State-of-the-World subscription to `RateLimitConfig`
//! resources, each response replacing the whole rule set through the reloader's
//! validate-then-swap, ACKed when applied and NACKed (naming the resource and field) when not.
//!
//! Parts: `convert` (resources → rules documents, errors → resource and field; pure),
//! `protocol` (the requests: subscribe, ACK, NACK; pure), `backoff` (reconnect waits; pure),
//! `settings` (the reference's setting names), `tls` (the client side of mTLS), `mismatch` (TLS
//! on one side only: which setting to change), `silence` (a stream that goes unanswered: warned
//! of, counted), `client` (the task).

mod backoff;
mod client;
mod convert;
mod mismatch;
mod protocol;
mod settings;
mod silence;
mod tls;

pub(crate) use client::XdsClient;
pub use settings::ConfigType;
pub(crate) use settings::{XdsArgs, XdsConfig};
pub(crate) use silence::XdsMetrics;
