//! One call on a concurrency key's leases, as the engine hands it to a backend, and the identity
//! of a concurrency key (a `CounterId` no rate limit can have).

use crate::clock::Nanos;
use crate::config::Algorithm;
use crate::lease::{LeaseAction, LeaseParams, Watch};
use crate::store::{CounterId, Entries};

/// One acquisition, release or look at the leases of `key` for request `id`, at `now`.
#[derive(Clone)]
pub struct LeaseCall<'a, K> {
    pub key: &'a K,
    /// The request id (the descriptor's entry after the rule's own).
    pub id: &'a str,
    pub action: LeaseAction,
    pub params: LeaseParams,
    pub now: Nanos,
    /// Told of this key's leases that a sweep finds ended (the rule's metrics).
    pub watch: Option<&'a Watch>,
}

impl<K: std::fmt::Debug> std::fmt::Debug for LeaseCall<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCall")
            .field("key", self.key)
            .field("id", &self.id)
            .field("action", &self.action)
            .field("params", &self.params)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// The slot of a concurrency key's identity: no rate limit has one this high (a rule has at most
/// a handful of limits), and its period is 0, which no rate window is; so a concurrency key never
/// meets a rate counter, even one its descriptor had before a reload made it a concurrency rule.
const CONCURRENCY_SLOT: usize = u32::MAX as usize;

/// The identity of the concurrency key of a descriptor's `entries` (the rule's own entries, not
/// the request id or the release marker after them).
pub fn concurrency_counter<'a>(domain: &'a str, entries: Entries<'a>) -> CounterId<'a> {
    CounterId {
        domain,
        entries,
        slot: CONCURRENCY_SLOT,
        algorithm: Algorithm::TokenBucket,
        period: 0,
    }
}
