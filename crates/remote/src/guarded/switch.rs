//! A switch of the decisions between the remote backend and the failure mode, counted, shown on
//! `ratelimit_store_up` and logged at most once per `SWITCH_LOG_EVERY` each way; and connection
//! attempts counted by outcome.

use std::sync::Arc;

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::StoreError;

use super::{Shared, tasks};
use crate::breaker::Change;
use crate::metrics::RemoteMetrics;
use crate::mode::FailureMode;
use crate::remote::Connect;

/// Counts, logs and shows one switch; back on the remote backend, writes what the local failure
/// mode admitted into it.
pub(super) fn switched<C: Connect>(shared: &Arc<Shared<C>>, change: Change, log: bool) {
    let m = &shared.metrics;
    let name = &shared.name;
    let now = monotonic()
        .saturating_duration_since(shared.epoch)
        .as_nanos() as u64;
    match change {
        Change::Down => {
            m.store_up.set(0);
            m.switched(false);
            let last_error = shared.last_error();
            if log && shared.down_log.due(now) {
                tracing::warn!(
                    mode = shared.mode.name(),
                    switches = m.switches_to_failure_mode(),
                    last_error = last_error.as_deref().unwrap_or("none: no answer"),
                    "{} stopped answering, or refuses every call (last_error says which): decisions by {}_FAILURE_MODE={} until it takes them again (said at most every 10 s; ratelimit_store_switches counts each switch)",
                    name.title,
                    name.upper,
                    shared.mode.name()
                );
            }
        }
        Change::Up => {
            shared.forget_last_error();
            // The backend may have lost counts while away (a restart without persistence).
            if let Some(cache) = &shared.cache {
                cache.clear();
            }
            m.store_up.set(1);
            m.switched(true);
            if shared.mode == FailureMode::Local {
                tokio::spawn(tasks::write_back(Arc::downgrade(shared)));
            }
            if shared.up_log.due(now) {
                tracing::warn!(
                    "{} answers again: decisions are back on {}",
                    name.title,
                    name.title
                );
            }
        }
    }
}

/// Counts one connection attempt by outcome (`ratelimit_<name>_connects`).
pub(super) fn count_connect<T>(metrics: &RemoteMetrics, attempt: &Result<T, StoreError>) {
    let outcome = match attempt {
        Ok(_) => "connected",
        Err(StoreError::Unreachable(_)) => "unreachable",
        Err(_) => "refused",
    };
    metrics.connects.with_label_values(&[outcome]).inc();
}
