//! The recorder's metrics, registered on the server's registry: lines and bytes written, lines
//! dropped by reason, file rotations.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// Why a decision was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue to the writer was full: the decision was answered and not recorded.
    QueueFull,
    /// Writing failed (disk full, file gone, …), or the writer was waiting to retry.
    WriteError,
    /// Not taken by `--record-sample`.
    SampledOut,
}

impl DropReason {
    pub const ALL: [DropReason; 3] = [
        DropReason::QueueFull,
        DropReason::WriteError,
        DropReason::SampledOut,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::WriteError => "write_error",
            DropReason::SampledOut => "sampled_out",
        }
    }
}

/// Counters resolved once, so recording touches only atomics.
#[derive(Clone)]
pub struct RecordMetrics {
    pub(crate) lines: IntCounter,
    pub(crate) bytes: IntCounter,
    pub(crate) rotations: IntCounter,
    dropped: [IntCounter; 3],
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric definition");
    // Registering twice (a second server on one registry) keeps the first; counts still work.
    let _ = registry.register(Box::new(c.clone()));
    c
}

impl RecordMetrics {
    pub fn register(registry: &Registry) -> RecordMetrics {
        let dropped = IntCounterVec::new(
            Opts::new(
                "ratelimit_record_dropped_total",
                "Decisions not written to the --record file, by reason (queue_full, write_error, sampled_out)",
            ),
            &["reason"],
        )
        .expect("valid metric definition");
        let _ = registry.register(Box::new(dropped.clone()));
        RecordMetrics {
            lines: counter(
                registry,
                "ratelimit_record_lines_total",
                "Decisions written to the --record file",
            ),
            bytes: counter(
                registry,
                "ratelimit_record_bytes_total",
                "Bytes written to the --record file",
            ),
            rotations: counter(
                registry,
                "ratelimit_record_rotations_total",
                "Times the --record file reached --record-max-bytes and was rotated",
            ),
            dropped: DropReason::ALL.map(|d| dropped.with_label_values(&[d.label()])),
        }
    }

    pub fn count_drop(&self, reason: DropReason, lines: u64) {
        self.dropped[reason as usize].inc_by(lines);
    }

    /// Record lines written so far.
    pub fn lines_written(&self) -> u64 {
        self.lines.get()
    }

    /// Lines dropped so far for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason as usize].get()
    }
}
