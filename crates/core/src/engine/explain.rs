//! What one descriptor meets on the live rules, charging nothing: the descriptor is planned as a
//! decision plans it (`plan::matched`: the same match, the same limits and numbers, the same
//! `plan::counter`, so a `share_threshold` rule shows its shared counter), and each planned limit's
//! counter is read. An override set through the quota API shows as such, with its limit. The answer is the `/explain` JSON's typed form ([`wire::explain`]), which the
//! admin port serves and `explain --server` reads.
//!
//! [`wire::explain`]: crate::wire::explain

use super::{Engine, plan};
use crate::clock::Nanos;
use crate::config::{Algorithm, Limit, PolicyName};
use crate::lease::{LeaseAction, Watch};
use crate::limiter::{self, human};
use crate::overrides::Override;
use crate::policy::{Outcome, Rule, RuleKind};
use crate::store::{Backend, Entries, LeaseCall, StoreError, concurrency_counter};
use crate::wire::explain::{Explained, ExplainedLimit, StoredState};

impl<B: Backend> Engine<B> {
    /// Explains `entries` (a descriptor) in `domain` at `now` on the live rules: the rule it
    /// matches and, per limit of that rule, the numbers a decision uses and the state of the
    /// counter it charges. A request's `replaces` (which acts between the descriptors of one
    /// request) does not apply to one descriptor asked about alone.
    pub async fn explain(
        &self,
        domain: &str,
        entries: &[(String, String)],
        now: Nanos,
    ) -> Result<Explained, StoreError> {
        let policy = self.policy();
        let overrides = self.overrides();
        let pairs = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        if let Some(set) = overrides.find(domain, pairs.clone(), now) {
            return self.explain_override(domain, entries, set, now).await;
        }
        let Some(rules) = policy.domain(domain) else {
            return Ok(Explained::UnknownDomain);
        };
        let mut planned = plan::Plan::new(0, self.settings.quota_mode);
        let rule = match plan::matched(rules, pairs, &mut planned, &self.settings.defaults) {
            Outcome::Rule(rule) => rule,
            Outcome::NoLimitOnNode => return Ok(Explained::NoLimit),
            Outcome::Unmatched => return Ok(Explained::Unmatched),
        };
        if let plan::Kind::Concurrency(slot) = &planned.kind {
            return self
                .explain_slots(domain, entries, rule, slot, planned.shadow_mode, now)
                .await;
        }
        let plan::Kind::Limited(limits) = &planned.kind else {
            return Ok(Explained::Unlimited {
                rule: rule.path.clone(),
                shadow_mode: planned.shadow_mode,
            });
        };
        let mut explained = Vec::with_capacity(limits.len());
        for limit in limits {
            let Some(configured) = configured(rule, limit.slot) else {
                continue;
            };
            let counter = plan::counter(domain, entries, planned.rule, limit.slot, &limit.params);
            let state = self.look(&counter).await?;
            explained.push(explain_limit(limit, configured, state, now));
        }
        Ok(Explained::Limited {
            rule: rule.path.clone(),
            shadow_mode: planned.shadow_mode,
            limits: explained,
        })
    }
}

impl<B: Backend> Engine<B> {
    /// A concurrency rule's slots for the key of `entries` (its first `slot.depth`), read with a
    /// look that changes nothing but dropping ended leases.
    async fn explain_slots(
        &self,
        domain: &str,
        entries: &[(String, String)],
        rule: &Rule,
        slot: &plan::Slot,
        shadow_mode: bool,
        now: Nanos,
    ) -> Result<Explained, StoreError> {
        let own = &entries[..slot.depth.min(entries.len())];
        let counted = Entries::from(own).sharing(&rule.shared);
        let key = self.store.key(&concurrency_counter(domain, counted));
        let series = self
            .metrics
            .as_ref()
            .map(|m| m.concurrency.rule(domain, rule));
        let watch: Option<Watch> = series.clone().map(|s| s as Watch);
        let answer = self
            .store
            .lease(LeaseCall {
                key: &key,
                id: "",
                action: LeaseAction::Peek,
                params: slot.params,
                now,
                watch: watch.as_ref(),
            })
            .await?;
        if let Some(series) = &series {
            series.record(LeaseAction::Peek, &answer);
        }
        Ok(Explained::Concurrency {
            rule: rule.path.clone(),
            shadow_mode,
            max_in_flight: slot.params.max_in_flight,
            lease: human(slot.params.lease),
            in_use: answer.in_use,
            free: answer.free(&slot.params),
            next_lease_end: answer.next_end.map(|end| human(end.saturating_sub(now))),
        })
    }

    /// [`Engine::explain`] of a descriptor an override applies to: planned as a decision plans
    /// it (`plan::override_limits` over the rule it matches, if any), its counter read.
    async fn explain_override(
        &self,
        domain: &str,
        entries: &[(String, String)],
        set: &Override,
        now: Nanos,
    ) -> Result<Explained, StoreError> {
        let policy = self.policy();
        let mut planned = plan::Plan::new(0, self.settings.quota_mode);
        if let Some(rules) = policy.domain(domain) {
            let pairs = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            plan::matched(rules, pairs, &mut planned, &self.settings.defaults);
        }
        plan::override_limits(&mut planned, set, &self.settings.defaults);
        let mut limits = Vec::new();
        for limit in planned.limits() {
            let counter = plan::counter(
                domain,
                entries,
                planned.sharing(),
                limit.slot,
                &limit.params,
            );
            let state = self.look(&counter).await?;
            let configured = Limit {
                name: None,
                requests_per_unit: set.requests_per_unit,
                unit: set.unit.0,
                unit_multiplier: 1,
                algorithm: Some(limit.params.algorithm),
                burst: None,
                max_delay: None,
                calendar: None,
                policy: PolicyName::Named(plan::OVERRIDE_POLICY.to_owned()),
                replaces: Vec::new(),
            };
            limits.push(explain_limit(limit, &configured, state, now));
        }
        Ok(Explained::Overridden {
            rule: planned.rule.map(|r| r.path.clone()),
            shadow_mode: planned.shadow_mode,
            limits,
            expires_in_seconds: set.seconds_left(now),
        })
    }
}

/// The rules file's limit at `slot` of `rule` (for what the plan does not carry: the multiplier,
/// whether the algorithm is the server's default).
fn configured(rule: &Rule, slot: usize) -> Option<&Limit> {
    match &rule.kind {
        RuleKind::Limited(limits) => limits.get(slot).map(|l| &l.limit),
        RuleKind::Unlimited { .. } | RuleKind::Concurrency(_) => None,
    }
}

/// One planned limit and its counter's `state` at `now`, in words and numbers.
fn explain_limit(
    limit: &plan::PlannedLimit<'_>,
    configured: &Limit,
    state: Option<limiter::State>,
    now: Nanos,
) -> ExplainedLimit {
    let params = &limit.params;
    let outlook = limiter::evaluate(params, state, now, 0).without_charge;
    ExplainedLimit {
        name: configured.name.clone(),
        algorithm: params.algorithm.name().into(),
        algorithm_is_default: configured.algorithm.is_none(),
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.name().into(),
        unit_multiplier: configured.unit_multiplier,
        window: params.window(),
        burst: params.burst,
        effective: params.describe(),
        remaining: outlook.remaining,
        reset_after: human(outlook.reset_after),
        reset_after_ns: outlook.reset_after,
        state: state.map(|s| StoredState { a: s.a, b: s.b }),
        state_meaning: params.describe_state(state.as_ref(), now),
        max_delay: (params.algorithm == Algorithm::LeakyBucket).then(|| human(params.max_delay)),
    }
}
