//! gRPC health checking (`grpc.health.v1`): one serving status shared by every service name we
//! answer for, and Watch streams that end when the server closes its listeners, so an open Watch
//! never holds a shutdown for its whole drain timeout.

use std::pin::Pin;

use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// Health service names we report: the whole server and the reference's "ratelimit".
pub(crate) const HEALTH_SERVICES: [&str; 2] = ["", "ratelimit"];

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
}

fn known(request: &Request<HealthCheckRequest>) -> Result<(), Status> {
    if HEALTH_SERVICES.contains(&request.get_ref().service.as_str()) {
        Ok(())
    } else {
        Err(Status::not_found("service not registered"))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        known(&request)?;
        Ok(Response::new(HealthCheckResponse {
            status: self.reporter.status() as i32,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        known(&request)?;
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
