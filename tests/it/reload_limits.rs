//! A reload that raises or lowers `requests_per_unit` (or `burst`) keeps the hits already used,
//! for every algorithm, through the real watcher and gRPC: used 1 of 3, raised to 10, the next hit
//! leaves 8; lowered to 3, the next hit leaves 0 and the one after is denied.

use crate::common;

use std::fs;

use common::{Code, TestServer, request, start, wait_remaining};

fn rules(algorithm: &str, unit: &str, rpu: u32, burst: Option<u32>) -> String {
    let extra = match algorithm {
        "leaky_bucket" => ", max_delay: 2s",
        _ => "",
    };
    let burst = burst.map_or(String::new(), |b| format!(", burst: {b}"));
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: {rpu}, algorithm: {algorithm}{burst}{extra}}}\n"
    )
}

/// Waits until the server reports `rpu` for (d, k=probe), charging nothing.
async fn wait_for_limit(s: &mut TestServer, rpu: u32) {
    s.eventually(&format!("limit {rpu}"), |mut c| async move {
        let mut r = request("d", &[&[("k", "probe")]]);
        r.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let Ok(response) = c.should_rate_limit(r).await else {
            return false;
        };
        response.into_inner().statuses[0]
            .current_limit
            .as_ref()
            .is_some_and(|l| l.requests_per_unit == rpu)
    })
    .await;
}

async fn edit(s: &mut TestServer, text: &str, rpu: u32) {
    fs::write(s.dir.path().join("d.yaml"), text).unwrap();
    wait_for_limit(s, rpu).await;
}

/// Sends one hit on (d, k=x) from its own task and returns once it has been decided (the probe
/// reports `left`): a leaky bucket holds its answer until the request's turn on the manual clock.
async fn hit(s: &TestServer, left: u32) -> tokio::task::JoinHandle<(Code, u32)> {
    let mut client = s.client.clone();
    let call = tokio::spawn(async move {
        let r = client
            .should_rate_limit(request("d", &[&[("k", "x")]]))
            .await
            .unwrap()
            .into_inner();
        (common::code(r.overall_code), r.statuses[0].limit_remaining)
    });
    wait_remaining(&s.client, "d", &[("k", "x")], left).await;
    call
}

async fn raise_then_lower(algorithm: &str, unit: &str) {
    let mut s = start(&[("d.yaml", &rules(algorithm, unit, 3, None))]).await;
    let mut calls = vec![hit(&s, 2).await];
    edit(&mut s, &rules(algorithm, unit, 10, None), 10).await;
    calls.push(hit(&s, 8).await);
    edit(&mut s, &rules(algorithm, unit, 3, None), 3).await;
    calls.push(hit(&s, 0).await);
    // A denial is never held; awaited here so it is decided before the clock moves.
    let denied = s.hit("d", &[("k", "x")]).await;
    // Releases the held leaky-bucket answers (every turn is within the 2 s max_delay).
    s.clock.advance(std::time::Duration::from_secs(2));
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers.push(denied);
    assert_eq!(
        answers,
        [
            (Code::Ok, 2),
            (Code::Ok, 8),
            (Code::Ok, 0),
            (Code::OverLimit, 0)
        ],
        "{algorithm}: used 1 of 3, raised to 10, lowered to 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_keeps_hits_used_across_limit_edits() {
    raise_then_lower("token_bucket", "hour").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_keeps_hits_used_across_limit_edits() {
    raise_then_lower("fixed_window", "hour").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_keeps_hits_used_across_limit_edits() {
    raise_then_lower("sliding_window", "hour").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_keeps_hits_used_across_limit_edits() {
    // Per second, so every turn is within max_delay; the manual clock stands still until the end,
    // so the queue does not drain meanwhile.
    raise_then_lower("leaky_bucket", "second").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_burst_gives_headroom_at_once() {
    let mut s = start(&[("d.yaml", &rules("token_bucket", "hour", 3, None))]).await;
    let key = [("k", "x")];
    for remaining in [2, 1, 0] {
        assert_eq!(s.hit("d", &key).await, (Code::Ok, remaining));
    }
    assert_eq!(s.hit("d", &key).await.0, Code::OverLimit);
    fs::write(
        s.dir.path().join("d.yaml"),
        rules("token_bucket", "hour", 3, Some(10)),
    )
    .unwrap();
    s.eventually("burst 10", |mut c| async move {
        let mut r = request("d", &[&[("k", "y")]]);
        r.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        c.should_rate_limit(r)
            .await
            .is_ok_and(|r| r.into_inner().statuses[0].limit_remaining == 10)
    })
    .await;
    assert_eq!(s.hit("d", &key).await, (Code::Ok, 6), "3 used of 10");
}
