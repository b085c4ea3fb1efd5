//! Leaky bucket as a queue drained at a constant rate: one hit leaves every
//! `period / requests_per_unit`. State is one instant, the time the queue will be empty (the
//! "theoretical arrival time" of GCRA, kept exactly in the token bucket's scaled units). A request
//! of `n` hits arriving at `now` takes the next free turn, `t = max(drain_time, now)`, and fits if
//! the queue then holds at most `burst` hits' worth (the request included) and it waits at most
//! `max_delay`. It is answered OK at `t`: the store commits at decision time, and the caller waits
//! `delay = t − now` before answering, so the requests Envoy forwards leave evenly spaced however
//! they arrived. A request that does not fit is denied at once.
//!
//! With the same `burst`, and a `max_delay` of at least `burst − 1` drain intervals (long enough to
//! wait behind a full queue), a token bucket admits exactly the same requests, leaves the same state
//! and reports the same outlook; the difference is when they are answered: the token bucket lets a
//! burst through at once, the leaky bucket smooths it. A shorter `max_delay` also denies requests
//! whose turn would come later than it.

use super::token_bucket::{offset_after, scale, tat_at};
use super::{Evaluation, LimitParams, Outlook, State, div};
use crate::clock::Nanos;

// Drain times are offsets after now in scaled units, as in the token bucket.

/// How many more single hits fit now, with the queue draining `tat` scaled units from now: as many
/// as the queue has room for (`(burst × period − tat) / period`), and no more than can start within
/// `max_delay` (`(max_wait − tat) / period + 1`). Both divide by `period`, so the smaller numerator
/// gives the smaller count and one division does.
fn fitting(params: &LimitParams, tat: u128) -> u32 {
    let max_wait = u128::from(params.max_delay) * scale(params);
    if params.requests_per_unit == 0 || tat > max_wait {
        return 0;
    }
    let period = u128::from(params.period.max(1));
    let room = (u128::from(params.burst) * period).saturating_sub(tat);
    let within_delay = max_wait - tat + period;
    div(room.min(within_delay), period).min(u128::from(u32::MAX)) as u32
}

pub(super) fn evaluate(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    hits: u64,
) -> Evaluation {
    let period = u128::from(params.period.max(1));
    let tat = offset_after(params, state.as_ref(), now);
    // The request's turn comes when the queue ahead of it has drained: `wait` from now.
    let (current, wait) = tat_at(params, now, tat);
    let without_charge = Outlook {
        remaining: fitting(params, tat),
        reset_after: wait,
    };
    let new_tat = tat + u128::from(hits) * period;
    let allowed = hits == 0
        || (params.requests_per_unit > 0
            && new_tat <= u128::from(params.burst) * period
            && tat <= u128::from(params.max_delay) * scale(params));
    if !allowed || hits == 0 {
        return Evaluation::uncharged(allowed, current, without_charge);
    }
    let (state_after, until_charged) = tat_at(params, now, new_tat);
    Evaluation {
        allowed,
        state_after,
        after_charge: Outlook {
            remaining: fitting(params, new_tat),
            reset_after: until_charged,
        },
        without_charge,
        delay: wait,
        retry_after: 0,
    }
}

/// Gives back the turn of `hits` that were queued but never answered: the drain time moves back
/// by their cost (never before `now`). Requests queued behind keep their turns, so the queue has
/// a hole where the cancelled one was; the next arrival takes the turn at the end.
pub(super) fn refund(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    super::token_bucket::uncharge(params, state, now, hits)
}

#[cfg(test)]
mod tests {
    use super::super::{evaluate as eval, refund as give_back};
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::Algorithm;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_767_225_600 * S;

    fn params(rpu: u32, period_s: u64, burst: u32, max_delay: Nanos) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::LeakyBucket,
            requests_per_unit: rpu,
            period: period_s * S,
            burst,
            max_delay,
            charge_denied: false,
        }
    }

    #[test]
    fn a_burst_is_queued_and_answered_one_interval_apart() {
        let p = params(10, 1, 5, S);
        let mut st = None;
        let mut delays = Vec::new();
        for _ in 0..7 {
            let e = eval(&p, st, T0, 1);
            if e.allowed {
                st = Some(e.state_after);
                delays.push(e.delay);
            }
        }
        assert_eq!(delays, [0, 100 * MS, 200 * MS, 300 * MS, 400 * MS]);
        let full = eval(&p, st, T0, 1);
        assert!(!full.allowed, "a full queue denies at once");
        assert_eq!(full.delay, 0);
        assert_eq!(
            full.without_charge.reset_after,
            500 * MS,
            "queue empty then"
        );
        // 100 ms later one turn has drained: one more fits, at the end of the queue.
        let later = eval(&p, st, T0 + 100 * MS, 1);
        assert!(later.allowed);
        assert_eq!(later.delay, 400 * MS);
    }

    #[test]
    fn max_delay_caps_the_queue() {
        let p = params(10, 1, 100, 250 * MS);
        let mut st = None;
        let mut admitted = 0;
        for _ in 0..10 {
            let e = eval(&p, st, T0, 1);
            if e.allowed {
                assert!(e.delay <= 250 * MS);
                st = Some(e.state_after);
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 3,
            "turns at 0, 100 and 200 ms; 300 ms is past max_delay"
        );
        assert_eq!(eval(&p, st, T0, 0).without_charge.remaining, 0);
    }

    #[test]
    fn a_max_delay_shorter_than_a_full_queue_denies_what_a_token_bucket_admits() {
        // 10/s, burst 5: the fifth request of a burst waits 4 drain intervals, 400 ms.
        let token = LimitParams {
            algorithm: Algorithm::TokenBucket,
            ..params(10, 1, 5, 0)
        };
        for (max_delay, fifth_admitted) in [(400 * MS, true), (400 * MS - 1, false)] {
            let p = params(10, 1, 5, max_delay);
            let (mut leaky_state, mut token_state) = (None, None);
            for _ in 0..4 {
                leaky_state = Some(eval(&p, leaky_state, T0, 1).state_after);
                token_state = Some(eval(&token, token_state, T0, 1).state_after);
            }
            assert!(eval(&token, token_state, T0, 1).allowed);
            assert_eq!(
                eval(&p, leaky_state, T0, 1).allowed,
                fifth_admitted,
                "max_delay {max_delay} ns"
            );
        }
    }

    #[test]
    fn remaining_counts_what_still_fits() {
        let p = params(10, 1, 5, S);
        let e = eval(&p, None, T0, 0);
        assert_eq!(e.without_charge.remaining, 5);
        let e = eval(&p, None, T0, 2);
        assert_eq!((e.after_charge.remaining, e.delay), (3, 0));
        assert_eq!(e.after_charge.reset_after, 200 * MS);
    }

    #[test]
    fn multi_hit_requests_take_as_many_turns() {
        let p = params(10, 1, 5, S);
        let e = eval(&p, None, T0, 3);
        let e2 = eval(&p, Some(e.state_after), T0, 2);
        assert!(e2.allowed);
        assert_eq!(e2.delay, 300 * MS);
        assert!(!eval(&p, Some(e2.state_after), T0, 1).allowed);
        assert!(!eval(&p, None, T0, 6).allowed, "more than the queue holds");
    }

    #[test]
    fn zero_hits_check_without_queueing_and_zero_rate_denies() {
        let p = params(10, 1, 1, S);
        let st = eval(&p, None, T0, 1).state_after;
        let check = eval(&p, Some(st), T0, 0);
        assert!(check.allowed);
        assert_eq!((check.delay, check.state_after), (0, st));
        let zero = params(0, 1, 1, S);
        assert!(!eval(&zero, None, T0, 1).allowed);
    }

    #[test]
    fn a_refund_frees_the_last_turn_and_leaves_a_hole() {
        let p = params(10, 1, 3, S);
        let a = eval(&p, None, T0, 1);
        let b = eval(&p, Some(a.state_after), T0, 1);
        let c = eval(&p, Some(b.state_after), T0, 1);
        assert_eq!(c.delay, 200 * MS);
        assert!(!eval(&p, Some(c.state_after), T0, 1).allowed);
        // b (turn at 100 ms) cancels: its turn is given back, c keeps its own.
        let st = give_back(&p, &c.state_after, T0 + 10 * MS, 1);
        let d = eval(&p, Some(st), T0 + 10 * MS, 1);
        assert!(d.allowed);
        assert_eq!(d.delay, 190 * MS, "the end of the queue, not b's turn");
        // Never before now.
        let st = give_back(&p, &a.state_after, T0 + 50 * MS, 5);
        assert_eq!(st.expires_at(), T0 + 50 * MS);
    }

    proptest! {
        /// The answers of admitted requests are spaced by at least the previous request's hits ×
        /// the drain interval, however the requests arrived; every delay respects max_delay.
        #[test]
        fn answers_leave_at_the_drain_rate(
            rpu in 1u32..200,
            period_s in 1u64..5,
            burst in 1u32..50,
            max_delay_ms in 0u64..5_000,
            steps in proptest::collection::vec((0u64..300_000_000, 1u64..4), 1..200),
        ) {
            let p = params(rpu, period_s, burst, max_delay_ms * MS);
            let mut now = T0 + 7;
            let mut state = None;
            let mut last: Option<(Nanos, u64)> = None;
            for (gap, hits) in steps {
                now += gap;
                let e = eval(&p, state, now, hits);
                if !e.allowed {
                    continue;
                }
                state = Some(e.state_after);
                prop_assert!(e.delay <= p.max_delay);
                let answer = now + e.delay;
                if let Some((prev, prev_hits)) = last {
                    let spacing = u128::from(prev_hits) * u128::from(p.period) / u128::from(rpu);
                    prop_assert!(
                        u128::from(answer - prev) >= spacing,
                        "answers {} ns apart, drain needs {spacing}", answer - prev
                    );
                }
                last = Some((answer, hits));
            }
        }

        /// The module's promise: with a `max_delay` of `burst − 1` drain intervals or more, the
        /// leaky bucket answers every request as a token bucket of the same burst does (same
        /// verdict, state and outlook), only later. So the token bucket's own bounds hold for it.
        #[test]
        fn admits_exactly_what_a_token_bucket_admits(
            rpu in 1u32..1000,
            period_s in 1u64..100,
            burst in 1u32..100,
            longer_by in prop_oneof![Just(0u64), 0u64..10 * S],
            steps in proptest::collection::vec((0u64..2_000_000_000, 0u64..5), 1..200),
        ) {
            let period = period_s * S;
            let full_queue_wait =
                (u128::from(burst - 1) * u128::from(period)).div_ceil(u128::from(rpu)) as u64;
            let leaky = params(rpu, period_s, burst, full_queue_wait + longer_by);
            let token = LimitParams { algorithm: Algorithm::TokenBucket, ..leaky };
            let mut now = T0 + 7;
            let (mut leaky_state, mut token_state) = (None, None);
            for (gap, hits) in steps {
                now += gap;
                let from_leaky = eval(&leaky, leaky_state, now, hits);
                let from_token = eval(&token, token_state, now, hits);
                prop_assert_eq!(Evaluation { delay: 0, ..from_leaky }, from_token);
                if from_leaky.allowed {
                    leaky_state = Some(from_leaky.state_after);
                    token_state = Some(from_token.state_after);
                }
            }
        }

        /// `remaining` is exact: that many single hits are queued, one more is not.
        #[test]
        fn remaining_is_exact(
            rpu in 1u32..50,
            burst in 1u32..30,
            max_delay_ms in 0u64..3_000,
            used in 0u32..40,
            later in 0u64..2_000_000_000,
        ) {
            let p = params(rpu, 1, burst, max_delay_ms * MS);
            let mut state = None;
            for _ in 0..used {
                let e = eval(&p, state, T0, 1);
                if e.allowed { state = Some(e.state_after); }
            }
            let now = T0 + later;
            let remaining = eval(&p, state, now, 0).without_charge.remaining;
            let mut passed = 0;
            for _ in 0..=remaining {
                let e = eval(&p, state, now, 1);
                if e.allowed { state = Some(e.state_after); passed += 1; }
            }
            prop_assert_eq!(passed, remaining);
        }

        /// Charging and then refunding the same hits at the same instant changes nothing a client
        /// can see.
        #[test]
        fn a_refund_undoes_a_charge(
            rpu in 1u32..100,
            burst in 1u32..30,
            used in 0u32..30,
            hits in 1u64..5,
        ) {
            let p = params(rpu, 1, burst, 10 * S);
            let mut state = None;
            for _ in 0..used {
                let e = eval(&p, state, T0, 1);
                if e.allowed { state = Some(e.state_after); }
            }
            let before = eval(&p, state, T0, 0).without_charge;
            let e = eval(&p, state, T0, hits);
            prop_assume!(e.allowed);
            let back = give_back(&p, &e.state_after, T0, hits);
            prop_assert_eq!(eval(&p, Some(back), T0, 0).without_charge, before);
        }
    }
}
