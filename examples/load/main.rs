//! Load benchmark: drives the real server and a no-op RateLimitService with the same traffic, in one
//! run, over a sweep of load shapes (connections × calls in flight), and prints throughput and
//! latency percentiles for each, their ratios, and the worst shape. The no-op server is written as
//! a tonic user would write one (`Server::builder().add_service(..).serve(addr)`), sharing no
//! listener, socket or server setting with ours, so a transport mistake of ours shows up as a
//! ratio instead of hiding on both sides. Each server runs in its own child process (this program
//! re-executed with `--serve`).
//!
//! `cargo run --release --example load -- --duration 5` (see `--help`).
//!
//! `--backend memory,redis` measures the server on its memory store and on a Redis store in the
//! same run (a `redis-server` it starts itself, or `--redis-url`), and reports its `MGET`s and
//! script calls per decision (`INFO commandstats`: a compare-and-set sent as a plain `SET` is not
//! told apart there from the `SET`s scripts run, so those are not counted); `--redis-memory-keys 100000` also reports Redis memory per
//! held counter (`INFO memory`). `--backend memory,redis,noop-redis` adds the Redis baseline
//! (`noop_redis.rs`: the reference's `INCRBY` + `EXPIRE` per descriptor through redis-rs, no
//! exactness, none of our code) on the same redis-server, its CPU and redis-server's read alike;
//! `ping-redis` adds the floor of one Redis round trip per decision (the same server sending only
//! one `PING` per call), `ping-redis-thread` that floor with its connection on a thread of its own;
//! `ping-redis-percore` that floor served thread per core (one one-thread runtime per CPU, each
//! accepting on the port with `SO_REUSEPORT` and with a Redis connection of its own, so a call never
//! leaves its thread), and `ping-redis-percore-thread` the same with one connection driven on a
//! thread of its own, as the server's redis-io thread drove its connections until 2026-12-06.
//!
//! `--backend memory,record` also measures the memory server recording every decision
//! (`--record` to a file in the run's temporary directory) and reports its throughput, latency and
//! server CPU per call as ratios to the same server without recording, with the lines written and
//! dropped. `control` adds a second memory server, identical to the first: its ratios to it are
//! what the run's noise alone gives, the yardstick for "no measurable cost".

mod codec;
mod cpu;
mod fixed;
mod h2_client;
mod noop;
mod noop_redis;
mod redis_side;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use ratelimit_server::clock::monotonic;
use tonic::transport::{Channel, Endpoint};

/// The load's rules: `user` allows `per_key` requests per second per user (by default a limit
/// nobody reaches, so every decision writes); `held` is for `--redis-memory-keys`.
fn rules(per_key: u64) -> String {
    format!(
        "domain: load\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {per_key}}}\n  - key: held\n    rate_limit: {{unit: hour, requests_per_unit: 1000, algorithm: fixed_window}}\n"
    )
}
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[derive(Debug, Parser)]
struct Args {
    /// Seconds of measurement per scenario (after 1 s of warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Key mixes to run: 1, 100k-zipf, 1m-uniform.
    #[arg(long, value_delimiter = ',', default_value = "1,100k-zipf,1m-uniform")]
    keys: Vec<String>,
    /// Load shapes, as CONNECTIONSxIN_FLIGHT (calls in flight in total, spread over the
    /// connections). Envoy multiplexes a worker's calls on one connection: few in flight per
    /// connection is the common production shape.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1x1,1x16,4x64,8x64,4x512"
    )]
    shapes: Vec<Shape>,
    /// Bytes of each request's descriptor value (0: short values `user-0000001`); e.g. 59000
    /// for requests near `MAX_REQUEST_BYTES`, to measure what recording large requests costs.
    #[arg(long, default_value_t = 0)]
    value_bytes: usize,
    /// Runs per server and scenario, alternating no-op and real; the medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measure this server binary (e.g. target/release/ratelimit-server, or an older build) as
    /// the real server, started as `BIN serve --config … --grpc-addr … --http-addr …`, instead of
    /// the server code linked into this program.
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// Servers to measure, each beside the no-op server: memory, redis, record (the memory
    /// server with `--record FILE`; compared with memory when both run), control (the memory
    /// server again, compared with memory: the noise of the run), noop-redis (the Redis
    /// baseline, `noop_redis.rs`, on the same redis-server; compared with redis), ping-redis
    /// (the floor: the same server sending one `PING` per call and nothing else; compared with
    /// memory), ping-redis-thread (the floor with its connection driven on a thread of its own,
    /// as the server's redis-io thread drove them until 2026-12-06), ping-redis-percore (the floor
    /// served thread per core, each thread with its own connection), ping-redis-percore-thread
    /// (thread per core, one connection on a thread of its own).
    #[arg(long, value_delimiter = ',', default_value = "memory")]
    backend: Vec<String>,
    /// Redis for `--backend redis` and the Redis baselines (host:port); default: a redis-server
    /// started for the run.
    #[arg(long)]
    redis_url: Option<String>,
    /// Server instances sharing the Redis for `--backend redis` (connections spread over them):
    /// with 2, hot keys are written by two instances at once and compare-and-set conflicts show
    /// as more than one script call per decision.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// The client: `tonic` (tonic's client with pre-encoded requests) or `h2` (a bare HTTP/2
    /// client with pre-framed messages: the least client CPU, so the servers get the most of a
    /// shared machine).
    #[arg(long, default_value = "tonic")]
    client: String,
    /// Requests per second each user may make (default: a limit nobody reaches).
    #[arg(long, default_value_t = 1_000_000_000)]
    per_key_limit: u64,
    /// After the load runs: hold this many counters in Redis and report its memory per counter.
    #[arg(long, default_value_t = 0)]
    redis_memory_keys: usize,
    /// Drive the server already listening at this address with exactly `--calls` calls (the
    /// first key mix and shape; bare HTTP/2 client), print the answers, and exit: a fixed load for
    /// instruction counts (`scripts/cost-per-decision.sh callgrind`).
    #[arg(long)]
    drive: Option<SocketAddr>,
    /// Calls for `--drive`.
    #[arg(long, default_value_t = 20_000)]
    calls: u64,
    /// Internal: serve `real`, `redis`, `noop` or `noop-redis` on this address and wait.
    #[arg(long, hide = true)]
    serve: Option<String>,
    #[arg(long, hide = true)]
    addr: Option<SocketAddr>,
    #[arg(long, hide = true)]
    admin_addr: Option<SocketAddr>,
    #[arg(long, hide = true)]
    config: Option<std::path::PathBuf>,
}

/// How many connections, and how many calls in flight over all of them.
#[derive(Debug, Clone, Copy)]
struct Shape {
    connections: usize,
    inflight: usize,
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Shape, String> {
        let bad = || format!("'{s}' is not CONNECTIONSxIN_FLIGHT (e.g. 1x16)");
        let (c, n) = s.split_once('x').ok_or_else(bad)?;
        let (connections, inflight) =
            (c.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
        if connections == 0 || inflight == 0 {
            return Err(bad());
        }
        Ok(Shape {
            connections,
            inflight,
        })
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.connections, self.inflight)
    }
}

/// A child server process, killed on drop.
struct ServerProcess(Child);

impl ServerProcess {
    /// User + system CPU seconds the process has used so far ([`cpu::cpu_seconds`]).
    fn cpu_seconds(&self) -> f64 {
        cpu::cpu_seconds(self.0.id())
    }

    /// The process's peak resident memory so far in MiB (`VmHWM` of `/proc/PID/status`); 0
    /// where there is no /proc.
    fn peak_rss_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }
}

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

fn spawn_server(
    kind: &str,
    config: &std::path::Path,
    server_bin: Option<&std::path::Path>,
    redis_url: Option<&str>,
    record: Option<&std::path::Path>,
) -> (ServerProcess, SocketAddr, SocketAddr) {
    let addr = free_addr();
    let admin = free_addr();
    let mut command = match server_bin {
        Some(bin) if kind != "noop" && !is_baseline(kind) => {
            let mut c = Command::new(bin);
            c.args(["serve", "--grpc-addr", &addr.to_string()])
                .args(["--http-addr", &admin.to_string(), "--config"])
                .arg(config)
                .env("LOG_LEVEL", "warn")
                .stderr(Stdio::null());
            c
        }
        _ => {
            let mut c = Command::new(std::env::current_exe().expect("own path"));
            c.args(["--serve", kind, "--addr", &addr.to_string()])
                .args(["--admin-addr", &admin.to_string(), "--config"])
                .arg(config);
            c
        }
    };
    if is_baseline(kind) {
        command.env(
            "REDIS_URL",
            redis_url.expect("a Redis for the no-op Redis server"),
        );
    }
    if kind == "redis" {
        command
            .env("BACKEND_TYPE", "redis")
            .env(
                "REDIS_URL",
                redis_url.expect("a Redis for the redis backend"),
            )
            .env("CACHE_KEY_PREFIX", "load:");
    }
    if let Some(file) = record {
        command.env("RECORD_FILE", file);
    }
    let child = command.stdout(Stdio::null()).spawn().expect("spawn server");
    (ServerProcess(child), addr, admin)
}

async fn serve(kind: &str, addr: SocketAddr, admin: SocketAddr, config: std::path::PathBuf) {
    use ratelimit_server::{clock::SystemClock, server, settings::ServeSettings};
    if kind == "noop" {
        let mut builder = tonic::transport::Server::builder();
        // The server's default HTTP/2 settings, read from its own defaults, for a no-op measured
        // alike: with keepalive on, hyper takes a lock and reads the clock for every frame it
        // receives.
        if std::env::var_os("NOOP_TRANSPORT_AS_OURS").is_some() {
            let ours = ServeSettings::for_tests(config.clone()).transport;
            builder = builder
                .http2_keepalive_interval(Some(ours.grpc_keepalive_interval))
                .http2_keepalive_timeout(Some(ours.grpc_keepalive_timeout))
                .max_concurrent_streams(Some(ours.grpc_max_concurrent_streams));
        }
        builder
            .add_service(noop::server())
            .serve(addr)
            .await
            .expect("noop server");
    } else if kind == "ping-redis-percore" || kind == "ping-redis-percore-thread" {
        let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (set by `spawn_server`)");
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let shared = if kind == "ping-redis-percore-thread" {
            Some(
                noop_redis::server(
                    &redis_url,
                    noop_redis::Exchange::Ping,
                    noop_redis::Driven::OnOwnThread,
                )
                .await,
            )
        } else {
            None
        };
        for _ in 0..threads {
            let redis_url = redis_url.clone();
            let shared = shared.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                    socket.set_reuseport(true).expect("reuseport");
                    socket.set_reuseaddr(true).expect("reuseaddr");
                    socket.bind(addr).expect("bind");
                    let listener = socket.listen(1024).expect("listen");
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let service = match shared {
                        Some(shared) => shared,
                        None => {
                            noop_redis::server(
                                &redis_url,
                                noop_redis::Exchange::Ping,
                                noop_redis::Driven::OnWorkers,
                            )
                            .await
                        }
                    };
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming(incoming)
                        .await
                        .expect("per-core floor");
                });
            });
        }
        std::future::pending::<()>().await;
    } else if let Some((exchange, driven)) = baseline(kind) {
        let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (set by `spawn_server`)");
        tonic::transport::Server::builder()
            .add_service(noop_redis::server(&redis_url, exchange, driven).await)
            .serve(addr)
            .await
            .expect("noop-redis server");
    } else {
        // BACKEND_TYPE, REDIS_URL, RECORD_FILE… come from the environment (set by
        // `spawn_server`).
        let mut settings = ServeSettings::for_tests(config);
        settings.grpc_addr = addr;
        settings.http_addr = admin;
        let _server = server::start(&settings, Arc::new(SystemClock))
            .await
            .expect("server");
        std::future::pending::<()>().await;
    }
}

/// Pre-encoded requests and how to pick the next one.
struct Traffic {
    requests: Vec<Bytes>,
    /// The same requests as gRPC message frames (for `--client h2`).
    framed: Vec<Bytes>,
    zipf: Option<Zipf<f64>>,
}

impl Traffic {
    fn new(mix: &str, value_bytes: usize) -> Traffic {
        let (count, zipf) = match mix {
            "1" => (1, false),
            "100k-zipf" => (100_000, true),
            "1m-uniform" => (1_000_000, false),
            other => panic!("unknown key mix {other}"),
        };
        let requests: Vec<Bytes> = (0..count)
            .map(|i| {
                let r = RateLimitRequest {
                    domain: "load".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: {
                                let mut v = format!("user-{i:07}");
                                if v.len() < value_bytes {
                                    v.push_str(&"x".repeat(value_bytes - v.len()));
                                }
                                v
                            },
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                Bytes::from(r.encode_to_vec())
            })
            .collect();
        Traffic {
            framed: requests.iter().map(|r| h2_client::frame(r)).collect(),
            requests,
            zipf: zipf.then(|| Zipf::new(count as f64, 1.0).expect("zipf")),
        }
    }

    fn index(&self, rng: &mut impl Rng) -> usize {
        let i = match &self.zipf {
            Some(z) => (z.sample(rng) as usize).saturating_sub(1),
            None => rng.random_range(0..self.requests.len()),
        };
        i.min(self.requests.len() - 1)
    }

    fn pick(&self, rng: &mut impl Rng) -> Bytes {
        self.requests[self.index(rng)].clone()
    }

    fn pick_framed(&self, rng: &mut impl Rng) -> Bytes {
        self.framed[self.index(rng)].clone()
    }
}

struct Outcome {
    throughput: f64,
    latency: Histogram<u64>,
    errors: u64,
    /// Every answered call, warm-up included (for per-decision counts on the server side).
    answered: u64,
    /// `MGET`s and script calls per answered call (redis backend only; plain `SET`s not counted).
    round_trips: Option<f64>,
    /// Script calls per answered call (plain `SET`s not counted).
    attempts: Option<f64>,
    /// The server process's peak resident memory (MiB), read when the run ends.
    peak_rss_mib: f64,
    /// `record` only: lines written and dropped for a full queue, from the server's /metrics.
    recorded: Option<(u64, u64)>,
    /// CPU seconds the server process(es) used over the run (warm-up included, as `answered`).
    server_cpu: f64,
    /// Calls answered after the warm-up (those `throughput` counts).
    measured: u64,
    /// CPU the server(s) and redis-server used over the same window as `measured`.
    window: cpu::Window,
}

async fn drive(
    addrs: &[SocketAddr],
    traffic: Arc<Traffic>,
    shape: Shape,
    duration: Duration,
    watched: &cpu::Watched,
) -> Outcome {
    let Shape {
        connections,
        inflight,
    } = shape;
    let mut channels = Vec::new();
    for c in 0..connections.min(inflight).max(1) {
        // Connections are spread over the instances (several only for `--instances`).
        let addr = addrs[c % addrs.len()];
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
    let warmup_end = monotonic() + Duration::from_secs(1);
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
                let (mut count, mut errors, mut answered) = (0u64, 0u64, 0u64);
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(PATH);
                loop {
                    let body = traffic.pick(&mut rng);
                    let started = monotonic();
                    if grpc.ready().await.is_err() {
                        errors += 1;
                        continue;
                    }
                    let result = grpc
                        .unary(tonic::Request::new(body), path.clone(), codec::RawCodec)
                        .await;
                    let now = monotonic();
                    answered += u64::from(result.is_ok());
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
                (count, errors, answered, hist)
            })
        })
        .collect();
    let window = watched.window(warmup_end, end);
    Outcome::of_workers(tasks, duration, window).await
}

/// One worker's tally: calls measured, errors, calls answered (warm-up included), latencies.
type Tally = (u64, u64, u64, Histogram<u64>);

impl Outcome {
    /// The workers' tallies added up: throughput over `duration`; the server-side fields are
    /// filled in by the caller.
    async fn of_workers(
        tasks: Vec<tokio::task::JoinHandle<Tally>>,
        duration: Duration,
        window: tokio::task::JoinHandle<cpu::Window>,
    ) -> Outcome {
        let mut latency =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
        let (mut count, mut errors, mut answered) = (0, 0, 0);
        for t in tasks {
            let (c, e, a, h) = t.await.expect("worker");
            count += c;
            errors += e;
            answered += a;
            latency.add(h).expect("same bounds");
        }
        Outcome {
            throughput: count as f64 / duration.as_secs_f64(),
            latency,
            errors,
            answered,
            round_trips: None,
            attempts: None,
            recorded: None,
            peak_rss_mib: 0.0,
            server_cpu: 0.0,
            measured: count,
            window: window.await.unwrap_or_default(),
        }
    }

    /// Server CPU µs per call answered after the warm-up.
    fn server_us(&self) -> f64 {
        self.window.server * 1e6 / self.measured.max(1) as f64
    }

    /// redis-server CPU µs per call answered after the warm-up (`None`: not measured).
    fn redis_us(&self) -> Option<f64> {
        self.window
            .redis
            .map(|r| r * 1e6 / self.measured.max(1) as f64)
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
            args.admin_addr.expect("--admin-addr"),
            args.config.clone().expect("--config"),
        )
        .await;
        return;
    }
    if let Some(addr) = args.drive {
        let traffic = Arc::new(Traffic::new(&args.keys[0], args.value_bytes));
        let (ok, failed) = fixed::drive(addr, traffic, args.shapes[0], args.calls).await;
        println!("{ok} calls answered OK, {failed} failed");
        if failed > 0 || ok != args.calls {
            std::process::exit(1);
        }
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("load.yaml"), rules(args.per_key_limit)).expect("write rules");
    let duration = Duration::from_secs_f64(args.duration);
    println!(
        "# ratelimit-server load benchmark: {} s per run after 1 s warm-up, \
         median of {} alternating runs per server, {} client, {} requests/s allowed per key",
        args.duration, args.rounds, args.client, args.per_key_limit
    );
    println!(
        "| keys | connections x in flight | server | req/s | p50 µs | p99 µs | p999 µs | errors | req/s ratio | p50 ratio | p999 ratio | server CPU µs per call |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut kinds = vec!["noop"];
    for backend in &args.backend {
        match backend.as_str() {
            "memory" => kinds.push("real"),
            "redis" => kinds.push("redis"),
            "record" => kinds.push("record"),
            "control" => kinds.push("control"),
            baseline if is_baseline(baseline) => kinds.push(baseline),
            other => panic!(
                "unknown backend {other} (memory, redis, noop-redis, ping-redis, ping-redis-thread, \
                 ping-redis-percore, ping-redis-percore-thread, \
                 record or control)"
            ),
        }
    }
    let on_redis = |kind: &str| kind == "redis" || is_baseline(kind);
    let redis = kinds
        .iter()
        .any(|kind| on_redis(kind))
        .then(|| redis_side::Redis::start_or_use(args.redis_url.as_deref()));
    let redis_url = redis.as_ref().map(|r| r.addr.clone());
    let mut failed = Vec::new();
    let mut worst: Option<(String, f64, f64)> = None;
    let mut worst_tail: Option<(String, f64)> = None;
    let mut redis_vs_memory = Vec::new();
    let mut record_vs_memory = Vec::new();
    let mut worst_record: Option<(String, f64, f64)> = None;
    let mut cpu_rounds = Vec::new();
    let record_file = dir.path().join("record.jsonl");
    for mix in &args.keys {
        let traffic = Arc::new(Traffic::new(mix, args.value_bytes));
        for &shape in &args.shapes {
            let mut runs: Vec<Vec<Outcome>> = kinds.iter().map(|_| Vec::new()).collect();
            for _ in 0..args.rounds.max(1) {
                for (slot, kind) in kinds.iter().enumerate() {
                    // A fresh server per run, so every run starts from an empty store.
                    if let Some(r) = &redis {
                        r.flush();
                    }
                    let before = redis.as_ref().map(redis_side::Redis::commands);
                    let instances = if *kind == "redis" {
                        args.instances.max(1)
                    } else {
                        1
                    };
                    let record = (*kind == "record").then_some(record_file.as_path());
                    if let Some(file) = record {
                        let _ = std::fs::remove_file(file);
                    }
                    let mut servers = Vec::new();
                    let mut addrs = Vec::new();
                    let mut admins = Vec::new();
                    for _ in 0..instances {
                        let (server, addr, admin) = spawn_server(
                            kind,
                            dir.path(),
                            args.server_bin.as_deref(),
                            redis_url.as_deref(),
                            record,
                        );
                        servers.push(server);
                        addrs.push(addr);
                        admins.push(admin);
                    }
                    let cpu_before: f64 = servers.iter().map(ServerProcess::cpu_seconds).sum();
                    let watched = cpu::Watched {
                        servers: servers.iter().map(|s| s.0.id()).collect(),
                        redis: redis
                            .as_ref()
                            .filter(|_| on_redis(kind))
                            .and_then(redis_side::Redis::pid),
                    };
                    let mut outcome = match args.client.as_str() {
                        "h2" => {
                            h2_client::drive(&addrs, traffic.clone(), shape, duration, &watched)
                                .await
                        }
                        "tonic" => drive(&addrs, traffic.clone(), shape, duration, &watched).await,
                        other => panic!("unknown client {other} (tonic or h2)"),
                    };
                    outcome.server_cpu =
                        servers.iter().map(ServerProcess::cpu_seconds).sum::<f64>() - cpu_before;
                    if record.is_some() {
                        outcome.recorded = Some(record_counts(admins[0]).await);
                    }
                    outcome.peak_rss_mib = servers
                        .iter()
                        .map(ServerProcess::peak_rss_mib)
                        .fold(0.0, f64::max);
                    drop(servers);
                    if on_redis(kind)
                        && let (Some(r), Some((calls, reads))) = (&redis, before)
                    {
                        let (calls_after, reads_after) = r.commands();
                        let answered = outcome.answered.max(1) as f64;
                        outcome.round_trips = Some((calls_after - calls) as f64 / answered);
                        outcome.attempts = Some((reads_after - reads) as f64 / answered);
                    }
                    runs[slot].push(outcome);
                }
            }
            cpu_rounds.extend(cpu_round_rows(mix, shape, &kinds, &runs));
            let results: Vec<(&str, Outcome)> = kinds
                .iter()
                .copied()
                .zip(runs.into_iter().map(median))
                .collect();
            let base = &results[0].1;
            // The worst shape is ours: the Redis baselines are not our servers.
            for (kind, real) in results.iter().skip(1).filter(|(k, _)| !is_baseline(k)) {
                let ratio = real.throughput / base.throughput;
                let scenario = format!("{mix} keys, {shape}, {kind}");
                if worst.as_ref().is_none_or(|(_, r, _)| ratio < *r) {
                    let p50 = us(&real.latency, 0.5) / us(&base.latency, 0.5);
                    worst = Some((scenario.clone(), ratio, p50));
                }
                let tail = us(&real.latency, 0.999) / us(&base.latency, 0.999);
                if worst_tail.as_ref().is_none_or(|(_, t)| tail > *t) {
                    worst_tail = Some((scenario, tail));
                }
            }
            for (kind, r) in &results {
                let name = display_name(kind);
                println!(
                    "| {mix} | {shape} | {name} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.2} | {:.2} | {:.1} |",
                    r.throughput,
                    us(&r.latency, 0.5),
                    us(&r.latency, 0.99),
                    us(&r.latency, 0.999),
                    r.errors,
                    r.throughput / base.throughput,
                    us(&r.latency, 0.5) / us(&base.latency, 0.5),
                    us(&r.latency, 0.999) / us(&base.latency, 0.999),
                    r.server_us(),
                );
                if r.errors > 0 || r.throughput == 0.0 {
                    failed.push(format!("{mix} keys, {shape}, {name} server"));
                }
            }
            let find = |k: &str| results.iter().find(|(kind, _)| *kind == k).map(|(_, o)| o);
            for other in ["record", "control"] {
                let (Some(with), Some(memory)) = (find(other), find("real")) else {
                    continue;
                };
                let ratio = with.throughput / memory.throughput;
                let p50 = us(&with.latency, 0.5) / us(&memory.latency, 0.5);
                let p999 = us(&with.latency, 0.999) / us(&memory.latency, 0.999);
                let cpu = |o: &Outcome| o.server_cpu * 1e6 / o.answered.max(1) as f64;
                let (lines, dropped) = match with.recorded {
                    Some((lines, dropped)) => (lines.to_string(), dropped.to_string()),
                    None => ("-".to_owned(), "-".to_owned()),
                };
                record_vs_memory.push(format!(
                    "| {mix} | {shape} | {} | {ratio:.3} | {p50:.3} | {p999:.3} | {:.2} / {:.2} = {:.3} | {:.1} / {:.1} | {lines} | {dropped} | {} |",
                    if other == "record" { "--record" } else { "control" },
                    cpu(with),
                    cpu(memory),
                    cpu(with) / cpu(memory),
                    with.peak_rss_mib,
                    memory.peak_rss_mib,
                    with.answered
                ));
                let scenario = format!("{mix} keys, {shape}");
                if other == "record" && worst_record.as_ref().is_none_or(|(_, r, _)| ratio < *r) {
                    worst_record = Some((scenario, ratio, p50));
                }
            }
            if let Some(redis) = find("redis") {
                let vs = |f: &dyn Fn(&Outcome) -> f64, fmt: fn(f64) -> String| {
                    find("real").map_or("-".to_owned(), |memory| fmt(f(memory)))
                };
                redis_vs_memory.push(format!(
                    "| {mix} | {shape} | {} | {} | {} | {:.2} | {:.3} | {:.1} | {} | {} |",
                    vs(&|m| redis.throughput / m.throughput, |v| format!("{v:.2}")),
                    vs(
                        &|m| us(&redis.latency, 0.5) / us(&m.latency, 0.5),
                        |v| format!("{v:.2}")
                    ),
                    vs(
                        &|m| us(&redis.latency, 0.5) - us(&m.latency, 0.5),
                        |v| format!("{v:.0}")
                    ),
                    redis.round_trips.unwrap_or(0.0),
                    redis.attempts.unwrap_or(0.0),
                    redis.server_us(),
                    vs(&|m| redis.server_us() / m.server_us(), |v| format!(
                        "{v:.2}"
                    )),
                    redis
                        .redis_us()
                        .map_or("-".to_owned(), |v| format!("{v:.1}")),
                ));
            }
        }
    }
    if !redis_vs_memory.is_empty() {
        println!(
            "\nRedis store, {} instance(s) sharing it:\n\n| keys | connections x in flight | \
             redis/memory req/s | redis/memory p50 | p50 difference µs | \
             MGET + script calls per decision | script calls per decision | \
             server CPU µs per decision | redis/memory server CPU | redis-server CPU µs per decision |",
            args.instances.max(1)
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for line in &redis_vs_memory {
            println!("{line}");
        }
    }
    if !cpu_rounds.is_empty() {
        println!(
            "\nCPU per call answered after the warm-up, every round (the servers of a round ran \
             one after the other; ratios within a round):\n\n| keys | connections x in flight | \
             round | {} |",
            cpu_round_header(&kinds)
        );
        println!("|---|---|---|{}", "---|".repeat(cpu_round_columns(&kinds)));
        for line in &cpu_rounds {
            println!("{line}");
        }
    }
    if !record_vs_memory.is_empty() {
        println!(
            "\nRecording cost (the memory server with --record, and the control, vs the memory \
             server, same run; server CPU is the server process's, writer thread included):\n\n\
             | keys | connections x in flight | server | req/s ratio | p50 ratio | p999 ratio | \
             server CPU µs per call, this / memory | peak RSS MiB, this / memory | \
             lines written | dropped (queue full) | calls answered |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for line in &record_vs_memory {
            println!("{line}");
        }
    }
    if let Some((scenario, ratio, p50)) = worst_record {
        println!(
            "worst recording shape: {scenario}: {ratio:.3}x the throughput without --record, p50 {p50:.3}x"
        );
    }
    if let (Some(r), true) = (&redis, args.redis_memory_keys > 0) {
        r.flush();
        let (_server, addr, _) = spawn_server(
            "redis",
            dir.path(),
            args.server_bin.as_deref(),
            redis_url.as_deref(),
            None,
        );
        let report = r.memory_per_counter(addr, args.redis_memory_keys).await;
        println!("\n{report}");
    }
    if let Some((scenario, ratio, p50)) = worst {
        println!(
            "\nworst shape: {scenario}: {ratio:.2}x the no-op server's throughput, p50 {p50:.2}x"
        );
    }
    if let Some((scenario, tail)) = worst_tail {
        println!("worst tail: {scenario}: p999 {tail:.2}x the no-op server's");
    }
    // A run with errors or no answers measured nothing: say so, and fail (CI smoke-runs this).
    if !failed.is_empty() {
        eprintln!("load: errors or no answers in: {}", failed.join("; "));
        std::process::exit(1);
    }
}

/// The floors of one Redis round trip per call (`--backend`), each compared with the memory store.
const FLOORS: [&str; 4] = [
    "ping-redis",
    "ping-redis-thread",
    "ping-redis-percore",
    "ping-redis-percore-thread",
];

/// The per-round CPU table's columns: each server's CPU µs per call, then the ratios the issue
/// asks for (memory / no-op, Redis / memory) and redis-server's µs per decision.
fn cpu_round_header(kinds: &[&str]) -> String {
    let mut columns: Vec<String> = kinds
        .iter()
        .map(|k| format!("{} µs", display_name(k)))
        .collect();
    if kinds.contains(&"real") {
        columns.push("memory / noop".into());
    }
    if kinds.contains(&"redis") {
        if kinds.contains(&"real") {
            columns.push("redis / memory".into());
        }
        columns.push("redis-server µs per decision".into());
    }
    if kinds.contains(&"noop-redis") {
        if kinds.contains(&"redis") {
            columns.push("redis / noop-redis".into());
        }
        columns.push("redis-server µs per decision, noop-redis".into());
    }
    for floor in FLOORS {
        if kinds.contains(&floor) {
            if kinds.contains(&"real") {
                columns.push(format!("{floor} / memory"));
            }
            columns.push(format!("redis-server µs per call, {floor}"));
        }
    }
    columns.join(" | ")
}

fn cpu_round_columns(kinds: &[&str]) -> usize {
    cpu_round_header(kinds).split(" | ").count()
}

/// One row per round: each server's CPU µs per call and the ratios within the round.
fn cpu_round_rows(mix: &str, shape: Shape, kinds: &[&str], runs: &[Vec<Outcome>]) -> Vec<String> {
    let rounds = runs.iter().map(Vec::len).min().unwrap_or(0);
    let of = |kind: &str, round: usize| {
        kinds
            .iter()
            .position(|k| *k == kind)
            .map(|slot| &runs[slot][round])
    };
    let rows: Vec<Vec<f64>> = (0..rounds)
        .map(|round| {
            let mut cells: Vec<f64> = runs.iter().map(|r| r[round].server_us()).collect();
            if let (Some(memory), Some(noop)) = (of("real", round), of("noop", round)) {
                cells.push(memory.server_us() / noop.server_us());
            }
            if let Some(redis) = of("redis", round) {
                if let Some(memory) = of("real", round) {
                    cells.push(redis.server_us() / memory.server_us());
                }
                cells.push(redis.redis_us().unwrap_or(f64::NAN));
            }
            if let Some(baseline) = of("noop-redis", round) {
                if let Some(redis) = of("redis", round) {
                    cells.push(redis.server_us() / baseline.server_us());
                }
                cells.push(baseline.redis_us().unwrap_or(f64::NAN));
            }
            for floor in FLOORS {
                if let Some(floor) = of(floor, round) {
                    if let Some(memory) = of("real", round) {
                        cells.push(floor.server_us() / memory.server_us());
                    }
                    cells.push(floor.redis_us().unwrap_or(f64::NAN));
                }
            }
            cells
        })
        .collect();
    let line = |label: String, cells: &[f64]| {
        let cells: Vec<String> = cells
            .iter()
            .map(|v| {
                if *v >= 5.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.2}")
                }
            })
            .collect();
        format!("| {mix} | {shape} | {label} | {} |", cells.join(" | "))
    };
    let mut out: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(round, cells)| line((round + 1).to_string(), cells))
        .collect();
    if rows.len() > 1 {
        // Each column's median over the rounds (for ratios: the median of the rounds' ratios).
        let medians: Vec<f64> = (0..rows[0].len())
            .map(|c| {
                let mut column: Vec<f64> = rows.iter().map(|r| r[c]).collect();
                column.sort_by(f64::total_cmp);
                column[column.len() / 2]
            })
            .collect();
        out.push(line("**median**".into(), &medians));
    }
    out
}

/// The Redis baseline `kind` names (served by this program, none of our code): what it sends
/// Redis per call and where its connection is driven.
fn baseline(kind: &str) -> Option<(noop_redis::Exchange, noop_redis::Driven)> {
    use noop_redis::{Driven, Exchange};
    match kind {
        "noop-redis" => Some((Exchange::ReferenceCommands, Driven::OnWorkers)),
        "ping-redis" => Some((Exchange::Ping, Driven::OnWorkers)),
        "ping-redis-thread" => Some((Exchange::Ping, Driven::OnOwnThread)),
        "ping-redis-percore" => Some((Exchange::Ping, Driven::OnWorkers)),
        "ping-redis-percore-thread" => Some((Exchange::Ping, Driven::OnOwnThread)),
        _ => None,
    }
}

/// Whether `kind` is one of the Redis baselines.
fn is_baseline(kind: &str) -> bool {
    baseline(kind).is_some()
}

/// How the tables name a server kind.
fn display_name(kind: &str) -> &str {
    match kind {
        "real" => "memory",
        "record" => "memory --record",
        "control" => "memory (control)",
        other => other,
    }
}

/// `ratelimit_record_lines_total` and the queue-full drops from a recording server's /metrics,
/// once its writer has caught up (the counts stop moving).
async fn record_counts(admin: SocketAddr) -> (u64, u64) {
    let read = || async move {
        let text = reqwest::get(format!("http://{admin}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        };
        Some((
            value("ratelimit_record_lines_total"),
            value(r#"ratelimit_record_dropped_total{reason="queue_full"}"#),
        ))
    };
    let mut last = None;
    for _ in 0..50 {
        let now = read().await;
        if now.is_some() && now == last {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last.unwrap_or_default()
}
