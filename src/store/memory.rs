//! The in-memory store: keys spread over mutex-guarded shards of a hash map. A request locks the
//! shards of all its keys (in shard order, so requests never deadlock), evaluates, charges all or
//! nothing, and unlocks: exact under any concurrency. We shard by hand rather than use dashmap
//! because dashmap cannot hold several shards at once, which all-or-nothing charging needs.
//! Idle keys (state equal to "no state") are dropped by `sweep`; `max_keys` bounds memory by
//! evicting the soonest-expiring of a few sampled keys when a shard is full.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::{Charge, Store, StoreError, StoreKey, Verdict};
use crate::clock::Nanos;
use crate::limiter::{self, State};

const SHARDS: usize = 128;
/// Keys looked at to choose one to evict when a shard is full.
const EVICTION_SAMPLE: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Entry {
    state: State,
    /// From this instant the state equals "no state" and may be dropped.
    expires_at: Nanos,
}

/// Store keys are already uniform hashes: use their low bits as the hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

/// A key as two words rather than a u128, so a map slot is 8-byte aligned (40 bytes, not 48).
type MapKey = (u64, u64);

fn map_key(key: StoreKey) -> MapKey {
    (key.0 as u64, (key.0 >> 64) as u64)
}

type Shard = HashMap<MapKey, Entry, BuildHasherDefault<KeyHasher>>;

/// Locks held by one request: a request's keys rarely span more than a few shards.
type Guards<'a> = SmallVec<[(usize, MutexGuard<'a, Shard>); 4]>;

/// Counts for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStoreStats {
    pub keys: usize,
    pub evictions: u64,
    pub expired: u64,
}

pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    max_keys_per_shard: usize,
    evictions: AtomicU64,
    expired: AtomicU64,
}

/// The client's view of a charge: after it if it was charged, else as things stand.
fn verdict(e: &limiter::Evaluation, charged: bool) -> Verdict {
    Verdict {
        allowed: e.allowed,
        outlook: if charged {
            e.after_charge
        } else {
            e.without_charge
        },
        charged,
        delay: if charged { e.delay } else { 0 },
    }
}

impl MemoryStore {
    /// A store that holds at most about `max_keys` keys (rounded up to a multiple of the shard count).
    pub fn new(max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    fn shard_of(key: StoreKey) -> usize {
        ((key.0 >> 64) as usize) % SHARDS
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave an entry half-written (entries are Copy and
        // written whole), so a poisoned shard is still consistent.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The decision logic, synchronous: what `Store::apply` does for the memory store.
    pub fn apply_now(&self, charges: &[Charge], now: Nanos) -> Vec<Verdict> {
        if let [charge] = charges {
            return vec![self.apply_one(charge, now)];
        }
        let mut shard_ids: SmallVec<[usize; 4]> =
            charges.iter().map(|c| Self::shard_of(c.key)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Guards<'_> = shard_ids.iter().map(|&s| (s, self.lock(s))).collect();
        let shard = |guards: &mut Guards<'_>, key: StoreKey| -> usize {
            let id = Self::shard_of(key);
            guards.iter().position(|(s, _)| *s == id).unwrap_or(0)
        };

        // Phase 1: evaluate each charge as if the earlier ones of this request were charged.
        let mut pending: SmallVec<[(StoreKey, State, Nanos); 4]> = SmallVec::new();
        let mut evaluations: SmallVec<[limiter::Evaluation; 4]> = SmallVec::new();
        for charge in charges {
            let current = pending
                .iter()
                .rev()
                .find(|(k, _, _)| *k == charge.key)
                .map(|(_, s, _)| *s)
                .or_else(|| {
                    let g = shard(&mut guards, charge.key);
                    guards[g].1.get(&map_key(charge.key)).map(|e| e.state)
                });
            let evaluation = limiter::evaluate(&charge.params, current, now, charge.hits);
            if evaluation.allowed {
                let expires_at = limiter::expires_at(&charge.params, &evaluation.charged);
                pending.push((charge.key, evaluation.charged, expires_at));
            }
            evaluations.push(evaluation);
        }
        let commit = charges
            .iter()
            .zip(&evaluations)
            .all(|(c, e)| e.allowed || !c.enforced);

        // Phase 2: charge everything, or nothing.
        if commit {
            for (key, state, expires_at) in pending {
                let g = shard(&mut guards, key);
                self.write(&mut guards[g].1, key, state, expires_at, now);
            }
        }
        evaluations
            .iter()
            .map(|e| verdict(e, commit && e.allowed))
            .collect()
    }

    /// The common case, one charge: one shard, no bookkeeping. It is charged iff it fits.
    fn apply_one(&self, charge: &Charge, now: Nanos) -> Verdict {
        let mut shard = self.lock(Self::shard_of(charge.key));
        let current = shard.get(&map_key(charge.key)).map(|e| e.state);
        let evaluation = limiter::evaluate(&charge.params, current, now, charge.hits);
        if evaluation.allowed {
            let expires_at = limiter::expires_at(&charge.params, &evaluation.charged);
            self.write(&mut shard, charge.key, evaluation.charged, expires_at, now);
        }
        verdict(&evaluation, evaluation.allowed)
    }

    /// What `Store::refund` does for the memory store: each key's state is given back its charge
    /// under the key's shard lock (a key that has since expired or been evicted is left alone).
    pub fn refund_now(&self, charges: &[Charge], now: Nanos) {
        for charge in charges {
            let mut shard = self.lock(Self::shard_of(charge.key));
            let Some(entry) = shard.get(&map_key(charge.key)) else {
                continue;
            };
            let state = limiter::refund(&charge.params, &entry.state, now, charge.hits);
            if state != entry.state {
                let expires_at = limiter::expires_at(&charge.params, &state);
                self.write(&mut shard, charge.key, state, expires_at, now);
            }
        }
    }

    fn write(&self, shard: &mut Shard, key: StoreKey, state: State, expires_at: Nanos, now: Nanos) {
        if expires_at <= now {
            shard.remove(&map_key(key));
            return;
        }
        if let Some(entry) = shard.get_mut(&map_key(key)) {
            *entry = Entry { state, expires_at };
            return;
        }
        if shard.len() >= self.max_keys_per_shard && !shard.contains_key(&map_key(key)) {
            self.make_room(shard, now);
        }
        shard.insert(map_key(key), Entry { state, expires_at });
    }

    /// Drops expired keys of a full shard; if none, evicts the soonest-expiring of a sample.
    fn make_room(&self, shard: &mut Shard, now: Nanos) {
        let before = shard.len();
        shard.retain(|_, e| e.expires_at > now);
        let dropped = before - shard.len();
        if dropped > 0 {
            self.expired.fetch_add(dropped as u64, Ordering::Relaxed);
            return;
        }
        let victim = shard
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, e)| e.expires_at)
            .map(|(k, _)| *k);
        if let Some(victim) = victim {
            shard.remove(&victim);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops every key whose state has expired (equals "no state"). Returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut dropped = 0;
        for id in 0..SHARDS {
            let mut shard = self.lock(id);
            let before = shard.len();
            shard.retain(|_, e| e.expires_at > now);
            dropped += before - shard.len();
            // Give memory back once a shard is mostly empty (the map never shrinks by itself).
            if shard.capacity() > 1024 && shard.len() * 4 < shard.capacity() {
                let len = shard.len();
                shard.shrink_to(len * 2);
            }
        }
        self.expired.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// The stored state of a key, for `explain`.
    pub fn peek(&self, key: StoreKey) -> Option<State> {
        self.lock(Self::shard_of(key))
            .get(&map_key(key))
            .map(|e| e.state)
    }

    pub fn stats(&self) -> MemoryStoreStats {
        MemoryStoreStats {
            keys: (0..SHARDS).map(|id| self.lock(id).len()).sum(),
            evictions: self.evictions.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}

impl Store for MemoryStore {
    async fn apply(&self, charges: &[Charge], now: Nanos) -> Result<Vec<Verdict>, StoreError> {
        Ok(self.apply_now(charges, now))
    }

    fn refund(&self, charges: &[Charge], now: Nanos) {
        self.refund_now(charges, now)
    }
}

#[cfg(test)]
mod tests;
