//! After its outage, a key stays within the share this instance kept. The local failure mode
//! started the key from what this instance last saw and kept its share of what was left, leaving
//! the rest to the other instances; when the key's hits are written back and its decisions go to
//! the remote backend again, the other instances may still be deciding on it alone (a cluster
//! master comes back to each instance at its own time) and their hits are not in the backend yet.
//! So the local state outlives the outage: a decision that it would refuse is refused without a
//! call, and what the backend admits is charged to it too, until the state expires. Without it,
//! the first instance back would spend, through the backend, the share another instance is still
//! spending alone.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::{self, LimitParams, State};
use ratelimit_core::store::memory::MemoryKey;
use ratelimit_core::store::{Transaction, Verdicts};

use super::{Guarded, KeyOf, Shared};
use crate::remote::Connect;

impl<C: Connect> Guarded<C> {
    /// The local answer when a key that left an outage has no room left in the share this
    /// instance kept (the request is refused, all or nothing, as the local failure mode decides
    /// it); `None`: the remote backend decides.
    pub(super) fn beyond_kept_share(&self, tx: &Transaction<'_, KeyOf<C>>) -> Option<Verdicts> {
        if self.shared.kept_keys.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut kept = kept(&self.shared);
        let mut full = false;
        for charge in tx.charges.iter().filter(|c| c.enforced) {
            if !kept.contains(&charge.key) {
                continue;
            }
            let Some(state) = self.shared.local.peek_now(charge.key.id()) else {
                // Expired: the share no longer bounds it.
                kept.remove(&charge.key);
                continue;
            };
            full |= !limiter::evaluate(&charge.params, Some(state), tx.now, charge.hits).allowed;
        }
        self.shared.kept_keys.store(kept.len(), Ordering::Relaxed);
        drop(kept);
        full.then(|| self.shared.local.run(*tx))
    }

    /// Charges the kept share with what the remote backend admitted on keys that left an outage.
    pub(super) fn count_in_kept_share(&self, tx: &Transaction<'_, KeyOf<C>>, verdicts: &Verdicts) {
        if self.shared.kept_keys.load(Ordering::Relaxed) == 0 {
            return;
        }
        let kept = kept(&self.shared);
        for (charge, _) in tx
            .charges
            .iter()
            .zip(verdicts)
            .filter(|(c, v)| v.charged && kept.contains(&c.key))
        {
            self.shared
                .local
                .run(Transaction::apply(std::slice::from_ref(charge), tx.now));
        }
    }

    /// The state a key taken over again starts from: the more used of what this instance saw in
    /// the remote backend (`seen`, its share kept) and the share it still keeps from an earlier
    /// outage.
    pub(super) fn start_within_kept(
        &self,
        key: &KeyOf<C>,
        params: &LimitParams,
        from_seen: Option<State>,
        now: Nanos,
    ) -> Option<State> {
        if !kept(&self.shared).contains(key) {
            return from_seen;
        }
        let Some(earlier) = self.shared.local.peek_now(key.id()) else {
            return from_seen;
        };
        let left = |s: Option<State>| {
            limiter::evaluate(params, s, now, 0)
                .without_charge
                .remaining
        };
        if left(Some(earlier)) < left(from_seen) {
            Some(earlier)
        } else {
            from_seen
        }
    }
}

/// `key` leaves the outage at `now` with its local state, which from now bounds this instance's
/// decisions on it. The share kept was rounded down; one hit is given back, so the instances
/// together can use all that was left (at most one hit each over it).
pub(super) fn keep<C: Connect>(
    shared: &Shared<C>,
    key: KeyOf<C>,
    params: &LimitParams,
    now: Nanos,
) {
    let mut kept = kept(shared);
    if kept.contains(&key) || kept.len() >= shared.outage_cap {
        return;
    }
    let Some(state) = shared.local.peek_now(key.id()) else {
        return;
    };
    let state = limiter::uncharge(params, &state, now, 1);
    shared.local.put(key.id(), Some(state), now);
    kept.insert(key);
    shared.kept_keys.store(kept.len(), Ordering::Relaxed);
}

/// Forgets every local state but those of keys whose share is kept.
pub(super) fn clear_all_but_kept<C: Connect>(shared: &Shared<C>, now: Nanos) {
    let kept = kept(shared);
    let states: Vec<_> = kept
        .iter()
        .map(|k| (k.id(), shared.local.peek_now(k.id())))
        .collect();
    shared.local.clear();
    for (id, state) in states {
        shared.local.put(id, state, now);
    }
}

fn kept<C: Connect>(shared: &Shared<C>) -> MutexGuard<'_, HashSet<KeyOf<C>>> {
    shared.kept.lock().unwrap_or_else(PoisonError::into_inner)
}
