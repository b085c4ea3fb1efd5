//! The local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`, 0 = off): a fixed-window key that
//! the remote backend denied stays denied until its window ends, so requests on it are answered OVER_LIMIT
//! without a call until then. Pure: time comes in as `now`.
//!
//! It never denies what the backend would admit: an entry answers only a charge with the same limit
//! (algorithm, requests per unit, window: so a reload or override that changes the limit misses)
//! asking for at least as many hits as the denied one, before the window's end. Within a fixed
//! window a count never goes down (denied requests charge nothing), so such a charge is denied by
//! the backend too. Only fixed windows are cached: a token bucket, sliding window or leaky bucket can
//! admit again before its reset (they refill continuously, and a leaky bucket is refunded).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::remote::RemoteKey;
use ratelimit_core::clock::Nanos;
use ratelimit_core::config::Algorithm;
use ratelimit_core::limiter::{LimitParams, Outlook};
use ratelimit_core::store::{Charge, Verdict, Verdicts};

#[derive(Debug, Clone, Copy)]
struct Entry {
    params: LimitParams,
    hits: u64,
    until: Nanos,
    remaining: u32,
}

/// Bytes counted per entry besides its key's text.
const ENTRY_OVERHEAD: usize = 96;

pub(crate) struct OverLimitCache<K> {
    entries: Mutex<(HashMap<K, Entry>, usize)>,
    max_bytes: usize,
}

impl<K: RemoteKey> OverLimitCache<K> {
    /// A cache of at most about `max_bytes` (None when 0: off).
    pub(crate) fn new(max_bytes: usize) -> Option<OverLimitCache<K>> {
        (max_bytes > 0).then(|| OverLimitCache {
            entries: Mutex::new((HashMap::new(), 0)),
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<K, Entry>, usize)> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The backend's answer for `charges`, if every charge is known to be over its limit at `now`.
    pub(crate) fn answer(&self, charges: &[Charge<K>], now: Nanos) -> Option<Verdicts> {
        if charges.is_empty() {
            return None;
        }
        let guard = self.lock();
        charges
            .iter()
            .map(|c| {
                let e = guard.0.get(&c.key)?;
                let hit = e.until > now && e.params == c.params && c.hits >= e.hits.max(1);
                hit.then(|| Verdict {
                    allowed: false,
                    outlook: Outlook {
                        remaining: e.remaining,
                        reset_after: e.until - now,
                    },
                    // As the backend answered it: nothing charged since.
                    remaining_before: e.remaining,
                    charged: false,
                    delay: 0,
                    // A cached fixed window: the hits fit again when it ends.
                    retry_after: e.until - now,
                })
            })
            .collect()
    }

    /// Learns from the backend's `verdicts` for `charges` decided at `now`.
    pub(crate) fn learn(&self, charges: &[Charge<K>], verdicts: &Verdicts, now: Nanos) {
        for (c, v) in charges.iter().zip(verdicts) {
            if v.allowed || c.hits == 0 || c.params.algorithm != Algorithm::FixedWindow {
                continue;
            }
            let entry = Entry {
                params: c.params,
                hits: c.hits,
                until: now.saturating_add(v.outlook.reset_after),
                remaining: v.outlook.remaining,
            };
            let size = c.key.bytes() + ENTRY_OVERHEAD;
            let mut guard = self.lock();
            let (map, bytes) = &mut *guard;
            if *bytes + size > self.max_bytes {
                // Full: drop what has expired; if still full, this one is not cached.
                map.retain(|_, e| e.until > now);
                *bytes = map.keys().map(|k| k.bytes() + ENTRY_OVERHEAD).sum();
                if *bytes + size > self.max_bytes {
                    continue;
                }
            }
            if map.insert(c.key.clone(), entry).is_none() {
                *bytes += size;
            }
        }
    }

    /// Forgets everything (the backend came back after an outage: it may have lost counts).
    pub(crate) fn clear(&self) {
        let mut guard = self.lock();
        guard.0.clear();
        guard.1 = 0;
    }

    /// Entries held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::store::memory::{MemoryKey, StoreKey};

    /// A remote backend's key, as the cache sees it.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct TextKey(String);

    impl MemoryKey for TextKey {
        fn id(&self) -> StoreKey {
            StoreKey(self.0.len() as u128)
        }
    }

    impl RemoteKey for TextKey {
        fn bytes(&self) -> usize {
            self.0.len()
        }
    }

    const S: Nanos = 1_000_000_000;

    fn params(limit: u32) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_unit: limit,
            period: 60 * S,
            burst: limit,
            max_delay: 0,
            charge_denied: false,
        }
    }

    fn charge(key: &str, limit: u32, hits: u64) -> Charge<TextKey> {
        Charge::new(TextKey(key.into()), params(limit), hits)
    }

    fn denied(reset_after: Nanos) -> Verdicts {
        [Verdict {
            allowed: false,
            outlook: Outlook {
                remaining: 0,
                reset_after,
            },
            remaining_before: 0,
            charged: false,
            delay: 0,
            retry_after: reset_after,
        }]
        .into_iter()
        .collect()
    }

    #[test]
    fn a_denied_fixed_window_is_answered_until_its_window_ends() {
        let cache = OverLimitCache::new(1 << 20).unwrap();
        let now = 100 * S;
        cache.learn(&[charge("k", 5, 1)], &denied(20 * S), now);
        let v = cache.answer(&[charge("k", 5, 1)], now + S).unwrap();
        assert!(!v[0].allowed);
        assert_eq!(v[0].outlook.reset_after, 19 * S);
        assert!(
            cache.answer(&[charge("k", 5, 1)], now + 20 * S).is_none(),
            "window over"
        );
    }

    #[test]
    fn never_answers_what_the_backend_could_admit() {
        let cache = OverLimitCache::new(1 << 20).unwrap();
        let now = 100 * S;
        cache.learn(&[charge("k", 5, 3)], &denied(20 * S), now);
        assert!(
            cache.answer(&[charge("k", 5, 2)], now).is_none(),
            "fewer hits"
        );
        assert!(
            cache.answer(&[charge("k", 5, 0)], now).is_none(),
            "check only"
        );
        assert!(
            cache.answer(&[charge("k", 6, 3)], now).is_none(),
            "limit raised"
        );
        assert!(cache.answer(&[charge("k", 5, 3)], now).is_some());
        assert!(
            cache
                .answer(&[charge("k", 5, 3), charge("other", 5, 1)], now)
                .is_none(),
            "a charge not known over its limit"
        );
        let mut tb = charge("tb", 5, 1);
        tb.params.algorithm = Algorithm::TokenBucket;
        cache.learn(std::slice::from_ref(&tb), &denied(20 * S), now);
        assert!(cache.answer(&[tb], now).is_none(), "token buckets refill");
    }

    #[test]
    fn bounded_in_bytes() {
        assert!(OverLimitCache::<TextKey>::new(0).is_none());
        let cache = OverLimitCache::new(10 * (ENTRY_OVERHEAD + 8)).unwrap();
        for i in 0..100 {
            cache.learn(&[charge(&format!("key-{i:04}"), 5, 1)], &denied(S), 0);
        }
        assert_eq!(cache.len(), 10);
        // Once they expire, room is made again.
        cache.learn(&[charge("key-late", 5, 1)], &denied(S), 2 * S);
        assert_eq!(cache.len(), 1);
        cache.clear();
        assert_eq!(cache.len(), 0);
    }
}
