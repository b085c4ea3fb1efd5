//! Time as a value: the `Clock` trait, the system clock, and a manual clock for tests. The only place
//! that reads the wall clock; everything else takes `now` (Unix nanoseconds) as an argument.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch. u64 holds them until the year 2554.
pub type Nanos = u64;

pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, now: Nanos) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new(5);
        let other = clock.clone();
        assert_eq!(clock.now(), 5);
        other.advance(Duration::from_nanos(10));
        assert_eq!(clock.now(), 15);
        clock.set(100);
        assert_eq!(other.now(), 100);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800 * NANOS_PER_SECOND);
    }
}
