//! Sliding window as the two-window weighted counter: epoch-aligned windows of `period` (or
//! calendar windows, `calendar::window`), and the
//! estimate of the last `period` is the previous window's count × the share of it still inside the
//! sliding window + the current window's count. Two counters of state; smooth at window edges.
//!
//! State ([`SlidingWindowState`]): when both counts are forgotten (the end of the window after the
//! current one, its expiry), and the previous and current windows' counts. Counts never exceed
//! `requests_per_unit` (a u32) because denied hits are not counted. Two empty counts are stored as
//! no state.
//!
//! Error against an exact sliding log (which admits at most `limit` in any interval shorter than
//! `period`): over any interval of length `d < period`, this admits at most
//! `limit × (1 + d / period)`. Proof sketch: such an interval spans at most the tail of one window
//! (`x` hits, `x ≤ limit`) and the head of the next; the last admission in the head, at offset
//! `e ≤ d`, needed `prev × (1 − e/period) + current ≤ limit` with `prev ≥ x`, so the head holds at
//! most `limit − x + x·d/period`. So there is no 2× burst at an edge (`d → 0` gives `limit`), and
//! the 2× of a whole period needs a full window's worth in the last instant of one window and
//! another at the end of the next. It can also under-admit: it assumes the previous window's hits
//! were spread evenly, so hits early in that window are forgotten later than a log would.

use super::{Evaluation, LimitParams, Outlook, State, div};
use crate::calendar;
use crate::clock::Nanos;

/// A sliding window's view of its [`State`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindowState {
    /// The end of the window after the current one: when both counts are forgotten, and so when
    /// the state expires. Stored as `State.a`.
    pub(crate) forgotten_at: Nanos,
    /// The hits counted in the window before the current one. The high half of `State.b`.
    pub(crate) previous: u32,
    /// The hits counted in the current window. The low half of `State.b`.
    pub(crate) current: u32,
}

impl SlidingWindowState {
    #[inline]
    pub(crate) fn from_state(state: &State) -> SlidingWindowState {
        SlidingWindowState {
            forgotten_at: state.a,
            previous: (state.b >> 32) as u32,
            current: state.b as u32,
        }
    }

    #[inline]
    pub(crate) fn into_state(self) -> State {
        if self.previous == 0 && self.current == 0 {
            return State::default();
        }
        State {
            a: self.forgotten_at,
            b: (u64::from(self.previous) << 32) | u64::from(self.current),
        }
    }
}

/// The window around `now`: its start, its length, and when its counts are forgotten (the end of
/// the next window). Epoch-aligned windows of `period`, or calendar windows (whose length is the
/// current one's: a calendar month's previous month is weighed as if it were as long).
#[derive(Debug, Clone, Copy)]
struct Current {
    start: Nanos,
    period: Nanos,
    forgotten_at: Option<Nanos>,
}

fn current(period: Nanos, now: Nanos) -> Current {
    if !calendar::is_calendar(period) {
        let period = period.max(1);
        let start = now - now % period;
        return Current {
            start,
            period,
            forgotten_at: forgotten_at(start, period),
        };
    }
    let (start, end) = calendar::window(period, now);
    Current {
        start,
        period: (end - start).max(1),
        forgotten_at: Some(calendar::next_end(period, end)),
    }
}

/// (the window, previous count, current count) as seen at `now`.
fn counts(params: &LimitParams, state: Option<State>, now: Nanos) -> (Current, u64, u64) {
    let window = current(params.period, now);
    let (prev, cur) = match state.as_ref().map(SlidingWindowState::from_state) {
        Some(s) if Some(s.forgotten_at) == window.forgotten_at => (s.previous, s.current),
        // Written in the previous window: its current count is now the previous one.
        Some(s) if Some(s.forgotten_at) == window.start.checked_add(window.period) => {
            (s.current, 0)
        }
        _ => (0, 0),
    };
    (window, u64::from(prev), u64::from(cur))
}

/// A count as stored: counts never exceed a u32 `requests_per_unit`, this only keeps the cast
/// honest.
fn saturated(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// When the counts of the window starting at `start` are forgotten: the end of the next window.
fn forgotten_at(start: Nanos, period: Nanos) -> Option<Nanos> {
    start.checked_add(period.checked_mul(2)?)
}

pub(super) fn evaluate(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    hits: u64,
) -> Evaluation {
    let (window, prev, cur) = counts(params, state, now);
    let (start, period) = (window.start, window.period);
    let forgotten = window.forgotten_at.unwrap_or(u64::MAX);
    let elapsed = now - start;
    let limit = u128::from(params.requests_per_unit);
    let p = u128::from(period);
    // Everything is multiplied by `period` so the weighting is exact integer arithmetic.
    let prev_weighted = u128::from(prev) * u128::from(period - elapsed);
    let available = (limit * p).saturating_sub(prev_weighted);
    let remaining = |cur: u64| -> u32 {
        div(available, p)
            .saturating_sub(u128::from(cur))
            .min(u128::from(u32::MAX)) as u32
    };
    let reset_after = |cur: u64| -> Nanos {
        if cur > 0 {
            forgotten - now
        } else if prev > 0 {
            start + period - now
        } else {
            0
        }
    };
    let outlook = |cur: u64| Outlook {
        remaining: remaining(cur),
        reset_after: reset_after(cur),
    };
    let allowed = prev_weighted + (u128::from(cur) + u128::from(hits)) * p <= limit * p;
    let new_cur = if allowed || params.charge_denied {
        cur.saturating_add(hits)
    } else {
        cur
    };
    Evaluation {
        allowed,
        state_after: SlidingWindowState {
            forgotten_at: forgotten,
            previous: saturated(prev),
            current: saturated(new_cur),
        }
        .into_state(),
        after_charge: outlook(new_cur),
        without_charge: outlook(cur),
        delay: 0,
        retry_after: 0,
    }
}

/// Takes back `hits` counted in the current window at `now`.
pub(super) fn uncharge(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    let (window, prev, cur) = counts(params, Some(*state), now);
    SlidingWindowState {
        forgotten_at: window.forgotten_at.unwrap_or(u64::MAX),
        previous: saturated(prev),
        current: saturated(cur.saturating_sub(hits)),
    }
    .into_state()
}

#[cfg(test)]
mod tests {
    use super::super::evaluate as eval;
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::Algorithm;
    use crate::limiter::testing::drive;
    use proptest::prelude::*;

    fn params(rpu: u32, period_s: u64) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::SlidingWindow,
            requests_per_unit: rpu,
            period: period_s * S,
            burst: rpu,
            max_delay: 0,
            charge_denied: false,
        }
    }

    const T0: Nanos = 1_767_225_600 * S; // a minute boundary

    #[test]
    fn calendar_days_across_the_spring_change_weigh_the_previous_day() {
        use crate::calendar::{CalendarUnit, CalendarWindow};
        let day = CalendarWindow::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
        let p = LimitParams {
            period: day.period(),
            ..params(10, 60)
        };
        let short_day = 1_774_738_800 * S; // 2026-03-29 00:00 in Berlin: 23 hours long
        let next_day = 1_774_821_600 * S; // 2026-03-30 00:00 in Berlin (UTC+2 now)
        let mut st = None;
        assert_eq!(drive(&p, &mut st, short_day, 20), 10);
        let e = eval(&p, st, short_day, 0);
        assert_eq!(
            e.without_charge.reset_after,
            next_day + 24 * 3_600 * S - short_day
        );
        assert_eq!(eval(&p, st, next_day, 0).without_charge.remaining, 0);
        // Half-way through the next (24-hour) day, half of the previous day's count still weighs.
        assert_eq!(
            eval(&p, st, next_day + 12 * 3_600 * S, 0)
                .without_charge
                .remaining,
            5
        );
        assert_eq!(
            eval(&p, st, next_day + 24 * 3_600 * S, 0)
                .without_charge
                .remaining,
            10,
            "forgotten after the next day"
        );
    }

    #[test]
    fn counts_like_a_fixed_window_inside_the_first_window() {
        let p = params(10, 60);
        let mut st = None;
        let e = eval(&p, st, T0 + 10 * S, 1);
        assert!(e.allowed);
        assert_eq!(e.after_charge.remaining, 9);
        assert_eq!(
            e.after_charge.reset_after,
            110 * S,
            "gone once it leaves the next window"
        );
        assert_eq!(drive(&p, &mut st, T0 + 10 * S, 20), 10);
    }

    #[test]
    fn no_burst_at_the_window_edge() {
        let p = params(10, 60);
        let mut st = None;
        assert_eq!(drive(&p, &mut st, T0 + 59 * S, 10), 10);
        // A fixed window would admit 10 more right after the edge; here the previous window
        // still weighs 59/60 of 10 = 9.83, so nothing passes.
        assert_eq!(drive(&p, &mut st, T0 + 60 * S, 10), 0);
        // Half way through, the previous window weighs 5: five pass.
        assert_eq!(drive(&p, &mut st, T0 + 90 * S, 10), 5);
    }

    #[test]
    fn the_documented_worst_case_is_reached() {
        let p = params(10, 60);
        let mut full = None;
        // 10 in the last nanosecond of one window. The documented bound allows 10 × (1 + d/60 s)
        // in any interval of length d < 60 s: 19 from d = 54 s on.
        assert_eq!(drive(&p, &mut full, T0 + 60 * S - 1, 10), 10);
        let at_bound = T0 + 114 * S;
        let mut state = full;
        assert_eq!(
            drive(&p, &mut state, at_bound, 10),
            9,
            "54 s + 1 ns later: 10 × 6/60 = 1 still counted, so 9 more (19 in all)"
        );
        let mut state = full;
        assert_eq!(
            drive(&p, &mut state, at_bound - 1, 10),
            8,
            "1 ns earlier the old 10 weigh just over 1: 8 more (18 in all)"
        );
    }

    #[test]
    fn state_rolls_over_and_expires() {
        let p = params(4, 1);
        let e = eval(&p, None, T0 + S / 2, 3);
        // The stored words themselves (a remote store holds them as they are).
        assert_eq!(
            e.state_after,
            State {
                a: T0 + 2 * S,
                b: 3
            }
        );
        assert_eq!(e.state_after.expires_at(), T0 + 2 * S);
        // In the next window the 3 become the previous count.
        let e2 = eval(&p, Some(e.state_after), T0 + S, 0);
        assert_eq!(
            e2.state_after,
            State {
                a: T0 + 3 * S,
                b: 3 << 32
            }
        );
        // Only the previous window holds hits: expired from T0 + 2s, kept to T0 + 3s (no harm).
        assert_eq!(e2.state_after.expires_at(), T0 + 3 * S);
        assert_eq!(e2.without_charge.remaining, 1);
        // Two windows later nothing is left.
        let e3 = eval(&p, Some(e.state_after), T0 + 2 * S, 0);
        assert_eq!(e3.without_charge.remaining, 4);
        assert_eq!(e3.without_charge.reset_after, 0);
    }

    #[test]
    fn zero_requests_per_unit_denies_everything() {
        let p = params(0, 1);
        assert!(!eval(&p, None, T0, 1).allowed);
        assert!(eval(&p, None, T0, 0).allowed);
    }

    #[test]
    fn a_lowered_limit_never_underflows() {
        let p = params(100, 1);
        let st = eval(&p, None, T0, 100).state_after;
        let low = params(10, 1);
        let e = eval(&low, Some(st), T0 + S + 1, 1);
        assert!(!e.allowed);
        assert_eq!(e.without_charge.remaining, 0);
    }

    proptest! {
        /// In any interval of length d < period, admitted hits ≤ limit × (1 + d / period): the
        /// documented error bound against an exact sliding log (which admits at most `limit`).
        #[test]
        fn never_exceeds_the_documented_bound(
            rpu in 1u32..50,
            period_s in 1u64..5,
            steps in proptest::collection::vec((0u64..700_000_000, 0u64..4), 1..150),
        ) {
            let p = params(rpu, period_s);
            let mut now = T0 + 123_456_789;
            let mut state = None;
            let mut admitted: Vec<(Nanos, u64)> = Vec::new();
            for (gap, hits) in steps {
                now += gap;
                let e = eval(&p, state, now, hits);
                if e.allowed {
                    state = Some(e.state_after);
                    admitted.push((now, hits));
                }
            }
            let limit = u128::from(rpu);
            let period = u128::from(p.period);
            for i in 0..admitted.len() {
                let mut sum = 0u128;
                for &(t, hits) in &admitted[i..] {
                    let d = u128::from(t - admitted[i].0);
                    if d >= period {
                        break;
                    }
                    sum += u128::from(hits);
                    prop_assert!(
                        sum * period <= limit * period + limit * d,
                        "{sum} hits within {d} ns (limit {limit} per {period} ns)"
                    );
                }
            }
        }

        /// `remaining` is exact: that many single hits pass, one more does not.
        #[test]
        fn remaining_is_exact(
            rpu in 1u32..40,
            used in 0u32..50,
            later in 0u64..3_000_000_000,
        ) {
            let p = params(rpu, 1);
            let mut state = None;
            drive(&p, &mut state, T0 + 400_000_000, used);
            let now = T0 + 400_000_000 + later;
            let remaining = eval(&p, state, now, 1).without_charge.remaining;
            prop_assert_eq!(drive(&p, &mut state, now, remaining + 1), remaining);
        }

        /// Once the state has expired, the key is as good as new.
        #[test]
        fn expired_state_equals_no_state(rpu in 1u32..40, used in 1u32..40, at in 0u64..1_000_000_000) {
            let p = params(rpu, 1);
            let mut state = None;
            drive(&p, &mut state, T0 + at, used);
            let st = state.unwrap();
            let when = st.expires_at();
            prop_assert_eq!(eval(&p, Some(st), when, 1), eval(&p, None, when, 1));
        }
    }
}
