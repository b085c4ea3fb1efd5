//! The five counts of one per-rule series (total, over, near, within, shadow), as plain atomics
//! that only ever grow: an increment saturates at `u64::MAX` instead of wrapping, since a counter
//! that goes down reads as a counter reset to Prometheus. What one descriptor adds to each is a
//! [`HitSplit`]: its hits, split among them (a request of several hits may fall on both sides of
//! a threshold).

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

/// How many of one descriptor's hits each per-rule count takes. Not a partition, as the
/// reference's counts are not: a near hit is also within, an over hit of a shadow-mode rule also
/// shadow, and on an over-limit answer the hits below the near-limit threshold are in `hits`
/// (total) alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HitSplit {
    /// All of them (`total_hits`).
    pub hits: u64,
    pub over: u64,
    pub near: u64,
    pub within: u64,
    pub shadow: u64,
}

impl HitSplit {
    /// Every one of `hits` counted the same way, `outcome`.
    pub fn whole(outcome: HitOutcome, hits: u64) -> HitSplit {
        let mut split = HitSplit {
            hits,
            ..HitSplit::default()
        };
        match outcome {
            HitOutcome::Within => split.within = hits,
            HitOutcome::Near => {
                split.near = hits;
                split.within = hits;
            }
            HitOutcome::Over => split.over = hits,
            HitOutcome::OverShadowed => {
                split.over = hits;
                split.shadow = hits;
            }
        }
        split
    }
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
    pub(crate) fn record(&self, split: HitSplit) {
        for (counter, n) in [
            (&self.total_hits, split.hits),
            (&self.over_limit, split.over),
            (&self.near_limit, split.near),
            (&self.within_limit, split.within),
            (&self.shadow_mode, split.shadow),
        ] {
            if n > 0 {
                add(counter, n);
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
