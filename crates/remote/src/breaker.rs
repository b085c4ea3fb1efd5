//! The circuit breaker in front of a remote backend, as a pure state machine: time comes in as an
//! argument (`now`), so it is tested without sleeping. It opens when the backend has stopped
//! answering: at least [`Breaker::THRESHOLD`] failed calls since the last answered one, and that
//! answer at least the breaker's quiet time ago (the backend's call timeout, at least
//! [`Breaker::QUIET`]): silence on every connection for as long as a call may take. One dropped
//! connection fails all of its calls in flight at once, but the pool's other connections go on
//! answering, so it does not open it. Open, no call goes to the backend for an interval that
//! starts at `base` and doubles after each failed probe up to `max`; when the interval ends one
//! call (the probe) goes through, and its success closes the breaker. A hung backend therefore
//! costs one timeout per probe, not one per request. It owns no clock, no I/O and no metrics: the
//! caller reports what changed.

use std::time::{Duration, Instant};

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// The breaker is closed: call the backend.
    Call,
    /// The breaker lets this one call through to see whether the backend answers again.
    Probe,
    /// The breaker is open: do not call the backend.
    Reject,
}

/// A switch between the backend and the failure mode, to log and count once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The backend stopped answering: decisions go to the failure mode.
    Down,
    /// The backend answers again: decisions go back to it.
    Up,
}

/// The breaker's state, for the `ratelimit_<name>_breaker_state` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed { recent: Recent },
    Open { until: Instant },
    HalfOpen { since: Instant },
}

/// While closed: failed calls since the last answered one, and when that was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recent {
    failures: u32,
    last_answer: Option<Instant>,
}

impl Recent {
    const NONE: Recent = Recent {
        failures: 0,
        last_answer: None,
    };
}

#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    phase: Phase,
    /// How long the next opening lasts.
    interval: Duration,
    base: Duration,
    max: Duration,
    /// A probe that has not reported within this long is taken as lost (its caller went away):
    /// another call may probe.
    probe_timeout: Duration,
    /// How long without an answer is silence (see [`Breaker::quiet`]).
    quiet: Duration,
}

impl Breaker {
    /// Failed calls since the last answered one that open the breaker...
    pub(crate) const THRESHOLD: u32 = 3;
    /// ... once that answer is at least this old (other connections answering meanwhile keep it
    /// closed): the least quiet time, and the default.
    pub(crate) const QUIET: Duration = Duration::from_millis(50);

    /// A closed breaker whose openings last `base`, doubling up to `max`.
    pub(crate) fn new(base: Duration, max: Duration, probe_timeout: Duration) -> Breaker {
        Breaker {
            phase: Phase::Closed {
                recent: Recent::NONE,
            },
            interval: base,
            base,
            max: max.max(base),
            probe_timeout,
            quiet: Self::QUIET,
        }
    }

    /// This breaker, taking `quiet` without an answer (at least [`Breaker::QUIET`]) as silence:
    /// the guard gives the backend's call timeout, as long as an answer may take.
    pub(crate) fn with_quiet(self, quiet: Duration) -> Breaker {
        Breaker {
            quiet: quiet.max(Self::QUIET),
            ..self
        }
    }

    /// How long without an answer is silence.
    pub(crate) fn quiet(&self) -> Duration {
        self.quiet
    }

    /// An open breaker (the backend not reached yet), whose first probe may go at `now`.
    pub(crate) fn new_open(
        base: Duration,
        max: Duration,
        probe_timeout: Duration,
        now: Instant,
    ) -> Self {
        Breaker {
            phase: Phase::Open { until: now },
            ..Breaker::new(base, max, probe_timeout)
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Closed, with enough failures to open but an answer too recent: the caller should check
    /// again (a `PING`) once [`Breaker::quiet`] has passed, in case no more calls come to tell.
    pub(crate) fn suspects(&self) -> bool {
        matches!(self.phase, Phase::Closed { recent } if recent.failures >= Self::THRESHOLD)
    }

    /// Closed, with no failure since its last answer.
    pub(crate) fn is_clear(&self) -> bool {
        matches!(self.phase, Phase::Closed { recent } if recent.failures == 0)
    }

    /// Whether decisions go to the backend (the breaker is closed).
    pub(crate) fn is_up(&self) -> bool {
        matches!(self.phase, Phase::Closed { .. })
    }

    /// What a call may do at `now`.
    pub(crate) fn permit(&mut self, now: Instant) -> Permit {
        match self.phase {
            Phase::Closed { .. } => Permit::Call,
            Phase::Open { until } if now >= until => {
                self.phase = Phase::HalfOpen { since: now };
                Permit::Probe
            }
            Phase::HalfOpen { since }
                if now.saturating_duration_since(since) >= self.probe_timeout =>
            {
                self.phase = Phase::HalfOpen { since: now };
                Permit::Probe
            }
            Phase::Open { .. } | Phase::HalfOpen { .. } => Permit::Reject,
        }
    }

    /// Records how a call made with `permit` ended at `now`; returns the switch it caused.
    pub(crate) fn record(&mut self, permit: Permit, ok: bool, now: Instant) -> Option<Change> {
        match (self.phase, permit) {
            (Phase::Closed { recent }, Permit::Call) => {
                if ok {
                    self.phase = Phase::Closed {
                        recent: Recent {
                            failures: 0,
                            last_answer: Some(now),
                        },
                    };
                    return None;
                }
                let failures = recent.failures.saturating_add(1);
                let quiet = recent
                    .last_answer
                    .is_none_or(|at| now.saturating_duration_since(at) >= self.quiet);
                if failures < Self::THRESHOLD || !quiet {
                    self.phase = Phase::Closed {
                        recent: Recent { failures, ..recent },
                    };
                    return None;
                }
                self.interval = self.base;
                self.open(now);
                Some(Change::Down)
            }
            (Phase::HalfOpen { .. }, Permit::Probe) if ok => Some(self.close()),
            (Phase::HalfOpen { .. }, Permit::Probe) => {
                self.interval = (self.interval * 2).min(self.max);
                self.open(now);
                None
            }
            // A call let through before the breaker opened, or a late probe: its answer says
            // nothing new.
            _ => None,
        }
    }

    /// A probe failed at once (a refused connection, an error reply: the backend is down or
    /// restarting, not slow): the breaker opens again for the base interval, not a doubled one.
    /// Backing off spares a backend that does not answer in time; one that refuses at once costs
    /// nothing to ask again, and is found within one base interval of its restart.
    pub(crate) fn record_fast_probe_failure(&mut self, now: Instant) {
        if let Phase::HalfOpen { .. } = self.phase {
            self.interval = self.base;
            self.open(now);
        }
    }

    /// The backend was reached some other way (the first connection): decisions go to it now.
    pub(crate) fn connected(&mut self) -> Option<Change> {
        (!self.is_up()).then(|| self.close())
    }

    fn open(&mut self, now: Instant) {
        self.phase = Phase::Open {
            until: now + self.interval,
        };
    }

    fn close(&mut self) -> Change {
        self.phase = Phase::Closed {
            recent: Recent::NONE,
        };
        self.interval = self.base;
        Change::Up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn breaker() -> Breaker {
        Breaker::new(100 * MS, 800 * MS, 250 * MS)
    }

    /// Fails `n` calls at `now`.
    fn fail(b: &mut Breaker, n: u32, now: Instant) -> Vec<Option<Change>> {
        (0..n)
            .map(|_| {
                let p = b.permit(now);
                b.record(p, false, now)
            })
            .collect()
    }

    /// Answers `n` calls at `now`.
    fn succeed(b: &mut Breaker, n: u32, now: Instant) {
        for _ in 0..n {
            let p = b.permit(now);
            assert_eq!(b.record(p, true, now), None);
        }
    }

    #[test]
    fn opens_after_failures_with_no_answer_between_them() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        assert_eq!(fail(&mut b, 2, t), [None, None]);
        succeed(&mut b, 1, t);
        assert_eq!(
            fail(&mut b, 2, t),
            [None, None],
            "an answer starts the count again"
        );
        assert!(b.is_up());
        assert_eq!(fail(&mut b, 1, t + Breaker::QUIET), [Some(Change::Down)]);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.permit(t + Breaker::QUIET + 99 * MS), Permit::Reject);
    }

    #[test]
    fn a_dropped_connection_while_others_answer_does_not_open_it() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        succeed(&mut b, 1, t);
        // A connection with 16 calls in flight drops: all 16 fail at once...
        assert!(fail(&mut b, 16, t + MS).iter().all(Option::is_none));
        // ... while the other connections go on answering.
        succeed(&mut b, 1, t + 2 * MS);
        assert!(fail(&mut b, 16, t + 20 * MS).iter().all(Option::is_none));
        assert!(b.is_up());
    }

    #[test]
    fn failures_right_after_an_answer_open_it_once_the_backend_stays_quiet() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        succeed(&mut b, 1000, t);
        assert!(fail(&mut b, 10, t + MS).iter().all(Option::is_none));
        assert!(b.suspects(), "the caller is told to check again");
        assert_eq!(
            fail(&mut b, 1, t + MS + Breaker::QUIET),
            [Some(Change::Down)]
        );
        assert!(!b.suspects());
    }

    #[test]
    fn with_a_longer_quiet_time_failures_within_it_keep_it_closed() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker().with_quiet(100 * MS);
        succeed(&mut b, 1, t);
        assert!(fail(&mut b, 30, t + 99 * MS).iter().all(Option::is_none));
        assert!(b.is_up());
        assert_eq!(fail(&mut b, 1, t + 100 * MS), [Some(Change::Down)]);
        assert_eq!(breaker().with_quiet(MS).quiet(), Breaker::QUIET);
    }

    #[test]
    fn one_probe_at_a_time_and_its_success_closes() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        let at = t + 100 * MS;
        assert_eq!(b.permit(at), Permit::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.permit(at), Permit::Reject, "only one probe");
        assert_eq!(b.permit(at + 249 * MS), Permit::Reject);
        assert_eq!(b.record(Permit::Probe, true, at + MS), Some(Change::Up));
        assert!(b.is_up());
        assert_eq!(b.permit(at + MS), Permit::Call);
    }

    #[test]
    fn failed_probes_double_the_interval_up_to_the_cap() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        let mut now = t;
        let mut waits = Vec::new();
        for _ in 0..6 {
            // The first instant a probe is allowed.
            let mut wait = Duration::ZERO;
            while b.permit(now + wait) == Permit::Reject {
                wait += MS;
            }
            waits.push(wait.as_millis());
            now += wait;
            assert_eq!(b.record(Permit::Probe, false, now), None);
        }
        assert_eq!(waits, [100, 200, 400, 800, 800, 800]);
        assert_eq!(b.permit(now + 800 * MS), Permit::Probe);
        assert_eq!(b.record(Permit::Probe, true, now), Some(Change::Up));
        // Closed again: the next opening starts from the base interval.
        fail(&mut b, 3, now);
        assert_eq!(b.permit(now + 100 * MS), Permit::Probe);
    }

    #[test]
    fn probes_that_fail_at_once_keep_the_base_interval() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        // One slow failure doubles the interval; fast ones bring it back to the base.
        assert_eq!(b.permit(t + 100 * MS), Permit::Probe);
        assert_eq!(b.record(Permit::Probe, false, t + 100 * MS), None);
        assert_eq!(b.permit(t + 299 * MS), Permit::Reject);
        assert_eq!(b.permit(t + 300 * MS), Permit::Probe);
        b.record_fast_probe_failure(t + 300 * MS);
        for at in [400, 500, 600] {
            assert_eq!(b.permit(t + (at - 1) * MS), Permit::Reject);
            assert_eq!(b.permit(t + at * MS), Permit::Probe);
            b.record_fast_probe_failure(t + at * MS);
        }
        assert!(!b.is_up());
        assert_eq!(b.permit(t + 700 * MS), Permit::Probe);
        assert_eq!(
            b.record(Permit::Probe, true, t + 700 * MS),
            Some(Change::Up)
        );
        // Only a probe in flight is recorded: closed, a fast failure changes nothing.
        b.record_fast_probe_failure(t + 701 * MS);
        assert!(b.is_up());
    }

    #[test]
    fn a_lost_probe_is_replaced() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        assert_eq!(b.permit(t + 100 * MS), Permit::Probe);
        // Its caller went away: no record. Past the probe timeout another call probes.
        assert_eq!(b.permit(t + 349 * MS), Permit::Reject);
        assert_eq!(b.permit(t + 350 * MS), Permit::Probe);
    }

    #[test]
    fn late_answers_change_nothing() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        // A call let through while closed answers after the breaker opened.
        assert_eq!(b.record(Permit::Call, true, t), None);
        assert_eq!(b.record(Permit::Call, false, t), None);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn starting_open_then_connected() {
        let t = ratelimit_core::clock::monotonic();
        let mut b = Breaker::new_open(100 * MS, 800 * MS, 250 * MS, t);
        assert!(!b.is_up());
        assert_eq!(b.connected(), Some(Change::Up));
        assert_eq!(b.connected(), None);
        assert_eq!(b.permit(t), Permit::Call);
    }
}
