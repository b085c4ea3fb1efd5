//! Metrics of one decision: per-rule hit counters (within, near, over, shadow: a request's hits
//! split as the reference splits them, `outcome::split`), global shadow mode (answers OK only
//! because of it), and the descriptors nothing matched (per known domain; calls to unknown
//! domains, per descriptor as the reference counts them; a descriptor that nearly matches a rule,
//! in another order or with more entries than its branch, warned of). The series of a rule are
//! created on its first hit (see `metrics::PolicyMetrics`).

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::outcome::{near_threshold, split};
use super::plan::{Kind, Lookup, Nearly, Plan, PlannedLimit, Role, Slot};
use super::{EngineSettings, Live};
use crate::metrics::{HitOutcome, HitSplit, Metrics};
use crate::store::Verdict;

pub(super) fn record(
    metrics: &Metrics,
    live: &Live,
    request: &RateLimitRequest,
    plans: &[Plan<'_>],
    tightest: &[Option<(&PlannedLimit<'_>, Verdict)>],
    response: &RateLimitResponse,
    settings: &EngineSettings,
) {
    let (mut no_rule, mut unknown_domain) = (0, 0);
    for plan in plans {
        match plan.lookup {
            Lookup::Found => {}
            Lookup::NoRule(_) => no_rule += 1,
            Lookup::UnknownDomain => unknown_domain += 1,
        }
    }
    if no_rule > 0
        && let Some(counter) = live.counters.no_rule(&request.domain)
    {
        counter.inc_by(no_rule);
    }
    if unknown_domain > 0 {
        metrics.domain_not_found(&request.domain, unknown_domain);
    }
    for (plan, descriptor) in plans.iter().zip(&request.descriptors) {
        let Lookup::NoRule(nearly) = plan.lookup else {
            continue;
        };
        let Some(rules) = live.policy.domain(&request.domain) else {
            continue;
        };
        match nearly {
            Nearly::Nothing => {}
            Nearly::AnotherOrder => metrics.descriptor_in_another_order(rules, &descriptor.entries),
            Nearly::LongerThanARule => {
                metrics.descriptor_longer_than_a_rule(rules, &descriptor.entries)
            }
        }
    }
    for ((plan, tightest), descriptor) in plans.iter().zip(tightest).zip(&request.descriptors) {
        let (split, depth) = match (tightest, &plan.kind) {
            (Some((limit, verdict)), _) => (
                split(
                    limit,
                    verdict,
                    plan.shadow_mode,
                    plan.hits,
                    settings.near_limit_ratio,
                ),
                descriptor.entries.len(),
            ),
            (None, Kind::Concurrency(slot)) => {
                match slot_outcome(slot, plan.shadow_mode, settings.near_limit_ratio) {
                    // The request id is no part of the rule's label.
                    Some(outcome) => (HitSplit::whole(outcome, plan.hits), slot.depth),
                    None => continue,
                }
            }
            (None, _) => continue,
        };
        let entries = descriptor
            .entries
            .iter()
            .take(depth)
            .map(|e| (e.key.as_str(), e.value.as_str()));
        match plan.rule {
            Some(rule) => {
                if let Some(series) = live.counters.rule(&request.domain, rule) {
                    series.record(split, entries);
                }
            }
            None => {
                if let Some(counts) = live.counters.override_counts(&request.domain) {
                    counts.record(split);
                }
            }
        }
    }
    // As the reference counts it (`shouldRateLimitWorker`): answers that would have been
    // OVER_LIMIT, not every answer with an OVER_LIMIT status (a quota descriptor over its limit
    // beside one within leaves the answer OK, shadow mode or not).
    if settings.shadow_mode && super::response::denies(plans, &response.statuses) {
        metrics.global_shadow_mode.inc();
    }
}

/// How a concurrency descriptor's acquisition counts in its rule's hit series: over when denied,
/// near when the slots it leaves in use pass `ratio` of the limit; releases are no hits.
fn slot_outcome(slot: &Slot, shadow: bool, ratio: f64) -> Option<HitOutcome> {
    let answer = slot.answer.filter(|_| slot.role == Role::Acquire)?;
    Some(if !answer.allowed() {
        if shadow {
            HitOutcome::OverShadowed
        } else {
            HitOutcome::Over
        }
    } else if u64::from(answer.in_use) > near_threshold(slot.params.max_in_flight, ratio) {
        HitOutcome::Near
    } else {
        HitOutcome::Within
    })
}
