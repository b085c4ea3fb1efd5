//! `--record-sample`: which decisions are recorded. Deterministic, not random: of every run of
//! decisions, exactly the share `p` (rounded down) is taken, spread evenly (p = 0.5 takes every
//! second one), so a count of lines is exact and testable.

use std::sync::atomic::{AtomicU64, Ordering};

/// A share `p` in (0, 1], kept as a fraction of 2^32.
#[derive(Debug)]
pub(crate) struct Sampler {
    /// `p × 2^32`, rounded; 2^32 takes everything.
    step: u64,
    seen: AtomicU64,
}

const ONE: u64 = 1 << 32;

impl Sampler {
    /// `p` must be in (0, 1] (the settings check it); other values are clamped into it.
    pub(crate) fn new(p: f64) -> Sampler {
        let step = (p.clamp(0.0, 1.0) * ONE as f64).round() as u64;
        Sampler {
            step: step.clamp(1, ONE),
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the next decision is recorded: the n-th (from 0) is taken when
    /// `floor((n + 1) p) > floor(n p)`.
    pub(crate) fn take(&self) -> bool {
        if self.step == ONE {
            return true;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let before = (u128::from(n) * u128::from(self.step)) >> 32;
        let after = (u128::from(n + 1) * u128::from(self.step)) >> 32;
        after > before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(p: f64, n: usize) -> usize {
        let s = Sampler::new(p);
        (0..n).filter(|_| s.take()).count()
    }

    #[test]
    fn takes_exactly_the_share_spread_evenly() {
        assert_eq!(taken(1.0, 1000), 1000);
        assert_eq!(taken(0.5, 1000), 500);
        assert_eq!(taken(0.1, 1000), 100);
        assert_eq!(taken(0.25, 7), 1);
        let half = Sampler::new(0.5);
        let pattern: Vec<bool> = (0..6).map(|_| half.take()).collect();
        assert_eq!(pattern, [false, true, false, true, false, true]);
        // The smallest share still takes some.
        assert_eq!(Sampler::new(1e-12).step, 1);
    }
}
