//! While the local failure mode may decide with an `auto` local share: says every
//! [`HEARTBEAT_EVERY`] (sooner after start: [`FIRST_BEATS`]) that this instance is alive in the
//! backend's registry, and learns how many are, so an outage's share is one over that count.

use std::sync::atomic::Ordering;
use std::sync::{PoisonError, Weak};
use std::time::Duration;

use crate::guarded::Shared;
use crate::remote::{Connect, Remote};

/// How often an instance says it is alive (a beat counts for `quota::fraction::STALE_AFTER_MS`).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// The waits after the first beats: instances started together (a rollout, a scale-up) count each
/// other within a quarter second instead of up to [`HEARTBEAT_EVERY`], during which each would
/// take a share of one were an outage to begin.
const FIRST_BEATS: [Duration; 3] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];

pub(in crate::guarded) async fn heartbeat<C: Connect>(shared: Weak<Shared<C>>) {
    let mut waits = FIRST_BEATS.into_iter();
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
            let beat = remote.heartbeat(s.instance_id);
            match tokio::time::timeout(s.connect.timeout() * 4, beat).await {
                Ok(Ok(live)) => {
                    s.live_instances.store(live.max(1), Ordering::Relaxed);
                    s.metrics.instances.set(live as i64);
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat failed"),
                Err(_) => tracing::debug!("heartbeat timed out"),
            }
        }
        drop(s);
        tokio::time::sleep(waits.next().unwrap_or(HEARTBEAT_EVERY)).await;
    }
}
