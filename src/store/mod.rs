//! Where limiter state lives. `Store` applies one request's charges atomically: every charge is
//! evaluated, and the request is charged on every key only if every enforced charge fits
//! (all-or-nothing), so denied traffic never eats quota.

mod key;
mod memory;

use std::future::Future;

use smallvec::SmallVec;

pub use key::{KeyBuilder, StoreKey};
pub use memory::{MemoryStore, MemoryStoreStats};

use crate::clock::Nanos;
use crate::limiter::{LimitParams, Outlook};

/// One limit to check and charge for one descriptor of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub key: StoreKey,
    pub params: LimitParams,
    pub hits: u64,
    /// False for shadow-mode rules: their denial does not stop the request from being charged.
    pub enforced: bool,
}

/// The answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the charge fit its limit.
    pub allowed: bool,
    /// The limit as the client now sees it (after the charge if the request was charged).
    pub outlook: Outlook,
    /// Whether this charge was written (the whole request fit, and this charge did).
    pub charged: bool,
    /// How long the answer must wait for this charge's turn (leaky bucket; 0 when not charged).
    pub delay: Nanos,
}

/// One verdict per charge, in order. Inline up to four, so the common request allocates nothing.
pub type Verdicts = SmallVec<[Verdict; 2]>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// A place where counters live.
pub trait Store: Send + Sync + 'static {
    /// Evaluates all `charges` at `now` and, iff every enforced one fits, charges them all.
    /// Returns one verdict per charge, in order.
    fn apply(
        &self,
        charges: &[Charge],
        now: Nanos,
    ) -> impl Future<Output = Result<Verdicts, StoreError>> + Send;

    /// Gives back what `charges` took (they were charged, but their answers were never delivered:
    /// the caller cancelled while waiting for its turn). Only leaky-bucket queue slots are given
    /// back; see `limiter::refund`. Called from a drop guard, so it must not block or fail: a
    /// remote store would send it from a task of its own.
    fn refund(&self, charges: &[Charge], now: Nanos);
}
