//! One rule's limits as the token bucket RLQS can assign: a long-run rate (`tokens` per
//! `period_secs`) and a burst. Envoy's filter enforces only token buckets (and blanket rules),
//! so every algorithm is honoured as one; see docs/algorithms.md.

use crate::calendar;
use crate::clock::NANOS_PER_SECOND;
use crate::config::Algorithm;
use crate::limiter::LimitParams;

/// The longest fill interval handed out, in seconds: Envoy reads a token bucket's rate as
/// `tokens_per_fill / whole seconds of fill_interval`, so a long interval gives a fine rate.
const FINE_FILL_INTERVAL_SECS: u64 = 3600;

/// What a rule allows, as one token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Tokens added per period.
    pub tokens: u32,
    /// The period in whole seconds (at least 1).
    pub period_secs: u64,
    /// The bucket's capacity.
    pub burst: u32,
}

impl Pool {
    /// The pool of a rule with these limits: the slowest long-run rate among them and the smallest
    /// burst (a fixed or sliding window's burst is its count: what it admits at once). `None` for
    /// no limits.
    pub(crate) fn of(limits: &[LimitParams]) -> Option<Pool> {
        limits
            .iter()
            .map(|p| Pool {
                tokens: p.requests_per_unit,
                // A calendar window counts here as its unit's nominal length.
                period_secs: (calendar::nominal(p.period) / NANOS_PER_SECOND).max(1),
                burst: match p.algorithm {
                    Algorithm::TokenBucket | Algorithm::LeakyBucket => p.burst,
                    Algorithm::FixedWindow | Algorithm::SlidingWindow => p.requests_per_unit,
                },
            })
            .reduce(|a, b| {
                let slower = if u128::from(b.tokens) * u128::from(a.period_secs)
                    < u128::from(a.tokens) * u128::from(b.period_secs)
                {
                    b
                } else {
                    a
                };
                Pool {
                    burst: a.burst.min(b.burst),
                    ..slower
                }
            })
    }

    /// Tokens per second.
    pub(crate) fn rate(&self) -> f64 {
        f64::from(self.tokens) / self.period_secs as f64
    }

    /// The fill interval every share of this pool is given (whole seconds): an hour when the
    /// pool's tokens per hour fit Envoy's `uint32 tokens_per_fill`, else the period.
    pub fn fill_interval_secs(&self) -> u64 {
        if self.tokens_per(FINE_FILL_INTERVAL_SECS) <= u128::from(u32::MAX) {
            FINE_FILL_INTERVAL_SECS
        } else {
            self.period_secs
        }
    }

    /// Whole tokens the pool adds in `secs` seconds, rounded down.
    pub(crate) fn tokens_per(&self, secs: u64) -> u128 {
        u128::from(self.tokens) * u128::from(secs) / u128::from(self.period_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(algorithm: Algorithm, rpu: u32, secs: u64, burst: u32) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: rpu,
            period: secs * NANOS_PER_SECOND,
            burst,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn a_window_bursts_its_count_and_a_bucket_its_burst() {
        let tb = Pool::of(&[params(Algorithm::TokenBucket, 10, 60, 20)]).unwrap();
        assert_eq!((tb.tokens, tb.period_secs, tb.burst), (10, 60, 20));
        let fw = Pool::of(&[params(Algorithm::FixedWindow, 10, 60, 20)]).unwrap();
        assert_eq!(fw.burst, 10);
    }

    #[test]
    fn several_limits_take_the_slowest_rate_and_the_smallest_burst() {
        let pool = Pool::of(&[
            params(Algorithm::TokenBucket, 10, 1, 10),
            params(Algorithm::TokenBucket, 1000, 86_400, 1000),
        ])
        .unwrap();
        assert_eq!(
            (pool.tokens, pool.period_secs, pool.burst),
            (1000, 86_400, 10)
        );
        assert_eq!(Pool::of(&[]), None);
    }

    #[test]
    fn the_fill_interval_is_an_hour_unless_the_tokens_would_not_fit() {
        let slow = Pool::of(&[params(Algorithm::TokenBucket, 10, 60, 10)]).unwrap();
        assert_eq!(slow.fill_interval_secs(), 3600);
        let fast = Pool::of(&[params(Algorithm::TokenBucket, u32::MAX, 1, 10)]).unwrap();
        assert_eq!(fast.fill_interval_secs(), 1);
    }
}
