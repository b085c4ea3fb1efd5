//! The rate-limiting algorithms as pure functions of (limit, state, now, hits). No clock, no I/O, no
//! locking: a store holds the `State` and calls `evaluate` under its own lock.

mod describe;
mod fixed_window;
mod leaky_bucket;
#[cfg(test)]
mod limit_change_tests;
mod retry;
#[cfg(test)]
mod share_tests;
mod sliding_window;
#[cfg(test)]
mod testing;
mod token_bucket;
#[cfg(test)]
mod uncharge_tests;

use crate::clock::{NANOS_PER_SECOND, Nanos};
use crate::config::{Algorithm, Limit};

pub use describe::human;
pub(crate) use fixed_window::FixedWindowState;
pub use retry::{NEVER, retry_after};
pub(crate) use sliding_window::SlidingWindowState;
pub(crate) use token_bucket::TatState;

/// What a limit that does not say gets: the server-wide `--default-algorithm` and
/// `--default-max-delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitDefaults {
    pub algorithm: Algorithm,
    /// Leaky bucket: the longest a request waits for its turn.
    pub max_delay: Nanos,
    /// `--charge-denied-hits`: fixed and sliding windows count the hits of denied requests too,
    /// as the reference counts them (a token cost reported after the fact stays spent).
    pub charge_denied: bool,
}

impl Default for LimitDefaults {
    fn default() -> Self {
        LimitDefaults {
            algorithm: Algorithm::TokenBucket,
            max_delay: NANOS_PER_SECOND,
            charge_denied: false,
        }
    }
}

impl LimitDefaults {
    /// Whether a limit of `algorithm` counts denied hits: with `charge_denied`, the windows do;
    /// the buckets never hold a debt.
    pub fn charges_denied(&self, algorithm: Algorithm) -> bool {
        self.charge_denied && matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }
}

/// The numbers an algorithm needs, precomputed from a `Limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitParams {
    pub algorithm: Algorithm,
    pub requests_per_unit: u32,
    /// The window / refill period in nanoseconds (unit × multiplier), or a calendar window
    /// packed by `calendar::CalendarWindow::period` (fixed and sliding windows only).
    pub period: Nanos,
    /// Token bucket capacity; leaky bucket queue length.
    pub burst: u32,
    /// Leaky bucket: the longest wait for a turn (ignored by the other algorithms).
    pub max_delay: Nanos,
    /// Fixed and sliding window: a denied request's hits are counted all the same (the
    /// reference's counting), so the window stays over until it ends. Always false for the
    /// buckets, which hold no debt.
    pub charge_denied: bool,
}

impl LimitParams {
    /// The limit's numbers, with the server's defaults for what it leaves unsaid.
    pub fn from_limit(limit: &Limit, defaults: &LimitDefaults) -> Self {
        let algorithm = limit.algorithm.unwrap_or(defaults.algorithm);
        LimitParams {
            algorithm,
            requests_per_unit: limit.requests_per_unit,
            period: match &limit.calendar {
                Some(calendar) => calendar.period(),
                None => limit.period_seconds().saturating_mul(NANOS_PER_SECOND),
            },
            burst: limit.effective_burst(),
            max_delay: limit.max_delay.map_or(defaults.max_delay, |d| {
                d.as_nanos().min(u128::from(u64::MAX)) as u64
            }),
            charge_denied: defaults.charges_denied(algorithm),
        }
    }

    /// Leaky bucket: time between two hits leaving the queue, `period / requests_per_unit`
    /// (rounded down; the algorithm itself keeps it exactly).
    pub fn drain_interval(&self) -> Option<Nanos> {
        (self.requests_per_unit > 0).then(|| self.period / u64::from(self.requests_per_unit))
    }
}

/// Per-key state as stores keep it: two words whose meaning belongs to the algorithm. Each
/// algorithm reads and writes them through its own view, the only place that packs them:
/// `TatState` (token and leaky bucket: a theoretical arrival / drain time, and the rate it was
/// written at), `FixedWindowState` (window end and count) and `SlidingWindowState` (when both
/// windows are forgotten, and both windows' counts). A key with no state behaves as a fresh key.
///
/// Every algorithm keeps one promise about `a`: from the instant `a` on, the state is equivalent to
/// no state. So a store can drop idle keys knowing only their state, and keeps nothing else. The
/// words are public for the stores, which keep them as they are (16 bytes in a memory slot,
/// `a:b` text in Redis) and never interpret `b`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    pub a: u64,
    pub b: u64,
}

impl State {
    /// The instant from which this state is equivalent to no state, so the key can be dropped.
    pub fn expires_at(&self) -> Nanos {
        self.a
    }
}

/// What a limit looks like to a client at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlook {
    /// Whole hits that would still pass now.
    pub remaining: u32,
    /// Time until the limit is fully available again (window end for fixed window; bucket full for
    /// token bucket; both windows' counts gone for sliding window; queue empty for leaky bucket).
    pub reset_after: Nanos,
}

/// The answer of an algorithm for one request on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// Whether `hits` fit now.
    pub allowed: bool,
    /// The key's state once the request is charged: what the store writes if it charges (when not
    /// `allowed`, the state as it stands, unless the limit counts denied hits: then with them).
    pub state_after: State,
    /// The outlook once charged.
    pub after_charge: Outlook,
    /// The outlook if nothing is charged (denied, or another descriptor denied the request).
    pub without_charge: Outlook,
    /// How long the answer must wait if charged: the request's turn in a leaky bucket's queue.
    /// 0 for every other algorithm, and for anything not allowed.
    pub delay: Nanos,
    /// When not allowed: how long until the same `hits` would fit, on the state as it stays
    /// ([`retry_after`]; [`NEVER`] if no wait makes them fit). 0 when allowed.
    pub retry_after: Nanos,
}

impl Evaluation {
    /// An answer that charges nothing: the state stays as it is and the client sees `outlook`
    /// whether or not the request goes ahead.
    pub(super) fn uncharged(allowed: bool, state: State, outlook: Outlook) -> Evaluation {
        Evaluation {
            allowed,
            state_after: state,
            after_charge: outlook,
            without_charge: outlook,
            delay: 0,
            retry_after: 0,
        }
    }
}

/// Decides whether `hits` fit the limit at `now`, given the key's current state; when they do
/// not, also how long until they would (on the state as it stays: with the denied hits when the
/// limit counts them).
pub fn evaluate(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> Evaluation {
    let mut evaluation = match params.algorithm {
        Algorithm::TokenBucket => token_bucket::evaluate(params, state, now, hits),
        Algorithm::FixedWindow => fixed_window::evaluate(params, state, now, hits),
        Algorithm::SlidingWindow => sliding_window::evaluate(params, state, now, hits),
        Algorithm::LeakyBucket => leaky_bucket::evaluate(params, state, now, hits),
    };
    if !evaluation.allowed {
        evaluation.retry_after = retry_after(params, Some(evaluation.state_after), now, hits);
    }
    evaluation
}

/// Gives back `hits` charged earlier whose answer was never delivered (the caller cancelled while
/// waiting for its turn). Only a leaky bucket's queue slot is given back; the other algorithms
/// count decisions, and keep the state as it is.
pub fn refund(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    match params.algorithm {
        Algorithm::LeakyBucket => leaky_bucket::refund(params, state, now, hits),
        _ => *state,
    }
}

/// Takes back `hits` that a charge at `now` took (the inverse of a charge that fit), for a request
/// that charged one store and then could not be completed on another (a Redis Cluster request
/// whose keys span slots). Token and leaky bucket: the TAT moves back by their cost (never before
/// `now`); fixed and sliding window: the window they were counted in at `now` counts them no more.
pub fn uncharge(params: &LimitParams, state: &State, now: Nanos, hits: u64) -> State {
    match params.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            token_bucket::uncharge(params, state, now, hits)
        }
        Algorithm::FixedWindow => fixed_window::uncharge(params, state, now, hits),
        Algorithm::SlidingWindow => sliding_window::uncharge(params, state, now, hits),
    }
}

/// A key's state as one instance should decide on it alone while the shared store is away: of
/// what the limit has left at `now` (by `state`, the last value the instance saw), the instance
/// keeps `share` (0 to 1, rounded down) and the rest is charged, as taken by the other instances.
/// Every algorithm, by a charge of the part that is not ours: `None` stays `None` only when
/// nothing is charged.
pub fn keep_share(
    params: &LimitParams,
    state: Option<State>,
    now: Nanos,
    share: f64,
) -> Option<State> {
    let remaining = u64::from(evaluate(params, state, now, 0).without_charge.remaining);
    let share = if share.is_nan() {
        1.0
    } else {
        share.clamp(0.0, 1.0)
    };
    let kept = ((remaining as f64) * share).floor() as u64;
    let others = remaining - kept.min(remaining);
    if others == 0 {
        return state;
    }
    let e = evaluate(params, state, now, others);
    if e.allowed {
        Some(e.state_after)
    } else {
        state
    }
}

/// Of `hits` admitted elsewhere (by the local failure mode during an outage), how many the limit
/// can still take at `now`: all of them if they fit, else what is left.
pub fn settled_hits(params: &LimitParams, state: Option<State>, now: Nanos, hits: u64) -> u64 {
    let remaining = u64::from(evaluate(params, state, now, 0).without_charge.remaining);
    hits.min(remaining)
}

/// `n / d`, by the 64-bit divide instruction when both fit, as they nearly always do here (the
/// algorithms divide offsets from now, not instants); a 128-bit division is a slow library call.
fn div(n: u128, d: u128) -> u128 {
    if (n | d) >> 64 == 0 {
        u128::from(n as u64 / d as u64)
    } else {
        n / d
    }
}

/// `n / d` rounded up, as `div`.
fn div_ceil(n: u128, d: u128) -> u128 {
    if (n | d) >> 64 == 0 {
        u128::from((n as u64).div_ceil(d as u64))
    } else {
        n.div_ceil(d)
    }
}

/// `v`, or `u64::MAX` if it does not fit.
fn clamp(v: u128) -> u64 {
    v.min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod arithmetic_tests {
    use super::*;

    #[test]
    fn fast_division_agrees_with_u128_division_on_both_sides_of_64_bits() {
        let values = [
            1u128,
            3,
            7,
            u128::from(u64::MAX),
            u128::from(u64::MAX) + 1,
            u128::MAX / 3,
        ];
        for &n in &values {
            for &d in &values {
                assert_eq!(div(n, d), n / d, "{n} / {d}");
                assert_eq!(div_ceil(n, d), n.div_ceil(d), "{n} / {d} rounded up");
            }
        }
    }
}
