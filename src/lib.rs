//! ratelimit-server: an Envoy-compatible external rate-limit service.
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod engine;
pub mod http;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod policy;
pub mod reload;
pub mod rules_dir;
pub mod service;
pub mod settings;
pub mod status;
pub mod store;
