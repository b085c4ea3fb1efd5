//! While the breaker is open, probes the backend (`Remote::probe`: a write, as decisions make)
//! whenever the breaker allows a probe (and, when nothing answered it, with a fresh connection;
//! not when the backend answered refusing it), so decisions go back to it (and
//! `ratelimit_store_up` says so) within a second of it answering, with or without traffic, and
//! within the breaker's base interval of a restart (a refused probe does not back off). Ends once
//! the breaker closes or the store is dropped. While fresh connections fail too, says why at most
//! every 30 s (as the background connection does: the error of a connection tells more than the
//! failed call that opened the breaker, e.g. what Redis wrote as it turned it away).

use std::sync::{Arc, Weak};
use std::time::Duration;

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::StoreError;

use crate::breaker::Permit;
use crate::every::Every;
use crate::guarded::{Guarded, Shared, switch};
use crate::remote::{Connect, Remote};

use super::reconnect::{STILL_FAILING_EVERY, still_failing};

/// How often the prober looks at the breaker.
const PROBE_TICK: Duration = Duration::from_millis(20);

pub(in crate::guarded) async fn probe<C: Connect>(shared: Weak<Shared<C>>) {
    let mut fresh = FreshConnections {
        since: monotonic(),
        attempts: 0,
        say: Every::new(STILL_FAILING_EVERY),
    };
    loop {
        tokio::time::sleep(PROBE_TICK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let store = Guarded { shared };
        let Some(remote) = store.shared.remote.load_full() else {
            continue;
        };
        match store.permit() {
            Permit::Call => return,
            Permit::Reject => {}
            Permit::Probe => {
                let started = monotonic();
                let ok = match remote.probe().await {
                    Ok(()) => true,
                    // It answered, refusing the probe: a fresh connection would be refused too.
                    Err(e @ StoreError::Unavailable(_)) => {
                        store.shared.failed_with(&e);
                        false
                    }
                    Err(e) => {
                        store.shared.failed_with(&e);
                        reconnect_now(&store, &mut fresh).await
                    }
                };
                if ok {
                    store.record(Permit::Probe, true);
                    return;
                }
                // Refused before the call timeout (the backend's process is down or restarting,
                // or it answered with an error), not left unanswered: no backing off.
                if started.elapsed() < store.shared.connect.timeout() {
                    store.record_fast_probe_failure();
                } else {
                    store.record(Permit::Probe, false);
                }
            }
        }
    }
}

/// Nothing answered a probe: tries a fresh connection at once, since the old one may be waiting
/// out its own reconnection backoff. On success the fresh backend replaces the old one, and the
/// probe is made again on it.
async fn reconnect_now<C: Connect>(store: &Guarded<C>, fresh: &mut FreshConnections) -> bool {
    let shared = &store.shared;
    let attempt = shared.connect.connect(shared.metrics.clone()).await;
    switch::count_connect(&shared.metrics, &attempt);
    match attempt {
        Ok(fresh) => {
            let probed = fresh.probe().await;
            shared.remote.store(Some(Arc::new(fresh)));
            if let Err(e) = &probed {
                shared.failed_with(e);
            }
            probed.is_ok()
        }
        Err(e) => {
            shared.failed_with(&e);
            fresh.attempts += 1;
            let failing_for = fresh.since.elapsed();
            if fresh.say.due(failing_for.as_nanos() as u64) {
                still_failing(
                    &shared.name,
                    &shared.connect,
                    &e,
                    fresh.attempts,
                    failing_for,
                );
            } else {
                tracing::debug!(error = %e, "the probe's fresh connection failed too");
            }
            false
        }
    }
}

/// The probes' fresh connections since the prober started (the breaker opened).
struct FreshConnections {
    since: std::time::Instant,
    attempts: u64,
    say: Every,
}
