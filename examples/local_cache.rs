//! What the local over-limit cache saves: the same zipf load on a tight fixed-window limit, run
//! against Redis with `LOCAL_CACHE_SIZE_IN_BYTES=0` and then with a cache, on a `redis-server` this
//! program starts. Prints answers, OVER_LIMIT, Redis commands (`INFO commandstats`) and req/s.
//!
//! `cargo run --release --example local_cache -- --requests 200000 --keys 10000 --limit 10`

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use ratelimit_server::clock::SystemClock;
use ratelimit_server::clock::monotonic;
use ratelimit_server::server;
use ratelimit_server::settings::{BackendType, ServeSettings};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Distinct keys, drawn with zipf exponent 1.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Requests per hour per key (fixed window).
    #[arg(long, default_value_t = 10)]
    limit: u32,
    #[arg(long, default_value_t = 64)]
    in_flight: u64,
    /// LOCAL_CACHE_SIZE_IN_BYTES of the second run.
    #[arg(long, default_value_t = 1 << 20)]
    cache_bytes: usize,
}

fn redis_commands(port: u16) -> u64 {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            ["cmdstat_mget:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn run(args: &Args, port: u16, cache_bytes: usize, prefix: &str) {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("c.yaml"),
        format!(
            "domain: c\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {}, algorithm: fixed_window}}\n",
            args.limit
        ),
    )
    .unwrap();
    let mut settings = ServeSettings::for_tests(rules.path().to_path_buf());
    settings.store.backend = BackendType::Redis;
    settings.store.redis_url = format!("127.0.0.1:{port}");
    settings.store.cache_key_prefix = prefix.into();
    settings.store.local_cache_size_in_bytes = cache_bytes;
    let server = server::start(&settings, Arc::new(SystemClock))
        .await
        .unwrap();
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let before = redis_commands(port);
    let next = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let started = monotonic();
    let workers: Vec<_> = (0..args.in_flight)
        .map(|w| {
            let (client, next, over) = (client.clone(), next.clone(), over.clone());
            let (total, keys) = (args.requests, args.keys);
            tokio::spawn(async move {
                let zipf = Zipf::new(keys as f64, 1.0).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(w);
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let key = zipf.sample(&mut rng) as u64;
                    let request = RateLimitRequest {
                        domain: "c".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "user".into(),
                                value: format!("u{key}"),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 0,
                    };
                    let r = client.clone().should_rate_limit(request).await.unwrap();
                    if r.get_ref().overall_code == Code::OverLimit as i32 {
                        over.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let commands = redis_commands(port) - before;
    let metrics = reqwest::get(format!("http://{}/metrics", server.http_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let fallbacks: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("ratelimit_store_failure_mode_decisions{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!(
        "| {} | {} | {} | {} | {:.2} | {:.0} | {fallbacks} |",
        if cache_bytes == 0 {
            "off".to_string()
        } else {
            format!("{cache_bytes} bytes")
        },
        args.requests,
        over.load(Ordering::Relaxed),
        commands,
        commands as f64 / args.requests as f64,
        args.requests as f64 / secs
    );
    server.shutdown_after(Duration::ZERO).await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--dir", &dir.path().display().to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    std::thread::sleep(Duration::from_millis(300));
    println!(
        "zipf(1.0) over {} keys, fixed window {}/hour, {} in flight",
        args.keys, args.limit, args.in_flight
    );
    println!(
        "\n| local cache | requests | OVER_LIMIT | Redis commands | per request | req/s | answered by REDIS_FAILURE_MODE |"
    );
    println!("|---|---|---|---|---|---|---|");
    run(&args, port, 0, "off:").await;
    run(&args, port, args.cache_bytes, "on:").await;
    let _ = redis.kill();
    let _ = redis.wait();
}
