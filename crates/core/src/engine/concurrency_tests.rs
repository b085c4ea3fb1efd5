//! The engine's concurrency descriptors on the memory store, with a manual clock: slots taken by
//! the request-time call and given back by the stream-done one, as Envoy sends them.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SECOND};
use crate::store::memory::MemoryBackend;

const START: u64 = 1_767_225_600 * NANOS_PER_SECOND;

const RULES: &str = "
domain: d
descriptors:
  - key: api_key
    concurrency: {max_in_flight: 2, lease: 10s}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    concurrency: {max_in_flight: 1, lease: 10s}
";

fn engine(clock: &ManualClock) -> Engine<MemoryBackend> {
    let configs =
        crate::config::parse_files(&[("t.yaml".into(), RULES.to_owned())]).expect("valid rules");
    Engine::new(
        Policy::new(&configs),
        Store::new(MemoryBackend::new(1000)),
        Arc::new(clock.clone()),
        EngineSettings::default(),
    )
    .with_metrics(Arc::new(Metrics::new(100)))
}

fn acquire(key: &str, id: &str) -> RateLimitRequest {
    crate::testing::request("d", &[&[("api_key", key), ("request_id", id)]])
}

fn release(key: &str, id: &str) -> RateLimitRequest {
    crate::testing::request(
        "d",
        &[&[
            ("api_key", key),
            ("request_id", id),
            (RELEASE_KEY, RELEASE_VALUE),
        ]],
    )
}

async fn code(e: &Engine<MemoryBackend>, r: RateLimitRequest) -> i32 {
    e.should_rate_limit(&r).await.unwrap().overall_code
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn slots_are_taken_denied_and_given_back_per_key() {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    assert_eq!(code(&e, acquire("k1", "a")).await, OK);
    let second = e.should_rate_limit(&acquire("k1", "b")).await.unwrap();
    assert_eq!(second.overall_code, OK);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    assert_eq!(
        second.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        2
    );
    let third = e.should_rate_limit(&acquire("k1", "c")).await.unwrap();
    assert_eq!(third.overall_code, OVER);
    assert_eq!(
        third.statuses[0]
            .duration_until_reset
            .as_ref()
            .unwrap()
            .seconds,
        10
    );
    assert_eq!(code(&e, acquire("k2", "d")).await, OK, "another key");
    // The denied request's stream-done call: its id holds nothing; nothing is freed.
    assert_eq!(code(&e, release("k1", "c")).await, OK);
    assert_eq!(code(&e, acquire("k1", "e")).await, OVER);
    // A finished request's stream-done call frees its slot.
    assert_eq!(code(&e, release("k1", "a")).await, OK);
    assert_eq!(code(&e, acquire("k1", "f")).await, OK);
    assert_eq!(code(&e, acquire("k1", "g")).await, OVER);
}

#[tokio::test]
async fn a_lost_release_frees_its_slot_when_the_lease_ends() {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    assert_eq!(code(&e, acquire("k1", "a")).await, OK);
    assert_eq!(code(&e, acquire("k1", "b")).await, OK);
    clock.advance(Duration::from_secs(9));
    assert_eq!(code(&e, acquire("k1", "c")).await, OVER);
    clock.advance(Duration::from_secs(1));
    assert_eq!(code(&e, acquire("k1", "c")).await, OK);
    assert_eq!(code(&e, acquire("k1", "d")).await, OK);
    let page = e.metrics().unwrap().encode();
    assert!(
        page.contains(
            "ratelimit_concurrency_expired_leases_total{domain=\"d\",rule=\"api_key\"} 2"
        ),
        "{page}"
    );
    assert!(
        page.contains("ratelimit_concurrency_slots_in_use{domain=\"d\",rule=\"api_key\"} 2"),
        "{page}"
    );
}

#[tokio::test]
async fn a_request_denied_by_a_rate_limit_keeps_no_slot_and_one_denied_for_concurrency_is_not_charged()
 {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    let both = |id: &str| {
        crate::testing::request(
            "d",
            &[&[("api_key", "k1"), ("request_id", id)], &[("route", "r")]],
        )
    };
    assert_eq!(code(&e, both("a")).await, OK);
    // The route's 1 per hour is spent: denied, and the slot it took goes back at once.
    assert_eq!(code(&e, both("b")).await, OVER);
    assert_eq!(code(&e, acquire("k1", "c")).await, OK, "b's slot came back");
    assert_eq!(
        code(&e, acquire("k1", "d")).await,
        OVER,
        "a and c hold both"
    );
    // Denied for concurrency: the route is told, not charged.
    let e = engine(&ManualClock::new(START));
    assert_eq!(code(&e, acquire("k1", "x")).await, OK);
    assert_eq!(code(&e, acquire("k1", "y")).await, OK);
    let r = e.should_rate_limit(&both("z")).await.unwrap();
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    assert_eq!(
        r.statuses[1].limit_remaining, 1,
        "the route was not charged"
    );
    assert_eq!(
        code(&e, crate::testing::request("d", &[&[("route", "r")]])).await,
        OK
    );
}

#[tokio::test]
async fn shadow_mode_lets_a_full_key_through_without_taking_a_slot() {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    let shadow = |id: &str| crate::testing::request("d", &[&[("shadow", "s"), ("request_id", id)]]);
    assert_eq!(code(&e, shadow("a")).await, OK);
    let r = e.should_rate_limit(&shadow("b")).await.unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn other_shapes_match_nothing() {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    for entries in [
        &[("api_key", "k1")][..],
        &[
            ("api_key", "k1"),
            ("request_id", "a"),
            ("concurrency", "other"),
        ],
        &[
            ("api_key", "k1"),
            ("request_id", "a"),
            ("x", "y"),
            ("z", "w"),
        ],
    ] {
        let r = e
            .should_rate_limit(&crate::testing::request("d", &[entries]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none(), "{entries:?}");
    }
}

#[tokio::test]
async fn explain_shows_the_slots_in_use() {
    let clock = ManualClock::new(START);
    let e = engine(&clock);
    assert_eq!(code(&e, acquire("k1", "a")).await, OK);
    let explained = e
        .explain("d", &[("api_key".into(), "k1".into())], clock.now())
        .await
        .unwrap();
    assert_eq!(
        explained,
        crate::wire::explain::Explained::Concurrency {
            rule: "api_key".into(),
            shadow_mode: false,
            max_in_flight: 2,
            lease: "10s".into(),
            in_use: 1,
            free: 1,
            next_lease_end: Some("10s".into()),
        }
    );
}
