//! The Rate Limit Quota Service over loopback gRPC, driven as Envoy drives it: a new bucket
//! reported alone with one request allowed, then reports every beat; assignments read back as
//! Envoy reads them. The server runs on a manual clock; its ticker runs in real time.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::common::metrics::scrape_count as scrape_metric;
use crate::common::process::Served;
use crate::common::redis::RedisServer;
use crate::common::wait::{eventually, eventually_or};
use crate::common::{self, TestServer};

const RULES: &str = "
domain: rlqs-test
descriptors:
  - key: name
    value: per-api-key
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: name
    value: vip
    rate_limit: {unlimited: true}
";

/// One RLQS stream as an Envoy holds it.
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    assignments: Streaming<RateLimitQuotaResponse>,
    first: bool,
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// What Envoy was told for one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Told {
    /// (max_tokens, tokens_per_fill, fill_interval seconds, ttl seconds)
    TokenBucket(u32, u32, i64, i64),
    Blanket(BlanketRule, i64),
    Abandon,
}

fn told(action: &Action) -> Told {
    match action {
        Action::AbandonAction(_) => Told::Abandon,
        Action::QuotaAssignmentAction(a) => {
            let ttl = a.assignment_time_to_live.unwrap().seconds;
            match a.rate_limit_strategy.unwrap().strategy.unwrap() {
                Strategy::TokenBucket(tb) => Told::TokenBucket(
                    tb.max_tokens,
                    tb.tokens_per_fill.unwrap().value,
                    tb.fill_interval.unwrap().seconds,
                    ttl,
                ),
                Strategy::BlanketRule(rule) => {
                    Told::Blanket(BlanketRule::try_from(rule).unwrap(), ttl)
                }
                Strategy::RequestsPerTimeUnit(_) => panic!("never sent"),
            }
        }
    }
}

impl Envoy {
    async fn connect(s: &TestServer) -> Envoy {
        let client = RateLimitQuotaServiceClient::connect(format!("http://{}", s.server.grpc_addr))
            .await
            .expect("connects");
        Envoy::on(client).await
    }

    /// A stream to a server process's gRPC port.
    async fn at(port: u16) -> Envoy {
        let client = RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connects");
        Envoy::on(client).await
    }

    async fn on(mut client: RateLimitQuotaServiceClient<tonic::transport::Channel>) -> Envoy {
        let (reports, rx) = mpsc::channel(16);
        let assignments = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        Envoy {
            reports,
            assignments,
            first: true,
        }
    }

    /// Reports `(bucket, allowed, denied)`; the domain goes on the stream's first message only,
    /// as Envoy sends it.
    async fn report(&mut self, usages: &[(&BucketId, u64, u64)]) {
        let domain = if self.first { "rlqs-test" } else { "" };
        self.first = false;
        let message = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages
                .iter()
                .map(|(id, allowed, denied)| BucketQuotaUsage {
                    bucket_id: Some((*id).clone()),
                    time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: 0,
                        nanos: 0,
                    }),
                    num_requests_allowed: *allowed,
                    num_requests_denied: *denied,
                })
                .collect(),
        };
        self.reports.send(message).await.expect("stream open");
    }

    /// The next message, as (bucket entries, what was told), within 10 s.
    async fn next(&mut self) -> Vec<(HashMap<String, String>, Told)> {
        let message = tokio::time::timeout(Duration::from_secs(10), self.assignments.message())
            .await
            .expect("an assignment within 10 s")
            .expect("stream healthy")
            .expect("stream not ended");
        message
            .bucket_action
            .iter()
            .map(|a| {
                (
                    a.bucket_id.clone().unwrap().bucket,
                    told(a.bucket_action.as_ref().unwrap()),
                )
            })
            .collect()
    }

    /// Every message until none comes for 2 s: the last action told (at least one message is
    /// awaited).
    async fn last_told(&mut self) -> Told {
        let mut last = self.next_one().await;
        while let Ok(message) =
            tokio::time::timeout(Duration::from_secs(2), self.assignments.message()).await
        {
            let message = message.expect("stream healthy").expect("stream not ended");
            if let Some(action) = message.bucket_action.last() {
                last = told(action.bucket_action.as_ref().unwrap());
            }
        }
        last
    }

    /// The next message's one action.
    async fn next_one(&mut self) -> Told {
        let mut actions = self.next().await;
        assert_eq!(actions.len(), 1, "{actions:?}");
        actions.remove(0).1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_bucket_is_assigned_its_share_at_once() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    let actions = envoy.next().await;
    assert_eq!(actions.len(), 1);
    assert_eq!(actions[0].0, k1.bucket, "the bucket id is echoed");
    // 10 per minute = 600 per hour; the request admitted before any assignment is taken off.
    assert_eq!(actions[0].1, Told::TokenBucket(9, 600, 3600, 20));
    // The next beat re-sends the same assignment (its TTL restarts; Envoy keeps its tokens).
    envoy.report(&[(&k1, 9, 20)]).await;
    assert_eq!(envoy.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_without_a_limit_are_allowed_for_an_hour() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let unruled = bucket(&[("name", "nothing-matches")]);
    let vip = bucket(&[("name", "vip")]);
    envoy.report(&[(&unruled, 1, 0), (&vip, 3, 0)]).await;
    let actions = envoy.next().await;
    assert_eq!(actions.len(), 2);
    for (_, told) in actions {
        assert_eq!(told, Told::Blanket(BlanketRule::AllowAll, 3600));
    }
}

/// A rate_limit_quota filter whose `domain` no rules file defines (here the rules say `other`)
/// has its buckets allowed for an hour, as before, and the server now says so, once per domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_of_a_domain_without_rules_are_allowed_and_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rlqs.yaml"),
        RULES.replace("rlqs-test", "other"),
    )
    .unwrap();
    let mut served = Served::start(dir.path(), &[]);
    served.wait_healthy().await;
    let mut envoy = Envoy::at(served.grpc).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    let k2 = bucket(&[("name", "per-api-key"), ("api_key", "k2")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    assert_eq!(
        envoy.next_one().await,
        Told::Blanket(BlanketRule::AllowAll, 3600)
    );
    envoy.report(&[(&k2, 1, 0)]).await;
    assert_eq!(
        envoy.next_one().await,
        Told::Blanket(BlanketRule::AllowAll, 3600)
    );
    let log = served.log();
    let warned = served.lines_with("a call for a domain that no rules file defines");
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("domain=\"rlqs-test\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_envoy_gets_a_share_and_the_first_is_told_without_asking() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    let mut a = Envoy::connect(&s).await;
    a.report(&[(&k1, 1, 0)]).await;
    assert_eq!(a.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
    let mut b = Envoy::connect(&s).await;
    b.report(&[(&k1, 1, 0)]).await;
    // The rate is halved; A's old bucket (9) is released, 8 are left: 5 for A, 3 for B.
    assert_eq!(a.next_one().await, Told::TokenBucket(5, 300, 3600, 20));
    assert_eq!(b.next_one().await, Told::TokenBucket(3, 300, 3600, 20));
    // Another key has a pool of its own.
    let k2 = bucket(&[("name", "per-api-key"), ("api_key", "k2")]);
    b.report(&[(&k2, 1, 0)]).await;
    assert_eq!(b.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_count_in_the_rules_series_and_the_rlqs_series() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("api_key", "k1"), ("name", "per-api-key")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    envoy.next().await;
    envoy.report(&[(&k1, 9, 20)]).await;
    envoy.next().await;
    let metrics = s.http("/metrics");
    let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
    let series = |family: &str| {
        format!(
            "{family}{{domain=\"rlqs-test\",rule=\"name_per-api-key.api_key\",key1=\"name_per-api-key\",key2=\"api_key\"}}"
        )
    };
    for (family, want) in [
        ("ratelimit_service_rate_limit_total_hits", 30),
        ("ratelimit_service_rate_limit_within_limit", 10),
        ("ratelimit_service_rate_limit_over_limit", 20),
    ] {
        let line = format!("{} {want}", series(family));
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    assert_eq!(scrape_metric(&metrics, "ratelimit_rlqs_streams").await, 1);
    assert_eq!(scrape_metric(&metrics, "ratelimit_rlqs_buckets").await, 1);
    assert_eq!(
        scrape_metric(&metrics, "ratelimit_rlqs_reports_total").await,
        2
    );
    assert!(text.contains("ratelimit_rlqs_assignments_total{action=\"token_bucket\"} 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_bucket_is_abandoned() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    envoy.next().await;
    s.advance(61);
    // The ticker (every second) finds the bucket idle and tells Envoy to drop it.
    assert_eq!(envoy.next_one().await, Told::Abandon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lowers_the_limit_is_pushed_at_once() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 0, 0)]).await;
    assert_eq!(envoy.next_one().await, Told::TokenBucket(10, 600, 3600, 20));
    std::fs::write(
        s.dir.path().join("rlqs.yaml"),
        RULES.replace("requests_per_unit: 10", "requests_per_unit: 2"),
    )
    .unwrap();
    assert_eq!(envoy.next_one().await, Told::TokenBucket(2, 120, 3600, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cannot_hold_more_buckets_than_its_cap_and_each_refusal_counts_once() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let ids: Vec<BucketId> = (0..10_050)
        .map(|i| bucket(&[("name", "nothing-matches"), ("n", &i.to_string())]))
        .collect();
    let (held, over) = ids.split_at(10_000);
    for chunk in held.chunks(2_000) {
        let usages: Vec<(&BucketId, u64, u64)> = chunk.iter().map(|id| (id, 1, 0)).collect();
        envoy.report(&usages).await;
        assert_eq!(envoy.next().await.len(), 2_000);
    }
    // Past the cap a bucket is not answered: Envoy keeps its no-assignment behaviour for it. It
    // reports the bucket again every 5 s; each refused bucket is counted once.
    for _ in 0..3 {
        let mut usages: Vec<(&BucketId, u64, u64)> = over.iter().map(|id| (id, 1, 0)).collect();
        usages.push((&held[1], 1, 0));
        envoy.report(&usages).await;
        assert_eq!(envoy.next().await.len(), 1);
    }
    let metrics = s.http("/metrics");
    assert_eq!(
        scrape_metric(&metrics, "ratelimit_rlqs_buckets_refused_total").await,
        50
    );
    assert_eq!(
        scrape_metric(&metrics, "ratelimit_rlqs_buckets").await,
        10_000
    );
    // A known bucket is still answered.
    envoy.report(&[(&held[0], 1, 0)]).await;
    assert_eq!(envoy.next().await.len(), 1);
}

/// Streams whose client sends reports and never reads the answers: the
/// server holds at most one action per bucket for each, and nothing once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_read_hold_at_most_one_action_per_bucket() {
    const BUCKETS: usize = 2_000;
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let metrics = s.http("/metrics");
    let ids: Vec<BucketId> = (0..BUCKETS)
        .map(|i| bucket(&[("name", "nothing-matches"), ("n", &i.to_string())]))
        .collect();
    let usages: Vec<(&BucketId, u64, u64)> = ids.iter().map(|id| (id, 1, 0)).collect();
    let mut silent = Vec::new();
    for _ in 0..3 {
        // Each answer is ~100 kB: 40 of them are past what HTTP/2 lets the server send to a
        // client that reads nothing (tonic's client windows: 2 MB a stream, 5 MB a connection).
        let mut envoy = Envoy::connect(&s).await;
        for _ in 0..40 {
            envoy.report(&usages).await;
        }
        silent.push(envoy);
    }
    let reports = 3 * 40 * BUCKETS as u64;
    eventually("every report is read", || async {
        scrape_metric(&metrics, "ratelimit_rlqs_reports_total").await >= reports
    })
    .await;
    // The last answers are queued just after their reports are counted.
    eventually("the clients read nothing, and actions wait", || async {
        scrape_metric(&metrics, "ratelimit_rlqs_outbox_pending").await > 0
    })
    .await;
    let pending = scrape_metric(&metrics, "ratelimit_rlqs_outbox_pending").await;
    assert!(
        pending <= 3 * BUCKETS as u64,
        "{pending} actions wait for 3 streams of {BUCKETS} buckets"
    );
    // A stream that reads gets the newest action per bucket, once.
    let mut reader = silent.pop().expect("three streams");
    let mut seen = 0;
    while seen < BUCKETS {
        seen += reader.next().await.len();
    }
    drop(reader);
    drop(silent);
    eventually("nothing pending once the streams close", || async {
        scrape_metric(&metrics, "ratelimit_rlqs_outbox_pending").await == 0
            && scrape_metric(&metrics, "ratelimit_rlqs_streams").await == 0
    })
    .await;
}

/// A shadow-mode bucket binds no Envoy: once its streams close it is forgotten, not ticked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_mode_bucket_goes_with_its_last_stream() {
    let rules = RULES.replace(
        "rate_limit: {unit: minute, requests_per_unit: 10}",
        "rate_limit: {unit: minute, requests_per_unit: 10}\n        shadow_mode: true",
    );
    let s = common::start(&[("rlqs.yaml", &rules)]).await;
    let metrics = s.http("/metrics");
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 30, 0)]).await;
    assert_eq!(
        envoy.next_one().await,
        Told::Blanket(BlanketRule::AllowAll, 3600)
    );
    assert_eq!(scrape_metric(&metrics, "ratelimit_rlqs_buckets").await, 1);
    drop(envoy);
    eventually("the bucket goes with its stream", || async {
        scrape_metric(&metrics, "ratelimit_rlqs_buckets").await == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_stream() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    envoy.next().await;
    let shutdown = tokio::spawn(s.server.shutdown_after(Duration::ZERO));
    let end = tokio::time::timeout(Duration::from_secs(10), envoy.assignments.message())
        .await
        .expect("the stream ends within 10 s");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown does not wait on the stream")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_how_a_bucket_is_read_and_each_streams_share() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    envoy.next().await;
    let url = s.http("/explain?domain=rlqs-test&bucket=api_key%3Dk1%2Cname%3Dper-api-key");
    let live: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(live["descriptor"], "name=per-api-key,api_key=k1", "{live}");
    assert_eq!(live["outcome"], "shared", "{live}");
    assert_eq!(live["rule"], "name_per-api-key.api_key", "{live}");
    assert_eq!(live["pool"]["tokens"], 10, "{live}");
    assert_eq!(live["pool"]["period_secs"], 60, "{live}");
    let streams = live["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1, "{live}");
    assert_eq!(
        streams[0]["grant"]["token_bucket"]["max_tokens"], 9,
        "{live}"
    );
    // The command line reads the same bucket offline, and the live shares from the server.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["explain", "--bucket", "--domain", "rlqs-test", "--server"])
        .arg(s.http(""))
        .arg(s.dir.path())
        .arg("api_key=k1,name=per-api-key")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for needle in [
        "read as descriptor name=per-api-key,api_key=k1",
        "rule 'name_per-api-key.api_key': a pool of 10 per 60 s, burst 10",
        "live on",
        "1 stream(s)",
        "\"max_tokens\":9",
    ] {
        assert!(text.contains(needle), "`{needle}` in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_buckets_are_not_kept() {
    let s = common::start(&[("rlqs.yaml", RULES)]).await;
    let mut envoy = Envoy::connect(&s).await;
    let huge_value = "v".repeat(100_000);
    let huge = bucket(&[("name", "per-api-key"), ("api_key", &huge_value)]);
    let keys: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    let wide_entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    let wide = bucket(&wide_entries);
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy
        .report(&[(&huge, 1, 0), (&wide, 1, 0), (&k1, 1, 0)])
        .await;
    // Only the well-formed bucket is answered.
    let actions = envoy.next().await;
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(actions[0].0, k1.bucket);
    let metrics = s.http("/metrics");
    assert_eq!(scrape_metric(&metrics, "ratelimit_rlqs_buckets").await, 1);
    assert_eq!(
        scrape_metric(&metrics, "ratelimit_rlqs_buckets_refused_total").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_can_be_turned_off() {
    let s = common::start_with(&[("rlqs.yaml", RULES)], |settings| {
        settings.rlqs_enabled = false;
    })
    .await;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", s.server.grpc_addr))
        .await
        .expect("connects");
    let (_reports, rx) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let status = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .expect_err("no such service");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

/// Connects every channel to one Unix socket.
#[derive(Clone)]
struct Uds(std::path::PathBuf);

impl tonic::codegen::Service<tonic::transport::Uri> for Uds {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::transport::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(hyper_util::rt::TokioIo::new)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_is_served_on_the_unix_socket_too() {
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("rls.sock");
    let socket = path.clone();
    let _s = common::start_with(&[("rlqs.yaml", RULES)], move |settings| {
        settings.grpc_uds = Some(socket);
    })
    .await;
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(Uds(path))
        .await
        .expect("connects over the socket");
    let mut envoy = Envoy::on(RateLimitQuotaServiceClient::new(channel)).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    envoy.report(&[(&k1, 1, 0)]).await;
    assert_eq!(envoy.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
}

/// Two server processes with `env` on one rules directory, healthy.
async fn two_servers(env: &[(&str, String)]) -> (tempfile::TempDir, Served, Served) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rlqs.yaml"), RULES).unwrap();
    let (mut one, mut two) = (
        Served::with_env(dir.path(), env),
        Served::with_env(dir.path(), env),
    );
    one.wait_healthy().await;
    two.wait_healthy().await;
    (dir, one, two)
}

/// [`two_servers`] sharing one store: once each sees the other's beat, an Envoy on each reports
/// bucket `k1` (10 a minute), and each gets the even split among the two instances alive: half of
/// 10 (less the request before the assignment) and half of 600 per hour.
async fn split_in_two(
    env: &[(&str, String)],
) -> (tempfile::TempDir, Served, Served, Envoy, Envoy, BucketId) {
    let (dir, one, two) = two_servers(env).await;
    one.wait_for_metric("ratelimit_rlqs_instances", 2).await;
    two.wait_for_metric("ratelimit_rlqs_instances", 2).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    let (mut a, mut b) = (Envoy::at(one.grpc).await, Envoy::at(two.grpc).await);
    a.report(&[(&k1, 1, 0)]).await;
    b.report(&[(&k1, 1, 0)]).await;
    assert_eq!(a.next_one().await, Told::TokenBucket(4, 300, 3600, 20));
    assert_eq!(b.next_one().await, Told::TokenBucket(4, 300, 3600, 20));
    (dir, one, two, a, b, k1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn two_servers_on_one_redis_split_one_buckets_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let env = [
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_URL", redis.addr()),
    ];
    let (_dir, one, _two, mut a, mut b, k1) = split_in_two(&env).await;
    // Equal demand for a few beats: the fractions follow the demands exchanged in Redis. Denied
    // requests only: admitted ones would spend each instance's half of the burst (4 tokens, one
    // back every 12 s), and whether the fourth landed before the last assignment was read would
    // decide between a bucket of 1 and `DenyAll` (a correct answer for a share used up).
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        a.report(&[(&k1, 0, 4)]).await;
        b.report(&[(&k1, 0, 4)]).await;
    }
    let (ta, tb) = (a.last_told().await, b.last_told().await);
    eprintln!("rlqs two servers on one Redis, after 4 beats of equal demand: {ta:?} + {tb:?}");
    let (Told::TokenBucket(max_a, fill_a, 3600, 20), Told::TokenBucket(max_b, fill_b, 3600, 20)) =
        (ta.clone(), tb.clone())
    else {
        panic!("token buckets on both: {ta:?} {tb:?}");
    };
    // Together within the rule (burst 10, 600 per hour), each with a share.
    assert!(max_a + max_b <= 10, "{ta:?} {tb:?}");
    assert!(fill_a + fill_b <= 600, "{ta:?} {tb:?}");
    assert!(
        max_a >= 1 && max_b >= 1 && fill_a >= 1 && fill_b >= 1,
        "{ta:?} {tb:?}"
    );
    // `/explain` shows each instance's part of the pool, about half.
    let url = format!(
        "{}/explain?domain=rlqs-test&bucket=api_key%3Dk1%2Cname%3Dper-api-key",
        one.http
    );
    let view: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let fraction = view["fraction"].as_f64().expect("a fraction");
    assert!((0.25..=0.75).contains(&fraction), "{view}");
    // Every key the exchange wrote carries a TTL.
    let mut keys = redis.keys("*%rlqs*");
    keys.extend(redis.keys("*%instances"));
    assert_eq!(
        keys.len(),
        3,
        "the bucket's hash, the moves counter and the instances': {keys:?}"
    );
    for key in keys {
        let ttl: i64 = redis.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    assert_eq!(one.metric("ratelimit_rlqs_exchange_errors_total").await, 0);
}

/// A bucket at rest costs no call (issue 34: 200,000 of them took a third of a core): once its
/// demand is written and no other instance moves, the entry is not written again every second,
/// nor the moves counter touched; when the bucket's last stream goes, its entry is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_bucket_at_rest_is_not_written_again_and_a_dropped_one_is_deleted() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let env = [
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_URL", redis.addr()),
    ];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rlqs.yaml"), RULES).unwrap();
    let mut one = Served::with_env(dir.path(), &env);
    one.wait_healthy().await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    let mut a = Envoy::at(one.grpc).await;
    a.report(&[(&k1, 1, 0)]).await;
    assert_eq!(a.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
    let hash = || redis.keys("*%rlqs|*");
    eventually("the bucket's entry is written", || async {
        hash().len() == 1
    })
    .await;
    let key = hash().remove(0);
    let state = || {
        (
            redis.cli(&["HGETALL", &key]).unwrap(),
            redis.cli(&["GET", &redis.keys("*%rlqs-moves")[0]]).unwrap(),
        )
    };
    // A round or two past the write, then three more at rest.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = state();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(state(), before, "the entry and the counter at rest");
    assert!(!before.0.trim().is_empty(), "{before:?}");
    // The stream gone, the bucket is no longer held: its entry is deleted.
    drop(a);
    eventually_or(
        "the entry deleted",
        || async { redis.cli(&["HLEN", &key]).is_ok_and(|n| n.trim() == "0") },
        || format!("{:?}\n{}", state(), one.log()),
    )
    .await;
    assert_eq!(one.metric("ratelimit_rlqs_exchange_errors_total").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_the_memory_store_each_give_the_whole_limit() {
    let (_dir, one, two) = two_servers(&[]).await;
    let k1 = bucket(&[("name", "per-api-key"), ("api_key", "k1")]);
    let (mut a, mut b) = (Envoy::at(one.grpc).await, Envoy::at(two.grpc).await);
    a.report(&[(&k1, 1, 0)]).await;
    b.report(&[(&k1, 1, 0)]).await;
    // Per-instance limits, as documented: each instance hands out the whole pool.
    assert_eq!(a.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
    assert_eq!(b.next_one().await, Told::TokenBucket(9, 600, 3600, 20));
    assert_eq!(one.metric("ratelimit_rlqs_instances").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn without_redis_each_server_keeps_its_last_fraction_and_says_so_once() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let env = [
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_URL", redis.addr()),
    ];
    let (_dir, one, _two, mut a, _b, k1) = split_in_two(&env).await;
    redis.kill_now();
    one.wait_for_metric("ratelimit_rlqs_exchange_errors_total", 3)
        .await;
    // The stream is still answered, on the last fraction (half), not the whole pool.
    a.report(&[(&k1, 0, 0)]).await;
    let Told::TokenBucket(max, fill, 3600, 20) = a.last_told().await else {
        panic!("a token bucket");
    };
    assert!(max <= 5 && fill <= 300, "{max} {fill}");
    // Said once (at most once a minute), counted every time.
    assert_eq!(
        one.log_lines("the RLQS demand exchange with Redis failed"),
        1,
        "{}",
        one.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn two_servers_on_a_redis_cluster_split_a_bucket_too() {
    let Some(cluster) = crate::redis_cluster::Cluster::start() else {
        return;
    };
    let env = [
        ("BACKEND_TYPE", "redis".to_owned()),
        ("REDIS_TYPE", "cluster".to_owned()),
        ("REDIS_URL", cluster.seeds()),
    ];
    let (_dir, one, two, mut a, _b, k1) = split_in_two(&env).await;
    // A few rounds with the bucket's hash on whichever master holds its slot.
    let reports = one.metric("ratelimit_rlqs_reports_total").await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        a.report(&[(&k1, 1, 3)]).await;
    }
    one.wait_for_metric("ratelimit_rlqs_reports_total", reports + 3)
        .await;
    assert_eq!(one.metric("ratelimit_rlqs_exchange_errors_total").await, 0);
    assert_eq!(two.metric("ratelimit_rlqs_exchange_errors_total").await, 0);
}
