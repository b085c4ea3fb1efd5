//! Where limiter state lives, behind one seam. A [`Backend`] keeps states (in memory, in a remote
//! store, or anything else) and runs one request's [`Transaction`] atomically on the states of its
//! keys; the transaction itself (all-or-nothing `decide`, leaky-bucket refunds) is written once, in
//! `transaction.rs`, so every backend gives the same verdicts. [`Store`] is what the engine holds:
//! a backend, the key of each [`CounterId`], and refunds sent without waiting.
//!
//! Adding a backend: a crate or module with a type implementing [`Backend`] (a backend reached
//! over the network also implements the remote layer's traits, crate `ratelimit-remote`, which
//! gives it a deadline, a breaker and a failure mode), and one arm where the server chooses its
//! backend (`server::start` in the app crate).

mod counter;
mod lease_call;
pub mod memory;
mod names;
mod transaction;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;
use smallvec::SmallVec;

pub use counter::{CounterId, Entries};
pub use lease_call::{LeaseCall, concurrency_counter};
pub use names::{CounterName, CounterNames};
pub use transaction::{Transaction, TransactionKind, TransactionOutcome, decide};

use crate::clock::Nanos;
use crate::lease::LeaseAnswer;
use crate::limiter::{LimitParams, Outlook, State};

/// One limit to check and charge for one descriptor of a request. Plain data by design: every
/// backend reads all of it, and a backend's tests re-key charges field by field; outside a
/// decision, [`Charge::new`] builds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge<K> {
    pub key: K,
    pub params: LimitParams,
    pub hits: u64,
    /// False for shadow-mode rules: their denial does not stop the request from being charged.
    pub enforced: bool,
    /// `quota_mode`: the request's descriptor this charge belongs to. A quota descriptor is over
    /// when any of its enforced charges is denied, and quota descriptors stop the request only
    /// when every one of them is over (the reference's rule).
    pub quota: Option<u32>,
}

impl<K> Charge<K> {
    /// An enforced charge of `hits` on `key` under `params`, in no `quota_mode` descriptor: what
    /// a caller outside a decision (a hand-over's write-back, a test) charges.
    pub fn new(key: K, params: LimitParams, hits: u64) -> Self {
        Charge {
            key,
            params,
            hits,
            enforced: true,
            quota: None,
        }
    }
}

/// The answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the charge fit its limit.
    pub allowed: bool,
    /// The limit as the client now sees it (after the charge if the request was charged).
    pub outlook: Outlook,
    /// Whole hits that would have passed before this charge: the outlook's `remaining` without it
    /// (`outlook.remaining` itself when not charged). What the per-rule metrics split a
    /// request's hits by, as the reference splits them on its count before the increment.
    pub remaining_before: u32,
    /// Whether this charge was written (the whole request fit, and this charge did).
    pub charged: bool,
    /// How long the answer must wait for this charge's turn (leaky bucket; 0 when not charged).
    pub delay: Nanos,
    /// When not allowed: how long until the same hits would fit (`limiter::retry_after`;
    /// `limiter::NEVER` if never). 0 when allowed.
    pub retry_after: Nanos,
}

/// One verdict per charge, in order. Inline up to two (most requests have one or two descriptors), so the common request allocates nothing.
pub type Verdicts = SmallVec<[Verdict; 2]>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Nobody answered (connection refused, no answer within the backend's timeout).
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// Other instances kept changing the request's keys between our read and our write.
    #[error("store contention: gave up after {0} attempts")]
    Contention(usize),
}

/// Counts for metrics. `keys` and `evictions` are the memory backend's; a remote backend reports
/// none (its keys expire there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub keys: usize,
    pub evictions: u64,
    pub(crate) expired: u64,
}

/// Where states live.
pub trait Backend: Send + Sync + 'static {
    /// The identity of one counter in this backend (it derives its own: a keyed hash in memory,
    /// text every instance computes alike in a shared store).
    type Key: Clone + Debug + PartialEq + Send + Sync + 'static;

    /// What it is, for logs, `/explain` and metrics (`memory`, or a remote backend's name).
    const NAME: &'static str;

    /// The key of a counter. Limit values (requests per unit, burst) are not part of a counter's
    /// identity, so editing a limit keeps the counter; a new algorithm or window starts a new one.
    fn key(&self, id: &CounterId<'_>) -> Self::Key;

    /// Runs `tx` on the current states of its keys, atomically, and keeps the states it leaves.
    /// Returns its verdicts (none for a refund). A refund may be queued and answered at once.
    fn transact(
        &self,
        tx: Transaction<'_, Self::Key>,
    ) -> impl Future<Output = Result<Verdicts, StoreError>> + Send;

    /// The stored state of a key, charging nothing (for `/explain`).
    fn peek(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Option<State>, StoreError>> + Send;

    /// Runs one call on a concurrency key's leases, atomically (see `crate::lease` for the
    /// rules). A backend that keeps no leases answers `Unavailable`.
    fn lease(
        &self,
        call: LeaseCall<'_, Self::Key>,
    ) -> impl Future<Output = Result<LeaseAnswer, StoreError>> + Send {
        let _ = call;
        async {
            Err(StoreError::Unavailable(format!(
                "the {} store keeps no concurrency leases",
                Self::NAME
            )))
        }
    }

    /// Forgets a key's state (the quota API's reset): its counter starts afresh. Returns whether
    /// it held one. A backend that cannot says so (`Unavailable`).
    fn reset(&self, _key: &Self::Key) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable(format!(
            "the {} store cannot reset a counter",
            Self::NAME
        ))))
    }

    /// Counts for `/metrics`.
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    /// Drops idle keys (a backend whose keys expire by themselves does nothing). Returns how many.
    fn sweep(&self, _now: Nanos) -> usize {
        0
    }
}

/// The store the engine holds: a backend (cheap to clone).
pub struct Store<B> {
    backend: Arc<B>,
}

impl<B> Clone for Store<B> {
    fn clone(&self) -> Self {
        Store {
            backend: self.backend.clone(),
        }
    }
}

impl<B: Backend> Store<B> {
    pub fn new(backend: B) -> Store<B> {
        Store {
            backend: Arc::new(backend),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The key of a counter.
    #[inline]
    pub fn key(&self, id: &CounterId<'_>) -> B::Key {
        self.backend.key(id)
    }

    /// Evaluates all `charges` at `now` and, iff every enforced one fits, charges them all.
    /// Returns one verdict per charge, in order.
    pub async fn apply(
        &self,
        charges: &[Charge<B::Key>],
        now: Nanos,
    ) -> Result<Verdicts, StoreError> {
        if charges.is_empty() {
            return Ok(Verdicts::new());
        }
        self.backend
            .transact(Transaction::apply(charges, now))
            .await
    }

    /// Gives back what `charges` took (they were charged, but their answers were never delivered:
    /// the caller cancelled while waiting for its turn). Only leaky-bucket queue slots are given
    /// back; see `limiter::refund`. Called from a drop guard: it never waits (a backend that
    /// cannot refund at once gets a task of its own).
    pub fn refund(&self, charges: &[Charge<B::Key>], now: Nanos) {
        let backend = self.backend.clone();
        let charges: Vec<Charge<B::Key>> = charges.to_vec();
        let mut refund = Box::pin(async move {
            if let Err(e) = backend.transact(Transaction::refund(&charges, now)).await {
                tracing::warn!(error = %e, "leaky-bucket refund failed");
            }
        });
        if refund.as_mut().now_or_never().is_some() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(refund)),
            Err(_) => tracing::warn!("leaky-bucket refund dropped: no async runtime"),
        }
    }

    /// Runs one call on a concurrency key's leases.
    pub async fn lease(&self, call: LeaseCall<'_, B::Key>) -> Result<LeaseAnswer, StoreError> {
        self.backend.lease(call).await
    }

    /// The stored state of a counter, charging nothing (for `/explain`).
    pub(crate) async fn peek(&self, key: &B::Key) -> Result<Option<State>, StoreError> {
        self.backend.peek(key).await
    }

    /// Forgets a counter's state (the quota API's reset); whether it held one.
    pub async fn reset(&self, key: &B::Key) -> Result<bool, StoreError> {
        self.backend.reset(key).await
    }

    /// The stored state of a key, charging nothing (the quota API's listing).
    pub async fn state(&self, key: &B::Key) -> Result<Option<State>, StoreError> {
        self.backend.peek(key).await
    }

    pub fn stats(&self) -> StoreStats {
        self.backend.stats()
    }

    pub fn sweep(&self, now: Nanos) -> usize {
        self.backend.sweep(now)
    }
}
