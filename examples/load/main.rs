//! Load benchmark: drives the real server and a no-op RateLimitService on the same tonic stack with
//! the same traffic, in one run, and prints throughput and latency percentiles for each and their
//! ratio. Each server runs in its own child process (this program re-executed with `--serve`).
//!
//! `cargo run --release --example load -- --duration 5` (see `--help`).

mod codec;
mod noop;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tonic::transport::{Channel, Endpoint};

const RULES: &str = "domain: load\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[derive(Debug, Parser)]
struct Args {
    /// Seconds of measurement per scenario (after 1 s of warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Key mixes to run: 1, 100k-zipf, 1m-uniform.
    #[arg(long, value_delimiter = ',', default_value = "1,100k-zipf,1m-uniform")]
    keys: Vec<String>,
    /// In-flight request levels.
    #[arg(long, value_delimiter = ',', default_value = "1,512")]
    inflight: Vec<usize>,
    /// Runs per server and scenario, alternating no-op and real; the medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// HTTP/2 connections the requests are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Internal: serve `real` or `noop` on this address and wait.
    #[arg(long, hide = true)]
    serve: Option<String>,
    #[arg(long, hide = true)]
    addr: Option<SocketAddr>,
    #[arg(long, hide = true)]
    config: Option<std::path::PathBuf>,
}

/// A child server process, killed on drop.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn spawn_server(kind: &str, config: &std::path::Path) -> (ServerProcess, SocketAddr) {
    let addr = free_addr();
    let child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--serve", kind, "--addr", &addr.to_string(), "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn server");
    (ServerProcess(child), addr)
}

async fn serve(kind: &str, addr: SocketAddr, config: std::path::PathBuf) {
    use ratelimit_server::{app, clock::SystemClock, settings::ServeSettings};
    if kind == "noop" {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        app::grpc_server()
            .add_service(noop::server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("noop server");
    } else {
        let mut settings = ServeSettings::for_tests(config);
        settings.grpc_addr = addr;
        let _server = app::start(&settings, Arc::new(SystemClock))
            .await
            .expect("server");
        std::future::pending::<()>().await;
    }
}

/// Pre-encoded requests and how to pick the next one.
struct Traffic {
    requests: Vec<Bytes>,
    zipf: Option<Zipf<f64>>,
}

impl Traffic {
    fn new(mix: &str) -> Traffic {
        let (count, zipf) = match mix {
            "1" => (1, false),
            "100k-zipf" => (100_000, true),
            "1m-uniform" => (1_000_000, false),
            other => panic!("unknown key mix {other}"),
        };
        let requests = (0..count)
            .map(|i| {
                let r = RateLimitRequest {
                    domain: "load".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: format!("user-{i:07}"),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                Bytes::from(r.encode_to_vec())
            })
            .collect();
        Traffic {
            requests,
            zipf: zipf.then(|| Zipf::new(count as f64, 1.0).expect("zipf")),
        }
    }

    fn pick(&self, rng: &mut impl Rng) -> Bytes {
        let i = match &self.zipf {
            Some(z) => (z.sample(rng) as usize).saturating_sub(1),
            None => rng.random_range(0..self.requests.len()),
        };
        self.requests[i.min(self.requests.len() - 1)].clone()
    }
}

struct Outcome {
    throughput: f64,
    latency: Histogram<u64>,
    errors: u64,
}

async fn drive(
    addr: SocketAddr,
    traffic: Arc<Traffic>,
    inflight: usize,
    connections: usize,
    duration: Duration,
) -> Outcome {
    let mut channels = Vec::new();
    for _ in 0..connections.min(inflight).max(1) {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .tcp_nodelay(true);
        let mut tries = 0;
        let channel: Channel = loop {
            match endpoint.connect().await {
                Ok(c) => break c,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot connect to {addr}: {e}"),
            }
        };
        channels.push(channel);
    }
    let warmup_end = Instant::now() + Duration::from_secs(1);
    let end = warmup_end + duration;
    let tasks: Vec<_> = (0..inflight)
        .map(|t| {
            let channel = channels[t % channels.len()].clone();
            let traffic = traffic.clone();
            tokio::spawn(async move {
                let mut grpc = tonic::client::Grpc::new(channel);
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let mut hist =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
                let (mut count, mut errors) = (0u64, 0u64);
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(PATH);
                loop {
                    let body = traffic.pick(&mut rng);
                    let started = Instant::now();
                    if grpc.ready().await.is_err() {
                        errors += 1;
                        continue;
                    }
                    let result = grpc
                        .unary(tonic::Request::new(body), path.clone(), codec::RawCodec)
                        .await;
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    if now >= warmup_end {
                        match result {
                            Ok(_) => {
                                count += 1;
                                let _ = hist.record((now - started).as_nanos() as u64);
                            }
                            Err(_) => errors += 1,
                        }
                    }
                }
                (count, errors, hist)
            })
        })
        .collect();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let (mut count, mut errors) = (0, 0);
    for t in tasks {
        let (c, e, h) = t.await.expect("worker");
        count += c;
        errors += e;
        latency.add(h).expect("same bounds");
    }
    Outcome {
        throughput: count as f64 / duration.as_secs_f64(),
        latency,
        errors,
    }
}

/// The run with the median throughput (its latencies come with it).
fn median(mut runs: Vec<Outcome>) -> Outcome {
    runs.sort_by(|a, b| a.throughput.total_cmp(&b.throughput));
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(kind) = &args.serve {
        serve(
            kind,
            args.addr.expect("--addr"),
            args.config.clone().expect("--config"),
        )
        .await;
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("load.yaml"), RULES).expect("write rules");
    let duration = Duration::from_secs_f64(args.duration);
    println!(
        "# ratelimit-server load benchmark: {} s per run after 1 s warm-up, {} connections, \
         median of {} alternating runs per server",
        args.duration, args.connections, args.rounds
    );
    println!(
        "| keys | in flight | server | req/s | p50 µs | p99 µs | p999 µs | errors | req/s ratio | p50 ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = Vec::new();
    for mix in &args.keys {
        let traffic = Arc::new(Traffic::new(mix));
        for &inflight in &args.inflight {
            let mut runs: [Vec<Outcome>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..args.rounds.max(1) {
                for (slot, kind) in ["noop", "real"].into_iter().enumerate() {
                    // A fresh server per run, so every run starts from an empty store.
                    let (_server, addr) = spawn_server(kind, dir.path());
                    let outcome =
                        drive(addr, traffic.clone(), inflight, args.connections, duration).await;
                    runs[slot].push(outcome);
                }
            }
            let [noop_runs, real_runs] = runs;
            let results = [("noop", median(noop_runs)), ("real", median(real_runs))];
            let base = &results[0].1;
            for (kind, r) in &results {
                println!(
                    "| {mix} | {inflight} | {kind} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.2} |",
                    r.throughput,
                    us(&r.latency, 0.5),
                    us(&r.latency, 0.99),
                    us(&r.latency, 0.999),
                    r.errors,
                    r.throughput / base.throughput,
                    us(&r.latency, 0.5) / us(&base.latency, 0.5),
                );
                if r.errors > 0 || r.throughput == 0.0 {
                    failed.push(format!("{mix} keys, {inflight} in flight, {kind} server"));
                }
            }
        }
    }
    // A run with errors or no answers measured nothing: say so, and fail (CI smoke-runs this).
    if !failed.is_empty() {
        eprintln!("load: errors or no answers in: {}", failed.join("; "));
        std::process::exit(1);
    }
}
