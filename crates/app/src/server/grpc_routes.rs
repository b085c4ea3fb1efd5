//! The gRPC listeners' one service: each call goes, by the service name in its path, to
//! `ShouldRateLimit` (ours, bounded before decoding), health (its request bounded as
//! `ShouldRateLimit`'s: in bytes and in time), or RLQS when it is on; any other
//! name is answered UNIMPLEMENTED, as tonic's router answers it. Each call is held to the
//! deadline its `grpc-timeout` asks for, as tonic's server holds it.

use std::convert::Infallible;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use hyper::body::Incoming;
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;

use crate::health::HealthService;
use crate::rlqs::QuotaService;
use crate::service::{RateLimitGrpc, deadline};
use ratelimit_core::store::Backend;

type QuotaServer<B> = RateLimitQuotaServiceServer<QuotaService<B>>;

/// The services, by name.
pub(super) struct GrpcRoutes<B> {
    pub(super) rate_limit: RateLimitGrpc<B>,
    pub(super) health: HealthServer<HealthService>,
    pub(super) quota: Option<QuotaServer<B>>,
}

impl<B> Clone for GrpcRoutes<B> {
    fn clone(&self) -> Self {
        GrpcRoutes {
            rate_limit: self.rate_limit.clone(),
            health: self.health.clone(),
            quota: self.quota.clone(),
        }
    }
}

/// `/package.Service/Method` → `package.Service`; `None` for a path of another shape.
fn service_name(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    // memchr: `split_once` searched char by char (~200 instructions a call under callgrind).
    let slash = memchr::memchr(b'/', rest.as_bytes())?;
    let (service, method) = (&rest[..slash], &rest[slash + 1..]);
    (!service.is_empty() && !method.is_empty()).then_some(service)
}

impl<B: Backend> hyper::service::Service<http::Request<Incoming>> for GrpcRoutes<B> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let deadline = deadline::requested(request.headers());
        match service_name(request.uri().path()) {
            Some(<RateLimitGrpc<B> as NamedService>::NAME) => {
                self.rate_limit.serve(request, deadline)
            }
            Some(<HealthServer<HealthService> as NamedService>::NAME) => {
                let call = self.health.clone().call(self.rate_limit.bounded(request));
                Box::pin(deadline::within(deadline, call))
            }
            Some(<QuotaServer<B> as NamedService>::NAME) => match &self.quota {
                Some(quota) => Box::pin(deadline::within(deadline, quota.clone().call(request))),
                None => unimplemented(),
            },
            _ => unimplemented(),
        }
    }
}

/// The answer to a call of a service not served here.
fn unimplemented() -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
    Box::pin(std::future::ready(
        Ok(Status::unimplemented("").into_http()),
    ))
}

#[cfg(test)]
mod tests {
    use super::service_name;

    #[test]
    fn the_service_is_the_paths_first_segment() {
        assert_eq!(
            service_name("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
            Some("envoy.service.ratelimit.v3.RateLimitService")
        );
        assert_eq!(
            service_name("/grpc.health.v1.Health/Check"),
            Some("grpc.health.v1.Health")
        );
    }

    #[test]
    fn paths_of_another_shape_name_no_service() {
        for path in ["", "/", "/x", "x/y", "//y", "/x/"] {
            assert_eq!(service_name(path), None, "{path:?}");
        }
    }
}
