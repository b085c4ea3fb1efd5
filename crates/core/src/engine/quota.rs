//! The engine's part in RLQS: an RLQS bucket read on the live rules (`quota::map_bucket` with the
//! server's defaults and `SHADOW_MODE`), and a usage report counted in the governing rule's
//! per-rule series, so the dashboards of ShouldRateLimit count RLQS traffic too.

use std::sync::Arc;

use super::Engine;
use crate::metrics::{HitOutcome, HitSplit};
use crate::policy::Policy;
use crate::quota::{Mapping, map_bucket};
use crate::store::Backend;

impl<B: Backend> Engine<B> {
    /// Reads an RLQS bucket (entries in any order) in `domain` on the live rules; returns the
    /// snapshot it was read on as well.
    pub fn map_bucket(&self, domain: &str, bucket: &[(String, String)]) -> (Arc<Policy>, Mapping) {
        let policy = self.policy();
        let mapping = map_bucket(
            &policy,
            domain,
            bucket,
            &self.settings().defaults,
            self.settings().shadow_mode,
        );
        (policy, mapping)
    }

    /// Notes a new RLQS bucket in `domain`, which has no rules (warned of once per domain, as
    /// ShouldRateLimit's calls are).
    pub fn quota_domain_not_found(&self, domain: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.quota_domain_not_found(domain);
        }
    }

    /// Counts one report of a bucket whose (ordered) descriptor is `descriptor`: `allowed` as
    /// within the limit but `shadow_over` of them as over and shadowed, `denied` as over.
    pub fn record_quota_usage(
        &self,
        domain: &str,
        descriptor: &[(String, String)],
        allowed: u64,
        denied: u64,
        shadow_over: u64,
    ) {
        let live = self.live.load();
        let Some(rule) = live.policy.domain(domain).and_then(|rules| {
            rules.rule_for(descriptor.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }) else {
            return;
        };
        let Some(series) = live.counters.rule(domain, rule) else {
            return;
        };
        let entries = || descriptor.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let shadow_over = shadow_over.min(allowed);
        for (outcome, hits) in [
            (HitOutcome::Within, allowed - shadow_over),
            (HitOutcome::OverShadowed, shadow_over),
            (HitOutcome::Over, denied),
        ] {
            if hits > 0 {
                series.record(HitSplit::whole(outcome, hits), entries());
            }
        }
    }
}
