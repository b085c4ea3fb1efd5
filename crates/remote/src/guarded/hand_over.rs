//! The local failure mode's outage: its first decision on a key starts from what this instance
//! last saw in the remote backend, keeping this instance's share ([`Guarded::hand_over`]); what it
//! admits is counted, and written back into the backend before the next remote decision on the
//! key ([`Guarded::settle_first`], [`settle`]), after which the key leaves the outage ([`release`])
//! and its local state goes on bounding this instance (`kept_share`).

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};

use ratelimit_core::clock::{Nanos, monotonic};
use ratelimit_core::limiter::{self, LimitParams};
use ratelimit_core::store::memory::MemoryKey;
use ratelimit_core::store::{Charge, Transaction, Verdicts};

use super::{Guarded, KeyOf, Shared, kept_share};
use crate::outage::{Claim, Outage, Settle};
use crate::remote::{Connect, Remote};

/// How many call timeouts a decision waits for another call's write-back of its keys before it
/// is answered locally (a write-back is a read and a write per key, retried a few times).
const SETTLE_WAIT_TIMEOUTS: u32 = 8;

impl<C: Connect> Guarded<C> {
    /// The local failure mode's first decision on a key in this outage starts from the value this
    /// instance last saw in the remote backend, of which it keeps its share of what is left: an
    /// outage does not give every instance the whole limit again.
    pub(super) fn hand_over(&self, tx: &Transaction<'_, KeyOf<C>>) {
        let share = self.share();
        let remote = self.shared.remote.load_full();
        let mut outage = self.outage();
        outage.last_now = Some((tx.now, monotonic()));
        for charge in tx.charges {
            if outage.contains(&charge.key) || outage.len() >= self.shared.outage_cap {
                continue;
            }
            let seen = remote
                .as_ref()
                .and_then(|r| r.last_seen(&charge.key, tx.now));
            let state = limiter::keep_share(&charge.params, seen, tx.now, share);
            let state = self.start_within_kept(&charge.key, &charge.params, state, tx.now);
            self.shared.local.put(charge.key.id(), state, tx.now);
            outage.take_over(charge.key.clone(), charge.params);
            self.shared.outage_keys.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.outage_keys_handed_over.inc();
        }
    }

    /// Adds what the local failure mode admitted to what is written back.
    pub(super) fn count_outage_use(&self, tx: &Transaction<'_, KeyOf<C>>, verdicts: &Verdicts) {
        let mut outage = self.outage();
        for (charge, verdict) in tx.charges.iter().zip(verdicts) {
            if verdict.charged {
                outage.count(&charge.key, charge.hits);
            }
        }
    }

    /// Before a decision goes to the remote backend on keys the local failure mode took over (one
    /// master of a cluster back, or the breaker closed): their hits are written into it first, so
    /// the decision counts them. While another call writes one of its keys back, the decision
    /// waits for that (bounded). Whether the decision may go to the remote backend now: `false`
    /// while one of its keys is still taken over (its write-back failed, or another call's is
    /// still under way), and the local failure mode decides it, within this instance's share:
    /// a decision on the remote backend would not count the hits not written yet.
    pub(super) async fn settle_first(
        &self,
        remote: &C::Backend,
        tx: &Transaction<'_, KeyOf<C>>,
    ) -> bool {
        if self.shared.outage_keys.load(Ordering::Relaxed) == 0 {
            return true;
        }
        let claim = self.outage().claim(tx.charges.iter().map(|c| &c.key));
        let claimed = match claim {
            Claim::Free => return true,
            Claim::Busy => {
                self.wait_settled(tx).await;
                return self.none_taken_over(tx);
            }
            Claim::Settle(claimed) => claimed,
        };
        let (written, unsettled) = settle(remote, claimed.clone(), tx.now).await;
        self.shared.metrics.outage_hits_written_back.inc_by(written);
        let unsettled: Vec<_> = unsettled.into_iter().map(|(k, _, _)| k).collect();
        release(&self.shared, claimed, &unsettled, tx.now);
        self.none_taken_over(tx)
    }

    /// Whether none of `tx`'s keys is taken over by the outage.
    fn none_taken_over(&self, tx: &Transaction<'_, KeyOf<C>>) -> bool {
        let outage = self.outage();
        !tx.charges.iter().any(|c| outage.contains(&c.key))
    }

    /// Waits (at most [`SETTLE_WAIT_TIMEOUTS`] call timeouts) until no key of `tx` is being
    /// written back.
    async fn wait_settled(&self, tx: &Transaction<'_, KeyOf<C>>) {
        let wait = self.shared.connect.timeout() * SETTLE_WAIT_TIMEOUTS;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let done = self.shared.settled.notified();
            let mut done = std::pin::pin!(done);
            done.as_mut().enable();
            {
                let outage = self.outage();
                if !tx
                    .charges
                    .iter()
                    .any(|c| outage.settling(&c.key) == Some(true))
                {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return;
            }
        }
    }

    fn outage(&self) -> MutexGuard<'_, Outage<KeyOf<C>>> {
        self.shared
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A write-back of `claimed` ended at `now`: the keys written leave the outage, their local state
/// kept as the bound of this instance's share (`kept_share`); the other local states go once no
/// key is left.
pub(super) fn release<C: Connect>(
    shared: &Shared<C>,
    claimed: Vec<Settle<KeyOf<C>>>,
    unsettled: &[KeyOf<C>],
    now: Nanos,
) {
    let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
    let params: Vec<_> = claimed.iter().map(|(k, p, _)| (k.clone(), *p)).collect();
    for key in outage.release(claimed, unsettled) {
        if let Some((_, p)) = params.iter().find(|(k, _)| *k == key) {
            kept_share::keep(shared, key, p, now);
        }
    }
    shared.outage_keys.store(outage.len(), Ordering::Relaxed);
    if outage.len() == 0 {
        kept_share::clear_all_but_kept(shared, now);
    }
    drop(outage);
    shared.settled.notify_waiters();
}

/// Charges `remote` with `hits` admitted elsewhere on each key, at most what its limit has left at
/// `now` (another instance may charge the key between the read and the write: a few tries), the
/// keys side by side (their reads and writes share the backend's pipelines). Returns the hits
/// written, and the keys that could not be written (the remote failed).
pub(super) async fn settle<B: Remote>(
    remote: &B,
    keys: Vec<Settle<B::Key>>,
    now: Nanos,
) -> (u64, Vec<Settle<B::Key>>) {
    let keys: Vec<_> = keys.into_iter().filter(|(_, _, hits)| *hits > 0).collect();
    let took = futures_util::future::join_all(
        keys.iter()
            .map(|(key, params, hits)| settle_one(remote, key, *params, *hits, now)),
    )
    .await;
    let mut written = 0u64;
    let mut unsettled = Vec::new();
    for (settle, took) in keys.into_iter().zip(took) {
        match took {
            Some(took) => written += took,
            None => unsettled.push(settle),
        }
    }
    (written, unsettled)
}

/// [`settle`] for one key: the hits written (0 when its limit had nothing left), or `None` when
/// the remote failed or kept changing the key.
async fn settle_one<B: Remote>(
    remote: &B,
    key: &B::Key,
    params: LimitParams,
    hits: u64,
    now: Nanos,
) -> Option<u64> {
    for _ in 0..3 {
        let state = remote.peek(key).await.ok()?;
        let take = limiter::settled_hits(&params, state, now, hits);
        if take == 0 {
            return Some(0);
        }
        let charge = Charge::new(key.clone(), params, take);
        let tx = Transaction::apply(std::slice::from_ref(&charge), now);
        match remote.transact(tx).await {
            Ok(v) if v.first().is_some_and(|v| v.charged) => return Some(take),
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "writing the outage's hits back failed");
                return None;
            }
        }
    }
    None
}
