//! Metrics of one decision: per-rule hit counters (within, near, over, shadow) and global shadow
//! mode. The series of a rule are created on its first hit (see `metrics::PolicyMetrics`).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::EngineSettings;
use super::outcome::outcome;
use super::plan::{Plan, PlannedLimit};
use crate::metrics::{Metrics, PolicyMetrics};
use crate::store::Verdict;

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
