//! The two kinds of listening socket one [`Acceptor`](super::Acceptor) serves: TCP (each accepted
//! connection gets TCP_NODELAY) and a Unix socket (`--grpc-uds`), who is at the other end (an IP
//! address for the per-client cap, none on a Unix socket: its peers are all local), and a look at
//! a connection's first bytes that leaves them to be read.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A listening socket.
pub(crate) trait Listener: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// The next connection and its peer's address, if it has one.
    fn poll_accept(&self, cx: &mut Context<'_>)
    -> Poll<io::Result<(Self::Stream, Option<IpAddr>)>>;

    /// Made ready to serve (TCP: no Nagle delay on answers).
    fn prepare(stream: &Self::Stream, listener: &'static str);

    /// Copies into `buf` what the peer has sent and nobody has read yet, waiting for its first
    /// bytes; they stay there for the next read. `Ok(0)`: the peer closed without sending.
    fn peek<'a>(
        stream: &'a Self::Stream,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;

    /// The peer's address, for log lines.
    fn peer(stream: &Self::Stream) -> Option<SocketAddr>;
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

    fn peek<'a>(
        stream: &'a TcpStream,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        stream.peek(buf)
    }

    fn peer(stream: &TcpStream) -> Option<SocketAddr> {
        stream.peer_addr().ok()
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, Option<IpAddr>)>> {
        UnixListener::poll_accept(self, cx).map_ok(|(stream, _)| (stream, None))
    }

    fn prepare(_: &UnixStream, _: &'static str) {}

    /// tokio has no `peek` for Unix streams: `recv` with `MSG_PEEK` once the socket is readable.
    async fn peek(stream: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            stream.readable().await?;
            let peeked = stream.try_io(Interest::READABLE, || {
                rustix::net::recv(stream, &mut *buf, rustix::net::RecvFlags::PEEK)
                    .map(|(read, _)| read)
                    .map_err(io::Error::from)
            });
            match peeked {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                peeked => return peeked,
            }
        }
    }

    fn peer(_: &UnixStream) -> Option<SocketAddr> {
        None
    }
}
