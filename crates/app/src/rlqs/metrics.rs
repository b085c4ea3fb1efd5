//! The RLQS series: streams open, buckets known, reports read, assignments sent by kind, actions
//! waiting in the streams' outboxes, and buckets refused past the caps; with Redis, the instances
//! sharing the buckets and the demand exchanges that failed. Per-rule hits and over-limit counts
//! of reported requests go to the rules' own series (`Engine::record_quota_usage`).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub(crate) struct QuotaMetrics {
    pub(crate) streams: IntGauge,
    pub(crate) buckets: IntGauge,
    pub(crate) reports: IntCounter,
    pub(crate) assignments: IntCounterVec,
    pub(crate) refused: IntCounter,
    pub(crate) outbox_pending: IntGauge,
    pub(crate) instances: IntGauge,
    pub(crate) exchange_errors: IntCounter,
}

impl QuotaMetrics {
    /// The series, registered on `registry` (a second registration keeps the first).
    pub(crate) fn register(registry: &Registry) -> QuotaMetrics {
        let metrics = QuotaMetrics {
            streams: IntGauge::new(
                "ratelimit_rlqs_streams",
                "Open RLQS streams (one per Envoy and domain)",
            )
            .expect("valid metric"),
            buckets: IntGauge::new("ratelimit_rlqs_buckets", "RLQS buckets the server tracks")
                .expect("valid metric"),
            reports: IntCounter::new(
                "ratelimit_rlqs_reports_total",
                "Bucket usage reports read from RLQS streams",
            )
            .expect("valid metric"),
            assignments: IntCounterVec::new(
                Opts::new(
                    "ratelimit_rlqs_assignments_total",
                    "Bucket actions sent on RLQS streams, by kind (token_bucket, allow_all, \
                     deny_all, abandon)",
                ),
                &["action"],
            )
            .expect("valid metric"),
            refused: IntCounter::new(
                "ratelimit_rlqs_buckets_refused_total",
                "Buckets refused (too large, or their stream or the server holds the most buckets \
                 it may), each counted once per stream",
            )
            .expect("valid metric"),
            outbox_pending: IntGauge::new(
                "ratelimit_rlqs_outbox_pending",
                "Bucket actions waiting in the RLQS streams' outboxes for their clients to read \
                 (the newest per bucket and stream)",
            )
            .expect("valid metric"),
            instances: IntGauge::new(
                "ratelimit_rlqs_instances",
                "Server instances sharing RLQS buckets through Redis, as last seen (1 without Redis)",
            )
            .expect("valid metric"),
            exchange_errors: IntCounter::new(
                "ratelimit_rlqs_exchange_errors_total",
                "RLQS demand exchanges with Redis that failed (a whole round or one bucket's); the \
                 last fractions are kept",
            )
            .expect("valid metric"),
        };
        metrics.instances.set(1);
        let _ = registry.register(Box::new(metrics.streams.clone()));
        let _ = registry.register(Box::new(metrics.buckets.clone()));
        let _ = registry.register(Box::new(metrics.reports.clone()));
        let _ = registry.register(Box::new(metrics.assignments.clone()));
        let _ = registry.register(Box::new(metrics.refused.clone()));
        let _ = registry.register(Box::new(metrics.outbox_pending.clone()));
        let _ = registry.register(Box::new(metrics.instances.clone()));
        let _ = registry.register(Box::new(metrics.exchange_errors.clone()));
        metrics
    }
}
