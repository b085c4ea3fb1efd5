//! Connections after TLS: the handshake of one accepted connection, bounded by the connection's
//! handshake deadline, then the limits moved onto the decrypted stream.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::TlsSource;
use crate::net::LimitedStream;

/// An accepted connection, plaintext or after its TLS handshake; limited either way.
pub(crate) enum Conn {
    Plain(LimitedStream<TcpStream>),
    Tls(Box<LimitedStream<TlsStream<TcpStream>>>),
}

/// Runs the TLS handshake on `stream` with the config serving now. It must end by the
/// connection's handshake deadline; the limits then watch the decrypted stream, with the same
/// deadline for the first request bytes. `None` (counted, logged at debug) when it fails.
pub(crate) async fn handshake(
    source: &TlsSource,
    stream: LimitedStream<TcpStream>,
) -> Option<Conn> {
    let deadline = stream.handshake_deadline();
    let (tcp, timeouts, slot, accepted) = stream.into_parts();
    let peer = tcp.peer_addr().ok();
    let acceptor = TlsAcceptor::from(source.config());
    let listener = source.listener();
    let error = match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => {
            let limited = LimitedStream::resume(tls, timeouts, slot, accepted);
            return Some(Conn::Tls(Box::new(limited)));
        }
        Ok(Err(e)) => e,
        Err(_) => io::Error::new(
            io::ErrorKind::TimedOut,
            "no TLS handshake within the handshake timeout",
        ),
    };
    source.metrics().handshake_error(listener);
    // rustls's refusals of what the client sent are InvalidData; a peer gone or silent is not.
    if error.kind() == io::ErrorKind::InvalidData && source.warn_of_refused_handshake() {
        tracing::warn!(
            listener,
            peer = peer.map(|peer| peer.to_string()).as_deref(),
            %error,
            "a client's TLS handshake was refused; its calls fail, so its Envoy lets requests \
             through unlimited (failure_mode_deny: false) or refuses them. Refused handshakes are \
             counted in ratelimit_tls_handshake_errors_total and warned of at most once a minute"
        );
    } else {
        tracing::debug!(listener, ?peer, %error, "TLS handshake failed; connection closed");
    }
    None
}

/// `stream` made ready to serve: as it is, or after its TLS handshake when `tls` is set (`None`
/// when that fails).
pub(crate) async fn open(
    tls: Option<Arc<TlsSource>>,
    stream: LimitedStream<TcpStream>,
) -> Option<Conn> {
    match tls {
        None => Some(Conn::Plain(stream)),
        Some(tls) => handshake(&tls, stream).await,
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, data),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
