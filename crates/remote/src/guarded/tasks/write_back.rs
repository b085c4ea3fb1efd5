//! Once the remote backend answers again: charges it with what the local failure mode admitted
//! during the outage (per key at most what its limit has left now, so the instances' outage
//! decisions count against the shared limit), then forgets the outage's local state. Decisions on
//! a key stay local while its write-back is under way.

use std::sync::{PoisonError, Weak};

use crate::guarded::Shared;
use crate::guarded::hand_over::{release, settle};
use crate::remote::Connect;

pub(in crate::guarded) async fn write_back<C: Connect>(shared: Weak<Shared<C>>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let (claimed, last_now) = {
        let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
        (outage.claim_all(), outage.last_now)
    };
    let (Some(remote), Some((last_now, at))) = (shared.remote.load_full(), last_now) else {
        release(&shared, claimed, &[], 0);
        return;
    };
    // The decisions' clock, carried forward from the outage's last decision.
    let now = last_now.saturating_add(at.elapsed().as_nanos() as u64);
    let (written, unsettled) = settle(&*remote, claimed.clone(), now).await;
    shared.metrics.outage_hits_written_back.inc_by(written);
    // Keys whose write failed (in a cluster, their master may still be away while the others
    // answer) stay taken over, their local state with them, until a decision on them settles them.
    let unsettled: Vec<_> = unsettled.into_iter().map(|(k, _, _)| k).collect();
    release(&shared, claimed, &unsettled, now);
    if written > 0 {
        tracing::info!(
            hits = written,
            "written back into {}: the hits {}_FAILURE_MODE=local admitted during the outage",
            shared.name.title,
            shared.name.upper
        );
    }
}
