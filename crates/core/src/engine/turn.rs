//! Waiting for a leaky bucket's turn: the answer of an admitted request is held until the latest
//! turn among its enforced charges, on the engine's own clock (`Clock::sleep_until`, the clock the
//! decision read: a manual clock in tests releases the answer when it is moved to the turn), with
//! no thread and no lock held. If the caller goes away first (tonic drops the handler's future when
//! the client cancels), a drop guard gives the queue turns back to the store.

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

/// Sleeps until the request's turn (`now`, the decision's time, plus its delay); refunds its
/// turns if dropped before then. Allocates nothing when the request need not wait.
pub(super) async fn wait<B: Backend>(
    store: &Store<B>,
    clock: &dyn Clock,
    now: Nanos,
    charges: &[Charge<B::Key>],
    verdicts: &[Verdict],
) {
    let delay = charges
        .iter()
        .zip(verdicts)
        .filter(|(c, _)| c.enforced)
        .map(|(_, v)| v.delay)
        .max()
        .unwrap_or(0);
    if delay == 0 {
        return;
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
    clock.sleep_until(now.saturating_add(delay)).await;
    guard.charges.clear();
}
