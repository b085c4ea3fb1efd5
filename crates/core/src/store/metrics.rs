//! The store's own Prometheus series (Redis calls, errors by kind, call latency, up/down, the
//! breaker, failure-mode decisions, local-cache hits). Built unregistered, so a store works
//! without a registry (tests, tools); `crate::metrics` registers the server's set.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, core::Collector,
};

/// Kinds of failed Redis calls (`ratelimit_redis_errors{kind}`).
pub const ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "conflict_exhausted"];

/// Outcomes of connecting to Redis (`ratelimit_redis_connects{outcome}`): connected; nobody
/// answered (refused, no answer in time); Redis or its TLS refused us (password, certificate).
pub const CONNECT_OUTCOMES: [&str; 3] = ["connected", "unreachable", "refused"];

/// Failure modes, as labels of `ratelimit_store_failure_mode_decisions{mode}`.
pub const MODES: [&str; 4] = ["local", "allow", "deny", "error"];

#[derive(Clone)]
pub struct StoreMetrics {
    pub redis_calls: IntCounter,
    pub redis_errors: IntCounterVec,
    pub redis_latency: Histogram,
    pub store_up: IntGauge,
    pub breaker_state: IntGauge,
    pub switches: IntCounterVec,
    pub failure_mode_decisions: IntCounterVec,
    /// `ratelimit_store_errors`: store operations that failed (each failed decision or peek).
    pub store_errors: IntCounter,
    pub over_limit_with_local_cache: IntCounter,
    /// Requests decided by one Redis call (one in flight per key and instance: the rest wait).
    pub redis_batch_requests: Histogram,
    /// How long a request waited for the call in flight on one of its keys.
    pub redis_queue_wait: Histogram,
    /// Compare-and-set calls that found a key changed by another instance (each costs a retry).
    pub redis_conflicts: IntCounter,
    /// Decisions that did not finish within their budget while Redis was answering: answered
    /// UNAVAILABLE, never by the failure mode.
    pub redis_over_budget: IntCounter,
    /// Attempts to connect, at start-up and in the background while disconnected, by outcome.
    pub redis_connects: IntCounterVec,
    /// Redis calls slower than the Envoy filter's default timeout (20 ms), which Envoy would
    /// have given up on.
    pub redis_slow_calls: IntCounter,
    /// Keys the local failure mode took over from the values last seen in Redis.
    pub outage_keys_handed_over: IntCounter,
    /// Hits admitted by the local failure mode and written back into Redis when it answered.
    pub outage_hits_written_back: IntCounter,
    /// Live instances on the shared Redis, as the last heartbeat counted them.
    pub redis_instances: IntGauge,
    /// Decisions sent to Redis a second time after a failed call while Redis answered others.
    pub redis_retries: IntCounter,
}

fn counter_vec(name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric definition");
    // Every label value exists from the start, so dashboards see zeros, not gaps.
    for v in values {
        c.with_label_values(&[v]);
    }
    c
}

impl StoreMetrics {
    /// A set not registered anywhere.
    pub fn unregistered() -> StoreMetrics {
        StoreMetrics {
            redis_calls: IntCounter::new("ratelimit_redis_calls", "Calls sent to Redis")
                .expect("valid metric definition"),
            redis_errors: counter_vec(
                "ratelimit_redis_errors",
                "Failed Redis calls by kind: timeout (no answer within REDIS_TIMEOUT), connection, script (Redis answered with an error), conflict_exhausted (a decision gave up after its compare-and-set retries)",
                "kind",
                &ERROR_KINDS,
            ),
            redis_latency: Histogram::with_opts(
                HistogramOpts::new("ratelimit_redis_call_seconds", "Redis call latency").buckets(
                    vec![
                        0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                        0.05, 0.1, 0.25, 0.5, 1.0,
                    ],
                ),
            )
            .expect("valid metric definition"),
            store_up: IntGauge::new(
                "ratelimit_store_up",
                "1 while decisions go to the configured store; 0 while Redis is unreachable and REDIS_FAILURE_MODE decides",
            )
            .expect("valid metric definition"),
            breaker_state: IntGauge::new(
                "ratelimit_redis_breaker_state",
                "Circuit breaker in front of Redis: 0 closed, 1 open, 2 half-open (probing)",
            )
            .expect("valid metric definition"),
            switches: counter_vec(
                "ratelimit_store_switches",
                "Switches of the decisions between Redis (to=redis) and REDIS_FAILURE_MODE (to=failure_mode)",
                "to",
                &["redis", "failure_mode"],
            ),
            failure_mode_decisions: counter_vec(
                "ratelimit_store_failure_mode_decisions",
                "Requests decided by REDIS_FAILURE_MODE because Redis was unreachable",
                "mode",
                &MODES,
            ),
            store_errors: IntCounter::new(
                "ratelimit_store_errors",
                "Store operations that failed (a Redis decision or read that did not complete)",
            )
            .expect("valid metric definition"),
            redis_batch_requests: Histogram::with_opts(
                HistogramOpts::new(
                    "ratelimit_redis_batch_requests",
                    "Requests decided by one Redis call: requests on a key whose call is in flight wait and go together in the next one",
                )
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]),
            )
            .expect("valid metric definition"),
            redis_queue_wait: Histogram::with_opts(
                HistogramOpts::new(
                    "ratelimit_redis_queue_wait_seconds",
                    "Time a request waited for the Redis call in flight on one of its keys before its own call (0 when its keys were idle)",
                )
                .buckets(vec![
                    0.0, 0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                    0.05, 0.1, 0.25,
                ]),
            )
            .expect("valid metric definition"),
            redis_conflicts: IntCounter::new(
                "ratelimit_redis_conflicts",
                "Compare-and-set calls that found a key changed by another instance and were decided again",
            )
            .expect("valid metric definition"),
            redis_over_budget: IntCounter::new(
                "ratelimit_redis_decisions_over_budget",
                "Decisions that did not finish within 64 x REDIS_TIMEOUT (as many calls as a decision may make) while Redis was answering: answered UNAVAILABLE (not admitted), never by REDIS_FAILURE_MODE",
            )
            .expect("valid metric definition"),
            redis_connects: counter_vec(
                "ratelimit_redis_connects",
                "Attempts to connect to Redis (at start-up and in the background while disconnected) by outcome: connected, unreachable (refused or no answer in time), refused (Redis or TLS refused us: password, certificate)",
                "outcome",
                &CONNECT_OUTCOMES,
            ),
            redis_slow_calls: IntCounter::new(
                "ratelimit_redis_slow_calls",
                "Redis calls that took longer than Envoy's default ratelimit filter timeout (20 ms): behind such an Envoy the call would have failed",
            )
            .expect("valid metric definition"),
            outage_keys_handed_over: IntCounter::new(
                "ratelimit_outage_keys_handed_over",
                "Keys REDIS_FAILURE_MODE=local started deciding from the value last seen in Redis, keeping this instance's share of what was left (REDIS_FAILURE_LOCAL_SHARE)",
            )
            .expect("valid metric definition"),
            outage_hits_written_back: IntCounter::new(
                "ratelimit_outage_hits_written_back",
                "Hits admitted by REDIS_FAILURE_MODE=local during an outage and charged to Redis once it answered again (at most what each limit had left)",
            )
            .expect("valid metric definition"),
            redis_retries: IntCounter::new(
                "ratelimit_redis_retries",
                "Decisions whose Redis call failed (a cut connection, one slow call) while Redis answered others, sent once more before REDIS_FAILURE_MODE would answer",
            )
            .expect("valid metric definition"),
            redis_instances: IntGauge::new(
                "ratelimit_redis_instances",
                "Server instances sharing this Redis whose beat is under 5 s old, by its registry (the local failure mode's share is 1 / this with REDIS_FAILURE_LOCAL_SHARE=auto)",
            )
            .expect("valid metric definition"),
            over_limit_with_local_cache: IntCounter::new(
                "ratelimit_over_limit_with_local_cache",
                "Requests answered OVER_LIMIT from the local over-limit cache, without a Redis call",
            )
            .expect("valid metric definition"),
        }
    }

    /// Registers every series in `registry`.
    pub fn register(&self, registry: &Registry) {
        let all: [Box<dyn Collector>; 19] = [
            Box::new(self.redis_retries.clone()),
            Box::new(self.outage_keys_handed_over.clone()),
            Box::new(self.outage_hits_written_back.clone()),
            Box::new(self.redis_instances.clone()),
            Box::new(self.redis_connects.clone()),
            Box::new(self.redis_slow_calls.clone()),
            Box::new(self.redis_batch_requests.clone()),
            Box::new(self.redis_queue_wait.clone()),
            Box::new(self.redis_conflicts.clone()),
            Box::new(self.redis_over_budget.clone()),
            Box::new(self.redis_calls.clone()),
            Box::new(self.redis_errors.clone()),
            Box::new(self.redis_latency.clone()),
            Box::new(self.store_up.clone()),
            Box::new(self.breaker_state.clone()),
            Box::new(self.switches.clone()),
            Box::new(self.failure_mode_decisions.clone()),
            Box::new(self.store_errors.clone()),
            Box::new(self.over_limit_with_local_cache.clone()),
        ];
        for c in all {
            registry.register(c).expect("metric registered once");
        }
    }

    /// Counts one failed Redis call of `kind` (one of `ERROR_KINDS`).
    pub fn error(&self, kind: &str) {
        self.redis_errors.with_label_values(&[kind]).inc();
    }
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics::unregistered()
    }
}
