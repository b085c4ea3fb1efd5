//! What each descriptor of a request will be checked against: the matched rule's limits (or the
//! request's override, or an override set through the quota API, which wins over both), minus
//! replaced ones, with the hits to charge.

use std::collections::HashSet;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use smallvec::{SmallVec, smallvec};

use super::{EngineSettings, InvalidRequest};
use crate::clock::Nanos;
use crate::config::Unit;
use crate::lease::{LeaseAnswer, LeaseParams};
use crate::limiter::{LimitDefaults, LimitParams};
use crate::overrides::{Override, Overrides};
use crate::policy::{DomainRules, Outcome, Policy, Rule, RuleKind};
use crate::store::{CounterId, Entries};

/// One limit a descriptor is checked against.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlannedLimit<'p> {
    pub(crate) name: &'p str,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Unit,
    pub(crate) params: LimitParams,
    /// Position in the rule's limit list: part of the store key.
    pub(crate) slot: usize,
    /// The quota policy it is advertised as in the IETF fields (None: not advertised).
    pub(crate) policy: Option<&'p str>,
}

/// The policy name of a limit that a request sets itself (`descriptor.limit`, Envoy's override).
pub(super) const OVERRIDE_POLICY: &str = "override";

/// A rule's limits: inline up to two (most rules have one), so planning allocates nothing.
pub(super) type PlannedLimits<'p> = SmallVec<[PlannedLimit<'p>; 2]>;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind<'p> {
    /// Unmatched, whitelisted, empty, unknown domain, or replaced.
    NoLimit,
    Unlimited,
    Limited(PlannedLimits<'p>),
    /// A concurrency rule's descriptor (see `concurrency`).
    Concurrency(Slot),
}

/// What a request asks of a concurrency rule, told by the entries after the rule's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The rule's entries alone (`/explain`): look at the slots.
    Look,
    /// Then the request id: take a slot for it (the request-time call).
    Acquire,
    /// Then the request id and the release marker: give its slot back (the stream-done call).
    Release,
}

/// A concurrency descriptor: its rule's numbers, what the request asks, and the store's answer
/// once it has one.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Slot {
    pub(crate) params: LeaseParams,
    pub(crate) role: Role,
    /// How many entries are the rule's own (the concurrency key's); the request id follows.
    pub(crate) depth: usize,
    pub(crate) answer: Option<LeaseAnswer>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan<'p> {
    pub(crate) kind: Kind<'p>,
    pub(crate) hits: u64,
    pub(crate) shadow_mode: bool,
    /// `quota_mode` (the rule's, or the server's `QUOTA_MODE`).
    pub(crate) quota: bool,
    /// The matched rule (None for request overrides and unmatched descriptors).
    pub(crate) rule: Option<&'p Rule>,
    /// How the descriptor's lookup ended, for the counts of descriptors nothing matched.
    pub(crate) lookup: Lookup,
    /// Whether an override set through the quota API replaced the rule's limits.
    pub(crate) overridden: bool,
}

/// What a descriptor that matched no rule may nearly match, as the rules' digests tell (cheap,
/// with rare false positives): the looks and warnings are `metrics`'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nearly {
    Nothing,
    /// Its keys are, in another order, a rule's path (`DomainRules::may_match_reordered`).
    AnotherOrder,
    /// Its first keys are the path of a rule without nested descriptors, and it goes on
    /// (`DomainRules::may_be_longer_than_a_rule`).
    LongerThanARule,
}

/// How a descriptor's lookup in the rules ended, as far as the unmatched counts care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A rule, a whitelisting entry, a request override, or nothing to look up (no entries).
    Found,
    /// The domain is known and no entry of the rules matched the descriptor; what it may nearly
    /// match, to be looked into off the decision's path.
    NoRule(Nearly),
    /// The request's domain has no rules (the reference's `domain_not_found`).
    UnknownDomain,
}

impl<'p> Plan<'p> {
    /// A descriptor that meets no limit (yet), charging `hits`; `quota`: the server's `QUOTA_MODE`.
    pub(crate) fn new(hits: u64, quota: bool) -> Self {
        Plan {
            kind: Kind::NoLimit,
            hits,
            shadow_mode: false,
            quota,
            rule: None,
            lookup: Lookup::Found,
            overridden: false,
        }
    }

    /// The rule whose `share_threshold` patterns stand for values in the counter's key: none once
    /// an override (set for exactly these entries) applies.
    pub(crate) fn sharing(&self) -> Option<&'p Rule> {
        self.rule.filter(|_| !self.overridden)
    }

    pub(crate) fn limits(&self) -> &[PlannedLimit<'p>] {
        match &self.kind {
            Kind::Limited(limits) => limits,
            _ => &[],
        }
    }
}

fn override_unit(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

/// The most hits one descriptor charges: more than any limit (`u32` per unit, or burst) can allow,
/// so a larger `hits_addend` gets the same answer (over the limit), and counts as this many in the
/// per-rule metrics (which therefore cannot overflow in fewer than 2^32 requests).
pub(super) const MAX_HITS: u64 = 1 << 32;

/// One plan per descriptor: inline up to two (most requests have one or two descriptors).
pub(super) type Plans<'p> = SmallVec<[Plan<'p>; 2]>;

pub(super) fn plan<'p>(
    policy: &'p Policy,
    overrides: &'p Overrides,
    request: &RateLimitRequest,
    settings: &EngineSettings,
    now: Nanos,
) -> Result<Plans<'p>, InvalidRequest> {
    let defaults = &settings.defaults;
    let request_hits = u64::from(request.hits_addend.max(1));
    let domain = policy.domain(&request.domain);
    let mut plans = Plans::with_capacity(request.descriptors.len());
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let hits = descriptor
            .hits_addend
            .map_or(request_hits, |h| h.value)
            .min(MAX_HITS);
        let mut plan = Plan::new(hits, settings.quota_mode);
        if !overrides.is_empty() && !descriptor.entries.is_empty() {
            let entries = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()));
            if let Some(set) = overrides.find(&request.domain, entries.clone(), now) {
                if let Some(domain) = domain {
                    matched(domain, entries, &mut plan, defaults);
                }
                override_limits(&mut plan, set, defaults);
                plans.push(plan);
                continue;
            }
        }
        let Some(domain) = domain else {
            plan.lookup = Lookup::UnknownDomain;
            plans.push(plan);
            continue;
        };
        if descriptor.entries.is_empty() {
            plans.push(plan);
            continue;
        }
        if let Some(limit) = &descriptor.limit {
            let unit =
                override_unit(limit.unit).ok_or(InvalidRequest::OverrideWithoutUnit { index })?;
            let period = unit.seconds() * crate::clock::NANOS_PER_SECOND;
            plan.kind = Kind::Limited(smallvec![PlannedLimit {
                name: "",
                requests_per_unit: limit.requests_per_unit,
                unit,
                params: LimitParams {
                    algorithm: defaults.algorithm,
                    requests_per_unit: limit.requests_per_unit,
                    period,
                    burst: limit.requests_per_unit,
                    max_delay: defaults.max_delay,
                    charge_denied: defaults.charges_denied(defaults.algorithm),
                },
                slot: 0,
                policy: Some(OVERRIDE_POLICY),
            }]);
            plans.push(plan);
            continue;
        }
        let entries = descriptor
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()));
        if let Outcome::Unmatched = matched(domain, entries, &mut plan, defaults) {
            plan.lookup = Lookup::NoRule(nearly(domain, descriptor));
        }
        if let Kind::Concurrency(slot) = &mut plan.kind {
            match super::concurrency::role(&descriptor.entries, slot.depth) {
                Some(role) => slot.role = role,
                None => plan.kind = Kind::NoLimit,
            }
        }
        plans.push(plan);
    }
    drop_replaced(&mut plans, settings.quota_mode);
    Ok(plans)
}

/// What `descriptor`, which matched none of `rules`, may nearly match.
fn nearly(rules: &DomainRules, descriptor: &RateLimitDescriptor) -> Nearly {
    let keys = || descriptor.entries.iter().map(|e| e.key.as_str());
    if descriptor.entries.len() < 2 {
        Nearly::Nothing
    } else if rules.may_match_reordered(keys()) {
        Nearly::AnotherOrder
    } else if rules.may_be_longer_than_a_rule(keys()) {
        Nearly::LongerThanARule
    } else {
        Nearly::Nothing
    }
}

/// Matches a descriptor's `entries` on its domain's `rules` and, if they end on a rule, plans its
/// limits into `plan` (its shadow and quota mode, each limit's numbers under `defaults`, its
/// slot). Returns how the match ended. The one match a descriptor gets: decisions ([`plan`]) and
/// `/explain` both plan here.
pub(super) fn matched<'p, 'e>(
    rules: &'p DomainRules,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    plan: &mut Plan<'p>,
    defaults: &LimitDefaults,
) -> Outcome<'p> {
    let outcome = rules.walk(entries, |_| {});
    let Outcome::Rule(rule) = outcome else {
        return outcome;
    };
    plan.rule = Some(rule);
    plan.shadow_mode = rule.shadow_mode;
    plan.quota |= rule.quota_mode;
    plan.kind = match &rule.kind {
        RuleKind::Unlimited { .. } => Kind::Unlimited,
        RuleKind::Limited(limits) => Kind::Limited(
            limits
                .iter()
                .enumerate()
                .map(|(slot, l)| PlannedLimit {
                    name: l.limit.name.as_deref().unwrap_or(""),
                    requests_per_unit: l.limit.requests_per_unit,
                    unit: l.limit.unit,
                    params: l.params(defaults),
                    slot,
                    policy: l.policy.as_deref(),
                })
                .collect(),
        ),
        RuleKind::Concurrency(spec) => {
            plan.quota = false;
            Kind::Concurrency(Slot {
                params: LeaseParams::of(spec),
                role: Role::Look,
                depth: rule.depth(),
                answer: None,
            })
        }
    };
    outcome
}

/// Puts an override's limit in place of what the rules planned (`plan` keeps the matched rule, if
/// any, for its shadow and quota mode and its metrics). It counts on the counter of the rule's
/// first limit when that limit has the same algorithm and window (slot 0, same algorithm and
/// period: the same key), so raising a tenant's limit keeps what it used; its algorithm is that
/// limit's, else the server's default.
pub(super) fn override_limits<'p>(plan: &mut Plan<'p>, set: &Override, defaults: &LimitDefaults) {
    let first = plan.limits().first().map(|l| l.params);
    let algorithm = first.map_or(defaults.algorithm, |p| p.algorithm);
    let params = LimitParams {
        algorithm,
        requests_per_unit: set.requests_per_unit,
        period: set.period(),
        burst: set.requests_per_unit,
        max_delay: first.map_or(defaults.max_delay, |p| p.max_delay),
        charge_denied: defaults.charges_denied(algorithm),
    };
    plan.kind = Kind::Limited(smallvec![PlannedLimit {
        name: "",
        requests_per_unit: set.requests_per_unit,
        unit: set.unit.0,
        params,
        slot: 0,
        policy: Some(OVERRIDE_POLICY),
    }]);
    plan.overridden = true;
}

/// The counter `limit` of a descriptor (its `entries`, planned as `plan`) charges: the entries as
/// they count, a `share_threshold` wildcard's pattern standing for the value (one counter for
/// every value it matches). The one place a counter's identity is made: decisions and `/explain`
/// both take it from here.
pub(super) fn counter<'a>(
    domain: &'a str,
    entries: impl Into<Entries<'a>>,
    rule: Option<&'a Rule>,
    slot: usize,
    params: &LimitParams,
) -> CounterId<'a> {
    let shared = rule.map_or(&[][..], |r| &r.shared[..]);
    CounterId::new(domain, entries.into().sharing(shared), slot, params)
}

/// Removes every matched limit named in some matched rule's `replaces`, as the reference's
/// `constructLimitsToCheck` does: an `unlimited` rule is set aside first, so it stays unlimited
/// even when named (its own `replaces` still apply); a descriptor left with no limit is no longer
/// a `quota_mode` descriptor (its rule's mode went with the limit), unless `QUOTA_MODE`
/// (`global_quota`) makes every descriptor one.
fn drop_replaced(plans: &mut [Plan<'_>], global_quota: bool) {
    let replaced: HashSet<&str> = plans
        .iter()
        .filter_map(|p| p.rule)
        .flat_map(Rule::replaces)
        .collect();
    if replaced.is_empty() {
        return;
    }
    for plan in plans.iter_mut() {
        if let Kind::Limited(limits) = &mut plan.kind {
            limits.retain(|l| l.name.is_empty() || !replaced.contains(l.name));
            if limits.is_empty() {
                plan.kind = Kind::NoLimit;
                // The reference's `isQuotaMode`: `globalQuotaMode || (limit != nil &&
                // limit.QuotaMode)`, the limit here being nil.
                plan.quota = global_quota;
            }
        }
    }
}
