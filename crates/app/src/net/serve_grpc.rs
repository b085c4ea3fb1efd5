//! Serves a gRPC listener (TCP, through TLS when it has it, or the Unix socket) with hyper's
//! HTTP/2 server, connection by connection (see [`super::serve`]): the transport's keepalive
//! pings and stream cap, each connection's maximum age; a connection's calls run in its own task
//! ([`super::connection_calls`]). Which service answers a call is the
//! caller's (`crate::server` routes by the path's service name); nothing sits between hyper and
//! it, as tonic's `Server` would put its router, connect info and boxed bodies on every call.

use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::connection_calls;
use super::serve::{self, ConnectionAge};
use super::{Acceptor, LimitedStream, Listener};

/// A gRPC listener's HTTP/2 settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Http2Settings {
    /// How often an idle connection is pinged, and how long the peer has to answer.
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    /// Calls one connection may have in progress.
    pub(crate) max_concurrent_streams: u32,
    /// When set, each connection is closed at this age (see [`ConnectionAge`]).
    pub(crate) age: Option<ConnectionAge>,
}

/// Serves `service` on every connection `acceptor` takes (made ready by `open`) until `stop`
/// completes, then lets the calls in progress finish. `listener` names it in log lines.
pub(crate) async fn serve_grpc<L, Io, Open, Opening, S, B>(
    acceptor: Acceptor<L>,
    open: Open,
    settings: Http2Settings,
    service: S,
    stop: impl Future<Output = ()>,
    listener: &'static str,
) where
    L: Listener,
    Open: Fn(LimitedStream<L::Stream>) -> Opening,
    Opening: Future<Output = Option<Io>> + Send + 'static,
    Io: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: hyper::service::Service<hyper::Request<Incoming>, Response = hyper::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let serve = move |io: Io, draining| {
        let service = service.clone();
        async move {
            // A builder per connection: its executor runs the connection's calls in its task.
            let (spawner, calls) = connection_calls::calls();
            let mut builder = http2::Builder::new(spawner);
            builder
                .timer(TokioTimer::new())
                .keep_alive_interval(settings.keepalive_interval)
                .keep_alive_timeout(settings.keepalive_timeout)
                .max_concurrent_streams(settings.max_concurrent_streams);
            let connection = builder.serve_connection(TokioIo::new(io), service);
            calls
                .run(serve::drive(connection, draining, settings.age, listener))
                .await;
        }
    };
    serve::serve_connections(acceptor, open, serve, stop).await;
}
