//! Serving a listener's connections with hyper, one task each, for the gRPC and the admin
//! listeners alike: the accept loop (a connection's TLS handshake runs in its own task, so a slow
//! one holds up no other), a connection's end (gracefully at shutdown, or at its maximum age with
//! a GOAWAY and then cut after the grace), and the drain: no new connections, the open ones
//! finish their calls. Dropping the serving future (the drain timeout) cuts what is left.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Acceptor, LimitedStream, Listener};

/// How long a connection may live: GOAWAY after `max`, cut `grace` later (gRPC's
/// MAX_CONNECTION_AGE and MAX_CONNECTION_AGE_GRACE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionAge {
    pub(crate) max: Duration,
    pub(crate) grace: Duration,
}

/// Set once when the listener stops accepting: each connection then finishes gracefully.
pub(crate) type Draining = watch::Receiver<bool>;

/// Accepts on `acceptor` until `stop` completes; each connection, once `open` has made it ready
/// (`None`: a failed TLS handshake, already logged), is served in a task of its own by `serve`.
/// Then the listening socket is closed, every connection is told to finish (through its
/// [`Draining`]), and this returns when they all have.
pub(crate) async fn serve_connections<L, Io, Open, Opening, Serve, Serving>(
    acceptor: Acceptor<L>,
    open: Open,
    serve: Serve,
    stop: impl Future<Output = ()>,
) where
    L: Listener,
    Open: Fn(LimitedStream<L::Stream>) -> Opening,
    Opening: Future<Output = Option<Io>> + Send + 'static,
    Serve: Fn(Io, Draining) -> Serving + Clone + Send + 'static,
    Serving: Future<Output = ()> + Send + 'static,
    Io: Send + 'static,
{
    let (drain, draining) = watch::channel(false);
    // Dropped with this future, the set aborts the connections still open.
    let mut connections = JoinSet::new();
    let mut stop = pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            accepted = acceptor.accept() => accepted,
            // Ended connections are reaped as they go, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            () = &mut stop => break,
        };
        let opening = open(stream);
        let serve = serve.clone();
        let draining = draining.clone();
        connections.spawn(async move {
            if let Some(io) = opening.await {
                serve(io, draining).await;
            }
        });
    }
    drop(acceptor);
    let _ = drain.send(true);
    while connections.join_next().await.is_some() {}
}

/// Drives one hyper connection to its end: until the peer closes it, or gracefully (GOAWAY; calls
/// in progress finish) once `draining` is set or at its maximum `age`, which is then cut after the
/// age's grace. `listener` names it in the debug line of a connection that ends with an error.
pub(crate) async fn drive<C>(
    connection: C,
    mut draining: Draining,
    age: Option<ConnectionAge>,
    listener: &'static str,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut connection = pin!(connection);
    let aged = async {
        match age {
            Some(age) => tokio::time::sleep(age.max).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        result = &mut connection => result,
        () = async { let _ = draining.wait_for(|draining| *draining).await; } => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
        () = aged => {
            connection.as_mut().graceful_shutdown();
            let grace = age.map_or(Duration::ZERO, |age| age.grace);
            match tokio::time::timeout(grace, &mut connection).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::debug!(listener, ?grace, "connection cut at the end of its age's grace");
                    return;
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(listener, error = %e, "connection ended with an error");
    }
}
