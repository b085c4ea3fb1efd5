//! How long to wait before the next connection attempt, as a pure function of the attempt number
//! and a random draw: exponential from the initial interval to the maximum
//! (`XDS_CLIENT_BACKOFF_*`), each delay spread by ± the random factor when jitter is on.

use std::time::Duration;

/// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, `_MAX_INTERVAL`, `_RANDOM_FACTOR`, `_JITTER`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    /// Share of the delay it may move by either way, in [0, 1].
    pub(crate) random_factor: f64,
    pub(crate) jitter: bool,
}

impl Backoff {
    /// The delay before attempt `attempt` (0 for the first retry), `draw` in [0, 1) choosing
    /// where in the spread it lands; never above `max`.
    pub fn delay(&self, attempt: u32, draw: f64) -> Duration {
        let base = self
            .initial
            .checked_mul(1u32 << attempt.min(30))
            .unwrap_or(self.max)
            .min(self.max);
        if !self.jitter {
            return base;
        }
        let factor = self.random_factor.clamp(0.0, 1.0);
        let draw = draw.clamp(0.0, 1.0);
        let spread = 1.0 - factor + 2.0 * factor * draw;
        Duration::try_from_secs_f64(base.as_secs_f64() * spread)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// A draw in [0, 1) from the process's random hash keys and a counter: different per call and per
/// process, no generator to seed.
pub(super) fn draw() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn reference() -> Backoff {
        Backoff {
            initial: 10 * S,
            max: 60 * S,
            random_factor: 0.5,
            jitter: true,
        }
    }

    #[test]
    fn doubles_from_the_initial_interval_up_to_the_maximum() {
        let b = Backoff {
            jitter: false,
            ..reference()
        };
        let delays: Vec<u64> = (0..5).map(|a| b.delay(a, 0.3).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 60, 60]);
        assert_eq!(b.delay(u32::MAX, 0.0), 60 * S);
    }

    #[test]
    fn jitter_spreads_by_the_random_factor_and_never_passes_the_maximum() {
        let b = reference();
        assert_eq!(b.delay(0, 0.0), 5 * S);
        assert_eq!(b.delay(0, 0.5), 10 * S);
        assert_eq!(b.delay(0, 1.0), 15 * S);
        assert_eq!(b.delay(3, 1.0), 60 * S);
        let b = Backoff {
            random_factor: 7.0,
            ..reference()
        };
        assert_eq!(b.delay(0, 0.0), Duration::ZERO);
        // No overflow, whatever the settings.
        let huge = Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
            ..reference()
        };
        assert_eq!(huge.delay(5, 1.0), Duration::MAX);
    }

    #[test]
    fn draws_are_in_the_unit_interval() {
        for _ in 0..1000 {
            let d = draw();
            assert!((0.0..1.0).contains(&d), "{d}");
        }
    }
}
