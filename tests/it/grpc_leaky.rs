//! Leaky bucket over real gRPC on the server's manual clock: admitted requests are answered at
//! their turns, in queue order, however they arrived; a full queue is rejected at once; a caller
//! that cancels while queued frees its turn. Held answers wait on the manual clock, so the test
//! releases them by moving it: what is asserted is order and counts, never how long anything took.

use crate::common;

use std::time::Duration;

use common::{Code, TestServer, code, request, start, wait_remaining};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimit_server::clock::Clock;
use tokio::sync::mpsc;

const RULES: &str = r#"
domain: q
descriptors:
  - key: even
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 5, max_delay: 2s}
  - key: slow
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 3, max_delay: 5s}
"#;

/// An answer: the server's (manual) time when it arrived, in ms after the start, code, remaining.
type Answer = (u64, Code, u32);

/// Sends `r` from its own task; its answer goes to `answers` when it arrives.
fn send(
    s: &TestServer,
    r: RateLimitRequest,
    answers: &mpsc::UnboundedSender<Answer>,
) -> tokio::task::JoinHandle<()> {
    let (mut client, clock, answers) = (s.client.clone(), s.clock.clone(), answers.clone());
    tokio::spawn(async move {
        let a = client.should_rate_limit(r).await.unwrap().into_inner();
        let at = (clock.now() - common::START) / 1_000_000;
        let _ = answers.send((at, code(a.overall_code), a.statuses[0].limit_remaining));
    })
}

fn one(key: &str) -> RateLimitRequest {
    request("q", &[&[(key, "x")]])
}

/// No answer has arrived that has not been taken: a held answer is not released early.
fn none_waiting(answers: &mut mpsc::UnboundedReceiver<Answer>, when: &str) {
    if let Ok(early) = answers.try_recv() {
        panic!("{when}: {early:?} arrived before its turn");
    }
}

#[tokio::test]
async fn delayed_oks_leave_at_their_turns_in_queue_order_however_they_arrived() {
    let s = start(&[("q.yaml", RULES)]).await;
    let (tx, mut answers) = mpsc::unbounded_channel();
    // Three arrive together, two more 30 ms later: the drain interval is 100 ms, so the turns are
    // at 0, 100, 200, 300 and 400 ms.
    for _ in 0..3 {
        send(&s, one("even"), &tx);
    }
    let mut got = vec![answers.recv().await.unwrap()];
    wait_remaining(&s.client, "q", &[("even", "x")], 2).await;
    s.clock.advance(Duration::from_millis(30));
    for _ in 0..2 {
        send(&s, one("even"), &tx);
    }
    wait_remaining(&s.client, "q", &[("even", "x")], 0).await;
    for turn in [100, 200, 300, 400] {
        none_waiting(&mut answers, &format!("before {turn} ms"));
        s.clock.set(common::START + turn * 1_000_000);
        got.push(answers.recv().await.unwrap());
    }
    none_waiting(&mut answers, "after the last turn");
    let ok = Code::Ok;
    assert_eq!(
        got,
        [
            (0, ok, 4),
            (100, ok, 3),
            (200, ok, 2),
            (300, ok, 1),
            (400, ok, 0)
        ],
        "one answer per turn, in queue order"
    );
}

#[tokio::test]
async fn a_full_queue_is_rejected_at_once() {
    let mut s = start(&[("q.yaml", RULES)]).await;
    let (tx, mut answers) = mpsc::unbounded_channel();
    // The clock stands still: the queue (turns at 0, 500 and 1000 ms) does not drain.
    for left in [2, 1, 0] {
        send(&s, one("slow"), &tx);
        wait_remaining(&s.client, "q", &[("slow", "x")], left).await;
    }
    assert_eq!(answers.recv().await.unwrap(), (0, Code::Ok, 2));
    // Answered while the clock stands still, so it did not wait for a turn (bounded only so that
    // a held denial fails instead of hanging).
    let denied = tokio::time::timeout(Duration::from_secs(30), s.call(one("slow")))
        .await
        .expect("a denial is answered without waiting for the clock");
    assert_eq!(code(denied.overall_code), Code::OverLimit);
    none_waiting(&mut answers, "with the clock standing still");
    s.clock.advance(Duration::from_secs(1));
    let mut rest = vec![answers.recv().await.unwrap(), answers.recv().await.unwrap()];
    rest.sort();
    assert_eq!(rest, [(1000, Code::Ok, 0), (1000, Code::Ok, 1)]);
}

#[tokio::test]
async fn a_caller_that_cancels_frees_its_turn() {
    let mut s = start(&[("q.yaml", RULES)]).await;
    let (tx, mut answers) = mpsc::unbounded_channel();
    let mut queued = Vec::new();
    for left in [2, 1, 0] {
        queued.push(send(&s, one("slow"), &tx));
        wait_remaining(&s.client, "q", &[("slow", "x")], left).await;
    }
    // The last one (its turn 1 s away) hangs up: the client resets the stream.
    queued.pop().unwrap().abort();
    wait_remaining(&s.client, "q", &[("slow", "x")], 1).await;
    send(&s, one("slow"), &tx);
    wait_remaining(&s.client, "q", &[("slow", "x")], 0).await;
    let denied = s.call(one("slow")).await;
    assert_eq!(code(denied.overall_code), Code::OverLimit, "full again");
    s.clock.advance(Duration::from_secs(1));
    drop(tx);
    let mut got = Vec::new();
    while let Some(a) = answers.recv().await {
        got.push(a);
    }
    got.sort();
    assert_eq!(
        got,
        [(0, Code::Ok, 2), (1000, Code::Ok, 0), (1000, Code::Ok, 1)],
        "the first, the second, and the one that took the freed turn"
    );
}

/// `MAX_WAITING_ANSWERS`: with one answer waiting for its turn, one more that would wait is
/// answered `RESOURCE_EXHAUSTED` at once (counted as `too_many_waiting`) and its turn given back;
/// the waiting one is answered at its turn. (Nothing bounded the answers waiting across keys: a
/// client that never cancels held about 4 KB a call for as long as `max_delay`.)
#[tokio::test]
async fn an_answer_beyond_max_waiting_answers_is_refused_at_once_and_gives_its_turn_back() {
    let s = common::start_with(&[("q.yaml", RULES)], |settings| {
        settings.max_waiting_answers = 1;
    })
    .await;
    let (tx, mut answers) = mpsc::unbounded_channel();
    send(&s, one("slow"), &tx);
    wait_remaining(&s.client, "q", &[("slow", "x")], 2).await;
    send(&s, one("slow"), &tx);
    // Held: its turn is taken (500 ms away on a clock that stands still).
    wait_remaining(&s.client, "q", &[("slow", "x")], 1).await;
    let refused = s
        .client
        .clone()
        .should_rate_limit(one("slow"))
        .await
        .expect_err("no place left to wait in");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("MAX_WAITING_ANSWERS"),
        "{}",
        refused.message()
    );
    wait_remaining(&s.client, "q", &[("slow", "x")], 1).await;
    assert_eq!(
        common::metrics::scrape_count(
            &s.http("/metrics"),
            "ratelimit_service_should_rate_limit_error{err_type=\"too_many_waiting\"}"
        )
        .await,
        1
    );
    s.advance(1);
    let mut codes = vec![
        answers.recv().await.unwrap().1,
        answers.recv().await.unwrap().1,
    ];
    codes.sort_by_key(|c| *c as i32);
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok],
        "the first and the one that waited"
    );
}
