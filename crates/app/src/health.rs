//! gRPC health checking (`grpc.health.v1`): one serving status shared by every service name we
//! answer for, and Watch streams that end when the server closes its listeners, so an open Watch
//! never holds a shutdown for its whole drain timeout. A name we do not answer for is `NOT_FOUND`
//! (which Envoy's health checker counts as unhealthy), and warned of once per name.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// Health service names we report: the whole server, the reference's "ratelimit", and the
/// rate-limit service's full name (gRPC's convention for a service's health).
pub(crate) const HEALTH_SERVICES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// Unknown names warned of, at most (a client's text: bounded).
const UNKNOWN_NAMES_WARNED: usize = 16;

/// Sets what the health service answers.
#[derive(Debug, Clone)]
pub(crate) struct HealthReporter {
    status: watch::Sender<ServingStatus>,
    closed: watch::Sender<bool>,
}

impl HealthReporter {
    /// A reporter that starts SERVING, and the gRPC service it drives.
    pub(crate) fn new() -> (HealthReporter, HealthServer<HealthService>) {
        let (status, _) = watch::channel(ServingStatus::Serving);
        let (closed, _) = watch::channel(false);
        let reporter = HealthReporter { status, closed };
        let service = HealthService {
            reporter: reporter.clone(),
            unknown: Mutex::new(HashSet::new()),
        };
        (reporter, HealthServer::new(service))
    }

    pub(crate) fn set(&self, status: ServingStatus) {
        self.status.send_replace(status);
    }

    pub(crate) fn status(&self) -> ServingStatus {
        *self.status.borrow()
    }

    /// Ends every Watch stream (after it has delivered the last status), now and from now on.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }
}

pub(crate) struct HealthService {
    reporter: HealthReporter,
    /// The unknown names warned of so far.
    unknown: Mutex<HashSet<String>>,
}

impl HealthService {
    /// `Ok` for a name we answer for; else `NOT_FOUND`, and a warning the first time.
    fn known(&self, request: &Request<HealthCheckRequest>) -> Result<(), Status> {
        let name = request.get_ref().service.as_str();
        if HEALTH_SERVICES.contains(&name) {
            return Ok(());
        }
        let mut warned = self.unknown.lock().unwrap_or_else(PoisonError::into_inner);
        if warned.len() < UNKNOWN_NAMES_WARNED && warned.insert(name.to_owned()) {
            tracing::warn!(
                service = name,
                known = ?HEALTH_SERVICES,
                "a gRPC health check asked for a service this server does not answer for: it is \
                 answered NOT_FOUND, which Envoy's health checker counts as unhealthy; set the \
                 check's service_name to one of the known names (said once per name)"
            );
        }
        Err(Status::not_found(format!(
            "service not registered; this server answers for {HEALTH_SERVICES:?}"
        )))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.known(&request)?;
        Ok(Response::new(HealthCheckResponse {
            status: self.reporter.status() as i32,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        self.known(&request)?;
        let status = self.reporter.status.subscribe();
        let closed = self.reporter.closed.subscribe();
        // The current status first; then each change; the end once closed, but never before a
        // change made before the close (NOT_SERVING) has been sent.
        let stream = futures_util::stream::unfold(
            (status, closed, true),
            |(mut status, mut closed, first)| async move {
                if !first {
                    tokio::select! {
                        biased;
                        changed = status.changed() => changed.ok()?,
                        _ = closed.wait_for(|c| *c) => return None,
                    }
                }
                let current = *status.borrow_and_update();
                let response = HealthCheckResponse {
                    status: current as i32,
                };
                Some((Ok(response), (status, closed, false)))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
