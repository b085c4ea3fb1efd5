//! Serves an axum router (the admin port) on an [`Acceptor`], connection by connection with
//! hyper-util, so that the guards of [`super::limited`] and a header read timeout apply (axum's own
//! `serve` has neither), and stops gracefully: no new connections, requests in flight finish. With
//! TLS, each connection's handshake runs in its own task (see [`super::tls`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use super::Acceptor;
use super::tls::{self, Conn, TlsSource};

/// Serves `router` until `stop` completes, then waits for open requests to finish.
pub(crate) async fn serve_http(
    acceptor: Acceptor,
    tls: Option<Arc<TlsSource>>,
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
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            let conn = match tls {
                None => Conn::Plain(stream),
                Some(tls) => match tls::handshake(&tls, stream).await {
                    Some(conn) => conn,
                    None => return,
                },
            };
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(conn), service)
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
    drop(acceptor);
    graceful.shutdown().await;
}
