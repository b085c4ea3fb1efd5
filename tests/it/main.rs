//! The integration tests, one binary (one link of the crates): real servers over loopback, real
//! clients, real `redis-server` and Envoy processes. Shared parts: `common` (the harness: servers
//! in process and as processes, metrics, waiting, ports, Redis, races, the store contract) and
//! `support` (certificates, Kubernetes manifests and pods). A test that needs redis-server or Envoy
//! is ignored, with the reason, when the build found neither and `CI` is unset (see `build.rs`);
//! under CI it runs, and fails without them.

mod common;
mod support;

// The fuzz targets' own modules (they name each other from the crate root), for `fuzz_corpus`.
#[path = "../../examples/fuzz/admin.rs"]
#[allow(dead_code, reason = "the fuzzer's own parts this test does not call")]
mod admin;
#[path = "../../examples/fuzz/input.rs"]
#[allow(dead_code, reason = "the fuzzer's own parts this test does not call")]
mod input;
#[path = "../../examples/fuzz/record.rs"]
#[allow(dead_code, reason = "the fuzzer's own parts this test does not call")]
mod record;
#[path = "../../examples/fuzz/requests.rs"]
mod requests;
#[path = "../../examples/fuzz/rules.rs"]
#[allow(dead_code, reason = "the fuzzer's own parts this test does not call")]
mod rules;

mod architecture;
mod calendar_windows;
mod check_cli;
mod client_mistakes;
mod concurrency_store;
mod container_image;
mod envoy_e2e;
mod envoy_gateway;
mod envoy_gateway_shapes;
mod explain_agrees;
mod explain_cli;
mod fuzz_corpus;
mod grpc_algorithms;
mod grpc_concurrency;
mod grpc_errors;
mod grpc_leaky;
mod grpc_limits;
mod grpc_uds;
mod hostile_inputs;
mod http_admin;
mod kubernetes;
mod query_cli;
mod quota_api;
mod recording;
mod redis_cluster;
mod redis_cluster_failover;
mod redis_failures;
mod redis_faults;
mod redis_lost_replies;
mod redis_refusals;
mod redis_sentinel;
mod redis_servers;
mod redis_start;
mod redis_store;
mod redis_tls;
mod reference_answer_suite;
mod reference_config;
mod reference_config_suite;
mod reference_env;
mod reference_integration_suite;
mod reference_server_suite;
mod reload;
mod reload_limits;
mod replay_cli;
mod rlqs;
mod shutdown;
mod statsd;
mod tls;
mod tracing;
mod transport;
mod valkey;
mod workers;
mod xds;
