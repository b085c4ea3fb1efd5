//! Test harness: a real server on 127.0.0.1:0 with a manual clock, and a real tonic client.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

pub mod contract;
pub mod fault_proxy;
pub mod metrics;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod race;
pub mod redis;
pub mod replay;
pub mod wait;

pub use ports::free_port;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimit_server::clock::{ManualClock, NANOS_PER_SECOND};
use ratelimit_server::server::{self, Server};
use ratelimit_server::settings::ServeSettings;
use tempfile::TempDir;
use tonic::transport::Channel;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
/// The one request builder, shared with the library's own tests.
#[allow(unused_imports, reason = "each test binary uses a part")]
pub use ratelimit_core::testing::{descriptor, request};

/// 2026-01-01T00:00:10Z: ten seconds into a minute, an hour and a day.
pub const START: u64 = 1_767_225_610 * NANOS_PER_SECOND;

pub struct TestServer {
    pub server: Server,
    pub client: RateLimitServiceClient<Channel>,
    pub clock: ManualClock,
    pub dir: TempDir,
}

/// Starts a server on the given rules files (name, YAML text).
pub async fn start(files: &[(&str, &str)]) -> TestServer {
    start_with(files, |_| {}).await
}

/// Same, letting the test adjust settings first.
pub async fn start_with(
    files: &[(&str, &str)],
    adjust: impl FnOnce(&mut ServeSettings),
) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write rules");
    }
    let config = dir.path().to_path_buf();
    start_at(dir, config, adjust).await
}

/// Starts a server whose rules directory is `config` (inside `dir`, laid out by the caller).
pub async fn start_at(
    dir: TempDir,
    config: std::path::PathBuf,
    adjust: impl FnOnce(&mut ServeSettings),
) -> TestServer {
    start_clocked(dir, config, START, adjust).await
}

/// [`start_with`] with the manual clock at the wall clock's time now: for a store that keeps
/// time itself (Redis expires keys by its own clock).
pub async fn start_now(
    files: &[(&str, &str)],
    adjust: impl FnOnce(&mut ServeSettings),
) -> TestServer {
    use ratelimit_server::clock::{Clock, SystemClock};
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write rules");
    }
    let config = dir.path().to_path_buf();
    start_clocked(dir, config, SystemClock.now(), adjust).await
}

async fn start_clocked(
    dir: TempDir,
    config: std::path::PathBuf,
    now: u64,
    adjust: impl FnOnce(&mut ServeSettings),
) -> TestServer {
    let mut settings = ServeSettings::for_tests(config);
    adjust(&mut settings);
    let clock = ManualClock::new(now);
    let server = server::start(&settings, Arc::new(clock.clone()))
        .await
        .expect("server starts");
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .expect("client connects");
    TestServer {
        server,
        client,
        clock,
        dir,
    }
}

impl TestServer {
    pub async fn call(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit succeeds")
            .into_inner()
    }

    pub async fn call_err(&mut self, request: RateLimitRequest) -> tonic::Status {
        self.client
            .should_rate_limit(request)
            .await
            .expect_err("ShouldRateLimit fails")
    }

    /// Sends one single-descriptor request and returns (code, remaining).
    pub async fn hit(&mut self, domain: &str, entries: &[(&str, &str)]) -> (Code, u32) {
        let r = self.call(request(domain, &[entries])).await;
        (code(r.overall_code), r.statuses[0].limit_remaining)
    }

    /// Base URL of the admin HTTP port.
    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.http_addr)
    }

    /// Polls `probe` (given a client) until it returns true; returns how long it took.
    pub async fn eventually<F, Fut>(&mut self, what: &str, mut probe: F) -> Duration
    where
        F: FnMut(RateLimitServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let client = self.client.clone();
        let took = wait::eventually(what, || probe(client.clone())).await;
        eprintln!("{what}: in force after {took:?}");
        took
    }

    pub fn advance(&self, seconds: u64) {
        self.clock.advance(Duration::from_secs(seconds));
    }
}

pub fn code(value: i32) -> Code {
    Code::try_from(value).expect("a known code")
}

/// The response's headers as (name, value) pairs, in order.
pub fn headers(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

/// `request(domain, [entries])` with zero hits: reports what remains, charges nothing, never held.
pub fn probe(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    let mut r = request(domain, &[entries]);
    r.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    r
}

/// Polls `probe(domain, entries)` until it reports `want` remaining: the way to know that calls
/// sent from other tasks have been decided (a held leaky-bucket answer has taken its turn) without
/// sleeping for a guessed time. Fails only if it never happens (10 s).
pub async fn wait_remaining(
    client: &RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    want: u32,
) {
    let mut client = client.clone();
    let started = tokio::time::Instant::now();
    loop {
        let r = client
            .should_rate_limit(probe(domain, entries))
            .await
            .expect("ShouldRateLimit succeeds")
            .into_inner();
        let remaining = r.statuses[0].limit_remaining;
        if remaining == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{domain} {entries:?}: remaining stayed {remaining}, never {want}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends `bytes` on `stream`, then reads until the server closes it (at most 10 s): what the
/// server answered, as text.
pub async fn answer_to<S>(mut stream: S, bytes: &[u8]) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&answer).into_owned()
}
