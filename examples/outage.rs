//! Outage timeline: the server on a Redis that this program starts, freezes (SIGSTOP) in the
//! middle of a steady load, and thaws (SIGCONT). Prints, per phase and per 250 ms slice, the
//! answers (OK, OVER_LIMIT, gRPC errors) and their latency, how long after SIGSTOP the server
//! switched to the failure mode, and how long after SIGCONT decisions were back on Redis
//! (`ratelimit_store_up`, polled every 5 ms).
//!
//! `cargo run --release --example outage -- --mode local --in-flight 64 --freeze-ms 2000`
//!
//! With `--fault restart` Redis is killed (SIGKILL) instead, and started again on the same port
//! (empty) after `--freeze-ms`: "back on Redis" is then counted from the restart.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use ratelimit_server::clock::SystemClock;
use ratelimit_server::clock::monotonic;
use ratelimit_server::remote::FailureMode;
use ratelimit_server::server;
use ratelimit_server::settings::{BackendType, ServeSettings};

const RULES: &str = "domain: o\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100000000, algorithm: fixed_window}\n";

#[derive(Debug, Parser)]
struct Args {
    /// REDIS_FAILURE_MODE: local, allow, deny or error.
    #[arg(long, default_value = "local")]
    mode: String,
    /// Calls in flight (over one connection).
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// REDIS_TIMEOUT in ms.
    #[arg(long, default_value_t = 100)]
    timeout_ms: u64,
    /// `freeze` (SIGSTOP, then SIGCONT) or `restart` (SIGKILL, then a new redis-server).
    #[arg(long, default_value = "freeze")]
    fault: String,
    /// How long Redis stays frozen (or down).
    #[arg(long, default_value_t = 2000)]
    freeze_ms: u64,
    /// Steady load before the freeze and after the thaw.
    #[arg(long, default_value_t = 1000)]
    steady_ms: u64,
}

/// One answered (or failed) call: when it ended (ms since start), its latency (µs), its outcome.
#[derive(Clone, Copy)]
struct Sample {
    end_ms: f64,
    latency_us: u64,
    outcome: u8, // 0 OK, 1 OVER_LIMIT, 2 error
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "o".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn store_up(url: &str) -> Option<bool> {
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("ratelimit_store_up "))?;
    Some(line.ends_with(" 1"))
}

fn summary(name: &str, samples: &[Sample]) {
    let mut h = Histogram::<u64>::new(3).unwrap();
    let mut counts = [0u64; 3];
    for s in samples {
        h.record(s.latency_us.max(1)).unwrap();
        counts[s.outcome as usize] += 1;
    }
    let span = samples
        .iter()
        .map(|s| s.end_ms)
        .fold((f64::MAX, f64::MIN), |(a, b), t| (a.min(t), b.max(t)));
    let secs = ((span.1 - span.0) / 1000.0).max(0.001);
    println!(
        "| {name} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
        samples.len(),
        samples.len() as f64 / secs,
        counts[0],
        counts[1],
        counts[2],
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let mode = FailureMode::parse(&args.mode).expect("local, allow, deny or error");
    let port = free_port();
    let redis_dir = tempfile::tempdir().unwrap();
    let spawn_redis = || {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &redis_dir.path().display().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH")
    };
    let restart = match args.fault.as_str() {
        "freeze" => false,
        "restart" => true,
        other => panic!("--fault freeze or restart, not {other}"),
    };
    let mut redis = spawn_redis();
    let signal = |redis: &std::process::Child, sig: &str| {
        Command::new("kill")
            .args([sig, &redis.id().to_string()])
            .status()
            .expect("kill");
    };
    std::thread::sleep(Duration::from_millis(300));

    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("o.yaml"), RULES).unwrap();
    let mut settings = ServeSettings::for_tests(rules.path().to_path_buf());
    settings.store.backend = BackendType::Redis;
    settings.store.redis_url = format!("127.0.0.1:{port}");
    settings.store.redis_timeout = Duration::from_millis(args.timeout_ms);
    settings.store.redis_failure_mode = mode;
    let server = server::start(&settings, Arc::new(SystemClock))
        .await
        .expect("server starts");
    let metrics_url = format!("http://{}/metrics", server.http_addr);
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();

    let start = monotonic();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::with_capacity(1 << 20)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..args.in_flight)
        .map(|w| {
            let (client, samples, stop) = (client.clone(), samples.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let mut client = client.clone();
                    let value = format!("u{}", (i * 7919 + w as u64) % 10_000);
                    let began = monotonic();
                    let outcome = match client.should_rate_limit(request(&value)).await {
                        Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => 0,
                        Ok(_) => 1,
                        Err(_) => 2,
                    };
                    let sample = Sample {
                        end_ms: start.elapsed().as_secs_f64() * 1000.0,
                        latency_us: began.elapsed().as_micros() as u64,
                        outcome,
                    };
                    samples.lock().unwrap().push(sample);
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(args.steady_ms)).await;
    let stop_at = start.elapsed().as_secs_f64() * 1000.0;
    if restart {
        let _ = redis.kill();
        let _ = redis.wait();
    } else {
        signal(&redis, "-STOP");
    }
    let mut down_after = None;
    while start.elapsed().as_secs_f64() * 1000.0 < stop_at + args.freeze_ms as f64 {
        if down_after.is_none() && store_up(&metrics_url).await == Some(false) {
            down_after = Some(start.elapsed().as_secs_f64() * 1000.0 - stop_at);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cont_at = start.elapsed().as_secs_f64() * 1000.0;
    if restart {
        redis = spawn_redis();
    } else {
        signal(&redis, "-CONT");
    }
    let mut up_after = None;
    while start.elapsed().as_secs_f64() * 1000.0 < cont_at + args.steady_ms as f64 {
        if up_after.is_none() && store_up(&metrics_url).await == Some(true) {
            up_after = Some(start.elapsed().as_secs_f64() * 1000.0 - cont_at);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    let end_ms = start.elapsed().as_secs_f64() * 1000.0;
    let samples = samples.lock().unwrap().clone();
    let phase = |from: f64, to: f64| -> Vec<Sample> {
        samples
            .iter()
            .copied()
            .filter(|s| s.end_ms >= from && s.end_ms < to)
            .collect()
    };
    let (fault, end) = if restart {
        ("killed", "the restart")
    } else {
        ("frozen", "SIGCONT")
    };
    println!(
        "REDIS_FAILURE_MODE={} REDIS_TIMEOUT={}ms, {} in flight, Redis {fault} {} ms",
        mode.name(),
        args.timeout_ms,
        args.in_flight,
        args.freeze_ms
    );
    println!(
        "store down (ratelimit_store_up 0) {:.0} ms after the fault; back on Redis (ratelimit_store_up 1) {:.0} ms after {end}",
        down_after.unwrap_or(f64::NAN),
        up_after.unwrap_or(f64::NAN)
    );
    println!(
        "p99.9 bound to compare with: 2.5 × REDIS_TIMEOUT = {} µs",
        args.timeout_ms * 2500
    );
    println!(
        "\n| phase | answers | per s | OK | OVER_LIMIT | gRPC errors | p50 µs | p99 µs | p99.9 µs | max µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    summary("before (Redis)", &phase(0.0, stop_at));
    summary("frozen", &phase(stop_at, cont_at));
    summary("after SIGCONT", &phase(cont_at, end_ms + 1.0));
    summary("whole run", &samples);
    println!("\n| slice (ms from SIGSTOP) | answers | gRPC errors | max µs |");
    println!("|---|---|---|---|");
    let mut t = stop_at - 500.0;
    while t < cont_at + 1000.0 {
        let slice = phase(t, t + 250.0);
        println!(
            "| {:+.0} | {} | {} | {} |",
            t - stop_at,
            slice.len(),
            slice.iter().filter(|s| s.outcome == 2).count(),
            slice.iter().map(|s| s.latency_us).max().unwrap_or(0)
        );
        t += 250.0;
    }
    server.shutdown_after(Duration::ZERO).await;
    let _ = redis.kill();
    let _ = redis.wait();
}
