//! This instance as a writer of counters: its writer id, its compare-and-set calls (`cas`), and
//! what they leave in the seen-value cache (`seen`), which is what the next call on a key expects
//! it to hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;
use ratelimit_core::store::StoreError;

use crate::calls::Calls;
use crate::cas::{self, Raw, decode};
use crate::key::TextKey;
use crate::seen::Seen;

/// The compare-and-set calls of one store.
pub(crate) struct Writer {
    calls: Arc<Calls>,
    seen: Seen,
    /// This store's writer id in the tags of the values it writes (random), and its calls' count.
    id: u64,
    seq: AtomicU64,
    conflicts: AtomicU64,
}

impl Writer {
    pub(crate) fn new(calls: Arc<Calls>) -> Writer {
        Writer {
            calls,
            seen: Seen::new(),
            id: writer_id(),
            seq: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
        }
    }

    /// The calls it makes (for the store's other commands).
    pub(crate) fn calls(&self) -> &Arc<Calls> {
        &self.calls
    }

    /// Compare-and-set conflicts seen so far (each one cost a retry).
    #[cfg(feature = "testing")]
    pub(crate) fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// The state this instance last saw in `key` (no call), unless Redis has dropped it by `now`.
    pub(crate) fn last_seen(&self, key: &TextKey, now: Nanos) -> Option<State> {
        let now_ms = now / 1_000_000;
        self.seen
            .get(key)
            .and_then(|v| decode(&v))
            .filter(|s| cas::pxat(s) > now_ms)
    }

    /// What this instance last saw in `keys` (no round trip): a key it has not seen is expected
    /// absent, and so is one whose last seen state Redis has dropped by `now` by our clock (its
    /// PXAT passed). Only for first attempts: retries decide on what Redis returned (with clocks
    /// apart, Redis may still hold such a key).
    pub(crate) fn expected(&self, keys: &[TextKey], now: Nanos) -> Raw {
        let now_ms = now / 1_000_000;
        keys.iter()
            .map(|k| {
                self.seen
                    .get(k)
                    .filter(|v| decode(v).is_none_or(|s| cas::pxat(&s) > now_ms))
            })
            .collect()
    }

    /// Writes `new` (per key, `None` = unchanged) if every key still holds `expected` (with
    /// nothing new: only checks). Returns `Ok` with what the keys hold if it did, else `Err` with
    /// what they hold now; either way the seen-value cache is left holding that.
    pub(crate) async fn compare_and_set(
        &self,
        keys: &[TextKey],
        expected: &[Option<Vec<u8>>],
        new: &[Option<State>],
        now: Nanos,
    ) -> Result<Result<Raw, Raw>, StoreError> {
        let call = cas::Call {
            keys,
            expected,
            new,
            now,
            tag: cas::Tag {
                writer: self.id,
                seq: self.seq.fetch_add(1, Ordering::Relaxed),
            },
        };
        let (group, written) = call.group().map_err(StoreError::Unavailable)?;
        let stamp = self.seen.stamp();
        let reply = self.calls.script(group).await?;
        let current = cas::reply(reply, keys.len()).map_err(|e| {
            self.calls.metrics().error("script");
            StoreError::Unavailable(e)
        })?;
        let held = current.as_ref().unwrap_or(&written);
        for (key, value) in keys.iter().zip(held) {
            self.seen.put(key, value.as_deref(), stamp);
        }
        match current {
            Some(current) => {
                self.conflicts.fetch_add(1, Ordering::Relaxed);
                self.calls.metrics().conflicts.inc();
                Ok(Err(current))
            }
            None => Ok(Ok(written)),
        }
    }
}

/// A random id for a store's writes (a randomly keyed hash: every `RandomState` has new keys, so
/// two stores in one process differ too).
fn writer_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}
