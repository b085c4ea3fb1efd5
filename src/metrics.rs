//! Every Prometheus metric, defined once, named as envoyproxy/ratelimit's Prometheus sink names them
//! so dashboards carry over. Per-rule counters are resolved when a policy is installed, so the hot
//! path only increments atomics; request values appear in labels only for `detailed_metric` rules,
//! and then under a cap.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::policy::Policy;

/// The label value used for a detailed series past the cap, and for request-supplied overrides.
pub const OVERFLOW_SUFFIX: &str = "_overflow";
pub const OVERRIDE_RULE: &str = "override";

/// The five per-rule counters, incremented by hits.
#[derive(Debug, Clone)]
pub struct RuleCounters {
    pub total_hits: IntCounter,
    pub over_limit: IntCounter,
    pub near_limit: IntCounter,
    pub within_limit: IntCounter,
    pub shadow_mode: IntCounter,
}

/// How one limited descriptor ended, for its rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitOutcome {
    Within,
    Near,
    Over,
    /// Over the limit, but the rule is in shadow mode (counted as over and as shadow).
    OverShadowed,
}

impl RuleCounters {
    pub fn record(&self, outcome: HitOutcome, hits: u64) {
        self.total_hits.inc_by(hits);
        match outcome {
            HitOutcome::Within => self.within_limit.inc_by(hits),
            HitOutcome::Near => {
                self.near_limit.inc_by(hits);
                self.within_limit.inc_by(hits);
            }
            HitOutcome::Over => self.over_limit.inc_by(hits),
            HitOutcome::OverShadowed => {
                self.over_limit.inc_by(hits);
                self.shadow_mode.inc_by(hits);
            }
        }
    }
}

/// Per-rule counters of one policy, indexed by `Rule::id`.
#[derive(Debug, Clone, Default)]
pub struct PolicyMetrics {
    pub rules: Vec<Option<RuleCounters>>,
}

pub struct Metrics {
    registry: Registry,
    total_hits: IntCounterVec,
    over_limit: IntCounterVec,
    near_limit: IntCounterVec,
    within_limit: IntCounterVec,
    shadow_mode: IntCounterVec,
    pub global_shadow_mode: IntCounter,
    pub config_load_success: IntCounter,
    pub config_load_error: IntCounter,
    pub should_rate_limit_error: IntCounterVec,
    pub total_requests: IntCounterVec,
    pub response_time: HistogramVec,
    pub store_keys: IntGauge,
    pub store_evictions: IntCounter,
    pub store_errors: IntCounter,
    detailed_cap: usize,
    detailed_seen: Mutex<HashSet<(String, String)>>,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

impl Metrics {
    /// A fresh registry. `detailed_cap` bounds the number of distinct detailed-metric series.
    pub fn new(detailed_cap: usize) -> Metrics {
        let r = Registry::new();
        let rule = ["domain", "rule"];
        let response_time = HistogramVec::new(
            HistogramOpts::new(
                "ratelimit_service_response_time_seconds",
                "ShouldRateLimit latency",
            )
            .buckets(vec![
                0.000_025, 0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                0.05, 0.1, 0.25, 1.0,
            ]),
            &["grpc_method"],
        )
        .expect("valid metric definition");
        r.register(Box::new(response_time.clone()))
            .expect("metric registered once");
        let store_keys = IntGauge::new("ratelimit_store_keys", "Keys held by the memory store")
            .expect("valid metric definition");
        r.register(Box::new(store_keys.clone()))
            .expect("metric registered once");
        Metrics {
            total_hits: counter_vec(
                &r,
                "ratelimit_service_rate_limit_total_hits",
                "Hits on a rule",
                &rule,
            ),
            over_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_over_limit",
                "Hits over the limit",
                &rule,
            ),
            near_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_near_limit",
                "Hits past NEAR_LIMIT_RATIO of the limit",
                &rule,
            ),
            within_limit: counter_vec(
                &r,
                "ratelimit_service_rate_limit_within_limit",
                "Hits within the limit",
                &rule,
            ),
            shadow_mode: counter_vec(
                &r,
                "ratelimit_service_rate_limit_shadow_mode",
                "Over-limit hits let through by shadow mode",
                &rule,
            ),
            global_shadow_mode: counter(
                &r,
                "ratelimit_service_global_shadow_mode",
                "Requests answered OK by global SHADOW_MODE",
            ),
            config_load_success: counter(
                &r,
                "ratelimit_service_config_load_success",
                "Rules loads that succeeded",
            ),
            config_load_error: counter(
                &r,
                "ratelimit_service_config_load_error",
                "Rules loads that failed",
            ),
            should_rate_limit_error: counter_vec(
                &r,
                "ratelimit_service_should_rate_limit_error",
                "Failed ShouldRateLimit calls",
                &["err_type"],
            ),
            total_requests: counter_vec(
                &r,
                "ratelimit_service_total_requests",
                "ShouldRateLimit calls",
                &["grpc_method"],
            ),
            response_time,
            store_keys,
            store_evictions: counter(
                &r,
                "ratelimit_store_evictions",
                "Live keys evicted because the key bound was reached",
            ),
            store_errors: counter(&r, "ratelimit_store_errors", "Store operations that failed"),
            registry: r,
            detailed_cap,
            detailed_seen: Mutex::new(HashSet::new()),
        }
    }

    /// The counters of one (domain, rule) series.
    pub fn rule_counters(&self, domain: &str, rule: &str) -> RuleCounters {
        let labels = [domain, rule];
        RuleCounters {
            total_hits: self.total_hits.with_label_values(&labels),
            over_limit: self.over_limit.with_label_values(&labels),
            near_limit: self.near_limit.with_label_values(&labels),
            within_limit: self.within_limit.with_label_values(&labels),
            shadow_mode: self.shadow_mode.with_label_values(&labels),
        }
    }

    /// Counters for a detailed-metric series (`rule` holds request values); past the cap, the
    /// rule's overflow series.
    pub fn detailed_counters(
        &self,
        domain: &str,
        rule_path: &str,
        detailed: String,
    ) -> RuleCounters {
        let mut seen = self
            .detailed_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (domain.to_owned(), detailed);
        if seen.contains(&key) || seen.len() < self.detailed_cap {
            let counters = self.rule_counters(domain, &key.1);
            seen.insert(key);
            counters
        } else {
            self.rule_counters(domain, &format!("{rule_path}{OVERFLOW_SUFFIX}"))
        }
    }

    /// Resolves the counters of every rule of a policy, once per reload.
    pub fn for_policy(&self, policy: &Policy) -> PolicyMetrics {
        let mut rules = vec![None; policy.rule_count()];
        for domain in policy.domains() {
            for rule in domain.rules() {
                rules[rule.id] = Some(self.rule_counters(&domain.name, &rule.path));
            }
        }
        PolicyMetrics { rules }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
