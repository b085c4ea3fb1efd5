//! All-or-nothing over one request's charges, as a pure function of the keys' stored states: the
//! single definition that every store (memory, Redis) applies, so they give the same verdicts.

use smallvec::SmallVec;

use super::{Charge, Verdict, Verdicts};
use crate::clock::Nanos;
use crate::limiter::{self, State};

/// What to answer and what to write for one request.
#[derive(Debug)]
pub struct Decision {
    pub verdicts: Verdicts,
    /// Whether the request is charged (every enforced charge fits).
    pub commit: bool,
    /// When committing: (charge index, state to store) in charge order; a key charged twice
    /// appears twice, the later state including the earlier charge.
    pub writes: SmallVec<[(usize, State); 4]>,
}

/// The client's view of a charge: after it if it was charged, else as things stand.
pub fn verdict(e: &limiter::Evaluation, charged: bool) -> Verdict {
    Verdict {
        allowed: e.allowed,
        outlook: if charged {
            e.after_charge
        } else {
            e.without_charge
        },
        charged,
        delay: if charged { e.delay } else { 0 },
    }
}

/// Evaluates every charge at `now` (each as if the earlier charges of the request on the same key
/// were charged), and charges all iff every enforced one fits. `stored` gives a key's state.
pub fn decide<K: PartialEq>(
    charges: &[Charge<K>],
    now: Nanos,
    mut stored: impl FnMut(&K) -> Option<State>,
) -> Decision {
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
        if evaluation.allowed {
            pending.push((evaluations.len(), evaluation.charged));
        }
        evaluations.push(evaluation);
    }
    let commit = charges
        .iter()
        .zip(&evaluations)
        .all(|(c, e)| e.allowed || !c.enforced);
    if !commit {
        // Nothing was taken: a key repeated in the request shows what it has now, not what it
        // would have had after the earlier (uncharged) charges of this request.
        for ((charge, evaluation), _) in charges
            .iter()
            .zip(evaluations.iter_mut())
            .zip(&stacked)
            .filter(|(_, stacked)| **stacked)
        {
            evaluation.without_charge =
                limiter::evaluate(&charge.params, stored(&charge.key), now, charge.hits)
                    .without_charge;
        }
        pending.clear();
    }
    Decision {
        verdicts: evaluations
            .iter()
            .map(|e| verdict(e, commit && e.allowed))
            .collect(),
        commit,
        writes: pending,
    }
}
