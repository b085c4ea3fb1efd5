//! The Redis backend: counters shared by every instance, surviving restarts.
//!
//! One decision in flight per key and instance (`queue`): a request whose keys are idle goes at
//! once; requests arriving while a call holds one of their keys wait, and are decided together in
//! the next call, in arrival order, each all-or-nothing (`batch`). So a hot key costs one call
//! per round trip per instance however many requests are in flight, and instances contend only
//! with each other.
//!
//! One source of truth for the arithmetic: a call runs the same Rust decision as the memory store
//! (`store::decide`, i.e. `limiter`) on the states this instance last saw in its keys (`seen`; a
//! key not seen is expected absent), and sends one Lua compare-and-set (`cas`) straight away:
//! every key must hold the expected value, else nothing is written and the script returns the
//! keys' current values, on which the batch is decided again, with no separate read. A batch that
//! writes nothing (denied, check-only) is verified by the same script, so no verdict rests on a
//! stale guess. On success each changed key is `SET … PXAT` the instant its state equals no state
//! (plus [`EXPIRY_GRACE_MS`]).
//!
//! Keys are hashed whole on a Redis Cluster (no hash tag), so one domain's counters spread over
//! every master. A request whose keys land in one slot is one script call; one whose keys span
//! slots is decided by `spread`: a compare-and-set per slot, and a charge taken back where
//! another slot could not follow.
//!
//! Time: the instance's clock (`now` is passed in, as for the memory store); see docs/redis.md for
//! the skew tolerance. Values are `a` or `a:b`, the two words of `limiter::State` in decimal.
//!
//! Beside the counters, the RLQS demand exchange (`demand`): each instance's demand per bucket in
//! a hash with a TTL, so instances can split a bucket's pool (docs/rlqs.md "Several servers").
#![forbid(unsafe_code)]

// The core's modules, by the names this crate's code uses for them.
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::{clock, config, limiter, store};

mod batch;
mod cas;
mod conn;
mod demand;
mod dispatch;
mod io;
mod key;
mod queue;
mod refusal;
mod seen;
mod slot;
mod spread;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use smallvec::SmallVec;
use std::time::Instant;
use tokio::sync::oneshot;

pub use cas::{EXPIRY_GRACE_MS, decode, encode};
pub use conn::{RedisConfig, RedisTls, Topology};
pub use demand::{KEY_TTL_MS, Snapshot};
pub use key::{MAX_DOMAIN, MAX_KEY, TextKey, TextKeyBuilder};
pub use queue::{MAX_BATCH_KEYS, MAX_BATCH_REQUESTS};
pub use seen::SEEN_PER_SHARD;
pub use slot::slot;

use batch::decide_batch;
use cas::Raw;
use clock::{Nanos, monotonic};
use config::Algorithm;
use limiter::State;
use queue::{Arrival, Batch, Group, Queues, Ticket};
use ratelimit_remote::{Connect, Every, Remote, RemoteKey, RemoteMetrics};
use seen::Seen;
use store::{Backend, Charge, CounterId, StoreError, Transaction, TransactionKind, Verdicts};

/// Compare-and-set attempts of one call before it gives up (each retry means another instance
/// wrote one of its keys in between). With one call in flight per key and instance, a retry
/// races only with the other instances' calls.
pub const MAX_ATTEMPTS: usize = 32;

/// Retries sent straight away on the values the failed script returned; later ones first wait a
/// little ([`backoff`]), so instances that keep colliding fall out of step.
const FRESH_RETRIES: usize = 4;

/// A request waiting for, or in, a call.
struct Pending {
    charges: Vec<Charge<TextKey>>,
    now: Nanos,
    /// Where its verdicts go; `None` for a refund (nobody waits for it).
    reply: Option<oneshot::Sender<Result<Verdicts, StoreError>>>,
    arrived: Instant,
}

impl Pending {
    /// Its caller went away before it was decided.
    fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
    }
}

struct Inner {
    conns: Arc<conn::Conns>,
    /// Pipelines the script calls (`None` on a cluster: each call goes alone, routed by slot).
    dispatcher: Option<Arc<dispatch::Dispatcher>>,
    keys: TextKeyBuilder,
    timeout: Duration,
    seen: Seen,
    /// This store's writer id in the tags of the values it writes (random), and its calls' count.
    writer: u64,
    calls: AtomicU64,
    conflicts: AtomicU64,
    queues: Mutex<Queues<TextKey, Pending>>,
    /// Keys are grouped by cluster slot (one script call per slot).
    cluster: bool,
    /// When a call last got an answer, in ns after `epoch`.
    answered: AtomicU64,
    epoch: Instant,
    metrics: RemoteMetrics,
    /// When the last "Redis is slower than Envoy waits" warning was said.
    slow_warning: Every,
}

/// The default `timeout` of Envoy's ratelimit filter (20 ms): a call slower than this fails
/// behind an Envoy that keeps the default.
pub const ENVOY_FILTER_TIMEOUT: Duration = Duration::from_millis(20);

/// How often a slow Redis is said again while it stays slow.
const SLOW_WARNING_EVERY: Duration = Duration::from_secs(60);

impl Inner {
    /// Counts one call's outcome (`Err(())`: no answer within `REDIS_TIMEOUT`) and turns a
    /// failure into the store's error.
    fn account<T>(
        &self,
        started: Instant,
        result: Result<::redis::RedisResult<T>, ()>,
    ) -> Result<T, StoreError> {
        let m = &self.metrics;
        let took = started.elapsed();
        m.calls.inc();
        m.latency.observe(took.as_secs_f64());
        let error = match result {
            Ok(Ok(value)) => {
                let at = monotonic().saturating_duration_since(self.epoch);
                self.answered
                    .fetch_max(at.as_nanos() as u64, Ordering::Relaxed);
                if took > ENVOY_FILTER_TIMEOUT {
                    self.slow(took, at);
                }
                return Ok(value);
            }
            Ok(Err(e)) => {
                m.error(error_kind(&e));
                let message = unavailable(&e);
                self.failed(Some(e));
                message
            }
            Err(()) => {
                m.error("timeout");
                self.failed(None);
                StoreError::Unavailable(format!("Redis call timed out after {:?}", self.timeout))
            }
        };
        Err(error)
    }

    /// A call answered, but later than Envoy's filter would have waited: counted, and said at
    /// most every [`SLOW_WARNING_EVERY`] (a Redis slow but within `REDIS_TIMEOUT` is otherwise
    /// invisible, while behind Envoy every such call fails by the filter's `failure_mode_deny`).
    fn slow(&self, took: Duration, at: Duration) {
        self.metrics.slow_calls.inc();
        if self.slow_warning.due(at.as_nanos() as u64) {
            tracing::warn!(
                ?took,
                envoy_timeout = ?ENVOY_FILTER_TIMEOUT,
                "Redis calls take longer than Envoy's default ratelimit filter timeout: behind such an Envoy these decisions time out (and fail open unless failure_mode_deny); raise the filter's timeout or move Redis closer (ratelimit_redis_slow_calls counts them)"
            );
        }
    }

    /// Tells the connections a call failed (with Sentinel, the master may have moved), on the
    /// Redis I/O thread.
    fn failed(&self, error: Option<::redis::RedisError>) {
        let conns = self.conns.clone();
        io::handle().spawn(async move { conns.failed(error.as_ref()).await });
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(d) = &self.dispatcher {
            d.close();
        }
    }
}

/// A handle to the Redis store (cheap to clone).
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

/// Waits before retry `attempt`: a yield for the first few (the other writer has just
/// written), then a jittered sleep of up to 2 ms.
async fn backoff(attempt: usize) {
    if attempt < FRESH_RETRIES {
        tokio::task::yield_now().await;
        return;
    }
    // Randomly keyed hashes make the jitter (RandomState gives every call new keys): instances that
    // collide at the same instant do not retry in step, as a clock-derived jitter would have them.
    use std::hash::BuildHasher;
    let jitter = std::collections::hash_map::RandomState::new().hash_one(attempt);
    tokio::time::sleep(Duration::from_micros(jitter % 2000)).await;
}

/// `call`'s output if it comes within `timeout`. A process short of CPU can wake up to find its
/// timer expired and the reply already in the socket, both in the same wake-up, and the timer may
/// be seen first: before calling it a timeout, let the connection's task run (a few yields) and
/// look once more, so a reply that is there counts as the answer it is.
async fn within<T>(timeout: Duration, call: impl Future<Output = T>) -> Result<T, ()> {
    use futures_util::FutureExt;
    let mut call = std::pin::pin!(call);
    if let Ok(output) = tokio::time::timeout(timeout, call.as_mut()).await {
        return Ok(output);
    }
    for _ in 0..3 {
        tokio::task::yield_now().await;
        if let Some(output) = call.as_mut().now_or_never() {
            return Ok(output);
        }
    }
    Err(())
}

/// A random id for a store's writes (a randomly keyed hash: every `RandomState` has new keys, so
/// two stores in one process differ too).
fn writer_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// A call's outcome before it is counted: `Err(())` when no answer came within `REDIS_TIMEOUT`.
type Sent = Result<::redis::RedisResult<::redis::Value>, ()>;

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn io_gone() -> ::redis::RedisError {
    ::redis::RedisError::from((::redis::ErrorKind::Io, "the Redis I/O thread is gone"))
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

/// The distinct keys of some requests' charges, in order of first appearance.
fn distinct<'a>(charges: impl IntoIterator<Item = &'a Charge<TextKey>>) -> SmallVec<[TextKey; 4]> {
    let mut keys: SmallVec<[TextKey; 4]> = SmallVec::new();
    for c in charges {
        if !keys.contains(&c.key) {
            keys.push(c.key.clone());
        }
    }
    keys
}

/// The states of raw values (anything unreadable counts as no state).
fn states(raw: &[Option<Vec<u8>>]) -> SmallVec<[Option<State>; 4]> {
    raw.iter().map(|v| v.as_deref().and_then(decode)).collect()
}

/// Frees a call's keys when dropped (also when its caller goes away mid-call), and starts what
/// waited for them.
struct Release<'a> {
    store: &'a RedisBackend,
    keys: Vec<TextKey>,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.store.release(&self.keys);
    }
}

/// Takes a waiting request out of the queues if its caller goes away before it starts.
struct Leave<'a> {
    store: &'a RedisBackend,
    ticket: Option<Ticket>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let (_, batches) = self.store.queues().cancel(ticket);
            self.store.start(batches);
        }
    }
}

impl RedisBackend {
    /// Connects as `config` says (failing if Redis does not answer within its timeout).
    pub async fn connect(config: &RedisConfig) -> Result<RedisBackend, StoreError> {
        Self::connect_observed(
            config,
            RemoteMetrics::unregistered(<RedisBackend as Backend>::NAME),
        )
        .await
    }

    /// [`RedisBackend::connect`], counting calls, errors and latency in `metrics`. Fails with
    /// `Unreachable` when nobody answered (refused, no answer within the timeout, a reply cut
    /// short: the first PING's too), with `Unavailable` when Redis or its TLS refused us
    /// (password, ACL, certificate; `refusal`).
    pub async fn connect_observed(
        config: &RedisConfig,
        metrics: RemoteMetrics,
    ) -> Result<RedisBackend, StoreError> {
        // rustls needs a process-wide crypto provider; ours is ring. (Err: one is installed.)
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Each connection's set-up is bounded by its round trips (`conn::connect_bound`), not the
        // whole pool by one REDIS_TIMEOUT; the outer bound is a safety net.
        let bound = conn::set_up_bound(config);
        let connecting = {
            let config = config.clone();
            async move { tokio::time::timeout(bound, conn::Conns::connect(&config)).await }
        };
        let conns = io::run(connecting)
            .await
            .ok_or_else(|| StoreError::Unavailable("the Redis I/O thread is gone".into()))?
            .map_err(|_| {
                StoreError::Unreachable(format!(
                    "no connection to Redis within {bound:?} ({} round trips of REDIS_TIMEOUT={:?} per connection)",
                    conn::CONNECT_ROUND_TRIPS,
                    config.timeout
                ))
            })?
            .map_err(|e| refusal::classify(&e))?;
        let conns = Arc::new(conns);
        if conns.is_sentinel() {
            let weak = Arc::downgrade(&conns);
            io::handle().spawn(conn::Conns::watch(move || weak.upgrade()));
        }
        let dispatcher = (!conns.is_cluster())
            .then(|| dispatch::Dispatcher::start(conns.clone(), config.timeout));
        let store = RedisBackend {
            inner: Arc::new(Inner {
                dispatcher,
                cluster: conns.is_cluster(),
                conns,
                keys: TextKeyBuilder::new(config.prefix.clone()),
                timeout: config.timeout,
                seen: Seen::new(),
                writer: writer_id(),
                calls: AtomicU64::new(0),
                conflicts: AtomicU64::new(0),
                queues: Mutex::new(Queues::default()),
                answered: AtomicU64::new(0),
                epoch: monotonic(),
                metrics,
                slow_warning: Every::new(SLOW_WARNING_EVERY),
            }),
        };
        store.first_ping().await?;
        Ok(store)
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut c = self.inner.conns.get();
        self.bounded(async move { ::redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .map(drop)
    }

    /// Says this instance (`id`) is alive, in the instances' hash the RLQS exchange beats in too
    /// (one registry of the server instances on this Redis, by Redis's clock), and counts the
    /// instances alive there, this one included.
    pub async fn heartbeat(&self, id: InstanceId) -> Result<usize, StoreError> {
        let now_ms = self.time_ms().await?;
        let seen = self
            .exchange_demand(&self.instances_key(), id, 0.0, now_ms)
            .await?;
        Ok(ratelimit_core::quota::fraction::live(
            id,
            &seen.peers,
            seen.now_ms,
        ))
    }

    /// The state this instance last saw in `key` (no call), unless Redis has dropped it by `now`.
    pub fn last_seen(&self, key: &TextKey, now: Nanos) -> Option<State> {
        let now_ms = now / 1_000_000;
        self.inner
            .seen
            .get(key)
            .and_then(|v| decode(&v))
            .filter(|s| cas::pxat(s) > now_ms)
    }

    /// Compare-and-set conflicts seen so far (each one cost a retry).
    pub fn conflicts(&self) -> u64 {
        self.inner.conflicts.load(Ordering::Relaxed)
    }

    /// Whether any call got an answer from Redis at or after `since`.
    pub fn answered_since(&self, since: Instant) -> bool {
        let at = self.inner.answered.load(Ordering::Relaxed);
        self.inner.epoch + Duration::from_nanos(at) >= since
    }

    /// Sends `call` on the Redis I/O thread, bounded there by `REDIS_TIMEOUT`; counts it.
    async fn bounded<T: Send + 'static>(
        &self,
        call: impl Future<Output = ::redis::RedisResult<T>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        io::run(async move {
            let started = monotonic();
            let result = within(inner.timeout, call).await;
            inner.account(started, result)
        })
        .await
        .unwrap_or_else(|| {
            Err(StoreError::Unavailable(
                "the Redis I/O thread is gone".into(),
            ))
        })
    }

    /// One script call: pipelined with the others waiting (single server, Sentinel), or alone
    /// (cluster); a Redis that does not know the script gets it loaded and the call again. A call
    /// whose reply was lost (its connection dropped, or it timed out while Redis answered other
    /// calls) is sent once more, on the next connection: the compare-and-set recognises its own
    /// write if the first attempt landed, so it is charged once (`ratelimit_redis_retries`).
    async fn script_call(&self, cmd: ::redis::Cmd) -> Result<::redis::Value, StoreError> {
        let started = monotonic();
        let first = self.send_script(cmd.clone()).await;
        if !self.lost(&first, started) {
            return self.inner.account(started, first);
        }
        let _ = self.inner.account(started, first);
        self.inner.metrics.retries.inc();
        let again = monotonic();
        let second = self.send_script(cmd).await;
        self.inner.account(again, second)
    }

    /// Whether a call failed on the way (its reply lost), not by Redis's answer: its connection
    /// failed, or it timed out while Redis answered other calls (a timeout with nothing
    /// answered is Redis gone quiet: not sent again, so a frozen Redis costs one timeout).
    fn lost(&self, sent: &Sent, started: Instant) -> bool {
        match sent {
            Ok(Ok(_)) => false,
            Ok(Err(e)) => e.is_io_error() || e.is_connection_dropped(),
            Err(()) => self.answered_since(started),
        }
    }

    /// Sends one script call, uncounted.
    async fn send_script(&self, cmd: ::redis::Cmd) -> Sent {
        let Some(dispatcher) = &self.inner.dispatcher else {
            let mut c = self.inner.conns.get();
            let timeout = self.inner.timeout;
            let call = async move {
                within(timeout, async move {
                    match cmd.query_async(&mut c).await {
                        Err(e) if e.code() == Some("NOSCRIPT") => {
                            cas::load().query_async::<String>(&mut c).await?;
                            cmd.query_async(&mut c).await
                        }
                        other => other,
                    }
                })
                .await
            };
            return io::run(call).await.unwrap_or_else(|| Ok(Err(io_gone())));
        };
        // The dispatcher bounded it by REDIS_TIMEOUT on the I/O thread; a timeout is no answer.
        match dispatcher.call(cmd).await {
            Err(e) if e.is_timeout() => Err(()),
            other => Ok(other),
        }
    }

    /// What this instance last saw in `keys` (no round trip): a key it has not seen is expected
    /// absent, and so is one whose last seen state Redis has dropped by `now` by our clock (its
    /// PXAT passed). Only for first attempts: retries decide on what Redis returned (with clocks
    /// apart, Redis may still hold such a key).
    fn expected(&self, keys: &[TextKey], now: Nanos) -> Raw {
        let now_ms = now / 1_000_000;
        keys.iter()
            .map(|k| {
                self.inner
                    .seen
                    .get(k)
                    .filter(|v| decode(v).is_none_or(|s| cas::pxat(&s) > now_ms))
            })
            .collect()
    }

    /// Writes `new` (per key, `None` = unchanged) if every key still holds `expected` (with
    /// nothing new: only checks). Returns `Ok` with what the keys hold if it did, else `Err` with
    /// what they hold now; either way the seen-value cache is left holding that.
    async fn compare_and_set(
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
                writer: self.inner.writer,
                seq: self.inner.calls.fetch_add(1, Ordering::Relaxed),
            },
        };
        let (cmd, written) = call.command();
        let stamp = self.inner.seen.stamp();
        let reply = self.script_call(cmd).await?;
        let current = cas::reply(reply, keys.len()).map_err(|e| {
            self.inner.metrics.error("script");
            StoreError::Unavailable(e)
        })?;
        let held = current.as_ref().unwrap_or(&written);
        for (key, value) in keys.iter().zip(held) {
            self.inner.seen.put(key, value.as_deref(), stamp);
        }
        match current {
            Some(current) => {
                self.inner.conflicts.fetch_add(1, Ordering::Relaxed);
                self.inner.metrics.conflicts.inc();
                Ok(Err(current))
            }
            None => Ok(Ok(written)),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues<TextKey, Pending>> {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Which requests `keys` may share a call with: on a cluster, those of the same slot (`None`
    /// if they span slots); otherwise all.
    fn group(&self, keys: &[TextKey]) -> Group {
        if !self.inner.cluster {
            return Some(0);
        }
        let mut slots = keys.iter().map(|k| slot(k.as_str().as_bytes()));
        let first = slots.next()?;
        slots.all(|s| s == first).then_some(first)
    }

    /// Queues `pending` behind the calls holding its keys, or starts it alone.
    fn submit(&self, pending: Pending) -> Arrival<TextKey, Pending> {
        let keys = distinct(&pending.charges);
        let group = self.group(&keys);
        self.queues().arrive(keys, group, pending)
    }

    /// A call on `keys` is done: starts what waited for them.
    fn release(&self, keys: &[TextKey]) {
        let batches = self.queues().finish(keys);
        self.start(batches);
    }

    /// Runs each batch in a task of its own (no caller's cancellation can strand it), then frees
    /// its keys.
    fn start(&self, batches: Vec<Batch<TextKey, Pending>>) {
        for batch in batches {
            let store = self.clone();
            tokio::spawn(async move {
                let _release = Release {
                    store: &store,
                    keys: batch.keys,
                };
                store.run(batch.requests).await;
            });
        }
    }

    /// Decides `requests` (one call's worth) and answers each.
    async fn run(&self, mut requests: Vec<Pending>) {
        requests.retain(|p| !p.abandoned());
        if requests.is_empty() {
            return;
        }
        let m = &self.inner.metrics;
        m.batch_requests.observe(requests.len() as f64);
        for p in requests.iter().filter(|p| p.reply.is_some()) {
            m.queue_wait.observe(p.arrived.elapsed().as_secs_f64());
        }
        let keys: Vec<TextKey> = distinct(requests.iter().flat_map(|p| &p.charges)).into_vec();
        let result = if requests.len() == 1 && self.group(&keys).is_none() {
            self.spread(&requests[0]).await.map(|v| vec![v])
        } else {
            self.decide(&keys, &mut requests).await
        };
        self.answer(requests, result);
    }

    /// Decides `requests` in order on `keys` (all of them, one slot), by compare-and-set, retrying
    /// on what Redis holds when another instance got in between. Drops requests whose callers left
    /// while it retried; the verdicts are those of the requests left, in order.
    async fn decide(
        &self,
        keys: &[TextKey],
        requests: &mut Vec<Pending>,
    ) -> Result<Vec<Verdicts>, StoreError> {
        let now = requests.iter().map(|p| p.now).max().unwrap_or(0);
        let mut expected = self.expected(keys, now);
        for attempt in 0..MAX_ATTEMPTS {
            let stored = states(&expected);
            let steps: Vec<Transaction<'_, TextKey>> = requests
                .iter()
                .map(|p| Transaction {
                    charges: &p.charges,
                    now: p.now,
                    kind: if p.reply.is_none() {
                        TransactionKind::Refund
                    } else {
                        TransactionKind::Apply
                    },
                })
                .collect();
            let outcome = decide_batch(&steps, keys, &stored);
            drop(steps);
            let new: SmallVec<[Option<State>; 4]> = outcome
                .states
                .iter()
                .zip(&stored)
                .map(|(after, before)| after.filter(|_| after != before))
                .collect();
            let Err(current) = self.compare_and_set(keys, &expected, &new, now).await? else {
                return Ok(outcome.verdicts);
            };
            expected = current;
            requests.retain(|p| !p.abandoned());
            if requests.is_empty() {
                return Ok(Vec::new());
            }
            if attempt + 1 >= FRESH_RETRIES {
                backoff(attempt).await;
            }
        }
        self.inner.metrics.error("conflict_exhausted");
        Err(StoreError::Contention(MAX_ATTEMPTS))
    }

    /// Sends each request its verdicts (or the call's error). A charged leaky-bucket turn whose
    /// caller went away meanwhile is given back.
    fn answer(&self, requests: Vec<Pending>, result: Result<Vec<Verdicts>, StoreError>) {
        match result {
            Ok(all) => {
                for (p, verdicts) in requests.into_iter().zip(all) {
                    let Some(reply) = p.reply else { continue };
                    if let Err(Ok(verdicts)) = reply.send(Ok(verdicts)) {
                        self.give_back(&p.charges, &verdicts, p.now);
                    }
                }
            }
            Err(e) => {
                for p in requests {
                    if let Some(reply) = p.reply {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Gives back the leaky-bucket turns `verdicts` took for `charges` (never answered).
    fn give_back(&self, charges: &[Charge<TextKey>], verdicts: &Verdicts, now: Nanos) {
        let turns: Vec<Charge<TextKey>> = charges
            .iter()
            .zip(verdicts)
            .filter(|(c, v)| v.charged && c.params.algorithm == Algorithm::LeakyBucket)
            .map(|(c, _)| c.clone())
            .collect();
        if !turns.is_empty() {
            self.refund_text(turns, now);
        }
    }

    /// `Store::apply`, on text keys: decided in the next call on its keys, together with the other
    /// requests waiting for them.
    pub async fn apply_text(
        &self,
        charges: &[Charge<TextKey>],
        now: Nanos,
    ) -> Result<Verdicts, StoreError> {
        if charges.is_empty() {
            return Ok(Verdicts::new());
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            charges: charges.to_vec(),
            now,
            reply: Some(reply),
            arrived: monotonic(),
        };
        let mut leave = Leave {
            store: self,
            ticket: None,
        };
        match self.submit(pending) {
            Arrival::Start(batch) => {
                let _release = Release {
                    store: self,
                    keys: batch.keys,
                };
                self.run(batch.requests).await;
            }
            Arrival::Queued(ticket) => leave.ticket = Some(ticket),
        }
        let result = answer.await;
        leave.ticket = None;
        result.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the decision's call was dropped".into(),
            ))
        })
    }

    /// Gives the leaky-bucket turns of `charges` back, in the next call on their keys. Does not
    /// wait (it is called from drop guards).
    pub fn refund_text(&self, charges: Vec<Charge<TextKey>>, now: Nanos) {
        if charges.is_empty() {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!("leaky-bucket refund dropped: no async runtime");
            return;
        }
        let pending = Pending {
            charges,
            now,
            reply: None,
            arrived: monotonic(),
        };
        if let Arrival::Start(batch) = self.submit(pending) {
            self.start(vec![batch]);
        }
    }

    /// A key's raw value (for tests and `/explain`).
    pub async fn get_raw(&self, key: &TextKey) -> Result<Option<Vec<u8>>, StoreError> {
        let mut c = self.inner.conns.get();
        let get = ::redis::cmd("GET").arg(key.as_str()).clone();
        self.bounded(async move { get.query_async(&mut c).await })
            .await
    }

    /// Requests waiting for a call on their keys, and keys held by a call or a waiting request
    /// (for tests: both 0 once everything is answered).
    pub fn queued(&self) -> (usize, usize) {
        let q = self.queues();
        (q.waiting(), q.lanes())
    }
}

impl Backend for RedisBackend {
    type Key = TextKey;
    const NAME: &'static str = "redis";

    fn key(&self, id: &CounterId<'_>) -> TextKey {
        self.inner.keys.key(id)
    }

    async fn transact(&self, tx: Transaction<'_, TextKey>) -> Result<Verdicts, StoreError> {
        match tx.kind {
            TransactionKind::Apply => self.apply_text(tx.charges, tx.now).await,
            TransactionKind::Refund => {
                self.refund_text(tx.charges.to_vec(), tx.now);
                Ok(Verdicts::new())
            }
        }
    }

    async fn peek(&self, key: &TextKey) -> Result<Option<State>, StoreError> {
        Ok(self.get_raw(key).await?.as_deref().and_then(decode))
    }
}

impl RemoteKey for TextKey {
    fn bytes(&self) -> usize {
        self.as_str().len()
    }
}

impl Remote for RedisBackend {
    async fn ping(&self) -> Result<(), StoreError> {
        RedisBackend::ping(self).await
    }

    fn last_seen(&self, key: &TextKey, now: Nanos) -> Option<State> {
        RedisBackend::last_seen(self, key, now)
    }

    async fn heartbeat(&self, id: InstanceId) -> Result<usize, StoreError> {
        RedisBackend::heartbeat(self, id).await
    }

    fn answered_since(&self, since: Instant) -> bool {
        RedisBackend::answered_since(self, since)
    }
}

/// Reaching Redis as `RedisConfig` says, and the keys of its counters (`CACHE_KEY_PREFIX`).
#[derive(Debug, Clone)]
pub struct RedisConnect {
    pub config: RedisConfig,
    keys: TextKeyBuilder,
}

impl RedisConnect {
    pub fn new(config: RedisConfig) -> RedisConnect {
        RedisConnect {
            keys: TextKeyBuilder::new(config.prefix.clone()),
            config,
        }
    }
}

impl Connect for RedisConnect {
    type Backend = RedisBackend;

    async fn connect(&self, metrics: RemoteMetrics) -> Result<RedisBackend, StoreError> {
        RedisBackend::connect_observed(&self.config, metrics).await
    }

    fn key(&self, id: &CounterId<'_>) -> TextKey {
        self.keys.key(id)
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Its own calls and the one ahead of it on its keys, each up to [`MAX_ATTEMPTS`] attempts.
    fn decision_deadline(&self) -> Duration {
        self.config.timeout * (2 * MAX_ATTEMPTS as u32)
    }
}
