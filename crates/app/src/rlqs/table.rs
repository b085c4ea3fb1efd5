//! Every RLQS stream and bucket the server knows, behind one lock: reports read into the
//! buckets' shares, assignments computed there and pushed to each stream's outbox (the stream
//! that reported, and any other whose share moved). Memory is bounded: at most
//! [`MAX_BUCKETS_PER_STREAM`] buckets per stream and [`MAX_BUCKETS`] in all, each of at most
//! `MAX_BUCKET_ENTRIES` entries and `MAX_BUCKET_BYTES` bytes (larger ones are not kept, so Envoy
//! keeps its no-assignment behaviour for them); a stream whose outbox is full misses pushes (its
//! next report's answer carries every assignment again). With instances sharing buckets through
//! Redis (`coordinate`), each bucket's shares hand out only this instance's fraction of the pool:
//! a new bucket starts at an even split among the instances last seen alive.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;

use super::actions::{Action, bucket_action};
use super::metrics::QuotaMetrics;
use crate::clock::Nanos;
use crate::engine::Engine;
use crate::policy::Policy;
use crate::quota::bucket::{MAX_BUCKET_BYTES, MAX_BUCKET_ENTRIES, canonical};
use crate::quota::fraction::even;
use crate::quota::{BucketLookup, BucketView, Governed, Mapping, Shares, StreamId};
use crate::store::Backend;

/// Most buckets one stream may report; more are ignored (and counted).
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Most buckets the server tracks in all.
pub const MAX_BUCKETS: usize = 200_000;
/// Longest domain a stream may name.
pub const MAX_DOMAIN_BYTES: usize = 256;

/// A bucket's identity: its domain and its entries sorted.
pub(super) type BucketKey = (String, Vec<(String, String)>);

/// One stream's sending side and what it reported.
struct Stream {
    outbox: mpsc::Sender<RateLimitQuotaResponse>,
    /// The domain of its first message.
    domain: Option<String>,
    buckets: BTreeSet<Arc<BucketKey>>,
}

/// One bucket: the rule that governs it, its shares (limited rules), its streams.
struct Bucket {
    id: BucketId,
    mapping: Mapping,
    shares: Option<Shares>,
    streams: BTreeSet<StreamId>,
}

impl Bucket {
    /// What the bucket's rule says for `stream` now (`None`: not assigned yet).
    fn action(&mut self, stream: StreamId, now: Nanos) -> Option<Action> {
        match (&self.mapping.governed, &mut self.shares) {
            (Governed::Limited { shadow: false, .. }, Some(shares)) => {
                shares.send(stream, now).map(Action::Grant)
            }
            _ => Some(Action::AllowAll),
        }
    }

    /// Whether the bucket's shares are computed (an enforced limited rule).
    fn enforced(&self) -> bool {
        matches!(
            self.mapping.governed,
            Governed::Limited { shadow: false, .. }
        )
    }
}

struct Inner {
    streams: HashMap<StreamId, Stream>,
    buckets: HashMap<Arc<BucketKey>, Bucket>,
    /// The rules the buckets were read on (a reload shows as another snapshot).
    policy: Option<Arc<Policy>>,
    next_stream: StreamId,
    /// Instances sharing the buckets, as last seen (1 without Redis): a new bucket's fraction is
    /// an even split among them until its first exchange.
    instances: usize,
}

/// Messages to send once the lock is released.
type Outgoing = Vec<(StreamId, Vec<(BucketId, Action)>)>;

/// The shared state of the RLQS service.
pub struct Table<B> {
    engine: Arc<Engine<B>>,
    metrics: QuotaMetrics,
    inner: Mutex<Inner>,
}

impl<B: Backend> Table<B> {
    pub fn new(engine: Arc<Engine<B>>, metrics: QuotaMetrics) -> Table<B> {
        Table {
            engine,
            metrics,
            inner: Mutex::new(Inner {
                streams: HashMap::new(),
                buckets: HashMap::new(),
                policy: None,
                next_stream: 1,
                instances: 1,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new stream; its assignments go to `outbox`.
    pub fn open(&self, outbox: mpsc::Sender<RateLimitQuotaResponse>) -> StreamId {
        let mut inner = self.lock();
        let id = inner.next_stream;
        inner.next_stream += 1;
        inner.streams.insert(
            id,
            Stream {
                outbox,
                domain: None,
                buckets: BTreeSet::new(),
            },
        );
        self.metrics.streams.set(inner.streams.len() as i64);
        id
    }

    /// The stream ended: its shares stay held until their TTL, its buckets forget it.
    pub fn close(&self, stream: StreamId) {
        let mut inner = self.lock();
        let Some(gone) = inner.streams.remove(&stream) else {
            return;
        };
        for key in gone.buckets {
            let Some(bucket) = inner.buckets.get_mut(&key) else {
                continue;
            };
            bucket.streams.remove(&stream);
            if let Some(shares) = &mut bucket.shares {
                shares.close(stream);
            }
            if bucket.streams.is_empty() && bucket.shares.as_ref().is_none_or(Shares::is_empty) {
                inner.buckets.remove(&key);
            }
        }
        self.metrics.streams.set(inner.streams.len() as i64);
        self.metrics.buckets.set(inner.buckets.len() as i64);
    }

    /// One message of `stream`: every usage counted, shares moved, and the answer (every reported
    /// bucket's assignment) and pushes (other streams whose share moved) sent.
    pub fn report(&self, stream: StreamId, reports: RateLimitQuotaUsageReports) {
        let now = self.engine.now();
        let mut outgoing: Outgoing = Vec::new();
        let mut answer = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            self.follow_reload(inner, now, &mut outgoing);
            let Some(state) = inner.streams.get_mut(&stream) else {
                return;
            };
            let domain = state
                .domain
                .get_or_insert_with(|| reports.domain.clone())
                .clone();
            let mut touched = Vec::new();
            for usage in reports.bucket_quota_usages {
                self.metrics.reports.inc();
                let Some(id) = usage.bucket_id else {
                    continue;
                };
                let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
                if id.bucket.len() > MAX_BUCKET_ENTRIES
                    || bytes > MAX_BUCKET_BYTES
                    || domain.len() > MAX_DOMAIN_BYTES
                {
                    // Not kept: a hostile stream cannot make the server hold large keys.
                    self.metrics.refused.inc();
                    continue;
                }
                let key = Arc::new((
                    domain.clone(),
                    canonical(id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
                ));
                let Some(state) = inner.streams.get_mut(&stream) else {
                    return;
                };
                let known = state.buckets.contains(&key);
                if !known
                    && (state.buckets.len() >= MAX_BUCKETS_PER_STREAM
                        || (!inner.buckets.contains_key(&key)
                            && inner.buckets.len() >= MAX_BUCKETS))
                {
                    self.metrics.refused.inc();
                    continue;
                }
                state.buckets.insert(key.clone());
                let fraction = even(inner.instances);
                let bucket = inner
                    .buckets
                    .entry(key.clone())
                    .or_insert_with(|| self.new_bucket(&key, id.clone(), fraction, now));
                bucket.streams.insert(stream);
                let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
                let mut shadow_over = 0;
                if let Some(shares) = &mut bucket.shares {
                    shadow_over = shares.report(stream, allowed, denied, now).over;
                }
                if !matches!(
                    bucket.mapping.governed,
                    Governed::Limited { shadow: true, .. }
                ) {
                    shadow_over = 0;
                }
                if bucket.mapping.rule_id().is_some() {
                    self.engine.record_quota_usage(
                        &domain,
                        &bucket.mapping.descriptor,
                        allowed,
                        denied,
                        shadow_over,
                    );
                }
                touched.push(key);
            }
            touched.sort();
            touched.dedup();
            for key in &touched {
                Self::reassign(inner, key, now, stream, &mut outgoing);
            }
            for key in &touched {
                if let Some(bucket) = inner.buckets.get_mut(key)
                    && let Some(action) = bucket.action(stream, now)
                {
                    answer.push((bucket.id.clone(), action));
                }
            }
            self.metrics.buckets.set(inner.buckets.len() as i64);
        }
        if !answer.is_empty() {
            outgoing.push((stream, answer));
        }
        self.send(outgoing);
    }

    /// Recomputes every bucket (demand moving, TTLs passing, a reload), abandons idle buckets,
    /// and pushes what changed. Run every second.
    pub fn tick(&self) {
        let now = self.engine.now();
        let mut outgoing: Outgoing = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            self.follow_reload(inner, now, &mut outgoing);
            let keys: Vec<Arc<BucketKey>> = inner.buckets.keys().cloned().collect();
            for key in keys {
                let Some(bucket) = inner.buckets.get_mut(&key) else {
                    continue;
                };
                if let Some(shares) = &mut bucket.shares {
                    for idle in shares.idle(now) {
                        bucket.streams.remove(&idle);
                        if let Some(stream) = inner.streams.get_mut(&idle) {
                            stream.buckets.remove(&key);
                        }
                        outgoing.push((idle, vec![(bucket.id.clone(), Action::Abandon)]));
                    }
                }
                Self::reassign(inner, &key, now, 0, &mut outgoing);
                if let Some(bucket) = inner.buckets.get(&key)
                    && bucket.streams.is_empty()
                    && bucket.shares.as_ref().is_none_or(Shares::is_empty)
                {
                    inner.buckets.remove(&key);
                }
            }
            self.metrics.buckets.set(inner.buckets.len() as i64);
        }
        self.send(outgoing);
    }

    fn new_bucket(&self, key: &BucketKey, id: BucketId, fraction: f64, now: Nanos) -> Bucket {
        let (_, mapping) = self.engine.map_bucket(&key.0, &key.1);
        let shares = match &mapping.governed {
            Governed::Limited { pool, .. } => {
                let mut shares = Shares::new(*pool, now);
                shares.set_fraction(fraction, now);
                Some(shares)
            }
            _ => None,
        };
        Bucket {
            id,
            mapping,
            shares,
            streams: BTreeSet::new(),
        }
    }

    /// After a reload, reads every bucket again: a changed pool moves the shares, a bucket whose
    /// rule changed kind starts afresh, and its streams are told at once.
    fn follow_reload(&self, inner: &mut Inner, now: Nanos, outgoing: &mut Outgoing) {
        let policy = self.engine.policy();
        if inner
            .policy
            .as_ref()
            .is_some_and(|seen| Arc::ptr_eq(seen, &policy))
        {
            return;
        }
        let first = inner.policy.is_none();
        inner.policy = Some(policy);
        if first {
            return;
        }
        let keys: Vec<Arc<BucketKey>> = inner.buckets.keys().cloned().collect();
        for key in keys {
            let (_, mapping) = self.engine.map_bucket(&key.0, &key.1);
            let Some(bucket) = inner.buckets.get_mut(&key) else {
                continue;
            };
            if bucket.mapping == mapping {
                continue;
            }
            match (&mut bucket.shares, &mapping.governed) {
                (Some(shares), Governed::Limited { pool, .. }) => shares.set_pool(*pool, now),
                (_, Governed::Limited { pool, .. }) => {
                    let mut shares = Shares::new(*pool, now);
                    shares.set_fraction(even(inner.instances), now);
                    for stream in &bucket.streams {
                        shares.report(*stream, 0, 0, now);
                    }
                    bucket.shares = Some(shares);
                }
                (_, _) => bucket.shares = None,
            }
            bucket.mapping = mapping;
            if !bucket.enforced() {
                for stream in &bucket.streams {
                    outgoing.push((*stream, vec![(bucket.id.clone(), Action::AllowAll)]));
                }
            }
        }
    }

    /// Every limited bucket and this instance's demand for it (requests per second), to publish:
    /// enforced ones, and shadow-mode ones, whose over-limit counts follow the fraction too.
    pub(super) fn demands(&self) -> Vec<(Arc<BucketKey>, f64)> {
        let inner = self.lock();
        inner
            .buckets
            .iter()
            .filter_map(|(key, b)| Some((key.clone(), b.shares.as_ref()?.demand())))
            .collect()
    }

    /// This instance's fraction of each bucket's pool, from an exchange, and the instances seen
    /// alive: buckets whose fraction moved are reassigned and their streams told at once.
    pub(super) fn set_fractions(&self, fractions: Vec<(Arc<BucketKey>, f64)>, instances: usize) {
        let now = self.engine.now();
        let mut outgoing: Outgoing = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            inner.instances = instances.max(1);
            for (key, fraction) in fractions {
                let moved = inner
                    .buckets
                    .get_mut(&key)
                    .and_then(|b| b.shares.as_mut())
                    .is_some_and(|shares| shares.set_fraction(fraction, now));
                if moved {
                    Self::reassign(inner, &key, now, 0, &mut outgoing);
                }
            }
        }
        self.send(outgoing);
    }

    /// The RLQS series.
    pub(super) fn metrics(&self) -> &QuotaMetrics {
        &self.metrics
    }

    /// Moves a bucket's shares and queues the changed grants; `answering`'s own are left to its
    /// answer.
    fn reassign(
        inner: &mut Inner,
        key: &Arc<BucketKey>,
        now: Nanos,
        answering: StreamId,
        outgoing: &mut Outgoing,
    ) {
        let Some(bucket) = inner.buckets.get_mut(key) else {
            return;
        };
        if !bucket.enforced() {
            return;
        }
        let Some(shares) = &mut bucket.shares else {
            return;
        };
        for (stream, grant) in shares.assign(now) {
            if stream == answering || !inner.streams.contains_key(&stream) {
                continue;
            }
            shares.send(stream, now);
            outgoing.push((stream, vec![(bucket.id.clone(), Action::Grant(grant))]));
        }
    }

    /// Sends each stream its actions, one message per stream; a full outbox misses this one.
    fn send(&self, outgoing: Outgoing) {
        if outgoing.is_empty() {
            return;
        }
        let mut by_stream: HashMap<StreamId, Vec<(BucketId, Action)>> = HashMap::new();
        for (stream, actions) in outgoing {
            by_stream.entry(stream).or_default().extend(actions);
        }
        let inner = self.lock();
        for (stream, actions) in by_stream {
            let Some(state) = inner.streams.get(&stream) else {
                continue;
            };
            for (_, action) in &actions {
                self.metrics
                    .assignments
                    .with_label_values(&[action.kind()])
                    .inc();
            }
            let message = RateLimitQuotaResponse {
                bucket_action: actions
                    .iter()
                    .map(|(id, action)| bucket_action(id, *action))
                    .collect(),
            };
            if state.outbox.try_send(message).is_err() {
                tracing::debug!(stream, "RLQS outbox full or closed: a push is dropped");
            }
        }
    }
}

impl<B: Backend> BucketLookup for Table<B> {
    fn view(&self, domain: &str, entries: &[(String, String)]) -> Option<BucketView> {
        let key = (
            domain.to_owned(),
            canonical(entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        );
        let inner = self.lock();
        let bucket = inner.buckets.get(&key)?;
        Some(BucketView {
            mapping: bucket.mapping.clone(),
            fraction: bucket.shares.as_ref().map_or(1.0, Shares::fraction),
            grants: bucket
                .shares
                .as_ref()
                .map(Shares::grants)
                .unwrap_or_default(),
        })
    }
}
