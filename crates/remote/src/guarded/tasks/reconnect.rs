//! Connects in the background with backoff until it succeeds or the store is dropped. While it
//! fails it says so at most every [`STILL_FAILING_EVERY`] (a warning while nobody answers, an
//! error while the backend refuses us: a password or certificate that waiting will not mend), with
//! the count of attempts, which `ratelimit_<name>_connects` also counts.

use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::StoreError;

use crate::every::Every;
use crate::guarded::{Shared, switch};
use crate::names::RemoteName;
use crate::remote::Connect;

/// First wait of the background (re)connection, doubled after each failure up to
/// [`RECONNECT_MAX`].
const RECONNECT_BASE: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// How often the background connection says it is still failing.
pub(super) const STILL_FAILING_EVERY: Duration = Duration::from_secs(30);

pub(in crate::guarded) async fn reconnect<C: Connect>(shared: Weak<Shared<C>>) {
    let mut wait = RECONNECT_BASE;
    let since = monotonic();
    let say = Every::new(STILL_FAILING_EVERY);
    let mut attempts = 0u64;
    loop {
        tokio::time::sleep(wait).await;
        let Some((metrics, connect, name)) = shared
            .upgrade()
            .map(|s| (s.metrics.clone(), s.connect.clone(), s.name.clone()))
        else {
            return;
        };
        let attempt = connect.connect(metrics.clone()).await;
        switch::count_connect(&metrics, &attempt);
        attempts += 1;
        match attempt {
            Ok(store) => {
                if let Some(shared) = shared.upgrade() {
                    connected(&shared, store);
                }
                return;
            }
            Err(e) => {
                let failing_for = since.elapsed();
                if say.due(failing_for.as_nanos() as u64) {
                    still_failing(&name, &connect, &e, attempts, failing_for);
                } else {
                    tracing::debug!(error = %e, ?wait, "{} still unreachable or refusing", name.title);
                }
                wait = (wait * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// The background connection succeeded: decisions go to `store` now.
fn connected<C: Connect>(shared: &Arc<Shared<C>>, store: C::Backend) {
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
    tracing::info!(remote = %shared.connect.describe(), "connected to {}", shared.name.title);
    if let Some(change) = change {
        switch::switched(shared, change, true);
    }
}

/// Says that the background connection still fails: a warning while nobody answers, an error
/// while the backend refuses us.
pub(super) fn still_failing<C: Connect>(
    name: &RemoteName,
    connect: &C,
    e: &StoreError,
    attempts: u64,
    failing_for: Duration,
) {
    match e {
        StoreError::Unreachable(_) => tracing::warn!(
            error = %e,
            remote = %connect.describe(),
            attempts,
            ?failing_for,
            "{} still unreachable; decisions by {}_FAILURE_MODE until it answers",
            name.title,
            name.upper
        ),
        _ => tracing::error!(
            error = %e,
            remote = %connect.describe(),
            attempts,
            ?failing_for,
            "{} REFUSES THIS SERVER (password, user or certificate): decisions by {}_FAILURE_MODE until the settings are fixed",
            name.upper,
            name.upper
        ),
    }
}
