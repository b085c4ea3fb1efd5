//! Serves an axum router (the admin port) on an [`Acceptor`], connection by connection with
//! hyper-util (see [`super::serve`]), so that the guards of [`super::limited`] and a header read
//! timeout apply (axum's own `serve` has neither), and stops gracefully: no new connections,
//! requests in flight finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;

use super::tls::{self, Conn, TlsSource};
use super::{Acceptor, serve};

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
    let serve = move |conn: Conn, draining| {
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        async move {
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            serve::drive(connection, draining, None, "admin").await;
        }
    };
    let open = move |stream| tls::open(tls.clone(), stream);
    serve::serve_connections(acceptor, open, serve, stop).await;
}
