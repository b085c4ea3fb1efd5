//! The names of counters whose keys are hashes (the memory store's), so the quota API can list a
//! domain's counters: each counter a decision charges is noted once with its identity (domain,
//! entries as counted, which limit, algorithm, window), found again by a 64-bit hash of it (a
//! backend's key type is the backend's; this one is the same for every backend). Kept only while
//! the quota API is on, bounded (a counter past the cap is not noted, and is missing from
//! lists), and pruned of counters whose state is gone. A store with readable keys (Redis) lists
//! its keys itself.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{CounterId, Entries};
use crate::clock::Nanos;
use crate::config::Algorithm;

/// A counter's identity, owned: what a [`CounterId`] borrows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterName {
    pub domain: String,
    /// (key, value) per entry, as counted (a `share_threshold` pattern in place of the value).
    pub entries: Vec<(String, String)>,
    pub slot: usize,
    pub algorithm: Algorithm,
    pub period: Nanos,
}

impl CounterName {
    /// The counter it names.
    pub fn id(&self) -> CounterId<'_> {
        CounterId {
            domain: &self.domain,
            entries: Entries::from(&self.entries[..]),
            slot: self.slot,
            algorithm: self.algorithm,
            period: self.period,
        }
    }

    fn of(id: &CounterId<'_>) -> CounterName {
        CounterName {
            domain: id.domain.to_owned(),
            entries: id
                .entries
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            slot: id.slot,
            algorithm: id.algorithm,
            period: id.period,
        }
    }
}

const SHARDS: usize = 32;

/// A hasher for keys that are hashes already: passes a `u64` through.
#[derive(Default)]
struct NoHash(u64);

impl Hasher for NoHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BuildNoHash = BuildHasherDefault<NoHash>;

/// Names by the hash of the counter (already a hash: the map does not hash it again).
type Shard = HashMap<u64, Arc<CounterName>, BuildNoHash>;

/// Counter names by a hash of the counter, sharded so that noting a known one takes one short
/// lock.
pub struct CounterNames {
    shards: Box<[Mutex<Shard>]>,
    len: AtomicUsize,
    cap: usize,
}

/// The hash of a counter's identity.
fn hash_of(id: &CounterId<'_>) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6e61_6d65).build_hasher();
    id.domain.hash(&mut h);
    id.entries.for_each(|k, v| {
        k.hash(&mut h);
        v.hash(&mut h);
    });
    (id.slot, id.algorithm.code(), id.period).hash(&mut h);
    h.finish()
}

impl CounterNames {
    /// At most `cap` names.
    pub fn new(cap: usize) -> CounterNames {
        CounterNames {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            len: AtomicUsize::new(0),
            cap,
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.shards[(hash >> 59) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the name of the counter `id` (nothing when it is known, or the cap is reached).
    pub fn note(&self, id: &CounterId<'_>) {
        let hash = hash_of(id);
        let mut shard = self.shard(hash);
        if shard.contains_key(&hash) || self.len.load(Ordering::Relaxed) >= self.cap {
            return;
        }
        shard.insert(hash, Arc::new(CounterName::of(id)));
        self.len.fetch_add(1, Ordering::Relaxed);
    }

    /// The names of `domain`'s counters, in no set order.
    pub fn of_domain(&self, domain: &str) -> Vec<Arc<CounterName>> {
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            found.extend(shard.values().filter(|n| n.domain == domain).cloned());
        }
        found
    }

    /// Every name noted, in no set order.
    pub fn all(&self) -> Vec<Arc<CounterName>> {
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            found.extend(shard.values().cloned());
        }
        found
    }

    /// Forgets a counter (its state is gone).
    pub fn forget(&self, name: &CounterName) {
        let hash = hash_of(&name.id());
        if self.shard(hash).remove(&hash).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitParams;

    #[test]
    fn a_key_is_named_once_and_the_cap_holds() {
        let params = LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_unit: 1,
            period: 60,
            burst: 1,
            max_delay: 0,
            charge_denied: false,
        };
        let names = CounterNames::new(2);
        let a = [("tenant", "a")];
        let b = [("tenant", "b")];
        names.note(&CounterId::new("d", &a, 0, &params));
        names.note(&CounterId::new("d", &a, 0, &params));
        names.note(&CounterId::new("e", &b, 1, &params));
        names.note(&CounterId::new("d", &b, 0, &params));
        assert_eq!(names.len(), 2, "the cap");
        let d = names.of_domain("d");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].entries, [("tenant".to_owned(), "a".to_owned())]);
        assert_eq!(d[0].id(), CounterId::new("d", &a, 0, &params));
        names.forget(&d[0]);
        names.forget(&d[0]);
        assert_eq!(names.len(), 1);
        assert!(names.of_domain("d").is_empty());
    }
}
