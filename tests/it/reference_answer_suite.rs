//! What a ShouldRateLimit answer contains, case by case, against envoyproxy/ratelimit's own unit
//! tests of it: `test/service/ratelimit_test.go` (overall code, statuses, shadow and quota modes,
//! headers, unlimited, empty domain or descriptors, dynamic metadata), `test/limiter/
//! base_limiter_test.go` (a status from a count: remaining, over/near/within/shadow counts) and
//! `test/redis/fixed_cache_impl_test.go` (the fixed-window cache: counts, resets, `hits_addend`
//! 0 and > 1, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, the local over-limit cache). Our own rules
//! and requests exercise the same cases over real gRPC on the manual clock.
//!
//! The mode: what a user switching from the reference runs, `DEFAULT_ALGORITHM=fixed_window`
//! (the reference counts only fixed windows; our default, `token_bucket`, is a stated choice) and
//! otherwise our defaults (denied requests charge nothing, a stated difference). A few tests also
//! run `CHARGE_DENIED_HITS=true` (the xDS mode), which claims the reference's counting exactly.
//! A test that asserts the reference's behaviour where ours differs is marked
//! `#[ignore = "difference: …"]`; none is now.

use crate::common;

use common::metrics::scrape;
use common::redis::RedisServer;
use common::{Code, TestServer, code, descriptor, headers, request, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind as V;
use envoy_types::pb::google::protobuf::{Duration, Struct, UInt64Value};
use ratelimit_server::config::Algorithm;
use ratelimit_server::settings::{BackendType, ServeSettings};

/// No rule names an algorithm: each runs under the server's default, as a reference rules file
/// does.
const RULES: &str = r#"
domain: answers
descriptors:
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 10, name: key_name}
  - key: per_minute_b
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: per_hour
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: per_hour_14
    rate_limit: {unit: hour, requests_per_unit: 14}
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: per_second_8
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: per_second_10
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: per_day
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: per_week
    rate_limit: {unit: week, requests_per_unit: 10}
  - key: per_month
    rate_limit: {unit: month, requests_per_unit: 10}
  - key: per_year
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: free
    rate_limit: {unlimited: true}
  - key: open
  - key: any_value
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: wild
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 10}
"#;

/// Quota mode and metadata, as the reference's service tests set them on their limits.
const QUOTA_RULES: &str = r#"
domain: quota
descriptors:
  - key: regular
    metadata: {name: service_1}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    metadata: {name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota_other
    quota_mode: true
    metadata: {some_other_name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: named_quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3, name: replaced_one}
  - key: replacing_quota
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
      replaces: [{name: replaced_one}]
"#;

/// Names of unlimited rules and what replaces them.
const REPLACE_RULES: &str = r#"
domain: replace
descriptors:
  - key: unlimited_named
    rate_limit: {unlimited: true, name: wide_open}
  - key: replacer
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces: [{name: wide_open}]
"#;

/// A server on `RULES` and `QUOTA_RULES` with fixed windows by default, `adjust`ed.
async fn fixed_with(adjust: impl FnOnce(&mut ServeSettings)) -> TestServer {
    start_with(
        &[
            ("answers.yaml", RULES),
            ("quota.yaml", QUOTA_RULES),
            ("replace.yaml", REPLACE_RULES),
        ],
        |s| {
            s.defaults.default_algorithm = Algorithm::FixedWindow;
            adjust(s);
        },
    )
    .await
}

async fn fixed() -> TestServer {
    fixed_with(|_| {}).await
}

/// A status with a limit, as the reference's `generateResponseDescriptorStatus` makes it.
fn limited(
    c: Code,
    requests_per_unit: u32,
    unit: Unit,
    name: &str,
    remaining: u32,
    reset: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: c as i32,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: reset,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// The status of a descriptor no limit applies to: OK, no limit, 0 remaining, no reset.
fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

/// The status of an unlimited descriptor: OK, no limit, 2^32 − 1 remaining, no reset.
fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: u32::MAX,
        ..Default::default()
    }
}

/// A descriptor's entries and its own `hits_addend` (None: the request's).
type WithHits<'a> = (&'a [(&'a str, &'a str)], Option<u64>);

/// A request whose descriptors carry their own `hits_addend`s.
fn with_hits(domain: &str, descriptors: &[WithHits<'_>]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|(entries, hits)| RateLimitDescriptor {
                hits_addend: hits.map(|value| UInt64Value { value }),
                ..descriptor(entries)
            })
            .collect(),
        hits_addend: 0,
    }
}

/// `request` with a request-level `hits_addend`.
fn hits(domain: &str, descriptors: &[&[(&str, &str)]], n: u32) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend: n,
        ..request(domain, descriptors)
    }
}

/// Each status' (code, remaining).
fn brief(r: &RateLimitResponse) -> Vec<(Code, u32)> {
    r.statuses
        .iter()
        .map(|s| (code(s.code), s.limit_remaining))
        .collect()
}

/// A rule's five per-rule counts on the metrics page: [total_hits, over_limit, near_limit,
/// within_limit, shadow_mode] (0 where absent).
async fn counts(s: &TestServer, domain: &str, rule: &str) -> [u64; 5] {
    let page = scrape(&s.http("/metrics")).await;
    let labels = format!("{{domain=\"{domain}\",rule=\"{rule}\",");
    [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ]
    .map(|family| {
        let name = format!("ratelimit_service_rate_limit_{family}{labels}");
        page.lines()
            .filter(|l| l.starts_with(&name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64
    })
}

/// The counts `send` moved on `rule`: [total, over, near, within, shadow].
async fn moved(s: &mut TestServer, domain: &str, rule: &str, send: RateLimitRequest) -> [u64; 5] {
    let before = counts(s, domain, rule).await;
    s.call(send).await;
    let after = counts(s, domain, rule).await;
    std::array::from_fn(|i| after[i] - before[i])
}

/// A metric without labels, or with exactly these (0 when absent).
async fn metric(s: &TestServer, series: &str) -> u64 {
    common::metrics::count(&scrape(&s.http("/metrics")).await, series)
}

fn field<'a>(s: &'a Struct, name: &str) -> Option<&'a V> {
    s.fields.get(name).and_then(|v| v.kind.as_ref())
}

fn text(v: Option<&V>) -> &str {
    match v {
        Some(V::StringValue(s)) => s,
        other => panic!("not a string: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// test/service/ratelimit_test.go

/// `TestService` (first request): a descriptor no rule matches is `{OK, no limit, 0}` and the
/// answer OK; as is every descriptor of a domain with no rules (`domain_not_found`, counted per
/// descriptor). No headers without a limited status.
#[tokio::test]
async fn unmatched_descriptors_and_unknown_domains_answer_ok_with_no_limit() {
    let mut s = fixed_with(|st| st.limit_response_headers_enabled = true).await;
    let r = s.call(request("answers", &[&[("hello", "world")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses, [no_limit()]);
    assert!(r.response_headers_to_add.is_empty());
    let r = s
        .call(request(
            "nowhere",
            &[&[("foo", "bar")], &[("hello", "world")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses, [no_limit(), no_limit()]);
    assert!(r.response_headers_to_add.is_empty());
    assert_eq!(
        metric(
            &s,
            "ratelimit_service_rate_limit_domain_not_found{domain=\"nowhere\"}"
        )
        .await,
        2
    );
    // A matched entry with no rate_limit (a whitelist) is the same status.
    let r = s.call(request("answers", &[&[("open", "x")]])).await;
    assert_eq!(r.statuses, [no_limit()]);
}

/// `TestService` (second and third requests): a descriptor over its limit beside an unmatched one
/// makes the answer OVER_LIMIT, whichever comes first; the over status carries the rule's limit
/// with its `name`, 0 remaining and the time to the window's end.
#[tokio::test]
async fn an_over_limit_descriptor_beside_an_unmatched_one_denies_in_either_order() {
    let mut s = fixed().await;
    for left in (0..10).rev() {
        assert_eq!(
            s.hit("answers", &[("per_minute", "k")]).await,
            (Code::Ok, left)
        );
    }
    let over = limited(Code::OverLimit, 10, Unit::Minute, "key_name", 0, 50);
    let r = s
        .call(request(
            "answers",
            &[&[("per_minute", "k")], &[("hello", "world")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(r.statuses, [over.clone(), no_limit()]);
    let r = s
        .call(request(
            "answers",
            &[&[("hello", "world")], &[("per_minute", "k")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(r.statuses, [no_limit(), over]);
}

/// `TestServiceGlobalShadowMode`: with SHADOW_MODE the answer is OK but the statuses still say
/// OVER_LIMIT; `global_shadow_mode` counts the request once; the rule counts the hit as over the
/// limit, not as its own shadow mode.
#[tokio::test]
async fn global_shadow_mode_answers_ok_keeps_the_statuses_and_counts_once() {
    let mut s = fixed_with(|st| st.shadow_mode = true).await;
    for _ in 0..10 {
        s.hit("answers", &[("per_minute", "g")]).await;
    }
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 0);
    let send = request("answers", &[&[("per_minute", "g")], &[("hello", "world")]]);
    let r = s.call(send.clone()).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        r.statuses,
        [
            limited(Code::OverLimit, 10, Unit::Minute, "key_name", 0, 50),
            no_limit()
        ]
    );
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 1);
    assert_eq!(
        moved(&mut s, "answers", "per_minute", send).await,
        [1, 1, 0, 0, 0],
        "one hit, over the limit; no per-rule shadow_mode"
    );
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 2);
}

/// `TestRuleShadowMode`, `TestGetResponseStatusOverLimitShadowMode`,
/// `TestOverLimitWithLocalCacheShadowRule`: a shadow-mode rule over its limit answers OK with its
/// limit, 0 remaining and its reset, and counts the hit as over and as shadow mode; the request
/// is OK and `global_shadow_mode` stays 0.
#[tokio::test]
async fn a_shadow_mode_rule_over_its_limit_answers_ok_with_its_limit() {
    let mut s = fixed().await;
    let key: &[(&str, &str)] = &[("shadowed", "s")];
    // 12 of 15 (the near-limit threshold is 12): within.
    assert_eq!(
        moved(&mut s, "answers", "shadowed", hits("answers", &[key], 12)).await,
        [12, 0, 0, 12, 0]
    );
    // 13: near.
    assert_eq!(
        moved(&mut s, "answers", "shadowed", request("answers", &[key])).await,
        [1, 0, 1, 1, 0]
    );
    // 15: both hits near (the count was past the threshold already).
    assert_eq!(
        moved(&mut s, "answers", "shadowed", hits("answers", &[key], 2)).await,
        [2, 0, 2, 2, 0]
    );
    for _ in 0..2 {
        let before = counts(&s, "answers", "shadowed").await;
        let r = s.call(request("answers", &[key])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(r.statuses, [limited(Code::Ok, 15, Unit::Hour, "", 0, 3590)]);
        let after = counts(&s, "answers", "shadowed").await;
        let delta: [u64; 5] = std::array::from_fn(|i| after[i] - before[i]);
        assert_eq!(delta, [1, 1, 0, 0, 1], "over the limit and shadow mode");
    }
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 0);
}

/// `TestMixedRuleShadowMode`: a shadow-mode rule over its limit (OK) beside an enforced rule over
/// its limit: the request is OVER_LIMIT.
#[tokio::test]
async fn an_enforced_rule_over_its_limit_denies_beside_a_shadowed_one() {
    let mut s = fixed().await;
    s.call(hits(
        "answers",
        &[&[("shadowed", "m")], &[("per_minute", "m")]],
        10,
    ))
    .await;
    s.call(hits("answers", &[&[("shadowed", "m")]], 5)).await;
    let r = s
        .call(request(
            "answers",
            &[&[("shadowed", "m")], &[("per_minute", "m")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        r.statuses,
        [
            limited(Code::Ok, 15, Unit::Hour, "", 0, 3590),
            limited(Code::OverLimit, 10, Unit::Minute, "key_name", 0, 50)
        ]
    );
}

/// `TestServiceWithCustomRatelimitHeaders` and `TestServiceWithDefaultRatelimitHeaders`: at 2 s
/// into a minute, a 10-per-minute descriptor over its limit beside an unmatched one: the three
/// headers, in order, carry its limit (the number alone, no `;w=` quota policy), 0 remaining and
/// 58 s; the names are LIMIT_*_HEADER's, else RateLimit-Limit/Remaining/Reset.
#[tokio::test]
async fn limit_headers_carry_the_over_limit_status_under_the_configured_names() {
    for (names, want) in [
        (
            Some([
                "A-Ratelimit-Limit",
                "A-Ratelimit-Remaining",
                "A-Ratelimit-Reset",
            ]),
            [
                "A-Ratelimit-Limit",
                "A-Ratelimit-Remaining",
                "A-Ratelimit-Reset",
            ],
        ),
        (
            None,
            ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
        ),
    ] {
        let mut s = fixed_with(|st| {
            st.limit_response_headers_enabled = true;
            if let Some([l, r, x]) = names {
                st.limit_limit_header = l.into();
                st.limit_remaining_header = r.into();
                st.limit_reset_header = x.into();
            }
        })
        .await;
        s.advance(52); // 10 s into the minute → 2 s into the next
        s.call(hits("answers", &[&[("per_minute", "h")]], 10)).await;
        let r = s
            .call(request(
                "answers",
                &[&[("per_minute", "h")], &[("hello", "world")]],
            ))
            .await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        assert_eq!(
            headers(&r),
            [(want[0], "10"), (want[1], "0"), (want[2], "58")]
        );
    }
}

/// `shouldRateLimitWorker`'s choice of the headers' status: the least remaining among statuses
/// with a limit (the first on ties, shadow-mode and quota statuses included), overridden by the
/// last non-quota OVER_LIMIT one; none when no status has a limit (unmatched, unlimited). Also
/// sent on OK answers.
#[tokio::test]
async fn limit_headers_come_from_the_least_remaining_or_the_last_over_limit_status() {
    let mut s = fixed_with(|st| st.limit_response_headers_enabled = true).await;
    let values = |r: &RateLimitResponse| -> Vec<String> {
        r.response_headers_to_add
            .iter()
            .map(|h| h.value.clone())
            .collect()
    };
    // per_minute leaves 9, per_hour (6 hits) leaves 9: a tie, the first wins.
    let r = s
        .call(with_hits(
            "answers",
            &[
                (&[("per_minute", "t")], None),
                (&[("per_hour", "t")], Some(6)),
            ],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(values(&r), ["10", "9", "50"]);
    let r = s
        .call(with_hits(
            "answers",
            &[
                (&[("per_hour", "t2")], Some(6)),
                (&[("per_minute", "t2")], None),
            ],
        ))
        .await;
    assert_eq!(values(&r), ["15", "9", "3590"]);
    // The least remaining wins over the order.
    let r = s
        .call(with_hits(
            "answers",
            &[
                (&[("per_minute", "t3")], None),
                (&[("per_hour", "t3")], Some(10)),
            ],
        ))
        .await;
    assert_eq!(values(&r), ["15", "5", "3590"]);
    // A shadow-mode status over its limit (OK, 0 remaining) first, an enforced over-limit one
    // after: the over-limit one.
    s.call(hits("answers", &[&[("shadowed", "o")]], 15)).await;
    s.call(hits("answers", &[&[("per_minute", "o")]], 10)).await;
    let r = s
        .call(request(
            "answers",
            &[&[("shadowed", "o")], &[("per_minute", "o")]],
        ))
        .await;
    assert_eq!(values(&r), ["10", "0", "50"]);
    // Two over their limits: the last.
    s.call(hits("answers", &[&[("per_hour", "o")]], 15)).await;
    let r = s
        .call(request(
            "answers",
            &[&[("per_minute", "o")], &[("per_hour", "o")]],
        ))
        .await;
    assert_eq!(values(&r), ["15", "0", "3590"]);
    let r = s
        .call(request(
            "answers",
            &[&[("per_hour", "o")], &[("per_minute", "o")]],
        ))
        .await;
    assert_eq!(values(&r), ["10", "0", "50"]);
    // The shadowed status alone (OK, 0 remaining): its values.
    let r = s.call(request("answers", &[&[("shadowed", "o")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(values(&r), ["15", "0", "3590"]);
    // Unlimited and unmatched only: no headers.
    let r = s
        .call(request("answers", &[&[("free", "x")], &[("hello", "w")]]))
        .await;
    assert!(r.response_headers_to_add.is_empty());
}

/// `TestEmptyDomain`, `TestEmptyDescriptors`: refused with the reference's messages (the gRPC
/// code, INVALID_ARGUMENT for its UNKNOWN, is a stated difference).
#[tokio::test]
async fn an_empty_domain_or_descriptor_list_is_refused_with_the_reference_message() {
    let mut s = fixed().await;
    let e = s.call_err(request("", &[&[("hello", "world")]])).await;
    assert_eq!(e.message(), "rate limit domain must not be empty");
    let e = s.call_err(request("answers", &[])).await;
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
}

/// `TestEmptyDomain`, `TestEmptyDescriptors`: each refusal counts in
/// `ratelimit.service.call.should_rate_limit.service_error`, which the reference's Prometheus
/// mapping names `ratelimit_service_should_rate_limit_error{err_type="service_error"}`.
#[tokio::test]
async fn refused_requests_count_as_the_reference_s_service_error() {
    let mut s = fixed().await;
    s.call_err(request("", &[&[("hello", "world")]])).await;
    s.call_err(request("answers", &[])).await;
    assert_eq!(
        metric(
            &s,
            "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"}"
        )
        .await,
        2
    );
}

/// `TestUnlimited`: a limited descriptor (9 left), an unmatched one, and an unlimited one
/// (OK, no limit, 2^32 − 1 remaining, no reset); the unlimited rule counts no hits.
#[tokio::test]
async fn unlimited_descriptors_report_max_remaining_and_no_limit() {
    let mut s = fixed().await;
    let r = s
        .call(request(
            "answers",
            &[
                &[("per_minute", "u")],
                &[("hello", "world")],
                &[("free", "q")],
            ],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        r.statuses,
        [
            limited(Code::Ok, 10, Unit::Minute, "key_name", 9, 50),
            no_limit(),
            unlimited()
        ]
    );
    assert_eq!(counts(&s, "answers", "free").await, [0; 5]);
}

/// `constructLimitsToCheck`: an unlimited rule is set aside before `replaces` is applied, so
/// naming it in another rule's `replaces` leaves it unlimited (2^32 − 1 remaining).
#[tokio::test]
async fn a_replaced_unlimited_rule_still_answers_unlimited() {
    let mut s = fixed().await;
    let r = s
        .call(request(
            "replace",
            &[&[("unlimited_named", "x")], &[("replacer", "x")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        r.statuses,
        [unlimited(), limited(Code::Ok, 5, Unit::Minute, "", 4, 50)]
    );
}

/// `TestServiceGlobalQuotaMode`, `TestServiceQuotaModeOnlyAllOverTheLimit` /
/// `…OnlySomeOverTheLimit`: with QUOTA_MODE every descriptor is a quota one: OVER_LIMIT only when
/// all are over; their statuses say OVER_LIMIT either way.
#[tokio::test]
async fn global_quota_mode_denies_only_when_every_descriptor_is_over() {
    let mut s = fixed_with(|st| st.quota_mode = true).await;
    s.call(hits("answers", &[&[("per_minute", "q")]], 10)).await;
    let r = s
        .call(request(
            "answers",
            &[&[("per_minute", "q")], &[("per_minute_b", "q")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(brief(&r), [(Code::OverLimit, 0), (Code::Ok, 9)]);
    s.call(hits("answers", &[&[("per_minute_b", "q")]], 9))
        .await;
    let r = s
        .call(request(
            "answers",
            &[&[("per_minute", "q")], &[("per_minute_b", "q")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(brief(&r), [(Code::OverLimit, 0), (Code::OverLimit, 0)]);
}

/// `TestServicePerDescriptorQuotaMode`, `TestServiceMixedPerDescriptorModes`,
/// `…UnderLimit`: a regular descriptor over its limit denies whatever the quota one says; the
/// only quota descriptor over its limit denies too; both within: OK.
#[tokio::test]
async fn per_descriptor_quota_mode_beside_a_regular_descriptor() {
    let mut s = fixed().await;
    let both = request("quota", &[&[("regular", "a")], &[("quota", "a")]]);
    let r = s.call(both.clone()).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(brief(&r), [(Code::Ok, 4), (Code::Ok, 2)]);
    // The quota one over, the regular one within: every quota descriptor is over.
    s.call(hits("quota", &[&[("quota", "a")]], 2)).await;
    let r = s.call(both.clone()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    // The regular one over, a quota one within.
    s.call(hits("quota", &[&[("regular", "b")]], 5)).await;
    let r = s
        .call(request("quota", &[&[("regular", "b")], &[("quota", "b")]]))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    // (The quota one's remaining: 3 here, not charged; the reference's 2, charged: stated.)
    assert_eq!(code(r.statuses[0].code), Code::OverLimit);
    assert_eq!(code(r.statuses[1].code), Code::Ok);
}

/// `TestServiceQuotaModeWithShadowMode`, `TestServiceMixedModeWithShadowMode`: global shadow
/// mode makes an OVER_LIMIT answer OK, statuses unchanged, and counts it.
#[tokio::test]
async fn global_shadow_mode_over_quota_descriptors() {
    let mut s = fixed_with(|st| st.shadow_mode = true).await;
    s.call(hits("quota", &[&[("regular", "s")]], 5)).await;
    s.call(hits("quota", &[&[("quota", "s")]], 3)).await;
    let r = s
        .call(request("quota", &[&[("regular", "s")], &[("quota", "s")]]))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(brief(&r), [(Code::OverLimit, 0), (Code::OverLimit, 0)]);
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 1);
}

/// `shouldRateLimitWorker`: `global_shadow_mode` counts answers whose code was OVER_LIMIT before
/// shadow mode made it OK. A quota descriptor over its limit beside one that is not leaves the
/// answer OK anyway: nothing to count.
#[tokio::test]
async fn global_shadow_mode_counts_only_answers_that_would_have_been_denied() {
    let mut s = fixed_with(|st| st.shadow_mode = true).await;
    s.call(hits("quota", &[&[("quota", "p")]], 3)).await;
    let r = s
        .call(request(
            "quota",
            &[&[("quota", "p")], &[("quota_other", "p")]],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(brief(&r), [(Code::OverLimit, 0), (Code::Ok, 2)]);
    assert_eq!(metric(&s, "ratelimit_service_global_shadow_mode").await, 0);
}

/// `constructLimitsToCheck`: a limit dropped by `replaces` is no limit at all, so its descriptor is
/// not a quota descriptor any more: the other quota descriptor, over its limit, is then every
/// quota descriptor over, and the answer OVER_LIMIT.
#[tokio::test]
async fn a_replaced_quota_limit_is_no_quota_descriptor() {
    let mut s = fixed().await;
    s.call(request("quota", &[&[("replacing_quota", "r")]]))
        .await;
    let r = s
        .call(request(
            "quota",
            &[&[("named_quota", "r")], &[("replacing_quota", "r")]],
        ))
        .await;
    assert_eq!(brief(&r), [(Code::Ok, 0), (Code::OverLimit, 0)]);
    assert!(r.statuses[0].current_limit.is_none(), "replaced");
    assert_eq!(code(r.overall_code), Code::OverLimit);
}

/// `TestMetadataReturnedForPassedDescriptors`, `…ForAllPassedDescriptors`,
/// `TestOverlappingMetadataReturnsTheFirstValue` (QUOTA_MODE, RESPONSE_DYNAMIC_METADATA): the
/// metadata of the descriptors that passed, merged, the first value winning; a descriptor over
/// its limit adds none. Also the request's own fields: domain, entries as `k=v`, `hitsAddend`.
#[tokio::test]
async fn dynamic_metadata_merges_the_metadata_of_the_descriptors_that_passed() {
    let mut s = fixed_with(|st| {
        st.quota_mode = true;
        st.response_dynamic_metadata = true;
    })
    .await;
    // Both pass: both rules' fields, the first descriptor's `name`.
    let r = s
        .call(request(
            "quota",
            &[
                &[("regular", "m")],
                &[("quota_other", "m")],
                &[("quota", "m")],
            ],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(field(&m, "domain")), "quota");
    assert!(
        field(&m, "hitsAddend").is_none(),
        "hits_addend 0 is left out"
    );
    let Some(V::ListValue(descriptors)) = field(&m, "descriptors") else {
        panic!("descriptors: {m:?}")
    };
    assert_eq!(descriptors.values.len(), 3);
    let Some(V::StructValue(first)) = &descriptors.values[0].kind else {
        panic!("a descriptor: {descriptors:?}")
    };
    let Some(V::ListValue(entries)) = field(first, "entries") else {
        panic!("entries: {first:?}")
    };
    assert_eq!(text(entries.values[0].kind.as_ref()), "regular=m");
    let Some(V::StructValue(merged)) = field(&m, "metadata") else {
        panic!("metadata: {m:?}")
    };
    assert_eq!(text(field(merged, "name")), "service_1");
    assert_eq!(text(field(merged, "some_other_name")), "service_2");
    // `quota` over its limit (quota mode: the answer still OK): only the others' metadata; with
    // the regular one over too, `quota`'s would have been first, but it did not pass.
    s.call(hits("quota", &[&[("quota", "n")]], 3)).await;
    let mut send = request("quota", &[&[("quota", "n")], &[("regular", "n")]]);
    send.hits_addend = 1;
    let r = s.call(send).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(field(&m, "hitsAddend"), Some(&V::NumberValue(1.0)));
    let Some(V::StructValue(merged)) = field(&m, "metadata") else {
        panic!("metadata: {m:?}")
    };
    assert_eq!(text(field(merged, "name")), "service_1");
}

// ---------------------------------------------------------------------------------------------
// test/redis/fixed_cache_impl_test.go and test/limiter/base_limiter_test.go

/// `testRedis`, `TestGetResponseStatusBelowLimit`: remaining is the limit less the window's
/// count, and the reset the time to the end of the epoch-aligned window, `unit − now % unit`
/// (START is 10 s into a minute, hour, day and week; months are 30 days, years 365).
#[tokio::test]
async fn remaining_and_reset_in_each_unit_s_fixed_window() {
    let mut s = fixed().await;
    let now: i64 = 1_767_225_610;
    for (key, unit, seconds) in [
        ("per_second_10", Unit::Second, 1),
        ("per_minute_b", Unit::Minute, 60),
        ("per_day", Unit::Day, 86_400),
        ("per_week", Unit::Week, 604_800),
        ("per_month", Unit::Month, 2_592_000),
        ("per_year", Unit::Year, 31_536_000),
    ] {
        let reset = seconds - now % seconds;
        // 10 per unit; 5 hits leave 5, as the reference's count of 5 does.
        let r = s.call(hits("answers", &[&[(key, "r")]], 5)).await;
        assert_eq!(
            r.statuses,
            [limited(Code::Ok, 10, unit, "", 5, reset)],
            "{key}"
        );
        let r = s.call(hits("answers", &[&[(key, "r")]], 6)).await;
        assert_eq!(
            r.statuses,
            [limited(Code::OverLimit, 10, unit, "", 0, reset)],
            "{key}"
        );
    }
    // A new window starts afresh at the second's end.
    s.clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(
        s.hit("answers", &[("per_second_10", "r")]).await,
        (Code::Ok, 9)
    );
}

/// `testRedis` (second and third requests), `NewRateLimitRequestWithPerDescriptorHitsAddend`: a
/// descriptor's own `hits_addend` wins over the request's; 0 checks without charging (and counts
/// no hits); a request `hits_addend` of 0 means 1.
#[tokio::test]
async fn descriptor_hits_addend_zero_checks_without_charging() {
    let mut s = fixed().await;
    let r = s
        .call(with_hits(
            "answers",
            &[
                (&[("hello", "w")], Some(0)),
                (&[("per_minute", "z")], Some(1)),
            ],
        ))
        .await;
    assert_eq!(
        r.statuses,
        [
            no_limit(),
            limited(Code::Ok, 10, Unit::Minute, "key_name", 9, 50)
        ]
    );
    let check = with_hits("answers", &[(&[("per_minute", "z")], Some(0))]);
    assert_eq!(
        moved(&mut s, "answers", "per_minute", check.clone()).await[0],
        0,
        "no hits counted"
    );
    assert_eq!(brief(&s.call(check.clone()).await), [(Code::Ok, 9)]);
    // Request-level 3 on one descriptor, its own 1 on another.
    let mut both = with_hits(
        "answers",
        &[
            (&[("per_minute", "z")], None),
            (&[("per_hour", "z")], Some(1)),
        ],
    );
    both.hits_addend = 3;
    assert_eq!(brief(&s.call(both).await), [(Code::Ok, 6), (Code::Ok, 14)]);
    s.call(hits("answers", &[&[("per_minute", "z")]], 6)).await;
    // At the limit: a check says OK, 0 remaining.
    assert_eq!(brief(&s.call(check).await), [(Code::Ok, 0)]);
    assert_eq!(
        brief(&s.call(request("answers", &[&[("per_minute", "z")]])).await),
        [(Code::OverLimit, 0)]
    );
}

/// `TestNearLimit` (the single hits): 15 per hour, near-limit threshold ⌊15 × 0.8⌋ = 12: hits up
/// to 12 are within, 13 to 15 near (and within), the 16th over; total counts every hit.
#[tokio::test]
async fn near_and_over_limit_counts_of_single_hits() {
    let mut s = fixed().await;
    let one = request("answers", &[&[("per_hour", "n")]]);
    let mut wants = vec![[1, 0, 0, 1, 0]; 12];
    wants.extend([[1, 0, 1, 1, 0]; 3]);
    wants.push([1, 1, 0, 0, 0]);
    for (i, want) in wants.into_iter().enumerate() {
        assert_eq!(
            moved(&mut s, "answers", "per_hour", one.clone()).await,
            want,
            "hit {}",
            i + 1
        );
    }
}

/// `TestNearLimit` (hits_addend > 1) where every hit falls on the same side of each threshold:
/// 20 per second (threshold 16): 3 hits from 2 are within; 3 hits from 16 are all near.
#[tokio::test]
async fn near_limit_counts_of_multi_hit_requests_on_one_side_of_the_threshold() {
    let mut s = fixed().await;
    let k = |v: &str| request("answers", &[&[("per_second", v)]]);
    s.call(hits("answers", &[&[("per_second", "a")]], 2)).await;
    assert_eq!(
        moved(
            &mut s,
            "answers",
            "per_second",
            RateLimitRequest {
                hits_addend: 3,
                ..k("a")
            }
        )
        .await,
        [3, 0, 0, 3, 0]
    );
    assert_eq!(
        brief(
            &s.call(with_hits("answers", &[(&[("per_second", "a")], Some(0))]))
                .await
        ),
        [(Code::Ok, 15)]
    );
    s.call(hits("answers", &[&[("per_second", "b")]], 16)).await;
    assert_eq!(
        moved(
            &mut s,
            "answers",
            "per_second",
            RateLimitRequest {
                hits_addend: 3,
                ..k("b")
            }
        )
        .await,
        [3, 0, 3, 3, 0]
    );
}

/// `TestNearLimit` (hits_addend > 1 across a threshold), `checkNearLimitThreshold` /
/// `checkOverLimitThreshold`: only the hits past the near-limit threshold count as near, only
/// those past the limit as over, and on an over-limit answer the hits between the threshold and
/// the limit count as near (none as within). The same whether the denied hits are charged
/// (CHARGE_DENIED_HITS=true) or not (our default: split as if added to the count as it stands).
#[tokio::test]
async fn near_and_over_limit_split_a_multi_hit_request_at_the_thresholds() {
    for charge_denied in [false, true] {
        near_and_over_limit_split(charge_denied).await;
    }
}

async fn near_and_over_limit_split(charge_denied: bool) {
    let mut s = fixed_with(|st| st.defaults.charge_denied_hits = charge_denied).await;
    // 8 per second (threshold 6): 2 hits from 5 → 7: one near.
    s.call(hits("answers", &[&[("per_second_8", "a")]], 5))
        .await;
    let send = hits("answers", &[&[("per_second_8", "a")]], 2);
    assert_eq!(
        moved(&mut s, "answers", "per_second_8", send).await,
        [2, 0, 1, 2, 0]
    );
    // 20 per second (threshold 16): 3 hits from 19 → 22: 2 over, 1 near.
    s.call(hits("answers", &[&[("per_second", "c")]], 19)).await;
    let send = hits("answers", &[&[("per_second", "c")]], 3);
    assert_eq!(
        moved(&mut s, "answers", "per_second", send).await,
        [3, 2, 1, 0, 0]
    );
    // 7 hits from 15 → 22: 2 over, 4 near.
    s.call(hits("answers", &[&[("per_second", "d")]], 15)).await;
    let send = hits("answers", &[&[("per_second", "d")]], 7);
    assert_eq!(
        moved(&mut s, "answers", "per_second", send).await,
        [7, 2, 4, 0, 0]
    );
    // A shadow-mode rule: 4 hits from 13 of 15 → 17: 2 over and shadow, 2 near.
    s.call(hits("answers", &[&[("shadowed", "x")]], 13)).await;
    let send = hits("answers", &[&[("shadowed", "x")]], 4);
    assert_eq!(
        moved(&mut s, "answers", "shadowed", send).await,
        [4, 2, 2, 0, 2]
    );
}

/// NEAR_LIMIT_RATIO moves the near-limit threshold: ⌊10 × 0.5⌋ = 5.
#[tokio::test]
async fn near_limit_ratio_sets_the_threshold() {
    let mut s = fixed_with(|st| st.near_limit_ratio = 0.5).await;
    let one = request("answers", &[&[("per_second_10", "r")]]);
    for want in [0, 0, 0, 0, 0, 1, 1] {
        assert_eq!(
            moved(&mut s, "answers", "per_second_10", one.clone()).await[2],
            want
        );
    }
}

/// `GetResponseDescriptorStatus`: the threshold is `floor(float32(limit) * float32(ratio))`,
/// computed in float32: with NEAR_LIMIT_RATIO=0.7 and a limit of 90 that is 63 (in float64,
/// 62.99… → 62), so the 63rd hit is not yet near the limit.
#[tokio::test]
async fn near_limit_threshold_is_computed_in_float32() {
    let rules = "domain: ratio\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 90}\n";
    let mut s = start_with(&[("ratio.yaml", rules)], |st| {
        st.defaults.default_algorithm = Algorithm::FixedWindow;
        st.near_limit_ratio = 0.7;
    })
    .await;
    s.call(hits("ratio", &[&[("k", "v")]], 62)).await;
    assert_eq!(
        moved(&mut s, "ratio", "k", request("ratio", &[&[("k", "v")]])).await,
        [1, 0, 0, 1, 0],
        "63 is not past 63"
    );
    assert_eq!(
        moved(&mut s, "ratio", "k", request("ratio", &[&[("k", "v")]])).await,
        [1, 0, 1, 1, 0]
    );
}

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig` (the answers): 15 and 14 per hour
/// from 10 each: 1 hit each leaves 4 and 3, 2 each leave 2 and 1; 2 more each do not fit the
/// second: it is OVER_LIMIT and the first, not charged, reports the 2 it still has (as the
/// reference with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, and our default).
#[tokio::test]
async fn a_denied_request_reports_what_its_other_keys_still_have() {
    let mut s = fixed().await;
    let pair = |n| {
        with_hits(
            "answers",
            &[
                (&[("per_hour", "s")], Some(n)),
                (&[("per_hour_14", "s")], Some(n)),
            ],
        )
    };
    s.call(pair(10)).await;
    assert_eq!(
        brief(&s.call(pair(1)).await),
        [(Code::Ok, 4), (Code::Ok, 3)]
    );
    assert_eq!(
        brief(&s.call(pair(2)).await),
        [(Code::Ok, 2), (Code::Ok, 1)]
    );
    let r = s.call(pair(2)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        r.statuses,
        [
            limited(Code::Ok, 15, Unit::Hour, "", 2, 3590),
            limited(Code::OverLimit, 14, Unit::Hour, "", 0, 3590)
        ]
    );
}

/// `GetLimit` on a descriptor entry with an empty value (`key_` as its lookup key): it matches the
/// value-less rule (its own counter, apart from other values), a `*` wildcard (which matches
/// zero characters), and a nested value-less rule below a value-less parent.
#[tokio::test]
async fn an_empty_value_matches_a_value_less_rule_and_a_star_wildcard() {
    let mut s = fixed().await;
    assert_eq!(s.hit("answers", &[("any_value", "")]).await, (Code::Ok, 2));
    assert_eq!(s.hit("answers", &[("any_value", "")]).await, (Code::Ok, 1));
    assert_eq!(s.hit("answers", &[("any_value", "x")]).await, (Code::Ok, 2));
    assert_eq!(s.hit("answers", &[("wild", "")]).await, (Code::Ok, 1));
    assert_eq!(s.hit("answers", &[("wild", "")]).await, (Code::Ok, 0));
    assert_eq!(s.hit("answers", &[("wild", "")]).await.0, Code::OverLimit);
    let r = s
        .call(request("answers", &[&[("parent", ""), ("child", "")]]))
        .await;
    assert_eq!(r.statuses, [limited(Code::Ok, 10, Unit::Minute, "", 9, 50)]);
}

// ---------------------------------------------------------------------------------------------
// CHARGE_DENIED_HITS=true (the xDS mode): the reference's counting, denied hits included.

/// `testRedis` (third request), `TestOverLimitWithLocalCache` (over the limit): with denied hits
/// counted, a count past the limit keeps every later request over, a check (`hits_addend` 0)
/// included; a key repeated in one request is counted in order (2, 1, 0, then over), and the
/// descriptor within its limit beside an over one is charged.
#[tokio::test]
async fn with_charge_denied_hits_counts_run_past_the_limit_as_the_reference_s() {
    let mut s = fixed_with(|st| st.defaults.charge_denied_hits = true).await;
    let k: &[(&str, &str)] = &[("per_hour", "c")];
    s.call(hits("answers", &[k], 14)).await;
    let r = s.call(hits("answers", &[k], 3)).await; // 17 of 15
    assert_eq!(
        r.statuses,
        [limited(Code::OverLimit, 15, Unit::Hour, "", 0, 3590)]
    );
    let check = with_hits("answers", &[(k, Some(0))]);
    assert_eq!(brief(&s.call(check).await), [(Code::OverLimit, 0)]);
    let q: &[(&str, &str)] = &[("per_minute_b", "c")];
    s.call(hits("answers", &[q], 7)).await;
    let r = s.call(request("answers", &[q; 4])).await;
    assert_eq!(
        brief(&r),
        [
            (Code::Ok, 2),
            (Code::Ok, 1),
            (Code::Ok, 0),
            (Code::OverLimit, 0)
        ]
    );
    // Beside an over-limit descriptor, the other one is charged.
    let r = s
        .call(request(
            "answers",
            &[&[("per_hour", "c")], &[("per_minute", "c")]],
        ))
        .await;
    assert_eq!(brief(&r), [(Code::OverLimit, 0), (Code::Ok, 9)]);
    assert_eq!(
        s.hit("answers", &[("per_minute", "c")]).await,
        (Code::Ok, 8)
    );
}

/// `TestNearLimit` (over the limit from a count already over): with denied hits counted, 3 hits
/// on a count of 27 of 10 are all over.
#[tokio::test]
async fn with_charge_denied_hits_hits_on_a_count_past_the_limit_are_all_over() {
    let mut s = fixed_with(|st| st.defaults.charge_denied_hits = true).await;
    let k: &[(&str, &str)] = &[("per_second_10", "o")];
    s.call(hits("answers", &[k], 27)).await;
    assert_eq!(
        moved(&mut s, "answers", "per_second_10", hits("answers", &[k], 3)).await,
        [3, 3, 0, 0, 0]
    );
}

// ---------------------------------------------------------------------------------------------
// The local over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES, Redis).

/// `TestOverLimitWithLocalCache`, `TestOverLimitWithLocalCacheShadowRule`,
/// `TestGetResponseStatusOverLimitWithLocalCache…`: on Redis with the local over-limit cache, an
/// answer from the cache is the one Redis gives: OVER_LIMIT with the limit, 0 remaining and the
/// reset, its hit counted as over the limit; a shadow-mode rule's, OK.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn answers_from_the_local_over_limit_cache_are_redis_s_answers() {
    use ratelimit_server::clock::{Clock, SystemClock};
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let addr = redis.addr();
    let s = fixed_with(move |st| {
        st.store.backend = BackendType::Redis;
        st.store.redis_url = addr;
        st.store.cache_key_prefix = "ans:".into();
        st.store.local_cache_size_in_bytes = 1 << 20;
    })
    .await;
    // Redis expires keys by its own clock: the server's follows the real one.
    let clock = s.clock.clone();
    let real = move || clock.set(SystemClock.now());
    real();
    let ticker = {
        let real = real.clone();
        tokio::spawn(async move {
            loop {
                real();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    let mut s = s;
    let k: &[(&str, &str)] = &[("per_day", "cache")];
    s.call(hits("answers", &[k], 10)).await;
    let cached_before = metric(&s, "ratelimit_over_limit_with_local_cache").await;
    for _ in 0..3 {
        let before = counts(&s, "answers", "per_day").await;
        let r = s.call(request("answers", &[k])).await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        let status = &r.statuses[0];
        assert_eq!(
            (code(status.code), status.limit_remaining),
            (Code::OverLimit, 0)
        );
        assert_eq!(
            status.current_limit,
            Some(RateLimit {
                name: String::new(),
                requests_per_unit: 10,
                unit: Unit::Day as i32
            })
        );
        let now_s = (SystemClock.now() / 1_000_000_000) as i64;
        let reset = status.duration_until_reset.as_ref().unwrap().seconds;
        assert!(
            (86_400 - now_s % 86_400 - reset).abs() <= 1,
            "reset {reset} is the day's end"
        );
        let after = counts(&s, "answers", "per_day").await;
        assert_eq!(after[1] - before[1], 1, "over the limit");
    }
    assert_eq!(
        metric(&s, "ratelimit_over_limit_with_local_cache").await - cached_before,
        2,
        "the first denial went to Redis, the other two came from the cache"
    );
    let shadow: &[(&str, &str)] = &[("shadowed", "cache")];
    s.call(hits("answers", &[shadow], 15)).await;
    for _ in 0..3 {
        let r = s.call(request("answers", &[shadow])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(brief(&r), [(Code::Ok, 0)]);
    }
    ticker.abort();
}
