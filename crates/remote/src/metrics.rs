//! The remote store's Prometheus series: the backend's calls, errors by kind and latency, up/down,
//! the breaker, failure-mode decisions, the outage's hand-over and write-back, local-cache hits.
//! Named after the backend (`ratelimit_redis_calls` for `redis`: see [`RemoteName`]), so the
//! series users scrape keep their names. Built unregistered, so a store works without a registry
//! (tests, tools); the server registers its set with [`RemoteMetrics::register`].

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, core::Collector,
};

use crate::mode::FailureMode;
use crate::names::RemoteName;

/// Kinds of failed calls (`ratelimit_<name>_errors{kind}`).
pub(crate) const ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "conflict_exhausted"];

/// Outcomes of connecting (`ratelimit_<name>_connects{outcome}`): connected; nobody answered
/// (refused, no answer in time); the backend or its TLS refused us (password, certificate).
pub(crate) const CONNECT_OUTCOMES: [&str; 3] = ["connected", "unreachable", "refused"];

#[derive(Clone)]
pub struct RemoteMetrics {
    /// The backend's name in series and labels (`redis`).
    name: &'static str,
    pub calls: IntCounter,
    pub errors: IntCounterVec,
    pub latency: Histogram,
    pub store_up: IntGauge,
    pub breaker_state: IntGauge,
    pub switches: IntCounterVec,
    pub failure_mode_decisions: IntCounterVec,
    /// `ratelimit_store_errors`: store operations that failed (each failed decision or peek).
    pub store_errors: IntCounter,
    pub over_limit_with_local_cache: IntCounter,
    /// Requests decided by one call (one in flight per key and instance: the rest wait).
    pub batch_requests: Histogram,
    /// How long a request waited for the call in flight on one of its keys.
    pub queue_wait: Histogram,
    /// Compare-and-set calls that found a key changed by another instance (each costs a retry).
    pub conflicts: IntCounter,
    /// Decisions that did not finish within their budget while the backend was answering:
    /// answered UNAVAILABLE, never by the failure mode.
    pub over_budget: IntCounter,
    /// Attempts to connect, at start-up and in the background while disconnected, by outcome.
    pub connects: IntCounterVec,
    /// Calls slower than the Envoy filter's default timeout (20 ms), which Envoy would have
    /// given up on.
    pub slow_calls: IntCounter,
    /// Keys the local failure mode took over from the values last seen in the backend.
    pub outage_keys_handed_over: IntCounter,
    /// Hits admitted by the local failure mode and written back when the backend answered.
    pub outage_hits_written_back: IntCounter,
    /// Live instances sharing the backend, as the last heartbeat counted them.
    pub instances: IntGauge,
    /// Decisions sent a second time after a failed call while the backend answered others.
    pub retries: IntCounter,
    /// Shards (cluster masters) whose own breaker is open: their keys go to the failure mode.
    pub shards_down: IntGauge,
    /// Switches of one shard's keys between the backend and the failure mode.
    pub shard_switches: IntCounterVec,
    /// Decisions the failure mode answered because their shard's breaker was open (no call).
    pub shard_down_decisions: IntCounter,
    /// Decisions the local failure mode answered, though the backend answers, because one of
    /// their keys still had outage hits not written back.
    pub awaiting_write_back: IntCounter,
}

const CALLS: &str = "Calls sent to {Name}";
const ERRORS: &str = "Failed {Name} calls by kind: timeout (no answer within {NAME}_TIMEOUT), connection, script ({Name} answered with an error), conflict_exhausted (a decision gave up after its compare-and-set retries)";
const LATENCY: &str = "{Name} call latency";
const STORE_UP: &str = "1 while decisions go to the configured store; 0 while {Name} is unreachable and {NAME}_FAILURE_MODE decides";
const BREAKER: &str = "Circuit breaker in front of {Name}: 0 closed, 1 open, 2 half-open (probing)";
const SWITCHES: &str = "Switches of the decisions between {Name} (to={name}) and {NAME}_FAILURE_MODE (to=failure_mode)";
const FAILURE_MODE: &str = "Requests decided by {NAME}_FAILURE_MODE because {Name} was unreachable";
const STORE_ERRORS: &str =
    "Store operations that failed (a {Name} decision or read that did not complete)";
const BATCH: &str = "Requests decided by one {Name} call: requests on a key whose call is in flight wait and go together in the next one";
const QUEUE_WAIT: &str = "Time a request waited for the {Name} call in flight on one of its keys before its own call (0 when its keys were idle)";
const CONFLICTS: &str =
    "Compare-and-set calls that found a key changed by another instance and were decided again";
const OVER_BUDGET: &str = "Decisions that did not finish within 64 x {NAME}_TIMEOUT (as many calls as a decision may make) while {Name} was answering: answered UNAVAILABLE (not admitted), never by {NAME}_FAILURE_MODE";
const CONNECTS: &str = "Attempts to connect to {Name} (at start-up and in the background while disconnected) by outcome: connected, unreachable (refused or no answer in time), refused ({Name} or TLS refused us: password, certificate)";
const SLOW: &str = "{Name} calls that took longer than Envoy's default ratelimit filter timeout (20 ms): behind such an Envoy the call would have failed";
const HANDED_OVER: &str = "Keys {NAME}_FAILURE_MODE=local started deciding from the value last seen in {Name}, keeping this instance's share of what was left ({NAME}_FAILURE_LOCAL_SHARE)";
const WRITTEN_BACK: &str = "Hits admitted by {NAME}_FAILURE_MODE=local during an outage and charged to {Name} once it answered again (at most what each limit had left)";
const RETRIES: &str = "Decisions whose {Name} call failed (a cut connection, one slow call) while {Name} answered others, sent once more before {NAME}_FAILURE_MODE would answer";
const INSTANCES: &str = "Server instances sharing this {Name} whose beat is under 5 s old, by its registry (the local failure mode's share is 1 / this with {NAME}_FAILURE_LOCAL_SHARE=auto)";
const SHARDS_DOWN: &str = "{Name} Cluster masters not answering while the others do: their keys are decided by {NAME}_FAILURE_MODE (a breaker per master), the other masters' keys stay on {Name}";
const SHARD_SWITCHES: &str = "Switches of one {Name} Cluster master's keys between {Name} (to={name}) and {NAME}_FAILURE_MODE (to=failure_mode)";
const SHARD_DOWN_DECISIONS: &str = "Requests decided by {NAME}_FAILURE_MODE without a call because their {Name} Cluster master's breaker was open";
const AWAITING_WRITE_BACK: &str = "Requests decided by {NAME}_FAILURE_MODE=local though {Name} answers, because one of their keys still had hits of the outage not written back into {Name} (decided within this instance's share until they are)";
const CACHE: &str =
    "Requests answered OVER_LIMIT from the local over-limit cache, without a {Name} call";

const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
const QUEUE_WAIT_BUCKETS: [f64; 13] = [
    0.0, 0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// Builds series whose names and help texts are templates filled with one backend's names.
struct Series(RemoteName);

impl Series {
    fn counter(&self, name: &str, help: &str) -> IntCounter {
        IntCounter::new(self.0.fill(name), self.0.fill(help)).expect("valid metric definition")
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        IntGauge::new(self.0.fill(name), self.0.fill(help)).expect("valid metric definition")
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(self.0.fill(name), self.0.fill(help));
        Histogram::with_opts(opts.buckets(buckets.to_vec())).expect("valid metric definition")
    }

    /// Every label value exists from the start, so dashboards see zeros, not gaps.
    fn counter_vec(&self, name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
        let opts = Opts::new(self.0.fill(name), self.0.fill(help));
        let c = IntCounterVec::new(opts, &[label]).expect("valid metric definition");
        for v in values {
            c.with_label_values(&[&self.0.fill(v)]);
        }
        c
    }
}

impl RemoteMetrics {
    /// A set not registered anywhere, named after the backend called `name` (`Backend::NAME`).
    pub fn unregistered(name: &'static str) -> RemoteMetrics {
        let s = Series(RemoteName::of(name));
        let modes = FailureMode::ALL.map(FailureMode::name);
        RemoteMetrics {
            name,
            calls: s.counter("ratelimit_{name}_calls", CALLS),
            errors: s.counter_vec("ratelimit_{name}_errors", ERRORS, "kind", &ERROR_KINDS),
            latency: s.histogram("ratelimit_{name}_call_seconds", LATENCY, &LATENCY_BUCKETS),
            store_up: s.gauge("ratelimit_store_up", STORE_UP),
            breaker_state: s.gauge("ratelimit_{name}_breaker_state", BREAKER),
            switches: s.counter_vec(
                "ratelimit_store_switches",
                SWITCHES,
                "to",
                &["{name}", "failure_mode"],
            ),
            failure_mode_decisions: s.counter_vec(
                "ratelimit_store_failure_mode_decisions",
                FAILURE_MODE,
                "mode",
                &modes,
            ),
            store_errors: s.counter("ratelimit_store_errors", STORE_ERRORS),
            batch_requests: s.histogram("ratelimit_{name}_batch_requests", BATCH, &BATCH_BUCKETS),
            queue_wait: s.histogram(
                "ratelimit_{name}_queue_wait_seconds",
                QUEUE_WAIT,
                &QUEUE_WAIT_BUCKETS,
            ),
            conflicts: s.counter("ratelimit_{name}_conflicts", CONFLICTS),
            over_budget: s.counter("ratelimit_{name}_decisions_over_budget", OVER_BUDGET),
            connects: s.counter_vec(
                "ratelimit_{name}_connects",
                CONNECTS,
                "outcome",
                &CONNECT_OUTCOMES,
            ),
            slow_calls: s.counter("ratelimit_{name}_slow_calls", SLOW),
            outage_keys_handed_over: s.counter("ratelimit_outage_keys_handed_over", HANDED_OVER),
            outage_hits_written_back: s.counter("ratelimit_outage_hits_written_back", WRITTEN_BACK),
            retries: s.counter("ratelimit_{name}_retries", RETRIES),
            instances: s.gauge("ratelimit_{name}_instances", INSTANCES),
            shards_down: s.gauge("ratelimit_{name}_masters_down", SHARDS_DOWN),
            shard_switches: s.counter_vec(
                "ratelimit_{name}_master_switches",
                SHARD_SWITCHES,
                "to",
                &["{name}", "failure_mode"],
            ),
            shard_down_decisions: s.counter(
                "ratelimit_{name}_master_down_decisions",
                SHARD_DOWN_DECISIONS,
            ),
            awaiting_write_back: s.counter(
                "ratelimit_outage_decisions_awaiting_write_back",
                AWAITING_WRITE_BACK,
            ),
            over_limit_with_local_cache: s.counter("ratelimit_over_limit_with_local_cache", CACHE),
        }
    }

    /// Registers every series in `registry`.
    pub fn register(&self, registry: &Registry) {
        let all: [Box<dyn Collector>; 23] = [
            Box::new(self.shard_down_decisions.clone()),
            Box::new(self.awaiting_write_back.clone()),
            Box::new(self.shards_down.clone()),
            Box::new(self.shard_switches.clone()),
            Box::new(self.retries.clone()),
            Box::new(self.outage_keys_handed_over.clone()),
            Box::new(self.outage_hits_written_back.clone()),
            Box::new(self.instances.clone()),
            Box::new(self.connects.clone()),
            Box::new(self.slow_calls.clone()),
            Box::new(self.batch_requests.clone()),
            Box::new(self.queue_wait.clone()),
            Box::new(self.conflicts.clone()),
            Box::new(self.over_budget.clone()),
            Box::new(self.calls.clone()),
            Box::new(self.errors.clone()),
            Box::new(self.latency.clone()),
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

    /// Counts one failed call of `kind` (one of `ERROR_KINDS`).
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    /// Counts one switch of the decisions: to the backend (`to_remote`) or to the failure mode.
    pub fn switched(&self, to_remote: bool) {
        let to = if to_remote { self.name } else { "failure_mode" };
        self.switches.with_label_values(&[to]).inc();
    }

    /// Switches to the failure mode so far.
    pub fn switches_to_failure_mode(&self) -> u64 {
        self.switches.with_label_values(&["failure_mode"]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keep_the_names_users_scrape() {
        let registry = Registry::new();
        RemoteMetrics::unregistered("redis").register(&registry);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        for expected in [
            "ratelimit_redis_calls",
            "ratelimit_redis_errors",
            "ratelimit_redis_call_seconds",
            "ratelimit_redis_breaker_state",
            "ratelimit_redis_decisions_over_budget",
            "ratelimit_store_up",
            "ratelimit_store_switches",
            "ratelimit_outage_hits_written_back",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
    }
}
