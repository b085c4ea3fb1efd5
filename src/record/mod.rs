//! `serve --record FILE`: every ShouldRateLimit decision (gRPC and `POST /json`) as one JSON line
//! (docs/record.md), written off the hot path. A decision is sampled, then moved (not copied)
//! into a bounded queue with `try_send`: a full queue drops it and counts it, so recording never
//! slows or blocks an answer. One writer thread encodes the lines (`line`), hashing values when
//! asked (`hash`), and appends them in batches to the file, which rotates by size and survives
//! write errors (`writer`).

mod hash;
mod line;
mod metrics;
mod sample;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prometheus::Registry;
use prost::Message;

pub use hash::HashKey;
pub use line::{Answer, Decided, Values, encode, rfc3339};
pub use metrics::{DropReason, RecordMetrics};
pub use sample::Sampler;
pub use writer::{FileSpec, RecordFile};

use crate::clock::Nanos;
use crate::policy::Policy;

/// What `--record` and its companions ask for.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub file: FileSpec,
    /// Share of decisions recorded, in (0, 1].
    pub sample: f64,
    /// With `--record-hash-values`: the key values are hashed with.
    pub hash_key: Option<HashKey>,
    /// Lines the queue holds before decisions are dropped.
    pub queue: usize,
    /// Bytes (requests' encoded sizes) the queue holds before decisions are dropped.
    pub queue_bytes: usize,
}

/// The live rules, for the values they name (kept clear when hashing).
pub type LivePolicy = Arc<dyn Fn() -> Arc<Policy> + Send + Sync>;

/// A batch is written once it is this large (or the queue is empty).
const BATCH_BYTES: usize = 64 * 1024;
/// How often the writer drains the queue. It sleeps between drains instead of waiting on the
/// queue, so a decision's `try_send` never has to wake it (no futex on the answering thread) and
/// lines are written in batches, not one `write` per decision. Lines reach the file within this.
const DRAIN_EVERY: Duration = Duration::from_millis(5);

/// The hot-path side: sampling and the queue. Shared by the gRPC and HTTP faces.
pub struct Recorder {
    queue: SyncSender<Option<Decided>>,
    sampler: Sampler,
    metrics: RecordMetrics,
    stop: Arc<AtomicBool>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Encoded bytes of the requests queued now, and their bound.
    queued_bytes: Arc<AtomicUsize>,
    queue_bytes: usize,
}

impl Recorder {
    /// Opens the file (an error stops the start) and starts the writer thread.
    pub fn start(
        config: RecordConfig,
        policy: LivePolicy,
        registry: &Registry,
    ) -> std::io::Result<Recorder> {
        let metrics = RecordMetrics::register(registry);
        let file = RecordFile::open(config.file.clone(), metrics.clone())?;
        let (queue, receiver) = mpsc::sync_channel(config.queue.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let thread = Writer {
            queued_bytes: queued_bytes.clone(),
            receiver,
            file,
            hash_key: config.hash_key.clone(),
            policy,
            named: None,
            stop: stop.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("record-writer".into())
            .spawn(move || thread.run())?;
        Ok(Recorder {
            queue,
            sampler: Sampler::new(config.sample),
            metrics,
            stop,
            writer: Mutex::new(Some(writer)),
            queued_bytes,
            queue_bytes: config.queue_bytes,
        })
    }

    /// Records one decision made at `time`: `response` is the answer, `None` when the engine
    /// refused the request. Never blocks: a full queue drops the decision and counts it.
    pub fn record(
        &self,
        time: Nanos,
        request: RateLimitRequest,
        response: Option<&RateLimitResponse>,
    ) {
        if !self.sampler.take() {
            self.metrics.count_drop(DropReason::SampledOut, 1);
            return;
        }
        // The byte bound: a request's wire size, taken back by the writer when it dequeues it.
        let size = request.encoded_len();
        if self.queued_bytes.fetch_add(size, Ordering::Relaxed) + size > self.queue_bytes {
            self.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            self.metrics.count_drop(DropReason::QueueFull, 1);
            return;
        }
        let answer = response.map(|r| Answer {
            code: r.overall_code,
            statuses: r.statuses.iter().map(|s| s.code).collect(),
        });
        let decided = Decided {
            time,
            request,
            answer,
        };
        let refused = match self.queue.try_send(Some(decided)) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => DropReason::QueueFull,
            // The writer has stopped (shutdown).
            Err(TrySendError::Disconnected(_)) => DropReason::WriteError,
        };
        self.queued_bytes.fetch_sub(size, Ordering::Relaxed);
        self.metrics.count_drop(refused, 1);
    }

    pub fn metrics(&self) -> &RecordMetrics {
        &self.metrics
    }

    /// Writes what is queued and stops the writer, waiting for it at most `wait` (a writer stuck
    /// on a blocked file is left behind). Blocking: call it off the async runtime.
    pub fn finish(&self, wait: Duration) {
        self.stop.store(true, Ordering::SeqCst);
        // The writer sees the flag at its next drain (within DRAIN_EVERY); this marker only
        // ends a drain that is under way.
        let _ = self.queue.try_send(None);
        let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let deadline = crate::clock::monotonic() + wait;
        while !writer.is_finished() && crate::clock::monotonic() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if writer.is_finished() {
            let _ = writer.join();
        } else {
            tracing::warn!(
                ?wait,
                "the record writer did not finish in time; lines still queued are lost"
            );
        }
    }
}

/// Values the live rules name: domain → key → values.
type Named = HashMap<String, HashMap<String, HashSet<String>>>;

fn named_values(policy: &Policy) -> Named {
    let mut named = Named::new();
    for domain in policy.domains() {
        let keys = named.entry(domain.name.clone()).or_default();
        for (key, value) in domain.named_values() {
            keys.entry(key.to_owned())
                .or_default()
                .insert(value.to_owned());
        }
    }
    named
}

/// The writer thread's side.
struct Writer {
    receiver: Receiver<Option<Decided>>,
    /// The recorder's count of queued bytes, given back as requests are dequeued.
    queued_bytes: Arc<AtomicUsize>,
    file: RecordFile,
    hash_key: Option<HashKey>,
    policy: LivePolicy,
    /// The named values of the policy they were read from (rebuilt when the rules change).
    named: Option<(Arc<Policy>, Named)>,
    stop: Arc<AtomicBool>,
}

struct Batch {
    bytes: Vec<u8>,
    lines: u64,
}

impl Writer {
    fn run(mut self) {
        let mut batch = Batch {
            bytes: Vec::with_capacity(BATCH_BYTES * 2),
            lines: 0,
        };
        loop {
            std::thread::sleep(DRAIN_EVERY);
            loop {
                match self.receiver.try_recv() {
                    Ok(next) => self.push(next, &mut batch),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.flush(&mut batch);
                        self.file.sync();
                        return;
                    }
                }
            }
            self.flush(&mut batch);
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
        }
        // Anything sent between the last look and the stop.
        while let Ok(next) = self.receiver.try_recv() {
            self.push(next, &mut batch);
        }
        self.flush(&mut batch);
        self.file.sync();
    }

    fn push(&mut self, decided: Option<Decided>, batch: &mut Batch) {
        let Some(decided) = decided else { return };
        self.queued_bytes
            .fetch_sub(decided.request.encoded_len(), Ordering::Relaxed);
        let start = batch.bytes.len();
        match &self.hash_key {
            None => encode(&decided, &Values::Clear, &mut batch.bytes),
            Some(key) => {
                let policy = (self.policy)();
                if !matches!(&self.named, Some((p, _)) if Arc::ptr_eq(p, &policy)) {
                    let named = named_values(&policy);
                    self.named = Some((policy, named));
                }
                let named = self.named.as_ref().map(|(_, n)| n);
                let is_named = |domain: &str, k: &str, v: &str| {
                    named
                        .and_then(|n| n.get(domain))
                        .and_then(|keys| keys.get(k))
                        .is_some_and(|values| values.contains(v))
                };
                let values = Values::Hashed {
                    key,
                    named: &is_named,
                };
                encode(&decided, &values, &mut batch.bytes);
            }
        }
        // Cut the batch where the file rotates, so a file keeps under its bound.
        if start > 0 && batch.bytes.len() as u64 > self.file.room() {
            let line = batch.bytes.split_off(start);
            self.flush(batch);
            batch.bytes.extend_from_slice(&line);
        }
        batch.lines += 1;
        if batch.bytes.len() >= BATCH_BYTES {
            self.flush(batch);
        }
    }

    fn flush(&mut self, batch: &mut Batch) {
        self.file.write(&batch.bytes, batch.lines);
        batch.bytes.clear();
        batch.lines = 0;
    }
}
