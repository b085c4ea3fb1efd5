//! Serves an axum router (the admin port) on an [`Acceptor`], connection by connection with
//! hyper-util, so that the guards of [`super::guard`] and a header read timeout apply (axum's own
//! `serve` has neither), and stops gracefully: no new connections, requests in flight finish.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use super::Acceptor;

/// Serves `router` until `stop` completes, then waits for open requests to finish.
pub async fn serve_http(
    acceptor: Acceptor,
    router: axum::Router,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            accepted = acceptor.accept() => accepted,
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
    drop(acceptor);
    graceful.shutdown().await;
}
