//! The last value this instance read from or wrote to each recently used key: what the next
//! decision on it expects, so its compare-and-set goes out without a read first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::key::TextKey;

/// Keys whose last seen value an instance remembers (per shard; `SEEN_SHARDS` shards).
pub(crate) const SEEN_PER_SHARD: usize = 1024;
/// Shards of the seen-value cache (each its own lock).
const SEEN_SHARDS: usize = 64;

/// The last value this instance read from or wrote to each recently used key: what the next
/// decision on it expects, so it can send its compare-and-set straight away instead of reading
/// first, and what the local failure mode starts a key from (the hand-over). Only a guess for
/// decisions: the script checks every expected value, and a wrong guess costs a retry on the
/// values the script sends back, never a different verdict. Bounded, and a hot key stays: each
/// shard keeps two generations, a key used is moved into the young one, and when the young one is
/// full the old one is forgotten (so a key used within the last half shard's worth of other keys
/// is kept, never a hot key dropped for a cold one, which would hand the local mode a fresh limit
/// in an outage).
/// Replies are handled in no set order (several connections, several threads): each value is
/// remembered with the stamp of the call that saw it, taken when the call was sent, and an older
/// call's reply does not replace what a newer one saw.
pub(super) struct Seen {
    shards: Box<[std::sync::Mutex<SeenShard>]>,
    stamps: AtomicU64,
}

/// Per key, by its digest: the value (`None`: absent) and the stamp of the call that saw it.
/// Keyed by the digest alone, not the key's text: an entry holds no pointer to the text, so a
/// lookup reads no second allocation to compare texts and an insert or eviction touches no
/// reference count (at 100k keys each of those was a cache miss). Two texts with one digest would
/// share an entry, which costs only a wrong guess (the compare-and-set checks it, a retry
/// follows); the local failure mode already keys its counters by the same digest.
/// (foldhash's seeded mix of a digest costs a tenth of SipHash.)
type Entries = HashMap<u128, (Option<Vec<u8>>, u64), foldhash::fast::RandomState>;

/// One shard's two generations.
#[derive(Default)]
struct SeenShard {
    young: Entries,
    old: Entries,
}

impl SeenShard {
    /// The entry of the key whose digest is `key`, moved into the young generation.
    fn touch(&mut self, key: u128) -> Option<&mut (Option<Vec<u8>>, u64)> {
        if !self.young.contains_key(&key) {
            let entry = self.old.remove(&key)?;
            self.insert(key, entry);
        }
        self.young.get_mut(&key)
    }

    fn insert(&mut self, key: u128, entry: (Option<Vec<u8>>, u64)) {
        if self.young.len() >= SEEN_PER_SHARD / 2 {
            // The old generation's table, emptied, is the new young one: no table is grown from
            // nothing again (a 100k-key load rotated each shard every few hundred decisions).
            std::mem::swap(&mut self.old, &mut self.young);
            self.young.clear();
        }
        self.young.insert(key, entry);
    }
}

impl Seen {
    pub(super) fn new() -> Seen {
        Seen {
            shards: (0..SEEN_SHARDS)
                .map(|_| std::sync::Mutex::new(SeenShard::default()))
                .collect(),
            stamps: AtomicU64::new(0),
        }
    }

    /// A stamp for a call about to be sent (later calls, higher stamps).
    pub(super) fn stamp(&self) -> u64 {
        self.stamps.fetch_add(1, Ordering::Relaxed)
    }

    fn shard(&self, key: &TextKey) -> std::sync::MutexGuard<'_, SeenShard> {
        self.shards[(key.digest() % SEEN_SHARDS as u128) as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn get(&self, key: &TextKey) -> Option<Vec<u8>> {
        self.shard(key)
            .touch(key.digest())
            .and_then(|(v, _)| v.clone())
    }

    /// Remembers `value` (`None`: the key is absent) for `key`, as seen by the call stamped
    /// `stamp`, unless a newer call's value is held.
    pub(super) fn put(&self, key: &TextKey, value: Option<&[u8]>, stamp: u64) {
        let mut shard = self.shard(key);
        if let Some((held, held_stamp)) = shard.touch(key.digest()) {
            if *held_stamp <= stamp {
                *held = value.map(<[u8]>::to_vec);
                *held_stamp = stamp;
            }
            return;
        }
        shard.insert(key.digest(), (value.map(<[u8]>::to_vec), stamp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_key_outlives_a_stream_of_cold_ones() {
        let keys = crate::key::TextKeyBuilder::new(String::new());
        let params = ratelimit_core::limiter::LimitParams {
            algorithm: ratelimit_core::config::Algorithm::FixedWindow,
            requests_per_unit: 1,
            period: 1_000_000_000,
            burst: 1,
            max_delay: 0,
            charge_denied: false,
        };
        let key = |i: usize| {
            let value = i.to_string();
            let entries = [("k", value.as_str())];
            keys.key(&ratelimit_core::store::CounterId::new(
                "d",
                &entries[..],
                0,
                &params,
            ))
        };
        let seen = Seen::new();
        let hot = key(0);
        seen.put(&hot, Some(b"7"), seen.stamp());
        for i in 1..200_000 {
            seen.put(&key(i), Some(b"1"), seen.stamp());
            if i % 1000 == 0 {
                assert_eq!(seen.get(&hot).as_deref(), Some(&b"7"[..]), "after {i}");
            }
        }
        let held: usize = seen
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap();
                s.young.len() + s.old.len()
            })
            .sum();
        assert!(held <= SEEN_SHARDS * SEEN_PER_SHARD, "{held} held");
    }
}
