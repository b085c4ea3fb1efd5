//! ratelimit-server: an Envoy-compatible external rate-limit service.
pub mod config;
pub mod rules_dir;
