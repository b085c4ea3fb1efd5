//! A request waiting for, or in, a call: its charges, its time, and where its verdicts go.

use std::time::Instant;

use ratelimit_core::clock::Nanos;
use ratelimit_core::store::TransactionKind;
use ratelimit_core::store::{Charge, StoreError, Transaction, Verdicts};
use tokio::sync::oneshot;

use crate::key::TextKey;

/// Where a request's verdicts (or its call's error) go.
pub(crate) type Reply = oneshot::Sender<Result<Verdicts, StoreError>>;

/// A request waiting for, or in, a call.
pub(crate) struct Pending {
    pub(crate) charges: Vec<Charge<TextKey>>,
    pub(crate) now: Nanos,
    /// Where its verdicts go; `None` for a refund (nobody waits for it).
    pub(crate) reply: Option<Reply>,
    pub(crate) arrived: Instant,
}

impl Pending {
    /// Its caller went away before it was decided.
    pub(crate) fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
    }

    /// The transaction it asks for: a decision, or a refund nobody waits for.
    pub(crate) fn transaction(&self) -> Transaction<'_, TextKey> {
        Transaction {
            charges: &self.charges,
            now: self.now,
            kind: if self.reply.is_none() {
                TransactionKind::Refund
            } else {
                TransactionKind::Apply
            },
        }
    }
}
