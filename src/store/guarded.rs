//! The Redis store as the server runs it: every decision bounded in time, a circuit breaker in
//! front of Redis ([`super::breaker`]), and while Redis is unreachable the operator's
//! `REDIS_FAILURE_MODE` decides (a per-instance memory store with the same rules, allow, deny, or
//! a gRPC error). A Redis that is unreachable at start-up does not stop the server: it starts in
//! the failure mode and keeps connecting in the background with backoff. Each switch between
//! Redis and the failure mode is logged once, counted and shown on `ratelimit_store_up`.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::clock::monotonic;

use super::breaker::{Breaker, Change, Permit};
use super::over_limit_cache::OverLimitCache;
use super::{
    Charge, MemoryStore, RedisConfig, RedisStore, Store, StoreError, StoreMetrics, TextKey,
    TextKeyBuilder, Verdict, Verdicts,
};
use crate::clock::Nanos;
use crate::limiter::{self, LimitParams, Outlook, State};

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

/// The longest a decision may take: as many calls as it may make under contention (its own and
/// the one ahead of it on its keys), each bounded by `REDIS_TIMEOUT`.
pub fn decision_deadline(timeout: Duration) -> Duration {
    timeout * (2 * super::redis::MAX_ATTEMPTS as u32)
}

struct Shared {
    /// None until the first connection succeeds.
    redis: ArcSwapOption<RedisStore>,
    keys: TextKeyBuilder,
    breaker: Mutex<Breaker>,
    local: MemoryStore,
    mode: FailureMode,
    /// Bound on one whole decision, a safety net: its Redis calls are each bounded by
    /// `REDIS_TIMEOUT` and so are its attempts, so a decision ends well before it.
    deadline: Duration,
    metrics: StoreMetrics,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: keys known over their limit, answered without a call.
    cache: Option<OverLimitCache>,
}

/// The Redis store behind a breaker and a failure mode (cheap to clone).
#[derive(Clone)]
pub struct GuardedRedis {
    shared: Arc<Shared>,
}

impl GuardedRedis {
    /// Connects to Redis. If nobody answers, starts anyway in the failure mode (with a loud
    /// warning) and keeps connecting in the background; a Redis that answers with a refusal
    /// (password, TLS certificate) is a start-up error.
    pub async fn start(
        config: &RedisConfig,
        mode: FailureMode,
        local_max_keys: usize,
        local_cache_bytes: usize,
        metrics: StoreMetrics,
    ) -> Result<GuardedRedis, StoreError> {
        let probe_timeout = config.timeout * 2 + Duration::from_millis(50);
        let connected = match RedisStore::connect_observed(config, metrics.clone()).await {
            Ok(store) => Some(store),
            Err(StoreError::Unreachable(e)) => {
                tracing::warn!(
                    error = %e,
                    redis = %config.describe(),
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
        let shared = Arc::new(Shared {
            redis: ArcSwapOption::new(connected.map(Arc::new)),
            keys: TextKeyBuilder::new(config.prefix.clone()),
            breaker: Mutex::new(breaker),
            local: MemoryStore::new(local_max_keys),
            mode,
            deadline: decision_deadline(config.timeout),
            metrics,
            cache: OverLimitCache::new(local_cache_bytes),
        });
        if !up {
            metrics_switch(&shared, Change::Down, false);
            tokio::spawn(reconnect(Arc::downgrade(&shared), config.clone()));
        }
        Ok(GuardedRedis { shared })
    }

    /// The Redis store, once connected (for tests and tools).
    pub fn redis(&self) -> Option<Arc<RedisStore>> {
        self.shared.redis.load_full()
    }

    /// Whether decisions go to Redis now.
    pub fn is_up(&self) -> bool {
        self.breaker().is_up() && self.shared.redis.load().is_some()
    }

    /// Whether Redis answered any call at or after `since`.
    fn answered_since(&self, since: std::time::Instant) -> bool {
        self.shared
            .redis
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
        let change = {
            let mut b = self.breaker();
            let change = b.record(permit, ok, monotonic());
            self.shared.metrics.breaker_state.set(b.state() as i64);
            change
        };
        if let Some(change) = change {
            metrics_switch(&self.shared, change, true);
            if change == Change::Down {
                tokio::spawn(probe(Arc::downgrade(&self.shared)));
            }
        }
    }

    /// The answer while Redis cannot decide.
    fn fallback(&self, charges: &[Charge<TextKey>], now: Nanos) -> Result<Verdicts, StoreError> {
        let mode = self.shared.mode;
        self.shared
            .metrics
            .failure_mode_decisions
            .with_label_values(&[mode.name()])
            .inc();
        match mode {
            FailureMode::Local => Ok(self.shared.local.apply_sync(charges, now)),
            FailureMode::Allow => Ok(fixed(charges, now, true)),
            FailureMode::Deny => Ok(fixed(charges, now, false)),
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
        let permit = self.permit();
        if permit == Permit::Reject {
            return None;
        }
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
fn metrics_switch(shared: &Shared, change: Change, log: bool) {
    let m = &shared.metrics;
    match change {
        Change::Down => {
            m.store_up.set(0);
            m.switches.with_label_values(&["failure_mode"]).inc();
            if log {
                tracing::warn!(
                    mode = shared.mode.name(),
                    "Redis stopped answering: decisions by REDIS_FAILURE_MODE={} until it answers again",
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
            tracing::warn!("Redis answers again: decisions are back on Redis");
        }
    }
}

/// While the breaker is open, probes Redis with `PING` whenever the breaker allows a probe, so
/// decisions go back to Redis (and `ratelimit_store_up` says so) within a second of it answering,
/// with or without traffic. Ends once the breaker closes or the store is dropped.
async fn probe(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(PROBE_TICK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let store = GuardedRedis { shared };
        let Some(redis) = store.shared.redis.load_full() else {
            continue;
        };
        match store.permit() {
            Permit::Call => return,
            Permit::Reject => {}
            Permit::Probe => {
                let ok = redis.ping().await.is_ok();
                store.record(Permit::Probe, ok);
                if ok {
                    return;
                }
            }
        }
    }
}

/// How often the prober looks at the breaker.
const PROBE_TICK: Duration = Duration::from_millis(20);

/// Connects in the background with backoff until it succeeds or the store is dropped.
async fn reconnect(shared: Weak<Shared>, config: RedisConfig) {
    let mut wait = RECONNECT_BASE;
    loop {
        tokio::time::sleep(wait).await;
        let Some(metrics) = shared.upgrade().map(|s| s.metrics.clone()) else {
            return;
        };
        match RedisStore::connect_observed(&config, metrics).await {
            Ok(store) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.redis.store(Some(Arc::new(store)));
                let change = {
                    let mut b = shared
                        .breaker
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let change = b.connected();
                    shared.metrics.breaker_state.set(b.state() as i64);
                    change
                };
                tracing::info!(redis = %config.describe(), "connected to Redis");
                if let Some(change) = change {
                    metrics_switch(&shared, change, true);
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, ?wait, "Redis still unreachable");
                wait = (wait * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// Allow or deny every charge, charging nothing.
fn fixed(charges: &[Charge<TextKey>], now: Nanos, allowed: bool) -> Verdicts {
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

impl Store for GuardedRedis {
    type Key = TextKey;

    fn key<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> TextKey {
        self.shared.keys.key(domain, entries, slot, params)
    }

    async fn apply(&self, charges: &[Charge<TextKey>], now: Nanos) -> Result<Verdicts, StoreError> {
        let cache = self.shared.cache.as_ref();
        if let Some(verdicts) = cache.and_then(|c| c.answer(charges, now)) {
            self.shared.metrics.over_limit_with_local_cache.inc();
            return Ok(verdicts);
        }
        if let Some(redis) = self.shared.redis.load_full()
            && let Some(answer) = self.through(redis.apply_text(charges, now)).await
        {
            if let (Some(cache), Ok(verdicts)) = (cache, &answer) {
                cache.learn(charges, verdicts, now);
            }
            return answer;
        }
        self.fallback(charges, now)
    }

    fn refund(&self, charges: &[Charge<TextKey>], now: Nanos) {
        match self.shared.redis.load_full() {
            Some(redis) if self.is_up() => redis.refund(charges, now),
            _ => self.shared.local.refund_sync(charges, now),
        }
    }

    async fn peek(&self, key: &TextKey) -> Result<Option<State>, StoreError> {
        if let Some(redis) = self.shared.redis.load_full()
            && let Some(answer) = self.through(redis.peek(key)).await
        {
            return answer;
        }
        match self.shared.mode {
            FailureMode::Local => Ok(self.shared.local.peek_now(super::MemoryKey::id(key))),
            _ => Err(StoreError::Unavailable("Redis is unreachable".into())),
        }
    }

    fn sweep(&self, now: Nanos) -> usize {
        self.shared.local.sweep(now)
    }
}
