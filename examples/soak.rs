//! Soak load for a running server: steady ShouldRateLimit calls over many
//! distinct keys (never above `--rate`: a caller that falls behind does not catch up in a burst
//! unless `--burst`), and RLQS streams that report their buckets every second and read every answer,
//! each stream closed and opened again every minute. Prints one line a minute (calls, answers by
//! code, errors, RLQS messages). `scripts/issue31-probes/soak.sh` starts the server and Redis,
//! reloads the rules, kills Redis now and then, and samples the server's RSS meanwhile.
//!
//! `cargo run --example soak -- --addr 127.0.0.1:8081 --minutes 20 --keys 200000`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;
use tokio::time::MissedTickBehavior;
use tonic::transport::Channel;

#[derive(Debug, Parser)]
struct Args {
    /// The server's gRPC address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    /// How long to run.
    #[arg(long, default_value_t = 20)]
    minutes: u64,
    /// Distinct `user` values, called in turn (more than the Redis store's 65,536 remembered
    /// keys, so that cache reaches its cap).
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// ShouldRateLimit calls per second (spread over `--in-flight` callers).
    #[arg(long, default_value_t = 400)]
    rate: u64,
    #[arg(long, default_value_t = 4)]
    in_flight: u64,
    /// RLQS streams held open (each reopened every minute).
    #[arg(long, default_value_t = 4)]
    streams: u64,
    /// Buckets each stream reports.
    #[arg(long, default_value_t = 50)]
    buckets: u64,
    /// Let a caller that fell behind catch up in a burst (tokio's `MissedTickBehavior::Burst`).
    /// Off by default: a late caller waits a whole period from its late call
    /// (`MissedTickBehavior::Delay`), so the call rate never rises above `--rate` and a memory
    /// figure does not depend on how far the load side fell behind.
    #[arg(long)]
    burst: bool,
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
    rlqs_messages: AtomicU64,
    rlqs_errors: AtomicU64,
}

fn request(user: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "soak".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: format!("user-{user:07}"),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// One caller: every `period`, the next key of its share.
async fn call(
    client: RateLimitServiceClient<Channel>,
    args: Arc<Args>,
    first: u64,
    c: Arc<Counts>,
) {
    let period = Duration::from_micros(1_000_000 * args.in_flight / args.rate.max(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(if args.burst {
        MissedTickBehavior::Burst
    } else {
        MissedTickBehavior::Delay
    });
    let mut user = first;
    loop {
        tick.tick().await;
        let mut client = client.clone();
        match client.should_rate_limit(request(user % args.keys)).await {
            Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => &c.ok,
            Ok(_) => &c.over,
            Err(_) => &c.errors,
        }
        .fetch_add(1, Ordering::Relaxed);
        user += args.in_flight;
    }
}

/// One RLQS stream after another, each reporting `buckets` every second for a minute and reading
/// every answer.
async fn rlqs(channel: Channel, args: Arc<Args>, stream: u64, c: Arc<Counts>) {
    let buckets: Vec<BucketId> = (0..args.buckets)
        .map(|b| BucketId {
            bucket: [
                ("name".to_owned(), "per-api-key".to_owned()),
                ("api_key".to_owned(), format!("s{stream}-b{b}")),
            ]
            .into(),
        })
        .collect();
    loop {
        let mut client = RateLimitQuotaServiceClient::new(channel.clone());
        let (reports, rx) = tokio::sync::mpsc::channel(4);
        let answers = match client
            .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(a) => a.into_inner(),
            Err(_) => {
                c.rlqs_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let counts = c.clone();
        let reader = tokio::spawn(async move {
            let mut answers = answers;
            while let Ok(Some(_)) = answers.message().await {
                counts.rlqs_messages.fetch_add(1, Ordering::Relaxed);
            }
        });
        for beat in 0..60 {
            let message = RateLimitQuotaUsageReports {
                domain: if beat == 0 {
                    "soak".into()
                } else {
                    String::new()
                },
                bucket_quota_usages: buckets
                    .iter()
                    .map(|id| BucketQuotaUsage {
                        bucket_id: Some(id.clone()),
                        time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                            seconds: 1,
                            nanos: 0,
                        }),
                        num_requests_allowed: 1,
                        num_requests_denied: 0,
                    })
                    .collect(),
            };
            if reports.send(message).await.is_err() {
                c.rlqs_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        drop(reports);
        reader.abort();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(Args::parse());
    let channel = Channel::from_shared(format!("http://{}", args.addr))?
        .connect()
        .await?;
    let counts = Arc::new(Counts::default());
    for first in 0..args.in_flight {
        let client = RateLimitServiceClient::new(channel.clone());
        tokio::spawn(call(client, args.clone(), first, counts.clone()));
    }
    for stream in 0..args.streams {
        tokio::spawn(rlqs(channel.clone(), args.clone(), stream, counts.clone()));
    }
    let started = monotonic();
    println!("minute ok over_limit errors rlqs_messages rlqs_errors");
    for minute in 1..=args.minutes {
        tokio::time::sleep_until((started + Duration::from_secs(60 * minute)).into()).await;
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        println!(
            "{minute} {} {} {} {} {}",
            take(&counts.ok),
            take(&counts.over),
            take(&counts.errors),
            take(&counts.rlqs_messages),
            take(&counts.rlqs_errors)
        );
    }
    Ok(())
}
