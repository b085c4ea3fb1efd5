//! `keep_share` leaves an instance its share of what a limit has left, for every algorithm, and
//! `settled_hits` takes back what an outage admitted without going past the limit.

use super::{LimitParams, State, evaluate, keep_share, settled_hits};
use crate::clock::{NANOS_PER_SECOND as S, Nanos};
use crate::config::Algorithm;
use proptest::prelude::*;

const T0: Nanos = 1_767_225_600 * S;

fn limit(algorithm: Algorithm, rpu: u32) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: rpu,
        period: 3600 * S,
        burst: rpu,
        max_delay: 86_400 * S,
        charge_denied: false,
    }
}

fn remaining(p: &LimitParams, state: Option<State>, now: Nanos) -> u64 {
    u64::from(evaluate(p, state, now, 0).without_charge.remaining)
}

proptest! {
    #[test]
    fn an_instance_keeps_its_share_of_what_is_left_rounded_down(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        rpu in 1u32..500,
        used in 0u64..500,
        instances in 1u32..6,
    ) {
        let p = limit(algorithm, rpu);
        let used = used.min(u64::from(rpu));
        let seen = (used > 0).then(|| evaluate(&p, None, T0, used).state_after);
        let left = remaining(&p, seen, T0);
        let share = 1.0 / f64::from(instances);
        let kept = remaining(&p, keep_share(&p, seen, T0, share), T0);
        prop_assert_eq!(kept, ((left as f64) * share).floor() as u64);
        // Every instance keeping its share: together never more than what was left.
        prop_assert!(kept * u64::from(instances) <= left);
    }

    #[test]
    fn settled_hits_never_take_a_limit_past_itself(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        rpu in 1u32..500,
        used in 0u64..500,
        hits in 0u64..1000,
    ) {
        let p = limit(algorithm, rpu);
        let used = used.min(u64::from(rpu));
        let state = (used > 0).then(|| evaluate(&p, None, T0, used).state_after);
        let take = settled_hits(&p, state, T0, hits);
        prop_assert!(take <= hits);
        prop_assert!(evaluate(&p, state, T0, take).allowed);
        prop_assert_eq!(take, hits.min(u64::from(rpu) - used));
    }
}

#[test]
fn a_whole_share_changes_nothing_and_a_zero_share_leaves_nothing() {
    let p = limit(Algorithm::FixedWindow, 10);
    let seen = Some(evaluate(&p, None, T0, 4).state_after);
    assert_eq!(keep_share(&p, seen, T0, 1.0), seen);
    assert_eq!(keep_share(&p, None, T0, 1.0), None);
    assert_eq!(remaining(&p, keep_share(&p, seen, T0, 0.0), T0), 0);
    assert_eq!(remaining(&p, keep_share(&p, None, T0, 0.5), T0), 5);
}
