//! The per-rule series of one policy: a slot per rule (by `Rule::id`) and per domain (for request
//! overrides) that is filled on the rule's first hit, so a rule no request has hit costs no series.
//! A new policy's table takes over the filled slots of rules it keeps (same domain and path), so
//! their counts carry on across reloads, and simply lacks the others: the series of a removed rule
//! vanish with the old table. `detailed_metric` rules keep one series per distinct (bounded) label,
//! at most `DETAILED_METRICS_CAP` across the server, released when the rule goes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use prometheus::{IntCounter, IntCounterVec};

use super::label;
use super::series::{Counts, HitSplit};
use super::stat_name::sanitize_stat_name;
use crate::policy::{Policy, Rule};

/// Where a `detailed_metric` rule counts hits past the cap: `<rule path>_overflow`.
pub(crate) const OVERFLOW_SUFFIX: &str = "_overflow";
/// The `rule` label of request-supplied limit overrides.
pub const OVERRIDE_RULE: &str = "override";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data whole (a push or an insert), so a poisoned lock is
    // still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many detailed series exist, server-wide, against the cap.
#[derive(Debug)]
pub(crate) struct DetailedBudget {
    cap: usize,
    live: AtomicUsize,
}

impl DetailedBudget {
    pub(crate) fn new(cap: usize) -> Self {
        DetailedBudget {
            cap,
            live: AtomicUsize::new(0),
        }
    }

    fn try_take(&self) -> bool {
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.live.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The series of a `detailed_metric` rule: one per distinct request label, then the overflow one.
#[derive(Debug)]
struct Detailed {
    /// How the label is made: (detailed_metric, per entry: value_to_metric, segment, shared).
    shape: LabelShape,
    by_label: Mutex<HashMap<String, Arc<Counts>>>,
    overflow: OnceLock<Counts>,
    budget: Arc<DetailedBudget>,
}

impl Drop for Detailed {
    fn drop(&mut self) {
        let held = lock(&self.by_label).len();
        self.budget.give_back(held);
    }
}

/// How a rule's per-request label is made, as the reference names its stats keys.
#[derive(Debug, PartialEq, Eq)]
struct LabelShape {
    /// `detailed_metric`: every entry's value (a `share_threshold` entry's pattern).
    detailed: bool,
    /// Per entry: (value_to_metric, the node's segment, matched by a share_threshold wildcard).
    levels: Vec<(bool, String, bool)>,
}

impl LabelShape {
    /// The shape of a `detailed_metric` or `value_to_metric` rule; None for the others.
    fn of(rule: &Rule) -> Option<LabelShape> {
        (rule.detailed_metric || rule.value_to_metric.contains(&true)).then(|| LabelShape {
            detailed: rule.detailed_metric,
            levels: rule
                .value_to_metric
                .iter()
                .zip(&rule.segments)
                .enumerate()
                .map(|(i, (v, s))| (*v, s.clone(), rule.shared.iter().any(|(at, _)| *at == i)))
                .collect(),
        })
    }

    /// The request's label, sanitized as the reference sanitizes the stats key (so values it
    /// would count as one stat, `a:b` and `a|b`, are one series here, and take one slot of the
    /// cap).
    fn label<'e>(&self, entries: impl IntoIterator<Item = (&'e str, &'e str)>) -> String {
        label::bounded_label(entries.into_iter().enumerate().map(|(i, (key, value))| {
            let (to_metric, segment, shared) = self
                .levels
                .get(i)
                .map_or((false, key, false), |(v, s, sh)| (*v, s.as_str(), *sh));
            if shared {
                (segment, None)
            } else if self.detailed {
                (key, Some(value))
            } else if to_metric {
                (key, (!value.is_empty()).then_some(value))
            } else {
                (segment, None)
            }
        }))
    }
}

/// The series of one hit rule.
#[derive(Debug)]
pub(crate) struct RuleSeries {
    domain: String,
    path: String,
    /// The `domain` and `rule` labels: the domain and the path sanitized as the reference's stat
    /// names (a detailed rule's request labels are sanitized as they are made).
    domain_label: String,
    path_label: String,
    /// The rule's own series (not exported for detailed rules, which count per request label).
    counts: Counts,
    detailed: Option<Detailed>,
}

/// One exported series: (domain label, rule label) and its counts. Both labels are sanitized
/// stat names already ([`sanitize_stat_name`]), so rows the reference would count as one stat
/// have equal labels, to be added up.
pub(super) type Row<'a> = (Cow<'a, str>, Cow<'a, str>, [u64; 5]);

impl RuleSeries {
    fn new(domain: &str, rule: &Rule, budget: &Arc<DetailedBudget>) -> Self {
        RuleSeries {
            domain: domain.to_owned(),
            path: rule.path.clone(),
            domain_label: sanitize_stat_name(domain).into_owned(),
            path_label: sanitize_stat_name(&rule.path).into_owned(),
            counts: Counts::default(),
            detailed: LabelShape::of(rule).map(|shape| Detailed {
                shape,
                by_label: Mutex::new(HashMap::new()),
                overflow: OnceLock::new(),
                budget: budget.clone(),
            }),
        }
    }

    /// Counts one descriptor's hits, `split`. For a detailed rule, under the series of the
    /// request's entries (`entries` is only read then), or past the cap, under the rule's overflow
    /// series.
    pub(crate) fn record<'e>(
        &self,
        split: HitSplit,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) {
        let Some(detailed) = &self.detailed else {
            self.counts.record(split);
            return;
        };
        let label = detailed.shape.label(entries);
        let mut by_label = lock(&detailed.by_label);
        if let Some(counts) = by_label.get(&label) {
            counts.record(split);
        } else if detailed.budget.try_take() {
            let counts = Arc::new(Counts::default());
            counts.record(split);
            by_label.insert(label, counts);
        } else {
            drop(by_label);
            detailed.overflow.get_or_init(Counts::default).record(split);
        }
    }

    /// The rows this rule exports.
    pub(super) fn rows<'a>(&'a self, out: &mut Vec<Row<'a>>) {
        let Some(detailed) = &self.detailed else {
            out.push((
                self.domain_label.as_str().into(),
                self.path_label.as_str().into(),
                self.counts.values(),
            ));
            return;
        };
        for (label, counts) in lock(&detailed.by_label).iter() {
            out.push((
                self.domain_label.as_str().into(),
                label.clone().into(),
                counts.values(),
            ));
        }
        if let Some(overflow) = detailed.overflow.get() {
            // `_` ends any address in the path: the suffix changes nothing of its sanitizing.
            let label = format!("{}{OVERFLOW_SUFFIX}", self.path_label);
            out.push((
                self.domain_label.as_str().into(),
                label.into(),
                overflow.values(),
            ));
        }
    }
}

/// The series slots of one policy.
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    /// By `Rule::id`: empty until the rule's first hit.
    rules: Vec<OnceLock<Arc<RuleSeries>>>,
    /// By domain: request-supplied limit overrides.
    overrides: HashMap<String, OnceLock<Arc<Counts>>>,
    /// By domain: the descriptors no rule matched (`ratelimit_service_rate_limit_no_rule`),
    /// resolved from `no_rule_counter` on the domain's first one.
    no_rule: HashMap<String, OnceLock<IntCounter>>,
    no_rule_counter: Option<IntCounterVec>,
    /// The filled rule slots, so exporting and carrying over need not walk every rule.
    hit: Mutex<Vec<Arc<RuleSeries>>>,
    budget: Arc<DetailedBudget>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        PolicyMetrics::new(Arc::new(DetailedBudget::new(0)))
    }
}

impl PolicyMetrics {
    pub(crate) fn new(budget: Arc<DetailedBudget>) -> Self {
        PolicyMetrics {
            rules: Vec::new(),
            overrides: HashMap::new(),
            no_rule: HashMap::new(),
            no_rule_counter: None,
            hit: Mutex::new(Vec::new()),
            budget,
        }
    }

    /// The table for `policy`, taking over from `old` the series of every rule `policy` keeps:
    /// same domain and path, and still (or still not) `detailed_metric`.
    pub(crate) fn carry_over(old: &PolicyMetrics, policy: &Policy) -> PolicyMetrics {
        let old_hits = lock(&old.hit).clone();
        let mut by_name: HashMap<(&str, &str), &Arc<RuleSeries>> = old_hits
            .iter()
            .map(|s| ((s.domain.as_str(), s.path.as_str()), s))
            .collect();
        let mut rules: Vec<OnceLock<Arc<RuleSeries>>> =
            (0..policy.rule_count()).map(|_| OnceLock::new()).collect();
        let mut hit = Vec::new();
        let mut overrides = HashMap::new();
        for domain in policy.domains() {
            let slot = OnceLock::new();
            if let Some(counts) = old.overrides.get(&domain.name).and_then(OnceLock::get) {
                let _ = slot.set(counts.clone());
            }
            overrides.insert(domain.name.clone(), slot);
            if by_name.is_empty() {
                continue;
            }
            for rule in domain.rules() {
                let key = (domain.name.as_str(), rule.path.as_str());
                let same_kind = by_name.get(&key).is_some_and(|s| {
                    s.detailed.as_ref().map(|d| &d.shape) == LabelShape::of(rule).as_ref()
                });
                // Removed once taken: two rules of one path (if a policy ever had them) would
                // otherwise share, and export twice, one series.
                if same_kind
                    && let Some(series) = by_name.remove(&key)
                    && let Some(slot) = rules.get_mut(rule.id)
                {
                    let _ = slot.set(series.clone());
                    hit.push(series.clone());
                }
            }
        }
        PolicyMetrics {
            rules,
            overrides,
            no_rule: HashMap::new(),
            no_rule_counter: None,
            hit: Mutex::new(hit),
            budget: old.budget.clone(),
        }
    }

    /// The table, counting the descriptors no rule matched in each of its domains in `counter`
    /// (a domain's series is resolved on its first such descriptor, then a count is one atomic
    /// add; the series lives in `counter`, so it carries over reloads).
    pub(crate) fn counting_no_rule(mut self, counter: &IntCounterVec) -> Self {
        self.no_rule = self
            .overrides
            .keys()
            .map(|domain| (domain.clone(), OnceLock::new()))
            .collect();
        self.no_rule_counter = Some(counter.clone());
        self
    }

    /// The counter of descriptors of `domain` that no rule matched.
    pub(crate) fn no_rule(&self, domain: &str) -> Option<&IntCounter> {
        let (slot, counter) = (self.no_rule.get(domain)?, self.no_rule_counter.as_ref()?);
        Some(slot.get_or_init(|| counter.with_label_values(&[&sanitize_stat_name(domain)])))
    }

    /// The series of `rule` (of `domain`), created on its first hit.
    pub(crate) fn rule(&self, domain: &str, rule: &Rule) -> Option<&RuleSeries> {
        let slot = self.rules.get(rule.id)?;
        let series = slot.get_or_init(|| {
            let series = Arc::new(RuleSeries::new(domain, rule, &self.budget));
            lock(&self.hit).push(series.clone());
            series
        });
        Some(series)
    }

    /// The series of request-supplied overrides in `domain`, created on its first hit.
    pub(crate) fn override_counts(&self, domain: &str) -> Option<&Counts> {
        let slot = self.overrides.get(domain)?;
        Some(slot.get_or_init(|| Arc::new(Counts::default())))
    }

    /// Every series to export, unsorted (labels may repeat; the exporter adds them up).
    pub(super) fn rows<'a>(&'a self, hit: &'a [Arc<RuleSeries>], out: &mut Vec<Row<'a>>) {
        for series in hit {
            series.rows(out);
        }
        for (domain, slot) in &self.overrides {
            if let Some(counts) = slot.get() {
                out.push((
                    sanitize_stat_name(domain),
                    OVERRIDE_RULE.into(),
                    counts.values(),
                ));
            }
        }
    }

    /// The filled rule slots now.
    pub(super) fn hit_series(&self) -> Vec<Arc<RuleSeries>> {
        lock(&self.hit).clone()
    }
}
