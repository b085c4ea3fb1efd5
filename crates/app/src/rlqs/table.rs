//! Every RLQS stream and bucket the server knows, behind one lock: reports read into the
//! buckets' shares, assignments computed there and pushed to each stream's outbox (the stream
//! that reported, and any other whose share moved). Memory is bounded: at most
//! [`MAX_BUCKETS_PER_STREAM`] buckets per stream and [`MAX_BUCKETS`] in all, each of at most
//! `MAX_BUCKET_ENTRIES` entries and `MAX_BUCKET_BYTES` bytes (larger ones are not kept, so Envoy
//! keeps its no-assignment behaviour for them; each refused bucket is counted once per stream);
//! a stream's outbox keeps only the newest action per bucket (`outbox`). The ticker visits only
//! the buckets that are due (`quota::deadlines`): an idle bucket costs nothing between its
//! deadlines. With instances sharing buckets through
//! Redis (`coordinate`), each bucket's shares hand out only this instance's fraction of the pool:
//! a new bucket starts at an even split among the instances last seen alive; and the table marks
//! the buckets whose published demand moved, so the exchange takes only those each second
//! ([`Table::demands`]), not every bucket.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use litemap::LiteMap;

use super::actions::Action;
use super::metrics::QuotaMetrics;
use super::outbox::Outbox;
use ratelimit_core::clock::Nanos;
use ratelimit_core::engine::Engine;
use ratelimit_core::policy::Policy;
use ratelimit_core::quota::fraction::even;
use ratelimit_core::quota::{
    BucketLookup, BucketView, Deadlines, Governed, Mapping, Shares, StreamId, Unruled,
};
use ratelimit_core::quota::{MAX_BUCKET_BYTES, MAX_BUCKET_ENTRIES, canonical};
use ratelimit_core::store::Backend;

/// Most buckets one stream may report; more are ignored (and counted).
pub(super) const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Most buckets the server tracks in all.
pub(super) const MAX_BUCKETS: usize = 200_000;
/// Longest domain a stream may name.
pub(super) const MAX_DOMAIN_BYTES: usize = 256;
/// Refused buckets a stream remembers, so that each is counted once; past it, a refused bucket
/// the stream has not been refused before is counted at each report.
pub(super) const MAX_REFUSED_PER_STREAM: usize = 10_000;

/// A bucket's identity: its domain and its entries sorted.
pub(super) type BucketKey = (String, Vec<(String, String)>);

/// One stream's sending side and what it reported.
struct Stream {
    outbox: Arc<Outbox>,
    /// The domain of its first message.
    domain: Option<String>,
    buckets: BTreeSet<Arc<BucketKey>>,
    /// Hashes of the buckets refused on this stream (each is counted once).
    refused: HashSet<u64>,
}

impl Stream {
    /// Counts a refused bucket once per stream (as long as it can remember it).
    fn refuse(&mut self, metrics: &QuotaMetrics, domain: &str, id: &BucketId) {
        let hash = bucket_hash(domain, id);
        if self.refused.contains(&hash) {
            return;
        }
        if self.refused.len() < MAX_REFUSED_PER_STREAM {
            self.refused.insert(hash);
        }
        metrics.refused.inc();
    }
}

/// A bucket's identity as a hash, whatever the order of its entries.
fn bucket_hash(domain: &str, id: &BucketId) -> u64 {
    let entries = id.bucket.iter().fold(0u64, |sum, entry| {
        let mut h = DefaultHasher::new();
        entry.hash(&mut h);
        sum.wrapping_add(h.finish())
    });
    let mut h = DefaultHasher::new();
    (domain, entries, id.bucket.len()).hash(&mut h);
    h.finish()
}

/// One bucket: the rule that governs it, its shares (limited rules), its streams.
struct Bucket {
    id: BucketId,
    mapping: Mapping,
    shares: Option<Shares>,
    /// Its streams, in order (a sorted `Vec`: most buckets have one, where a `BTreeSet`
    /// allocates a node of eleven).
    streams: LiteMap<StreamId, ()>,
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

    /// What this instance publishes for the bucket: its demand while its rule limits it
    /// (enforced or shadow mode) and an open stream reports it; `None`: it holds nothing.
    fn published(&self) -> Option<f64> {
        self.shares
            .as_ref()
            .filter(|s| s.has_open())
            .map(Shares::demand)
    }
}

/// What `bucket` (if still there) publishes.
fn published(bucket: Option<&Bucket>) -> Option<f64> {
    bucket.and_then(Bucket::published)
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
    /// When each bucket with shares next needs the ticker.
    due: Deadlines<Arc<BucketKey>>,
    /// An exchange takes the demands (`Table::demands` was called): only then are the buckets
    /// whose published demand moved marked, so a server without one keeps no such set.
    exchanged: bool,
    /// Buckets whose published demand (or whether there is one) may have moved since the last
    /// `Table::demands`.
    marked: HashSet<Arc<BucketKey>>,
}

impl Inner {
    /// Marks `key` for the exchange if what it publishes is no longer `before` (a report, a
    /// stream closed or gone idle, the bucket made, dropped or re-mapped by a reload).
    fn mark_if_moved(&mut self, key: &Arc<BucketKey>, before: Option<f64>) {
        if self.exchanged && published(self.buckets.get(key)) != before {
            self.marked.insert(key.clone());
        }
    }

    /// Schedules `key`'s next visit by the ticker (if its shares will ever need one).
    fn settle(&mut self, key: &Arc<BucketKey>, now: Nanos) {
        let next = self
            .buckets
            .get(key)
            .and_then(|b| b.shares.as_ref())
            .and_then(|shares| shares.next_due(now));
        if let Some(at) = next {
            self.due.schedule(key.clone(), at);
        }
    }

    /// Forgets `key` if no stream reports it and no closed stream's share still binds.
    fn drop_if_unused(&mut self, key: &Arc<BucketKey>) {
        if self.buckets.get(key).is_some_and(|bucket| {
            bucket.streams.is_empty() && bucket.shares.as_ref().is_none_or(Shares::is_empty)
        }) {
            self.buckets.remove(key);
            self.due.remove(key);
        }
    }
}

/// Actions to queue once the lock is released: per stream, (bucket, its id, the action).
type Outgoing = Vec<(StreamId, Vec<(Arc<BucketKey>, BucketId, Action)>)>;

/// The shared state of the RLQS service.
pub(crate) struct Table<B> {
    engine: Arc<Engine<B>>,
    metrics: QuotaMetrics,
    inner: Mutex<Inner>,
}

impl<B: Backend> Table<B> {
    pub(crate) fn new(engine: Arc<Engine<B>>, metrics: QuotaMetrics) -> Table<B> {
        Table {
            engine,
            metrics,
            inner: Mutex::new(Inner {
                streams: HashMap::new(),
                buckets: HashMap::new(),
                policy: None,
                next_stream: 1,
                instances: 1,
                due: Deadlines::new(),
                exchanged: false,
                marked: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new stream's outbox (its assignments go there; the stream's writer drains it).
    pub(crate) fn outbox(&self) -> Arc<Outbox> {
        Outbox::new(self.metrics.clone())
    }

    /// A new stream; its assignments go to `outbox`.
    pub(crate) fn open(&self, outbox: Arc<Outbox>) -> StreamId {
        let mut inner = self.lock();
        let id = inner.next_stream;
        inner.next_stream += 1;
        inner.streams.insert(
            id,
            Stream {
                outbox,
                domain: None,
                buckets: BTreeSet::new(),
                refused: HashSet::new(),
            },
        );
        self.metrics.streams.set(inner.streams.len() as i64);
        id
    }

    /// The stream ended: its shares stay held until their TTL (a shadow-mode bucket's, which
    /// bind nothing, go at once), its buckets forget it, its outbox writes what is pending and
    /// ends.
    pub(crate) fn close(&self, stream: StreamId) {
        let now = self.engine.now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(gone) = inner.streams.remove(&stream) else {
            return;
        };
        gone.outbox.close();
        for key in gone.buckets {
            let Some(bucket) = inner.buckets.get_mut(&key) else {
                continue;
            };
            let before = bucket.published();
            bucket.streams.remove(&stream);
            let enforced = bucket.enforced();
            if let Some(shares) = &mut bucket.shares {
                if enforced {
                    shares.close(stream);
                } else {
                    shares.remove(stream);
                }
            }
            inner.drop_if_unused(&key);
            inner.mark_if_moved(&key, before);
            // The others' shares move at the next tick.
            if inner.buckets.contains_key(&key) {
                inner.due.schedule(key, now);
            }
        }
        self.metrics.streams.set(inner.streams.len() as i64);
        self.metrics.buckets.set(inner.buckets.len() as i64);
    }

    /// One message of `stream`: every usage counted, shares moved, and the answer (every reported
    /// bucket's assignment) and pushes (other streams whose share moved) sent.
    pub(crate) fn report(&self, stream: StreamId, reports: RateLimitQuotaUsageReports) {
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
                let Some(key) = self.admit(inner, stream, &domain, &id) else {
                    continue;
                };
                let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
                self.count_usage(inner, stream, (&key, id), (allowed, denied), now);
                touched.push(key);
            }
            touched.sort();
            touched.dedup();
            for key in &touched {
                Self::reassign(inner, key, now, stream, &mut outgoing);
            }
            for key in touched {
                if let Some(bucket) = inner.buckets.get_mut(&key)
                    && let Some(action) = bucket.action(stream, now)
                {
                    answer.push((key.clone(), bucket.id.clone(), action));
                }
                inner.settle(&key, now);
            }
            self.metrics.buckets.set(inner.buckets.len() as i64);
        }
        if !answer.is_empty() {
            outgoing.push((stream, answer));
        }
        self.send(outgoing);
    }

    /// The key of bucket `id` that `stream` reports, now bound to the stream; `None` (the refusal
    /// counted once) when the bucket is too large or a bucket cap is reached.
    fn admit(
        &self,
        inner: &mut Inner,
        stream: StreamId,
        domain: &str,
        id: &BucketId,
    ) -> Option<Arc<BucketKey>> {
        let state = inner.streams.get_mut(&stream)?;
        let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
        if id.bucket.len() > MAX_BUCKET_ENTRIES
            || bytes > MAX_BUCKET_BYTES
            || domain.len() > MAX_DOMAIN_BYTES
        {
            // Not kept: a hostile stream cannot make the server hold large keys.
            state.refuse(&self.metrics, domain, id);
            return None;
        }
        let key = Arc::new((
            domain.to_owned(),
            canonical(id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        ));
        let known = state.buckets.contains(&key);
        if !known
            && (state.buckets.len() >= MAX_BUCKETS_PER_STREAM
                || (!inner.buckets.contains_key(&key) && inner.buckets.len() >= MAX_BUCKETS))
        {
            state.refuse(&self.metrics, domain, id);
            return None;
        }
        state.buckets.insert(key.clone());
        Some(key)
    }

    /// One bucket's usage from `stream`: the bucket made if new, the stream's share told what it
    /// admitted, and the rule's series counted (shadow mode: what the share would have denied).
    fn count_usage(
        &self,
        inner: &mut Inner,
        stream: StreamId,
        (key, id): (&Arc<BucketKey>, BucketId),
        (allowed, denied): (u64, u64),
        now: Nanos,
    ) {
        let fraction = even(inner.instances);
        let bucket = inner
            .buckets
            .entry(key.clone())
            .or_insert_with(|| self.new_bucket(key, id, fraction, now));
        bucket.streams.insert(stream, ());
        let before = bucket.published();
        let mut shadow_over = 0;
        if let Some(shares) = &mut bucket.shares {
            shadow_over = shares.report(stream, allowed, denied, now).over;
        }
        if inner.exchanged && bucket.published() != before {
            inner.marked.insert(key.clone());
        }
        if !matches!(
            bucket.mapping.governed,
            Governed::Limited { shadow: true, .. }
        ) {
            shadow_over = 0;
        }
        if bucket.mapping.rule_id().is_some() {
            self.engine.record_quota_usage(
                &key.0,
                &bucket.mapping.descriptor,
                allowed,
                denied,
                shadow_over,
            );
        }
    }

    /// Recomputes the buckets that are due (an idle stream, a closed stream's TTL passing, a
    /// share waiting for the ledger, a reload), abandons idle buckets, and pushes what changed.
    /// Run every second; a bucket that is not due costs nothing.
    pub(crate) fn tick(&self) {
        let now = self.engine.now();
        let mut outgoing: Outgoing = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            self.follow_reload(inner, now, &mut outgoing);
            for key in inner.due.due(now) {
                let Some(bucket) = inner.buckets.get_mut(&key) else {
                    continue;
                };
                let before = bucket.published();
                if let Some(shares) = &mut bucket.shares {
                    for idle in shares.idle(now) {
                        bucket.streams.remove(&idle);
                        if let Some(stream) = inner.streams.get_mut(&idle) {
                            stream.buckets.remove(&key);
                        }
                        outgoing.push((
                            idle,
                            vec![(key.clone(), bucket.id.clone(), Action::Abandon)],
                        ));
                    }
                }
                Self::reassign(inner, &key, now, 0, &mut outgoing);
                inner.drop_if_unused(&key);
                inner.mark_if_moved(&key, before);
                inner.settle(&key, now);
            }
            self.metrics.buckets.set(inner.buckets.len() as i64);
        }
        self.send(outgoing);
    }

    fn new_bucket(&self, key: &BucketKey, id: BucketId, fraction: f64, now: Nanos) -> Bucket {
        let (_, mapping) = self.engine.map_bucket(&key.0, &key.1);
        if mapping.governed == Governed::AllowAll(Unruled::UnknownDomain) {
            self.engine.quota_domain_not_found(&key.0);
        }
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
            streams: LiteMap::with_capacity(1),
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
            let before = bucket.published();
            match (&mut bucket.shares, &mapping.governed) {
                (Some(shares), Governed::Limited { pool, .. }) => shares.set_pool(*pool, now),
                (_, Governed::Limited { pool, .. }) => {
                    let mut shares = Shares::new(*pool, now);
                    shares.set_fraction(even(inner.instances), now);
                    for stream in bucket.streams.keys() {
                        shares.report(*stream, 0, 0, now);
                    }
                    bucket.shares = Some(shares);
                }
                (_, _) => bucket.shares = None,
            }
            bucket.mapping = mapping;
            if !bucket.enforced() {
                for stream in bucket.streams.keys() {
                    outgoing.push((
                        *stream,
                        vec![(key.clone(), bucket.id.clone(), Action::AllowAll)],
                    ));
                }
            }
            inner.mark_if_moved(&key, before);
            // The shares move at this tick (or the next one, after a report).
            inner.due.remove(&key);
            inner.due.schedule(key, now);
        }
    }

    /// What this instance publishes that changed since the last call: each bucket whose demand
    /// (requests per second) may have moved, with its demand now, or `None` where it holds the
    /// bucket no more. It holds the limited buckets an open stream reports: enforced ones, and
    /// shadow-mode ones, whose over-limit counts follow the fraction too. The first call gives
    /// every bucket held, and from then on the table marks the buckets that move, so a call
    /// costs what moved, not every bucket.
    pub(super) fn demands(&self) -> Vec<(Arc<BucketKey>, Option<f64>)> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.exchanged {
            inner.exchanged = true;
            return inner
                .buckets
                .iter()
                .filter_map(|(key, b)| Some((key.clone(), Some(b.published()?))))
                .collect();
        }
        let marked = std::mem::take(&mut inner.marked);
        marked
            .into_iter()
            .map(|key| {
                let now = published(inner.buckets.get(&key));
                (key, now)
            })
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
                    inner.settle(&key, now);
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
            outgoing.push((
                stream,
                vec![(key.clone(), bucket.id.clone(), Action::Grant(grant))],
            ));
        }
    }

    /// Queues each stream's actions in its outbox (the newest per bucket is kept).
    fn send(&self, outgoing: Outgoing) {
        if outgoing.is_empty() {
            return;
        }
        let mut by_stream: HashMap<StreamId, Vec<(Arc<BucketKey>, BucketId, Action)>> =
            HashMap::new();
        for (stream, actions) in outgoing {
            by_stream.entry(stream).or_default().extend(actions);
        }
        let outboxes: Vec<(StreamId, Arc<Outbox>, _)> = {
            let inner = self.lock();
            by_stream
                .into_iter()
                .filter_map(|(stream, actions)| {
                    Some((stream, inner.streams.get(&stream)?.outbox.clone(), actions))
                })
                .collect()
        };
        for (stream, outbox, actions) in outboxes {
            let dropped = outbox.push(actions);
            if dropped > 0 {
                tracing::debug!(
                    stream,
                    dropped,
                    "RLQS outbox full or closed: actions dropped"
                );
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use ratelimit_core::clock::{ManualClock, NANOS_PER_SECOND};
    use ratelimit_core::engine::{EngineSettings, Rules};
    use ratelimit_core::policy::Policy;
    use ratelimit_core::quota::ASSIGNMENT_TTL_SECS;
    use ratelimit_core::store::Store;
    use ratelimit_core::store::memory::MemoryBackend;

    use super::*;

    const LIMITED: &str = "
domain: d
descriptors:
  - key: name
    value: limited
    descriptors:
      - key: n
        rate_limit: {unit: minute, requests_per_unit: 10}
";

    fn policy(yaml: &str) -> Policy {
        let configs = ratelimit_core::config::parse_files(&[("t.yaml".into(), yaml.to_owned())])
            .expect("valid rules");
        Policy::new(&configs)
    }

    fn table() -> (Table<MemoryBackend>, ManualClock) {
        let clock = ManualClock::new(1_767_225_600 * NANOS_PER_SECOND);
        let engine = Engine::new(
            policy(LIMITED),
            Store::new(MemoryBackend::new(1000)),
            Arc::new(clock.clone()),
            EngineSettings::default(),
        );
        let metrics = QuotaMetrics::register(&prometheus::Registry::new());
        (Table::new(Arc::new(engine), metrics), clock)
    }

    fn id(n: &str) -> BucketId {
        BucketId {
            bucket: [("name", "limited"), ("n", n)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// One message of `(bucket, allowed, denied)`.
    fn report(usages: &[(&str, u64, u64)]) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "d".to_owned(),
            bucket_quota_usages: usages
                .iter()
                .map(|(n, allowed, denied)| BucketQuotaUsage {
                    bucket_id: Some(id(n)),
                    time_elapsed: None,
                    num_requests_allowed: *allowed,
                    num_requests_denied: *denied,
                })
                .collect(),
        }
    }

    /// The changes since the last call, by bucket `n`, in `n` order.
    fn changes<B: Backend>(table: &Table<B>) -> Vec<(String, Option<f64>)> {
        let mut changes: Vec<_> = table
            .demands()
            .into_iter()
            .map(|(key, demand)| {
                let n = key.1.iter().find(|(k, _)| k == "n").map(|(_, v)| v.clone());
                (n.unwrap_or_default(), demand)
            })
            .collect();
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        changes
    }

    #[test]
    fn the_first_call_gives_every_bucket_held_and_then_only_what_moved() {
        let (table, clock) = table();
        let s = table.open(table.outbox());
        table.report(s, report(&[("a", 2, 0), ("b", 1, 0)]));
        assert_eq!(
            changes(&table),
            vec![("a".into(), Some(2.0)), ("b".into(), Some(1.0))]
        );
        assert!(changes(&table).is_empty());
        // The same usage a second later: the demand did not move, nothing marked.
        clock.advance(Duration::from_secs(1));
        table.report(s, report(&[("a", 2, 0), ("b", 1, 0)]));
        table.tick();
        assert!(changes(&table).is_empty());
        // a's usage moves: a alone (the average of 2 and 6 a second).
        clock.advance(Duration::from_secs(1));
        table.report(s, report(&[("a", 6, 0), ("b", 1, 0)]));
        assert_eq!(changes(&table), vec![("a".into(), Some(4.0))]);
        // A new bucket is marked when it is first held.
        table.report(s, report(&[("c", 1, 0)]));
        assert_eq!(changes(&table), vec![("c".into(), Some(1.0))]);
    }

    #[test]
    fn a_closed_stream_unholds_its_buckets_and_another_open_one_moves_the_demand() {
        let (table, clock) = table();
        let (s1, s2) = (table.open(table.outbox()), table.open(table.outbox()));
        table.report(s1, report(&[("a", 2, 0), ("b", 1, 0)]));
        table.report(s2, report(&[("b", 3, 0)]));
        assert_eq!(
            changes(&table),
            vec![("a".into(), Some(2.0)), ("b".into(), Some(4.0))]
        );
        table.close(s1);
        // a is held by no open stream (its share still binds until the TTL, but is not
        // published); b is s2's demand alone.
        assert_eq!(
            changes(&table),
            vec![("a".into(), None), ("b".into(), Some(3.0))]
        );
        // The TTL passes: a is dropped, which publishes nothing new.
        clock.advance(Duration::from_secs(ASSIGNMENT_TTL_SECS + 1));
        table.tick();
        assert!(changes(&table).is_empty());
    }

    #[test]
    fn a_stream_gone_idle_unholds_the_bucket_when_the_ticker_abandons_it() {
        let (table, clock) = table();
        let s = table.open(table.outbox());
        table.report(s, report(&[("a", 2, 0)]));
        assert_eq!(changes(&table), vec![("a".into(), Some(2.0))]);
        // Reports of nothing for 50 s: the demand falls; at a minute the stream is idle.
        for _ in 0..5 {
            clock.advance(Duration::from_secs(10));
            table.report(s, report(&[("a", 0, 0)]));
            table.tick();
        }
        let moved = changes(&table);
        assert_eq!(moved.len(), 1);
        assert!(moved[0].1.is_some_and(|d| d > 0.0 && d < 0.1));
        clock.advance(Duration::from_secs(10));
        table.tick();
        assert_eq!(changes(&table), vec![("a".into(), None)]);
    }

    #[test]
    fn a_reload_that_re_maps_a_bucket_marks_it() {
        let (table, clock) = table();
        let s = table.open(table.outbox());
        table.report(s, report(&[("a", 2, 0)]));
        assert_eq!(changes(&table), vec![("a".into(), Some(2.0))]);
        // The rule no longer limits: the bucket is held no more.
        let other = LIMITED.replace("value: limited", "value: other");
        Rules::set_policy(&*table.engine, policy(&other));
        clock.advance(Duration::from_secs(1));
        table.tick();
        assert_eq!(changes(&table), vec![("a".into(), None)]);
        // Limited again: held again, with its stream's report of nothing yet.
        Rules::set_policy(&*table.engine, policy(LIMITED));
        clock.advance(Duration::from_secs(1));
        table.tick();
        assert_eq!(changes(&table), vec![("a".into(), Some(0.0))]);
        // A reload that changes nothing for the bucket marks nothing.
        Rules::set_policy(&*table.engine, policy(LIMITED));
        clock.advance(Duration::from_secs(1));
        table.tick();
        assert!(changes(&table).is_empty());
    }

    #[test]
    fn without_an_exchange_nothing_is_marked() {
        let (table, _clock) = table();
        let s = table.open(table.outbox());
        table.report(s, report(&[("a", 2, 0)]));
        table.close(s);
        assert!(table.lock().marked.is_empty());
    }
}
