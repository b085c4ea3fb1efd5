//! The circuit breaker in front of Redis, as a pure state machine: time comes in as an argument
//! (`now`), so it is tested without sleeping. After [`Breaker::THRESHOLD`] consecutive failed
//! calls it opens: no call goes to Redis for an interval that starts at `base` and doubles after
//! each failed probe up to `max`; when the interval ends one call (the probe) goes through, and
//! its success closes the breaker. A hung Redis therefore costs one timeout per probe, not one
//! per request. It owns no clock, no I/O and no metrics: the caller reports what changed.

use std::time::{Duration, Instant};

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// The breaker is closed: call Redis.
    Call,
    /// The breaker lets this one call through to see whether Redis answers again.
    Probe,
    /// The breaker is open: do not call Redis.
    Reject,
}

/// A switch between Redis and the failure mode, to log and count once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Redis stopped answering: decisions go to the failure mode.
    Down,
    /// Redis answers again: decisions go back to it.
    Up,
}

/// The breaker's state, for the `ratelimit_redis_breaker_state` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { since: Instant },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    phase: Phase,
    /// How long the next opening lasts.
    interval: Duration,
    base: Duration,
    max: Duration,
    /// A probe that has not reported within this long is taken as lost (its caller went away):
    /// another call may probe.
    probe_timeout: Duration,
}

impl Breaker {
    /// Consecutive failures that open the breaker.
    pub const THRESHOLD: u32 = 3;

    /// A closed breaker whose openings last `base`, doubling up to `max`.
    pub fn new(base: Duration, max: Duration, probe_timeout: Duration) -> Breaker {
        Breaker {
            phase: Phase::Closed { failures: 0 },
            interval: base,
            base,
            max: max.max(base),
            probe_timeout,
        }
    }

    /// An open breaker (Redis not reached yet), whose first probe may go at `now`.
    pub fn new_open(base: Duration, max: Duration, probe_timeout: Duration, now: Instant) -> Self {
        Breaker {
            phase: Phase::Open { until: now },
            ..Breaker::new(base, max, probe_timeout)
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether decisions go to Redis (the breaker is closed).
    pub fn is_up(&self) -> bool {
        matches!(self.phase, Phase::Closed { .. })
    }

    /// What a call may do at `now`.
    pub fn permit(&mut self, now: Instant) -> Permit {
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
    pub fn record(&mut self, permit: Permit, ok: bool, now: Instant) -> Option<Change> {
        match (self.phase, permit) {
            (Phase::Closed { .. }, Permit::Call) if ok => {
                self.phase = Phase::Closed { failures: 0 };
                None
            }
            (Phase::Closed { failures }, Permit::Call) => {
                let failures = failures + 1;
                if failures < Self::THRESHOLD {
                    self.phase = Phase::Closed { failures };
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

    /// Redis was reached some other way (the first connection): decisions go to it now.
    pub fn connected(&mut self) -> Option<Change> {
        (!self.is_up()).then(|| self.close())
    }

    fn open(&mut self, now: Instant) {
        self.phase = Phase::Open {
            until: now + self.interval,
        };
    }

    fn close(&mut self) -> Change {
        self.phase = Phase::Closed { failures: 0 };
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

    #[test]
    fn opens_after_consecutive_failures_only() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        assert_eq!(fail(&mut b, 2, t), [None, None]);
        assert_eq!(
            b.record(Permit::Call, true, t),
            None,
            "a success resets the count"
        );
        assert_eq!(fail(&mut b, 2, t), [None, None]);
        assert!(b.is_up());
        assert_eq!(fail(&mut b, 1, t), [Some(Change::Down)]);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.permit(t + 99 * MS), Permit::Reject);
    }

    #[test]
    fn one_probe_at_a_time_and_its_success_closes() {
        let t = crate::clock::monotonic();
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
        let t = crate::clock::monotonic();
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
    fn a_lost_probe_is_replaced() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        assert_eq!(b.permit(t + 100 * MS), Permit::Probe);
        // Its caller went away: no record. Past the probe timeout another call probes.
        assert_eq!(b.permit(t + 349 * MS), Permit::Reject);
        assert_eq!(b.permit(t + 350 * MS), Permit::Probe);
    }

    #[test]
    fn late_answers_change_nothing() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        fail(&mut b, 3, t);
        // A call let through while closed answers after the breaker opened.
        assert_eq!(b.record(Permit::Call, true, t), None);
        assert_eq!(b.record(Permit::Call, false, t), None);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn starting_open_then_connected() {
        let t = crate::clock::monotonic();
        let mut b = Breaker::new_open(100 * MS, 800 * MS, 250 * MS, t);
        assert!(!b.is_up());
        assert_eq!(b.connected(), Some(Change::Up));
        assert_eq!(b.connected(), None);
        assert_eq!(b.permit(t), Permit::Call);
    }
}
