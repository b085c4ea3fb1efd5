//! What one descriptor meets on the live rules, charging nothing: the rule it matches, and for
//! each of the rule's limits the state of the very counter a decision would charge (the same
//! `plan::counter`, so a `share_threshold` rule shows its shared counter). `/explain` and
//! `explain --server` render this.

use std::sync::Arc;

use super::{Engine, plan};
use crate::limiter::{self, LimitParams, Outlook, State};
use crate::policy::{Outcome, Policy, Rule, RuleKind};
use crate::store::{Backend, StoreError};

/// A descriptor's fate on the live rules.
#[derive(Debug)]
pub enum Explained {
    UnknownDomain,
    /// No rule matches the descriptor.
    Unmatched,
    /// The descriptor ends on a node with no limit.
    NoLimit,
    Unlimited {
        rule: String,
        shadow_mode: bool,
    },
    Limited {
        rule: String,
        shadow_mode: bool,
        limits: Vec<ExplainedLimit>,
    },
}

/// One limit of the matched rule, and its counter now.
#[derive(Debug)]
pub struct ExplainedLimit {
    /// The limit's position in the rule's list.
    pub slot: usize,
    pub params: LimitParams,
    pub state: Option<State>,
    /// What a request with no hits would see now.
    pub outlook: Outlook,
}

impl<B: Backend> Engine<B> {
    /// Explains `entries` (a descriptor) in `domain` at `now` on `policy` (hold the snapshot the
    /// answer refers to; see [`Engine::policy`]). Returns the rule it matched (if any) as well.
    pub async fn explain<'p>(
        &self,
        policy: &'p Arc<Policy>,
        domain: &str,
        entries: &[(String, String)],
        now: crate::clock::Nanos,
    ) -> Result<(Explained, Option<&'p Rule>), StoreError> {
        let Some(rules) = policy.domain(domain) else {
            return Ok((Explained::UnknownDomain, None));
        };
        let pairs = || entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let rule = match rules.walk(pairs(), |_| {}) {
            Outcome::Rule(rule) => rule,
            Outcome::NoLimitOnNode => return Ok((Explained::NoLimit, None)),
            Outcome::Unmatched => return Ok((Explained::Unmatched, None)),
        };
        let RuleKind::Limited(limits) = &rule.kind else {
            let explained = Explained::Unlimited {
                rule: rule.path.clone(),
                shadow_mode: rule.shadow_mode,
            };
            return Ok((explained, Some(rule)));
        };
        let defaults = self.settings().defaults;
        let mut explained = Vec::with_capacity(limits.len());
        for (slot, limit) in limits.iter().enumerate() {
            let params = limit.params(&defaults);
            let counter = plan::counter(domain, entries, Some(rule), slot, &params);
            let state = self.look(&counter).await?;
            explained.push(ExplainedLimit {
                slot,
                params,
                state,
                outlook: limiter::evaluate(&params, state, now, 0).without_charge,
            });
        }
        let explained = Explained::Limited {
            rule: rule.path.clone(),
            shadow_mode: rule.shadow_mode,
            limits: explained,
        };
        Ok((explained, Some(rule)))
    }
}
