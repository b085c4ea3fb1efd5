//! `serve --record FILE`: every ShouldRateLimit decision (gRPC and `POST /json`) as one JSON line
//! (docs/record.md), written off the hot path. A decision is sampled and written as a small binary
//! frame (`frame`: the time, the codes, the request in protobuf) into a bounded buffer of pending
//! decisions (`pending`): a full buffer drops it and counts it, so recording never waits, and the
//! answering thread does no more than that one copy. One writer thread (`drain`) takes the pending
//! frames every few milliseconds, turns each into its JSON line (`wire::record`; values hashed when asked:
//! `hash`) and appends them to the file, which rotates by size (`rotated`: no kept file is
//! renamed) and survives write errors, short writes included (`writer`). docs/record.md ("How it stays off the hot path") says why it is built so.

mod drain;
mod frame;
mod hash;
mod metrics;
mod pending;
mod rotated;
mod sample;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prometheus::Registry;

pub use hash::HashKey;
pub use metrics::DropReason;
pub(crate) use metrics::RecordMetrics;
pub use ratelimit_core::wire::record::{Answer, Decided, Values, encode};
pub(crate) use sample::Sampler;
pub use writer::FileSpec;
pub(crate) use writer::RecordFile;

use pending::{NotQueued, Pending};
use ratelimit_core::clock::Nanos;
use ratelimit_core::policy::Policy;

/// What `--record` and its companions ask for: a settings record, plain data filled by the
/// settings or by a caller's literal.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub file: FileSpec,
    /// Share of decisions recorded, in (0, 1].
    pub sample: f64,
    /// With `--record-hash-values`: the key values are hashed with.
    pub hash_key: Option<HashKey>,
    /// Decisions pending for the writer before more are dropped.
    pub queue: usize,
    /// Bytes of pending decisions (requests as encoded on the wire, plus 20 bytes each) before
    /// more are dropped.
    pub queue_bytes: usize,
}

/// The live rules, for the values they name (kept clear when hashing).
pub type LivePolicy = Arc<dyn Fn() -> Arc<Policy> + Send + Sync>;

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

/// `--record-hash-values`: the key, and the values the live rules name (kept clear), rebuilt on
/// the writer thread when the rules change.
struct Hashing {
    key: HashKey,
    policy: LivePolicy,
    named: Option<(Arc<Policy>, Named)>,
}

impl Hashing {
    /// The key, and the named values of the rules in force now.
    fn current(&mut self) -> (&HashKey, &Named) {
        let policy = (self.policy)();
        let current = matches!(&self.named, Some((p, _)) if Arc::ptr_eq(p, &policy));
        if !current {
            let named = named_values(&policy);
            self.named = Some((policy, named));
        }
        (
            &self.key,
            &self.named.get_or_insert_with(Default::default).1,
        )
    }
}

/// The hot-path side: sampling and the pending buffer. Shared by the gRPC and HTTP faces.
pub struct Recorder {
    pending: Arc<Pending>,
    sampler: Sampler,
    metrics: RecordMetrics,
    stop: Arc<AtomicBool>,
    writer: Mutex<Option<JoinHandle<()>>>,
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
        let pending = Arc::new(Pending::new(config.queue, config.queue_bytes));
        let stop = Arc::new(AtomicBool::new(false));
        let drain = drain::Drain {
            pending: pending.clone(),
            file,
            hashing: config.hash_key.map(|key| Hashing {
                key,
                policy,
                named: None,
            }),
            stop: stop.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("record-writer".into())
            .spawn(move || drain.run())?;
        Ok(Recorder {
            pending,
            sampler: Sampler::new(config.sample),
            metrics,
            stop,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Records one decision made at `time`: `response` is the answer, `None` when the engine
    /// refused the request. Never waits: a full buffer drops the decision and counts it.
    pub fn record(
        &self,
        time: Nanos,
        request: &RateLimitRequest,
        response: Option<&RateLimitResponse>,
    ) {
        if !self.sampler.take() {
            self.metrics.count_drop(DropReason::SampledOut, 1);
            return;
        }
        let pushed = self
            .pending
            .push_with(|out| frame::write(time, request, response, out));
        match pushed {
            Ok(()) => {}
            Err(NotQueued::Full) => self.metrics.count_drop(DropReason::QueueFull, 1),
            Err(NotQueued::Closed) => self.metrics.count_drop(DropReason::WriteError, 1),
        }
    }

    pub fn metrics(&self) -> &RecordMetrics {
        &self.metrics
    }

    /// Writes what is pending and stops the writer, waiting for it at most `wait` (a writer stuck
    /// on a blocked file is left behind). Blocking: call it off the async runtime.
    pub fn finish(&self, wait: Duration) {
        // The writer sees the flag at its next drain (within drain::DRAIN_EVERY).
        self.stop.store(true, Ordering::SeqCst);
        let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let deadline = ratelimit_core::clock::monotonic() + wait;
        while !writer.is_finished() && ratelimit_core::clock::monotonic() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if writer.is_finished() {
            let _ = writer.join();
        } else {
            tracing::warn!(
                ?wait,
                "the record writer did not finish in time; lines still pending are lost"
            );
        }
    }
}
