//! The two kinds of listening socket one [`Acceptor`](super::Acceptor) serves: TCP (each accepted
//! connection gets TCP_NODELAY) and a Unix socket (`--grpc-uds`), and who is at the other end: an
//! IP address for the per-client cap, none on a Unix socket (its peers are all local).

use std::io;
use std::net::IpAddr;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A listening socket.
pub(crate) trait Listener: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// The next connection and its peer's address, if it has one.
    fn poll_accept(&self, cx: &mut Context<'_>)
    -> Poll<io::Result<(Self::Stream, Option<IpAddr>)>>;

    /// Made ready to serve (TCP: no Nagle delay on answers).
    fn prepare(stream: &Self::Stream, listener: &'static str);
}

impl Listener for TcpListener {
    type Stream = TcpStream;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, Option<IpAddr>)>> {
        TcpListener::poll_accept(self, cx).map_ok(|(stream, peer)| (stream, Some(peer.ip())))
    }

    fn prepare(stream: &TcpStream, listener: &'static str) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(listener, error = %e, "cannot set TCP_NODELAY");
        }
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, Option<IpAddr>)>> {
        UnixListener::poll_accept(self, cx).map_ok(|(stream, _)| (stream, None))
    }

    fn prepare(_: &UnixStream, _: &'static str) {}
}
