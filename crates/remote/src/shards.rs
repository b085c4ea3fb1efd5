//! A breaker per shard (a Redis Cluster master) beside the backend's own: a shard whose calls
//! fail while it answers nothing (the same rule as the backend's breaker, [`Breaker`]) opens
//! alone, and only its keys go to the failure mode; one decision at a time probes it once its
//! interval ends, and its answer closes it. The other shards' keys go on to the backend. Pure:
//! `now` comes in; the guard counts and logs the switches.

use std::collections::HashMap;
use std::time::Instant;

use crate::breaker::{Breaker, Change, Permit};
use crate::remote::Shard;

/// Shards remembered at most (a cluster has a few masters; each failover adds one): past it,
/// closed shards with nothing to remember are forgotten.
const MAX_SHARDS: usize = 256;

/// The shards' breakers, made on a shard's first call.
pub(crate) struct Shards {
    breakers: HashMap<Shard, Breaker>,
    /// A closed breaker, the start of every shard's.
    fresh: Breaker,
}

impl Shards {
    /// Shards whose breakers start as `fresh` (closed).
    pub(crate) fn new(fresh: Breaker) -> Shards {
        Shards {
            breakers: HashMap::new(),
            fresh,
        }
    }

    /// What a decision on `shard`'s keys may do at `now`.
    pub(crate) fn permit(&mut self, shard: Shard, now: Instant) -> Permit {
        self.breakers
            .get_mut(&shard)
            .map_or(Permit::Call, |b| b.permit(now))
    }

    /// Records how a call on `shard` made with `permit` ended at `now`; the switch it caused.
    pub(crate) fn record(
        &mut self,
        shard: Shard,
        permit: Permit,
        ok: bool,
        now: Instant,
    ) -> Option<Change> {
        if self.breakers.len() >= MAX_SHARDS {
            self.breakers.retain(|_, b| !b.is_clear());
        }
        let breaker = self
            .breakers
            .entry(shard)
            .or_insert_with(|| self.fresh.clone());
        breaker.record(permit, ok, now)
    }

    /// Shards whose breaker is not closed.
    pub(crate) fn down(&self) -> usize {
        self.breakers.values().filter(|b| !b.is_up()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);
    const DEAD: Shard = Shard(1);
    const LIVE: Shard = Shard(2);

    fn shards() -> Shards {
        Shards::new(Breaker::new(100 * MS, 800 * MS, 250 * MS))
    }

    #[test]
    fn a_silent_shard_opens_alone_and_its_probe_closes_it() {
        let t = ratelimit_core::clock::monotonic();
        let mut s = shards();
        for n in 0..3 {
            let at = t + n * 20 * MS;
            let permit = s.permit(LIVE, at);
            assert_eq!(s.record(LIVE, permit, true, at), None);
            assert_eq!(s.permit(DEAD, at), Permit::Call);
        }
        // The dead master answered nothing ever: its third failure opens it.
        assert_eq!(s.record(DEAD, Permit::Call, false, t), None);
        assert_eq!(s.record(DEAD, Permit::Call, false, t), None);
        assert_eq!(
            s.record(DEAD, Permit::Call, false, t + Breaker::QUIET),
            Some(Change::Down)
        );
        assert_eq!(s.down(), 1);
        let open = t + Breaker::QUIET;
        assert_eq!(s.permit(DEAD, open + 10 * MS), Permit::Reject);
        assert_eq!(s.permit(LIVE, open + 10 * MS), Permit::Call);
        // Its interval over, one decision probes; the promoted master answers it.
        assert_eq!(s.permit(DEAD, open + 100 * MS), Permit::Probe);
        assert_eq!(s.permit(DEAD, open + 100 * MS), Permit::Reject);
        assert_eq!(
            s.record(DEAD, Permit::Probe, true, open + 101 * MS),
            Some(Change::Up)
        );
        assert_eq!(s.down(), 0);
        assert_eq!(s.permit(DEAD, open + 102 * MS), Permit::Call);
    }

    #[test]
    fn failures_right_after_the_shard_answered_keep_it_closed() {
        let t = ratelimit_core::clock::monotonic();
        let mut s = shards();
        s.record(LIVE, Permit::Call, true, t);
        // One cut connection fails 16 calls at once.
        for _ in 0..16 {
            assert_eq!(s.record(LIVE, Permit::Call, false, t + MS), None);
        }
        assert_eq!(s.permit(LIVE, t + 2 * MS), Permit::Call);
        assert_eq!(s.down(), 0);
    }

    #[test]
    fn past_the_cap_quiet_shards_are_forgotten_and_open_ones_kept() {
        let t = ratelimit_core::clock::monotonic();
        let mut s = shards();
        for n in 0..3 {
            s.record(DEAD, Permit::Call, false, t + n * Breaker::QUIET);
        }
        for n in 10..(10 + MAX_SHARDS as u64) {
            s.record(Shard(n), Permit::Call, true, t);
        }
        assert!(s.breakers.len() <= MAX_SHARDS);
        assert_eq!(s.down(), 1);
        assert_eq!(s.permit(DEAD, t + Breaker::QUIET + MS), Permit::Reject);
    }
}
