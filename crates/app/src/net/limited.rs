//! One accepted connection, limited: it holds its listener's connection slot and its client's
//! ([`Slot`]) until it closes, and it fails (so the server closes it) when the peer has not sent
//! its first bytes within the handshake timeout, or when nothing has been read or written for the
//! idle timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::clients::ClientSlot;

/// Bytes a peer must send within the handshake timeout: the HTTP/2 connection preface (24 bytes)
/// and the header of the SETTINGS frame that must follow it (9), without which the handshake never
/// completes and no keepalive ping is ever sent; an HTTP/1 request line with a header is longer.
const HANDSHAKE_BYTES: u64 = 33;

/// How long a connection may stay silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From accept until the peer has sent `HANDSHAKE_BYTES`; activity does not extend it.
    pub(crate) handshake: Duration,
    /// After the handshake: longest time with nothing read or written.
    pub(crate) idle: Duration,
}

/// What one connection holds while it is open: a place under its listener's cap and, when its
/// peer has an address, under its client's.
#[derive(Debug)]
pub(crate) struct Slot {
    _listener: OwnedSemaphorePermit,
    _client: Option<ClientSlot>,
}

impl Slot {
    pub(crate) fn new(listener: OwnedSemaphorePermit, client: Option<ClientSlot>) -> Slot {
        Slot {
            _listener: listener,
            _client: client,
        }
    }
}

/// A connection that closes itself when its peer stays silent, and frees its slot when dropped.
pub(crate) struct LimitedStream<S> {
    inner: S,
    timeouts: Timeouts,
    deadline: Pin<Box<Sleep>>,
    accepted: Instant,
    last_activity: Instant,
    received: u64,
    slot: Slot,
}

impl<S> LimitedStream<S> {
    pub(crate) fn new(inner: S, timeouts: Timeouts, slot: Slot) -> Self {
        LimitedStream::resume(inner, timeouts, slot, Instant::now())
    }

    /// The limits over `inner` for a connection accepted at `accepted`: its handshake deadline is
    /// `accepted` + the handshake timeout, and it counts the bytes read from `inner` afresh. TLS
    /// uses it to move a connection's limits from the TCP stream onto the decrypted stream, so the
    /// one deadline covers the TLS handshake and the first request bytes after it.
    pub(crate) fn resume(inner: S, timeouts: Timeouts, slot: Slot, accepted: Instant) -> Self {
        LimitedStream {
            inner,
            timeouts,
            deadline: Box::pin(tokio::time::sleep_until(accepted + timeouts.handshake)),
            accepted,
            last_activity: Instant::now(),
            received: 0,
            slot,
        }
    }

    /// The connection, its timeouts, its slot and when it was accepted (see [`LimitedStream::resume`]).
    pub(crate) fn into_parts(self) -> (S, Timeouts, Slot, Instant) {
        (self.inner, self.timeouts, self.slot, self.accepted)
    }

    /// When the handshake timeout of this connection ends.
    pub(crate) fn handshake_deadline(&self) -> Instant {
        self.accepted + self.timeouts.handshake
    }

    /// The connection under the limits.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Polled when the peer has nothing for us: `Ready` with an error once the connection has been
    /// silent too long. The timer is moved forward lazily, when it fires, so activity costs no
    /// timer update.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.received < HANDSHAKE_BYTES {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "peer sent no request within the handshake timeout",
                ));
            }
            let next = self.last_activity + self.timeouts.idle;
            if next <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle for longer than the idle timeout",
                ));
            }
            self.deadline.as_mut().reset(next);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LimitedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = (buf.filled().len() - before) as u64;
                if read > 0 {
                    this.received = this.received.saturating_add(read);
                    this.last_activity = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => this.poll_expired(cx).map(Err),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LimitedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.last_activity = Instant::now();
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.last_activity = Instant::now();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
