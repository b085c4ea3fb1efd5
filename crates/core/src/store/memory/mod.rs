//! The in-memory backend: keys spread over mutex-guarded shards of a hash table. A transaction locks
//! the shards of all its keys (in shard order, so requests never deadlock), runs on their states
//! and writes what changed, and unlocks: exact under any concurrency. We shard by hand rather than use dashmap
//! because dashmap cannot hold several shards at once, which all-or-nothing charging needs.
//! Idle keys (whose state has expired) are dropped by `sweep`; `max_keys` bounds memory by
//! evicting the soonest-expiring of a few sampled keys when a shard is full.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use smallvec::SmallVec;

mod key;
mod leases;

pub use key::{KeyBuilder, StoreKey};

use super::transaction::{TransactionKind, decide_one};
use super::{
    Backend, Charge, CounterId, LeaseCall, StoreError, StoreStats, Transaction, Verdict, Verdicts,
};
use crate::clock::Nanos;
use crate::lease::LeaseAnswer;
use crate::limiter::State;
use leases::LeaseTable;

/// What the memory store needs of a key: its 128-bit identity.
pub trait MemoryKey {
    fn id(&self) -> StoreKey;
}

impl MemoryKey for StoreKey {
    #[inline(always)]
    fn id(&self) -> StoreKey {
        *self
    }
}

const SHARDS: usize = 128;
/// Keys looked at to choose one to evict when a shard is full.
const EVICTION_SAMPLE: usize = 8;

/// One key and its state: 32 bytes, aligned so a slot never straddles two cache lines (a lookup
/// misses the cache at most once). Nothing else is kept: the state says when it expires.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct Slot {
    key: u128,
    state: State,
}

const _: () = assert!(size_of::<Slot>() == 32 && align_of::<Slot>() == 32);

/// Store keys are already uniform keyed hashes: the table hashes by their low 64 bits (the shard is
/// chosen by the high ones).
fn hash_of(key: u128) -> u64 {
    key as u64
}

fn slot_hash(slot: &Slot) -> u64 {
    hash_of(slot.key)
}

type Shard = HashTable<Slot>;

/// Locks held by one request: a request's keys rarely span more than a few shards.
type Guards<'a> = SmallVec<[(usize, MutexGuard<'a, Shard>); 4]>;

pub struct MemoryBackend {
    keys: KeyBuilder,
    shards: Box<[Mutex<Shard>]>,
    max_keys_per_shard: usize,
    evictions: AtomicU64,
    expired: AtomicU64,
    /// Concurrency keys' leases (a table of their own).
    leases: LeaseTable,
}

/// A key's state in a locked shard.
fn get(shard: &Shard, key: StoreKey) -> Option<State> {
    shard
        .find(hash_of(key.0), |s| s.key == key.0)
        .map(|s| s.state)
}

impl MemoryBackend {
    /// A store that holds at most about `max_keys` keys (rounded up to a multiple of the shard count).
    pub fn new(max_keys: usize) -> Self {
        MemoryBackend::with_keys(max_keys, KeyBuilder::random())
    }

    /// A store whose keys are built with `keys` (a fixed secret: for tests and benchmarks).
    pub(crate) fn with_keys(max_keys: usize, keys: KeyBuilder) -> Self {
        MemoryBackend {
            keys,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            leases: LeaseTable::new(max_keys),
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

    /// Runs `tx` on the states of its keys under their shard locks (in shard order) and writes
    /// what it changed: what `Backend::transact` does here, synchronously. Takes any key that
    /// names a memory key (a remote backend's, for its local failure mode).
    pub fn run<K: MemoryKey + PartialEq + Clone>(&self, tx: Transaction<'_, K>) -> Verdicts {
        if let (TransactionKind::Apply, [charge]) = (tx.kind, tx.charges) {
            let mut verdicts = Verdicts::new();
            verdicts.push(self.apply_one(charge, tx.now));
            return verdicts;
        }
        let keys = tx.keys();
        let ids: SmallVec<[StoreKey; 4]> = keys.iter().map(MemoryKey::id).collect();
        let mut shard_ids: SmallVec<[usize; 4]> = ids.iter().map(|k| Self::shard_of(*k)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Guards<'_> = shard_ids.iter().map(|&s| (s, self.lock(s))).collect();
        let shard = |guards: &Guards<'_>, key: StoreKey| -> usize {
            let id = Self::shard_of(key);
            guards.iter().position(|(s, _)| *s == id).unwrap_or(0)
        };
        let before: SmallVec<[Option<State>; 4]> = ids
            .iter()
            .map(|&key| get(&guards[shard(&guards, key)].1, key))
            .collect();
        let mut states = before.clone();
        let verdicts = tx.run(&keys, &mut states);
        for ((key, was), state) in ids.iter().zip(&before).zip(&states) {
            if let Some(state) = state
                && Some(*state) != *was
            {
                let g = shard(&guards, *key);
                self.write(&mut guards[g].1, *key, *state, tx.now);
            }
        }
        verdicts
    }

    /// The common case, one charge: one shard, one probe of its table. It is charged iff it fits.
    fn apply_one<K: MemoryKey>(&self, charge: &Charge<K>, now: Nanos) -> Verdict {
        let key = charge.key.id();
        let mut shard = self.lock(Self::shard_of(key));
        let key = key.0;
        match shard.entry(hash_of(key), |s| s.key == key, slot_hash) {
            Entry::Occupied(mut slot) => {
                let (verdict, write) = decide_one(charge, Some(slot.get().state), now);
                if let Some(state) = write {
                    if state.expires_at() > now {
                        slot.get_mut().state = state;
                    } else {
                        slot.remove();
                    }
                }
                verdict
            }
            Entry::Vacant(_) => {
                let (verdict, write) = decide_one(charge, None, now);
                if let Some(state) = write {
                    self.insert(&mut shard, key, state, now);
                }
                verdict
            }
        }
    }

    /// Stores `state` as the key's (dropping the key if the state has already expired).
    fn write(&self, shard: &mut Shard, key: StoreKey, state: State, now: Nanos) {
        let key = key.0;
        match shard.find_entry(hash_of(key), |s| s.key == key) {
            Ok(mut slot) if state.expires_at() > now => slot.get_mut().state = state,
            Ok(slot) => {
                slot.remove();
            }
            Err(_) => self.insert(shard, key, state, now),
        }
    }

    /// Adds a key that is not in the shard, making room first if the shard is full.
    fn insert(&self, shard: &mut Shard, key: u128, state: State, now: Nanos) {
        if state.expires_at() <= now {
            return;
        }
        if shard.len() >= self.max_keys_per_shard {
            self.make_room(shard, now);
        }
        shard.insert_unique(hash_of(key), Slot { key, state }, slot_hash);
    }

    /// Drops expired keys of a full shard; if none, evicts the soonest-expiring of a sample.
    fn make_room(&self, shard: &mut Shard, now: Nanos) {
        let before = shard.len();
        shard.retain(|s| s.state.expires_at() > now);
        let dropped = before - shard.len();
        if dropped > 0 {
            self.expired.fetch_add(dropped as u64, Ordering::Relaxed);
            return;
        }
        let victim = shard
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|s| s.state.expires_at())
            .map(|s| s.key);
        if let Some(victim) = victim
            && let Ok(slot) = shard.find_entry(hash_of(victim), |s| s.key == victim)
        {
            slot.remove();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one call on a concurrency key's leases: what `Backend::lease` does here,
    /// synchronously. Takes any key that names a memory key (a remote backend's, for its local
    /// failure mode). The request id is kept as its keyed hash (16 bytes whatever its length).
    pub fn lease_now<K: MemoryKey>(&self, call: &LeaseCall<'_, K>) -> LeaseAnswer {
        self.leases.call(
            call.key.id().0,
            self.keys.digest(call.id),
            call.action,
            &call.params,
            call.now,
            call.watch,
        )
    }

    /// Concurrency keys holding leases.
    pub fn lease_keys(&self) -> usize {
        self.leases.keys()
    }

    /// Drops every key whose state has expired (equals "no state"), and every ended concurrency
    /// lease. Returns how many keys it dropped.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.leases.sweep(now);
        let mut dropped = 0;
        for id in 0..SHARDS {
            let mut shard = self.lock(id);
            let before = shard.len();
            shard.retain(|s| s.state.expires_at() > now);
            dropped += before - shard.len();
            // Give memory back once a shard is mostly empty (the table never shrinks by itself).
            if shard.capacity() > 1024 && shard.len() * 4 < shard.capacity() {
                let len = shard.len();
                shard.shrink_to(len * 2, slot_hash);
            }
        }
        self.expired.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Sets a key's state (`None`: drops it), as a failure mode's hand-over seeds it.
    pub fn put(&self, key: StoreKey, state: Option<State>, now: Nanos) {
        let mut shard = self.lock(Self::shard_of(key));
        match state {
            Some(state) => self.write(&mut shard, key, state, now),
            None => {
                if let Ok(slot) = shard.find_entry(hash_of(key.0), |s| s.key == key.0) {
                    slot.remove();
                }
            }
        }
    }

    /// Forgets every key (the local failure mode's store, once the shared store is back).
    pub fn clear(&self) {
        for id in 0..SHARDS {
            self.lock(id).clear();
        }
        self.leases.clear();
    }

    /// The stored state of a key, for `explain`.
    pub fn peek_now(&self, key: StoreKey) -> Option<State> {
        get(&self.lock(Self::shard_of(key)), key)
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            keys: (0..SHARDS).map(|id| self.lock(id).len()).sum(),
            evictions: self.evictions.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}

impl Backend for MemoryBackend {
    type Key = StoreKey;
    const NAME: &'static str = "memory";

    #[inline]
    fn key(&self, id: &CounterId<'_>) -> StoreKey {
        self.keys.key(id)
    }

    async fn transact(&self, tx: Transaction<'_, StoreKey>) -> Result<Verdicts, StoreError> {
        Ok(self.run(tx))
    }

    async fn peek(&self, key: &StoreKey) -> Result<Option<State>, StoreError> {
        Ok(self.peek_now(*key))
    }

    async fn lease(&self, call: LeaseCall<'_, StoreKey>) -> Result<LeaseAnswer, StoreError> {
        Ok(self.lease_now(&call))
    }

    async fn reset(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let mut shard = self.lock(Self::shard_of(*key));
        Ok(match shard.find_entry(hash_of(key.0), |s| s.key == key.0) {
            Ok(slot) => {
                slot.remove();
                true
            }
            Err(_) => false,
        })
    }

    fn stats(&self) -> StoreStats {
        MemoryBackend::stats(self)
    }

    fn sweep(&self, now: Nanos) -> usize {
        MemoryBackend::sweep(self, now)
    }
}

#[cfg(test)]
mod tests;
