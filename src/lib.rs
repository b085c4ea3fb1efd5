//! ratelimit-server: an Envoy-compatible external rate-limit service.
pub mod clock;
pub mod config;
pub mod limiter;
pub mod policy;
pub mod store;
