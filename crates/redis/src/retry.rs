//! How often a compare-and-set is tried again when another instance wrote one of its keys in
//! between, and how long each retry waits.

use std::time::Duration;

/// Compare-and-set attempts of one call before it gives up (each retry means another instance
/// wrote one of its keys in between). With one call in flight per key and instance, a retry
/// races only with the other instances' calls.
pub(crate) const MAX_ATTEMPTS: usize = 32;

/// Retries sent straight away on the values the failed script returned; later ones first wait a
/// little ([`backoff`]), so instances that keep colliding fall out of step.
pub(crate) const FRESH_RETRIES: usize = 4;

/// Waits before retry `attempt + 1` when that one is not sent straight away.
pub(crate) async fn before_retry(attempt: usize) {
    if attempt + 1 >= FRESH_RETRIES {
        backoff(attempt).await;
    }
}

/// Waits before retry `attempt`: a yield for the first few (the other writer has just
/// written), then a jittered sleep of up to 2 ms.
async fn backoff(attempt: usize) {
    if attempt < FRESH_RETRIES {
        tokio::task::yield_now().await;
        return;
    }
    // Randomly keyed hashes make the jitter (RandomState gives every call new keys): instances that
    // collide at the same instant do not retry in step, as a clock-derived jitter would have them.
    use std::hash::BuildHasher;
    let jitter = std::collections::hash_map::RandomState::new().hash_one(attempt);
    tokio::time::sleep(Duration::from_micros(jitter % 2000)).await;
}
