//! Counting a replay: per rule (by `Rule::id`, plus one `override` row per domain for request-
//! supplied limits) requests, allowed, denied, near-limit and shadow counts, the keys most often
//! denied, and requests per second of virtual time (for the busiest minute and the plot); per
//! run, the overall answers. With `--against`, what changed between the two rules sets, per
//! descriptor. Pure: the replay feeds it engine answers and times.

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use ratelimit_core::clock::{NANOS_PER_SECOND, Nanos};
use ratelimit_core::engine::Attribution;
use ratelimit_core::metrics::HitOutcome;

/// Requests of one rule in one second of virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bin {
    /// Unix second.
    pub(crate) second: u64,
    pub(crate) allowed: u32,
    pub(crate) denied: u32,
}

/// One rule's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RuleTally {
    /// Descriptors this rule decided.
    pub(crate) requests: u64,
    /// Within the limit (near-limit ones included), or an `unlimited` rule.
    pub(crate) allowed: u64,
    /// Over the limit (shadow-mode ones included: see `shadow`).
    pub(crate) denied: u64,
    /// Allowed, but past the near-limit ratio (0.8) of the limit, as the near_limit metric.
    pub(crate) near: u64,
    /// Denied by a shadow-mode rule, so let through.
    pub(crate) shadow: u64,
    /// Denials per key (`k=v,k2=v2`).
    pub(crate) denied_keys: HashMap<String, u64>,
    /// Per second with requests, in time order.
    pub(crate) seconds: Vec<Bin>,
}

/// `k=v,k2=v2` of a descriptor, into `out`.
pub(crate) fn key_text(descriptor: &RateLimitDescriptor, out: &mut String) {
    out.clear();
    for (i, e) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&e.key);
        out.push('=');
        out.push_str(&e.value);
    }
}

fn bump(map: &mut HashMap<String, u64>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

fn is_denied(outcome: Option<HitOutcome>) -> bool {
    matches!(outcome, Some(HitOutcome::Over | HitOutcome::OverShadowed))
}

impl RuleTally {
    fn count(&mut self, outcome: Option<HitOutcome>, now: Nanos, key: impl FnOnce() -> String) {
        self.requests += 1;
        let denied = is_denied(outcome);
        match outcome {
            None | Some(HitOutcome::Within) => self.allowed += 1,
            Some(HitOutcome::Near) => {
                self.allowed += 1;
                self.near += 1;
            }
            Some(HitOutcome::Over) => self.denied += 1,
            Some(HitOutcome::OverShadowed) => {
                self.denied += 1;
                self.shadow += 1;
            }
        }
        if denied {
            bump(&mut self.denied_keys, &key());
        }
        let second = now / NANOS_PER_SECOND;
        if self.seconds.last().is_none_or(|b| b.second != second) {
            self.seconds.push(Bin {
                second,
                allowed: 0,
                denied: 0,
            });
        }
        if let Some(bin) = self.seconds.last_mut() {
            if denied {
                bin.denied = bin.denied.saturating_add(1);
            } else {
                bin.allowed = bin.allowed.saturating_add(1);
            }
        }
    }

    /// The `n` keys most often denied, most first (ties by key).
    pub(crate) fn top_denied(&self, n: usize) -> Vec<(&str, u64)> {
        top(&self.denied_keys, n)
    }

    /// The UTC minute (its first Unix second) with the most requests, and how many; the earliest
    /// on ties.
    pub(crate) fn busiest_minute(&self) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        let mut current: Option<(u64, u64)> = None;
        // Bins are in time order, so each minute's bins are adjacent.
        for bin in &self.seconds {
            let minute = bin.second - bin.second % 60;
            let n = u64::from(bin.allowed) + u64::from(bin.denied);
            current = match current {
                Some((m, count)) if m == minute => Some((m, count + n)),
                done => {
                    best = more(best, done);
                    Some((minute, n))
                }
            };
        }
        more(best, current)
    }
}

/// The larger of two (minute, count), the earlier on ties (`a` is the earlier).
fn more(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some(x), Some(y)) if y.1 > x.1 => Some(y),
        (Some(x), _) => Some(x),
        (None, y) => y,
    }
}

/// The `n` largest counts, largest first, ties by key.
pub(crate) fn top(map: &HashMap<String, u64>, n: usize) -> Vec<(&str, u64)> {
    let mut all: Vec<(&str, u64)> = map.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    all.truncate(n);
    all
}

/// Overall answers of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) requests: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    /// Requests the engine refused (invalid: e.g. no domain, too many descriptors).
    pub(crate) refused: u64,
    /// Descriptors no rule matched (and no limit override): no limit, not per rule.
    pub(crate) unmatched: u64,
}

/// Everything counted for one rules set.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// By `Rule::id`.
    pub(crate) rules: Vec<RuleTally>,
    /// Request-supplied limits, per domain.
    pub(crate) overrides: HashMap<String, RuleTally>,
    pub(crate) totals: Totals,
    key: String,
}

impl Tally {
    pub(crate) fn new(rule_count: usize) -> Self {
        Tally {
            rules: vec![RuleTally::default(); rule_count],
            ..Default::default()
        }
    }

    /// Counts one decided request. `attribution` has one entry per descriptor of `descriptors`.
    pub(crate) fn record(
        &mut self,
        domain: &str,
        descriptors: &[RateLimitDescriptor],
        response: &RateLimitResponse,
        attribution: &[Attribution],
        now: Nanos,
    ) {
        self.totals.requests += 1;
        if response.overall_code == Code::OverLimit as i32 {
            self.totals.denied += 1;
        } else {
            self.totals.allowed += 1;
        }
        for (a, d) in attribution.iter().zip(descriptors) {
            let tally = match (a.rule, a.outcome) {
                (Some(id), _) => match self.rules.get_mut(id) {
                    Some(t) => t,
                    None => continue,
                },
                (None, Some(_)) => {
                    if !self.overrides.contains_key(domain) {
                        self.overrides
                            .insert(domain.to_owned(), RuleTally::default());
                    }
                    match self.overrides.get_mut(domain) {
                        Some(t) => t,
                        None => continue,
                    }
                }
                (None, None) => {
                    self.totals.unmatched += 1;
                    continue;
                }
            };
            let key = &mut self.key;
            tally.count(a.outcome, now, || {
                key_text(d, key);
                key.clone()
            });
        }
    }

    /// Counts a request the engine refused.
    pub(crate) fn refused(&mut self) {
        self.totals.requests += 1;
        self.totals.refused += 1;
    }
}

/// Where a descriptor's decision is reported: a rule's (domain, path), or (domain, `override`).
pub(crate) type RuleName = (String, String);

/// What changed for one rule between the two rules sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RuleDiff {
    /// Descriptors denied after but not before.
    pub(crate) newly_denied: u64,
    /// Descriptors denied before but not after.
    pub(crate) freed: u64,
    pub(crate) newly_limited_keys: HashMap<String, u64>,
    pub(crate) freed_keys: HashMap<String, u64>,
}

/// What changed between `before` and `after` over the same requests.
#[derive(Debug, Default)]
pub struct DiffTally {
    /// Requests answered OK before and OVER_LIMIT after.
    pub(crate) ok_to_over: u64,
    /// Requests answered OVER_LIMIT before and OK after.
    pub(crate) over_to_ok: u64,
    /// Only rules with a change.
    pub(crate) rules: HashMap<RuleName, RuleDiff>,
    key: String,
}

impl DiffTally {
    /// Compares one request's two answers. `name_before`/`name_after` give a descriptor's rule
    /// name on each side (None: no rule and no override); a change is reported under the rule
    /// that decided it after (or before, if none did after).
    pub fn record<'n>(
        &mut self,
        descriptors: &[RateLimitDescriptor],
        before: (&RateLimitResponse, &[Attribution]),
        after: (&RateLimitResponse, &[Attribution]),
        name_before: impl Fn(&Attribution) -> Option<(&'n str, &'n str)>,
        name_after: impl Fn(&Attribution) -> Option<(&'n str, &'n str)>,
    ) {
        let over = |r: &RateLimitResponse| r.overall_code == Code::OverLimit as i32;
        match (over(before.0), over(after.0)) {
            (false, true) => self.ok_to_over += 1,
            (true, false) => self.over_to_ok += 1,
            _ => {}
        }
        for ((b, a), d) in before.1.iter().zip(after.1).zip(descriptors) {
            let (was, is) = (is_denied(b.outcome), is_denied(a.outcome));
            if was == is {
                continue;
            }
            let Some((domain, path)) = name_after(a).or_else(|| name_before(b)) else {
                continue;
            };
            let name = (domain.to_owned(), path.to_owned());
            let row = self.rules.entry(name).or_default();
            key_text(d, &mut self.key);
            if is {
                row.newly_denied += 1;
                bump(&mut row.newly_limited_keys, &self.key);
            } else {
                row.freed += 1;
                bump(&mut row.freed_keys, &self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    const S: Nanos = NANOS_PER_SECOND;

    fn descriptor(k: &str, v: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: k.into(),
                value: v.into(),
            }],
            ..Default::default()
        }
    }

    fn response(over: bool) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            ..Default::default()
        }
    }

    fn at(rule: Option<usize>, outcome: Option<HitOutcome>) -> Attribution {
        Attribution {
            rule,
            outcome,
            hits: 1,
        }
    }

    #[test]
    fn counts_outcomes_per_rule_and_keys_denied() {
        let mut t = Tally::new(2);
        let d = [descriptor("ip", "a"), descriptor("ip", "b")];
        let outcomes = [
            Some(HitOutcome::Within),
            Some(HitOutcome::Near),
            Some(HitOutcome::Over),
            Some(HitOutcome::OverShadowed),
            None,
        ];
        for (i, o) in outcomes.into_iter().enumerate() {
            t.record(
                "edge",
                &d[i % 2..i % 2 + 1],
                &response(o == Some(HitOutcome::Over)),
                &[at(Some(1), o)],
                i as u64 * S,
            );
        }
        t.record("edge", &d[..1], &response(false), &[at(None, None)], 0);
        t.record(
            "edge",
            &d[..1],
            &response(true),
            &[at(None, Some(HitOutcome::Over))],
            0,
        );
        let r = &t.rules[1];
        assert_eq!(
            (r.requests, r.allowed, r.denied, r.near, r.shadow),
            (5, 3, 2, 1, 1)
        );
        assert_eq!(r.top_denied(10), [("ip=a", 1), ("ip=b", 1)]);
        assert_eq!(t.rules[0], RuleTally::default());
        assert_eq!(t.overrides["edge"].denied, 1);
        assert_eq!(
            t.totals,
            Totals {
                requests: 7,
                allowed: 5,
                denied: 2,
                refused: 0,
                unmatched: 1
            }
        );
    }

    #[test]
    fn the_busiest_minute_is_the_minute_with_most_requests() {
        let mut t = RuleTally::default();
        let minute = 1_796_101_200;
        // 3 in the first minute, 4 spread over the second (two seconds), 4 in the third: the
        // second wins the tie by being earlier.
        for s in [0, 1, 59, 60, 60, 119, 119, 120, 121, 122, 179] {
            t.count(Some(HitOutcome::Within), (minute + s) * S, String::new);
        }
        assert_eq!(t.busiest_minute(), Some((minute + 60, 4)));
        assert_eq!(t.seconds.len(), 9);
        assert_eq!(RuleTally::default().busiest_minute(), None);
    }

    #[test]
    fn top_keys_are_most_first_then_by_key() {
        let map: HashMap<String, u64> = [("b", 2), ("a", 2), ("c", 5), ("d", 1)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(top(&map, 3), [("c", 5), ("a", 2), ("b", 2)]);
    }

    #[test]
    fn a_diff_counts_newly_denied_and_freed_keys_under_the_deciding_rule() {
        let mut diff = DiffTally::default();
        let d = [descriptor("ip", "a")];
        let name = |a: &Attribution| a.rule.map(|_| ("edge", "ip"));
        let over = Some(HitOutcome::Over);
        let within = Some(HitOutcome::Within);
        let cases = [
            (within, over),
            (within, over),
            (over, within),
            (over, over),
            (within, within),
        ];
        for (b, a) in cases {
            diff.record(
                &d,
                (&response(b == over), &[at(Some(0), b)]),
                (&response(a == over), &[at(Some(0), a)]),
                name,
                name,
            );
        }
        assert_eq!((diff.ok_to_over, diff.over_to_ok), (2, 1));
        let row = &diff.rules[&("edge".to_owned(), "ip".to_owned())];
        assert_eq!((row.newly_denied, row.freed), (2, 1));
        assert_eq!(row.newly_limited_keys["ip=a"], 2);
        assert_eq!(row.freed_keys["ip=a"], 1);
        assert_eq!(diff.rules.len(), 1);
    }
}
