//! The five counts of one per-rule series (total, over, near, within, shadow), as plain atomics
//! that only ever grow: an increment saturates at `u64::MAX` instead of wrapping, since a counter
//! that goes down reads as a counter reset to Prometheus.

use std::sync::atomic::{AtomicU64, Ordering};

/// How one limited descriptor ended, for its rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitOutcome {
    Within,
    Near,
    Over,
    /// Over the limit, but the rule is in shadow mode (counted as over and as shadow).
    OverShadowed,
}

/// The per-rule metric families, in the order of `Counts::values`.
pub(crate) const FAMILIES: [(&str, &str); 5] = [
    ("ratelimit_service_rate_limit_total_hits", "Hits on a rule"),
    (
        "ratelimit_service_rate_limit_over_limit",
        "Hits over the limit",
    ),
    (
        "ratelimit_service_rate_limit_near_limit",
        "Hits past NEAR_LIMIT_RATIO of the limit",
    ),
    (
        "ratelimit_service_rate_limit_within_limit",
        "Hits within the limit",
    ),
    (
        "ratelimit_service_rate_limit_shadow_mode",
        "Over-limit hits let through by shadow mode",
    ),
];

/// One series' counts.
#[derive(Debug, Default)]
pub struct Counts {
    total_hits: AtomicU64,
    over_limit: AtomicU64,
    near_limit: AtomicU64,
    within_limit: AtomicU64,
    shadow_mode: AtomicU64,
}

/// `counter += n`, stopping at `u64::MAX`.
fn add(counter: &AtomicU64, n: u64) {
    // The closure always returns Some, so this cannot fail.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

impl Counts {
    pub(crate) fn record(&self, outcome: HitOutcome, hits: u64) {
        add(&self.total_hits, hits);
        match outcome {
            HitOutcome::Within => add(&self.within_limit, hits),
            HitOutcome::Near => {
                add(&self.near_limit, hits);
                add(&self.within_limit, hits);
            }
            HitOutcome::Over => add(&self.over_limit, hits),
            HitOutcome::OverShadowed => {
                add(&self.over_limit, hits);
                add(&self.shadow_mode, hits);
            }
        }
    }

    /// The counts in the order of `FAMILIES`.
    pub(crate) fn values(&self) -> [u64; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}
