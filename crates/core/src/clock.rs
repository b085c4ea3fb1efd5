//! Time as a value, and waiting on it: the `Clock` trait (read the time, sleep until a time), the
//! system clock, and a manual clock for tests. The only reader of wall time, and the one timer a
//! decision waits on, so a test that moves a manual clock moves every wait that depends on it.
//! Everything else takes `now` (Unix nanoseconds) as an argument.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// Nanoseconds since the Unix epoch. u64 holds them until the year 2554.
pub type Nanos = u64;

pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// A wait on a clock: completes once the clock reads the time it was asked for.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A source of the current time, and of waits on it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;

    /// Completes once `now()` reads `at` or later (at once if it already does). Waits measured on
    /// this clock, not on another timer, so decisions and waits never disagree about the time.
    fn sleep_until(&self, at: Nanos) -> Sleep;
}

/// Monotonic time for timeouts, back-off and latency (not for decisions, which take a [`Clock`]):
/// tokio's reading, so it follows tokio's paused time in tests that pause it.
pub fn monotonic() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// The real wall clock; its waits are tokio timers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the one read of wall time; clippy.toml disallows it everywhere else"
    )]
    fn now(&self) -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }

    /// A tokio timer for the time left: tokio's timer is monotonic, so a wall-clock step while
    /// waiting neither cuts the wait short nor stretches it.
    fn sleep_until(&self, at: Nanos) -> Sleep {
        let left = at.saturating_sub(self.now());
        Box::pin(tokio::time::sleep(Duration::from_nanos(left)))
    }
}

/// A clock that moves only when told to; its waits end when it is moved past them. Clones share the
/// same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    inner: Arc<Manual>,
}

#[derive(Debug, Default)]
struct Manual {
    now: AtomicU64,
    /// Woken on every move: each waiter re-reads the time.
    moved: Notify,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            inner: Arc::new(Manual {
                now: AtomicU64::new(start),
                moved: Notify::new(),
            }),
        }
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .inner
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
        self.inner.moved.notify_waiters();
    }

    pub fn set(&self, now: Nanos) {
        self.inner.now.store(now, Ordering::SeqCst);
        self.inner.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.inner.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at: Nanos) -> Sleep {
        let inner = self.inner.clone();
        Box::pin(async move {
            loop {
                // Registered before the time is read, so a move between the read and the wait
                // still wakes this waiter.
                let moved = inner.moved.notified();
                let mut moved = std::pin::pin!(moved);
                moved.as_mut().enable();
                if inner.now.load(Ordering::SeqCst) >= at {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

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
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800 * NANOS_PER_SECOND);
    }

    #[test]
    fn a_wait_for_a_time_already_passed_ends_at_once() {
        let clock = ManualClock::new(100);
        assert_eq!(clock.sleep_until(100).now_or_never(), Some(()));
        assert_eq!(clock.sleep_until(0).now_or_never(), Some(()));
    }

    #[tokio::test]
    async fn a_system_wait_for_a_past_time_ends() {
        SystemClock.sleep_until(0).await;
        SystemClock.sleep_until(SystemClock.now()).await;
    }

    #[tokio::test]
    async fn a_manual_wait_ends_when_the_clock_is_moved_to_it_and_not_before() {
        let clock = ManualClock::new(0);
        let mut early = clock.sleep_until(10);
        let mut late = clock.sleep_until(20);
        assert!(
            (&mut early).now_or_never().is_none(),
            "the clock stands still"
        );
        clock.advance(Duration::from_nanos(9));
        assert!((&mut early).now_or_never().is_none(), "1 ns short");
        clock.advance(Duration::from_nanos(1));
        // Woken by the move, from another task as a server would be.
        tokio::spawn(early).await.unwrap();
        assert!(
            (&mut late).now_or_never().is_none(),
            "the later one still waits"
        );
        let waiting = tokio::spawn(late);
        tokio::task::yield_now().await;
        clock.set(25);
        waiting.await.unwrap();
    }
}
