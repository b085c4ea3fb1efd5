//! Leaky bucket over real gRPC in real time: admitted requests are answered evenly spaced at the
//! drain rate however they arrived, a full queue is rejected at once, and a caller that cancels
//! while queued frees its turn. Spacing is asserted from the answers' timestamps, with tolerances.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Code, code, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimit_server::app::{self, Server};
use ratelimit_server::clock::{Clock, ManualClock, SystemClock};
use ratelimit_server::settings::ServeSettings;
use tempfile::TempDir;
use tonic::transport::Channel;

const RULES: &str = r#"
domain: q
descriptors:
  - key: even
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 5, max_delay: 2s}
  - key: slow
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 3, max_delay: 5s}
"#;

struct Running {
    _server: Server,
    client: RateLimitServiceClient<Channel>,
    _dir: TempDir,
}

async fn serve(clock: Arc<dyn Clock>) -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("q.yaml"), RULES).expect("write rules");
    let settings = ServeSettings::for_tests(dir.path().to_path_buf());
    let server = app::start(&settings, clock).await.expect("server starts");
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .expect("client connects");
    Running {
        _server: server,
        client,
        _dir: dir,
    }
}

/// Sends `r` from its own task; returns when it was answered, the code and the remaining.
fn send(
    client: &RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> tokio::task::JoinHandle<(Instant, Code, u32)> {
    let mut client = client.clone();
    tokio::spawn(async move {
        let a = client.should_rate_limit(r).await.unwrap().into_inner();
        (
            Instant::now(),
            code(a.overall_code),
            a.statuses[0].limit_remaining,
        )
    })
}

fn probe(key: &str) -> RateLimitRequest {
    let mut r = request("q", &[&[(key, "x")]]);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    r
}

/// Polls a zero-hit check until `remaining` is `want` (or 3 s pass).
async fn wait_remaining(client: &mut RateLimitServiceClient<Channel>, key: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = client
            .should_rate_limit(probe(key))
            .await
            .unwrap()
            .into_inner();
        if r.statuses[0].limit_remaining == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "remaining stayed {}",
            r.statuses[0].limit_remaining
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn delayed_oks_leave_evenly_spaced_however_they_arrived() {
    let s = serve(Arc::new(SystemClock)).await;
    // Three arrive together, two more 30 ms later: all five leave 100 ms apart.
    let mut calls: Vec<_> = (0..3)
        .map(|_| send(&s.client, request("q", &[&[("even", "x")]])))
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    calls.extend((0..2).map(|_| send(&s.client, request("q", &[&[("even", "x")]]))));
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    answers.sort_by_key(|a| a.0);
    assert!(answers.iter().all(|a| a.1 == Code::Ok), "{answers:?}");
    let remaining: Vec<u32> = answers.iter().map(|a| a.2).collect();
    assert_eq!(remaining, [4, 3, 2, 1, 0], "answered in queue order");
    for pair in answers.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= Duration::from_millis(60) && gap <= Duration::from_millis(220),
            "answers {gap:?} apart, the drain interval is 100 ms"
        );
    }
}

#[tokio::test]
async fn a_full_queue_is_rejected_at_once() {
    // A manual clock that stands still: the queue (turns 0, 500 and 1000 ms) never drains.
    let mut s = serve(Arc::new(ManualClock::new(1_767_225_600_000_000_000))).await;
    let mut queued = Vec::new();
    for left in [2, 1, 0] {
        queued.push(send(&s.client, request("q", &[&[("slow", "x")]])));
        wait_remaining(&mut s.client, "slow", left).await;
    }
    let started = Instant::now();
    let r = s
        .client
        .should_rate_limit(request("q", &[&[("slow", "x")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "denied after {:?}, half the drain interval is 250 ms",
        started.elapsed()
    );
    for q in queued {
        assert_eq!(q.await.unwrap().1, Code::Ok);
    }
}

#[tokio::test]
async fn a_caller_that_cancels_frees_its_turn() {
    let mut s = serve(Arc::new(ManualClock::new(1_767_225_600_000_000_000))).await;
    let mut queued = Vec::new();
    for left in [2, 1, 0] {
        queued.push(send(&s.client, request("q", &[&[("slow", "x")]])));
        wait_remaining(&mut s.client, "slow", left).await;
    }
    // The last one (its turn 1 s away) hangs up: the client resets the stream.
    queued.pop().unwrap().abort();
    wait_remaining(&mut s.client, "slow", 1).await;
    let r = send(&s.client, request("q", &[&[("slow", "x")]]));
    wait_remaining(&mut s.client, "slow", 0).await;
    let denied = s
        .client
        .should_rate_limit(request("q", &[&[("slow", "x")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(denied.overall_code), Code::OverLimit, "full again");
    assert_eq!(r.await.unwrap().1, Code::Ok, "the freed turn was taken");
    for q in queued {
        assert_eq!(q.await.unwrap().1, Code::Ok);
    }
}
