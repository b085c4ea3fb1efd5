//! Every Prometheus metric, defined once, named as envoyproxy/ratelimit's Prometheus sink names them
//! so dashboards carry over. Per-rule series follow the live rules: a rule gets its five series on
//! its first hit, keeps them across reloads that keep it, and loses them when a reload removes it;
//! the hot path of a hit rule only adds to atomics. Request values appear in labels only for
//! `detailed_metric` rules, bounded in number and length.

mod build_info;
mod concurrency;
mod families;
mod label;
mod rules;
mod series;
mod stat_name;
mod store_stats;
#[cfg(test)]
mod tests;
mod unmatched;

use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub use build_info::long_version;
pub(crate) use concurrency::ConcurrencyMetrics;
pub use rules::OVERRIDE_RULE;
pub(crate) use rules::{DetailedBudget, PolicyMetrics};
pub use series::{Counts, HitOutcome, HitSplit};
pub use stat_name::sanitize_stat_name;
pub(crate) use store_stats::StatsSource;
pub use unmatched::{OTHER_DOMAINS, UNKNOWN_DOMAINS_CAP};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use crate::policy::{DomainRules, Policy};
use crate::store::{Backend, Store};

pub struct Metrics {
    registry: Registry,
    /// The live policy's series table, read by the exporter.
    live: Arc<ArcSwap<PolicyMetrics>>,
    /// Serialises `install`, so each table carries over from the one before it.
    installing: Mutex<()>,
    pub global_shadow_mode: IntCounter,
    pub config_load_success: IntCounter,
    pub config_load_error: IntCounter,
    /// Reads of the rules files (a file event's burst or a reload request), changed or not.
    pub rules_checks: IntCounter,
    pub should_rate_limit_error: IntCounterVec,
    /// Answers held now for their leaky-bucket turn (`ratelimit_waiting_answers`).
    pub waiting_answers: IntGauge,
    pub total_requests: IntCounterVec,
    pub response_time: HistogramVec,
    /// The concurrency rules' series.
    pub(crate) concurrency: ConcurrencyMetrics,
    /// Where `ratelimit_store_keys` and `ratelimit_store_evictions` are read at scrape time.
    store_stats: Arc<OnceLock<StatsSource>>,
    /// Descriptors of a known domain that no rule matched, by domain.
    no_rule: IntCounterVec,
    /// Descriptors of calls to domains with no rules, by domain (bounded).
    unknown_domains: unmatched::UnknownDomains,
    /// Descriptors that nearly match a rule, warned of once.
    near_misses: unmatched::NearMisses,
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
        let live = Arc::new(ArcSwap::from_pointee(PolicyMetrics::new(Arc::new(
            DetailedBudget::new(detailed_cap),
        ))));
        build_info::register(&r);
        r.register(Box::new(families::RuleFamilies::new(live.clone())))
            .expect("metric registered once");
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
        let store_stats = Arc::new(OnceLock::new());
        r.register(Box::new(store_stats::StoreStatsCollector::new(
            store_stats.clone(),
        )))
        .expect("metric registered once");
        Metrics {
            concurrency: ConcurrencyMetrics::new(&r),
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
            rules_checks: counter(
                &r,
                "ratelimit_rules_checks",
                "Times the rules files were read (after file events or a reload request), whether or not they had changed",
            ),
            should_rate_limit_error: counter_vec(
                &r,
                "ratelimit_service_should_rate_limit_error",
                "Failed ShouldRateLimit calls",
                &["err_type"],
            ),
            waiting_answers: {
                let g = IntGauge::new(
                    "ratelimit_waiting_answers",
                    "Answers held now for their leaky-bucket turn (at most MAX_WAITING_ANSWERS; \
                     past it a call is refused with RESOURCE_EXHAUSTED)",
                )
                .expect("valid metric definition");
                r.register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
            total_requests: counter_vec(
                &r,
                "ratelimit_service_total_requests",
                "ShouldRateLimit calls",
                &["grpc_method"],
            ),
            response_time,
            store_stats,
            no_rule: counter_vec(
                &r,
                "ratelimit_service_rate_limit_no_rule",
                "Descriptors of a domain with rules that no rule matched (whitelisted ones are matched)",
                &["domain"],
            ),
            unknown_domains: unmatched::UnknownDomains::new(
                counter_vec(
                    &r,
                    "ratelimit_service_rate_limit_domain_not_found",
                    "Descriptors of calls to a domain with no rules (past 100 such domains, under domain=\"(other)\")",
                    &["domain"],
                ),
                UNKNOWN_DOMAINS_CAP,
            ),
            near_misses: unmatched::NearMisses::default(),
            registry: r,
            live,
            installing: Mutex::new(()),
        }
    }

    /// Makes `policy`'s series table the live one and returns it for the engine: rules `policy`
    /// keeps (same domain and path) keep their series and counts; the series of the others are no
    /// longer exported.
    pub(crate) fn install(&self, policy: &Policy) -> Arc<PolicyMetrics> {
        let _serial = self
            .installing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let table = Arc::new(
            PolicyMetrics::carry_over(&self.live.load(), policy).counting_no_rule(&self.no_rule),
        );
        self.live.store(table.clone());
        self.near_misses.forget();
        table
    }

    /// Counts `descriptors` descriptors of a call to `domain`, which has no rules.
    pub(crate) fn domain_not_found(&self, domain: &str, descriptors: u64) {
        self.unknown_domains.count(domain, descriptors);
    }

    /// A descriptor of a call to `rules`' domain that matched no rule, its keys those of a rule's
    /// path in another order: warned of if another order of its `entries` matches that rule.
    pub(crate) fn descriptor_in_another_order(&self, rules: &DomainRules, entries: &[Entry]) {
        self.near_misses.another_order(rules, entries);
    }

    /// A descriptor of a call to `rules`' domain that matched no rule, its first keys the path of
    /// a rule without nested descriptors: warned of if its first entries match that rule.
    pub(crate) fn descriptor_longer_than_a_rule(&self, rules: &DomainRules, entries: &[Entry]) {
        self.near_misses.longer_than_a_rule(rules, entries);
    }

    /// An RLQS bucket in `domain`, which has no rules: warned of as a call's domain is, not
    /// counted (`domain_not_found` counts ShouldRateLimit's descriptors, as the reference does).
    pub(crate) fn quota_domain_not_found(&self, domain: &str) {
        self.unknown_domains.seen(domain);
    }

    /// Reads the store's key and eviction counts (`Store::stats`) for every scrape from now on.
    /// Only the first store attached is read: a server has one.
    pub fn read_store_stats<B: Backend>(&self, store: Store<B>) {
        let _ = self.store_stats.set(Arc::new(move || store.stats()));
    }

    /// The registry, for metrics defined next to their code (TLS, the remote store's).
    pub fn registry(&self) -> &Registry {
        &self.registry
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
