//! The circuit breaker in front of Redis, as a pure state machine: time comes in as an argument
//! (`now`), so it is tested without sleeping. It opens on a failure *rate*: at least
//! [`Breaker::THRESHOLD`] failed calls that are at least half of the recent calls (counts halve
//! every [`Breaker::DECAY`], so "recent" is the last second or so). One dropped connection fails
//! all of its calls in flight at once; with the pool's other connections answering, that is a
//! small share and does not open it (it used to: three failures in a row did). Open, no call goes
//! to Redis for an interval that starts at `base` and doubles after each failed probe up to `max`;
//! when the interval ends one call (the probe) goes through, and its success closes the breaker.
//! A hung Redis therefore costs one timeout per probe, not one per request. It owns no clock, no
//! I/O and no metrics: the caller reports what changed.

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
    Closed { recent: Recent },
    Open { until: Instant },
    HalfOpen { since: Instant },
}

/// Recent calls and failures while closed, halved every [`Breaker::DECAY`] since `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recent {
    calls: u32,
    failures: u32,
    since: Option<Instant>,
}

impl Recent {
    const NONE: Recent = Recent {
        calls: 0,
        failures: 0,
        since: None,
    };

    /// The counts at `now`: halved once per whole `DECAY` elapsed.
    fn at(self, now: Instant) -> Recent {
        let Some(since) = self.since else {
            return Recent {
                since: Some(now),
                ..self
            };
        };
        let halvings = now.saturating_duration_since(since).as_nanos() / Breaker::DECAY.as_nanos();
        if halvings == 0 {
            return self;
        }
        let shift = halvings.min(31) as u32;
        Recent {
            calls: self.calls >> shift,
            failures: self.failures >> shift,
            since: Some(since + Breaker::DECAY * halvings.min(u32::MAX as u128) as u32),
        }
    }
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
    /// Recent failures that open the breaker, if they are at least half of the recent calls.
    pub const THRESHOLD: u32 = 3;
    /// Recent counts halve this often.
    pub const DECAY: Duration = Duration::from_millis(250);

    /// A closed breaker whose openings last `base`, doubling up to `max`.
    pub fn new(base: Duration, max: Duration, probe_timeout: Duration) -> Breaker {
        Breaker {
            phase: Phase::Closed {
                recent: Recent::NONE,
            },
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
            (Phase::Closed { recent }, Permit::Call) => {
                let mut recent = recent.at(now);
                recent.calls = recent.calls.saturating_add(1);
                if ok {
                    self.phase = Phase::Closed { recent };
                    return None;
                }
                recent.failures = recent.failures.saturating_add(1);
                let tripped = recent.failures >= Self::THRESHOLD
                    && u64::from(recent.failures) * 2 >= u64::from(recent.calls);
                if !tripped {
                    self.phase = Phase::Closed { recent };
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
    fn opens_when_most_recent_calls_fail() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        assert_eq!(fail(&mut b, 2, t), [None, None]);
        succeed(&mut b, 1, t);
        // 3 of 4 recent calls failed.
        assert_eq!(fail(&mut b, 1, t), [Some(Change::Down)]);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.permit(t + 99 * MS), Permit::Reject);
    }

    #[test]
    fn one_dropped_connection_among_answering_ones_does_not_open_it() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        succeed(&mut b, 100, t);
        // A connection with 16 calls in flight drops: all 16 fail at once.
        assert!(fail(&mut b, 16, t + MS).iter().all(Option::is_none));
        assert!(b.is_up());
        // ... and again a second later, after more answers.
        succeed(&mut b, 100, t + 1000 * MS);
        assert!(fail(&mut b, 16, t + 1001 * MS).iter().all(Option::is_none));
        assert!(b.is_up());
    }

    #[test]
    fn old_answers_fade_so_an_outage_still_opens_it() {
        let t = crate::clock::monotonic();
        let mut b = breaker();
        succeed(&mut b, 1000, t);
        // Two seconds later (8 halvings: 1000 → 3 calls) Redis stops answering.
        let later = t + 2000 * MS;
        let changes = fail(&mut b, 6, later);
        assert_eq!(changes.iter().flatten().count(), 1, "{changes:?}");
        assert!(!b.is_up());
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
