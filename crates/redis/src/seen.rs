//! The last value this instance read from or wrote to each recently used key: what the next
//! decision on it expects, so its compare-and-set goes out without a read first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::TextKey;

/// Keys whose last seen value an instance remembers (per shard; `SEEN_SHARDS` shards).
pub const SEEN_PER_SHARD: usize = 1024;
/// Shards of the seen-value cache (each its own lock).
const SEEN_SHARDS: usize = 64;

/// The last value this instance read from or wrote to each recently used key: what the next
/// decision on it expects, so it can send its compare-and-set straight away instead of reading
/// first. Only a guess: the script checks every expected value, and a wrong guess costs a retry on
/// the values the script sends back, never a different verdict. Bounded: a full shard forgets an
/// arbitrary key (its next decision expects "absent").
/// Replies are handled in no set order (several connections, several threads): each value is
/// remembered with the stamp of the call that saw it, taken when the call was sent, and an older
/// call's reply does not replace what a newer one saw.
pub(super) struct Seen {
    shards: Box<[std::sync::Mutex<SeenShard>]>,
    stamps: AtomicU64,
}

/// Per key: the value (`None`: absent) and the stamp of the call that saw it.
type SeenShard = HashMap<TextKey, (Option<Vec<u8>>, u64)>;

impl Seen {
    pub(super) fn new() -> Seen {
        Seen {
            shards: (0..SEEN_SHARDS)
                .map(|_| std::sync::Mutex::new(HashMap::new()))
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
        self.shard(key).get(key).and_then(|(v, _)| v.clone())
    }

    /// Remembers `value` (`None`: the key is absent) for `key`, as seen by the call stamped
    /// `stamp`, unless a newer call's value is held.
    pub(super) fn put(&self, key: &TextKey, value: Option<&[u8]>, stamp: u64) {
        let mut shard = self.shard(key);
        if let Some((held, held_stamp)) = shard.get_mut(key) {
            if *held_stamp <= stamp {
                *held = value.map(<[u8]>::to_vec);
                *held_stamp = stamp;
            }
            return;
        }
        if shard.len() >= SEEN_PER_SHARD
            && let Some(victim) = shard.keys().next().cloned()
        {
            shard.remove(&victim);
        }
        shard.insert(key.clone(), (value.map(<[u8]>::to_vec), stamp));
    }
}
