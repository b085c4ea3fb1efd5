//! The concurrency rules' series, per rule (`domain`, `rule`): acquisitions, denials, releases
//! (`result`: `released`, or `unknown` for a request id that held no slot: a denied request's
//! stream-done call, a lease already expired), leases that ended unreleased, and the slots in
//! use. The slots in use are counted by this instance, from what its calls did: +1 per slot
//! taken, −1 per slot released or lease found ended (by a call, or the memory store's sweep).
//! With several instances on one Redis, the sum over instances is the rule's slots in use (one
//! instance's own count may even go below 0: it saw leases end that another took). A rule's
//! series stay after a reload removes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::lease::{LeaseAction, LeaseAnswer, LeaseOutcome, LeaseWatch};
use crate::policy::Rule;

pub(crate) struct ConcurrencyMetrics {
    acquisitions: IntCounterVec,
    denials: IntCounterVec,
    releases: IntCounterVec,
    expired: IntCounterVec,
    in_use: IntGaugeVec,
    /// Each rule's series, bound once (by domain and rule path).
    by_rule: Mutex<HashMap<(String, String), Arc<RuleLeases>>>,
}

/// One concurrency rule's series.
pub(crate) struct RuleLeases {
    acquisitions: IntCounter,
    denials: IntCounter,
    released: IntCounter,
    unknown: IntCounter,
    expired: IntCounter,
    in_use: IntGauge,
}

impl RuleLeases {
    /// Counts what one call did.
    pub(crate) fn record(&self, action: LeaseAction, answer: &LeaseAnswer) {
        if answer.expired > 0 {
            self.expired(answer.expired);
        }
        match (action, answer.outcome) {
            (_, LeaseOutcome::Taken) => {
                self.acquisitions.inc();
                self.in_use.inc();
            }
            (_, LeaseOutcome::Denied) => self.denials.inc(),
            (_, LeaseOutcome::Released) => {
                self.released.inc();
                self.in_use.dec();
            }
            (LeaseAction::Release, LeaseOutcome::Unknown) => self.unknown.inc(),
            _ => {}
        }
    }
}

impl LeaseWatch for RuleLeases {
    fn expired(&self, leases: u32) {
        self.expired.inc_by(u64::from(leases));
        self.in_use.sub(i64::from(leases));
    }
}

fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

impl ConcurrencyMetrics {
    pub(crate) fn new(r: &Registry) -> ConcurrencyMetrics {
        let labels = &["domain", "rule"];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(
                r,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition"),
            )
        };
        ConcurrencyMetrics {
            acquisitions: counter(
                "ratelimit_concurrency_acquisitions_total",
                "Slots taken by concurrency rules' request-time calls",
                labels,
            ),
            denials: counter(
                "ratelimit_concurrency_denials_total",
                "Request-time calls denied because every slot was held (nothing taken)",
                labels,
            ),
            releases: counter(
                "ratelimit_concurrency_releases_total",
                "Stream-done calls: result=released gave a slot back, result=unknown found no slot for the request id (a denied request, an expired lease)",
                &["domain", "rule", "result"],
            ),
            expired: counter(
                "ratelimit_concurrency_expired_leases_total",
                "Leases that ended unreleased (their release was lost) and freed their slot",
                labels,
            ),
            in_use: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "ratelimit_concurrency_slots_in_use",
                        "Slots held, as this instance's calls changed them (with several instances, sum them)",
                    ),
                    labels,
                )
                .expect("valid metric definition"),
            ),
            by_rule: Mutex::new(HashMap::new()),
        }
    }

    /// The series of `rule` in `domain`.
    pub(crate) fn rule(&self, domain: &str, rule: &Rule) -> Arc<RuleLeases> {
        let mut by_rule = self.by_rule.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = by_rule.get(&(domain.to_owned(), rule.path.clone())) {
            return series.clone();
        }
        let labels = [domain, rule.path.as_str()];
        let series = Arc::new(RuleLeases {
            acquisitions: self.acquisitions.with_label_values(&labels),
            denials: self.denials.with_label_values(&labels),
            released: self
                .releases
                .with_label_values(&[domain, &rule.path, "released"]),
            unknown: self
                .releases
                .with_label_values(&[domain, &rule.path, "unknown"]),
            expired: self.expired.with_label_values(&labels),
            in_use: self.in_use.with_label_values(&labels),
        });
        by_rule.insert((domain.to_owned(), rule.path.clone()), series.clone());
        series
    }
}
