//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic,
//! translating engine errors into gRPC statuses (INVALID_ARGUMENT, UNAVAILABLE) and recording call
//! counts, errors and latency. The route is ours rather than envoy-types' generated server so that
//! the request's bytes are bounded before they are decoded (see `codec` and `body`).

mod body;
mod codec;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Latency on tokio's monotonic time (it follows paused time in tests).
use tokio::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as RateLimitCode;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prometheus::{Histogram, IntCounter, IntCounterVec};
use tokio::sync::Semaphore;
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};

use crate::engine::{Decision, Engine, EngineError};
use crate::record::Recorder;
use crate::store::Backend;
use crate::telemetry::Tracing;

pub use body::GuardedBody;
pub use codec::RequestCodec;

/// The gRPC path of the one method we serve.
pub const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Bounds on what one call may make the server hold before the request is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Largest encoded RateLimitRequest; a larger one is refused (OUT_OF_RANGE, as tonic says it)
    /// from its length prefix, before its bytes are buffered.
    pub max_request_bytes: usize,
    /// Request bytes buffered by all calls together; past it new bytes are refused
    /// (RESOURCE_EXHAUSTED) until calls in progress finish.
    pub max_buffered_bytes: usize,
    /// Longest time a request may take to arrive in full; a stalled stream is then ended.
    pub body_timeout: Duration,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            max_request_bytes: 64 * 1024,
            max_buffered_bytes: 64 * 1024 * 1024,
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// The call metrics, resolved once so a call only touches atomics.
struct CallMetrics {
    requests: IntCounter,
    latency: Histogram,
    errors: IntCounterVec,
    invalid: IntCounter,
    store_errors: IntCounter,
}

struct Shared<S> {
    engine: Arc<Engine<S>>,
    metrics: Option<CallMetrics>,
    limits: CallLimits,
    /// One permit per request byte buffered (see [`GuardedBody`]).
    buffered: Arc<Semaphore>,
    /// A span per call when tracing is on; `None` builds nothing.
    tracing: Option<Tracing>,
    /// `serve --record`: each decision, queued for the record file.
    recorder: Option<Arc<Recorder>>,
}

/// The tonic service around a shared engine.
pub struct RateLimitGrpc<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for RateLimitGrpc<S> {
    fn clone(&self) -> Self {
        RateLimitGrpc {
            shared: self.shared.clone(),
        }
    }
}

impl<S> NamedService for RateLimitGrpc<S> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<S: Backend> RateLimitGrpc<S> {
    pub fn new(engine: Arc<Engine<S>>, limits: CallLimits) -> Self {
        let method = ["ShouldRateLimit"];
        let metrics = engine.metrics().map(|m| CallMetrics {
            requests: m.total_requests.with_label_values(&method),
            latency: m.response_time.with_label_values(&method),
            errors: m.should_rate_limit_error.clone(),
            invalid: m
                .should_rate_limit_error
                .with_label_values(&["invalid_argument"]),
            store_errors: m
                .should_rate_limit_error
                .with_label_values(&["store_error"]),
        });
        let permits = limits.max_buffered_bytes.clamp(1, Semaphore::MAX_PERMITS);
        RateLimitGrpc {
            shared: Arc::new(Shared {
                engine,
                metrics,
                limits,
                buffered: Arc::new(Semaphore::new(permits)),
                tracing: None,
                recorder: None,
            }),
        }
    }

    /// Records an OpenTelemetry span per ShouldRateLimit call (see [`Tracing`]).
    pub fn with_tracing(self, tracing: Option<Tracing>) -> Self {
        let shared =
            Arc::try_unwrap(self.shared).unwrap_or_else(|_| unreachable!("not yet cloned"));
        RateLimitGrpc {
            shared: Arc::new(Shared { tracing, ..shared }),
        }
    }

    /// Records each decision (see [`Recorder`]).
    pub fn with_recorder(self, recorder: Option<Arc<Recorder>>) -> Self {
        let shared =
            Arc::try_unwrap(self.shared).unwrap_or_else(|_| unreachable!("not yet cloned"));
        RateLimitGrpc {
            shared: Arc::new(Shared { recorder, ..shared }),
        }
    }

    /// Counts a call refused before it reached the engine (malformed, too large, stalled),
    /// by the gRPC code it was refused with.
    fn count_refused(&self, code: Code) {
        if let Some(m) = &self.shared.metrics {
            m.requests.inc();
            let kind = match code {
                Code::InvalidArgument => "invalid_argument",
                // tonic refuses a message over the size bound with OUT_OF_RANGE.
                Code::OutOfRange => "request_too_large",
                Code::ResourceExhausted => "resource_exhausted",
                Code::DeadlineExceeded | Code::Cancelled => "stalled_request",
                _ => "transport",
            };
            m.errors.with_label_values(&[kind]).inc();
        }
    }
}

/// The gRPC status a trailers-only (error) response carries in its headers.
fn refused_code<B>(response: &http::Response<B>) -> Option<Code> {
    let status = response.headers().get(Status::GRPC_STATUS)?;
    let code = Code::from_bytes(status.as_bytes());
    (code != Code::Ok).then_some(code)
}

impl<S, B> Service<http::Request<B>> for RateLimitGrpc<S>
where
    S: Backend,
    B: http_body::Body<Data = tonic::codegen::Bytes> + Unpin + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            if request.uri().path() != SHOULD_RATE_LIMIT_PATH {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            let limits = this.shared.limits;
            let request = request.map(|body| {
                GuardedBody::new(body, this.shared.buffered.clone(), limits.body_timeout)
            });
            let mut grpc = Grpc::new(RequestCodec::new(this.shared.engine.settings().bounds))
                .apply_max_message_size_config(Some(limits.max_request_bytes), None);
            let handled = Arc::new(AtomicBool::new(false));
            let unary = Unary {
                service: this.clone(),
                handled: handled.clone(),
            };
            let response = grpc.unary(unary, request).await;
            if !handled.load(Ordering::Relaxed)
                && let Some(code) = refused_code(&response)
            {
                this.count_refused(code);
            }
            Ok(response)
        })
    }
}

/// The decoded call, handed to the engine.
struct Unary<S> {
    service: RateLimitGrpc<S>,
    handled: Arc<AtomicBool>,
}

impl<S: Backend> UnaryService<RateLimitRequest> for Unary<S> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        self.handled.store(true, Ordering::Relaxed);
        let shared = self.service.shared.clone();
        Box::pin(async move { shared.should_rate_limit(request).await })
    }
}

impl From<EngineError> for Status {
    fn from(error: EngineError) -> Status {
        match error {
            EngineError::Invalid(e) => Status::invalid_argument(e.to_string()),
            EngineError::Store(e) => Status::unavailable(e.to_string()),
        }
    }
}

impl<S: Backend> Shared<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let mut span = self.tracing.as_ref().map(Tracing::start_call);
        if let Some(span) = &mut span {
            let r = request.get_ref();
            span.request(
                &r.domain,
                r.descriptors
                    .iter()
                    .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))),
            );
        }
        let Decision { now, result } = self.engine.decide(request.get_ref()).await;
        if let Some(m) = &self.metrics {
            m.requests.inc();
            m.latency.observe(started.elapsed().as_secs_f64());
            match &result {
                Err(EngineError::Invalid(_)) => m.invalid.inc(),
                Err(EngineError::Store(_)) => m.store_errors.inc(),
                Ok(_) => {}
            }
        }
        if let Some(recorder) = &self.recorder {
            recorder.record(now, request.get_ref(), result.as_ref().ok());
        }
        let response = result.map_err(Status::from);
        if let Some(span) = span {
            match &response {
                Ok(r) => span.ok(RateLimitCode::try_from(r.overall_code)
                    .unwrap_or(RateLimitCode::Unknown)
                    .as_str_name()),
                Err(status) => span.refused(status.code(), status.message()),
            }
        }
        Ok(Response::new(response?))
    }
}
