//! The one front door to a decision, whatever face the request came in by (gRPC
//! `ShouldRateLimit`, `POST /json`): the call's metrics (`ratelimit_service_total_requests`,
//! latency, errors by kind), its OpenTelemetry span, the recorder, then the engine. The faces only
//! translate: bytes to a `RateLimitRequest`, and the answer (or error) to their protocol.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prometheus::{Histogram, IntCounter, IntCounterVec};
use tonic::codegen::http;

use crate::record::Recorder;
use crate::telemetry::Tracing;
use ratelimit_core::clock::monotonic;
use ratelimit_core::engine::{Decision, Engine, EngineError, InvalidRequest};
use ratelimit_core::store::Backend;

/// Why a call was refused before it reached the engine, as `ratelimit_service_should_rate_limit_error`
/// counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedCall {
    /// Malformed (gRPC decoding, JSON parsing).
    InvalidArgument,
    /// Over the request size bound.
    TooLarge,
    /// Over the buffered-bytes budget.
    ResourceExhausted,
    /// Its body never arrived in full.
    Stalled,
    /// Anything else the transport refused.
    Transport,
}

impl RefusedCall {
    fn label(self) -> &'static str {
        match self {
            RefusedCall::InvalidArgument => "invalid_argument",
            RefusedCall::TooLarge => "request_too_large",
            RefusedCall::ResourceExhausted => "resource_exhausted",
            RefusedCall::Stalled => "stalled_request",
            RefusedCall::Transport => "transport",
        }
    }
}

/// The call metrics, resolved once so a call only touches atomics.
struct CallMetrics {
    requests: IntCounter,
    latency: Histogram,
    errors: IntCounterVec,
    /// Requests the reference refuses too: an empty domain, no descriptors.
    service_error: IntCounter,
    /// Other requests the engine refused (over a bound, an override without a unit…).
    invalid: IntCounter,
    store_errors: IntCounter,
    /// Answers not held: `MAX_WAITING_ANSWERS` wait already.
    too_many_waiting: IntCounter,
}

/// The front door: an engine, and what every decision is also given to.
pub struct FrontDoor<B> {
    engine: Arc<Engine<B>>,
    metrics: Option<CallMetrics>,
    tracing: Option<Tracing>,
    recorder: Option<Arc<Recorder>>,
}

impl<B: Backend> FrontDoor<B> {
    /// Decisions of `engine`, counted in its metrics (if it has them), with a span per call when
    /// `tracing` is on, and recorded by `recorder` when there is one.
    pub fn new(
        engine: Arc<Engine<B>>,
        tracing: Option<Tracing>,
        recorder: Option<Arc<Recorder>>,
    ) -> FrontDoor<B> {
        let method = ["ShouldRateLimit"];
        let metrics = engine.metrics().map(|m| CallMetrics {
            requests: m.total_requests.with_label_values(&method),
            latency: m.response_time.with_label_values(&method),
            errors: m.should_rate_limit_error.clone(),
            // The reference counts the requests it refuses (an empty domain, no descriptors) as
            // `ratelimit.service.call.should_rate_limit.service_error`, which its Prometheus
            // mapping names `err_type="service_error"`: alerts written for it keep working.
            service_error: m
                .should_rate_limit_error
                .with_label_values(&["service_error"]),
            invalid: m
                .should_rate_limit_error
                .with_label_values(&["invalid_argument"]),
            // A failed store call: the store that fails is Redis (memory never does), and the
            // reference counts its failures as `redis_error` (`err_type="redis_error"`).
            store_errors: m
                .should_rate_limit_error
                .with_label_values(&["redis_error"]),
            too_many_waiting: m
                .should_rate_limit_error
                .with_label_values(&["too_many_waiting"]),
        });
        FrontDoor {
            engine,
            metrics,
            tracing,
            recorder,
        }
    }

    pub fn engine(&self) -> &Arc<Engine<B>> {
        &self.engine
    }

    /// Decides `request`.
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, EngineError> {
        self.decide_in_trace(request, None).await
    }

    /// Decides `request`, whose span (when tracing) is a child of the one its `headers` name
    /// (W3C `traceparent` or B3, as Envoy sends them with the call).
    pub async fn decide_in_trace(
        &self,
        request: &RateLimitRequest,
        headers: Option<&http::HeaderMap>,
    ) -> Result<RateLimitResponse, EngineError> {
        let started = monotonic();
        let mut span = self.tracing.as_ref().map(|t| t.start_call(headers));
        if let Some(span) = &mut span {
            span.request(
                &request.domain,
                request
                    .descriptors
                    .iter()
                    .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))),
            );
        }
        let Decision { now, result } = self.engine.decide(request).await;
        if let Some(m) = &self.metrics {
            m.requests.inc();
            m.latency.observe(started.elapsed().as_secs_f64());
            match &result {
                Err(EngineError::Invalid(
                    InvalidRequest::EmptyDomain | InvalidRequest::NoDescriptors,
                )) => m.service_error.inc(),
                Err(EngineError::Invalid(_)) => m.invalid.inc(),
                Err(EngineError::Store(_)) => m.store_errors.inc(),
                Err(EngineError::Overloaded(_)) => m.too_many_waiting.inc(),
                Ok(_) => {}
            }
        }
        if let Some(recorder) = &self.recorder {
            recorder.record(now, request, result.as_ref().ok());
        }
        if let Some(span) = span {
            match &result {
                Ok(r) => span.ok(Code::try_from(r.overall_code)
                    .unwrap_or(Code::Unknown)
                    .as_str_name()),
                Err(e) => span.refused(status_code(e), &e.to_string()),
            }
        }
        result
    }

    /// Counts a call refused before it reached the engine.
    pub fn refused(&self, why: RefusedCall) {
        if let Some(m) = &self.metrics {
            m.requests.inc();
            m.errors.with_label_values(&[why.label()]).inc();
        }
    }
}

/// The gRPC code an engine error is answered with.
pub(crate) fn status_code(error: &EngineError) -> tonic::Code {
    match error {
        EngineError::Invalid(_) => tonic::Code::InvalidArgument,
        EngineError::Store(_) => tonic::Code::Unavailable,
        EngineError::Overloaded(_) => tonic::Code::ResourceExhausted,
    }
}
