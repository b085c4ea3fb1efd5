//! The Redis store: [`RedisBackend`], connected as a `RedisConfig` says. A decision waits in the
//! queues (`queue`) for the call holding its keys, then goes with the others waiting for them in
//! one call (`attempts`; `spread` for one whose keys span cluster slots); each caller gets its
//! verdicts back over a channel. Also the few plain commands the store answers (`PING`, a key's
//! state for `/explain`) and the RLQS demand exchange's door (`demand`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::oneshot;

use ratelimit_core::clock::{Clock, Nanos, SystemClock, monotonic};
use ratelimit_core::config::Algorithm;
use ratelimit_core::lease::LeaseAnswer;
use ratelimit_core::limiter::State;
use ratelimit_core::quota::fraction::{self, InstanceId};
use ratelimit_core::store::TransactionKind;
use ratelimit_core::store::{
    Backend, Charge, CounterId, LeaseCall, StoreError, Transaction, Verdicts,
};
use ratelimit_remote::{RemoteMetrics, Shard};

use crate::calls::{Calls, script_call};
use crate::cas::{self, decode};
use crate::conn::{self, Conns, RedisConfig};
use crate::demand::DemandRound;
use crate::greeting::Greeting;
use crate::key::{TextKey, TextKeyBuilder, distinct};
use crate::masters::Masters;
use crate::pending::Pending;
use crate::queue::{Arrival, Batch, Group, Queues, Ticket};
use crate::slot::slot;
use crate::writer::Writer;
use crate::{attempts, eviction, greeting, io, lease, mode, refusal, speaks, spread, version};

/// How long the breaker's probe key lives (it is written again at each probe).
const PROBE_KEY_LIFETIME_MS: u64 = 1000;

/// Milliseconds since the Unix epoch by this host's clock (Redis expires keys by its own; the
/// probe key's expiry needs no precision).
fn wall_clock_ms() -> u64 {
    SystemClock.now() / 1_000_000
}

/// A handle to the Redis store (cheap to clone).
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    writer: Writer,
    keys: TextKeyBuilder,
    queues: Mutex<Queues<TextKey, Pending>>,
    /// Keys are grouped by cluster slot (one script call per slot).
    cluster: bool,
    /// On a cluster, the master serving each slot (a key's shard for the guard's breakers).
    masters: Option<Arc<Masters>>,
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
        let conns = Arc::new(open(config).await?);
        if conns.is_sentinel() {
            let weak = Arc::downgrade(&conns);
            tokio::spawn(Conns::watch(move || weak.upgrade()));
        }
        let masters = conns.cluster().map(|cluster| {
            let masters = Arc::new(Masters::new());
            let follow = Masters::follow(Arc::downgrade(&masters), cluster, config.timeout);
            tokio::spawn(follow);
            masters
        });
        let calls = Arc::new(Calls::new(conns, config.timeout, metrics));
        calls.first_ping().await?;
        let info = mode::server_info(&calls).await;
        mode::check(info.as_deref(), config)?;
        mode::warn_if_replica(&calls, config).await;
        eviction::warn_if_evicting(&calls, config).await;
        let probe = cas::write_probe(
            &TextKeyBuilder::new(config.prefix.clone()).write_probe_key(),
            wall_clock_ms() + PROBE_KEY_LIFETIME_MS,
        );
        version::check(&calls, info.as_deref(), probe, &config.describe()).await?;
        calls
            .probe_conditional_set(&TextKeyBuilder::new(config.prefix.clone()).probe_key())
            .await;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                masters,
                cluster: calls.is_cluster(),
                writer: Writer::new(calls),
                keys: TextKeyBuilder::new(config.prefix.clone()),
                queues: Mutex::new(Queues::default()),
            }),
        })
    }

    /// The breaker's probe: checks that Redis takes a write as decisions make it (the script's
    /// `SET` on a key of its own, `cas::write_probe`), so that a Redis answering `PING` while it
    /// refuses every decision's command (out of memory, read-only, an ACL) stays down instead of
    /// coming back up at each probe. On a cluster, that any master answers a `PING`
    /// (`Conn::ping`): each master's keys have their own breaker, probed by their own calls.
    /// `Unavailable` when Redis refused it, `Unreachable` when nothing answered (`Calls::probe`).
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        let calls = self.calls();
        let mut c = calls.conn();
        if self.inner.cluster {
            return calls.probe(async move { c.ping().await }).await;
        }
        let pxat_ms = wall_clock_ms() + PROBE_KEY_LIFETIME_MS;
        let probe = cas::write_probe(&self.inner.keys.write_probe_key(), pxat_ms);
        calls
            .probe(async move { script_call::<::redis::Value>(&mut c, &probe, cas::SCRIPT).await })
            .await
    }

    /// Starts a round of the RLQS demand exchange for `instance` at Redis's time: the one door to
    /// the demand hashes (docs/rlqs.md "Several servers").
    pub async fn demand_round(&self, instance: InstanceId) -> Result<DemandRound, StoreError> {
        DemandRound::start(self.calls().clone(), self.inner.keys.clone(), instance).await
    }

    /// The round of the demand exchange that [`RedisBackend::demand_round`] started at `now_ms`
    /// (Redis's time), again: no call.
    pub fn demand_round_at(&self, instance: InstanceId, now_ms: u64) -> DemandRound {
        DemandRound::at(
            self.calls().clone(),
            self.inner.keys.clone(),
            instance,
            now_ms,
        )
    }

    /// Says this instance (`id`) is alive, in the instances' hash the RLQS exchange beats in too
    /// (one registry of the server instances on this Redis, by Redis's clock), and counts the
    /// instances alive there, this one included.
    pub(crate) async fn heartbeat(&self, id: InstanceId) -> Result<usize, StoreError> {
        let seen = self.demand_round(id).await?.beat().await?.seen;
        Ok(fraction::live(id, &seen.peers, seen.now_ms))
    }

    /// The state this instance last saw in `key` (no call), unless Redis has dropped it by `now`.
    pub(crate) fn last_seen(&self, key: &TextKey, now: Nanos) -> Option<State> {
        self.inner.writer.last_seen(key, now)
    }

    /// The cluster master serving `key`'s slot (`None` off a cluster, or before it is known).
    pub(crate) fn shard(&self, key: &TextKey) -> Option<Shard> {
        self.inner.masters.as_ref()?.shard_of(key.as_str())
    }

    /// Whether any call got an answer from Redis at or after `since`.
    pub(crate) fn answered_since(&self, since: Instant) -> bool {
        self.calls().answered_since(since)
    }

    /// Compare-and-set conflicts seen so far (each one cost a retry).
    #[cfg(feature = "testing")]
    pub fn conflicts(&self) -> u64 {
        self.inner.writer.conflicts()
    }

    pub(crate) fn calls(&self) -> &Arc<Calls> {
        self.inner.writer.calls()
    }

    /// How this store names its keys.
    pub(crate) fn keys(&self) -> &TextKeyBuilder {
        &self.inner.keys
    }

    /// A key's raw value (for `/explain`).
    async fn get_raw(&self, key: &TextKey) -> Result<Option<Vec<u8>>, StoreError> {
        let calls = self.calls();
        let mut c = calls.conn();
        let get = ::redis::cmd("GET").arg(key.as_str()).clone();
        calls
            .bounded(async move { get.query_async(&mut c).await })
            .await
    }

    /// `Store::apply`, on text keys: decided in the next call on its keys, together with the other
    /// requests waiting for them.
    async fn apply(&self, charges: &[Charge<TextKey>], now: Nanos) -> Result<Verdicts, StoreError> {
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
                // Boxed: the call's state (the compare-and-set, its script call and retry)
                // would otherwise live inline in the request's future, which tonic and the
                // service move several times per call (callgrind: ~8,000 instructions of memcpy
                // per decision); boxed, a move copies a pointer.
                Box::pin(self.run(batch.requests)).await;
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
    fn refund(&self, charges: Vec<Charge<TextKey>>, now: Nanos) {
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

    fn queues(&self) -> MutexGuard<'_, Queues<TextKey, Pending>> {
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
        let m = self.calls().metrics();
        m.batch_requests.observe(requests.len() as f64);
        for p in requests.iter().filter(|p| p.reply.is_some()) {
            m.queue_wait.observe(p.arrived.elapsed().as_secs_f64());
        }
        let keys: Vec<TextKey> = distinct(requests.iter().flat_map(|p| &p.charges)).into_vec();
        let writer = &self.inner.writer;
        let result = if requests.len() == 1 && self.group(&keys).is_none() {
            let request = &requests[0];
            spread::spread(writer, &request.charges, request.now)
                .await
                .map(|v| vec![v])
        } else {
            attempts::decide(writer, &keys, &mut requests).await
        };
        self.answer(requests, result);
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
            self.refund(turns, now);
        }
    }
}

/// The connections `config` asks for, made in a task of their own. Each connection's set-up is
/// bounded by its round trips (`conn::connect_bound`), not the whole pool by one REDIS_TIMEOUT;
/// the outer bound is a safety net.
async fn open(config: &RedisConfig) -> Result<Conns, StoreError> {
    // rustls needs a process-wide crypto provider; ours is ring. (Err: one is installed.)
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bound = conn::set_up_bound(config);
    let connecting = {
        let config = config.clone();
        async move { tokio::time::timeout(bound, Conns::connect(&config)).await }
    };
    let opened = io::run(connecting).await.ok_or_else(|| {
        StoreError::Unavailable("the runtime stopped while connecting to Redis".into())
    })?;
    let Ok(opened) = opened else {
        // A TLS client at Redis's plaintext port waits here: Redis waits for the line end of
        // the ClientHello it takes for a command.
        if let Some(mismatch) = tls_mismatch(None, config).await {
            return Err(mismatch);
        }
        return Err(StoreError::Unreachable(format!(
            "no connection to Redis within {bound:?} ({} round trips of REDIS_TIMEOUT={:?} per connection)",
            conn::CONNECT_ROUND_TRIPS,
            config.timeout
        )));
    };
    match opened {
        Ok(conns) => Ok(conns),
        Err(e) => Err(connect_failure(&e, config).await),
    }
}

/// A failure to connect as the store's error (`refusal`); a connection cut as it opened, or
/// answered with what Redis never says, is told by what the server wrote unasked (`greeting`:
/// protected mode, `maxclients`, a server that is not Redis).
async fn connect_failure(e: &::redis::RedisError, config: &RedisConfig) -> StoreError {
    if refusal::cut(e) || e.kind() == ::redis::ErrorKind::Parse {
        match greeting::greeting(config.first_addrs(), config.timeout).await {
            Some(Greeting::Error(said)) => return refusal::turned_away(e, &said),
            Some(Greeting::Foreign(wrote)) => return refusal::not_redis(e, &wrote),
            None => {}
        }
    }
    if let Some(mismatch) = tls_mismatch(Some(e), config).await {
        return mismatch;
    }
    refusal::classify(e)
}

/// A refusal when the store and Redis disagree about TLS (`speaks`): with TLS on, Redis's
/// plaintext port answers a `PING` as Redis (after any failure: the ClientHello taken for a bad
/// command, or no answer at all, `e` `None`); with TLS off, a connection cut as it opened (`e`)
/// where a ClientHello gets TLS back is Redis's TLS port.
async fn tls_mismatch(e: Option<&::redis::RedisError>, config: &RedisConfig) -> Option<StoreError> {
    let addr = *config.first_addrs().first()?;
    if config.tls.is_some() {
        return speaks::answers_plain_redis(addr, config.timeout)
            .await
            .then(|| refusal::tls_at_plaintext(addr));
    }
    if e.is_some_and(refusal::cut) && speaks::speaks_tls(addr, config.timeout).await {
        return Some(refusal::plaintext_at_tls(addr));
    }
    None
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

impl Backend for RedisBackend {
    type Key = TextKey;
    const NAME: &'static str = "redis";

    fn key(&self, id: &CounterId<'_>) -> TextKey {
        self.inner.keys.key(id)
    }

    async fn transact(&self, tx: Transaction<'_, TextKey>) -> Result<Verdicts, StoreError> {
        match tx.kind {
            TransactionKind::Apply => self.apply(tx.charges, tx.now).await,
            TransactionKind::Refund => {
                self.refund(tx.charges.to_vec(), tx.now);
                Ok(Verdicts::new())
            }
        }
    }

    async fn peek(&self, key: &TextKey) -> Result<Option<State>, StoreError> {
        Ok(self.get_raw(key).await?.as_deref().and_then(decode))
    }

    async fn lease(&self, call: LeaseCall<'_, TextKey>) -> Result<LeaseAnswer, StoreError> {
        lease::call(self.calls(), &call).await
    }

    async fn reset(&self, key: &TextKey) -> Result<bool, StoreError> {
        self.delete(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_redis::TestRedis;

    /// Each decision boxes its Redis call (`apply`), copying the whole future into a fresh
    /// allocation: the compare-and-set is shared rather than held by value at each level, and the
    /// cluster's direct call is boxed, so the call stays a third of its old 3,664 bytes
    /// (docs/cost-per-decision.md "Cache misses, not instructions"). This bound fails if a step grows it
    /// back.
    #[tokio::test]
    async fn a_decisions_redis_call_stays_small() {
        let Some(redis) = TestRedis::start() else {
            return;
        };
        let backend = RedisBackend::connect(&RedisConfig::single(&redis.url()).unwrap())
            .await
            .unwrap();
        let size = std::mem::size_of_val(&backend.run(Vec::new()));
        assert!(size <= 2048, "the Redis call's future is {size} bytes");
    }
}
