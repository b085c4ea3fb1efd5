//! Which rule decided each descriptor of a request, and how (for `replay`, which counts per rule
//! what the per-rule metrics would).

use super::EngineSettings;
use super::outcome::outcome;
use super::plan::{Plan, PlannedLimit};
use crate::metrics::HitOutcome;
use crate::store::Verdict;

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
                    outcome(
                        limit,
                        verdict,
                        plan.shadow_mode,
                        plan.hits,
                        settings.near_limit_ratio,
                    )
                }),
                hits: plan.hits,
            }),
    );
}
