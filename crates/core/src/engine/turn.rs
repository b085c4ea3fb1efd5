//! Waiting for a leaky bucket's turn: the answer of an admitted request is held until the latest
//! turn among its enforced charges, on the engine's own clock (`Clock::sleep_until`, the clock the
//! decision read: a manual clock in tests releases the answer when it is moved to the turn), with
//! no thread and no lock held. If the caller goes away first (tonic drops the handler's future when
//! the client cancels), a drop guard gives the queue turns back to the store. At most
//! `max_waiting` answers wait at once across keys ([`Waiting`]): one more is not held, and its
//! turns are given back as a cancelled caller's are.

use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::IntGauge;

use crate::clock::{Clock, Nanos};
use crate::config::Algorithm;
use crate::store::{Backend, Charge, Store, Verdict};

/// Gives back the leaky-bucket turns of a request unless disarmed.
struct RefundOnDrop<'a, B: Backend> {
    store: &'a Store<B>,
    clock: &'a dyn Clock,
    charges: Vec<Charge<B::Key>>,
}

impl<B: Backend> Drop for RefundOnDrop<'_, B> {
    fn drop(&mut self) {
        if !self.charges.is_empty() {
            self.store.refund(&self.charges, self.clock.now());
        }
    }
}

/// The answers waiting for their turns, and the most that may.
pub(super) struct Waiting {
    now: AtomicUsize,
    max: usize,
    /// `ratelimit_waiting_answers`, when the engine has metrics.
    gauge: Option<IntGauge>,
}

impl Waiting {
    pub(super) fn new(max: usize) -> Waiting {
        Waiting {
            now: AtomicUsize::new(0),
            max,
            gauge: None,
        }
    }

    /// Also shown in `gauge`.
    pub(super) fn with_gauge(mut self, gauge: IntGauge) -> Waiting {
        self.gauge = Some(gauge);
        self
    }

    /// A place among the waiting, or `Full` with how many wait.
    fn enter(&self) -> Result<Place<'_>, Full> {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map(|_| {
                if let Some(gauge) = &self.gauge {
                    gauge.inc();
                }
                Place(self)
            })
            .map_err(Full)
    }
}

/// One answer's place among the waiting, left when dropped.
struct Place<'a>(&'a Waiting);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
        if let Some(gauge) = &self.0.gauge {
            gauge.dec();
        }
    }
}

/// `max_waiting` answers wait already (how many).
#[derive(Debug)]
pub(super) struct Full(pub(super) usize);

/// Sleeps until the request's turn (`now`, the decision's time, plus its delay); refunds its
/// turns if dropped before then, or at once with `Full` when `waiting` has no place left.
/// Allocates nothing when the request need not wait.
pub(super) async fn wait<B: Backend>(
    store: &Store<B>,
    clock: &dyn Clock,
    waiting: &Waiting,
    now: Nanos,
    charges: &[Charge<B::Key>],
    verdicts: &[Verdict],
) -> Result<(), Full> {
    let delay = charges
        .iter()
        .zip(verdicts)
        .filter(|(c, _)| c.enforced)
        .map(|(_, v)| v.delay)
        .max()
        .unwrap_or(0);
    if delay == 0 {
        return Ok(());
    }
    let mut guard = RefundOnDrop {
        store,
        clock,
        charges: charges
            .iter()
            .zip(verdicts)
            .filter(|(c, v)| v.charged && c.params.algorithm == Algorithm::LeakyBucket)
            .map(|(c, _)| c.clone())
            .collect(),
    };
    let _place = waiting.enter()?;
    clock.sleep_until(now.saturating_add(delay)).await;
    guard.charges.clear();
    Ok(())
}
