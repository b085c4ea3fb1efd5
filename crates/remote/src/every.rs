//! "At most once per period": whether a repeated message is due again, for warnings that must
//! keep coming while a fault lasts without flooding the log. Time is passed in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Says yes at most once per `period` (the first time always), from any thread.
#[derive(Debug)]
pub struct Every {
    period: u64,
    /// When it last said yes, in ns since the caller's epoch, plus one (0: never).
    last: AtomicU64,
}

impl Every {
    pub const fn new(period: Duration) -> Every {
        Every {
            period: period.as_nanos() as u64,
            last: AtomicU64::new(0),
        }
    }

    /// Whether the message is due at `now` (ns since a fixed epoch of the caller's); if so, the
    /// next one is due a period later. Of racing callers, one gets yes.
    pub fn due(&self, now: u64) -> bool {
        let stamp = now.saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && stamp.saturating_sub(last) < self.period {
            return false;
        }
        self.last
            .compare_exchange(last, stamp, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_then_once_per_period() {
        let every = Every::new(Duration::from_secs(30));
        let s = 1_000_000_000;
        assert!(every.due(0));
        assert!(!every.due(s));
        assert!(!every.due(29 * s));
        assert!(every.due(30 * s));
        assert!(!every.due(31 * s));
        assert!(every.due(61 * s));
    }
}
