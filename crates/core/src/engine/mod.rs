//! One ShouldRateLimit decision, transport-free: validate the request, match each descriptor
//! against the live policy snapshot, drop replaced limits, charge the store all-or-nothing, and
//! build the reference's response (statuses, overall code, optional headers), then, for leaky
//! buckets, wait for the request's turn before answering. The server's faces reach it through the
//! front door (`ratelimit-app`'s `front`: `Engine::decide`); replay through `Engine::decide_at`;
//! `/explain` through `Engine::explain`.

mod attribution;
mod concurrency;
mod counters;
mod explain;
mod ietf;
mod metadata;
mod observe;
mod outcome;
mod plan;
mod quota;
mod request;
mod response;
mod turn;

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use smallvec::SmallVec;

pub use attribution::Attribution;
pub use concurrency::{RELEASE_KEY, RELEASE_VALUE};
pub use request::{InvalidRequest, RequestBounds};
pub use response::{HeaderNames, ResponseHeaders};

use crate::clock::{Clock, Nanos};
use crate::limiter::{LimitDefaults, State};
use crate::metrics::{Metrics, PolicyMetrics};
use crate::overrides::Overrides;
use crate::policy::Policy;
use crate::store::{Backend, Charge, CounterId, CounterNames, Store, StoreError};

pub use counters::CounterLimit;

/// Server-wide behaviour, from settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// `SHADOW_MODE`: answer OK overall even when over the limit (statuses still tell the truth).
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is a quota descriptor.
    pub quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: fill the response's dynamic metadata as the reference does.
    pub dynamic_metadata: bool,
    /// `NEAR_LIMIT_RATIO`: the share of a limit past which a hit counts as near the limit.
    pub near_limit_ratio: f64,
    /// `--rate-limit-headers` (`LIMIT_RESPONSE_HEADERS_ENABLED` and the draft-03 header names).
    pub response_headers: ResponseHeaders,
    /// Algorithm and leaky-bucket max delay for limits that do not say, and for request-supplied
    /// limit overrides.
    pub defaults: LimitDefaults,
    pub bounds: RequestBounds,
    /// `MAX_WAITING_ANSWERS`: the most answers held for a leaky bucket's turn at once, across
    /// keys (each holds a few KB); one more is refused, its turns given back.
    pub max_waiting: usize,
}

/// [`EngineSettings::max_waiting`] by default: at about 4 KB each, 400 MB of waiting answers.
pub const MAX_WAITING_ANSWERS: usize = 100_000;

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            shadow_mode: false,
            quota_mode: false,
            dynamic_metadata: false,
            near_limit_ratio: 0.8,
            response_headers: ResponseHeaders::Off,
            defaults: LimitDefaults::default(),
            bounds: RequestBounds::default(),
            max_waiting: MAX_WAITING_ANSWERS,
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The answer would wait for its leaky-bucket turn, and `max_waiting` answers already do.
    #[error(
        "{0} answers already wait for their leaky-bucket turns, the most MAX_WAITING_ANSWERS allows: this one's turn was given back"
    )]
    Overloaded(usize),
}

/// A decision and the instant it was made at.
#[derive(Debug)]
pub struct Decision {
    /// The `now` the request's limits were evaluated at.
    pub now: Nanos,
    pub result: Result<RateLimitResponse, EngineError>,
}

/// The rules in force and their metric series, swapped together, and the overrides set at run
/// time on top of them (kept across reloads; a decision looks them up only when there are some).
struct Live {
    policy: Arc<Policy>,
    counters: Arc<PolicyMetrics>,
    overrides: Arc<Overrides>,
}

/// Whether a decision holds its answer until a leaky bucket's turn (serving) or not (replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turns {
    Wait,
    Skip,
}

/// The rate limiter: live policy + store + clock (+ metrics).
pub struct Engine<B> {
    live: ArcSwap<Live>,
    /// Held while a new `Live` is made from the current one (a reload, an override change), so
    /// that neither loses the other's change.
    swapping: Mutex<()>,
    store: Store<B>,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    metrics: Option<Arc<Metrics>>,
    /// With the quota API on a store of hashed keys: the name of each key charged, for lists.
    names: Option<Arc<CounterNames>>,
    /// Answers waiting for their leaky-bucket turns now (at most `settings.max_waiting`).
    waiting: turn::Waiting,
}

impl<B: Backend> Engine<B> {
    pub fn new(
        policy: Policy,
        store: Store<B>,
        clock: Arc<dyn Clock>,
        settings: EngineSettings,
    ) -> Self {
        Engine {
            live: ArcSwap::from_pointee(Live {
                policy: Arc::new(policy),
                counters: Arc::default(),
                overrides: Arc::default(),
            }),
            swapping: Mutex::new(()),
            store,
            clock,
            waiting: turn::Waiting::new(settings.max_waiting),
            settings,
            metrics: None,
            names: None,
        }
    }

    /// Notes the name of every key a decision charges (at most `cap`), so that the quota API
    /// can list a domain's counters on a store whose keys are hashes (memory).
    pub fn with_counter_names(mut self, cap: usize) -> Self {
        self.names = Some(Arc::new(CounterNames::new(cap)));
        self
    }

    /// The names noted, with [`Engine::with_counter_names`].
    pub fn counter_names(&self) -> Option<&Arc<CounterNames>> {
        self.names.as_ref()
    }

    /// Records per-rule and global metrics into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.waiting = turn::Waiting::new(self.settings.max_waiting)
            .with_gauge(metrics.waiting_answers.clone());
        self.metrics = Some(metrics);
        let policy = self.policy();
        self.install(policy);
        self
    }

    /// Replaces the live rules; requests in flight finish on the snapshot they started with.
    pub(crate) fn set_policy(&self, policy: Policy) {
        self.install(Arc::new(policy));
    }

    fn install(&self, policy: Arc<Policy>) {
        let _swapping = self.swapping.lock().unwrap_or_else(PoisonError::into_inner);
        let counters = self
            .metrics
            .as_ref()
            .map(|m| m.install(&policy))
            .unwrap_or_default();
        let overrides = self.live.load().overrides.clone();
        self.live.store(Arc::new(Live {
            policy,
            counters,
            overrides,
        }));
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.live.load().policy.clone()
    }

    /// The overrides in force (live or expired: a decision checks each one's expiry).
    pub fn overrides(&self) -> Arc<Overrides> {
        self.live.load().overrides.clone()
    }

    /// Changes the overrides: `change` gets the set in force and returns the new one, or `None`
    /// to keep it. Requests in flight finish on the set they started with. Returns whether it
    /// changed.
    pub fn change_overrides(&self, change: impl FnOnce(&Overrides) -> Option<Overrides>) -> bool {
        let _swapping = self.swapping.lock().unwrap_or_else(PoisonError::into_inner);
        let live = self.live.load_full();
        let Some(overrides) = change(&live.overrides) else {
            return false;
        };
        self.live.store(Arc::new(Live {
            policy: live.policy.clone(),
            counters: live.counters.clone(),
            overrides: Arc::new(overrides),
        }));
        true
    }

    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    pub fn store(&self) -> &Store<B> {
        &self.store
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// The stored state of a counter, charging nothing.
    async fn look(&self, id: &CounterId<'_>) -> Result<Option<State>, StoreError> {
        let key = self.store.key(id);
        self.store.peek(&key).await
    }

    /// The engine's clock reading (for `explain`).
    pub fn now(&self) -> crate::clock::Nanos {
        self.clock.now()
    }

    /// Decides one request.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, EngineError> {
        self.decide(request).await.result
    }

    /// Decides one request and says at which instant: the `now` its limits were evaluated at
    /// (read before validation, so a refused request has one too), for `serve --record`.
    pub async fn decide(&self, request: &RateLimitRequest) -> Decision {
        let now = self.clock.now();
        Decision {
            now,
            result: self.run(request, now, Turns::Wait, None).await,
        }
    }

    /// Decides one request at `now` (not the engine's clock), and says per descriptor which rule
    /// decided it and how (`attribution` is cleared, then gets one entry per descriptor). Leaky
    /// bucket turns are taken but not waited for: the answer comes at once. For `replay`, which
    /// runs recorded requests on their recorded times.
    pub async fn decide_at(
        &self,
        request: &RateLimitRequest,
        now: Nanos,
        attribution: &mut Vec<Attribution>,
    ) -> Result<RateLimitResponse, EngineError> {
        attribution.clear();
        self.run(request, now, Turns::Skip, Some(attribution)).await
    }

    /// Gives back the concurrency slots a request took (boxed, as the other concurrency steps of
    /// [`Engine::run`]).
    async fn give_back(
        &self,
        request: &RateLimitRequest,
        plans: &[plan::Plan<'_>],
        slots: &concurrency::Taken<'_, B::Key>,
        now: Nanos,
    ) {
        let metrics = self.metrics.as_deref();
        Box::pin(concurrency::give_back(
            &self.store,
            metrics,
            request,
            plans,
            slots,
            now,
        ))
        .await;
    }

    /// One decision at `now`; `attribution`: where to say which rule decided each descriptor.
    async fn run(
        &self,
        request: &RateLimitRequest,
        now: Nanos,
        turns: Turns,
        attribution: Option<&mut Vec<Attribution>>,
    ) -> Result<RateLimitResponse, EngineError> {
        self.settings.bounds.check(request)?;
        let live = self.live.load_full();
        let mut plans = plan::plan(&live.policy, &live.overrides, request, &self.settings, now)?;
        let metrics = self.metrics.as_deref();
        let slots = match plans
            .iter()
            .any(|p| matches!(p.kind, plan::Kind::Concurrency(_)))
        {
            // Boxed, as are the other concurrency steps below: their futures are several times
            // the size of the rest of this one, which every call would otherwise carry and copy
            // at each await of the layers above (docs/cost-per-decision.md "Who wakes whom, against
            // the baseline; the decision's future").
            true => Some(
                Box::pin(concurrency::run(
                    &self.store,
                    metrics,
                    request,
                    &mut plans,
                    now,
                ))
                .await?,
            ),
            false => None,
        };
        let blocked = slots.as_ref().is_some_and(|s| s.blocked);
        let mut charges: SmallVec<[Charge<B::Key>; 2]> = SmallVec::new();
        for (index, (descriptor, plan)) in request.descriptors.iter().zip(&plans).enumerate() {
            for limit in plan.limits() {
                let counter = plan::counter(
                    &request.domain,
                    &descriptor.entries[..],
                    plan.sharing(),
                    limit.slot,
                    &limit.params,
                );
                let key = self.store.key(&counter);
                if let Some(names) = &self.names {
                    names.note(&counter);
                }
                charges.push(Charge {
                    key,
                    params: limit.params,
                    hits: plan.hits,
                    enforced: !plan.shadow_mode,
                    quota: plan.quota.then_some(index as u32),
                });
            }
        }
        let verdicts = match blocked {
            // Denied for concurrency: the rate limits are told, not charged.
            true => Box::pin(concurrency::uncharged(&self.store, &charges, now)).await?,
            false => match self.store.apply(&charges, now).await {
                Ok(verdicts) => verdicts,
                Err(e) => {
                    if let Some(slots) = &slots {
                        self.give_back(request, &plans, slots, now).await;
                    }
                    return Err(e.into());
                }
            },
        };
        let tightest = response::tightest(&plans, &verdicts);
        let mut response = response::build(&plans, &tightest, &verdicts, &self.settings, now);
        if let Some(slots) = slots.as_ref().filter(|s| !s.is_empty())
            && response.overall_code == Code::OverLimit as i32
        {
            // Denied by a rate limit: the slots this request took go back at once (its
            // stream-done call will find none).
            self.give_back(request, &plans, slots, now).await;
        }
        if self.settings.dynamic_metadata {
            response.dynamic_metadata = Some(metadata::build(request, &plans, &response.statuses));
        }
        if let Some(metrics) = &self.metrics {
            observe::record(
                metrics,
                &live,
                request,
                &plans,
                &tightest,
                &response,
                &self.settings,
            );
        }
        if let Some(attribution) = attribution {
            attribution::attribute(attribution, &plans, &tightest, &self.settings);
        }
        if !self.settings.shadow_mode && turns == Turns::Wait {
            turn::wait(
                &self.store,
                &*self.clock,
                &self.waiting,
                now,
                &charges,
                &verdicts,
            )
            .await
            .map_err(|turn::Full(held)| EngineError::Overloaded(held))?;
        }
        Ok(response)
    }
}

/// Where rules go in: what a reload (from files, or any other source) needs of the engine.
pub trait Rules: Send + Sync {
    /// The rules in force.
    fn policy(&self) -> Arc<Policy>;
    /// Replaces them; requests in flight finish on the snapshot they started with.
    fn set_policy(&self, policy: Policy);
}

impl<B: Backend> Rules for Engine<B> {
    fn policy(&self) -> Arc<Policy> {
        Engine::policy(self)
    }

    fn set_policy(&self, policy: Policy) {
        Engine::set_policy(self, policy);
    }
}

#[cfg(test)]
mod concurrency_tests;
#[cfg(test)]
mod tests;
