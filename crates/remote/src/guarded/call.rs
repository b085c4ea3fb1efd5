//! One call on the connected backend as a decision makes it: with the breaker's permit (none while
//! it is open: the background prober alone probes), under the decision deadline, its outcome
//! recorded in the breaker and counted. [`Guarded::call`] offers the same to any call the server
//! makes on the backend beside decisions (the RLQS demand exchange).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Instant;

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::StoreError;

use super::{Guarded, switch, tasks};
use crate::breaker::{Breaker, Change, Permit};
use crate::remote::{Connect, Remote, Shard};

/// What became of a call made through the breaker.
pub(super) enum Answer<T> {
    /// The backend answered (or the decision ran out of time while it answered others): this is
    /// the answer.
    Answered(Result<T, StoreError>),
    /// The backend is not there (the breaker is open, the call failed, or nothing answered in
    /// time): the failure mode answers. The call's own error, if it failed with one.
    Down(Option<StoreError>),
}

impl<C: Connect> Guarded<C> {
    /// Runs `call` on the connected backend under the layer's deadline and the breaker's permit,
    /// and counts its failure as a decision's: an error (or no answer in time) may open the
    /// breaker. Answers `Unavailable` without calling while the breaker is open or before the
    /// first connection.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnOnce(Arc<C::Backend>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let remote = self.shared.remote.load_full();
        let Some(remote) = remote.filter(|_| self.breaker().is_up()) else {
            return Err(self.unavailable());
        };
        match self.through(call(remote)).await {
            Answer::Answered(answer) => answer,
            Answer::Down(error) => Err(error.unwrap_or_else(|| self.unavailable())),
        }
    }

    fn unavailable(&self) -> StoreError {
        StoreError::Unavailable(format!("{} is unavailable", self.shared.name.title))
    }

    pub(super) fn breaker(&self) -> MutexGuard<'_, Breaker> {
        self.shared
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn permit(&self) -> Permit {
        let mut b = self.breaker();
        let permit = b.permit(monotonic());
        self.shared.metrics.breaker_state.set(b.state() as i64);
        permit
    }

    /// Tells the breaker that a probe failed at once (`Breaker::record_fast_probe_failure`).
    pub(super) fn record_fast_probe_failure(&self) {
        let mut b = self.breaker();
        b.record_fast_probe_failure(monotonic());
        self.shared.metrics.breaker_state.set(b.state() as i64);
    }

    /// Tells the breaker how a call went; starts a check when failures follow an answer, and the
    /// prober when the breaker opens.
    pub(super) fn record(&self, permit: Permit, ok: bool) {
        let (change, suspects) = {
            let mut b = self.breaker();
            let change = b.record(permit, ok, monotonic());
            self.shared.metrics.breaker_state.set(b.state() as i64);
            (change, b.suspects())
        };
        if suspects && !self.shared.checking.swap(true, Ordering::AcqRel) {
            tokio::spawn(tasks::check_again(Arc::downgrade(&self.shared)));
        }
        if let Some(change) = change {
            switch::switched(&self.shared, change, true);
            if change == Change::Down {
                tokio::spawn(tasks::probe(Arc::downgrade(&self.shared)));
            }
        }
    }

    /// Whether the remote backend answered any call at or after `since`.
    fn answered_since(&self, since: Instant) -> bool {
        self.shared
            .remote
            .load()
            .as_ref()
            .is_some_and(|r| r.answered_since(since))
    }

    /// Makes `call` through the breaker, under the decision deadline.
    pub(super) async fn through<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Answer<T> {
        self.through_for(call, &[]).await
    }

    /// [`Guarded::through`] for a call on keys of `shards` (cluster masters): its failure is
    /// theirs (`per_shard`), not the whole backend's, whose breaker hears only its answer, so one
    /// dead master does not open it while the others answer.
    pub(super) async fn through_for<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
        shards: &[(Shard, Permit)],
    ) -> Answer<T> {
        // Requests call only while the breaker is closed; while it is open the background prober
        // alone probes (with a fresh connection if the old ones fail: a request's probe on the
        // old connections would wait out their own reconnection backoff).
        if !self.breaker().is_up() {
            return Answer::Down(None);
        }
        let permit = Permit::Call;
        let started = monotonic();
        let metrics = &self.shared.metrics;
        match tokio::time::timeout(self.shared.deadline, call).await {
            Ok(Ok(value)) => {
                self.record(permit, true);
                Answer::Answered(Ok(value))
            }
            // The backend answered; other instances kept changing the keys.
            Ok(Err(e @ StoreError::Contention(_))) => {
                self.record(permit, true);
                metrics.store_errors.inc();
                Answer::Answered(Err(e))
            }
            Ok(Err(e)) => {
                if shards.is_empty() {
                    self.shared.failed_with(&e);
                    self.record(permit, false);
                }
                metrics.store_errors.inc();
                tracing::debug!(error = %e, "{} call failed", self.shared.name.title);
                Answer::Down(Some(e))
            }
            // The backend answered meanwhile, but this decision did not finish within its
            // (generous) bound: not an outage. It is answered as an error, never by the failure
            // mode, which might admit what the backend would refuse.
            Err(_) if self.answered_since(started) => {
                metrics.store_errors.inc();
                metrics.over_budget.inc();
                Answer::Answered(Err(StoreError::Unavailable(format!(
                    "the decision did not finish within {:?} while {} answered; not admitted",
                    self.shared.deadline, self.shared.name.title
                ))))
            }
            // Nothing answered: the backend is not there.
            Err(_) => {
                metrics.store_errors.inc();
                Answer::Down(None)
            }
        }
    }
}
