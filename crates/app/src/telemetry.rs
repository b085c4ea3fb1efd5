//! OpenTelemetry tracing (the reference's TRACING_ENABLED and OTEL_EXPORTER_OTLP_*): one span per
//! ShouldRateLimit, a child of the caller's span when the call names one (W3C `traceparent` or
//! B3, read by `trace_context`), exported over OTLP/gRPC by a batch processor (each export counted
//! and a failure said: `export`), flushed on shutdown. Spans carry
//! the domain, the descriptor count and the overall code (and the gRPC code of a refused call);
//! descriptor values only when asked (`record_values`), since they are often user identifiers.
//! When tracing is off nothing here exists: the service holds `None` and builds no span.

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use prometheus::Registry;
use tonic::codegen::http::HeaderMap;

use crate::trace_context::TraceContext;

mod export;

use export::{CountedExporter, ExportMetrics};

/// What the exporter and spans are made from (see `settings::TracingArgs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// `service.name` of the spans' resource.
    pub(crate) service_name: String,
    /// `service.namespace`, when set.
    pub(crate) service_namespace: Option<String>,
    /// `service.instance.id`, when set.
    pub(crate) service_instance_id: Option<String>,
    /// Share of root traces sampled (0..=1).
    pub(crate) sampling_rate: f64,
    /// The collector's OTLP/gRPC endpoint (`http://collector:4317`).
    pub(crate) endpoint: String,
    /// Headers sent with each export (e.g. an API key).
    pub(crate) headers: Vec<(String, String)>,
    /// Also record each descriptor's entries (`key=value`) on the span.
    pub(crate) record_values: bool,
}

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot start OpenTelemetry tracing: {0}")]
pub struct TracingError(String);

/// The tracer the gRPC service records spans with, and the provider to flush on shutdown.
#[derive(Debug, Clone)]
pub struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    record_values: bool,
    context: TraceContext,
}

impl Tracing {
    /// Builds the OTLP/gRPC exporter and the batch processor, the exports counted on `registry`.
    /// Must run inside the tokio runtime (the exporter's channel lives on it); connecting is lazy,
    /// so a collector that is down does not stop the start: spans are lost, counted and said
    /// (`export`).
    pub fn start(config: &TracingConfig, registry: &Registry) -> Result<Tracing, TracingError> {
        let mut metadata = tonic::metadata::MetadataMap::new();
        for (name, value) in &config.headers {
            let key =
                tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map_err(|e| TracingError(format!("header name '{name}': {e}")))?;
            let value = value
                .parse()
                .map_err(|e| TracingError(format!("header '{name}' value: {e}")))?;
            metadata.insert(key, value);
        }
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.endpoint.clone())
            .with_metadata(metadata)
            .build()
            .map_err(|e| TracingError(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(CountedExporter::new(
                exporter,
                ExportMetrics::register(registry),
            ))
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_rate,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .with_attributes(
                        [
                            ("service.namespace", &config.service_namespace),
                            ("service.instance.id", &config.service_instance_id),
                        ]
                        .into_iter()
                        .filter_map(|(k, v)| v.clone().map(|v| KeyValue::new(k, v))),
                    )
                    .build(),
            )
            .build();
        let scope = InstrumentationScope::builder("ratelimit-server")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Ok(Tracing {
            tracer: provider.tracer_with_scope(scope),
            provider,
            record_values: config.record_values,
            context: TraceContext::default(),
        })
    }

    /// Starts the span of one ShouldRateLimit call: a child of the span `headers` name (the
    /// call's trace context), else the root of a new trace.
    pub fn start_call(&self, headers: Option<&HeaderMap>) -> CallSpan {
        let builder = self
            .tracer
            .span_builder("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ]);
        let span = match headers.and_then(|h| self.context.parent(h)) {
            Some(parent) => builder.start_with_context(&self.tracer, &parent),
            None => builder.start(&self.tracer),
        };
        CallSpan {
            span: Box::new(span),
            record_values: self.record_values,
        }
    }

    /// Exports the spans still buffered and stops the exporter. Blocking work is moved off the
    /// runtime's workers (the batch processor's thread needs them to send).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing OpenTelemetry spans failed"),
            Err(e) => tracing::warn!(error = %e, "flushing OpenTelemetry spans failed"),
        }
    }
}

/// The span of one call in progress; ended by [`CallSpan::ok`] or [`CallSpan::refused`].
/// The SDK's span (~400 bytes) is boxed: every call's future holds an `Option<CallSpan>`, and
/// with tracing off it would carry those bytes for nothing, copied whole with the future into
/// its allocation (docs/cost-per-decision.md "A future twice its size").
pub struct CallSpan {
    span: Box<opentelemetry_sdk::trace::Span>,
    record_values: bool,
}

impl CallSpan {
    /// Records what was asked: the domain, the number of descriptors, and (when asked) each
    /// descriptor's entries as `key=value,…`.
    pub fn request<'a, D, E>(&mut self, domain: &str, descriptors: D)
    where
        D: ExactSizeIterator<Item = E>,
        E: Iterator<Item = (&'a str, &'a str)>,
    {
        if !self.span.is_recording() {
            return;
        }
        self.span
            .set_attribute(KeyValue::new("ratelimit.domain", domain.to_owned()));
        self.span.set_attribute(KeyValue::new(
            "ratelimit.descriptor_count",
            descriptors.len() as i64,
        ));
        if self.record_values {
            for (i, entries) in descriptors.enumerate() {
                let text: Vec<String> = entries.map(|(k, v)| format!("{k}={v}")).collect();
                self.span.set_attribute(KeyValue::new(
                    format!("ratelimit.descriptor.{i}"),
                    text.join(","),
                ));
            }
        }
    }

    /// Ends the span of an answered call with its overall code (`OK`, `OVER_LIMIT`).
    pub fn ok(mut self, overall_code: &'static str) {
        if self.span.is_recording() {
            self.span
                .set_attribute(KeyValue::new("ratelimit.overall_code", overall_code));
            self.span
                .set_attribute(KeyValue::new("rpc.grpc.status_code", 0_i64));
        }
        self.span.end();
    }

    /// Ends the span of a refused call with its gRPC code, marking it an error.
    pub fn refused(mut self, code: tonic::Code, message: &str) {
        if self.span.is_recording() {
            self.span
                .set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
            self.span
                .set_status(Status::error(format!("{}: {message}", code.description())));
        }
        self.span.end();
    }
}
