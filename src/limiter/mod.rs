//! The rate-limiting algorithms as pure functions of (limit, state, now, hits). No clock, no I/O, no
//! locking: a store holds the `State` and calls `evaluate` under its own lock.

mod fixed_window;
mod token_bucket;

use crate::clock::{NANOS_PER_SECOND, Nanos};
use crate::config::{Algorithm, Limit};

/// The numbers an algorithm needs, precomputed from a `Limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitParams {
    pub algorithm: Algorithm,
    pub requests_per_unit: u32,
    /// The window / refill period in nanoseconds (unit × multiplier).
    pub period: Nanos,
    /// Token bucket capacity.
    pub burst: u32,
}

impl LimitParams {
    pub fn from_limit(limit: &Limit) -> Self {
        LimitParams {
            algorithm: limit.algorithm,
            requests_per_unit: limit.requests_per_unit,
            period: limit.period_seconds().saturating_mul(NANOS_PER_SECOND),
            burst: limit.effective_burst(),
        }
    }
}

/// Per-key state: two words whose meaning belongs to the algorithm (token bucket: theoretical arrival
/// time; fixed window: window start and count). A key with no state behaves as a fresh key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    pub a: u64,
    pub b: u64,
}

/// What a limit looks like to a client at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlook {
    /// Whole hits that would still pass now.
    pub remaining: u32,
    /// Time until the limit is fully available again (window end for fixed window; bucket full for
    /// token bucket).
    pub reset_after: Nanos,
}

/// The answer of an algorithm for one request on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// Whether `hits` fit now.
    pub allowed: bool,
    /// The state to store if the request is charged (only meaningful when `allowed`).
    pub charged: State,
    /// The outlook once charged.
    pub after_charge: Outlook,
    /// The outlook if nothing is charged (denied, or another descriptor denied the request).
    pub without_charge: Outlook,
}

/// Decides whether `hits` fit the limit at `now`, given the key's current state.
pub fn evaluate(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> Evaluation {
    match params.algorithm {
        Algorithm::TokenBucket => token_bucket::evaluate(params, state, now, hits),
        Algorithm::FixedWindow => fixed_window::evaluate(params, state, now, hits),
    }
}

/// The instant from which `state` is equivalent to no state at all, so the key can be dropped.
pub fn expires_at(params: &LimitParams, state: &State) -> Nanos {
    match params.algorithm {
        Algorithm::TokenBucket => token_bucket::expires_at(state),
        Algorithm::FixedWindow => fixed_window::expires_at(params, state),
    }
}
