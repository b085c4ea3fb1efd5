//! The Redis store: counters shared by every instance, surviving restarts.
//!
//! One source of truth for the arithmetic: a request runs the same Rust decision as the memory
//! store (`store::decide`, i.e. `limiter`) on the states this instance last saw in its keys (a
//! small bounded per-instance cache; a key not seen is expected absent), and sends one Lua
//! compare-and-set straight away: every key of the request must hold the expected value, else
//! nothing is written and the script returns the keys' current values, on which the request is
//! decided again (at most [`MAX_ATTEMPTS`] times), with no separate read. A decision that writes
//! nothing (denied, check-only) is verified by the same script with nothing to write, so no
//! verdict rests on a stale cache. On success each changed key is `SET … PXAT` the instant its
//! state equals no state (plus [`EXPIRY_GRACE_MS`]). A decision whose keys this instance saw last
//! costs one round trip; a wrong guess (another instance wrote, a key never seen that exists)
//! one more. All of a request's keys share the `{domain}` hash tag, so on a cluster they are in
//! one slot and the script is one atomic step on one master. Refunds read with `MGET` first.
//!
//! Time: the instance's clock (`now` is passed in, as for the memory store); see docs/redis.md for
//! the skew tolerance. Values are `a` or `a:b`, the two words of `limiter::State` in decimal.

mod conn;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::Script;
use smallvec::SmallVec;

pub use conn::{RedisConfig, RedisTls, Topology};

use super::{Charge, Store, StoreError, StoreMetrics, TextKey, TextKeyBuilder, Verdicts, decide};
use crate::clock::Nanos;
use crate::limiter::{self, LimitParams, State};

/// Decisions tried before giving up under contention (each retry means another instance wrote
/// one of the request's keys between our read and our write).
pub const MAX_ATTEMPTS: usize = 16;
/// Kept past the instant a state equals no state, so an instance whose clock is up to this much
/// behind Redis's (or another instance's) still reads it.
pub const EXPIRY_GRACE_MS: u64 = 1000;

/// KEYS = the request's keys; ARGV = per key (expected value, '' = absent; new value, '' = leave,
/// '-' = delete; PXAT in ms). Writes only if every key holds what the caller expected, and returns
/// 1; else writes nothing and returns the keys' current values (nil for an absent key), so the
/// caller can decide again without reading them. With no new values it only verifies.
const CAS: &str = r"
local cur = {}
local same = true
for i = 1, #KEYS do
  cur[i] = redis.call('GET', KEYS[i])
  local want = ARGV[3*i-2]
  if want == '' then
    if cur[i] then same = false end
  elseif cur[i] ~= want then
    same = false
  end
end
if not same then return cur end
for i = 1, #KEYS do
  local new = ARGV[3*i-1]
  if new == '-' then
    redis.call('DEL', KEYS[i])
  elseif new ~= '' then
    redis.call('SET', KEYS[i], new, 'PXAT', ARGV[3*i])
  end
end
return 1
";

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
struct Seen {
    shards: Box<[std::sync::Mutex<SeenShard>]>,
    stamps: AtomicU64,
}

/// Per key: the value (`None`: absent) and the stamp of the call that saw it.
type SeenShard = HashMap<TextKey, (Option<Vec<u8>>, u64)>;

impl Seen {
    fn new() -> Seen {
        Seen {
            shards: (0..SEEN_SHARDS)
                .map(|_| std::sync::Mutex::new(HashMap::new()))
                .collect(),
            stamps: AtomicU64::new(0),
        }
    }

    /// A stamp for a call about to be sent (later calls, higher stamps).
    fn stamp(&self) -> u64 {
        self.stamps.fetch_add(1, Ordering::Relaxed)
    }

    fn shard(&self, key: &TextKey) -> std::sync::MutexGuard<'_, SeenShard> {
        self.shards[(key.digest() % SEEN_SHARDS as u128) as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, key: &TextKey) -> Option<Vec<u8>> {
        self.shard(key).get(key).and_then(|(v, _)| v.clone())
    }

    /// Remembers `value` (`None`: the key is absent) for `key`, as seen by the call stamped
    /// `stamp`, unless a newer call's value is held.
    fn put(&self, key: &TextKey, value: Option<&[u8]>, stamp: u64) {
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

/// A state as stored.
pub fn encode(state: &State) -> String {
    if state.b == 0 {
        state.a.to_string()
    } else {
        format!("{}:{}", state.a, state.b)
    }
}

/// A stored value as a state (anything unreadable counts as no state).
pub fn decode(value: &[u8]) -> Option<State> {
    let text = std::str::from_utf8(value).ok()?;
    let (a, b) = text.split_once(':').unwrap_or((text, "0"));
    Some(State {
        a: a.parse().ok()?,
        b: b.parse().ok()?,
    })
}

struct Inner {
    conns: Arc<conn::Conns>,
    keys: TextKeyBuilder,
    timeout: Duration,
    cas: Script,
    seen: Seen,
    conflicts: AtomicU64,
    /// Writers of one instance queue per key stripe after a conflict, so a hot key's retries race
    /// only with other instances, not with this instance's own requests.
    stripes: Box<[tokio::sync::Mutex<()>]>,
    metrics: StoreMetrics,
}

/// Retries decided straight away on the values the failed script returned; later ones wait
/// ([`backoff`]) and read the keys again first.
const FRESH_RETRIES: usize = 4;

/// Key stripes per instance.
const STRIPES: usize = 256;

/// A handle to the Redis store (cheap to clone).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

/// What one read of a request's keys found.
struct Read {
    keys: SmallVec<[TextKey; 4]>,
    /// The raw values, `None` for an absent key.
    raw: SmallVec<[Option<Vec<u8>>; 4]>,
}

impl Read {
    fn state(&self, key: &TextKey) -> Option<State> {
        let i = self.keys.iter().position(|k| k == key)?;
        self.raw[i].as_deref().and_then(decode)
    }
}

/// Waits before retry `attempt`: a yield for the first few (the other writer has just
/// written), then a jittered sleep of up to 2 ms.
async fn backoff(attempt: usize) {
    if attempt < 4 {
        tokio::task::yield_now().await;
        return;
    }
    // Randomly keyed hashes make the jitter (RandomState gives every call new keys): instances that
    // collide at the same instant do not retry in step, as a clock-derived jitter would have them.
    use std::hash::BuildHasher;
    let jitter = std::collections::hash_map::RandomState::new().hash_one(attempt);
    tokio::time::sleep(Duration::from_micros(jitter % 2000)).await;
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// A connection error as a store error: `Unreachable` when nobody answered (refused, timed out),
/// else `Unavailable` (Redis or TLS answered, with an error: wrong password, bad certificate).
fn classify(e: &::redis::RedisError) -> StoreError {
    if e.is_connection_refusal() || e.is_timeout() {
        StoreError::Unreachable(e.to_string())
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

/// The `ratelimit_redis_errors` kind of a failed call.
fn error_kind(e: &::redis::RedisError) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        "connection"
    } else {
        "script"
    }
}

impl RedisStore {
    /// Connects as `config` says (failing if Redis does not answer within its timeout).
    pub async fn connect(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        Self::connect_observed(config, StoreMetrics::unregistered()).await
    }

    /// [`RedisStore::connect`], counting calls, errors and latency in `metrics`. Fails with
    /// `Unreachable` when nobody answered (refused, no answer within the timeout), with
    /// `Unavailable` when Redis or its TLS refused us (password, certificate).
    pub async fn connect_observed(
        config: &RedisConfig,
        metrics: StoreMetrics,
    ) -> Result<RedisStore, StoreError> {
        // rustls needs a process-wide crypto provider; ours is ring. (Err: one is installed.)
        let _ = rustls::crypto::ring::default_provider().install_default();
        let conns = tokio::time::timeout(config.timeout, conn::Conns::connect(config))
            .await
            .map_err(|_| {
                StoreError::Unreachable(format!(
                    "no answer from Redis within {:?} (REDIS_TIMEOUT)",
                    config.timeout
                ))
            })?
            .map_err(|e| classify(&e))?;
        let conns = Arc::new(conns);
        if conns.is_sentinel() {
            let weak = Arc::downgrade(&conns);
            tokio::spawn(conn::Conns::watch(move || weak.upgrade()));
        }
        let store = RedisStore {
            inner: Arc::new(Inner {
                conns,
                keys: TextKeyBuilder::new(config.prefix.clone()),
                timeout: config.timeout,
                cas: Script::new(CAS),
                seen: Seen::new(),
                conflicts: AtomicU64::new(0),
                stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
                metrics,
            }),
        };
        store.ping().await?;
        Ok(store)
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut c = self.inner.conns.get();
        self.bounded(::redis::cmd("PING").query_async::<String>(&mut c))
            .await
            .map(drop)
    }

    /// Compare-and-set conflicts seen so far (each one cost a retry).
    pub fn conflicts(&self) -> u64 {
        self.inner.conflicts.load(Ordering::Relaxed)
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let m = &self.inner.metrics;
        m.redis_calls.inc();
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(self.inner.timeout, call).await;
        m.redis_latency.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                m.error(error_kind(&e));
                self.inner.conns.failed(Some(&e)).await;
                Err(unavailable(e))
            }
            Err(_) => {
                m.error("timeout");
                self.inner.conns.failed(None).await;
                Err(StoreError::Unavailable(format!(
                    "Redis call timed out after {:?}",
                    self.inner.timeout
                )))
            }
        }
    }

    /// The distinct keys of `charges`.
    fn distinct(charges: &[Charge<TextKey>]) -> SmallVec<[TextKey; 4]> {
        let mut keys: SmallVec<[TextKey; 4]> = SmallVec::new();
        for c in charges {
            if !keys.contains(&c.key) {
                keys.push(c.key.clone());
            }
        }
        keys
    }

    /// Reads the distinct keys of `charges` in one `MGET`.
    async fn read(&self, charges: &[Charge<TextKey>]) -> Result<Read, StoreError> {
        let keys = Self::distinct(charges);
        let mut cmd = ::redis::cmd("MGET");
        for k in &keys {
            cmd.arg(k.as_str());
        }
        let mut c = self.inner.conns.get();
        let raw: Vec<Option<Vec<u8>>> = self.bounded(cmd.query_async(&mut c)).await?;
        Ok(Read {
            keys,
            raw: raw.into_iter().collect(),
        })
    }

    /// What this instance last saw in the keys of `charges` (no round trip): a key it has not
    /// seen is expected absent, and so is one whose last seen state Redis has dropped by `now`
    /// by our clock (its PXAT passed). Only for first attempts: retries decide on what Redis
    /// returned (with clocks apart, Redis may still hold such a key).
    fn expected(&self, charges: &[Charge<TextKey>], now: Nanos) -> Read {
        let keys = Self::distinct(charges);
        let now_ms = now / 1_000_000;
        let raw = keys
            .iter()
            .map(|k| {
                self.inner.seen.get(k).filter(|v| {
                    decode(v).is_none_or(|s| {
                        s.expires_at().div_ceil(1_000_000) + EXPIRY_GRACE_MS > now_ms
                    })
                })
            })
            .collect();
        Read { keys, raw }
    }

    /// Writes `new` (one entry per read key, `None` = unchanged) if every read key still holds
    /// what `read` says (with nothing new: only checks). Returns `None` if it did, else what the
    /// keys hold now; either way the seen-value cache is left holding that.
    async fn compare_and_set(
        &self,
        read: &Read,
        new: &[Option<State>],
        now: Nanos,
    ) -> Result<Option<SmallVec<[Option<Vec<u8>>; 4]>>, StoreError> {
        let mut invocation = self.inner.cas.prepare_invoke();
        let mut values: SmallVec<[Option<String>; 4]> = SmallVec::new();
        for ((key, raw), new) in read.keys.iter().zip(&read.raw).zip(new) {
            invocation.key(key.as_str());
            invocation.arg(raw.as_deref().unwrap_or(b""));
            match new {
                None => {
                    values.push(None);
                    invocation.arg("").arg(0)
                }
                Some(s) if s.expires_at() <= now => {
                    values.push(Some(String::new()));
                    invocation.arg("-").arg(0)
                }
                Some(s) => {
                    let text = encode(s);
                    invocation
                        .arg(&text)
                        .arg(s.expires_at().div_ceil(1_000_000) + EXPIRY_GRACE_MS);
                    values.push(Some(text));
                    &mut invocation
                }
            };
        }
        let stamp = self.inner.seen.stamp();
        let mut c = self.inner.conns.get();
        let reply: ::redis::Value = self.bounded(invocation.invoke_async(&mut c)).await?;
        let seen = &self.inner.seen;
        match reply {
            ::redis::Value::Int(1) => {
                for ((key, raw), value) in read.keys.iter().zip(&read.raw).zip(&values) {
                    match value {
                        None => seen.put(key, raw.as_deref(), stamp),
                        Some(v) if v.is_empty() => seen.put(key, None, stamp),
                        Some(v) => seen.put(key, Some(v.as_bytes()), stamp),
                    }
                }
                Ok(None)
            }
            ::redis::Value::Array(current) if current.len() == read.keys.len() => {
                let current: SmallVec<[Option<Vec<u8>>; 4]> = current
                    .into_iter()
                    .map(|value| match value {
                        ::redis::Value::BulkString(v) => Some(v),
                        _ => None,
                    })
                    .collect();
                for (key, value) in read.keys.iter().zip(&current) {
                    seen.put(key, value.as_deref(), stamp);
                }
                Ok(Some(current))
            }
            other => {
                self.inner.metrics.error("script");
                Err(StoreError::Unavailable(format!(
                    "unexpected compare-and-set reply: {other:?}"
                )))
            }
        }
    }

    /// One decide-and-write on what `read` expects the keys to hold, checked and written (or only
    /// checked, when nothing is to be written) by one script call. `Err` if a key held something
    /// else: what the keys held then.
    async fn attempt(
        &self,
        charges: &[Charge<TextKey>],
        now: Nanos,
        read: Read,
    ) -> Result<Result<Verdicts, Read>, StoreError> {
        let decision = decide(charges, now, |k| read.state(k));
        // The last state written per key; None where nothing changes.
        let mut new: SmallVec<[Option<State>; 4]> = SmallVec::from_elem(None, read.keys.len());
        for (index, state) in &decision.writes {
            let i = read
                .keys
                .iter()
                .position(|k| *k == charges[*index].key)
                .unwrap_or(0);
            new[i] = Some(*state);
        }
        for (slot, key) in new.iter_mut().zip(&read.keys) {
            if slot.is_some() && *slot == read.state(key) {
                *slot = None;
            }
        }
        let Some(current) = self.compare_and_set(&read, &new, now).await? else {
            return Ok(Ok(decision.verdicts));
        };
        self.inner.conflicts.fetch_add(1, Ordering::Relaxed);
        Ok(Err(Read {
            keys: read.keys,
            raw: current,
        }))
    }

    /// Locks the stripes of `charges`' keys, in stripe order (so two requests never deadlock).
    async fn lock_stripes(
        &self,
        charges: &[Charge<TextKey>],
    ) -> SmallVec<[tokio::sync::MutexGuard<'_, ()>; 4]> {
        let mut ids: SmallVec<[usize; 4]> = charges
            .iter()
            .map(|c| (c.key.digest() % STRIPES as u128) as usize)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut guards = SmallVec::new();
        for id in ids {
            guards.push(self.inner.stripes[id].lock().await);
        }
        guards
    }

    /// `Store::apply`, on text keys: optimistic first; after a conflict, queued behind this
    /// instance's other writers of the same keys, retrying up to [`MAX_ATTEMPTS`] in all.
    pub async fn apply_text(
        &self,
        charges: &[Charge<TextKey>],
        now: Nanos,
    ) -> Result<Verdicts, StoreError> {
        let mut read = match self
            .attempt(charges, now, self.expected(charges, now))
            .await?
        {
            Ok(verdicts) => return Ok(verdicts),
            Err(current) => current,
        };
        let _queued = self.lock_stripes(charges).await;
        for attempt in 1..MAX_ATTEMPTS {
            if attempt >= FRESH_RETRIES {
                // Under this much contention the values the script returned are old by now.
                backoff(attempt).await;
                read = self.read(charges).await?;
            }
            read = match self.attempt(charges, now, read).await? {
                Ok(verdicts) => return Ok(verdicts),
                Err(current) => current,
            };
        }
        self.inner.metrics.error("conflict_exhausted");
        Err(StoreError::Contention(MAX_ATTEMPTS))
    }

    /// Gives the leaky-bucket turns of `charges` back, by the same compare-and-set.
    pub async fn refund_text(
        &self,
        charges: &[Charge<TextKey>],
        now: Nanos,
    ) -> Result<(), StoreError> {
        for _ in 0..MAX_ATTEMPTS {
            let read = self.read(charges).await?;
            let mut new: SmallVec<[Option<State>; 4]> = SmallVec::from_elem(None, read.keys.len());
            for charge in charges {
                let i = read.keys.iter().position(|k| *k == charge.key).unwrap_or(0);
                let Some(state) = new[i].or_else(|| read.state(&charge.key)) else {
                    continue;
                };
                new[i] = Some(limiter::refund(&charge.params, &state, now, charge.hits));
            }
            for (slot, key) in new.iter_mut().zip(&read.keys) {
                if *slot == read.state(key) {
                    *slot = None;
                }
            }
            if new.iter().all(Option::is_none)
                || self.compare_and_set(&read, &new, now).await?.is_none()
            {
                return Ok(());
            }
            self.inner.conflicts.fetch_add(1, Ordering::Relaxed);
            backoff(1).await;
        }
        Err(StoreError::Contention(MAX_ATTEMPTS))
    }

    /// A key's raw value (for tests and `/explain`).
    pub async fn get_raw(&self, key: &TextKey) -> Result<Option<Vec<u8>>, StoreError> {
        let mut c = self.inner.conns.get();
        self.bounded(::redis::cmd("GET").arg(key.as_str()).query_async(&mut c))
            .await
    }

    /// Runs any command (for tests and tools).
    pub async fn command<T: ::redis::FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut c = self.inner.conns.get();
        self.bounded(cmd.query_async(&mut c)).await
    }
}

impl Store for RedisStore {
    type Key = TextKey;

    fn key<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> TextKey {
        self.inner.keys.key(domain, entries, slot, params)
    }

    async fn apply(&self, charges: &[Charge<TextKey>], now: Nanos) -> Result<Verdicts, StoreError> {
        self.apply_text(charges, now).await
    }

    fn refund(&self, charges: &[Charge<TextKey>], now: Nanos) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("leaky-bucket refund dropped: no async runtime");
            return;
        };
        let store = self.clone();
        let charges = charges.to_vec();
        runtime.spawn(async move {
            if let Err(e) = store.refund_text(&charges, now).await {
                tracing::warn!(error = %e, "leaky-bucket refund to Redis failed");
            }
        });
    }

    async fn peek(&self, key: &TextKey) -> Result<Option<State>, StoreError> {
        Ok(self.get_raw(key).await?.as_deref().and_then(decode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_text() {
        for s in [
            State { a: 0, b: 0 },
            State {
                a: 1_767_225_600_000_000_000,
                b: 0,
            },
            State {
                a: u64::MAX,
                b: u64::MAX,
            },
            State { a: 5, b: 7 },
        ] {
            assert_eq!(decode(encode(&s).as_bytes()), Some(s));
        }
        assert_eq!(encode(&State { a: 12, b: 3 }), "12:3");
        assert_eq!(decode(b"junk"), None);
        assert_eq!(decode(b"1:x"), None);
    }
}
