//! The quota API's view of counters, planned as decisions plan them (`plan::matched`,
//! `plan::override_limits`, `plan::counter`): the keys a descriptor's decision charges (what a
//! reset clears), and the limit that counts on a counter found in the store (a listing's item).

use super::{Engine, plan};
use crate::clock::Nanos;
use crate::config::{Algorithm, Unit};
use crate::limiter::LimitParams;
use crate::store::Backend;

/// The limit that counts on a counter now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterLimit {
    pub params: LimitParams,
    pub unit: Unit,
    /// An override set through the quota API, not the rules.
    pub overridden: bool,
}

impl<B: Backend> Engine<B> {
    /// Plans `entries` of `domain` at `now` as a decision would, into `plan`; with `overrides`
    /// false, as if no override were set.
    fn plan_descriptor<'p>(
        &self,
        policy: &'p crate::policy::Policy,
        overrides: Option<&'p crate::overrides::Overrides>,
        domain: &str,
        entries: &[(String, String)],
        now: Nanos,
    ) -> plan::Plan<'p> {
        let mut planned = plan::Plan::new(0, self.settings.quota_mode);
        let pairs = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        if let Some(rules) = policy.domain(domain) {
            plan::matched(rules, pairs.clone(), &mut planned, &self.settings.defaults);
        }
        if let Some(set) = overrides.and_then(|o| o.find(domain, pairs, now)) {
            plan::override_limits(&mut planned, set, &self.settings.defaults);
        }
        planned
    }

    /// The keys a decision on `entries` charges at `now`, and those it charges once no override
    /// applies (the rule's own): what a reset of the descriptor clears. Without duplicates.
    pub fn descriptor_keys(
        &self,
        domain: &str,
        entries: &[(String, String)],
        now: Nanos,
    ) -> Vec<B::Key> {
        let policy = self.policy();
        let overrides = self.overrides();
        let mut keys: Vec<B::Key> = Vec::new();
        for with_overrides in [true, false] {
            let set = with_overrides.then_some(&*overrides);
            let planned = self.plan_descriptor(&policy, set, domain, entries, now);
            for limit in planned.limits() {
                let counter = plan::counter(
                    domain,
                    entries,
                    planned.sharing(),
                    limit.slot,
                    &limit.params,
                );
                let key = self.store.key(&counter);
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        keys
    }

    /// The limit that counts at `now` on the counter of `entries` (as counted) of `domain` that is
    /// limit `slot` of its rule with this `algorithm` and `period`: the override's, or the matched
    /// rule's. `None` when none does any more (the rules changed; the counter runs out unused).
    pub fn counter_limit(
        &self,
        domain: &str,
        entries: &[(String, String)],
        slot: usize,
        algorithm: Algorithm,
        period: Nanos,
        now: Nanos,
    ) -> Option<CounterLimit> {
        let policy = self.policy();
        let overrides = self.overrides();
        let planned = self.plan_descriptor(&policy, Some(&overrides), domain, entries, now);
        let found = planned.limits().iter().find(|l| {
            l.slot == slot && l.params.algorithm == algorithm && l.params.period == period
        })?;
        Some(CounterLimit {
            params: found.params,
            unit: found.unit,
            overridden: planned.overridden,
        })
    }
}
