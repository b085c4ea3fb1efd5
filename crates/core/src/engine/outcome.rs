//! How one descriptor's tightest limit went, as the per-rule metrics count it: its hits split at
//! the near-limit threshold (`NEAR_LIMIT_RATIO` of its capacity) and at the limit as the reference
//! splits them (`split`, for the metrics, `observe`), and the descriptor as a whole — within,
//! near, over, or over but let through by `shadow_mode` (`outcome`, for replay's `attribution`).
//! Pure; both read the same count before and after the request.

use super::plan::PlannedLimit;
use crate::config::Algorithm;
use crate::metrics::{HitOutcome, HitSplit};
use crate::store::Verdict;

/// The near-limit threshold of a limit of `capacity`: hits that take the count past it are near
/// the limit.
pub(super) fn near_threshold(capacity: u32, ratio: f64) -> u64 {
    // The reference's arithmetic, on purpose: `floor(float32(limit) * float32(NEAR_LIMIT_RATIO))`
    // (base_limiter.go, GetResponseDescriptorStatus), in float32: 90 × 0.7 is 63 there, where
    // float64 gives 62.99… → 62.
    (capacity as f32 * ratio as f32).floor() as u64
}

/// Where one descriptor's hits fall on its tightest limit, in hits used of its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    /// What the limit had used before the request (the reference's `limitBeforeIncrease`).
    before: u64,
    /// `before` plus the request's hits, whether or not they were charged
    /// (`limitAfterIncrease`).
    after: u64,
    /// The capacity (`overLimitThreshold`): requests per unit, or a bucket's burst.
    limit: u64,
    /// `nearLimitThreshold`.
    near: u64,
}

fn counts(limit: &PlannedLimit<'_>, verdict: &Verdict, hits: u64, ratio: f64) -> Counts {
    let capacity = match limit.params.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => limit.params.burst,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => limit.params.requests_per_unit,
    };
    let before = u64::from(capacity.saturating_sub(verdict.remaining_before));
    Counts {
        before,
        after: before.saturating_add(hits),
        limit: u64::from(capacity),
        near: near_threshold(capacity, ratio),
    }
}

/// How a descriptor's `hits` count in its rule's series, by the reference's arithmetic on its
/// count before and after them (base_limiter.go: `checkNearLimitThreshold`,
/// `checkOverLimitThreshold`, `increaseShadowModeStats`):
///
/// - allowed: every hit within; those that take the count past the near-limit threshold near;
/// - denied: those past the limit over (all of them if the count was at the limit already), those
///   between the near-limit threshold and the limit near, none within — the hits below the
///   threshold are in the total alone; a shadow-mode rule's over hits also shadow.
///
/// A denied request that was not charged (our default: denied requests don't eat quota) is split
/// the same way, as if its hits had been added to the count as it stands (the count its status
/// reports): its counts are the ones the reference's would be, though the store's count did not
/// move, so the same request sent again is split the same way again.
pub(super) fn split(
    limit: &PlannedLimit<'_>,
    verdict: &Verdict,
    shadow: bool,
    hits: u64,
    ratio: f64,
) -> HitSplit {
    split_counts(
        counts(limit, verdict, hits, ratio),
        verdict.allowed,
        shadow,
        hits,
    )
}

fn split_counts(c: Counts, allowed: bool, shadow: bool, hits: u64) -> HitSplit {
    if allowed {
        let near = if c.after <= c.near {
            0
        } else if c.before >= c.near {
            hits
        } else {
            c.after - c.near
        };
        return HitSplit {
            hits,
            near,
            within: hits,
            ..HitSplit::default()
        };
    }
    // `after <= limit` cannot be denied on these counts (no algorithm denies hits that fit its
    // remaining); should one, every hit counts as over rather than none.
    let (over, near) = if c.before >= c.limit || c.after <= c.limit {
        (hits, 0)
    } else {
        (
            c.after - c.limit,
            c.limit.saturating_sub(c.near.max(c.before)),
        )
    };
    HitSplit {
        hits,
        over,
        near,
        within: 0,
        shadow: if shadow { over } else { 0 },
    }
}

/// The descriptor as a whole: over (or over but shadowed) when denied; near when allowed and its
/// hits take the count past the near-limit threshold (or it was past it already); else within.
pub(super) fn outcome(
    limit: &PlannedLimit<'_>,
    verdict: &Verdict,
    shadow: bool,
    hits: u64,
    ratio: f64,
) -> HitOutcome {
    if !verdict.allowed {
        return if shadow {
            HitOutcome::OverShadowed
        } else {
            HitOutcome::Over
        };
    }
    let c = counts(limit, verdict, hits, ratio);
    if c.after > c.near {
        HitOutcome::Near
    } else {
        HitOutcome::Within
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(before: u64, hits: u64, limit: u64, near: u64) -> Counts {
        Counts {
            before,
            after: before + hits,
            limit,
            near,
        }
    }

    /// (hits, over, near, within, shadow).
    fn five(s: HitSplit) -> [u64; 5] {
        [s.hits, s.over, s.near, s.within, s.shadow]
    }

    #[test]
    fn near_threshold_is_computed_in_float32() {
        assert_eq!(near_threshold(90, 0.7), 63, "float64 would give 62");
        assert_eq!(near_threshold(15, 0.8), 12);
        assert_eq!(near_threshold(8, 0.8), 6);
        assert_eq!(near_threshold(20, 0.8), 16);
        assert_eq!(near_threshold(10, 0.5), 5);
        assert_eq!(near_threshold(10, 0.0), 0);
        assert_eq!(near_threshold(10, 1.0), 10);
        // float32 cannot hold every u32: the reference's threshold is rounded as ours is.
        assert_eq!(near_threshold(u32::MAX, 1.0), 1 << 32);
    }

    /// `TestNearLimit`'s cases, and the ones of `checkNearLimitThreshold` and
    /// `checkOverLimitThreshold` across each threshold.
    #[test]
    fn allowed_hits_are_near_only_past_the_threshold() {
        // 8 per second (threshold 6): 2 hits from 5 → 7: one near.
        assert_eq!(
            five(split_counts(at(5, 2, 8, 6), true, false, 2)),
            [2, 0, 1, 2, 0]
        );
        // 3 hits from 2 of 20 (threshold 16): none.
        assert_eq!(
            five(split_counts(at(2, 3, 20, 16), true, false, 3)),
            [3, 0, 0, 3, 0]
        );
        // From the threshold on: all.
        assert_eq!(
            five(split_counts(at(16, 3, 20, 16), true, false, 3)),
            [3, 0, 3, 3, 0]
        );
        // Up to the threshold exactly: none; to the limit exactly: those past the threshold.
        assert_eq!(
            five(split_counts(at(10, 6, 20, 16), true, false, 6)),
            [6, 0, 0, 6, 0]
        );
        assert_eq!(
            five(split_counts(at(10, 10, 20, 16), true, false, 10)),
            [10, 0, 4, 10, 0]
        );
        // A check (no hits) counts nothing, wherever the count is.
        assert_eq!(
            five(split_counts(at(18, 0, 20, 16), true, false, 0)),
            [0; 5]
        );
    }

    #[test]
    fn denied_hits_split_at_the_limit_and_the_threshold() {
        // 20 per second (threshold 16): 3 hits from 19 → 22: 2 over, 1 near, none within.
        assert_eq!(
            five(split_counts(at(19, 3, 20, 16), false, false, 3)),
            [3, 2, 1, 0, 0]
        );
        // 7 hits from 15 → 22: 2 over, 4 near (the one from 15 to 16 in the total alone).
        assert_eq!(
            five(split_counts(at(15, 7, 20, 16), false, false, 7)),
            [7, 2, 4, 0, 0]
        );
        // From the limit or past it: all over.
        assert_eq!(
            five(split_counts(at(20, 3, 20, 16), false, false, 3)),
            [3, 3, 0, 0, 0]
        );
        assert_eq!(
            five(split_counts(at(27, 3, 10, 8), false, false, 3)),
            [3, 3, 0, 0, 0]
        );
        // A shadow-mode rule, 15 per hour at 13, 4 hits → 17: 2 over and shadow, 2 near.
        assert_eq!(
            five(split_counts(at(13, 4, 15, 12), false, true, 4)),
            [4, 2, 2, 0, 2]
        );
        assert_eq!(
            five(split_counts(at(15, 2, 15, 12), false, true, 2)),
            [2, 2, 0, 0, 2]
        );
        // A threshold at the limit (NEAR_LIMIT_RATIO=1): no near hits.
        assert_eq!(
            five(split_counts(at(8, 4, 10, 10), false, false, 4)),
            [4, 2, 0, 0, 0]
        );
    }

    #[test]
    fn a_denial_of_hits_that_fit_counts_them_all_over() {
        assert_eq!(
            five(split_counts(at(5, 2, 10, 8), false, false, 2)),
            [2, 2, 0, 0, 0]
        );
    }

    #[test]
    fn the_counts_come_from_what_remained_before_the_charge() {
        use crate::limiter::{LimitParams, Outlook};
        let limit = PlannedLimit {
            name: "",
            requests_per_unit: 20,
            unit: crate::config::Unit::Second,
            params: LimitParams {
                algorithm: Algorithm::FixedWindow,
                requests_per_unit: 20,
                period: 1_000_000_000,
                burst: 20,
                max_delay: 0,
                charge_denied: true,
            },
            slot: 0,
            policy: None,
        };
        // With denied hits charged: 19 + 3 is charged, 0 remaining after, 1 before.
        let verdict = Verdict {
            allowed: false,
            outlook: Outlook {
                remaining: 0,
                reset_after: 0,
            },
            remaining_before: 1,
            charged: true,
            delay: 0,
            retry_after: 0,
        };
        assert_eq!(
            five(split(&limit, &verdict, false, 3, 0.8)),
            [3, 2, 1, 0, 0]
        );
        assert_eq!(outcome(&limit, &verdict, false, 3, 0.8), HitOutcome::Over);
        // Allowed: 14 + 3 → 17, past 16.
        let verdict = Verdict {
            allowed: true,
            outlook: Outlook {
                remaining: 3,
                reset_after: 0,
            },
            remaining_before: 6,
            charged: true,
            ..verdict
        };
        assert_eq!(
            five(split(&limit, &verdict, false, 3, 0.8)),
            [3, 0, 1, 3, 0]
        );
        assert_eq!(outcome(&limit, &verdict, false, 3, 0.8), HitOutcome::Near);
        assert_eq!(outcome(&limit, &verdict, false, 2, 0.8), HitOutcome::Within);
    }
}
