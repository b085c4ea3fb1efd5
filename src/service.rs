//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic,
//! translating engine errors into gRPC statuses (INVALID_ARGUMENT, UNAVAILABLE) and recording call
//! counts, errors and latency.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prometheus::{Histogram, IntCounter};
use tonic::{Request, Response, Status};

use crate::engine::{Engine, EngineError};
use crate::store::Store;

/// The call metrics, resolved once so a call only touches atomics.
struct CallMetrics {
    requests: IntCounter,
    latency: Histogram,
    invalid: IntCounter,
    store_errors: IntCounter,
}

/// The tonic service around a shared engine.
pub struct RateLimitGrpc<S> {
    engine: Arc<Engine<S>>,
    metrics: Option<CallMetrics>,
}

impl<S: Store> RateLimitGrpc<S> {
    pub fn server(engine: Arc<Engine<S>>) -> RateLimitServiceServer<Self> {
        let method = ["ShouldRateLimit"];
        let metrics = engine.metrics().map(|m| CallMetrics {
            requests: m.total_requests.with_label_values(&method),
            latency: m.response_time.with_label_values(&method),
            invalid: m
                .should_rate_limit_error
                .with_label_values(&["invalid_argument"]),
            store_errors: m
                .should_rate_limit_error
                .with_label_values(&["store_error"]),
        });
        RateLimitServiceServer::new(RateLimitGrpc { engine, metrics })
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

#[tonic::async_trait]
impl<S: Store> RateLimitService for RateLimitGrpc<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let result = self.engine.should_rate_limit(request.get_ref()).await;
        if let Some(m) = &self.metrics {
            m.requests.inc();
            m.latency.observe(started.elapsed().as_secs_f64());
            match &result {
                Err(EngineError::Invalid(_)) => m.invalid.inc(),
                Err(EngineError::Store(_)) => m.store_errors.inc(),
                Ok(_) => {}
            }
        }
        Ok(Response::new(result?))
    }
}
