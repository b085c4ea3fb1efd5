//! RLQS from outside: streams that never read, and shadow-mode buckets (`scripts/issue31-probes/rlqs.sh` starts
//! the server and runs this): loopback only, bounded in count and time.
//!
//! - `slow-readers`: streams that report many buckets often and never read an answer; prints the
//!   server's RSS and `ratelimit_rlqs_outbox_pending` every second, then again after they close.
//! - `caps`: streams up to the server's bucket cap (and some past it) reporting in rounds (every
//!   5 s, or once the server has read the last round), with ShouldRateLimit calls meanwhile (their
//!   latency); then the server's CPU over 30 s with every stream open and silent, ShouldRateLimit
//!   latency over 20 s while those buckets tick (compare with `--streams 0`), and the CPU again
//!   after every stream closed.
//!
//! ```sh
//! cargo build --example rlqs_probe
//! target/debug/examples/rlqs_probe caps --grpc 127.0.0.1:8081 --admin 127.0.0.1:8080 --pid PID
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use hdrhistogram::Histogram;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// The rules domain the probe's rules file names (scripts/issue31-probes/rlqs.yaml).
const DOMAIN: &str = "rlqs-probe";

#[derive(Parser)]
struct Args {
    /// The server's gRPC listener.
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc: SocketAddr,
    /// The server's admin listener (/metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    admin: SocketAddr,
    /// The server's process id (its RSS and CPU are read from /proc).
    #[arg(long)]
    pid: u32,
    /// Another process whose CPU at rest is read beside the server's (e.g. its redis-server).
    #[arg(long)]
    also_pid: Option<u32>,
    #[command(subcommand)]
    probe: Probe,
}

#[derive(Subcommand)]
enum Probe {
    /// Streams that report and never read.
    SlowReaders {
        #[arg(long, default_value_t = 10)]
        streams: usize,
        #[arg(long, default_value_t = 5_000)]
        buckets: usize,
        /// Between two reports of one stream.
        #[arg(long, default_value_t = 100)]
        every_ms: u64,
        #[arg(long, default_value_t = 15)]
        seconds: u64,
    },
    /// Streams at the bucket caps.
    Caps {
        /// Streams of 10,000 buckets each: 20 fill the server's 200,000; the rest are refused.
        #[arg(long, default_value_t = 25)]
        streams: usize,
        #[arg(long, default_value_t = 10_000)]
        buckets: usize,
        /// Rounds of reports (every 5 s, or as soon as the server has read the last one), with
        /// ShouldRateLimit calls alongside.
        #[arg(long, default_value_t = 3)]
        rounds: u64,
    },
}

/// One stream's sending side; its answers are read by a task of its own, or not at all.
struct Reporter {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    usages: Vec<BucketQuotaUsage>,
    first: bool,
    _responses: Option<tonic::Streaming<RateLimitQuotaResponse>>,
}

impl Reporter {
    /// A stream whose buckets are `{name: <name>, n: <stream>-<i>}`.
    async fn open(args: &Args, name: &str, stream: usize, buckets: usize, read: bool) -> Reporter {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", args.grpc))
            .await
            .expect("connects")
            .max_decoding_message_size(64 << 20);
        let (reports, rx) = mpsc::channel(4);
        let responses = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        let responses = if read {
            tokio::spawn(async move {
                let mut responses = responses;
                while let Ok(Some(_)) = responses.message().await {}
            });
            None
        } else {
            Some(responses)
        };
        let usages = (0..buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [
                        ("name".to_owned(), name.to_owned()),
                        ("n".to_owned(), format!("{stream}-{i}")),
                    ]
                    .into_iter()
                    .collect(),
                }),
                time_elapsed: Some(ProtoDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
            })
            .collect();
        Reporter {
            reports,
            usages,
            first: true,
            _responses: responses,
        }
    }

    async fn report(&mut self) -> bool {
        let domain = if std::mem::take(&mut self.first) {
            DOMAIN
        } else {
            ""
        };
        let message = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: self.usages.clone(),
        };
        self.reports.send(message).await.is_ok()
    }
}

/// The server's resident set, in MB.
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The server's CPU time (user + system) in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    field(14).unwrap_or(0) + field(15).unwrap_or(0)
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The server's share of one core over `window`.
async fn cpu_share(pid: u32, window: Duration) -> f64 {
    let before = cpu_ticks(pid);
    tokio::time::sleep(window).await;
    let ticks = cpu_ticks(pid).saturating_sub(before) as f64;
    ticks / clock_ticks_per_second() / window.as_secs_f64()
}

/// A series' value on the server's /metrics (0 when absent).
async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{admin}/metrics")).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn slow_readers(args: &Args, streams: usize, buckets: usize, every: Duration, secs: u64) {
    let pid = args.pid;
    println!("before: rss {:.0} MB", rss_mb(pid));
    let mut tasks = Vec::new();
    let until = Instant::now() + Duration::from_secs(secs);
    for s in 0..streams {
        let mut reporter = Reporter::open(args, "free", s, buckets, false).await;
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until && reporter.report().await {
                tokio::time::sleep(every).await;
            }
            reporter
        }));
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "t={:>2}s rss {:.0} MB, outbox pending {}, reports {}",
            started.elapsed().as_secs(),
            rss_mb(pid),
            metric(args.admin, "ratelimit_rlqs_outbox_pending").await,
            metric(args.admin, "ratelimit_rlqs_reports_total").await,
        );
    }
    let mut reporters = Vec::new();
    for task in tasks {
        reporters.extend(task.await.ok());
    }
    println!(
        "at close: rss {:.0} MB, outbox pending {}",
        rss_mb(pid),
        metric(args.admin, "ratelimit_rlqs_outbox_pending").await
    );
    drop(reporters);
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!(
        "5 s after close: rss {:.0} MB, outbox pending {}, streams {}",
        rss_mb(pid),
        metric(args.admin, "ratelimit_rlqs_outbox_pending").await,
        metric(args.admin, "ratelimit_rlqs_streams").await
    );
}

/// ShouldRateLimit calls one after another until `stop` is set; their latencies in microseconds.
async fn decide(grpc: SocketAddr, stop: Arc<AtomicBool>) -> Histogram<u64> {
    let mut histogram = Histogram::<u64>::new(3).expect("valid histogram");
    let Ok(mut client) = RateLimitServiceClient::connect(format!("http://{grpc}")).await else {
        return histogram;
    };
    let request = RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "name".to_owned(),
                value: "decide".to_owned(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let _ = client.should_rate_limit(request.clone()).await;
        let _ = histogram.record(started.elapsed().as_micros() as u64);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    histogram
}

/// Four callers of [`decide`] on a runtime of their own (one thread), their latencies together
/// once `stop` is set. Not on the probe's runtime, where its RLQS streams encode and decode
/// messages of 10,000 buckets: what they measure is the server, not the probe's own work. (Both
/// ways read alike on 2026-12-04: ShouldRateLimit p99 14-29 ms during the report rounds, with
/// stalls of 100-200 ms.) They start at once.
fn deciders(grpc: SocketAddr, stop: Arc<AtomicBool>) -> impl Future<Output = Histogram<u64>> {
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the callers' runtime starts");
        runtime.block_on(async move {
            let callers: Vec<_> = (0..4)
                .map(|_| tokio::spawn(decide(grpc, stop.clone())))
                .collect();
            let mut all = Histogram::<u64>::new(3).expect("valid histogram");
            for caller in callers {
                if let Ok(h) = caller.await {
                    let _ = all.add(h);
                }
            }
            all
        })
    });
    async move {
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| Histogram::<u64>::new(3).expect("valid histogram"))
    }
}

/// Waits until `series` reaches `target` (at most `limit`); whether it did.
async fn reach(admin: SocketAddr, series: &str, target: f64, limit: Duration) -> bool {
    let started = Instant::now();
    while metric(admin, series).await < target {
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    true
}

async fn caps(args: &Args, streams: usize, buckets: usize, rounds: u64) {
    let pid = args.pid;
    println!("before: rss {:.0} MB", rss_mb(pid));
    let stop = Arc::new(AtomicBool::new(false));
    let mut reporters = Vec::new();
    for s in 0..streams {
        // Half the buckets limited, half in shadow mode.
        let name = if s % 2 == 0 { "limited" } else { "shadow" };
        reporters.push(Reporter::open(args, name, s, buckets, true).await);
    }
    let started = Instant::now();
    let callers = deciders(args.grpc, stop.clone());
    let per_round = (streams * buckets) as f64;
    for round in 0..rounds {
        let next = Instant::now() + Duration::from_secs(5);
        for reporter in &mut reporters {
            reporter.report().await;
        }
        let read = reach(
            args.admin,
            "ratelimit_rlqs_reports_total",
            per_round * (round + 1) as f64,
            Duration::from_secs(300),
        )
        .await;
        println!(
            "round {} read {} after {:.0} s: buckets {}, refused {}",
            round + 1,
            if read { "whole" } else { "in part" },
            started.elapsed().as_secs_f64(),
            metric(args.admin, "ratelimit_rlqs_buckets").await,
            metric(args.admin, "ratelimit_rlqs_buckets_refused_total").await,
        );
        tokio::time::sleep_until(next).await;
    }
    stop.store(true, Ordering::Relaxed);
    let all = callers.await;
    println!(
        "after {rounds} rounds: rss {:.0} MB, buckets {}, refused {}, reports {}",
        rss_mb(pid),
        metric(args.admin, "ratelimit_rlqs_buckets").await,
        metric(args.admin, "ratelimit_rlqs_buckets_refused_total").await,
        metric(args.admin, "ratelimit_rlqs_reports_total").await,
    );
    println!(
        "ShouldRateLimit meanwhile: {} calls, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        all.len(),
        all.value_at_quantile(0.5) as f64 / 1000.0,
        all.value_at_quantile(0.99) as f64 / 1000.0,
        all.max() as f64 / 1000.0
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let also = args.also_pid.map(cpu_ticks);
    println!(
        "streams open and silent: cpu {:.1} % of a core over 30 s, buckets {}",
        100.0 * cpu_share(pid, Duration::from_secs(30)).await,
        metric(args.admin, "ratelimit_rlqs_buckets").await,
    );
    if let (Some(other), Some(before)) = (args.also_pid, also) {
        let ticks = cpu_ticks(other).saturating_sub(before) as f64;
        println!(
            "  meanwhile process {other} (--also-pid): cpu {:.1} % of a core",
            100.0 * ticks / clock_ticks_per_second() / 30.0
        );
    }
    // The same calls while every bucket is held and ticks (the streams silent): compared with a
    // run of `--streams 0`, what the buckets cost a decision's latency.
    let stop = Arc::new(AtomicBool::new(false));
    let callers = deciders(args.grpc, stop.clone());
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    let ticking = callers.await;
    println!(
        "ShouldRateLimit over 20 s with the buckets held and ticking: {} calls, p50 {:.3} ms, \
         p99 {:.3} ms, max {:.1} ms (buckets {})",
        ticking.len(),
        ticking.value_at_quantile(0.5) as f64 / 1000.0,
        ticking.value_at_quantile(0.99) as f64 / 1000.0,
        ticking.max() as f64 / 1000.0,
        metric(args.admin, "ratelimit_rlqs_buckets").await,
    );
    drop(reporters);
    // Closed streams' shares bind until their TTL (20 s).
    tokio::time::sleep(Duration::from_secs(25)).await;
    println!(
        "every stream closed: cpu {:.1} % of a core over 30 s, buckets {}, rss {:.0} MB",
        100.0 * cpu_share(pid, Duration::from_secs(30)).await,
        metric(args.admin, "ratelimit_rlqs_buckets").await,
        rss_mb(pid)
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match args.probe {
        Probe::SlowReaders {
            streams,
            buckets,
            every_ms,
            seconds,
        } => {
            slow_readers(
                &args,
                streams,
                buckets,
                Duration::from_millis(every_ms),
                seconds,
            )
            .await
        }
        Probe::Caps {
            streams,
            buckets,
            rounds,
        } => caps(&args, streams, buckets, rounds).await,
    }
}
