//! Noticing a management server that accepts a stream and never answers: once a stream has gone
//! [`XdsConfig::answer_wait`](super::XdsConfig) without a response, one WARN, the gauge
//! `ratelimit_xds_stream_unanswered` set to 1 and `ratelimit_xds_unanswered_streams_total`
//! counted; the first response (or the stream's end) sets the gauge back to 0.

use std::time::Duration;

use prometheus::{IntCounter, IntGauge, Registry};
use tokio::time::Instant;

/// The xDS client's series.
#[derive(Clone)]
pub(crate) struct XdsMetrics {
    unanswered: IntGauge,
    unanswered_streams: IntCounter,
}

impl XdsMetrics {
    /// The series, registered on `registry` (a second registration keeps the first).
    pub(crate) fn register(registry: &Registry) -> XdsMetrics {
        let metrics = XdsMetrics {
            unanswered: IntGauge::new(
                "ratelimit_xds_stream_unanswered",
                "1 while the open xDS stream has had no response for longer than \
                 XDS_CLIENT_ANSWER_WAIT",
            )
            .expect("valid metric"),
            unanswered_streams: IntCounter::new(
                "ratelimit_xds_unanswered_streams_total",
                "xDS streams that went XDS_CLIENT_ANSWER_WAIT without a response",
            )
            .expect("valid metric"),
        };
        let _ = registry.register(Box::new(metrics.unanswered.clone()));
        let _ = registry.register(Box::new(metrics.unanswered_streams.clone()));
        metrics
    }
}

/// One stream's wait for its first response.
pub(super) struct Silence<'a> {
    metrics: &'a XdsMetrics,
    wait: Duration,
    deadline: Instant,
    warned: bool,
    answered: bool,
}

impl<'a> Silence<'a> {
    /// Starts the wait now.
    pub(super) fn new(metrics: &'a XdsMetrics, wait: Duration) -> Silence<'a> {
        Silence {
            metrics,
            wait,
            deadline: Instant::now() + wait,
            warned: false,
            answered: false,
        }
    }

    /// Whether the wait may still run out (no response yet, not warned yet).
    pub(super) fn watching(&self) -> bool {
        !self.warned && !self.answered
    }

    /// When the wait runs out.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The wait ran out: warn once, and say so on the metrics.
    pub(super) fn expired(&mut self, server: &str) {
        if !self.watching() {
            return;
        }
        self.warned = true;
        self.metrics.unanswered.set(1);
        self.metrics.unanswered_streams.inc();
        tracing::warn!(
            server,
            waited = ?self.wait,
            "the xDS management server accepted the stream but has sent no response; the rules \
             in force stay (with none yet, health stays failing) until it answers \
             (XDS_CLIENT_ANSWER_WAIT)"
        );
    }

    /// A response came.
    pub(super) fn answered(&mut self, server: &str) {
        if self.answered {
            return;
        }
        self.answered = true;
        if self.warned {
            self.metrics.unanswered.set(0);
            tracing::info!(server, "the xDS management server answered after all");
        }
    }
}

impl Drop for Silence<'_> {
    fn drop(&mut self) {
        if self.warned && !self.answered {
            self.metrics.unanswered.set(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge(m: &XdsMetrics) -> (i64, u64) {
        (m.unanswered.get(), m.unanswered_streams.get())
    }

    #[test]
    fn a_silent_stream_is_reported_once_and_cleared_by_its_first_response() {
        let metrics = XdsMetrics::register(&Registry::new());
        let mut silence = Silence::new(&metrics, Duration::from_secs(15));
        assert!(silence.watching());
        silence.expired("ads");
        silence.expired("ads");
        assert_eq!(gauge(&metrics), (1, 1));
        assert!(!silence.watching());
        silence.answered("ads");
        assert_eq!(gauge(&metrics), (0, 1));
        drop(silence);
        assert_eq!(gauge(&metrics), (0, 1));
    }

    #[test]
    fn a_silent_stream_that_ends_clears_the_gauge_and_keeps_the_count() {
        let metrics = XdsMetrics::register(&Registry::new());
        let mut silence = Silence::new(&metrics, Duration::from_secs(15));
        silence.expired("ads");
        drop(silence);
        assert_eq!(gauge(&metrics), (0, 1));
        let mut answered = Silence::new(&metrics, Duration::from_secs(15));
        answered.answered("ads");
        answered.expired("ads");
        assert_eq!(gauge(&metrics), (0, 1));
    }
}
