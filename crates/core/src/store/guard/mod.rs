//! A remote backend as the server runs it ([`Guarded`]): every decision bounded in time, a circuit
//! breaker in front of it ([`breaker`]), and while it is unreachable the operator's
//! `REDIS_FAILURE_MODE` decides (a per-instance memory backend with the same rules, allow, deny,
//! or a gRPC error). A backend unreachable at start-up does not stop the server: it starts in the
//! failure mode and keeps connecting in the background with backoff. Each switch between the
//! backend and the failure mode is logged once, counted and shown on `ratelimit_store_up`. Any
//! backend that implements [`Remote`] (and says how to reach it, [`Connect`]) can be guarded.

pub mod breaker;
mod every;
mod outage;
mod over_limit_cache;

pub use every::Every;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::clock::monotonic;

use breaker::{Breaker, Change, Permit};
use outage::{Claim, Outage, Settle};
use over_limit_cache::OverLimitCache;

use super::memory::{MemoryBackend, MemoryKey};
use super::transaction::Kind;
use super::{
    Backend, Charge, CounterId, StoreError, StoreMetrics, StoreStats, Transaction, Verdict,
    Verdicts,
};
use crate::clock::Nanos;
use crate::limiter::{self, LimitParams, Outlook, State};

/// What the guard needs of a remote backend's keys: a memory key for the local failure mode, and
/// a size, for the over-limit cache's bound.
pub trait RemoteKey: MemoryKey + std::hash::Hash + Eq + Clone + Send + Sync + 'static {
    /// Bytes the key takes (for `LOCAL_CACHE_SIZE_IN_BYTES`).
    fn bytes(&self) -> usize;
}

/// A backend reached over the network.
pub trait Remote: Backend<Key: RemoteKey> {
    /// Checks that it answers (the breaker's probe).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Whether any call got an answer at or after `since`.
    fn answered_since(&self, since: std::time::Instant) -> bool;
    /// The state this instance last saw in `key`, without a call (for the local failure mode's
    /// hand-over), unless the backend has dropped it by `now`.
    fn last_seen(&self, key: &Self::Key, now: Nanos) -> Option<State>;
    /// Says this instance (`id`) is alive in the backend's registry of server instances; the
    /// count of instances alive there, this one included.
    fn heartbeat(&self, id: InstanceId) -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// How to reach a remote backend: at start-up, and again in the background while it is away.
pub trait Connect: Clone + Send + Sync + 'static {
    type Backend: Remote;
    /// Connects (failing with `Unreachable` when nobody answered, `Unavailable` when it refused).
    fn connect(
        &self,
        metrics: StoreMetrics,
    ) -> impl Future<Output = Result<Self::Backend, StoreError>> + Send;
    /// The key of a counter, connected or not.
    fn key(&self, id: &CounterId<'_>) -> <Self::Backend as Backend>::Key;
    /// Where it is, for logs (no credentials).
    fn describe(&self) -> String;
    /// The bound on each call.
    fn timeout(&self) -> Duration;
    /// The longest one decision may take while the backend answers: as many calls as it may make
    /// under contention, each bounded by [`Connect::timeout`]. A safety net: past it, a decision
    /// is answered `UNAVAILABLE`, never by the failure mode.
    fn decision_deadline(&self) -> Duration;
}

/// What answers while Redis is unreachable (`REDIS_FAILURE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Decide from a memory store in this instance, with the same rules.
    Local,
    /// Answer OK.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
    /// Answer gRPC UNAVAILABLE (Envoy's `failure_mode_deny` decides).
    Error,
}

impl FailureMode {
    pub const ALL: [FailureMode; 4] = [Self::Local, Self::Allow, Self::Deny, Self::Error];

    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Error => "error",
        }
    }

    /// A mode by name, any case.
    pub fn parse(text: &str) -> Option<FailureMode> {
        let text = text.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|m| m.name() == text)
    }
}

/// How much of what each limit has left the local failure mode gives this instance
/// (`REDIS_FAILURE_LOCAL_SHARE`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalShare {
    /// One over the live instances, as the last heartbeat counted them (1 while none is known).
    Auto,
    /// This fraction (0 < share ≤ 1).
    Fixed(f64),
}

impl LocalShare {
    /// `auto` or a fraction in (0, 1].
    pub fn parse(text: &str) -> Result<LocalShare, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Ok(LocalShare::Auto);
        }
        match text.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(LocalShare::Fixed(f)),
            _ => Err(format!(
                "invalid share '{text}' (expected auto, or a fraction above 0 and at most 1)"
            )),
        }
    }
}

/// How often an instance says it is alive in Redis (a beat counts for
/// `quota::fraction::STALE_AFTER_MS`).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// A server instance's id among those on one remote backend (the RLQS exchange's
/// `quota::fraction::InstanceId` is the same type).
pub type InstanceId = u64;

/// A fresh id for this store among the instances on the remote backend: random (a randomly
/// keyed hash; every `RandomState` has new keys, so two servers in one process differ too).
fn instance_id() -> InstanceId {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// First wait of the background (re)connection, doubled after each failure up to
/// [`RECONNECT_MAX`].
const RECONNECT_BASE: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// The breaker's openings: 100 ms doubling to 800 ms, so Redis is probed at least every 0.8 s
/// and decisions are back on it within a second of it answering again.
const BREAKER_BASE: Duration = Duration::from_millis(100);
const BREAKER_MAX: Duration = Duration::from_millis(800);

struct Shared<C: Connect> {
    /// None until the first connection succeeds.
    remote: ArcSwapOption<C::Backend>,
    connect: C,
    breaker: Mutex<Breaker>,
    local: MemoryBackend,
    mode: FailureMode,
    /// Bound on one whole decision, a safety net: its Redis calls are each bounded by
    /// `REDIS_TIMEOUT` and so are its attempts, so a decision ends well before it.
    deadline: Duration,
    metrics: StoreMetrics,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: keys known over their limit, answered without a call.
    cache: Option<OverLimitCache<<C::Backend as Backend>::Key>>,
    /// Switches are logged at most once per [`SWITCH_LOG_EVERY`] each way (all are counted).
    down_log: Every,
    up_log: Every,
    epoch: std::time::Instant,
    /// A `check_again` is pending.
    checking: AtomicBool,
    share: LocalShare,
    /// Live instances on the remote backend, by the last heartbeat (at least 1).
    live_instances: AtomicUsize,
    /// This instance's id among those on the remote backend (the RLQS exchange uses it too).
    instance_id: InstanceId,
    /// The keys the local failure mode took over in this outage (at most `outage_cap`).
    outage: Mutex<Outage<<C::Backend as Backend>::Key>>,
    outage_cap: usize,
    /// Keys in `outage` (read without its lock on every decision).
    outage_keys: AtomicUsize,
    /// Told when a write-back of taken-over keys ends (decisions on them wait for it).
    settled: tokio::sync::Notify,
}

/// A flapping Redis (62 switches in 8 s were 62 WARN lines) is said once per this long each way;
/// `ratelimit_store_switches` counts every switch.
const SWITCH_LOG_EVERY: Duration = Duration::from_secs(10);

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

/// What the guard is told to do (from settings).
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    pub mode: FailureMode,
    /// Keys the local failure mode's memory backend holds.
    pub local_max_keys: usize,
    /// `LOCAL_CACHE_SIZE_IN_BYTES` (0: no over-limit cache).
    pub local_cache_bytes: usize,
    /// `REDIS_FAILURE_LOCAL_SHARE`: the local failure mode's share of what each limit has left.
    pub local_share: LocalShare,
}

impl<C: Connect> Guarded<C> {
    /// Connects. If nobody answers, starts anyway in the failure mode (with a loud warning) and
    /// keeps connecting in the background; a backend that answers with a refusal (password, TLS
    /// certificate) is a start-up error.
    pub async fn start(
        connect: C,
        settings: GuardSettings,
        metrics: StoreMetrics,
    ) -> Result<Guarded<C>, StoreError> {
        let GuardSettings {
            mode,
            local_max_keys,
            local_cache_bytes,
            local_share,
        } = settings;
        let timeout = connect.timeout();
        let probe_timeout = timeout * 2 + Duration::from_millis(50);
        let attempt = connect.connect(metrics.clone()).await;
        count_connect(&metrics, &attempt);
        let connected = match attempt {
            Ok(store) => Some(store),
            Err(StoreError::Unreachable(e)) => {
                tracing::warn!(
                    error = %e,
                    redis = %connect.describe(),
                    mode = mode.name(),
                    "REDIS IS UNREACHABLE AT START-UP: serving anyway, decisions by REDIS_FAILURE_MODE={} until it answers; reconnecting in the background",
                    mode.name()
                );
                None
            }
            Err(e) => return Err(e),
        };
        let breaker = match connected {
            Some(_) => Breaker::new(BREAKER_BASE, BREAKER_MAX, probe_timeout),
            None => Breaker::new_open(BREAKER_BASE, BREAKER_MAX, probe_timeout, monotonic()),
        }
        // Silence is no answer on any connection for as long as a call may take.
        .with_quiet(timeout);
        metrics.store_up.set(i64::from(connected.is_some()));
        metrics.breaker_state.set(breaker.state() as i64);
        let up = connected.is_some();
        let deadline = connect.decision_deadline();
        let shared = Arc::new(Shared {
            remote: ArcSwapOption::new(connected.map(Arc::new)),
            connect,
            breaker: Mutex::new(breaker),
            local: MemoryBackend::new(local_max_keys),
            mode,
            deadline,
            metrics,
            cache: OverLimitCache::new(local_cache_bytes),
            down_log: Every::new(SWITCH_LOG_EVERY),
            up_log: Every::new(SWITCH_LOG_EVERY),
            epoch: monotonic(),
            checking: AtomicBool::new(false),
            share: local_share,
            live_instances: AtomicUsize::new(1),
            instance_id: instance_id(),
            outage: Mutex::new(Outage::new()),
            outage_cap: local_max_keys,
            outage_keys: AtomicUsize::new(0),
            settled: tokio::sync::Notify::new(),
        });
        if !up {
            metrics_switch(&shared, Change::Down, false);
            tokio::spawn(reconnect(Arc::downgrade(&shared)));
        }
        if mode == FailureMode::Local && local_share == LocalShare::Auto {
            tokio::spawn(heartbeat(Arc::downgrade(&shared)));
        }
        Ok(Guarded { shared })
    }

    /// This store's id among the instances on the remote backend.
    pub fn instance_id(&self) -> InstanceId {
        self.shared.instance_id
    }

    /// The remote backend, once connected (for tests and tools).
    pub fn remote(&self) -> Option<Arc<C::Backend>> {
        self.shared.remote.load_full()
    }

    /// Whether decisions go to the remote backend now.
    pub fn is_up(&self) -> bool {
        self.breaker().is_up() && self.shared.remote.load().is_some()
    }

    /// Whether the remote backend answered any call at or after `since`.
    fn answered_since(&self, since: std::time::Instant) -> bool {
        self.shared
            .remote
            .load()
            .as_ref()
            .is_some_and(|r| r.answered_since(since))
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.shared
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn permit(&self) -> Permit {
        let mut b = self.breaker();
        let permit = b.permit(monotonic());
        self.shared.metrics.breaker_state.set(b.state() as i64);
        permit
    }

    fn record(&self, permit: Permit, ok: bool) {
        let (change, suspects) = {
            let mut b = self.breaker();
            let change = b.record(permit, ok, monotonic());
            self.shared.metrics.breaker_state.set(b.state() as i64);
            (change, b.suspects())
        };
        if suspects && !self.shared.checking.swap(true, Ordering::AcqRel) {
            tokio::spawn(check_again(Arc::downgrade(&self.shared)));
        }
        if let Some(change) = change {
            metrics_switch(&self.shared, change, true);
            if change == Change::Down {
                tokio::spawn(probe(Arc::downgrade(&self.shared)));
            }
        }
    }

    /// A probe's `PING` failed: tries a fresh connection at once, since the old one may be
    /// waiting out its own reconnection backoff (after a Redis restart that alone kept decisions
    /// off Redis for ~3 s). On success the fresh backend replaces the old one.
    async fn reconnect_now(&self) -> bool {
        let attempt = self
            .shared
            .connect
            .connect(self.shared.metrics.clone())
            .await;
        count_connect(&self.shared.metrics, &attempt);
        match attempt {
            Ok(fresh) => {
                self.shared.remote.store(Some(Arc::new(fresh)));
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "the probe's fresh connection failed too");
                false
            }
        }
    }

    /// The answer while the remote backend cannot decide.
    fn fallback(
        &self,
        tx: Transaction<'_, <C::Backend as Backend>::Key>,
    ) -> Result<Verdicts, StoreError> {
        if tx.is_refund() {
            self.shared.local.run(tx);
            return Ok(Verdicts::new());
        }
        let mode = self.shared.mode;
        self.shared
            .metrics
            .failure_mode_decisions
            .with_label_values(&[mode.name()])
            .inc();
        match mode {
            FailureMode::Local => {
                self.hand_over(&tx);
                let verdicts = self.shared.local.run(tx);
                self.count_outage_use(&tx, &verdicts);
                Ok(verdicts)
            }
            FailureMode::Allow => Ok(fixed(tx.charges, tx.now, true)),
            FailureMode::Deny => Ok(fixed(tx.charges, tx.now, false)),
            FailureMode::Error => Err(StoreError::Unavailable(
                "Redis is unreachable (REDIS_FAILURE_MODE=error)".into(),
            )),
        }
    }

    /// This instance's share of what each limit has left, while the local failure mode decides.
    fn share(&self) -> f64 {
        match self.shared.share {
            LocalShare::Fixed(share) => share,
            LocalShare::Auto => {
                1.0 / self.shared.live_instances.load(Ordering::Relaxed).max(1) as f64
            }
        }
    }

    /// The local failure mode's first decision on a key in this outage starts from the value this
    /// instance last saw in the remote backend, of which it keeps its share of what is left: an
    /// outage does not give every instance the whole limit again.
    fn hand_over(&self, tx: &Transaction<'_, <C::Backend as Backend>::Key>) {
        let share = self.share();
        let remote = self.shared.remote.load_full();
        let mut outage = self
            .shared
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        outage.last_now = Some((tx.now, monotonic()));
        for charge in tx.charges {
            if outage.contains(&charge.key) || outage.len() >= self.shared.outage_cap {
                continue;
            }
            let seen = remote
                .as_ref()
                .and_then(|r| r.last_seen(&charge.key, tx.now));
            let state = limiter::keep_share(&charge.params, seen, tx.now, share);
            self.shared.local.put(charge.key.id(), state, tx.now);
            outage.take_over(charge.key.clone(), charge.params);
            self.shared.outage_keys.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.outage_keys_handed_over.inc();
        }
    }

    /// Adds what the local failure mode admitted to what is written back.
    fn count_outage_use(
        &self,
        tx: &Transaction<'_, <C::Backend as Backend>::Key>,
        verdicts: &Verdicts,
    ) {
        let mut outage = self
            .shared
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (charge, verdict) in tx.charges.iter().zip(verdicts) {
            if verdict.charged {
                outage.count(&charge.key, charge.hits);
            }
        }
    }

    /// Before a decision goes to the remote backend on keys the local failure mode took over (one
    /// master of a cluster back, or the breaker closed): their hits are written into it first, so
    /// the decision counts them. While another call writes one of its keys back, the decision
    /// waits for that (bounded). Either way the decision then goes to the remote backend: a key
    /// whose write-back failed stays taken over (with its hits) for the next decision, and only a
    /// failed call is answered by the failure mode (a key kept local for every request while one
    /// instance was away admitted from its share what the others took on Redis meanwhile).
    async fn settle_first(
        &self,
        remote: &C::Backend,
        tx: &Transaction<'_, <C::Backend as Backend>::Key>,
    ) {
        if self.shared.outage_keys.load(Ordering::Relaxed) == 0 {
            return;
        }
        let claim = self.outage().claim(tx.charges.iter().map(|c| &c.key));
        let claimed = match claim {
            Claim::Free => return,
            Claim::Busy => return self.wait_settled(tx).await,
            Claim::Settle(claimed) => claimed,
        };
        let (written, unsettled) = settle(remote, claimed.clone(), tx.now).await;
        self.shared.metrics.outage_hits_written_back.inc_by(written);
        let unsettled: Vec<_> = unsettled.into_iter().map(|(k, _, _)| k).collect();
        self.release(claimed, &unsettled, tx.now);
    }

    /// Waits (at most [`SETTLE_WAIT_TIMEOUTS`] × `REDIS_TIMEOUT`) until no key of `tx` is being
    /// written back.
    async fn wait_settled(&self, tx: &Transaction<'_, <C::Backend as Backend>::Key>) {
        let wait = self.shared.connect.timeout() * SETTLE_WAIT_TIMEOUTS;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let done = self.shared.settled.notified();
            let mut done = std::pin::pin!(done);
            done.as_mut().enable();
            {
                let outage = self.outage();
                if !tx
                    .charges
                    .iter()
                    .any(|c| outage.settling(&c.key) == Some(true))
                {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return;
            }
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage<<C::Backend as Backend>::Key>> {
        self.shared
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A write-back of `claimed` ended: the keys written leave the outage with their local state.
    fn release(
        &self,
        claimed: Vec<Settle<<C::Backend as Backend>::Key>>,
        unsettled: &[<C::Backend as Backend>::Key],
        now: Nanos,
    ) {
        release(&self.shared, claimed, unsettled, now);
    }

    /// Calls Redis through the breaker; `None` when the failure mode must answer.
    async fn through<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Option<Result<T, StoreError>> {
        // Requests call only while the breaker is closed; while it is open the background prober
        // alone probes (with a fresh connection if the old ones fail: a request's probe on the
        // old connections, waiting out their own reconnection backoff, kept failing and
        // doubling the breaker's interval, ~3 s after a Redis restart).
        if !self.breaker().is_up() {
            return None;
        }
        let permit = Permit::Call;
        let started = monotonic();
        match tokio::time::timeout(self.shared.deadline, call).await {
            Ok(Ok(value)) => {
                self.record(permit, true);
                Some(Ok(value))
            }
            // Redis answered; other instances kept changing the keys.
            Ok(Err(e @ StoreError::Contention(_))) => {
                self.record(permit, true);
                self.shared.metrics.store_errors.inc();
                Some(Err(e))
            }
            Ok(Err(e)) => {
                self.record(permit, false);
                self.shared.metrics.store_errors.inc();
                tracing::debug!(error = %e, "Redis call failed");
                None
            }
            // Redis answered meanwhile, but this decision did not finish within its (generous)
            // bound: not an outage. It is answered as an error, never by the failure mode, which
            // might admit what Redis would refuse.
            Err(_) if self.answered_since(started) => {
                self.shared.metrics.store_errors.inc();
                self.shared.metrics.redis_over_budget.inc();
                Some(Err(StoreError::Unavailable(format!(
                    "the decision did not finish within {:?} while Redis answered; not admitted",
                    self.shared.deadline
                ))))
            }
            // Nothing answered: Redis is not there.
            Err(_) => {
                self.shared.metrics.store_errors.inc();
                None
            }
        }
    }
}

/// Counts, logs and shows one switch; back on the remote backend, writes what the local failure
/// mode admitted into it.
fn metrics_switch<C: Connect>(shared: &Arc<Shared<C>>, change: Change, log: bool) {
    let m = &shared.metrics;
    let now = monotonic()
        .saturating_duration_since(shared.epoch)
        .as_nanos() as u64;
    match change {
        Change::Down => {
            m.store_up.set(0);
            m.switches.with_label_values(&["failure_mode"]).inc();
            if log && shared.down_log.due(now) {
                tracing::warn!(
                    mode = shared.mode.name(),
                    switches = m.switches.with_label_values(&["failure_mode"]).get(),
                    "Redis stopped answering: decisions by REDIS_FAILURE_MODE={} until it answers again (said at most every 10 s; ratelimit_store_switches counts each switch)",
                    shared.mode.name()
                );
            }
        }
        Change::Up => {
            // Redis may have lost counts while away (a restart without persistence).
            if let Some(cache) = &shared.cache {
                cache.clear();
            }
            m.store_up.set(1);
            m.switches.with_label_values(&["redis"]).inc();
            if shared.mode == FailureMode::Local {
                tokio::spawn(write_back(Arc::downgrade(shared)));
            }
            if shared.up_log.due(now) {
                tracing::warn!("Redis answers again: decisions are back on Redis");
            }
        }
    }
}

/// While the breaker is open, probes Redis with `PING` whenever the breaker allows a probe, so
/// decisions go back to Redis (and `ratelimit_store_up` says so) within a second of it answering,
/// with or without traffic. Ends once the breaker closes or the store is dropped.
async fn probe<C: Connect>(shared: Weak<Shared<C>>) {
    loop {
        tokio::time::sleep(PROBE_TICK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let store = Guarded { shared };
        let Some(redis) = store.shared.remote.load_full() else {
            continue;
        };
        match store.permit() {
            Permit::Call => return,
            Permit::Reject => {}
            Permit::Probe => {
                let ok = redis.ping().await.is_ok() || store.reconnect_now().await;
                store.record(Permit::Probe, ok);
                if ok {
                    return;
                }
            }
        }
    }
}

/// Once the remote backend answers again: charges it with what the local failure mode admitted
/// during the outage (per key at most what its limit has left now, so the instances' outage
/// decisions count against the shared limit), then forgets the outage's local state. Decisions on
/// a key stay local while its write-back is under way.
async fn write_back<C: Connect>(shared: Weak<Shared<C>>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let (claimed, last_now) = {
        let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
        (outage.claim_all(), outage.last_now)
    };
    let (Some(remote), Some((last_now, at))) = (shared.remote.load_full(), last_now) else {
        release(&shared, claimed, &[], 0);
        return;
    };
    // The decisions' clock, carried forward from the outage's last decision.
    let now = last_now.saturating_add(at.elapsed().as_nanos() as u64);
    let (written, unsettled) = settle(&*remote, claimed.clone(), now).await;
    shared.metrics.outage_hits_written_back.inc_by(written);
    // Keys whose write failed (in a cluster, their master may still be away while the others
    // answer) stay taken over, their local state with them, until a decision on them settles them.
    let unsettled: Vec<_> = unsettled.into_iter().map(|(k, _, _)| k).collect();
    release(&shared, claimed, &unsettled, now);
    if written > 0 {
        tracing::info!(
            hits = written,
            "written back into Redis: the hits REDIS_FAILURE_MODE=local admitted during the outage"
        );
    }
}

/// A write-back of `claimed` ended at `now`: the keys written leave the outage with their local
/// state (all of it once none is left).
fn release<C: Connect>(
    shared: &Shared<C>,
    claimed: Vec<Settle<<C::Backend as Backend>::Key>>,
    unsettled: &[<C::Backend as Backend>::Key],
    now: Nanos,
) {
    let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
    for key in outage.release(claimed, unsettled) {
        shared.local.put(key.id(), None, now);
    }
    shared.outage_keys.store(outage.len(), Ordering::Relaxed);
    if outage.len() == 0 {
        shared.local.clear();
    }
    drop(outage);
    shared.settled.notify_waiters();
}

/// How many `REDIS_TIMEOUT`s a decision waits for another call's write-back of its keys before it
/// is answered locally (a write-back is a read and a write per key, retried a few times).
const SETTLE_WAIT_TIMEOUTS: u32 = 8;

/// Charges `remote` with `hits` admitted elsewhere on each key, at most what its limit has left at
/// `now` (another instance may charge the key between the read and the write: a few tries).
/// Returns the hits written, and the keys that could not be written (the remote failed).
async fn settle<B: Remote>(
    remote: &B,
    keys: Vec<(B::Key, LimitParams, u64)>,
    now: Nanos,
) -> (u64, Vec<(B::Key, LimitParams, u64)>) {
    let mut written = 0u64;
    let mut unsettled = Vec::new();
    for (key, params, hits) in keys.into_iter().filter(|(_, _, hits)| *hits > 0) {
        let mut settled = false;
        for _ in 0..3 {
            let Ok(state) = remote.peek(&key).await else {
                break;
            };
            let take = limiter::settled_hits(&params, state, now, hits);
            if take == 0 {
                settled = true;
                break;
            }
            let charge = Charge {
                key: key.clone(),
                params,
                hits: take,
                enforced: true,
                quota: None,
            };
            match remote
                .transact(Transaction::apply(std::slice::from_ref(&charge), now))
                .await
            {
                Ok(v) if v.first().is_some_and(|v| v.charged) => {
                    written += take;
                    settled = true;
                    break;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "writing the outage's hits back failed");
                    break;
                }
            }
        }
        if !settled {
            unsettled.push((key, params, hits));
        }
    }
    (written, unsettled)
}

/// While the local failure mode may decide with `REDIS_FAILURE_LOCAL_SHARE=auto`: says every
/// [`HEARTBEAT_EVERY`] that this instance is alive, and learns how many are, so an outage's share
/// is one over that count.
async fn heartbeat<C: Connect>(shared: Weak<Shared<C>>) {
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        let remote = s.remote.load_full();
        let up = s
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_up();
        if let (Some(remote), true) = (remote, up) {
            match tokio::time::timeout(s.connect.timeout() * 4, remote.heartbeat(s.instance_id))
                .await
            {
                Ok(Ok(live)) => {
                    s.live_instances.store(live.max(1), Ordering::Relaxed);
                    s.metrics.redis_instances.set(live as i64);
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat failed"),
                Err(_) => tracing::debug!("heartbeat timed out"),
            }
        }
        drop(s);
        tokio::time::sleep(HEARTBEAT_EVERY).await;
    }
}

/// Failures came right after an answer (a dropped connection, or the start of an outage): once
/// the breaker's quiet time has passed, a `PING` tells which, so the breaker opens on a dead Redis
/// even if no more requests come to fail.
async fn check_again<C: Connect>(shared: Weak<Shared<C>>) {
    let quiet = match shared.upgrade() {
        Some(s) => s
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quiet(),
        None => return,
    };
    tokio::time::sleep(quiet).await;
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let store = Guarded { shared };
    if let Some(redis) = store.shared.remote.load_full()
        && store.permit() == Permit::Call
    {
        let ok = redis.ping().await.is_ok();
        store.shared.checking.store(false, Ordering::Release);
        store.record(Permit::Call, ok);
    } else {
        store.shared.checking.store(false, Ordering::Release);
    }
}

/// How often the prober looks at the breaker.
const PROBE_TICK: Duration = Duration::from_millis(20);

/// Counts one connection attempt by outcome (`ratelimit_redis_connects`).
fn count_connect<T>(metrics: &StoreMetrics, attempt: &Result<T, StoreError>) {
    let outcome = match attempt {
        Ok(_) => "connected",
        Err(StoreError::Unreachable(_)) => "unreachable",
        Err(_) => "refused",
    };
    metrics.redis_connects.with_label_values(&[outcome]).inc();
}

/// How often the background connection says it is still failing.
const STILL_FAILING_EVERY: Duration = Duration::from_secs(30);

/// Connects in the background with backoff until it succeeds or the store is dropped. While it
/// fails it says so at most every [`STILL_FAILING_EVERY`] (a warning while nobody answers, an error
/// while Redis refuses us: a password or certificate that waiting will not mend), with the count
/// of attempts, which `ratelimit_redis_connects` also counts.
async fn reconnect<C: Connect>(shared: Weak<Shared<C>>) {
    let mut wait = RECONNECT_BASE;
    let since = monotonic();
    let say = Every::new(STILL_FAILING_EVERY);
    let mut attempts = 0u64;
    loop {
        tokio::time::sleep(wait).await;
        let Some((metrics, connect)) = shared
            .upgrade()
            .map(|s| (s.metrics.clone(), s.connect.clone()))
        else {
            return;
        };
        let attempt = connect.connect(metrics.clone()).await;
        count_connect(&metrics, &attempt);
        attempts += 1;
        match attempt {
            Ok(store) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.remote.store(Some(Arc::new(store)));
                let change = {
                    let mut b = shared
                        .breaker
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let change = b.connected();
                    shared.metrics.breaker_state.set(b.state() as i64);
                    change
                };
                tracing::info!(redis = %connect.describe(), "connected to Redis");
                if let Some(change) = change {
                    metrics_switch(&shared, change, true);
                }
                return;
            }
            Err(e) => {
                let failing_for = since.elapsed();
                let due = say.due(failing_for.as_nanos() as u64);
                match &e {
                    StoreError::Unreachable(_) if due => tracing::warn!(
                        error = %e,
                        redis = %connect.describe(),
                        attempts,
                        ?failing_for,
                        "Redis still unreachable; decisions by REDIS_FAILURE_MODE until it answers"
                    ),
                    StoreError::Unreachable(_) => {
                        tracing::debug!(error = %e, ?wait, "Redis still unreachable");
                    }
                    _ if due => tracing::error!(
                        error = %e,
                        redis = %connect.describe(),
                        attempts,
                        ?failing_for,
                        "REDIS REFUSES THIS SERVER (password, user or certificate): decisions by REDIS_FAILURE_MODE until the settings are fixed"
                    ),
                    _ => tracing::debug!(error = %e, ?wait, "Redis still refuses us"),
                }
                wait = (wait * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// Allow or deny every charge, charging nothing.
fn fixed<K>(charges: &[Charge<K>], now: Nanos, allowed: bool) -> Verdicts {
    charges
        .iter()
        .map(|c| {
            let fresh = limiter::evaluate(&c.params, None, now, c.hits).without_charge;
            Verdict {
                allowed,
                outlook: if allowed {
                    fresh
                } else {
                    Outlook {
                        remaining: 0,
                        reset_after: BREAKER_MAX.as_nanos() as Nanos,
                    }
                },
                charged: false,
                delay: 0,
            }
        })
        .collect()
}

impl<C: Connect> Backend for Guarded<C> {
    type Key = <C::Backend as Backend>::Key;
    const NAME: &'static str = <C::Backend as Backend>::NAME;

    fn key(&self, id: &CounterId<'_>) -> Self::Key {
        self.shared.connect.key(id)
    }

    async fn transact(&self, tx: Transaction<'_, Self::Key>) -> Result<Verdicts, StoreError> {
        let cache = self
            .shared
            .cache
            .as_ref()
            .filter(|_| tx.kind == Kind::Apply);
        if let Some(verdicts) = cache.and_then(|c| c.answer(tx.charges, tx.now)) {
            self.shared.metrics.over_limit_with_local_cache.inc();
            return Ok(verdicts);
        }
        // A call whose reply was lost on a cut connection is sent again by the backend itself
        // (once, recognised by Redis if it had landed), so one cut costs no failure-mode answer.
        if let Some(remote) = self.shared.remote.load_full()
            && (tx.kind == Kind::Apply || self.is_up())
        {
            if tx.kind == Kind::Apply && self.is_up() {
                self.settle_first(&remote, &tx).await;
            }
            if let Some(answer) = self.through(remote.transact(tx)).await {
                if let (Some(cache), Ok(verdicts)) = (cache, &answer) {
                    cache.learn(tx.charges, verdicts, tx.now);
                }
                return answer;
            }
        }
        self.fallback(tx)
    }

    async fn peek(&self, key: &Self::Key) -> Result<Option<State>, StoreError> {
        if let Some(remote) = self.shared.remote.load_full()
            && let Some(answer) = self.through(remote.peek(key)).await
        {
            return answer;
        }
        match self.shared.mode {
            FailureMode::Local => Ok(self.shared.local.peek_now(key.id())),
            _ => Err(StoreError::Unavailable("Redis is unreachable".into())),
        }
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    fn sweep(&self, now: Nanos) -> usize {
        self.shared.local.sweep(now)
    }
}
