//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic: a
//! request decoded within its bounds goes through the front door (`crate::front`: metrics, span,
//! recorder, engine), engine errors become gRPC statuses (INVALID_ARGUMENT, UNAVAILABLE), and a
//! call refused before decoding is counted there by its code. The route is ours rather than
//! envoy-types' generated server so that the request's bytes are bounded before they are decoded
//! (see `codec` and `body`).

mod body;
mod codec;
pub(crate) mod deadline;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::{BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};

use crate::front::{FrontDoor, RefusedCall, status_code};
use ratelimit_core::store::Backend;

pub(crate) use body::{BoundedBody, ByteBudget};
pub(crate) use codec::RequestCodec;

/// The gRPC path of the one method we serve.
pub(crate) const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Bounds on what one call may make the server hold before the request is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Largest encoded RateLimitRequest; a larger one is refused (OUT_OF_RANGE, as tonic says it)
    /// from its length prefix, before its bytes are buffered.
    pub(crate) max_request_bytes: usize,
    /// Request bytes buffered by all calls together; past it new bytes are refused
    /// (RESOURCE_EXHAUSTED) until calls in progress finish.
    pub(crate) max_buffered_bytes: usize,
    /// Longest time a request may take to arrive in full; a stalled stream is then ended.
    pub(crate) body_timeout: Duration,
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

struct Shared<S> {
    front: Arc<FrontDoor<S>>,
    limits: CallLimits,
    /// Request bytes buffered by all calls (see [`BoundedBody`]).
    buffered: Arc<ByteBudget>,
}

/// `ShouldRateLimit` around a shared engine.
pub(crate) struct RateLimitGrpc<S> {
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
    pub(crate) fn new(front: Arc<FrontDoor<S>>, limits: CallLimits) -> Self {
        RateLimitGrpc {
            shared: Arc::new(Shared {
                front,
                limits,
                buffered: Arc::new(ByteBudget::new(limits.max_buffered_bytes.max(1))),
            }),
        }
    }

    /// Counts a call refused before it reached the engine (malformed, too large, stalled),
    /// by the gRPC code it was refused with.
    fn count_refused(&self, code: Code) {
        let why = match code {
            Code::InvalidArgument => RefusedCall::InvalidArgument,
            // tonic refuses a message over the size bound with OUT_OF_RANGE.
            Code::OutOfRange => RefusedCall::TooLarge,
            Code::ResourceExhausted => RefusedCall::ResourceExhausted,
            Code::DeadlineExceeded | Code::Cancelled => RefusedCall::Stalled,
            _ => RefusedCall::Transport,
        };
        self.shared.front.refused(why);
    }
}

/// The gRPC status a trailers-only (error) response carries in its headers.
fn refused_code<B>(response: &http::Response<B>) -> Option<Code> {
    let status = response.headers().get(Status::GRPC_STATUS)?;
    let code = Code::from_bytes(status.as_bytes());
    (code != Code::Ok).then_some(code)
}

impl<S> RateLimitGrpc<S> {
    /// `request` with its body bounded as a `ShouldRateLimit` call's is: by the bytes all calls
    /// may buffer (a call waiting for its request counting its headers too) and by the time its
    /// request may take (see [`BoundedBody`]). The health service's calls are bounded the same way.
    pub(crate) fn bounded<B>(&self, request: http::Request<B>) -> http::Request<BoundedBody<B>> {
        let budget = self.shared.buffered.clone();
        let timeout = self.shared.limits.body_timeout;
        request.map(|body| BoundedBody::new(body, budget, timeout))
    }
}

impl<S: Backend> RateLimitGrpc<S> {
    /// Answers one call: `ShouldRateLimit`, or UNIMPLEMENTED for another method of the service;
    /// DEADLINE_EXCEEDED once `deadline` (the call's `grpc-timeout`) has passed.
    pub(crate) fn serve<B>(
        &self,
        request: http::Request<B>,
        deadline: Option<Duration>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
    where
        B: http_body::Body<Data = tonic::codegen::Bytes> + Unpin + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let this = self.clone();
        Box::pin(deadline::within(deadline, async move {
            if request.uri().path() != SHOULD_RATE_LIMIT_PATH {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            let limits = this.shared.limits;
            let request = this.bounded(request);
            let bounds = this.shared.front.engine().settings().bounds;
            let mut grpc = Grpc::new(RequestCodec::new(bounds))
                .apply_max_message_size_config(Some(limits.max_request_bytes), None);
            // The call's own state, borrowed (no reference count shared with other calls).
            let handled = AtomicBool::new(false);
            let unary = Unary {
                shared: &this.shared,
                handled: &handled,
            };
            let response = grpc.unary(unary, request).await;
            if !handled.load(Ordering::Relaxed)
                && let Some(code) = refused_code(&response)
            {
                this.count_refused(code);
            }
            Ok(response)
        }))
    }
}

/// The decoded call, handed to the engine. It borrows what it needs from the call's future
/// (which owns the service and the flag), so a call clones no reference count for it.
struct Unary<'a, S> {
    shared: &'a Shared<S>,
    handled: &'a AtomicBool,
}

impl<'a, S: Backend> UnaryService<RateLimitRequest> for Unary<'a, S> {
    type Response = RateLimitResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<RateLimitResponse>, Status>> + Send + 'a>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        self.handled.store(true, Ordering::Relaxed);
        let shared = self.shared;
        Box::pin(shared.should_rate_limit(request))
    }
}

impl<S: Backend> Shared<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let headers = request.metadata().as_ref();
        match self
            .front
            .decide_in_trace(request.get_ref(), Some(headers))
            .await
        {
            Ok(response) => Ok(Response::new(response)),
            Err(e) => Err(Status::new(status_code(&e), e.to_string())),
        }
    }
}
