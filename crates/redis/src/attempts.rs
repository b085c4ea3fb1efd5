//! One call's worth of requests on keys of one slot, decided in arrival order by compare-and-set,
//! attempt after attempt: each attempt decides the batch (`batch`) on the states the keys were
//! last seen holding and sends one compare-and-set; when another instance got in between, the
//! next attempt decides again on what Redis returned.

use smallvec::SmallVec;

use ratelimit_core::limiter::State;
use ratelimit_core::store::{StoreError, Transaction, Verdicts};

use crate::batch::decide_batch;
use crate::cas::states;
use crate::key::TextKey;
use crate::pending::Pending;
use crate::retry::{MAX_ATTEMPTS, before_retry};
use crate::writer::Writer;

/// Decides `requests` in order on `keys` (all of them, one slot), retrying on what Redis holds
/// when another instance got in between. Drops requests whose callers left while it retried; the
/// verdicts are those of the requests left, in order.
pub(crate) async fn decide(
    writer: &Writer,
    keys: &[TextKey],
    requests: &mut Vec<Pending>,
) -> Result<Vec<Verdicts>, StoreError> {
    let now = requests.iter().map(|p| p.now).max().unwrap_or(0);
    let mut expected = writer.expected(keys, now);
    for attempt in 0..MAX_ATTEMPTS {
        let stored = states(&expected);
        let steps: Vec<Transaction<'_, TextKey>> =
            requests.iter().map(Pending::transaction).collect();
        let outcome = decide_batch(&steps, keys, &stored);
        drop(steps);
        let new: SmallVec<[Option<State>; 4]> = outcome
            .states
            .iter()
            .zip(&stored)
            .map(|(after, before)| after.filter(|_| after != before))
            .collect();
        let Err(current) = writer.compare_and_set(keys, &expected, &new, now).await? else {
            return Ok(outcome.verdicts);
        };
        expected = current;
        requests.retain(|p| !p.abandoned());
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        before_retry(attempt).await;
    }
    writer.calls().metrics().error("conflict_exhausted");
    Err(StoreError::Contention(MAX_ATTEMPTS))
}
