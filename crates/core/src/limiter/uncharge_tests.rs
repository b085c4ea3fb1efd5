//! `uncharge` undoes a charge, for every algorithm: after charging `hits` at `now` and taking them
//! back at the same `now`, the key looks and behaves as before the charge, whatever hits came
//! before it.

use super::{LimitParams, State, evaluate, uncharge};
use crate::clock::{NANOS_PER_SECOND as S, Nanos};
use crate::config::Algorithm;
use proptest::prelude::*;

const T0: Nanos = 1_767_225_600 * S;

fn limit(algorithm: Algorithm, rpu: u32, period_s: u64) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: rpu,
        period: period_s * S,
        burst: rpu,
        max_delay: 86_400 * S,
        charge_denied: false,
    }
}

/// Charges each of `history` (time offset in ms from T0, hits) that fits; the state left.
fn replay(p: &LimitParams, history: &[(u64, u64)]) -> Option<State> {
    let mut state = None;
    for &(ms, hits) in history {
        let e = evaluate(p, state, T0 + ms * 1_000_000, hits);
        if e.allowed {
            state = Some(e.state_after);
        }
    }
    state
}

proptest! {
    #[test]
    fn a_charge_taken_back_leaves_the_key_as_it_was(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        rpu in 1u32..50,
        period_s in prop::sample::select(vec![1u64, 60, 3600]),
        history in prop::collection::vec((0u64..5_000, 0u64..4), 0..20),
        hits in 1u64..5,
        after_ms in 5_000u64..6_000,
    ) {
        let p = limit(algorithm, rpu, period_s);
        let before = replay(&p, &history);
        let now = T0 + after_ms * 1_000_000;
        let charged = evaluate(&p, before, now, hits);
        prop_assume!(charged.allowed);
        let undone = uncharge(&p, &charged.state_after, now, hits);
        let was = evaluate(&p, before, now, 1);
        let is = evaluate(&p, Some(undone), now, 1);
        prop_assert_eq!(is.without_charge, was.without_charge);
        prop_assert_eq!(is.allowed, was.allowed);
        prop_assert_eq!(is.after_charge, was.after_charge);
        // And later too: the same requests fit a second later.
        let later = now + S;
        prop_assert_eq!(
            evaluate(&p, Some(undone), later, hits).allowed,
            evaluate(&p, before, later, hits).allowed
        );
    }
}
