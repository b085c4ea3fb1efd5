//! Builds the RateLimitResponse as envoyproxy/ratelimit does: one status per descriptor in order,
//! the overall code, and the optional headers: the reference's draft-03 RateLimit-* taken from the
//! tightest status, or the IETF fields of every limit (`ietf`).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;
use smallvec::SmallVec;

use super::plan::{Kind, Plan, PlannedLimit};
use super::{EngineSettings, ietf};
use crate::clock::{NANOS_PER_SECOND, Nanos};
use crate::config::Unit;
use crate::store::Verdict;

/// Names of the response headers (`LIMIT_LIMIT_HEADER`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

/// Which rate-limit headers answers carry (`--rate-limit-headers`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResponseHeaders {
    /// None (the reference's default).
    #[default]
    Off,
    /// The reference's draft-03 `RateLimit-Limit/Remaining/Reset` of the tightest limit, under
    /// these names (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    Draft03(HeaderNames),
    /// draft-ietf-httpapi-ratelimit-headers-11: `RateLimit-Policy`, `RateLimit`, and
    /// `Retry-After` on OVER_LIMIT.
    Ietf,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

pub(super) fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// Whole seconds, rounded up, as the reference reports resets (and as Envoy's headers show them).
pub(super) fn reset_seconds(reset: Nanos) -> u64 {
    reset.div_ceil(NANOS_PER_SECOND)
}

/// The tightest limit of each plan and its verdict: a denied one first, else the least remaining;
/// the first on ties. `verdicts` holds one verdict per planned limit, in plan order.
pub(super) fn tightest<'a, 'p: 'a>(
    plans: &'a [Plan<'p>],
    verdicts: &'a [Verdict],
) -> SmallVec<[Option<(&'a PlannedLimit<'p>, Verdict)>; 2]> {
    let mut next = 0;
    plans
        .iter()
        .map(|plan| {
            let limits = plan.limits();
            let mine = verdicts.get(next..next + limits.len()).unwrap_or(&[]);
            next += limits.len();
            limits
                .iter()
                .zip(mine)
                .min_by_key(|(_, v)| (v.allowed, v.outlook.remaining))
                .map(|(l, v)| (l, *v))
        })
        .collect()
}

/// The answer to a request planned as `plans`, whose charges got `verdicts` (one per planned
/// limit, in plan order), `tightest` the tightest of each plan.
pub(super) fn build(
    plans: &[Plan<'_>],
    tightest: &[Option<(&PlannedLimit<'_>, Verdict)>],
    verdicts: &[Verdict],
    settings: &EngineSettings,
    now: Nanos,
) -> RateLimitResponse {
    let mut statuses = Vec::with_capacity(plans.len());
    for (plan, tightest) in plans.iter().zip(tightest) {
        let status = match (&plan.kind, tightest) {
            (Kind::Concurrency(slot), _) => super::concurrency::status(slot, plan.shadow_mode, now),
            (Kind::Unlimited, _) => DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..Default::default()
            },
            (Kind::Limited(_), Some((limit, verdict))) => {
                let over = !verdict.allowed && !plan.shadow_mode;
                DescriptorStatus {
                    code: if over { Code::OverLimit } else { Code::Ok } as i32,
                    current_limit: Some(RateLimit {
                        name: limit.name.to_owned(),
                        requests_per_unit: limit.requests_per_unit,
                        unit: proto_unit(limit.unit) as i32,
                    }),
                    limit_remaining: if verdict.allowed {
                        verdict.outlook.remaining
                    } else {
                        0
                    },
                    duration_until_reset: Some(Duration {
                        seconds: reset_seconds(verdict.outlook.reset_after) as i64,
                        nanos: 0,
                    }),
                    ..Default::default()
                }
            }
            _ => DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
        };
        statuses.push(status);
    }
    let overall = if denies(plans, &statuses) && !settings.shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let response_headers_to_add = match &settings.response_headers {
        ResponseHeaders::Off => Vec::new(),
        ResponseHeaders::Draft03(names) => {
            let quota: Vec<bool> = plans.iter().map(|p| p.quota).collect();
            headers(&statuses, &quota, names)
        }
        ResponseHeaders::Ietf => ietf::headers(plans, verdicts, overall == Code::OverLimit),
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    }
}

/// Whether the statuses deny the request, `SHADOW_MODE` aside (the reference's rule): a
/// non-quota descriptor over its limit denies; quota descriptors deny only when there is one and
/// every one is over. Unlimited descriptors are in neither group.
pub(super) fn denies(plans: &[Plan<'_>], statuses: &[DescriptorStatus]) -> bool {
    let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
    let quota = |(p, _): &(&Plan<'_>, &DescriptorStatus)| p.quota && p.kind != Kind::Unlimited;
    let pairs = || plans.iter().zip(statuses);
    pairs().filter(|x| !quota(x)).any(|(_, s)| over(s))
        || (pairs().any(|x| quota(&x)) && pairs().filter(quota).all(|(_, s)| over(s)))
}

/// The reference's choice: the status with the least remaining among those with a limit (first on
/// ties), overridden by the last OVER_LIMIT one that is not a quota descriptor. No headers when no
/// descriptor had a limit.
fn headers(statuses: &[DescriptorStatus], quota: &[bool], names: &HeaderNames) -> Vec<HeaderValue> {
    let limited = statuses.iter().filter(|s| s.current_limit.is_some());
    let chosen = statuses
        .iter()
        .zip(quota)
        .filter(|(s, q)| !**q && s.current_limit.is_some())
        .map(|(s, _)| s)
        .rfind(|s| s.code == Code::OverLimit as i32)
        .or_else(|| limited.min_by_key(|s| s.limit_remaining));
    let Some(status) = chosen else {
        return Vec::new();
    };
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}
