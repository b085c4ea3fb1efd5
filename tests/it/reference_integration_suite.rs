//! envoyproxy/ratelimit's own end-to-end scenarios (`test/integration/integration_test.go` and
//! `mtls_test.go` at f2fb157), run against the real binary from outside, as a deployment that only
//! changed its image runs it: the reference's environment (`RUNTIME_ROOT=runtime/current` relative
//! to the working directory, `RUNTIME_SUBDIRECTORY=ratelimit`, `RUNTIME_APPDIRECTORY=config`,
//! `USE_STATSD=false`, `REDIS_SOCKET_TYPE=tcp`, `PORT`/`GRPC_PORT`/`DEBUG_PORT`, and per scenario
//! `BACKEND_TYPE=redis`/`REDIS_URL`, `REDIS_PERSECOND*`, `LOCAL_CACHE_SIZE_IN_BYTES`,
//! `CACHE_KEY_PREFIX`, `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, `REDIS_AUTH`,
//! `RUNTIME_WATCH_ROOT=false`, `GRPC_SERVER_USE_TLS`…) and its directory layout, with rules of our
//! own that hold the same cases. Each answer is compared as the reference's test compares it:
//! codes, `current_limit`, `limit_remaining`, and the per-rule and config-load stats (here read
//! off `/metrics`, where the reference reads its stats store). Durations are not compared (a real
//! clock): only that a limited status has one, in whole seconds; where the reference's test
//! asserts how one moves, ours differs (ignored, `difference:`).

use crate::common;
use crate::support::certs::{Ca, Leaf, client_config};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::metrics::{count, scrape};
use common::process::{Served, reference_listeners};
use common::redis::RedisServer;
use common::wait::eventually;
use common::{Code, code, free_port, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper_util::rt::TokioIo;
use ratelimit_server::clock::{Clock, NANOS_PER_SECOND, SystemClock};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

// Our rules for the reference's `config/` files: domain `basic` (a per-second limit and a
// per-minute one), domain `another` (minute, hour and day limits, one key per case), the
// share_threshold domain, and the file the reload scenario copies in. Each key has a `_local`
// twin: the reference's local-cache runs use those, so that their counters are apart.
const BASIC: &str = "\
domain: basic
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: key1_local, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
";

const ANOTHER: &str = "\
domain: another
descriptors:
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2_local, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: key3_local, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: key4, rate_limit: {unit: day, requests_per_unit: 20}}
  - {key: key4_local, rate_limit: {unit: day, requests_per_unit: 20}}
";

const SHARED: &str = "\
domain: share-threshold-test
descriptors:
  # Every value under files/ counts against one threshold.
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  # Each value under files_no_share/ has its own.
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// Swapped into `config/` by the reload scenario (kept beside it, outside `config/`, until then).
const RELOADED: &str = "\
domain: reload
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: block, rate_limit: {unit: second, requests_per_unit: 0}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
";

/// The reference's runtime layout in a fresh directory, the server's working directory:
/// `runtime/current/ratelimit/config/{basic,another,share_threshold}.yaml` and
/// `runtime/current/ratelimit/reload.yaml`.
fn runtime_layout() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = config_dir(dir.path());
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("basic.yaml"), BASIC).unwrap();
    std::fs::write(config.join("another.yaml"), ANOTHER).unwrap();
    std::fs::write(config.join("share_threshold.yaml"), SHARED).unwrap();
    std::fs::write(config.parent().unwrap().join("reload.yaml"), RELOADED).unwrap();
    dir
}

fn config_dir(cwd: &Path) -> PathBuf {
    cwd.join("runtime/current/ratelimit/config")
}

/// Starts the binary in `cwd` as the reference's test starts its runner, by environment alone:
/// its `defaultSettings()` (runtime path relative to the working directory, subdirectory and app
/// directory, TCP Redis sockets, statsd off, its own ports, here free ones on loopback) plus
/// `extra`. Returns once `/healthcheck` answers 200.
async fn launch(cwd: &Path, extra: &[(&str, String)]) -> Served {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command
        .current_dir(cwd)
        .env_clear()
        .env("RUNTIME_ROOT", "runtime/current")
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_APPDIRECTORY", "config")
        .env("REDIS_PERSECOND_SOCKET_TYPE", "tcp")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("USE_STATSD", "false")
        .env("SHUTDOWN_DELAY", "0s");
    let (http, grpc, _debug) = reference_listeners(&mut command);
    for (name, value) in extra {
        command.env(name, value);
    }
    let mut served = Served::spawn_command(command, grpc, http);
    served.wait_healthy().await;
    served
}

/// A server started by [`launch`] and a plaintext gRPC client to it.
struct Reference {
    served: Served,
    client: RateLimitServiceClient<Channel>,
}

impl Reference {
    /// Starts the binary in `cwd` with the reference's integration-test environment plus
    /// `extra`, and connects a plaintext gRPC client.
    async fn start(cwd: &Path, extra: &[(&str, String)]) -> Reference {
        let mut served = launch(cwd, extra).await;
        let client = served.client().await;
        Reference { served, client }
    }

    async fn call(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        match self.client.should_rate_limit(request).await {
            Ok(r) => r.into_inner(),
            Err(e) => panic!("ShouldRateLimit failed: {e}\n{}", self.served.log()),
        }
    }

    async fn metrics(&self) -> String {
        scrape(&format!("{}/metrics", self.served.http)).await
    }
}

/// The environment of the reference's `makeSimpleRedisSettings(port, perSecondPort, perSecond,
/// localCacheSize)` for a Redis on `redis` (the per-second one on `per_second` when asked).
fn redis_env(
    redis: &RedisServer,
    per_second: Option<&RedisServer>,
    local_cache: usize,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_URL", redis.addr()),
        ("LOCAL_CACHE_SIZE_IN_BYTES", local_cache.to_string()),
    ];
    if let Some(p) = per_second {
        env.push(("REDIS_PERSECOND", "true".to_owned()));
        env.push(("REDIS_PERSECOND_URL", p.addr()));
    }
    env
}

/// The status the reference's `newDescriptorStatus(code, rpu, unit, remaining, _)` builds, with
/// the answer's own `duration_until_reset`, as the reference's test copies it: present, and whole
/// seconds (it copies the seconds alone, so nanoseconds other than 0 would fail its comparison).
fn limited(code: Code, rpu: u32, unit: Unit, remaining: u32, actual: &DescriptorStatus) -> String {
    let reset = actual
        .duration_until_reset
        .expect("a limited status has duration_until_reset");
    assert_eq!(reset.nanos, 0, "whole seconds: {actual:?}");
    let expected = DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(reset),
        quota: None,
    };
    format!("{expected:?}")
}

/// Asserts `r` is `overall` with `statuses` (each `limited(...)` text or an unlimited OK).
fn assert_answer(r: &RateLimitResponse, overall: Code, statuses: &[String], what: &str) {
    assert_eq!(code(r.overall_code), overall, "{what}: {r:?}");
    let got: Vec<String> = r.statuses.iter().map(|s| format!("{s:?}")).collect();
    assert_eq!(got, statuses, "{what}");
    assert!(r.response_headers_to_add.is_empty(), "{what}: {r:?}");
}

/// `key` for the run: the reference's local-cache runs use the `_local` keys.
fn key(name: &str, local: bool) -> String {
    if local {
        format!("{name}_local")
    } else {
        name.to_owned()
    }
}

/// A rule's count of `stat` (`total_hits`, `over_limit`…) on a `/metrics` page, where the
/// reference's stat is `ratelimit.service.rate_limit.<domain>.<rule>.<stat>`.
fn rule_stat(page: &str, stat: &str, domain: &str, rule: &str) -> u64 {
    let name = format!("ratelimit_service_rate_limit_{stat}{{");
    let (d, r) = (format!("domain=\"{domain}\""), format!("rule=\"{rule}\""));
    page.lines()
        .filter(|l| l.starts_with(&name) && l.contains(&d) && l.contains(&r))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// A value unique to this run, as the reference's `rand.Int()` values.
fn unique() -> String {
    SystemClock.now().to_string()
}

/// Waits out the last seconds of a wall-clock minute, so that the reference's fixed windows (a
/// minute, an hour) do not turn over in the middle of a scenario that fills one.
async fn not_at_a_minute_end() {
    let second = SystemClock.now() / NANOS_PER_SECOND % 60;
    if second >= 55 {
        tokio::time::sleep(Duration::from_secs(61 - second)).await;
    }
}

/// The reference's `testBasicBaseConfig`: an unknown domain, a per-second limit, a minute limit
/// filled and passed, two descriptors of one request (one over), and the per-rule stats of each.
/// `stop_increment`: the run sets `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`, where the
/// reference's expectations are ours (a denied request charges no descriptor); without it the
/// reference charges the descriptor that fitted, which docs/compatibility.md states we do not.
async fn basic_scenario(s: &mut Reference, local: bool, stop_increment: bool) {
    // The stats the reference's ExtraTags run reads after start-up: one config load.
    let page = s.metrics().await;
    assert_eq!(
        count(&page, "ratelimit_service_config_load_success"),
        1,
        "{page}"
    );

    // A domain with no rules: OK, one status with nothing but its code.
    let r = s
        .call(request("foo", &[&[(&key("hello", local), "world")]]))
        .await;
    let bare = format!(
        "{:?}",
        DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }
    );
    assert_answer(&r, Code::Ok, &[bare], "unknown domain");

    // 50 per second: 49 left.
    let key1 = key("key1", local);
    let r = s.call(request("basic", &[&[(&key1, "foo")]])).await;
    let want = limited(Code::Ok, 50, Unit::Second, 49, &r.statuses[0]);
    assert_answer(&r, Code::Ok, &[want], "basic key1");
    let page = s.metrics().await;
    assert_eq!(rule_stat(&page, "total_hits", "basic", &key1), 1, "{page}");

    // 20 per minute, 25 calls on a fresh value: 19..0 left, then OVER_LIMIT with 0.
    not_at_a_minute_end().await;
    let key2 = key("key2", local);
    let value = unique();
    for i in 0..25u32 {
        let r = s.call(request("another", &[&[(&key2, &value)]])).await;
        let (status, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 20 - (i + 1))
        };
        let want = limited(status, 20, Unit::Minute, remaining, &r.statuses[0]);
        assert_answer(&r, status, &[want], &format!("key2 call {i}"));
    }
    let page = s.metrics().await;
    assert_eq!(rule_stat(&page, "total_hits", "another", &key2), 25);
    assert_eq!(rule_stat(&page, "over_limit", "another", &key2), 5);

    // Two descriptors in one request, 20/minute and 10/hour, on a fresh value, 15 calls: the
    // second is over from the 11th call, which makes the whole answer OVER_LIMIT.
    let key3 = key("key3", local);
    let value = unique();
    for i in 0..15u32 {
        let r = s
            .call(request(
                "another",
                &[&[(&key2, &value)], &[(&key3, &value)]],
            ))
            .await;
        let mut remaining1 = 20 - (i + 1);
        let (status, remaining2) = if i >= 10 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 10 - (i + 1))
        };
        if i >= 10 {
            // The reference with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true leaves the first
            // counter where the last allowed call left it, as we always do.
            assert!(stop_increment, "only the stop-increment runs get here");
            remaining1 = 10;
        }
        let want = [
            limited(Code::Ok, 20, Unit::Minute, remaining1, &r.statuses[0]),
            limited(status, 10, Unit::Hour, remaining2, &r.statuses[1]),
        ];
        assert_answer(&r, status, &want, &format!("key2+key3 call {i}"));
        if !stop_increment && i == 9 {
            break;
        }
    }
    let page = s.metrics().await;
    let calls = if stop_increment { 15 } else { 10 };
    // Every call counts in total_hits, denied ones too; over_limit counts the denied descriptor.
    assert_eq!(
        rule_stat(&page, "total_hits", "another", &key2),
        25 + calls,
        "{page}"
    );
    assert_eq!(rule_stat(&page, "over_limit", "another", &key2), 5);
    assert_eq!(rule_stat(&page, "total_hits", "another", &key3), calls);
    assert_eq!(rule_stat(&page, "over_limit", "another", &key3), calls - 10);
}

/// The reference's `TestBasicConfig` with no Redis: the in-memory store under the same
/// environment (`RUNTIME_WATCH_ROOT` left at its default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_basic_scenario_in_memory() {
    let dir = runtime_layout();
    for stop_increment in [false, true] {
        let env = if stop_increment {
            vec![("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true".to_owned())]
        } else {
            vec![]
        };
        let mut s = Reference::start(dir.path(), &env).await;
        basic_scenario(&mut s, false, stop_increment).await;
    }
}

/// The reference's `TestBasicConfig` runs on one Redis (and a per-second one): without and with
/// `REDIS_PERSECOND`, `LOCAL_CACHE_SIZE_IN_BYTES=1000` (the `_local` keys), `CACHE_KEY_PREFIX`,
/// and `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` with each. Redis is emptied between runs, where
/// the reference relies on the clock moving on.
#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_basic_scenario_on_redis_in_each_of_the_references_settings() {
    let (Some(redis), Some(per_second)) = (RedisServer::start(), RedisServer::start()) else {
        return;
    };
    let dir = runtime_layout();
    // (the reference's name, a per-second Redis, LOCAL_CACHE_SIZE_IN_BYTES, CACHE_KEY_PREFIX,
    // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)
    type Run<'a> = (
        &'a str,
        Option<&'a RedisServer>,
        usize,
        Option<&'a str>,
        bool,
    );
    let runs: [Run; 9] = [
        ("WithoutPerSecondRedis", None, 0, None, false),
        ("WithPerSecondRedis", Some(&per_second), 0, None, false),
        (
            "WithoutPerSecondRedisWithLocalCache",
            None,
            1000,
            None,
            false,
        ),
        (
            "WithPerSecondRedisWithLocalCache",
            Some(&per_second),
            1000,
            None,
            false,
        ),
        (
            "WithoutPerSecondRedisWithCachePrefix",
            None,
            0,
            Some("prefix:"),
            false,
        ),
        ("WithoutPerSecondRedisStopIncrement", None, 0, None, true),
        (
            "WithPerSecondRedisStopIncrement",
            Some(&per_second),
            0,
            None,
            true,
        ),
        (
            "WithoutPerSecondRedisLocalCacheStopIncrement",
            None,
            1000,
            None,
            true,
        ),
        (
            "WithPerSecondRedisLocalCacheStopIncrement",
            Some(&per_second),
            1000,
            None,
            true,
        ),
    ];
    for (name, per_second, local_cache, prefix, stop_increment) in runs {
        eprintln!("run {name}");
        redis.cli(&["FLUSHALL"]).unwrap();
        let mut env = redis_env(&redis, per_second, local_cache);
        if let Some(prefix) = prefix {
            env.push(("CACHE_KEY_PREFIX", prefix.to_owned()));
        }
        if stop_increment {
            env.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true".to_owned()));
        }
        let mut s = Reference::start(dir.path(), &env).await;
        basic_scenario(&mut s, local_cache > 0, stop_increment).await;
        if let Some(prefix) = prefix {
            let keys = redis.cli(&["KEYS", "*"]).unwrap();
            assert!(
                keys.lines().all(|k| k.starts_with(prefix)),
                "{name}: every key under CACHE_KEY_PREFIX: {keys}"
            );
        }
    }
}

/// The reference's `TestBasicAuthConfig`: Redis with a password, `REDIS_AUTH` giving it.
#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_basic_scenario_on_a_redis_with_a_password() {
    assert!(common::redis::available());
    let redis = RedisServer::spawn(
        free_port(),
        &["--requirepass", "password123"],
        ["-a", "password123", "--no-auth-warning"]
            .map(String::from)
            .to_vec(),
    );
    let dir = runtime_layout();
    let mut env = redis_env(&redis, None, 0);
    env.push(("REDIS_AUTH", "password123".to_owned()));
    let mut s = Reference::start(dir.path(), &env).await;
    basic_scenario(&mut s, false, true).await;
}

/// The reference's `TestBasicTLSConfig` (without a per-second Redis): Redis over TLS with a
/// password (`REDIS_TLS`, `REDIS_TLS_CACERT`, `REDIS_AUTH`), then one that asks for a client
/// certificate (`REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`), where the reference's Makefile
/// puts stunnel in front of Redis.
#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_basic_scenario_on_redis_over_tls() {
    assert!(common::redis::available());
    let certs = tempfile::tempdir().unwrap();
    let ca = Ca::new("redis CA");
    let ca_file = certs.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let (server_cert, server_key) = ca.server("redis").write(certs.path(), "server");
    let (client_cert, client_key) = ca.client(&["client"]).write(certs.path(), "client");
    let path = |p: &Path| p.display().to_string();
    let dir = runtime_layout();
    for client_certificate in [false, true] {
        let port = free_port();
        let args = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &path(&server_cert),
            "--tls-key-file",
            &path(&server_key),
            "--tls-ca-cert-file",
            &path(&ca_file),
            "--tls-auth-clients",
            if client_certificate { "yes" } else { "no" },
            "--requirepass",
            "password123",
        ]
        .map(str::to_owned);
        let cli = [
            "--tls",
            "--cacert",
            &path(&ca_file),
            "--cert",
            &path(&client_cert),
            "--key",
            &path(&client_key),
            "-a",
            "password123",
            "--no-auth-warning",
        ]
        .map(str::to_owned);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let redis = RedisServer::spawn(port, &args, cli.to_vec());
        let mut env = redis_env(&redis, None, 0);
        env.extend([
            ("REDIS_TLS", "true".to_owned()),
            ("REDIS_TLS_CACERT", path(&ca_file)),
            ("REDIS_AUTH", "password123".to_owned()),
        ]);
        if client_certificate {
            env.push(("REDIS_TLS_CLIENT_CERT", path(&client_cert)));
            env.push(("REDIS_TLS_CLIENT_KEY", path(&client_key)));
        }
        let mut s = Reference::start(dir.path(), &env).await;
        basic_scenario(&mut s, false, true).await;
    }
}

/// The reference's `TestBasicReloadConfig` (`RUNTIME_WATCH_ROOT=false`): the basic scenario,
/// then a file copied into `config/` is in force once `config_load_success` has moved, and its
/// removal is a load too.
async fn reload_scenario(extra: Vec<(&'static str, String)>) {
    let dir = runtime_layout();
    let mut env = extra;
    env.push(("RUNTIME_WATCH_ROOT", "false".to_owned()));
    let mut s = Reference::start(dir.path(), &env).await;
    basic_scenario(&mut s, false, true).await;

    // Before: the domain has no rules, so OK with a bare status.
    let r = s.call(request("reload", &[&[("block", "foo")]])).await;
    let bare = format!(
        "{:?}",
        DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }
    );
    assert_answer(&r, Code::Ok, &[bare], "reload domain before its file");
    let loads = "ratelimit_service_config_load_success";
    let before = count(&s.metrics().await, loads);

    // The file copied in, as the reference's test copies it (create, then write).
    let config = config_dir(dir.path());
    std::fs::copy(
        config.parent().unwrap().join("reload.yaml"),
        config.join("reload.yaml"),
    )
    .unwrap();
    let server = &s;
    eventually("a load after the copy", || async {
        count(&server.metrics().await, loads) > before
    })
    .await;
    let r = s.call(request("reload", &[&[("key1", "foo")]])).await;
    let want = limited(Code::Ok, 50, Unit::Second, 49, &r.statuses[0]);
    assert_answer(&r, Code::Ok, &[want], "reload key1 after the copy");
    let page = s.metrics().await;
    assert_eq!(
        count(&page, "ratelimit_service_config_load_error"),
        0,
        "{page}\n{}",
        s.served.log()
    );

    // Removing it is a load too.
    let after = count(&page, loads);
    std::fs::remove_file(config.join("reload.yaml")).unwrap();
    let server = &s;
    eventually("a load after the removal", || async {
        count(&server.metrics().await, loads) > after
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_copied_into_the_watched_directory_and_removed_reloads_in_memory() {
    reload_scenario(vec![]).await;
}

#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_copied_into_the_watched_directory_and_removed_reloads_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    reload_scenario(redis_env(&redis, None, 0)).await;
}

/// The reference's `TestShareThreshold`: values matching a `share_threshold` wildcard share one
/// counter (the 11th call, on another value, is over), values of a plain wildcard each have
/// their own.
async fn share_threshold_scenario(extra: Vec<(&'static str, String)>) {
    let dir = runtime_layout();
    let mut s = Reference::start(dir.path(), &extra).await;
    let domain = "share-threshold-test";
    for i in 0..10 {
        let r = s
            .call(request(domain, &[&[("files", "files/a.pdf")]]))
            .await;
        assert_eq!(code(r.overall_code), Code::Ok, "call {i}: {r:?}");
    }
    let r = s
        .call(request(domain, &[&[("files", "files/b.csv")]]))
        .await;
    let want = limited(Code::OverLimit, 10, Unit::Hour, 0, &r.statuses[0]);
    assert_answer(
        &r,
        Code::OverLimit,
        &[want],
        "files/b.csv after 10 of files/a.pdf",
    );
    let base = unique();
    for i in 0..10 {
        let value = format!("files_no_share/{base}-{i}");
        let r = s
            .call(request(domain, &[&[("files_no_share", &value)]]))
            .await;
        let want = limited(Code::Ok, 10, Unit::Hour, 9, &r.statuses[0]);
        assert_answer(&r, Code::Ok, &[want], &value);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_threshold_is_one_counter_in_memory() {
    share_threshold_scenario(vec![]).await;
}

#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_threshold_is_one_counter_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    share_threshold_scenario(redis_env(&redis, None, 0)).await;
}

/// The end of the reference's `testBasicBaseConfig`: two hits on a day limit (20/day) two seconds
/// apart, and the second's `duration_until_reset` is shorter than the first's (a fixed window's
/// end comes nearer). Ours, under the reference's environment, made a rule without `algorithm` a
/// token bucket, whose time until full grows with each hit (4320 s, then about 8638 s); it now
/// counts in the reference's fixed windows there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_until_reset_of_a_day_limit_shrinks_between_two_hits() {
    let dir = runtime_layout();
    let mut s = Reference::start(dir.path(), &[]).await;
    let hit = request("another", &[&[("key4", "durTest")]]);
    let first = s.call(hit.clone()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = s.call(hit).await;
    let seconds = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!(seconds(&second) < seconds(&first), "{first:?}\n{second:?}");
}

/// The reference's local-cache runs (`LOCAL_CACHE_SIZE_IN_BYTES=1000` with Redis): once Redis has
/// found a limit over, the next calls on it are answered from the local cache without Redis; after
/// 25 calls on a 20/minute limit, 4 were (its `over_limit_with_local_cache`, which ours counts in
/// `ratelimit_over_limit_with_local_cache`). Ours keeps that cache for fixed windows only, and the
/// reference's rules, which name no algorithm, were token buckets here: none was.
#[cfg_attr(no_redis, ignore = "needs redis-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_over_limit_calls_are_answered_from_the_local_cache() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = runtime_layout();
    let mut s = Reference::start(dir.path(), &redis_env(&redis, None, 1000)).await;
    not_at_a_minute_end().await;
    for _ in 0..25 {
        s.call(request("another", &[&[("key2_local", "cached")]]))
            .await;
    }
    let page = s.metrics().await;
    assert_eq!(
        count(&page, "ratelimit_over_limit_with_local_cache"),
        4,
        "{page}"
    );
}

// --- gRPC TLS (`mtls_test.go`, `Test_mTLS`, `TestReloadGRPCServerCerts`) ---

/// PKCS#1 RSA keys made once with `openssl genrsa -traditional 2048`: the reference's test signs
/// its certificates with RSA keys it writes as `RSA PRIVATE KEY` PEM, so ours are the same kind.
const SERVER_CA_KEY: &str = include_str!("../fixtures/reference-integration/server-ca.rsa.key");
const SERVER_KEY: &str = include_str!("../fixtures/reference-integration/server.rsa.key");
const NEW_SERVER_CA_KEY: &str =
    include_str!("../fixtures/reference-integration/server-ca-new.rsa.key");
const NEW_SERVER_KEY: &str = include_str!("../fixtures/reference-integration/server-new.rsa.key");
const CLIENT_CA_KEY: &str = include_str!("../fixtures/reference-integration/client-ca.rsa.key");
const CLIENT_KEY: &str = include_str!("../fixtures/reference-integration/client.rsa.key");

/// A PKCS#1 `RSA PRIVATE KEY` PEM as an rcgen key pair (rcgen with ring reads PKCS#8 only: the
/// PKCS#1 key is wrapped in a PKCS#8 PrivateKeyInfo).
fn rsa_key_pair(pkcs1_pem: &str) -> KeyPair {
    let PrivateKeyDer::Pkcs1(pkcs1) = PrivateKeyDer::from_pem_slice(pkcs1_pem.as_bytes()).unwrap()
    else {
        panic!("a PKCS#1 key")
    };
    fn der(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match body.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(body);
        out
    }
    // version 0, AlgorithmIdentifier {rsaEncryption, NULL}, OCTET STRING of the PKCS#1 key.
    let mut info = vec![0x02, 0x01, 0x00];
    info.extend(der(
        0x30,
        &[
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
        ],
    ));
    info.extend(der(0x04, pkcs1.secret_pkcs1_der()));
    let pkcs8 = der(0x30, &info);
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &rcgen::PKCS_RSA_SHA256)
        .unwrap()
}

/// The reference's `createCA`: a CA for client and server authentication.
fn rsa_ca(org: &str, key_pem: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ClientAuth,
        ExtendedKeyUsagePurpose::ServerAuth,
    ];
    CertifiedIssuer::self_signed(params, rsa_key_pair(key_pem)).unwrap()
}

/// The reference's `signCert`: a leaf for DNS name `dns` (`localhost` there), server or client
/// usage, its key as the PKCS#1 PEM.
fn rsa_leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    key_pem: &str,
    server: bool,
    dns: &str,
) -> Leaf {
    let mut params = CertificateParams::new(vec![dns.to_owned()]).unwrap();
    let name = if server { "Server" } else { "Client" };
    params
        .distinguished_name
        .push(DnType::OrganizationName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    let cert = params.signed_by(&rsa_key_pair(key_pem), &**ca).unwrap();
    Leaf {
        cert_pem: cert.pem(),
        key_pem: key_pem.to_owned(),
    }
}

/// A TLS connection to `localhost:port` trusting `ca_pem` only, with ALPN `alpn` and `identity`
/// as client certificate: Ok, or the handshake's error.
async fn tls_connect(
    port: u16,
    ca_pem: &str,
    identity: Option<&Leaf>,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = client_config(ca_pem, identity, alpn);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(config).connect(name, tcp).await
}

/// One ShouldRateLimit over a new mTLS gRPC connection: its overall code, or the error.
async fn call_over_tls(port: u16, ca_pem: &str, identity: Option<&Leaf>) -> Result<Code, String> {
    let config: Arc<rustls::ClientConfig> = client_config(ca_pem, identity, &[b"h2"]);
    let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = TlsConnector::from(config.clone());
            async move {
                let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let r = RateLimitServiceClient::new(channel)
        .should_rate_limit(request("basic", &[&[("key1", "tls")]]))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(code(r.into_inner().overall_code))
}

/// The reference's `Test_mTLS`: `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`/`_KEY` (an RSA key
/// in PKCS#1 PEM), `GRPC_CLIENT_TLS_CACERT` and `GRPC_CLIENT_TLS_SAN=localhost`: a client with a
/// certificate of that CA for `localhost` is answered. (The reference's test only dials, lazily;
/// that the server requires the certificate is its `RequireAndVerifyClientCert`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_mtls_from_the_references_settings() {
    let dir = runtime_layout();
    let certs = tempfile::tempdir().unwrap();
    let server_ca = rsa_ca("Acme CA", SERVER_CA_KEY);
    let client_ca = rsa_ca("Acme Client CA", CLIENT_CA_KEY);
    let (cert, key) =
        rsa_leaf(&server_ca, SERVER_KEY, true, "localhost").write(certs.path(), "server");
    let client = rsa_leaf(&client_ca, CLIENT_KEY, false, "localhost");
    let client_ca_file = certs.path().join("client-ca.pem");
    std::fs::write(&client_ca_file, client_ca.pem()).unwrap();
    let path = |p: &Path| p.display().to_string();
    let s = launch(
        dir.path(),
        &[
            ("GRPC_SERVER_USE_TLS", "true".to_owned()),
            ("GRPC_SERVER_TLS_CERT", path(&cert)),
            ("GRPC_SERVER_TLS_KEY", path(&key)),
            ("GRPC_CLIENT_TLS_CACERT", path(&client_ca_file)),
            ("GRPC_CLIENT_TLS_SAN", "localhost".to_owned()),
        ],
    )
    .await;
    let port = s.grpc;
    assert_eq!(
        call_over_tls(port, &server_ca.pem(), Some(&client)).await,
        Ok(Code::Ok),
        "{}",
        s.log()
    );
    // Without a client certificate, or with one of the CA for another name: refused.
    assert!(call_over_tls(port, &server_ca.pem(), None).await.is_err());
    let stranger = rsa_leaf(&client_ca, CLIENT_KEY, false, "other.example");
    assert!(
        call_over_tls(port, &server_ca.pem(), Some(&stranger))
            .await
            .is_err()
    );
}

/// The reference's `TestReloadGRPCServerCerts`: the certificate and key files renamed over by
/// ones of another CA are served to new connections (within the reference's 10 s), and the old
/// CA no longer verifies. Plain TLS dials without ALPN, as its `tls.Dial`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_server_certificates_renamed_over_are_served() {
    let dir = runtime_layout();
    let certs = tempfile::tempdir().unwrap();
    let initial_ca = rsa_ca("Acme CA", SERVER_CA_KEY);
    let new_ca = rsa_ca("Acme CA 2", NEW_SERVER_CA_KEY);
    let (cert, key) =
        rsa_leaf(&initial_ca, SERVER_KEY, true, "localhost").write(certs.path(), "server");
    let (new_cert, new_key) =
        rsa_leaf(&new_ca, NEW_SERVER_KEY, true, "localhost").write(certs.path(), "server-new");
    let path = |p: &Path| p.display().to_string();
    let s = launch(
        dir.path(),
        &[
            ("GRPC_SERVER_USE_TLS", "true".to_owned()),
            ("GRPC_SERVER_TLS_CERT", path(&cert)),
            ("GRPC_SERVER_TLS_KEY", path(&key)),
        ],
    )
    .await;
    let port = s.grpc;
    let (initial, new) = (initial_ca.pem(), new_ca.pem());
    assert!(
        tls_connect(port, &initial, None, &[]).await.is_ok(),
        "{}",
        s.log()
    );
    assert!(tls_connect(port, &new, None, &[]).await.is_err());
    std::fs::rename(&new_cert, &cert).unwrap();
    std::fs::rename(&new_key, &key).unwrap();
    eventually("the renamed certificate served", || async {
        tls_connect(port, &new, None, &[]).await.is_ok()
    })
    .await;
    assert!(tls_connect(port, &initial, None, &[]).await.is_err());
}
