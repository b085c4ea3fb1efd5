//! Engine tests without a transport: the handler called directly with a manual clock. Held
//! leaky-bucket answers wait on that clock, so a test polls a call once to see it held, and moves
//! the clock to release it: nothing here depends on how fast the machine is.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use futures_util::FutureExt;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SECOND};
use crate::store::Store;
use crate::store::memory::MemoryBackend;

const START: u64 = 1_767_225_600 * NANOS_PER_SECOND;

fn engine(yaml: &str) -> Engine<MemoryBackend> {
    engine_on(yaml, ManualClock::new(START), EngineSettings::default())
}

fn engine_on(yaml: &str, clock: ManualClock, settings: EngineSettings) -> Engine<MemoryBackend> {
    let configs =
        crate::config::parse_files(&[("t.yaml".into(), yaml.to_owned())]).expect("valid rules");
    Engine::new(
        Policy::new(&configs),
        Store::new(MemoryBackend::new(1000)),
        Arc::new(clock),
        settings,
    )
}

/// A zero-hit check of `q=1`: what remains, charging nothing.
fn check() -> RateLimitRequest {
    let mut check = request(&[&[("q", "1")]]);
    check.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    check
}

/// A request of domain `d` (the one builder, `crate::testing`).
fn request(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    crate::testing::request("d", descriptors)
}

#[tokio::test]
async fn unlimited_rule_can_replace_a_named_limit() {
    let e = engine(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0, name: block}\n  - key: vip\n    rate_limit: {unlimited: true, replaces: [{name: block}]}\n",
    );
    let r = e
        .should_rate_limit(&request(&[&[("a", "1")]]))
        .await
        .unwrap();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "0 per second blocks"
    );
    let r = e
        .should_rate_limit(&request(&[&[("a", "1")], &[("vip", "x")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
}

/// `constructLimitsToCheck`: an unlimited rule is set aside before `replaces` applies, so naming
/// it leaves it unlimited.
#[tokio::test]
async fn a_replaced_unlimited_rule_stays_unlimited() {
    let e = engine(
        "domain: d\ndescriptors:\n  - key: open\n    rate_limit: {unlimited: true, name: wide}\n  - key: r\n    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: wide}]}\n",
    );
    let r = e
        .should_rate_limit(&request(&[&[("open", "x")], &[("r", "x")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].limit_remaining, 4);
}

/// A quota_mode descriptor whose limit is replaced is no quota descriptor any more (the
/// reference's limit is nil): the other one, over its limit, is every quota descriptor over.
/// Under QUOTA_MODE it still is one (never over), and the answer stays OK.
#[tokio::test]
async fn a_replaced_quota_limit_is_no_quota_descriptor_unless_quota_mode_says_so() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 3, name: gone}\n  - key: b\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: gone}]}\n";
    for (global, want) in [(false, Code::OverLimit), (true, Code::Ok)] {
        let settings = EngineSettings {
            quota_mode: global,
            ..EngineSettings::default()
        };
        let e = engine_on(yaml, ManualClock::new(START), settings);
        e.should_rate_limit(&request(&[&[("b", "x")]]))
            .await
            .unwrap();
        let r = e
            .should_rate_limit(&request(&[&[("a", "x")], &[("b", "x")]]))
            .await
            .unwrap();
        assert!(r.statuses[0].current_limit.is_none(), "replaced");
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(r.overall_code, want as i32, "QUOTA_MODE={global}");
    }
}

#[tokio::test]
async fn invalid_requests_are_errors_not_answers() {
    let e = engine("domain: d\n");
    let mut r = request(&[&[("a", "1")]]);
    r.domain.clear();
    assert!(matches!(
        e.should_rate_limit(&r).await,
        Err(EngineError::Invalid(InvalidRequest::EmptyDomain))
    ));
}

#[tokio::test]
async fn a_new_policy_takes_effect_and_keeps_counters_of_unchanged_rules() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}\n";
    let e = engine(yaml);
    e.should_rate_limit(&request(&[&[("a", "1")]]))
        .await
        .unwrap();
    let raised = yaml.replace("requests_per_unit: 2", "requests_per_unit: 5");
    let configs = crate::config::parse_files(&[("t.yaml".into(), raised)]).unwrap();
    e.set_policy(Policy::new(&configs));
    let r = e
        .should_rate_limit(&request(&[&[("a", "1")]]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 3,
        "5 - the 2 hits counted across the swap"
    );
}

const LEAKY: &str = "domain: d\ndescriptors:\n  - key: q\n    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 3, max_delay: 5s}\n";

#[tokio::test]
async fn a_held_answer_is_released_when_the_clock_reaches_its_turn_and_not_before() {
    let clock = ManualClock::new(START);
    let e = engine_on(LEAKY, clock.clone(), EngineSettings::default());
    let q = request(&[&[("q", "1")]]);
    let first = e.should_rate_limit(&q).now_or_never();
    assert_eq!(
        first.map(|r| r.unwrap().statuses[0].limit_remaining),
        Some(2),
        "answered at once"
    );
    // Drains 2 per second: the second request's turn is 500 ms away.
    let mut second = Box::pin(e.should_rate_limit(&q));
    assert!((&mut second).now_or_never().is_none(), "held for its turn");
    clock.advance(std::time::Duration::from_millis(499));
    assert!(
        (&mut second).now_or_never().is_none(),
        "1 ms before its turn"
    );
    clock.advance(std::time::Duration::from_millis(1));
    let answer = second.await.unwrap();
    assert_eq!(
        (answer.overall_code, answer.statuses[0].limit_remaining),
        (Code::Ok as i32, 1),
        "released at its turn with what remained when it was decided"
    );
}

#[tokio::test]
async fn a_caller_that_goes_away_while_queued_gives_its_turn_back() {
    let e = engine(LEAKY);
    let q = request(&[&[("q", "1")]]);
    let first = e.should_rate_limit(&q).await.unwrap();
    assert_eq!(first.statuses[0].limit_remaining, 2, "answered at once");
    // The second waits 500 ms for its turn on a clock that stands still; its caller polls it once
    // and gives up (drops it).
    let gave_up = e.should_rate_limit(&q).now_or_never();
    assert!(gave_up.is_none(), "queued, not answered");
    let r = e.should_rate_limit(&check()).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 2, "the turn was given back");
}

/// `max_waiting`: one answer more than may wait is not held: it fails at once (`Overloaded`) and
/// its turn is given back, as a cancelled caller's is; the one waiting keeps its turn, and once it
/// is answered a place is free again. `ratelimit_waiting_answers` shows those waiting.
#[tokio::test]
async fn an_answer_beyond_max_waiting_is_not_held_and_gives_its_turn_back() {
    let clock = ManualClock::new(START);
    let metrics = Arc::new(Metrics::new(10));
    let e = engine_on(
        LEAKY,
        clock.clone(),
        EngineSettings {
            max_waiting: 1,
            ..EngineSettings::default()
        },
    )
    .with_metrics(metrics.clone());
    let q = request(&[&[("q", "1")]]);
    assert_eq!(
        e.should_rate_limit(&q).await.unwrap().statuses[0].limit_remaining,
        2
    );
    assert_eq!(metrics.waiting_answers.get(), 0);
    let mut waiting = Box::pin(e.should_rate_limit(&q));
    assert!((&mut waiting).now_or_never().is_none(), "held for its turn");
    let refused = e.should_rate_limit(&q).now_or_never();
    assert!(
        matches!(refused, Some(Err(EngineError::Overloaded(1)))),
        "{refused:?}"
    );
    assert_eq!(
        metrics.waiting_answers.get(),
        1,
        "the refused one is not held"
    );
    let r = e.should_rate_limit(&check()).await.unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "only the waiting one's turn is taken"
    );
    clock.advance(std::time::Duration::from_millis(500));
    assert_eq!(waiting.await.unwrap().overall_code, Code::Ok as i32);
    assert_eq!(metrics.waiting_answers.get(), 0);
    let mut next = Box::pin(e.should_rate_limit(&q));
    assert!(
        (&mut next).now_or_never().is_none(),
        "held again: the place was freed"
    );
}

#[tokio::test]
async fn global_shadow_mode_never_holds_an_answer() {
    let e = engine_on(
        LEAKY,
        ManualClock::new(START),
        EngineSettings {
            shadow_mode: true,
            ..EngineSettings::default()
        },
    );
    let q = request(&[&[("q", "1")]]);
    // The clock stands still: a held answer would never be ready.
    for left in [2, 1, 0] {
        let answer = e.should_rate_limit(&q).now_or_never();
        assert_eq!(
            answer.map(|r| r.unwrap().statuses[0].limit_remaining),
            Some(left),
            "answered at once, queued behind the earlier ones"
        );
    }
    let r = e.should_rate_limit(&check()).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 0, "the turns were taken");
}

#[tokio::test]
async fn hits_beyond_any_limit_are_over_it_and_the_largest_limit_still_fits_exactly() {
    for algorithm in [
        "fixed_window",
        "token_bucket",
        "sliding_window",
        "leaky_bucket",
    ] {
        let e = engine(&format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: 4294967295, algorithm: {algorithm}}}\n"
        ));
        let mut r = request(&[&[("a", "1")]]);
        for hits in [u64::MAX, 1 << 63, 1 << 32] {
            r.descriptors[0].hits_addend =
                Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
            let answer = e.should_rate_limit(&r).await.unwrap();
            assert_eq!(
                answer.overall_code,
                Code::OverLimit as i32,
                "{algorithm}: {hits} hits"
            );
        }
        if algorithm == "leaky_bucket" {
            continue; // a full queue would hold the answer for a second
        }
        r.descriptors[0].hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value {
            value: u64::from(u32::MAX),
        });
        let answer = e.should_rate_limit(&r).await.unwrap();
        assert_eq!(
            (answer.overall_code, answer.statuses[0].limit_remaining),
            (Code::Ok as i32, 0),
            "{algorithm}: the whole limit at once, after the refused ones took nothing"
        );
    }
}

#[tokio::test]
async fn a_decision_says_the_instant_it_was_made_at_refused_or_not() {
    let clock = ManualClock::new(1_767_225_600 * NANOS_PER_SECOND);
    let configs = crate::config::parse_files(&[(
        "t.yaml".into(),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n".to_owned(),
    )])
    .expect("valid rules");
    let e = Engine::new(
        Policy::new(&configs),
        Store::new(MemoryBackend::new(1000)),
        Arc::new(clock.clone()),
        EngineSettings::default(),
    );
    let first = e.decide(&request(&[&[("a", "1")]])).await;
    assert_eq!(first.now, 1_767_225_600 * NANOS_PER_SECOND);
    assert_eq!(first.result.unwrap().overall_code, Code::Ok as i32);
    clock.advance(std::time::Duration::from_secs(61));
    // The limit was evaluated at the instant reported: a minute later the window is new.
    let second = e.decide(&request(&[&[("a", "1")]])).await;
    assert_eq!(second.now, 1_767_225_661 * NANOS_PER_SECOND);
    assert_eq!(second.result.unwrap().overall_code, Code::Ok as i32);
    let mut invalid = request(&[&[("a", "1")]]);
    invalid.domain.clear();
    let refused = e.decide(&invalid).await;
    assert_eq!(refused.now, 1_767_225_661 * NANOS_PER_SECOND);
    assert!(matches!(refused.result, Err(EngineError::Invalid(_))));
}

/// `/explain`'s answer is the decision's plan: the outcome of the one match, the rule's limits as
/// planned, and the counter the decisions charged (a `share_threshold` pattern's, shared).
#[tokio::test]
async fn explain_answers_from_the_decisions_plan() {
    use crate::wire::explain::Explained;

    let e = engine(concat!(
        "domain: d\ndescriptors:\n",
        "  - key: path\n    value: \"/api/*\"\n    share_threshold: true\n",
        "    rate_limits:\n",
        "      - {unit: hour, requests_per_unit: 10, name: hourly}\n",
        "      - {unit: day, requests_per_unit: 50, unit_multiplier: 2, algorithm: fixed_window}\n",
        "  - key: open\n    rate_limit: {unlimited: true}\n",
        "  - key: plain\n    descriptors:\n",
        "      - key: sub\n        shadow_mode: true\n",
        "        rate_limit: {unit: minute, requests_per_unit: 3}\n",
    ));
    for value in ["/api/a", "/api/b"] {
        let r = e
            .should_rate_limit(&request(&[&[("path", value)]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let entries = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let explained = e
        .explain("d", &entries(&[("path", "/api/zzz")]), START)
        .await
        .unwrap();
    let Explained::Limited {
        rule,
        shadow_mode,
        limits,
    } = explained
    else {
        panic!("a limited rule: {explained:?}");
    };
    assert_eq!((rule.as_str(), shadow_mode), ("path_/api/*", false));
    let shown: Vec<_> = limits
        .iter()
        .map(|l| {
            (
                l.name.as_deref(),
                l.algorithm.as_str(),
                l.algorithm_is_default,
                l.unit_multiplier,
                l.remaining,
                l.state.is_some(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (Some("hourly"), "token_bucket", true, 1, 8, true),
            (None, "fixed_window", false, 2, 48, true),
        ]
    );
    for (pairs, expected) in [
        (&[("open", "x")][..], "Unlimited"),
        (&[("plain", "x")][..], "NoLimit"),
        (&[("plain", "x"), ("sub", "y")][..], "Limited"),
        (&[("nothing", "x")][..], "Unmatched"),
    ] {
        let explained = e.explain("d", &entries(pairs), START).await.unwrap();
        let debug = format!("{explained:?}");
        assert!(debug.starts_with(expected), "{pairs:?}: {debug}");
        if let Explained::Limited { shadow_mode, .. } = explained {
            assert!(
                shadow_mode,
                "a shadow rule's limits are explained as shadow"
            );
        }
    }
    let explained = e.explain("other", &entries(&[("k", "v")]), START).await;
    assert!(matches!(explained, Ok(Explained::UnknownDomain)));
}

/// Every call carries its decision's future and moves it at each layer above (the service, the
/// front door): the rarely taken concurrency steps are boxed so that they do not set its size
/// (docs/cost-per-decision.md "Who wakes whom, against the baseline; the decision's future"). This
/// bound fails if an unboxed step grows it.
#[test]
fn a_decisions_future_stays_small() {
    let e = engine(
        "domain: d\ndescriptors:\n  - key: q\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    let request = request(&[&[("q", "1")]]);
    let decision = e.decide(&request);
    let size = std::mem::size_of_val(&decision);
    assert!(size <= 2048, "the decision's future is {size} bytes");
}
