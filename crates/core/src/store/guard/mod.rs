//! A remote backend as the server runs it ([`Guarded`]): every decision bounded in time, a circuit
//! breaker in front of it ([`breaker`]), and while it is unreachable the operator's
//! `REDIS_FAILURE_MODE` decides (a per-instance memory backend with the same rules, allow, deny,
//! or a gRPC error). A backend unreachable at start-up does not stop the server: it starts in the
//! failure mode and keeps connecting in the background with backoff. Each switch between the
//! backend and the failure mode is logged once, counted and shown on `ratelimit_store_up`. Any
//! backend that implements [`Remote`] (and says how to reach it, [`Connect`]) can be guarded.

pub mod breaker;
mod every;
mod over_limit_cache;

pub use every::Every;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::clock::monotonic;

use breaker::{Breaker, Change, Permit};
use over_limit_cache::OverLimitCache;

use super::memory::{MemoryBackend, MemoryKey};
use super::transaction::Kind;
use super::{
    Backend, Charge, CounterId, StoreError, StoreMetrics, StoreStats, Transaction, Verdict,
    Verdicts,
};
use crate::clock::Nanos;
use crate::limiter::{self, Outlook, State};

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
        };
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
        });
        if !up {
            metrics_switch(&shared, Change::Down, false);
            tokio::spawn(reconnect(Arc::downgrade(&shared)));
        }
        Ok(Guarded { shared })
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
            FailureMode::Local => Ok(self.shared.local.run(tx)),
            FailureMode::Allow => Ok(fixed(tx.charges, tx.now, true)),
            FailureMode::Deny => Ok(fixed(tx.charges, tx.now, false)),
            FailureMode::Error => Err(StoreError::Unavailable(
                "Redis is unreachable (REDIS_FAILURE_MODE=error)".into(),
            )),
        }
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

/// Counts, logs and shows one switch.
fn metrics_switch<C: Connect>(shared: &Shared<C>, change: Change, log: bool) {
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

/// Failures came right after an answer (a dropped connection, or the start of an outage): once
/// [`Breaker::QUIET`] has passed, a `PING` tells which, so the breaker opens on a dead Redis even
/// if no more requests come to fail.
async fn check_again<C: Connect>(shared: Weak<Shared<C>>) {
    tokio::time::sleep(Breaker::QUIET).await;
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
        if let Some(remote) = self.shared.remote.load_full()
            && (tx.kind == Kind::Apply || self.is_up())
            && let Some(answer) = self.through(remote.transact(tx)).await
        {
            if let (Some(cache), Ok(verdicts)) = (cache, &answer) {
                cache.learn(tx.charges, verdicts, tx.now);
            }
            return answer;
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
