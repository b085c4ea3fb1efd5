//! The OTLP exporter as the server runs it: each batch's outcome counted
//! (`ratelimit_tracing_spans_exported_total`, `ratelimit_tracing_spans_failed_total`) and a failed
//! export said at most once a minute with its error. The SDK is built without its internal logs,
//! so without this a collector that is down or refuses the spans loses them in silence.

use std::time::{Duration, Instant};

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use prometheus::{IntCounter, Registry};
use ratelimit_core::clock::monotonic;
use ratelimit_remote::Every;

/// How often failed exports are said again while they go on.
const FAILURE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The exporter's series.
#[derive(Clone, Debug)]
pub(crate) struct ExportMetrics {
    exported: IntCounter,
    failed: IntCounter,
}

impl ExportMetrics {
    /// The series, registered on `registry` (a second registration keeps the first).
    pub(crate) fn register(registry: &Registry) -> ExportMetrics {
        let metrics = ExportMetrics {
            exported: IntCounter::new(
                "ratelimit_tracing_spans_exported_total",
                "spans the OpenTelemetry collector took",
            )
            .expect("valid metric"),
            failed: IntCounter::new(
                "ratelimit_tracing_spans_failed_total",
                "spans lost in exports that failed (collector down, refusing, too slow)",
            )
            .expect("valid metric"),
        };
        let _ = registry.register(Box::new(metrics.exported.clone()));
        let _ = registry.register(Box::new(metrics.failed.clone()));
        metrics
    }
}

/// `inner`, each export counted and a failure said.
#[derive(Debug)]
pub(crate) struct CountedExporter<E> {
    inner: E,
    metrics: ExportMetrics,
    failure_warning: Every,
    epoch: Instant,
}

impl<E> CountedExporter<E> {
    pub(crate) fn new(inner: E, metrics: ExportMetrics) -> CountedExporter<E> {
        CountedExporter {
            inner,
            metrics,
            failure_warning: Every::new(FAILURE_WARNING_EVERY),
            epoch: monotonic(),
        }
    }

    /// Counts one export of `spans` spans that ended with `result`.
    fn counted(&self, spans: u64, result: &OTelSdkResult) {
        let Err(error) = result else {
            self.metrics.exported.inc_by(spans);
            return;
        };
        self.metrics.failed.inc_by(spans);
        let now = monotonic().saturating_duration_since(self.epoch);
        if self.failure_warning.due(now.as_nanos() as u64) {
            tracing::warn!(
                %error,
                spans,
                "exporting spans to the OpenTelemetry collector failed: they are lost (said at most once a minute; ratelimit_tracing_spans_failed_total counts the spans lost)"
            );
        }
    }
}

impl<E: SpanExporter> SpanExporter for CountedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        self.counted(spans, &result);
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::OTelSdkError;

    #[test]
    fn exports_are_counted_by_outcome() {
        let registry = Registry::new();
        let metrics = ExportMetrics::register(&registry);
        let exporter = CountedExporter::new((), metrics.clone());
        exporter.counted(3, &Ok(()));
        exporter.counted(5, &Err(OTelSdkError::InternalFailure("refused".into())));
        exporter.counted(2, &Err(OTelSdkError::Timeout(Duration::from_secs(10))));
        assert_eq!(metrics.exported.get(), 3);
        assert_eq!(metrics.failed.get(), 7);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "ratelimit_tracing_spans_exported_total",
                "ratelimit_tracing_spans_failed_total"
            ]
        );
    }
}
