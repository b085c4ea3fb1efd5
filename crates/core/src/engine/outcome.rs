//! How one descriptor's tightest limit went, as the per-rule metrics count it: within, near (past
//! `NEAR_LIMIT_RATIO` of its capacity), over, or over but let through by `shadow_mode`. Pure; the
//! one classification both the metrics (`observe`) and replay's attribution (`attribution`) use.

use super::plan::PlannedLimit;
use crate::config::Algorithm;
use crate::metrics::HitOutcome;
use crate::store::Verdict;

/// Near the limit: after this request, more than `ratio` of the capacity is used.
pub(super) fn outcome(
    limit: &PlannedLimit<'_>,
    verdict: &Verdict,
    shadow: bool,
    ratio: f64,
) -> HitOutcome {
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
