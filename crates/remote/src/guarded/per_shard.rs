//! A decision's shards (a Redis Cluster's masters serving its keys): each shard's breaker permits
//! the call or sends the decision to the failure mode, and hears how the call went; a shard's
//! switch is counted (`ratelimit_<name>_master_switches`, `_masters_down`), logged at most once
//! per `SWITCH_LOG_EVERY` each way, and its coming back writes the outage's hits back.

use std::sync::{Arc, MutexGuard, PoisonError};

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::{StoreError, Transaction};

use super::call::Answer;
use super::{Guarded, KeyOf, tasks};
use crate::breaker::{Change, Permit};
use crate::mode::FailureMode;
use crate::remote::{Connect, Remote, Shard};
use crate::shards::Shards;

/// The permits a call got from its keys' shards (empty off a sharded backend).
pub(super) type ShardPermits = Vec<(Shard, Permit)>;

impl<C: Connect> Guarded<C> {
    /// The permits of `tx`'s shards; `None` when one of them is open (the failure mode decides).
    pub(super) fn shard_permits(
        &self,
        remote: &C::Backend,
        tx: &Transaction<'_, KeyOf<C>>,
    ) -> Option<ShardPermits> {
        self.permits_of(remote, tx.charges.iter().map(|c| &c.key))
    }

    /// The permits of the shards of `keys`; `None` when one of them is open.
    pub(super) fn permits_of<'k>(
        &self,
        remote: &C::Backend,
        keys: impl IntoIterator<Item = &'k KeyOf<C>>,
    ) -> Option<ShardPermits> {
        let mut permits = ShardPermits::new();
        for key in keys {
            let Some(shard) = remote.shard(key) else {
                continue;
            };
            if !permits.iter().any(|(s, _)| *s == shard) {
                permits.push((shard, Permit::Call));
            }
        }
        if permits.is_empty() {
            return Some(permits);
        }
        let now = monotonic();
        let mut shards = self.shards();
        for (shard, permit) in &mut permits {
            *permit = shards.permit(*shard, now);
            if *permit == Permit::Reject {
                return None;
            }
        }
        Some(permits)
    }

    /// Tells the shards of a call how it went.
    pub(super) fn record_shards<T>(&self, permits: &ShardPermits, answer: &Answer<T>) {
        if permits.is_empty() {
            return;
        }
        let ok = matches!(
            answer,
            Answer::Answered(Ok(_) | Err(StoreError::Contention(_)))
        );
        let now = monotonic();
        let changes: Vec<Change> = {
            let mut shards = self.shards();
            let changes = permits
                .iter()
                .filter_map(|(shard, permit)| shards.record(*shard, *permit, ok, now))
                .collect();
            self.shared.metrics.shards_down.set(shards.down() as i64);
            changes
        };
        for change in changes {
            self.shard_switched(change);
        }
    }

    /// Counts and logs one shard's switch; back on the backend, writes the outage's hits back.
    fn shard_switched(&self, change: Change) {
        let shared = &self.shared;
        let name = &shared.name;
        let now = monotonic()
            .saturating_duration_since(shared.epoch)
            .as_nanos() as u64;
        let to = match change {
            Change::Down => "failure_mode",
            Change::Up => name.series,
        };
        shared.metrics.shard_switches.with_label_values(&[to]).inc();
        match change {
            Change::Down if shared.shard_down_log.due(now) => tracing::warn!(
                mode = shared.mode.name(),
                "a {} master stopped answering while the others answer: its keys are decided by {}_FAILURE_MODE={} until it (or its promoted replica) answers; the other masters' keys stay on {} (said at most every 10 s; ratelimit_{}_master_switches counts each switch)",
                name.title,
                name.upper,
                shared.mode.name(),
                name.title,
                name.series
            ),
            Change::Up => {
                if shared.mode == FailureMode::Local {
                    tokio::spawn(tasks::write_back(Arc::downgrade(shared)));
                }
                if shared.shard_up_log.due(now) {
                    tracing::warn!(
                        "a {} master answers again: its keys are back on {}",
                        name.title,
                        name.title
                    );
                }
            }
            Change::Down => {}
        }
    }

    fn shards(&self) -> MutexGuard<'_, Shards> {
        self.shared
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
