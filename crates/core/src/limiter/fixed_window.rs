//! Fixed window: a counter per epoch-aligned window of `period`, as envoyproxy/ratelimit counts
//! (window start = now − now mod period), or per calendar window (`calendar::window`). Cheap, but
//! admits up to 2× the limit across a window edge.

use super::{Evaluation, LimitParams, Outlook, State};
use crate::calendar::window;
use crate::clock::Nanos;

/// A fixed window's view of its [`State`]: the window counted in and its hits. A window with no
/// hits is stored as no state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedWindowState {
    /// The end of the window counted in, when the state expires. Stored as `State.a`.
    pub(crate) end: Nanos,
    /// The hits counted in it. Stored as `State.b`.
    pub(crate) count: u64,
}

impl FixedWindowState {
    #[inline]
    pub(crate) fn from_state(state: &State) -> FixedWindowState {
        FixedWindowState {
            end: state.a,
            count: state.b,
        }
    }

    #[inline]
    pub(crate) fn into_state(self) -> State {
        if self.count == 0 {
            return State::default();
        }
        State {
            a: self.end,
            b: self.count,
        }
    }
}

pub(super) fn evaluate(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    hits: u64,
) -> Evaluation {
    let (_, end) = window(params.period, now);
    let count = match state.as_ref().map(FixedWindowState::from_state) {
        Some(s) if s.end == end => s.count,
        _ => 0,
    };
    let limit = u64::from(params.requests_per_unit);
    let reset_after = end - now;
    let outlook = |used: u64| Outlook {
        remaining: limit.saturating_sub(used).min(u64::from(u32::MAX)) as u32,
        reset_after,
    };
    let after = count.saturating_add(hits);
    let allowed = after <= limit;
    let kept = if allowed || params.charge_denied {
        after
    } else {
        count
    };
    Evaluation {
        allowed,
        state_after: FixedWindowState { end, count: kept }.into_state(),
        after_charge: outlook(kept),
        without_charge: outlook(count),
        delay: 0,
        retry_after: 0,
    }
}

/// Takes back `hits` counted in the window of `now` (a state of another window is left as it is).
pub(super) fn uncharge(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    let (_, end) = window(params.period, now);
    let s = FixedWindowState::from_state(state);
    if s.end != end {
        return *state;
    }
    FixedWindowState {
        end,
        count: s.count.saturating_sub(hits),
    }
    .into_state()
}

#[cfg(test)]
mod tests {
    use super::super::evaluate as eval;
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::Algorithm;
    use proptest::prelude::*;

    fn params(rpu: u32, period_s: u64) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_unit: rpu,
            period: period_s * S,
            burst: rpu,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn counts_down_then_denies_until_the_window_ends() {
        let p = params(3, 60);
        let mut st = None;
        let t = 1_767_225_610 * S; // 10 s into a minute
        for expected in [2, 1, 0] {
            let e = eval(&p, st, t, 1);
            assert!(e.allowed);
            assert_eq!(e.after_charge.remaining, expected);
            assert_eq!(e.after_charge.reset_after, 50 * S);
            st = Some(e.state_after);
        }
        let e = eval(&p, st, t + 49 * S, 1);
        assert!(!e.allowed);
        assert_eq!(e.after_charge.remaining, 0);
        assert_eq!(e.without_charge.reset_after, S);
        let e = eval(&p, st, t + 50 * S, 1);
        assert!(e.allowed, "a new window starts at the minute");
        assert_eq!(e.after_charge.remaining, 2);
    }

    #[test]
    fn denied_hits_are_not_counted() {
        let p = params(5, 1);
        let e = eval(&p, None, 0, 4);
        let e2 = eval(&p, Some(e.state_after), 0, 3);
        assert!(!e2.allowed);
        assert_eq!(FixedWindowState::from_state(&e2.state_after).count, 4);
        assert!(eval(&p, Some(e2.state_after), 0, 1).allowed);
    }

    #[test]
    fn with_charge_denied_a_cost_over_the_limit_is_counted_and_keeps_the_window_over() {
        let p = LimitParams {
            charge_denied: true,
            ..params(10, 60)
        };
        let e = eval(&p, None, 0, 6);
        assert!(e.allowed);
        // 8 tokens reported after the fact against 4 left: denied, and spent all the same.
        let e2 = eval(&p, Some(e.state_after), S, 8);
        assert!(!e2.allowed);
        assert_eq!(FixedWindowState::from_state(&e2.state_after).count, 14);
        assert_eq!(e2.after_charge.remaining, 0);
        // A check (no hits) is now denied until the window ends, as the reference's count > limit.
        assert!(!eval(&p, Some(e2.state_after), 59 * S, 0).allowed);
        assert!(eval(&p, Some(e2.state_after), 60 * S, 0).allowed);
    }

    #[test]
    fn state_expires_at_window_end() {
        let p = params(5, 60);
        let e = eval(&p, None, 61 * S, 1);
        assert_eq!(e.state_after.expires_at(), 120 * S);
        let empty = eval(&p, None, 61 * S, 0);
        assert_eq!(
            empty.state_after.expires_at(),
            0,
            "an empty window is no state"
        );
    }

    #[test]
    fn a_calendar_month_in_berlin_resets_at_midnight_there_and_its_state_expires_then() {
        use crate::calendar::{CalendarUnit, CalendarWindow};
        let month = CalendarWindow::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
        let p = LimitParams {
            period: month.period(),
            ..params(2, 60)
        };
        let last_minute = 1_769_900_340 * S; // 2026-01-31T22:59:00Z, 23:59 in Berlin
        let february = 1_769_900_400 * S; // 2026-02-01 00:00 in Berlin
        let e = eval(&p, None, last_minute, 2);
        assert!(e.allowed);
        assert_eq!(e.after_charge.reset_after, 60 * S, "to the real boundary");
        assert_eq!(e.state_after.expires_at(), february);
        assert!(!eval(&p, Some(e.state_after), february - 1, 1).allowed);
        let e = eval(&p, Some(e.state_after), february, 1);
        assert!(e.allowed, "a new month");
        assert_eq!(e.after_charge.remaining, 1);
        assert_eq!(
            e.after_charge.reset_after,
            (1_772_319_600 - 1_769_900_400) * S
        );
        // The day of the spring change lasts 23 hours.
        let day = CalendarWindow::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
        let p = LimitParams {
            period: day.period(),
            ..params(2, 60)
        };
        let e = eval(&p, None, 1_774_738_800 * S, 1);
        assert_eq!(e.after_charge.reset_after, 23 * 3_600 * S);
        assert_eq!(
            uncharge(&p, &e.state_after, 1_774_785_600 * S, 1),
            State::default()
        );
    }

    proptest! {
        /// Fixed window admits exactly what a plain per-window counter admits.
        #[test]
        fn equals_a_plain_counter(
            rpu in 0u32..50,
            period_s in 1u64..10,
            steps in proptest::collection::vec((0u64..3_000_000_000, 0u64..5), 1..200),
        ) {
            let p = params(rpu, period_s);
            let mut now = 1_700_000_000 * S;
            let mut state = None;
            let mut counts = std::collections::HashMap::<u64, u64>::new();
            for (gap, hits) in steps {
                now += gap;
                let window = now / p.period;
                let count = counts.entry(window).or_default();
                let expect = *count + hits <= u64::from(rpu);
                let e = eval(&p, state, now, hits);
                prop_assert_eq!(e.allowed, expect);
                if e.allowed {
                    *count += hits;
                    state = Some(e.state_after);
                }
                prop_assert_eq!(u64::from(e.after_charge.remaining), u64::from(rpu) - *count);
            }
        }
    }
}
