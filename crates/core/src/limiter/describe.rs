//! Words for `explain`: what a limit's numbers mean under its algorithm, and what a key's state
//! says. Pure formatting, no clock.

use super::{FixedWindowState, LimitParams, SlidingWindowState, State, TatState};
use crate::calendar;
use crate::clock::Nanos;
use crate::config::{Algorithm, format_duration};

/// A duration for people: exact when it is whole milliseconds, else milliseconds to 3 decimals.
pub fn human(nanos: Nanos) -> String {
    if nanos.is_multiple_of(1_000_000) || nanos < 1_000_000 {
        format_duration(std::time::Duration::from_nanos(nanos))
    } else {
        format!("{:.3}ms", nanos as f64 / 1e6)
    }
}

impl LimitParams {
    /// The effective rate, burst and window, e.g. `refill 1 every 100ms, burst 10`.
    pub fn describe(&self) -> String {
        let window = self.window();
        let interval = self.drain_interval().map_or("never".into(), human);
        match self.algorithm {
            Algorithm::TokenBucket => {
                format!("refill 1 every {interval}, burst {}", self.burst)
            }
            Algorithm::FixedWindow if calendar::is_calendar(self.period) => {
                format!("{} per {window}", self.requests_per_unit)
            }
            Algorithm::FixedWindow => format!(
                "{} per epoch-aligned window of {window}",
                self.requests_per_unit
            ),
            Algorithm::SlidingWindow => format!(
                "{} per sliding window of {window} (previous window weighted by its overlap)",
                self.requests_per_unit
            ),
            Algorithm::LeakyBucket => format!(
                "drain 1 every {interval}, queue {}, max delay {}",
                self.burst,
                human(self.max_delay)
            ),
        }
    }

    /// The start of the window that ends at `end`.
    fn window_start(&self, end: Nanos) -> Nanos {
        if calendar::is_calendar(self.period) {
            calendar::window(self.period, end.saturating_sub(1)).0
        } else {
            end.saturating_sub(self.period)
        }
    }

    /// The window in words: `1m`, or `calendar month in Europe/Berlin`.
    pub fn window(&self) -> String {
        calendar::describe(self.period).unwrap_or_else(|| human(self.period))
    }

    /// What a key's stored state says at `now`, e.g. `12 hits in the window that started 3s ago`.
    pub(crate) fn describe_state(&self, state: Option<&State>, now: Nanos) -> String {
        let Some(s) = state else {
            return "no state: as fresh".into();
        };
        match self.algorithm {
            Algorithm::TokenBucket => {
                let full_at = TatState::from_state(s).rounded_up;
                format!(
                    "bucket full again in {}",
                    human(full_at.saturating_sub(now))
                )
            }
            Algorithm::LeakyBucket => format!(
                "queue empty in {} (the next turn starts then)",
                human(TatState::from_state(s).rounded_up.saturating_sub(now))
            ),
            Algorithm::FixedWindow => {
                let window = FixedWindowState::from_state(s);
                format!(
                    "{} hit(s) in the window that started {} ago",
                    window.count,
                    human(now.saturating_sub(self.window_start(window.end)))
                )
            }
            Algorithm::SlidingWindow => {
                let windows = SlidingWindowState::from_state(s);
                let current_start = if calendar::is_calendar(self.period) {
                    calendar::window(self.period, now).0
                } else {
                    windows
                        .forgotten_at
                        .saturating_sub(self.period.saturating_mul(2))
                };
                format!(
                    "{} hit(s) in the window that started {} ago, {} in the one before",
                    windows.current,
                    human(now.saturating_sub(current_start)),
                    windows.previous
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;

    fn params(algorithm: Algorithm) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: 3,
            period: S,
            burst: 5,
            max_delay: 2 * S,
            charge_denied: false,
        }
    }

    #[test]
    fn describes_each_algorithm() {
        assert_eq!(
            params(Algorithm::TokenBucket).describe(),
            "refill 1 every 333.333ms, burst 5"
        );
        assert_eq!(
            params(Algorithm::LeakyBucket).describe(),
            "drain 1 every 333.333ms, queue 5, max delay 2s"
        );
        assert!(
            params(Algorithm::FixedWindow)
                .describe()
                .contains("window of 1s")
        );
        let sliding = LimitParams {
            requests_per_unit: 10,
            ..params(Algorithm::SlidingWindow)
        };
        let before = crate::limiter::evaluate(&sliding, None, 9 * S, 4).state_after;
        let st = crate::limiter::evaluate(&sliding, Some(before), 10 * S, 2).state_after;
        assert_eq!(
            sliding.describe_state(Some(&st), 10 * S + S / 2),
            "2 hit(s) in the window that started 500ms ago, 4 in the one before"
        );
        assert_eq!(sliding.describe_state(None, 0), "no state: as fresh");
        let fixed = params(Algorithm::FixedWindow);
        let st = crate::limiter::evaluate(&fixed, None, 10 * S + S / 4, 2).state_after;
        assert_eq!(
            fixed.describe_state(Some(&st), 10 * S + S / 2),
            "2 hit(s) in the window that started 500ms ago"
        );
    }
}
