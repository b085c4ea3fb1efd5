//! While the breaker is open, probes the backend with `ping` whenever the breaker allows a probe
//! (and, when that fails, with a fresh connection), so decisions go back to it (and
//! `ratelimit_store_up` says so) within a second of it answering, with or without traffic, and
//! within the breaker's base interval of a restart (a refused probe does not back off). Ends once
//! the breaker closes or the store is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ratelimit_core::clock::monotonic;

use crate::breaker::Permit;
use crate::guarded::{Guarded, Shared, switch};
use crate::remote::{Connect, Remote};

/// How often the prober looks at the breaker.
const PROBE_TICK: Duration = Duration::from_millis(20);

pub(in crate::guarded) async fn probe<C: Connect>(shared: Weak<Shared<C>>) {
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
                let ok = remote.ping().await.is_ok() || reconnect_now(&store).await;
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

/// A probe's `ping` failed: tries a fresh connection at once, since the old one may be waiting
/// out its own reconnection backoff. On success the fresh backend replaces the old one.
async fn reconnect_now<C: Connect>(store: &Guarded<C>) -> bool {
    let shared = &store.shared;
    let attempt = shared.connect.connect(shared.metrics.clone()).await;
    switch::count_connect(&shared.metrics, &attempt);
    match attempt {
        Ok(fresh) => {
            shared.remote.store(Some(Arc::new(fresh)));
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "the probe's fresh connection failed too");
            false
        }
    }
}
