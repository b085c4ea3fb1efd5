//! The memory backend's concurrency leases: per concurrency key (its 128-bit keyed hash) the
//! key's [`Leases`] and its rule's watch, in mutex-guarded shards apart from the counters' table
//! (a key's leases are a list, not a 16-byte state). A key with no lease left is dropped at once;
//! ended leases go on the key's next call or at the sweep, which tells the rule's watch.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::clock::Nanos;
use crate::lease::{LeaseAction, LeaseAnswer, LeaseOutcome, LeaseParams, Leases, Watch};

const SHARDS: usize = 64;

struct Entry {
    leases: Leases,
    watch: Option<Watch>,
}

type Shard = HashMap<u128, Entry>;

pub(super) struct LeaseTable {
    shards: Box<[Mutex<Shard>]>,
    /// Keys one shard may hold: a new key past it is denied (never evicted: dropping a key's
    /// leases would let more than its limit in).
    max_keys_per_shard: usize,
}

impl LeaseTable {
    pub(super) fn new(max_keys: usize) -> LeaseTable {
        LeaseTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    fn lock(&self, key: u128) -> MutexGuard<'_, Shard> {
        self.lock_shard(((key >> 64) as usize) % SHARDS)
    }

    fn lock_shard(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // Every critical section leaves an entry whole, so a poisoned shard is consistent.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `action` for request `id` (its digest) on `key`'s leases at `now`.
    pub(super) fn call(
        &self,
        key: u128,
        id: u128,
        action: LeaseAction,
        params: &LeaseParams,
        now: Nanos,
        watch: Option<&Watch>,
    ) -> LeaseAnswer {
        let mut shard = self.lock(key);
        if let Some(entry) = shard.get_mut(&key) {
            let answer = entry.leases.apply(action, id, params, now);
            if entry.watch.is_none() {
                entry.watch = watch.cloned();
            }
            if entry.leases.is_empty() {
                shard.remove(&key);
            }
            return answer;
        }
        let mut leases = Leases::default();
        if action == LeaseAction::Acquire && shard.len() >= self.max_keys_per_shard {
            let ended = drop_ended(&mut shard, now);
            if ended == 0 && shard.len() >= self.max_keys_per_shard {
                let mut answer = leases.apply(LeaseAction::Peek, id, params, now);
                answer.outcome = LeaseOutcome::Denied;
                return answer;
            }
        }
        let answer = leases.apply(action, id, params, now);
        if !leases.is_empty() {
            shard.insert(
                key,
                Entry {
                    leases,
                    watch: watch.cloned(),
                },
            );
        }
        answer
    }

    /// Drops every ended lease (telling each key's watch) and the keys left with none. Returns
    /// how many leases ended.
    pub(super) fn sweep(&self, now: Nanos) -> usize {
        (0..SHARDS)
            .map(|s| drop_ended(&mut self.lock_shard(s), now))
            .sum()
    }

    /// Keys holding leases.
    pub(super) fn keys(&self) -> usize {
        (0..SHARDS).map(|s| self.lock_shard(s).len()).sum()
    }

    pub(super) fn clear(&self) {
        for s in 0..SHARDS {
            self.lock_shard(s).clear();
        }
    }
}

/// Drops a shard's ended leases, telling their keys' watches, and the keys left with none.
fn drop_ended(shard: &mut Shard, now: Nanos) -> usize {
    let mut ended = 0;
    shard.retain(|_, entry| {
        let n = entry.leases.expire(now);
        if n > 0 {
            ended += n as usize;
            if let Some(watch) = &entry.watch {
                watch.expired(n);
            }
        }
        !entry.leases.is_empty()
    });
    ended
}
