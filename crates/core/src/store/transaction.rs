//! One request's transaction on the states of its keys, as a pure function: all-or-nothing over
//! its charges (`decide`), or the leaky-bucket turns of a cancelled request given back. The single
//! definition every backend runs (memory under its shard locks, a remote store on the states it
//! expects and then checks by compare-and-set), so they give the same verdicts.

use smallvec::SmallVec;

use super::{Charge, Verdict, Verdicts};
use crate::clock::Nanos;
use crate::limiter::{self, State};

/// What a transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionKind {
    /// Charge all of the charges iff every enforced one fits.
    Apply,
    /// Give back the leaky-bucket turns the charges took (their answers were never delivered).
    Refund,
}

/// One request's transaction: its charges, at `now`.
#[derive(Debug)]
pub struct Transaction<'a, K> {
    pub charges: &'a [Charge<K>],
    pub now: Nanos,
    pub kind: TransactionKind,
}

impl<K> Clone for Transaction<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Transaction<'_, K> {}

impl<'a, K: PartialEq> Transaction<'a, K> {
    pub fn apply(charges: &'a [Charge<K>], now: Nanos) -> Self {
        Transaction {
            charges,
            now,
            kind: TransactionKind::Apply,
        }
    }

    pub fn refund(charges: &'a [Charge<K>], now: Nanos) -> Self {
        Transaction {
            charges,
            now,
            kind: TransactionKind::Refund,
        }
    }

    pub fn is_refund(&self) -> bool {
        self.kind == TransactionKind::Refund
    }

    /// The distinct keys of its charges, in order of first appearance.
    pub(crate) fn keys(&self) -> SmallVec<[K; 4]>
    where
        K: Clone,
    {
        let mut keys: SmallVec<[K; 4]> = SmallVec::new();
        for c in self.charges {
            if !keys.contains(&c.key) {
                keys.push(c.key.clone());
            }
        }
        keys
    }

    /// Runs on `states`, the states of `keys` (which hold every key of the charges), leaving the
    /// new states there. Returns the verdicts (none for a refund).
    pub fn run(&self, keys: &[K], states: &mut [Option<State>]) -> Verdicts {
        let at = |key: &K| keys.iter().position(|k| k == key);
        match self.kind {
            TransactionKind::Refund => {
                for charge in self.charges {
                    if let Some(i) = at(&charge.key)
                        && let Some(state) = states[i]
                    {
                        states[i] = Some(limiter::refund(
                            &charge.params,
                            &state,
                            self.now,
                            charge.hits,
                        ));
                    }
                }
                Verdicts::new()
            }
            TransactionKind::Apply => {
                let decision = decide(self.charges, self.now, |k| at(k).and_then(|i| states[i]));
                for (index, state) in &decision.writes {
                    if let Some(i) = at(&self.charges[*index].key) {
                        states[i] = Some(*state);
                    }
                }
                decision.verdicts
            }
        }
    }
}

/// `decide` for a request of one charge, the common case, without its bookkeeping: the verdict,
/// and the state to store if it is charged.
#[inline]
pub(crate) fn decide_one<K>(
    charge: &Charge<K>,
    state: Option<State>,
    now: Nanos,
) -> (Verdict, Option<State>) {
    let evaluation = limiter::evaluate(&charge.params, state, now, charge.hits);
    let charged = evaluation.allowed || charge.params.charge_denied;
    (
        verdict(&evaluation, charged),
        charged.then_some(evaluation.state_after),
    )
}

/// What to answer and what to write for one request.
#[derive(Debug)]
pub struct TransactionOutcome {
    pub verdicts: Verdicts,
    /// Whether the request is charged (every enforced charge fits).
    pub commit: bool,
    /// (charge index, state to store) in charge order: when committing, every charge that fit;
    /// whether or not, every charge whose limit counts denied hits (`LimitParams::charge_denied`).
    /// A key charged twice appears twice, the later state including the earlier charge.
    pub writes: SmallVec<[(usize, State); 4]>,
}

/// The client's view of a charge: after it if it was charged, else as things stand.
fn verdict(e: &limiter::Evaluation, charged: bool) -> Verdict {
    Verdict {
        allowed: e.allowed,
        outlook: if charged {
            e.after_charge
        } else {
            e.without_charge
        },
        remaining_before: e.without_charge.remaining,
        charged,
        delay: if charged { e.delay } else { 0 },
        retry_after: if e.allowed { 0 } else { e.retry_after },
    }
}

/// Whether the request may be charged: every enforced charge fits, except that quota descriptors
/// (`Charge::quota`) block only when all of them are over.
fn fits<K>(charges: &[Charge<K>], evaluations: &[limiter::Evaluation]) -> bool {
    let mut quota: SmallVec<[(u32, bool); 4]> = SmallVec::new();
    for (c, e) in charges.iter().zip(evaluations) {
        if !c.enforced {
            continue;
        }
        match c.quota {
            None if !e.allowed => return false,
            None => {}
            Some(d) => match quota.iter_mut().find(|(q, _)| *q == d) {
                Some((_, fits)) => *fits &= e.allowed,
                None => quota.push((d, e.allowed)),
            },
        }
    }
    quota.is_empty() || quota.iter().any(|(_, fits)| *fits)
}

/// Evaluates every charge at `now` (each as if the earlier charges of the request on the same key
/// were charged), and charges all iff every enforced one fits. Charges whose limit counts denied
/// hits are charged either way, as the reference counts every descriptor of every request.
/// `stored` gives a key's state.
pub fn decide<K: PartialEq>(
    charges: &[Charge<K>],
    now: Nanos,
    mut stored: impl FnMut(&K) -> Option<State>,
) -> TransactionOutcome {
    let mut pending: SmallVec<[(usize, State); 4]> = SmallVec::new();
    let mut evaluations: SmallVec<[limiter::Evaluation; 4]> = SmallVec::new();
    // Whether each charge was evaluated on top of an earlier charge of the same key.
    let mut stacked: SmallVec<[bool; 4]> = SmallVec::new();
    for charge in charges {
        let earlier = pending
            .iter()
            .rev()
            .find(|(i, _)| charges[*i].key == charge.key)
            .map(|(_, s)| *s);
        stacked.push(earlier.is_some());
        let current = earlier.or_else(|| stored(&charge.key));
        let evaluation = limiter::evaluate(&charge.params, current, now, charge.hits);
        if evaluation.allowed || charge.params.charge_denied {
            pending.push((evaluations.len(), evaluation.state_after));
        }
        evaluations.push(evaluation);
    }
    let commit = fits(charges, &evaluations);
    if !commit {
        // Nothing was taken: a key repeated in the request shows what it has now, not what it
        // would have had after the earlier (uncharged) charges of this request.
        for ((charge, evaluation), _) in charges
            .iter()
            .zip(evaluations.iter_mut())
            .zip(&stacked)
            .filter(|((charge, _), stacked)| **stacked && !charge.params.charge_denied)
        {
            let alone = limiter::evaluate(&charge.params, stored(&charge.key), now, charge.hits);
            evaluation.without_charge = alone.without_charge;
            evaluation.retry_after = alone.retry_after;
        }
        pending.retain(|(i, _)| charges[*i].params.charge_denied);
    }
    TransactionOutcome {
        verdicts: evaluations
            .iter()
            .zip(charges)
            .map(|(e, c)| verdict(e, (commit && e.allowed) || c.params.charge_denied))
            .collect(),
        commit,
        writes: pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::Algorithm;
    use crate::limiter::LimitParams;

    /// A charge on key `key` of a limit of 1 per second, already used up when `full`.
    fn charge(key: u32, quota: Option<u32>) -> Charge<u32> {
        Charge {
            key,
            params: LimitParams {
                algorithm: Algorithm::FixedWindow,
                requests_per_unit: 1,
                period: S,
                burst: 1,
                max_delay: 0,
                charge_denied: false,
            },
            hits: 1,
            enforced: true,
            quota,
        }
    }

    fn commits(charges: &[Charge<u32>], full: &[u32]) -> bool {
        decide(charges, 10 * S, |k| {
            full.contains(k).then_some(State { a: 11 * S, b: 1 })
        })
        .commit
    }

    #[test]
    fn one_charge_decides_as_decide_does() {
        for enforced in [true, false] {
            for full in [false, true] {
                let mut c = charge(1, None);
                c.enforced = enforced;
                let state = full.then_some(State { a: 11 * S, b: 1 });
                let d = decide(&[c], 10 * S, |_| state);
                let (v, write) = decide_one(&c, state, 10 * S);
                assert_eq!(d.verdicts[0], v, "{enforced} {full}");
                assert_eq!(
                    d.writes.first().map(|(_, s)| *s),
                    write,
                    "{enforced} {full}"
                );
            }
        }
    }

    #[test]
    fn with_charge_denied_every_charge_of_a_denied_request_is_written() {
        let counting = |key| {
            let mut c = charge(key, None);
            c.params.charge_denied = true;
            c
        };
        let full = |k: &u32| (*k == 2).then_some(State { a: 11 * S, b: 1 });
        let charges = [counting(1), counting(2)];
        let d = decide(&charges, 10 * S, full);
        assert!(!d.commit, "key 2 is over");
        let written: Vec<(usize, u64)> = d.writes.iter().map(|(i, s)| (*i, s.b)).collect();
        assert_eq!(
            written,
            [(0, 1), (1, 2)],
            "both counted, as the reference counts"
        );
        assert!(d.verdicts.iter().all(|v| v.charged));
        assert!(d.verdicts[0].allowed && !d.verdicts[1].allowed);
        // Without it, a denied request writes nothing.
        let d = decide(&[charge(1, None), charge(2, None)], 10 * S, full);
        assert!(d.writes.is_empty());
        // One charge: `decide_one` writes the same.
        let (v, write) = decide_one(&counting(2), full(&2), 10 * S);
        assert!(!v.allowed && v.charged);
        assert_eq!(write.map(|s| s.b), Some(2));
    }

    #[test]
    fn quota_descriptors_deny_only_when_all_are_over() {
        let two_quotas = [charge(1, Some(0)), charge(2, Some(1))];
        assert!(commits(&two_quotas, &[]));
        assert!(
            commits(&two_quotas, &[1]),
            "one quota descriptor still fits"
        );
        assert!(
            !commits(&two_quotas, &[1, 2]),
            "every quota descriptor is over"
        );
        // A plain descriptor over its limit denies whatever the quotas say.
        let mixed = [charge(1, Some(0)), charge(3, None)];
        assert!(!commits(&mixed, &[3]));
        assert!(!commits(&mixed, &[1]), "the only quota descriptor is over");
        // Two limits of one quota descriptor: it is over when either is.
        let one_descriptor = [charge(1, Some(0)), charge(2, Some(0)), charge(4, Some(1))];
        assert!(commits(&one_descriptor, &[1]), "descriptor 1 still fits");
        assert!(!commits(&one_descriptor, &[1, 4]));
    }
}
