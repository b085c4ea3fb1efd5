//! A request's concurrency descriptors. Envoy sends two calls per request: at request time the
//! rule's entries and the request id (take a slot), at stream done the same and the release
//! marker (give it back). Here: which of the two a descriptor is ([`role`]), the store calls on
//! the keys' leases (one each, before the rate charges, so a request denied for concurrency is
//! charged nothing), the slots given back again when the request is denied after all, and each
//! descriptor's status.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;
use smallvec::SmallVec;

use super::plan::{Kind, Plan, Role, Slot};
use super::response::reset_seconds;
use crate::clock::Nanos;
use crate::lease::{LeaseAction, LeaseOutcome, Watch};
use crate::limiter;
use crate::metrics::Metrics;
use crate::store::{
    Backend, Charge, Entries, LeaseCall, Store, StoreError, Verdict, Verdicts, concurrency_counter,
};

/// The entry Envoy's stream-done `rate_limits` entry adds last (a `generic_key` with this
/// `descriptor_key` and `descriptor_value`) so the server tells a release from an acquisition.
pub const RELEASE_KEY: &str = "concurrency";
pub const RELEASE_VALUE: &str = "release";

/// The `name` of a concurrency descriptor's limit in its status.
const LIMIT_NAME: &str = "concurrency";

/// What a descriptor matched by a concurrency rule of `depth` entries asks: the request id after
/// the rule's entries (take a slot), then the release marker (give it back). Any other shape
/// matches nothing (`None`).
pub(super) fn role(entries: &[Entry], depth: usize) -> Option<Role> {
    match entries.get(depth..)? {
        [_id] => Some(Role::Acquire),
        [_id, marker] if marker.key == RELEASE_KEY && marker.value == RELEASE_VALUE => {
            Some(Role::Release)
        }
        _ => None,
    }
}

/// The slots this request took (plan index, key, request id): given back if it is denied after
/// all.
pub(super) struct Taken<'r, K> {
    slots: SmallVec<[(usize, K, &'r str); 1]>,
    /// An enforced concurrency descriptor was denied: the request is over the limit.
    pub(super) blocked: bool,
}

impl<K> Taken<'_, K> {
    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// What one concurrency descriptor of a request calls on.
struct Target<'r, K> {
    plan: usize,
    key: K,
    id: &'r str,
    action: LeaseAction,
}

/// Runs the request's concurrency calls: its releases, then its acquisitions in order until an
/// enforced one is denied (then the slots this request took are given back, and the rest are not
/// tried). Each plan gets its answer.
pub(super) async fn run<'r, B: Backend>(
    store: &Store<B>,
    metrics: Option<&Metrics>,
    request: &'r RateLimitRequest,
    plans: &mut [Plan<'_>],
    now: Nanos,
) -> Result<Taken<'r, B::Key>, StoreError> {
    let mut targets: SmallVec<[Target<'r, B::Key>; 1]> = SmallVec::new();
    for (index, (descriptor, plan)) in request.descriptors.iter().zip(plans.iter()).enumerate() {
        let Kind::Concurrency(slot) = &plan.kind else {
            continue;
        };
        let action = match slot.role {
            Role::Acquire => LeaseAction::Acquire,
            Role::Release => LeaseAction::Release,
            Role::Look => continue,
        };
        let entries = &descriptor.entries[..];
        let shared = plan.rule.map_or(&[][..], |r| &r.shared[..]);
        let counted = Entries::from(&entries[..slot.depth]).sharing(shared);
        targets.push(Target {
            plan: index,
            key: store.key(&concurrency_counter(&request.domain, counted)),
            id: &entries[slot.depth].value,
            action,
        });
    }
    targets.sort_by_key(|t| t.action != LeaseAction::Release);
    let mut taken = Taken {
        slots: SmallVec::new(),
        blocked: false,
    };
    for target in targets {
        if taken.blocked && target.action == LeaseAction::Acquire {
            continue;
        }
        let plan = &mut plans[target.plan];
        let (Kind::Concurrency(slot), Some(rule)) = (&mut plan.kind, plan.rule) else {
            continue;
        };
        let series = metrics.map(|m| m.concurrency.rule(&request.domain, rule));
        let watch: Option<Watch> = series.clone().map(|s| s as Watch);
        let call = LeaseCall {
            key: &target.key,
            id: target.id,
            action: target.action,
            params: slot.params,
            now,
            watch: watch.as_ref(),
        };
        let answer = match store.lease(call).await {
            Ok(answer) => answer,
            Err(e) => {
                give_back(store, metrics, request, plans, &taken, now).await;
                return Err(e);
            }
        };
        if let Some(series) = &series {
            series.record(target.action, &answer);
        }
        slot.answer = Some(answer);
        match answer.outcome {
            LeaseOutcome::Taken => taken.slots.push((target.plan, target.key, target.id)),
            LeaseOutcome::Denied if !plan.shadow_mode => taken.blocked = true,
            _ => {}
        }
    }
    if taken.blocked {
        give_back(store, metrics, request, plans, &taken, now).await;
        taken.slots.clear();
    }
    Ok(taken)
}

/// Gives back the slots `taken` holds (the request was denied after all). Best effort: a release
/// that fails leaves its lease to expire.
pub(super) async fn give_back<B: Backend>(
    store: &Store<B>,
    metrics: Option<&Metrics>,
    request: &RateLimitRequest,
    plans: &[Plan<'_>],
    taken: &Taken<'_, B::Key>,
    now: Nanos,
) {
    for (index, key, id) in &taken.slots {
        let plan = &plans[*index];
        let (Kind::Concurrency(slot), Some(rule)) = (&plan.kind, plan.rule) else {
            continue;
        };
        let call = LeaseCall {
            key,
            id,
            action: LeaseAction::Release,
            params: slot.params,
            now,
            watch: None,
        };
        match store.lease(call).await {
            Ok(answer) => {
                if let Some(m) = metrics {
                    m.concurrency
                        .rule(&request.domain, rule)
                        .record(LeaseAction::Release, &answer);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "a denied request's slot was not given back; its lease will expire")
            }
        }
    }
}

/// The rate charges' verdicts without charging them (the request is denied for concurrency):
/// each counter's state as stored, evaluated at `now`.
pub(super) async fn uncharged<B: Backend>(
    store: &Store<B>,
    charges: &[Charge<B::Key>],
    now: Nanos,
) -> Result<Verdicts, StoreError> {
    let mut verdicts = Verdicts::new();
    for charge in charges {
        let state = store.peek(&charge.key).await?;
        let evaluation = limiter::evaluate(&charge.params, state, now, charge.hits);
        verdicts.push(Verdict {
            allowed: evaluation.allowed,
            outlook: evaluation.without_charge,
            remaining_before: evaluation.without_charge.remaining,
            charged: false,
            delay: 0,
            retry_after: evaluation.retry_after,
        });
    }
    Ok(verdicts)
}

/// A concurrency descriptor's status: over the limit when its acquisition was denied (unless in
/// shadow mode), the slots left, and when the soonest lease ends.
pub(super) fn status(slot: &Slot, shadow_mode: bool, now: Nanos) -> DescriptorStatus {
    let Some(answer) = slot.answer.filter(|_| slot.role == Role::Acquire) else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
    };
    let over = !answer.allowed() && !shadow_mode;
    let until_free = answer
        .next_end
        .filter(|_| answer.free(&slot.params) == 0)
        .map_or(0, |end| end.saturating_sub(now));
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            name: LIMIT_NAME.to_owned(),
            requests_per_unit: slot.params.max_in_flight,
            unit: ProtoUnit::Unknown as i32,
        }),
        limit_remaining: answer.free(&slot.params),
        duration_until_reset: Some(Duration {
            seconds: i64::try_from(reset_seconds(until_free)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        ..Default::default()
    }
}
