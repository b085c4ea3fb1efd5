//! How long until a denied request would pass: for `Retry-After` and the `t` of a policy that is
//! out of quota. Closed forms per algorithm on the key's state, exact to the nanosecond (the
//! earliest instant at which `evaluate` admits the same hits on the same state), since every
//! algorithm only frees capacity as time passes: a fixed window at its end, a token bucket and a
//! leaky bucket's queue (and its `max_delay`) as the theoretical arrival time draws near, a
//! sliding window as the previous window's weight shrinks and the windows move on.

use super::fixed_window::FixedWindowState;
use super::sliding_window::SlidingWindowState;
use super::token_bucket::{TatState, offset_after, scale, written_scale};
use super::{LimitParams, State, clamp, div, div_ceil};
use crate::clock::Nanos;
use crate::config::Algorithm;

/// What [`retry_after`] says of hits that no wait lets through (more than the limit can ever
/// hold, or a limit of 0).
pub const NEVER: Nanos = Nanos::MAX;

/// The shortest wait `d` such that `hits` fit the limit at `now + d` on `state` (0 if they fit
/// now), or [`NEVER`].
pub fn retry_after(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> Nanos {
    if hits == 0 {
        return 0;
    }
    if params.requests_per_unit == 0 {
        return NEVER;
    }
    match params.algorithm {
        Algorithm::FixedWindow => fixed_window(params, state, now, hits),
        Algorithm::SlidingWindow => sliding_window(params, state, now, hits),
        Algorithm::TokenBucket => tat_wait(params, state, now, hits, None),
        Algorithm::LeakyBucket => {
            let max_wait = u128::from(params.max_delay) * scale(params);
            tat_wait(params, state, now, hits, Some(max_wait))
        }
    }
}

/// Fixed window: now if they fit, else at the window's end (a new window counts from 0).
fn fixed_window(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> Nanos {
    let limit = u64::from(params.requests_per_unit);
    if hits > limit {
        return NEVER;
    }
    let period = params.period.max(1);
    let end = (now - now % period).saturating_add(period);
    let count = match state.as_ref().map(FixedWindowState::from_state) {
        Some(s) if s.end == end => s.count,
        _ => 0,
    };
    if count.saturating_add(hits) <= limit {
        0
    } else {
        end - now
    }
}

/// Token bucket (`max_wait` None) and leaky bucket: the TAT offset falls by the state's scale
/// every nanosecond until it is 0, and the hits fit once it is at most `burst × period − cost`
/// (and, for a leaky bucket, at most `max_wait`, so the turn comes within `max_delay`).
fn tat_wait(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    hits: u64,
    max_wait: Option<u128>,
) -> Nanos {
    let period = u128::from(params.period.max(1));
    let cost = u128::from(hits) * period;
    let capacity = u128::from(params.burst) * period;
    let Some(room) = capacity.checked_sub(cost) else {
        return NEVER;
    };
    let tat = offset_after(params, state.as_ref(), now);
    let bound = max_wait.map_or(room, |w| room.min(w));
    let excess = tat.saturating_sub(bound);
    if excess == 0 {
        return 0;
    }
    let per_nano = state.as_ref().map_or_else(
        || scale(params),
        |s| written_scale(params, &TatState::from_state(s)),
    );
    clamp(div_ceil(excess, per_nano))
}

/// Sliding window: in the current window once the previous count's weight has shrunk enough;
/// else in the next window (this window's count then weighs as the previous one, and nothing is
/// current); at the latest at the start of the window after (both forgotten).
fn sliding_window(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> Nanos {
    let limit = u64::from(params.requests_per_unit);
    if hits > limit {
        return NEVER;
    }
    let period = params.period.max(1);
    let start = now - now % period;
    let (previous, current) = match state.as_ref().map(SlidingWindowState::from_state) {
        Some(s)
            if Some(s.forgotten_at) == period.checked_mul(2).and_then(|d| start.checked_add(d)) =>
        {
            (u64::from(s.previous), u64::from(s.current))
        }
        Some(s) if Some(s.forgotten_at) == start.checked_add(period) => (u64::from(s.current), 0),
        _ => (0, 0),
    };
    let now_elapsed = now - start;
    // In this window, if the current count leaves room for the hits.
    if let Some(elapsed) = first_fit(period, previous, current, hits, limit)
        && elapsed < period
    {
        return elapsed.max(now_elapsed) - now_elapsed;
    }
    // In the next window, the current count is the previous one.
    let next = period - now_elapsed;
    match first_fit(period, current, 0, hits, limit) {
        Some(elapsed) => next.saturating_add(elapsed),
        None => next.saturating_add(period),
    }
}

/// The least time into a window (0..=period) at which `previous × (period − e) + (current + hits)
/// × period ≤ limit × period`; None if the current count alone leaves no room.
fn first_fit(period: Nanos, previous: u64, current: u64, hits: u64, limit: u64) -> Option<Nanos> {
    let p = u128::from(period);
    let free = u128::from(limit.checked_sub(current.saturating_add(hits))?) * p;
    if previous == 0 {
        return Some(0);
    }
    // previous × (p − e) ≤ free  ⇔  p − e ≤ ⌊free / previous⌋.
    let weight_left = div(free, u128::from(previous));
    Some(clamp(p.saturating_sub(weight_left)))
}

#[cfg(test)]
mod tests {
    use super::super::evaluate;
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use proptest::prelude::*;

    fn params(algorithm: Algorithm, rpu: u32, period: Nanos, burst: u32) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: rpu,
            period,
            burst,
            max_delay: period / 2,
            charge_denied: false,
        }
    }

    /// The state after `hits` single hits at `times` (each charged if it fits).
    fn after(p: &LimitParams, times: &[Nanos]) -> Option<State> {
        let mut state = None;
        for &t in times {
            let e = evaluate(p, state, t, 1);
            if e.allowed || p.charge_denied {
                state = Some(e.state_after);
            }
        }
        state
    }

    #[test]
    fn a_full_fixed_window_passes_again_at_its_end() {
        let p = params(Algorithm::FixedWindow, 2, 60 * S, 2);
        let t = 1_000 * 60 * S + 10 * S;
        let st = after(&p, &[t, t]);
        assert_eq!(retry_after(&p, st, t + S, 1), 49 * S);
        assert_eq!(retry_after(&p, st, t + S, 3), NEVER);
        let e = evaluate(&p, st, t + S, 1);
        assert!(!e.allowed);
        assert_eq!(e.retry_after, 49 * S, "evaluate reports it on a denial");
    }

    #[test]
    fn an_empty_token_bucket_passes_after_one_tokens_refill() {
        let p = params(Algorithm::TokenBucket, 10, S, 10);
        let t = 5_000 * S;
        let st = after(&p, &[t; 10]);
        assert_eq!(retry_after(&p, st, t, 1), S / 10);
        assert_eq!(retry_after(&p, st, t, 3), 3 * S / 10);
        assert_eq!(retry_after(&p, st, t, 11), NEVER);
    }

    #[test]
    fn a_leaky_bucket_waits_for_room_in_the_queue_and_a_turn_within_max_delay() {
        // 10/s, a queue of 10, at most 500 ms of wait: the 6th request would wait 500 ms, the
        // 7th 600 ms, so after six the next fits once 100 ms have drained.
        let p = params(Algorithm::LeakyBucket, 10, S, 10);
        let t = 5_000 * S;
        let st = after(&p, &[t; 10]);
        assert!(!evaluate(&p, st, t, 1).allowed);
        assert_eq!(retry_after(&p, st, t, 1), S / 10);
        assert!(evaluate(&p, st, t + S / 10, 1).allowed);
    }

    #[test]
    fn a_sliding_window_passes_as_the_previous_window_fades() {
        let p = params(Algorithm::SlidingWindow, 4, 60 * S, 4);
        let t = 1_000 * 60 * S;
        // Four hits at the end of one window: in the next, one hit fits once a quarter of it
        // has passed (4 × (1 − e) + 1 ≤ 4).
        let st = after(&p, &[t + 59 * S; 4]);
        assert_eq!(retry_after(&p, st, t + 59 * S, 1), S + 15 * S);
    }

    fn any_algorithm() -> impl Strategy<Value = Algorithm> {
        prop::sample::select(Algorithm::ALL.to_vec())
    }

    proptest! {
        /// The wait is exact: the hits fit after it and not a nanosecond before (capacity only
        /// grows with time, so that is the earliest instant); NEVER only when they never fit.
        #[test]
        fn the_wait_is_the_earliest_instant_the_hits_fit(
            algorithm in any_algorithm(),
            rpu in 1u32..20,
            period in 1u64..5_000,
            burst_extra in 0u32..5,
            charge_denied in any::<bool>(),
            offsets in prop::collection::vec(0u64..10_000, 0..40),
            hits in 1u64..25,
            later in 0u64..10_000,
        ) {
            let mut p = params(algorithm, rpu, period, rpu + burst_extra);
            p.charge_denied = charge_denied && matches!(
                algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow);
            let t0 = 1_000_000u64;
            let mut times: Vec<Nanos> = offsets.iter().map(|o| t0 + o).collect();
            times.sort_unstable();
            let st = after(&p, &times);
            let now = times.last().copied().unwrap_or(t0) + later;
            let wait = retry_after(&p, st, now, hits);
            if wait == NEVER {
                for d in [0, period, 10 * period, 1_000 * period] {
                    prop_assert!(!evaluate(&p, st, now + d, hits).allowed, "fits after {d}");
                }
            } else {
                prop_assert!(evaluate(&p, st, now + wait, hits).allowed, "not after {wait}");
                if wait > 0 {
                    prop_assert!(!evaluate(&p, st, now + wait - 1, hits).allowed,
                        "already at {}", wait - 1);
                }
            }
        }
    }
}
