//! [`Guarded`]: a remote backend as the server runs it. Every decision is bounded in time and goes
//! through a circuit breaker ([`crate::breaker`]); while the backend is unreachable the operator's
//! failure mode decides (a per-instance memory backend with the same rules, allow, deny, or a gRPC
//! error). A backend unreachable at start-up does not stop the server: it starts in the failure
//! mode and keeps connecting in the background with backoff. Each switch between the backend and
//! the failure mode is logged once, counted and shown on `ratelimit_store_up`.
//!
//! Here: the shared state, start-up and the `Backend` face. Beside it: `call` (one call under the
//! deadline and the breaker's permit), `per_shard` (a breaker per shard: a cluster master's keys
//! go to the failure mode alone), `failure` (the failure modes' answers), `hand_over` (the
//! local failure mode's outage: keys taken over, their hits written back), `kept_share` (after
//! its outage, a key within the share this instance kept), `switch` (a switch
//! counted and logged) and `tasks` (the background loops).

mod call;
mod failure;
mod hand_over;
mod kept_share;
mod per_shard;
mod switch;
mod tasks;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use ratelimit_core::clock::{Nanos, monotonic};
use ratelimit_core::lease::LeaseAnswer;
use ratelimit_core::limiter::State;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::store::memory::{MemoryBackend, MemoryKey};
use ratelimit_core::store::{
    Backend, CounterId, LeaseCall, StoreError, StoreStats, Transaction, TransactionKind, Verdicts,
};

use crate::breaker::{Breaker, Change};
use crate::every::Every;
use crate::metrics::RemoteMetrics;
use crate::mode::{FailureMode, GuardSettings, LocalShare};
use crate::names::RemoteName;
use crate::outage::Outage;
use crate::over_limit_cache::OverLimitCache;
use crate::remote::Connect;
use crate::shards::Shards;

use call::Answer;

/// The breaker's openings: 100 ms doubling to 800 ms, so the backend is probed at least every
/// 0.8 s and decisions are back on it within a second of it answering again.
const BREAKER_BASE: Duration = Duration::from_millis(100);
const BREAKER_MAX: Duration = Duration::from_millis(800);

/// A flapping backend is said once per this long each way; `ratelimit_store_switches` counts
/// every switch.
const SWITCH_LOG_EVERY: Duration = Duration::from_secs(10);

/// The key type of the backend `C` reaches.
type KeyOf<C> = <<C as Connect>::Backend as Backend>::Key;

struct Shared<C: Connect> {
    /// None until the first connection succeeds.
    remote: ArcSwapOption<C::Backend>,
    connect: C,
    /// The backend's names in logs and errors.
    name: RemoteName,
    breaker: Mutex<Breaker>,
    /// A breaker per shard (a cluster's masters), beside `breaker`.
    shards: Mutex<Shards>,
    local: MemoryBackend,
    mode: FailureMode,
    /// Bound on one whole decision, a safety net: its calls are each bounded by the backend's
    /// timeout and so are its attempts, so a decision ends well before it.
    deadline: Duration,
    metrics: RemoteMetrics,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: keys known over their limit, answered without a call.
    cache: Option<OverLimitCache<KeyOf<C>>>,
    /// Switches are logged at most once per [`SWITCH_LOG_EVERY`] each way (all are counted).
    down_log: Every,
    up_log: Every,
    shard_down_log: Every,
    shard_up_log: Every,
    epoch: Instant,
    /// A `check_again` is pending.
    checking: AtomicBool,
    /// The last error a call or probe failed with since the backend last came back: said when it
    /// is switched off and in the failure mode `error`'s answers, so they tell a backend refusing
    /// its calls (out of memory, read-only) from a silent one.
    last_error: Mutex<Option<String>>,
    share: LocalShare,
    /// Live instances on the remote backend, by the last heartbeat (at least 1).
    live_instances: AtomicUsize,
    /// This instance's id among those on the remote backend (the RLQS exchange uses it too).
    instance_id: InstanceId,
    /// The keys the local failure mode took over in this outage (at most `outage_cap`).
    outage: Mutex<Outage<KeyOf<C>>>,
    outage_cap: usize,
    /// Keys in `outage` (read without its lock on every decision).
    outage_keys: AtomicUsize,
    /// Told when a write-back of taken-over keys ends (decisions on them wait for it).
    settled: tokio::sync::Notify,
    /// Keys that left an outage, whose local state still bounds this instance (`kept_share`).
    kept: Mutex<HashSet<KeyOf<C>>>,
    /// Keys in `kept` (read without its lock on every decision).
    kept_keys: AtomicUsize,
}

impl<C: Connect> Shared<C> {
    fn new(
        connect: C,
        settings: GuardSettings,
        metrics: RemoteMetrics,
        connected: Option<C::Backend>,
    ) -> Shared<C> {
        let timeout = connect.timeout();
        let probe_timeout = timeout * 2 + Duration::from_millis(50);
        let breaker = match connected {
            Some(_) => Breaker::new(BREAKER_BASE, BREAKER_MAX, probe_timeout),
            None => Breaker::new_open(BREAKER_BASE, BREAKER_MAX, probe_timeout, monotonic()),
        }
        // Silence is no answer on any connection for as long as a call may take.
        .with_quiet(timeout);
        let shard_breaker =
            Breaker::new(BREAKER_BASE, BREAKER_MAX, probe_timeout).with_quiet(timeout);
        metrics.store_up.set(i64::from(connected.is_some()));
        metrics.breaker_state.set(breaker.state() as i64);
        Shared {
            remote: ArcSwapOption::new(connected.map(Arc::new)),
            deadline: connect.decision_deadline(),
            connect,
            name: RemoteName::of(<C::Backend as Backend>::NAME),
            breaker: Mutex::new(breaker),
            shards: Mutex::new(Shards::new(shard_breaker)),
            local: MemoryBackend::new(settings.local_max_keys),
            mode: settings.mode,
            metrics,
            cache: OverLimitCache::new(settings.local_cache_bytes),
            down_log: Every::new(SWITCH_LOG_EVERY),
            up_log: Every::new(SWITCH_LOG_EVERY),
            shard_down_log: Every::new(SWITCH_LOG_EVERY),
            shard_up_log: Every::new(SWITCH_LOG_EVERY),
            epoch: monotonic(),
            checking: AtomicBool::new(false),
            last_error: Mutex::new(None),
            share: settings.local_share,
            live_instances: AtomicUsize::new(1),
            instance_id: instance_id(),
            outage: Mutex::new(Outage::new()),
            outage_cap: settings.local_max_keys,
            outage_keys: AtomicUsize::new(0),
            settled: tokio::sync::Notify::new(),
            kept: Mutex::new(HashSet::new()),
            kept_keys: AtomicUsize::new(0),
        }
    }
}

/// A remote backend behind a breaker and a failure mode (cheap to clone).
pub struct Guarded<C: Connect> {
    shared: Arc<Shared<C>>,
}

impl<C: Connect> Clone for Guarded<C> {
    fn clone(&self) -> Self {
        Guarded {
            shared: self.shared.clone(),
        }
    }
}

/// A fresh id for this store among the instances on the remote backend: random (a randomly
/// keyed hash; every `RandomState` has new keys, so two servers in one process differ too).
fn instance_id() -> InstanceId {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// The first connection: the backend, or `None` when nobody answered (said loudly: the server
/// starts in the failure mode). A refusal (password, TLS certificate) is the start's error.
async fn connect_first<C: Connect>(
    connect: &C,
    mode: FailureMode,
    metrics: &RemoteMetrics,
) -> Result<Option<C::Backend>, StoreError> {
    let attempt = connect.connect(metrics.clone()).await;
    switch::count_connect(metrics, &attempt);
    match attempt {
        Ok(store) => Ok(Some(store)),
        Err(StoreError::Unreachable(e)) => {
            let name = RemoteName::of(<C::Backend as Backend>::NAME);
            tracing::warn!(
                error = %e,
                remote = %connect.describe(),
                mode = mode.name(),
                "{} IS UNREACHABLE AT START-UP: serving anyway, decisions by {}_FAILURE_MODE={} until it answers; reconnecting in the background",
                name.upper,
                name.upper,
                mode.name()
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl<C: Connect> Shared<C> {
    /// Remembers `error` as the last a call or probe failed with.
    fn failed_with(&self, error: &StoreError) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
    }

    /// The last error a call or probe failed with (since the backend last came back).
    fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Forgets the last error: the backend answers again.
    fn forget_last_error(&self) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

impl<C: Connect> Guarded<C> {
    /// Connects. If nobody answers, starts anyway in the failure mode (with a loud warning) and
    /// keeps connecting in the background; a backend that answers with a refusal (password, TLS
    /// certificate) is a start-up error.
    pub async fn start(
        connect: C,
        settings: GuardSettings,
        metrics: RemoteMetrics,
    ) -> Result<Guarded<C>, StoreError> {
        let connected = connect_first(&connect, settings.mode, &metrics).await?;
        let up = connected.is_some();
        let shared = Arc::new(Shared::new(connect, settings, metrics, connected));
        if !up {
            switch::switched(&shared, Change::Down, false);
            tokio::spawn(tasks::reconnect(Arc::downgrade(&shared)));
        }
        if settings.mode == FailureMode::Local && settings.local_share == LocalShare::Auto {
            tokio::spawn(tasks::heartbeat(Arc::downgrade(&shared)));
        }
        Ok(Guarded { shared })
    }

    /// This store's id among the instances on the remote backend.
    pub fn instance_id(&self) -> InstanceId {
        self.shared.instance_id
    }

    /// Whether decisions go to the remote backend now.
    pub fn is_up(&self) -> bool {
        self.breaker().is_up() && self.shared.remote.load().is_some()
    }
}

impl<C: Connect> Backend for Guarded<C> {
    type Key = KeyOf<C>;
    const NAME: &'static str = <C::Backend as Backend>::NAME;

    fn key(&self, id: &CounterId<'_>) -> Self::Key {
        self.shared.connect.key(id)
    }

    async fn transact(&self, tx: Transaction<'_, Self::Key>) -> Result<Verdicts, StoreError> {
        let apply = tx.kind == TransactionKind::Apply;
        let cache = self.shared.cache.as_ref().filter(|_| apply);
        if let Some(verdicts) = cache.and_then(|c| c.answer(tx.charges, tx.now)) {
            self.shared.metrics.over_limit_with_local_cache.inc();
            return Ok(verdicts);
        }
        // A call whose reply was lost on a cut connection is sent again by the backend itself
        // (once, recognised by the backend if it had landed), so one cut costs no failure-mode
        // answer.
        if let Some(remote) = self.shared.remote.load_full()
            && (apply || self.is_up())
        {
            let mut permits = Vec::new();
            if apply && self.is_up() {
                // A shard (cluster master) that stopped answering: its keys alone go to the
                // failure mode.
                let Some(shards) = self.shard_permits(&remote, &tx) else {
                    self.shared.metrics.shard_down_decisions.inc();
                    return self.fallback(tx, None);
                };
                permits = shards;
                if !self.settle_first(&remote, &tx).await {
                    self.shared.metrics.awaiting_write_back.inc();
                    return self.fallback(tx, None);
                }
                if let Some(verdicts) = self.beyond_kept_share(&tx) {
                    return Ok(verdicts);
                }
            }
            let answer = self.through_for(remote.transact(tx), &permits).await;
            self.record_shards(&permits, &answer);
            match answer {
                Answer::Answered(answer) => {
                    if let (true, Ok(verdicts)) = (apply, &answer) {
                        self.count_in_kept_share(&tx, verdicts);
                    }
                    if let (Some(cache), Ok(verdicts)) = (cache, &answer) {
                        cache.learn(tx.charges, verdicts, tx.now);
                    }
                    return answer;
                }
                Answer::Down(cause) => return self.fallback(tx, cause),
            }
        }
        self.fallback(tx, None)
    }

    async fn peek(&self, key: &Self::Key) -> Result<Option<State>, StoreError> {
        if let Some(remote) = self.shared.remote.load_full()
            && let Answer::Answered(answer) = self.through(remote.peek(key)).await
        {
            return answer;
        }
        match self.shared.mode {
            FailureMode::Local => Ok(self.shared.local.peek_now(key.id())),
            _ => Err(StoreError::Unavailable(format!(
                "{} is unreachable",
                self.shared.name.title
            ))),
        }
    }

    async fn lease(&self, call: LeaseCall<'_, Self::Key>) -> Result<LeaseAnswer, StoreError> {
        if let Some(remote) = self.shared.remote.load_full() {
            // The key's shard (cluster master) stopped answering: the failure mode, no call.
            // (While the store's own breaker is open no call goes, and no shard hears of it.)
            let keys = self.is_up().then_some(call.key);
            let Some(permits) = self.permits_of(&remote, keys) else {
                self.shared.metrics.shard_down_decisions.inc();
                return self.lease_fallback(&call, None);
            };
            let answer = self.through_for(remote.lease(call.clone()), &permits).await;
            self.record_shards(&permits, &answer);
            match answer {
                Answer::Answered(answer) => return answer,
                Answer::Down(cause) => return self.lease_fallback(&call, cause),
            }
        }
        self.lease_fallback(&call, None)
    }

    /// Resets the key in the shared store (through the breaker, as any call beside decisions),
    /// and this instance's local copy of it (the local failure mode's).
    async fn reset(&self, key: &Self::Key) -> Result<bool, StoreError> {
        let shared_key = key.clone();
        let reset = self
            .call(|remote| async move { remote.reset(&shared_key).await })
            .await;
        self.shared.local.put(key.id(), None, 0);
        reset
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    fn sweep(&self, now: Nanos) -> usize {
        self.shared.local.sweep(now)
    }
}
