//! Once the remote backend answers again: charges it with what the local failure mode admitted
//! during the outage (per key at most what its limit has left now, so the instances' outage
//! decisions count against the shared limit), then forgets the outage's local state. It claims
//! [`CHUNK`] keys at a time and writes them side by side: a decision on a key of the chunk waits
//! for that chunk (a few round trips), and one on a key not reached yet writes its own key back
//! and goes on, so no decision waits for the whole write-back (thousands of keys, two round trips
//! each). A key whose write-back failed stays local until a decision on it writes it back.

use std::sync::{PoisonError, Weak};

use crate::guarded::Shared;
use crate::guarded::hand_over::{release, settle};
use crate::remote::Connect;

/// Keys written back side by side.
const CHUNK: usize = 256;

pub(in crate::guarded) async fn write_back<C: Connect>(shared: Weak<Shared<C>>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let (keys, last_now) = {
        let outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
        (outage.not_settling(), outage.last_now)
    };
    let (Some(remote), Some((last_now, at))) = (shared.remote.load_full(), last_now) else {
        let claimed = {
            let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
            outage.claim_all()
        };
        release(&shared, claimed, &[], 0);
        return;
    };
    let mut written = 0;
    for chunk in keys.chunks(CHUNK) {
        let claimed = {
            let mut outage = shared.outage.lock().unwrap_or_else(PoisonError::into_inner);
            outage.claim_free(chunk)
        };
        if claimed.is_empty() {
            continue;
        }
        // The decisions' clock, carried forward from the outage's last decision.
        let now = last_now.saturating_add(at.elapsed().as_nanos() as u64);
        let (took, unsettled) = settle(&*remote, claimed.clone(), now).await;
        shared.metrics.outage_hits_written_back.inc_by(took);
        written += took;
        // Keys whose write failed (in a cluster, their master may still be away while the others
        // answer) stay taken over, their local state with them, until a decision on them settles
        // them; so do the keys not reached once one failed.
        let unsettled: Vec<_> = unsettled.into_iter().map(|(k, _, _)| k).collect();
        let failed = !unsettled.is_empty();
        release(&shared, claimed, &unsettled, now);
        if failed {
            break;
        }
    }
    if written > 0 {
        tracing::info!(
            hits = written,
            "written back into {}: the hits {}_FAILURE_MODE=local admitted during the outage",
            shared.name.title,
            shared.name.upper
        );
    }
}
