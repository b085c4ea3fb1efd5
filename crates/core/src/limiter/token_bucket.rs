//! Token bucket as GCRA (generic cell rate algorithm): one timestamp per key, the theoretical arrival
//! time (TAT). Each hit costs `period / requests_per_unit`; a request fits while the TAT it would push
//! to stays within `burst` hits' cost of now. A full bucket is the absence of state.

use super::{Evaluation, LimitParams, Outlook, State, clamp, div, div_ceil};
use crate::clock::Nanos;

// Time is kept exactly in "scaled" units of 1/requests_per_unit nanoseconds, so one hit costs exactly
// `period` scaled units and no rounding ever admits extra traffic or loses a token. The arithmetic
// works on offsets from now (the TAT minus now), which fit in 64 bits unless a period is very long,
// so it rarely needs a 128-bit division. The leaky bucket keeps its queue's drain time the same way
// and shares these helpers and the state's layout, [`TatState`].
//
// A limit edit keeps the hits used. An offset in scaled units is "hits used × period" whatever the
// rate, so the state also records the scale it was written with: the offset is read back in the
// writer's scale and used as is under the current one. Raising 3/hour to 10/hour after one hit
// leaves 8, not the 5 that keeping the time debt (20 minutes, now 3⅓ hits) would. Until the key is
// charged again it keeps draining at the rate it was written with, and expires when that rate
// empties it.

/// A token bucket's (or a leaky bucket's) view of its [`State`]: the theoretical arrival time
/// (TAT), exactly, as `rounded_up` whole nanoseconds minus `below` scaled units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TatState {
    /// The TAT rounded up to a whole nanosecond: when the bucket is full again (the queue empty),
    /// and so when the state expires. Stored as `State.a`.
    pub(crate) rounded_up: Nanos,
    /// How many scaled units (1/`written_scale` ns) before `rounded_up` the TAT lies: less than
    /// `written_scale`. The low half of `State.b`.
    pub(crate) below: u32,
    /// The `requests_per_unit` the state was written at, the scale of `below`; 0 in a state written
    /// before the scale was recorded, which is read in the current scale. The high half of
    /// `State.b`.
    pub(crate) written_scale: u32,
}

impl TatState {
    #[inline]
    pub(crate) fn from_state(state: &State) -> TatState {
        TatState {
            rounded_up: state.a,
            below: state.b as u32,
            written_scale: (state.b >> 32) as u32,
        }
    }

    #[inline]
    pub(crate) fn into_state(self) -> State {
        State {
            a: self.rounded_up,
            b: (u64::from(self.written_scale) << 32) | u64::from(self.below),
        }
    }
}

pub(super) fn scale(params: &LimitParams) -> u128 {
    u128::from(params.requests_per_unit.max(1))
}

/// The scale a state was written in: its writer's `requests_per_unit` (the current one if the
/// state does not say).
pub(super) fn written_scale(params: &LimitParams, state: &TatState) -> u128 {
    match state.written_scale {
        0 => scale(params),
        written => u128::from(written),
    }
}

/// How far the state's TAT lies after `now`, in scaled units (0 if it has passed): hits used ×
/// period, read in the scale the state was written in.
pub(super) fn offset_after(params: &LimitParams, state: Option<&State>, now: Nanos) -> u128 {
    match state.map(TatState::from_state) {
        Some(s) if s.rounded_up > now => {
            let scale = written_scale(params, &s);
            u128::from(s.rounded_up - now) * scale - u128::from(s.below).min(scale - 1)
        }
        _ => 0,
    }
}

/// A TAT `offset` scaled units after `now`: the state that stores it, and the time until it in
/// whole nanoseconds, rounded up (a reset is never reported early). One division gives both.
pub(super) fn tat_at(params: &LimitParams, now: Nanos, offset: u128) -> (State, Nanos) {
    let scale = scale(params);
    let whole = div_ceil(offset, scale);
    let state = TatState {
        rounded_up: now.saturating_add(clamp(whole)),
        // scale ≤ u32::MAX, and the remainder is below it
        below: (whole * scale - offset) as u32,
        written_scale: scale as u32,
    };
    (state.into_state(), clamp(whole))
}

pub(super) fn evaluate(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    hits: u64,
) -> Evaluation {
    let period = u128::from(params.period.max(1));
    // Offsets after now, in scaled units.
    let tat = offset_after(params, state.as_ref(), now);
    let limit_at = u128::from(params.burst) * period;
    let fitting = |tat: u128| -> u32 {
        if params.requests_per_unit == 0 {
            return 0;
        }
        div(limit_at.saturating_sub(tat), period).min(u128::from(u32::MAX)) as u32
    };
    let (current, until_current) = tat_at(params, now, tat);
    let without_charge = Outlook {
        remaining: fitting(tat),
        reset_after: until_current,
    };
    let new_tat = tat + u128::from(hits) * period;
    let allowed = if params.requests_per_unit == 0 {
        hits == 0
    } else {
        new_tat <= limit_at
    };
    if !allowed {
        return Evaluation::uncharged(allowed, current, without_charge);
    }
    let (state_after, until_charged) = tat_at(params, now, new_tat);
    Evaluation {
        allowed,
        state_after,
        after_charge: Outlook {
            remaining: fitting(new_tat),
            reset_after: until_charged,
        },
        without_charge,
        delay: 0,
        retry_after: 0,
    }
}

/// Takes back `hits` charged at `now`: the TAT moves back by their cost, never before `now`. (The
/// leaky bucket's refund of a turn is the same arithmetic on the same state.)
pub(super) fn uncharge(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    let cost = u128::from(hits) * u128::from(params.period.max(1));
    let tat = offset_after(params, Some(state), now).saturating_sub(cost);
    tat_at(params, now, tat).0
}

#[cfg(test)]
mod tests {
    use super::super::evaluate as eval;
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::Algorithm;
    use crate::limiter::testing::drive;
    use proptest::prelude::*;

    fn params(rpu: u32, period_s: u64, burst: u32) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_unit: rpu,
            period: period_s * S,
            burst,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn fresh_bucket_admits_burst_then_denies() {
        let p = params(10, 1, 10);
        let mut st = None;
        let t0 = 1_000 * S;
        let first = eval(&p, st, t0, 1);
        assert!(first.allowed);
        assert_eq!(first.after_charge.remaining, 9);
        assert_eq!(first.without_charge.remaining, 10);
        assert_eq!(first.after_charge.reset_after, S / 10);
        assert_eq!(drive(&p, &mut st, t0, 20), 10);
        let denied = eval(&p, st, t0, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.after_charge.remaining, 0);
        assert_eq!(denied.without_charge.reset_after, S);
    }

    #[test]
    fn refills_at_the_rate() {
        let p = params(10, 1, 10);
        let mut st = None;
        let t0 = 1_000 * S;
        assert_eq!(drive(&p, &mut st, t0, 10), 10);
        // 350 ms later 3 tokens are back.
        assert_eq!(drive(&p, &mut st, t0 + 350_000_000, 10), 3);
        // after a full period idle, the state has expired: the bucket is full.
        let st_now = st.unwrap();
        assert!(st_now.expires_at() <= t0 + 350_000_000 + S);
        assert_eq!(drive(&p, &mut st, t0 + 350_000_000 + S, 20), 10);
    }

    #[test]
    fn burst_differs_from_rate() {
        let p = params(1, 1, 5);
        let mut st = None;
        assert_eq!(drive(&p, &mut st, 0, 10), 5);
        assert_eq!(drive(&p, &mut st, S, 10), 1);
    }

    #[test]
    fn multi_hit_requests_are_all_or_nothing() {
        let p = params(10, 60, 10);
        let e = eval(&p, None, 0, 11);
        assert!(!e.allowed);
        let e = eval(&p, None, 0, 10);
        assert!(e.allowed);
        assert_eq!(e.after_charge.remaining, 0);
        assert_eq!(e.after_charge.reset_after, 60 * S);
    }

    #[test]
    fn zero_hits_checks_without_consuming() {
        let p = params(1, 1, 1);
        let e = eval(&p, None, 0, 0);
        assert!(e.allowed);
        assert_eq!(e.after_charge.remaining, 1);
    }

    #[test]
    fn zero_requests_per_unit_denies_everything() {
        let p = params(0, 1, 0);
        assert!(!eval(&p, None, 0, 1).allowed);
        assert!(eval(&p, None, 0, 0).allowed);
    }

    #[test]
    fn non_integral_cost_never_over_admits() {
        let p = params(3, 1, 3);
        let mut st = None;
        assert_eq!(drive(&p, &mut st, 0, 10), 3);
        // a token comes back every third of a second, exactly
        assert_eq!(drive(&p, &mut st, S / 3, 10), 0);
        assert_eq!(drive(&p, &mut st, S / 3 + 1, 10), 1);
        assert_eq!(drive(&p, &mut st, S, 10), 2);
    }

    proptest! {
        /// Over any schedule, admitted hits never exceed burst + rate × elapsed.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_elapsed(
            rpu in 1u32..1000,
            burst in 1u32..1000,
            period_s in 1u64..100,
            steps in proptest::collection::vec((0u64..2_000_000_000, 1u64..20), 1..200),
        ) {
            let p = params(rpu, period_s, burst);
            let start = 1_700_000_000 * S;
            let mut now = start;
            let mut state = None;
            let mut admitted: u128 = 0;
            for (gap, hits) in steps {
                now += gap;
                let e = eval(&p, state, now, hits);
                if e.allowed {
                    state = Some(e.state_after);
                    admitted += u128::from(hits);
                }
                let elapsed = u128::from(now - start);
                let bound = u128::from(burst)
                    + (elapsed * u128::from(rpu)) / u128::from(p.period);
                prop_assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
            }
        }

        /// After idling for burst's worth of refill time the bucket is full again.
        #[test]
        fn full_after_idle(rpu in 1u32..1000, burst in 1u32..1000, used in 0u32..1000) {
            let p = params(rpu, 1, burst);
            let mut state = None;
            drive(&p, &mut state, 0, used);
            let full_at = state.map_or(0, |s| s.expires_at());
            let e = eval(&p, state, full_at, 1);
            prop_assert_eq!(e.without_charge.remaining, burst);
            prop_assert_eq!(e.without_charge.reset_after, 0);
        }

        /// A TAT survives being stored exactly, and the state expires when the TAT (rounded up to
        /// a whole nanosecond) has passed.
        #[test]
        fn a_stored_tat_is_exact(
            rpu in 1u32..=u32::MAX,
            now in 0u64..u64::MAX / 2,
            raw_offset in any::<u128>(),
        ) {
            // Up to a quarter of u64::MAX nanoseconds ahead (so `a` does not saturate), which is
            // far beyond 64 bits of scaled units when rpu is large.
            let offset = raw_offset % (u128::from(u64::MAX / 4) * u128::from(rpu));
            let p = params(rpu, 1, 1);
            let (st, until) = tat_at(&p, now, offset);
            prop_assert_eq!(offset_after(&p, Some(&st), now), offset);
            let whole = offset.div_ceil(u128::from(rpu));
            prop_assert_eq!(u128::from(st.expires_at()), u128::from(now) + whole);
            prop_assert_eq!(u128::from(until), whole);
        }

        /// `remaining` is exact: that many single hits pass, one more does not.
        #[test]
        fn remaining_is_exact(rpu in 1u32..50, burst in 1u32..50, used in 0u32..60, gap in 0u64..3_000_000_000) {
            let p = params(rpu, 1, burst);
            let mut state = None;
            drive(&p, &mut state, 0, used);
            let e = eval(&p, state, gap, 1);
            let remaining = e.without_charge.remaining;
            prop_assert_eq!(drive(&p, &mut state, gap, remaining + 1), remaining);
        }
    }
}
