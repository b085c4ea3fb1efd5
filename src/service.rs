//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic,
//! translating engine errors into gRPC statuses (INVALID_ARGUMENT, UNAVAILABLE).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::engine::{Engine, EngineError};
use crate::store::Store;

/// The tonic service around a shared engine.
pub struct RateLimitGrpc<S> {
    engine: Arc<Engine<S>>,
}

impl<S: Store> RateLimitGrpc<S> {
    pub fn server(engine: Arc<Engine<S>>) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(RateLimitGrpc { engine })
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
        let response = self.engine.should_rate_limit(request.get_ref()).await?;
        Ok(Response::new(response))
    }
}
