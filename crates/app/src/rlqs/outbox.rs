//! One RLQS stream's outbox: the newest action per bucket waiting to be written, in the order
//! the buckets were first queued, at most [`MAX_PENDING`]. The stream's writer takes everything
//! pending as one message each time the client can take one, so a client that reads slowly (or
//! never) holds at most one action per bucket here, not every message the server meant to send.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use futures_util::Stream;
use tokio::sync::Notify;

use super::actions::{Action, bucket_action};
use super::metrics::QuotaMetrics;
use super::table::BucketKey;

/// Most actions one stream's outbox holds (twice a stream's bucket cap: a bucket it was told to
/// abandon may come back before the abandon is written); a new bucket's action past it is
/// dropped (its next report's answer carries it).
pub(super) const MAX_PENDING: usize = 20_000;

#[derive(Default)]
struct Pending {
    actions: HashMap<Arc<BucketKey>, (BucketId, Action)>,
    /// The buckets in `actions`, in the order they were first queued.
    order: VecDeque<Arc<BucketKey>>,
    closed: bool,
}

/// The actions waiting for one stream's client.
pub(crate) struct Outbox {
    pending: Mutex<Pending>,
    ready: Notify,
    metrics: QuotaMetrics,
}

impl Outbox {
    pub(crate) fn new(metrics: QuotaMetrics) -> Arc<Outbox> {
        Arc::new(Outbox {
            pending: Mutex::new(Pending::default()),
            ready: Notify::new(),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues each action, replacing one still pending for the same bucket; returns how many
    /// were dropped (the outbox full, or closed).
    pub(crate) fn push(&self, actions: Vec<(Arc<BucketKey>, BucketId, Action)>) -> usize {
        let mut pending = self.lock();
        if pending.closed {
            return actions.len();
        }
        let mut dropped = 0;
        let mut queued = 0;
        for (key, id, action) in actions {
            let full = pending.actions.len() >= MAX_PENDING;
            match pending.actions.entry(key) {
                Entry::Occupied(mut slot) => {
                    slot.insert((id, action));
                    queued += 1;
                }
                Entry::Vacant(_) if full => dropped += 1,
                Entry::Vacant(slot) => {
                    let key = slot.key().clone();
                    slot.insert((id, action));
                    pending.order.push_back(key);
                    self.metrics.outbox_pending.inc();
                    queued += 1;
                }
            }
        }
        drop(pending);
        if queued > 0 {
            self.ready.notify_one();
        }
        dropped
    }

    /// Actions pending.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().actions.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// No more actions are queued; what is pending is still written, then the stream ends.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// Everything pending as one message, once there is any; `None` once closed and empty.
    async fn next(&self) -> Option<RateLimitQuotaResponse> {
        loop {
            if let Some(message) = self.take() {
                return Some(message);
            }
            if self.lock().closed {
                // Something queued between the two looks is still written.
                return self.take();
            }
            self.ready.notified().await;
        }
    }

    fn take(&self) -> Option<RateLimitQuotaResponse> {
        let mut pending = self.lock();
        if pending.order.is_empty() {
            return None;
        }
        let order = std::mem::take(&mut pending.order);
        let mut actions = std::mem::take(&mut pending.actions);
        drop(pending);
        self.metrics.outbox_pending.sub(order.len() as i64);
        let mut message = RateLimitQuotaResponse {
            bucket_action: Vec::with_capacity(order.len()),
        };
        for key in order {
            if let Some((id, action)) = actions.remove(&key) {
                self.metrics
                    .assignments
                    .with_label_values(&[action.kind()])
                    .inc();
                message.bucket_action.push(bucket_action(&id, action));
            }
        }
        Some(message)
    }

    /// Forgets what is pending (the client is gone).
    fn clear(&self) {
        let mut pending = self.lock();
        pending.closed = true;
        let n = pending.order.len();
        pending.order.clear();
        pending.actions.clear();
        drop(pending);
        self.metrics.outbox_pending.sub(n as i64);
    }
}

/// The writing end: clears the outbox when the transport drops it (the client went away).
struct Writer(Arc<Outbox>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.clear();
    }
}

/// The stream of messages the client reads: each one everything pending when it could take one.
pub(super) fn messages(outbox: Arc<Outbox>) -> impl Stream<Item = RateLimitQuotaResponse> + Send {
    futures_util::stream::unfold(Writer(outbox), |writer| async move {
        let message = writer.0.next().await?;
        Some((message, writer))
    })
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use ratelimit_core::quota::Grant;

    fn key(n: usize) -> (Arc<BucketKey>, BucketId) {
        let entries = vec![("k".to_owned(), n.to_string())];
        let id = BucketId {
            bucket: entries.iter().cloned().collect(),
        };
        (Arc::new(("d".to_owned(), entries)), id)
    }

    fn action(n: usize, action: Action) -> (Arc<BucketKey>, BucketId, Action) {
        let (key, id) = key(n);
        (key, id, action)
    }

    fn outbox() -> Arc<Outbox> {
        Outbox::new(QuotaMetrics::register(&prometheus::Registry::new()))
    }

    #[tokio::test]
    async fn only_the_newest_action_per_bucket_waits_in_first_queued_order() {
        let outbox = outbox();
        for round in 0..100 {
            let kind = if round % 2 == 0 {
                Action::AllowAll
            } else {
                Action::Grant(Grant::DenyAll)
            };
            outbox.push(vec![action(1, kind), action(2, Action::AllowAll)]);
        }
        outbox.push(vec![action(3, Action::Abandon)]);
        assert_eq!(outbox.len(), 3);
        assert_eq!(outbox.metrics.outbox_pending.get(), 3);
        let mut messages = Box::pin(messages(outbox.clone()));
        let message = messages.next().await.expect("a message");
        let buckets: Vec<String> = message
            .bucket_action
            .iter()
            .map(|a| a.bucket_id.as_ref().unwrap().bucket["k"].clone())
            .collect();
        assert_eq!(buckets, ["1", "2", "3"]);
        assert_eq!(
            message.bucket_action[0].bucket_action,
            bucket_action(&key(1).1, Action::Grant(Grant::DenyAll)).bucket_action
        );
        assert_eq!(outbox.metrics.outbox_pending.get(), 0);
    }

    #[tokio::test]
    async fn a_full_outbox_drops_new_buckets_but_still_replaces_pending_ones() {
        let outbox = outbox();
        let all: Vec<_> = (0..MAX_PENDING + 10)
            .map(|n| action(n, Action::AllowAll))
            .collect();
        assert_eq!(outbox.push(all), 10);
        assert_eq!(outbox.push(vec![action(0, Action::Abandon)]), 0);
        assert_eq!(outbox.len(), MAX_PENDING);
    }

    #[tokio::test]
    async fn a_closed_outbox_writes_what_is_pending_then_ends_and_a_dropped_writer_clears_it() {
        let outbox = outbox();
        outbox.push(vec![action(1, Action::AllowAll)]);
        outbox.close();
        assert_eq!(outbox.push(vec![action(2, Action::AllowAll)]), 1);
        let mut stream = Box::pin(messages(outbox.clone()));
        assert_eq!(stream.next().await.unwrap().bucket_action.len(), 1);
        assert!(stream.next().await.is_none());

        let outbox = self::outbox();
        outbox.push(vec![
            action(1, Action::AllowAll),
            action(2, Action::AllowAll),
        ]);
        drop(messages(outbox.clone()));
        assert!(outbox.is_empty());
        assert_eq!(outbox.metrics.outbox_pending.get(), 0);
    }
}
