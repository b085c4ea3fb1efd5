//! Metrics of one decision: per-rule hit counters (within, near, over, shadow) and global shadow mode.
//! The series of a rule are created on its first hit (see `metrics::PolicyMetrics`). Also the same
//! outcomes as values (`Attribution`), for `replay`.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::EngineSettings;
use super::plan::{Plan, PlannedLimit};
use crate::config::Algorithm;
use crate::metrics::{HitOutcome, Metrics, PolicyMetrics};
use crate::store::Verdict;

/// Near the limit: after this request, more than `ratio` of the capacity is used.
fn outcome(limit: &PlannedLimit<'_>, verdict: &Verdict, shadow: bool, ratio: f64) -> HitOutcome {
    if !verdict.allowed {
        return if shadow {
            HitOutcome::OverShadowed
        } else {
            HitOutcome::Over
        };
    }
    let capacity = match limit.params.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => limit.params.burst,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => limit.params.requests_per_unit,
    };
    let used = capacity.saturating_sub(verdict.outlook.remaining);
    let threshold = (f64::from(capacity) * ratio).floor() as u32;
    if used > threshold {
        HitOutcome::Near
    } else {
        HitOutcome::Within
    }
}

/// How one descriptor of a request was decided, and by which rule (for `replay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribution {
    /// The matched rule's `Rule::id` in the engine's policy; `None` for a request's limit override
    /// and for a descriptor that matched no rule.
    pub rule: Option<usize>,
    /// The outcome as the per-rule metrics count it (near the limit: past `NEAR_LIMIT_RATIO`);
    /// `None` when no limit applied (no match, unlimited, replaced).
    pub outcome: Option<HitOutcome>,
    /// Hits the descriptor charged.
    pub hits: u64,
}

pub(super) fn attribute(
    out: &mut Vec<Attribution>,
    plans: &[Plan<'_>],
    tightest: &[Option<(&PlannedLimit<'_>, Verdict)>],
    settings: &EngineSettings,
) {
    out.extend(
        plans
            .iter()
            .zip(tightest)
            .map(|(plan, tightest)| Attribution {
                rule: plan.rule.map(|r| r.id),
                outcome: tightest.as_ref().map(|(limit, verdict)| {
                    outcome(limit, verdict, plan.shadow_mode, settings.near_limit_ratio)
                }),
                hits: plan.hits,
            }),
    );
}

pub(super) fn record(
    metrics: &Metrics,
    counters: &PolicyMetrics,
    request: &RateLimitRequest,
    plans: &[Plan<'_>],
    tightest: &[Option<(&PlannedLimit<'_>, Verdict)>],
    response: &RateLimitResponse,
    settings: &EngineSettings,
) {
    for ((plan, tightest), descriptor) in plans.iter().zip(tightest).zip(&request.descriptors) {
        let Some((limit, verdict)) = tightest else {
            continue;
        };
        let outcome = outcome(limit, verdict, plan.shadow_mode, settings.near_limit_ratio);
        let entries = descriptor
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()));
        match plan.rule {
            Some(rule) => {
                if let Some(series) = counters.rule(&request.domain, rule) {
                    series.record(outcome, plan.hits, entries);
                }
            }
            None => {
                if let Some(counts) = counters.override_counts(&request.domain) {
                    counts.record(outcome, plan.hits);
                }
            }
        }
    }
    let over = response
        .statuses
        .iter()
        .any(|s| s.code == Code::OverLimit as i32);
    if settings.shadow_mode && over {
        metrics.global_shadow_mode.inc();
    }
}
