//! A reload that changes `requests_per_unit` or `burst` keeps the hits already used, for every
//! algorithm, as the reference's counters do: used 1 of 3/hour, raised to 10/hour, the next hit
//! leaves 8; a lowered limit counts the hits used against the new one.

use super::{LimitParams, State, TatState, evaluate};
use crate::clock::{NANOS_PER_SECOND as S, Nanos};
use crate::config::Algorithm;
use proptest::prelude::*;

const ALL: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::LeakyBucket,
];
/// Ten seconds into an hour.
const T0: Nanos = 1_767_225_610 * S;

fn hourly(algorithm: Algorithm, rpu: u32, burst: u32) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: rpu,
        period: 3_600 * S,
        burst,
        max_delay: 86_400 * S,
        charge_denied: false,
    }
}

/// Charges `hits` single hits at `now` under `p`; returns the state.
fn use_hits(p: &LimitParams, mut state: Option<State>, now: Nanos, hits: u32) -> Option<State> {
    for _ in 0..hits {
        let e = evaluate(p, state, now, 1);
        assert!(e.allowed, "{:?}", p.algorithm);
        state = Some(e.state_after);
    }
    state
}

#[test]
fn a_raised_limit_gives_headroom_at_once() {
    for algorithm in ALL {
        let state = use_hits(&hourly(algorithm, 3, 3), None, T0, 1);
        let raised = hourly(algorithm, 10, 10);
        let e = evaluate(&raised, state, T0 + S, 1);
        assert!(e.allowed, "{algorithm:?}");
        assert_eq!(e.after_charge.remaining, 8, "{algorithm:?}");
        // and the rest of the new limit is there too
        let state = use_hits(&raised, Some(e.state_after), T0 + S, 8);
        assert!(
            !evaluate(&raised, state, T0 + S, 1).allowed,
            "{algorithm:?}"
        );
    }
}

#[test]
fn a_lowered_limit_counts_the_hits_already_used() {
    for algorithm in ALL {
        let state = use_hits(&hourly(algorithm, 10, 10), None, T0, 5);
        let six = hourly(algorithm, 6, 6);
        let e = evaluate(&six, state, T0 + S, 1);
        assert!(e.allowed, "{algorithm:?}");
        assert_eq!(e.after_charge.remaining, 0, "{algorithm:?}");
        assert!(
            !evaluate(&six, Some(e.state_after), T0 + S, 1).allowed,
            "{algorithm:?}"
        );
        let three = hourly(algorithm, 3, 3);
        let e = evaluate(&three, state, T0 + S, 1);
        assert!(!e.allowed, "{algorithm:?}: 5 used of 3");
        assert_eq!(e.without_charge.remaining, 0, "{algorithm:?}");
    }
}

#[test]
fn a_raised_burst_gives_headroom_at_once() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let state = use_hits(&hourly(algorithm, 3, 3), None, T0, 3);
        assert!(!evaluate(&hourly(algorithm, 3, 3), state, T0, 1).allowed);
        let e = evaluate(&hourly(algorithm, 3, 10), state, T0, 1);
        assert!(e.allowed, "{algorithm:?}");
        assert_eq!(e.after_charge.remaining, 6, "{algorithm:?}");
    }
}

#[test]
fn after_a_change_the_bucket_refills_at_the_new_rate() {
    // 3 used of 3/hour; raised to 60/hour (burst 3): once charged under the new rate, a hit
    // comes back every minute.
    let p = hourly(Algorithm::TokenBucket, 3, 3);
    let state = use_hits(&p, None, T0, 2);
    let fast = hourly(Algorithm::TokenBucket, 60, 3);
    let e = evaluate(&fast, state, T0, 1);
    assert!(e.allowed);
    assert_eq!(e.after_charge.remaining, 0);
    assert_eq!(e.after_charge.reset_after, 180 * S);
    assert!(!evaluate(&fast, Some(e.state_after), T0 + 59 * S, 1).allowed);
    assert!(evaluate(&fast, Some(e.state_after), T0 + 60 * S, 1).allowed);
}

#[test]
fn states_written_without_their_scale_read_in_the_current_one() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let p = hourly(algorithm, 7, 5);
        let state = use_hits(&p, None, T0, 2).unwrap();
        let legacy = TatState {
            written_scale: 0,
            ..TatState::from_state(&state)
        }
        .into_state();
        for now in [T0, T0 + 17 * S, T0 + 1_000 * S] {
            assert_eq!(
                evaluate(&p, Some(legacy), now, 1),
                evaluate(&p, Some(state), now, 1),
                "{algorithm:?}"
            );
        }
    }
}

proptest! {
    /// For every algorithm, right after an edit the hits used under the old limit count against
    /// the new one: the new limit's remaining is `new − used` (rounded down), within one hit.
    #[test]
    fn hits_used_carry_over_any_edit(
        alg in 0usize..4,
        old_rpu in 1u32..200,
        new_rpu in 1u32..200,
        used_frac in 0u32..=100,
    ) {
        let algorithm = ALL[alg];
        let used = old_rpu * used_frac / 100;
        let state = use_hits(&hourly(algorithm, old_rpu, old_rpu), None, T0, used);
        let new = hourly(algorithm, new_rpu, new_rpu);
        let remaining = evaluate(&new, state, T0, 0).without_charge.remaining;
        prop_assert_eq!(remaining, new_rpu.saturating_sub(used), "{:?}", algorithm);
    }
}
