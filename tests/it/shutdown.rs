//! Graceful shutdown: gRPC health goes NOT_SERVING first, and the real binary exits 0 on SIGTERM.

use crate::common;

use std::time::Duration;

use common::process::Served;
use common::start;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

#[tokio::test]
async fn health_flips_to_not_serving_before_the_server_stops() {
    let s = start(&[("d.yaml", RULES)]).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "ratelimit"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "service {service:?}");
    }
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );
    let stopping = tokio::spawn(s.server.shutdown());
    let update = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("a health update")
        .expect("the watch stream carries the update")
        .expect("an update before the stream ends");
    assert_eq!(update.status(), ServingStatus::NotServing);
    drop(watch);
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown finishes")
        .unwrap();
}

/// An open Watch stream does not hold the shutdown for the drain timeout: it ends (after saying
/// NOT_SERVING) when the server closes its listeners.
#[tokio::test]
async fn open_health_watches_end_at_shutdown_instead_of_holding_the_drain() {
    let s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.drain_timeout = Duration::from_secs(3600);
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest { service: "".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );
    // The guard is far above any real shutdown and far below the hour-long drain timeout.
    tokio::time::timeout(Duration::from_secs(30), s.server.shutdown())
        .await
        .expect("shutdown is not held by an open Watch stream");
    let mut seen = Vec::new();
    while let Ok(Some(update)) = watch.message().await {
        seen.push(update.status());
    }
    assert_eq!(seen, [ServingStatus::NotServing], "then the stream ended");
}

async fn client_channel(port: u16) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
/// SIGTERM: health says NOT_SERVING (HTTP 500) while the server keeps answering, new connections
/// included, for SHUTDOWN_DELAY; then it drains and exits 0.
async fn sigterm_keeps_serving_with_health_not_serving_for_the_delay_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("d.yaml"), RULES).unwrap();
    // Long enough for the checks below on a loaded machine; they assert what happens within the
    // delay, not when.
    let mut served = Served::with_env(dir.path(), &[("SHUTDOWN_DELAY", "5s".to_owned())]);
    served.wait_ready().await;
    served.terminate();
    let healthcheck = format!("{}/healthcheck", served.http);
    common::wait::eventually("health says unhealthy", || async {
        reqwest::get(&healthcheck)
            .await
            .is_ok_and(|r| r.status() == 500)
    })
    .await;
    // Unhealthy, but still serving: a new connection gets its answer.
    let grpc = served.grpc;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("the gRPC listener is still open during the shutdown delay");
    let answer = client
        .should_rate_limit(common::request("d", &[&[("k", "v")]]))
        .await
        .expect("calls are still answered during the shutdown delay")
        .into_inner();
    assert_eq!(common::code(answer.overall_code), common::Code::Ok);
    let mut health = HealthClient::new(client_channel(grpc).await);
    let status = health
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), ServingStatus::NotServing);
    let exit = served.wait_exit();
    assert_eq!(exit.code(), Some(0));
}

#[tokio::test]
async fn serve_refuses_to_start_on_invalid_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("d.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n").unwrap();
    let mut served = Served::start(dir.path(), &[]);
    assert_eq!(served.wait_exit().code(), Some(1));
    let stderr = served.log();
    assert!(
        stderr.contains("d.yaml:4:") && stderr.contains("fortnight"),
        "{stderr}"
    );
    assert!(
        stderr.contains("no rules are in force; refusing to start"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("previous rules"),
        "there are none: {stderr}"
    );
}

#[tokio::test]
async fn in_flight_requests_complete_during_shutdown() {
    // A leaky bucket draining 2 per second holds the 2nd and 3rd answers until the server's manual
    // clock reaches their turns (0.5 s and 1 s): until the test moves it, they stay in flight.
    let rules = "domain: d\ndescriptors:\n  - key: q\n    rate_limit: {unit: second, requests_per_unit: 2, burst: 5, algorithm: leaky_bucket, max_delay: 2s}\n";
    let s = common::start_with(&[("d.yaml", rules)], |settings| {
        settings.drain_timeout = Duration::from_secs(3600);
    })
    .await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let mut client = s.client.clone();
            tokio::spawn(async move {
                client
                    .should_rate_limit(common::request("d", &[&[("q", "x")]]))
                    .await
            })
        })
        .collect();
    common::wait_remaining(&s.client, "d", &[("q", "x")], 2).await;
    let (draining, clock) = (s.server.status.clone(), s.clock.clone());
    let stopping = tokio::spawn(s.server.shutdown());
    common::wait::eventually("health flips", || async { draining.is_draining() }).await;
    assert!(
        !stopping.is_finished() && !calls[1].is_finished() && !calls[2].is_finished(),
        "shutdown waits for the held answers"
    );
    clock.advance(Duration::from_secs(1));
    for call in calls {
        let response = call
            .await
            .unwrap()
            .expect("an in-flight call completes")
            .into_inner();
        assert_eq!(common::code(response.overall_code), common::Code::Ok);
    }
    tokio::time::timeout(Duration::from_secs(30), stopping)
        .await
        .expect("shutdown finishes once the held answers are sent")
        .unwrap();
}
