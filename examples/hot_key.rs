//! The hot-key race, from outside: several server processes (`--server-bin`, the release binary)
//! on one Redis, each driven with CONNECTIONS × IN_FLIGHT calls on one key, and what they admitted
//! together against the limit, how many answers came from `REDIS_FAILURE_MODE`, errors, latency.
//!
//! ```sh
//! cargo build --release --bin ratelimit-server --example hot_key
//! target/release/examples/hot_key --server-bin target/release/ratelimit-server \
//!     --instances 2 --shape 4x64 --requests 5000 --limit 300 --algorithms token_bucket
//! ```
//!
//! The rules are one key per algorithm (`tb`, `fw`, `sw`, `lb`), `--limit` per hour (`--high`:
//! a limit nobody reaches, so every decision writes: the throughput case). Each instance starts
//! with the defaults a user gets (`REDIS_TIMEOUT` 100 ms, `REDIS_FAILURE_MODE` local) unless
//! `--env NAME=VALUE` says otherwise. A redis-server is started on a free port for the run.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use ratelimit_core::testing::request;
use ratelimit_server::clock::monotonic;
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Parser)]
struct Args {
    /// The server binary to run (e.g. target/release/ratelimit-server, or an older build).
    #[arg(long)]
    server_bin: std::path::PathBuf,
    /// Server processes sharing the Redis.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    /// Per instance: connections × calls in flight in total (spread over the connections).
    #[arg(long, default_value = "4x64")]
    shape: String,
    /// Requests per instance and algorithm.
    #[arg(long, default_value_t = 5000)]
    requests: usize,
    /// Requests per hour the key allows.
    #[arg(long, default_value_t = 300)]
    limit: u64,
    /// A limit nobody reaches instead (every decision writes).
    #[arg(long)]
    high: bool,
    /// Algorithms to race, one after the other (each on its own key).
    #[arg(long, value_delimiter = ',', default_value = "token_bucket")]
    algorithms: Vec<String>,
    /// Extra environment for the servers (NAME=VALUE), e.g. REDIS_TIMEOUT=30s.
    #[arg(long = "env")]
    env: Vec<String>,
    /// Use this Redis (host:port) instead of starting one.
    #[arg(long)]
    redis_url: Option<String>,
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn key_of(algorithm: &str) -> &'static str {
    match algorithm {
        "token_bucket" => "tb",
        "fixed_window" => "fw",
        "sliding_window" => "sw",
        "leaky_bucket" => "lb",
        other => panic!("unknown algorithm {other}"),
    }
}

fn rules(limit: u64) -> String {
    let mut text = String::from("domain: hot\ndescriptors:\n");
    for algorithm in [
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "leaky_bucket",
    ] {
        let extra = if algorithm == "leaky_bucket" {
            ", max_delay: 0s"
        } else {
            ""
        };
        text.push_str(&format!(
            "  - key: {}\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: {algorithm}{extra}}}\n",
            key_of(algorithm)
        ));
    }
    text
}

/// The sum of a metric's samples in a Prometheus text page (every label set), 0 if absent.
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn scrape(admin: SocketAddr) -> String {
    let url = format!("http://{admin}/metrics");
    match reqwest::get(&url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

#[derive(Default)]
struct Tally {
    ok: usize,
    over: usize,
    errors: usize,
}

/// `count` calls on `key=x`, `in_flight` at a time over `channels`; the latency of each in µs.
async fn drive(
    channels: Vec<Channel>,
    key: &'static str,
    count: usize,
    in_flight: usize,
    latency: Arc<std::sync::Mutex<Histogram<u64>>>,
) -> Tally {
    let gate = Arc::new(Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let permit = gate.clone().acquire_owned().await.expect("open");
        let mut client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
        let latency = latency.clone();
        tasks.push(tokio::spawn(async move {
            let started = monotonic();
            let answer = client
                .should_rate_limit(request("hot", &[&[(key, "x")]]))
                .await;
            let us = started.elapsed().as_micros() as u64;
            let _ = latency.lock().expect("histogram").record(us.max(1));
            drop(permit);
            answer.map(|r| r.into_inner().overall_code)
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        match t.await.expect("task") {
            Ok(c) if c == Code::Ok as i32 => tally.ok += 1,
            Ok(_) => tally.over += 1,
            Err(_) => tally.errors += 1,
        }
    }
    tally
}

fn start_redis() -> (Process, String) {
    let port = free_addr().port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    (Process(child), format!("127.0.0.1:{port}"))
}

async fn wait_ready(admin: SocketAddr) {
    let started = monotonic();
    loop {
        if let Ok(r) = reqwest::get(format!("http://{admin}/healthcheck")).await
            && r.status().is_success()
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "server never became healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let (connections, in_flight) = args
        .shape
        .split_once('x')
        .and_then(|(c, f)| Some((c.parse::<usize>().ok()?, f.parse::<usize>().ok()?)))
        .expect("--shape CONNECTIONSxIN_FLIGHT");
    let limit = if args.high { 1_000_000_000 } else { args.limit };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("hot.yaml"), rules(limit)).expect("rules");
    let (_redis, redis_url) = match &args.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let (p, url) = start_redis();
            (Some(p), url)
        }
    };
    // Wait for redis-server to take connections.
    let started = monotonic();
    while std::net::TcpStream::connect(&redis_url).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no redis-server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut servers = Vec::new();
    for _ in 0..args.instances {
        let (grpc, admin) = (free_addr(), free_addr());
        let mut command = Command::new(&args.server_bin);
        command
            .args(["serve", "--config"])
            .arg(dir.path())
            .args(["--grpc-addr", &grpc.to_string()])
            .args(["--http-addr", &admin.to_string()])
            .env("BACKEND_TYPE", "redis")
            .env("REDIS_URL", &redis_url)
            .env("LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for pair in &args.env {
            let (name, value) = pair.split_once('=').expect("--env NAME=VALUE");
            command.env(name, value);
        }
        servers.push((Process(command.spawn().expect("spawn server")), grpc, admin));
    }
    for (_, _, admin) in &servers {
        wait_ready(*admin).await;
    }
    println!(
        "{} instances × {connections}×{in_flight} in flight × {} requests, limit {}/hour{}",
        args.instances,
        args.requests,
        limit,
        if args.high {
            " (nobody reaches it)"
        } else {
            ""
        }
    );
    for algorithm in &args.algorithms {
        let key = key_of(algorithm);
        let before: Vec<String> = scrape_all(servers.iter().map(|s| scrape(s.2))).await;
        let latency = Arc::new(std::sync::Mutex::new(
            Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
        ));
        let started = monotonic();
        let mut runs = Vec::new();
        for (_, grpc, _) in &servers {
            let mut channels = Vec::new();
            for _ in 0..connections {
                channels.push(
                    Endpoint::from_shared(format!("http://{grpc}"))
                        .expect("uri")
                        .tcp_nodelay(true)
                        .connect()
                        .await
                        .expect("connect"),
                );
            }
            runs.push(tokio::spawn(drive(
                channels,
                key,
                args.requests,
                in_flight,
                latency.clone(),
            )));
        }
        let mut total = Tally::default();
        for r in runs {
            let t = r.await.expect("run");
            total.ok += t.ok;
            total.over += t.over;
            total.errors += t.errors;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after: Vec<String> = scrape_all(servers.iter().map(|s| scrape(s.2))).await;
        let delta = |name: &str| -> f64 {
            before
                .iter()
                .zip(&after)
                .map(|(b, a)| metric(a, name) - metric(b, name))
                .sum()
        };
        let h = latency.lock().expect("histogram");
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "{algorithm:>14}: admitted {} of limit {limit}, over {}, gRPC errors {}, failure-mode answers {}, store errors {}, \
             {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, Redis calls {}",
            total.ok,
            total.over,
            total.errors,
            delta("ratelimit_store_failure_mode_decisions"),
            delta("ratelimit_store_errors"),
            (total.ok + total.over + total.errors) as f64 / seconds,
            ms(0.5),
            ms(0.99),
            h.max() as f64 / 1000.0,
            delta("ratelimit_redis_calls"),
        );
    }
}

/// Awaits each future in turn (few, short: no need for a join combinator).
async fn scrape_all<F: std::future::Future<Output = String>>(
    futures: impl Iterator<Item = F>,
) -> Vec<String> {
    let mut out = Vec::new();
    for f in futures {
        out.push(f.await);
    }
    out
}
