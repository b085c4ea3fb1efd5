//! Clients at a gRPC listener that speak another protocol than it serves: HTTP/1.x or TLS on the
//! plaintext listener, plaintext on a TLS one — an Envoy cluster set up without HTTP/2 or with the
//! wrong transport socket. Their calls fail, and Envoy's ratelimit filter then lets requests
//! through unlimited (or refuses them) while nothing was said here. Each connection's first bytes
//! are peeked before it is served ([`first_bytes`](super::first_bytes) reads them); one that
//! speaks the wrong protocol is answered when it speaks HTTP/1.x (a status and a reason), counted
//! in `ratelimit_connections_wrong_protocol_total{listener,protocol}`, warned of at most once a
//! minute per listener and protocol, then closed.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use ratelimit_remote::Every;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::first_bytes::{self, Spoken};
use super::{LimitedStream, Listener};

/// A warning of each kind is logged at most this often per listener (every one is counted).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Bytes peeked: the HTTP/2 preface is 24, an HTTP/1.x request line fits.
const PEEKED: usize = 256;

/// After an answer, what the client sent is read and dropped until it closes, up to this much
/// and this long, so the close is a FIN the client reads the answer before, not a reset.
const DRAINED: usize = 64 * 1024;
const DRAIN_FOR: Duration = Duration::from_secs(1);

/// `ratelimit_connections_wrong_protocol_total{listener, protocol}`, registered on `registry`.
pub(crate) fn counters(registry: &Registry) -> IntCounterVec {
    let counters = IntCounterVec::new(
        Opts::new(
            "ratelimit_connections_wrong_protocol_total",
            "Connections to a gRPC listener closed because their client spoke another protocol: \
             http1 (HTTP/1.x on the plaintext listener), tls (a TLS handshake on the plaintext \
             listener), plaintext (plaintext on the TLS listener)",
        ),
        &["listener", "protocol"],
    )
    .expect("valid metric");
    // Registering twice (a second server on one registry) keeps the first; counts still work.
    let _ = registry.register(Box::new(counters.clone()));
    counters
}

/// One gRPC listener's check of its clients' first bytes.
pub(crate) struct WrongProtocol {
    listener: &'static str,
    /// Whether the listener serves TLS.
    tls: bool,
    counters: IntCounterVec,
    /// One per [`Mismatch`], in its declaration order.
    warned: [Every; 3],
}

impl WrongProtocol {
    pub(crate) fn new(listener: &'static str, tls: bool, counters: IntCounterVec) -> WrongProtocol {
        WrongProtocol {
            listener,
            tls,
            counters,
            warned: [const { Every::new(WARN_EVERY) }; 3],
        }
    }

    /// Whether `stream` is to be served: `false` when its client speaks the wrong protocol (it
    /// has then been answered if it speaks HTTP/1.x, counted and warned of). What the peek finds
    /// stays to be read. A client silent until its handshake deadline, or whose bytes are not
    /// told apart, is served, and the server refuses it as it did before.
    pub(crate) async fn serves<L: Listener>(&self, stream: &mut LimitedStream<L::Stream>) -> bool {
        let mut head = [0u8; PEEKED];
        let deadline = stream.handshake_deadline();
        let peeked = tokio::time::timeout_at(deadline, L::peek(stream.get_ref(), &mut head)).await;
        let Ok(Ok(len)) = peeked else { return true };
        let spoken = first_bytes::spoken(&head[..len]);
        let Some(mismatch) = first_bytes::mismatch(spoken, self.tls) else {
            return true;
        };
        self.counters
            .with_label_values(&[self.listener, mismatch.label()])
            .inc();
        if self.warned[mismatch as usize].due(since_start()) {
            let request_line = match spoken {
                Spoken::Http1 { request_line } => Some(String::from_utf8_lossy(request_line)),
                _ => None,
            };
            tracing::warn!(
                listener = self.listener,
                peer = L::peer(stream.get_ref())
                    .map(|peer| peer.to_string())
                    .as_deref(),
                request_line = request_line.as_deref(),
                protocol = mismatch.label(),
                "{}. Its calls fail, so its Envoy lets requests through unlimited \
                 (failure_mode_deny: false) or refuses them. Such connections are closed, counted in \
                 ratelimit_connections_wrong_protocol_total and warned of at most once a minute",
                mismatch.warning()
            );
        }
        if let Some(answer) = mismatch.answer(spoken) {
            answer_and_drain(stream, answer).await;
        }
        false
    }
}

/// Writes `answer`, ends our side, then reads what the client still sends until it closes (at
/// most [`DRAINED`] bytes for [`DRAIN_FOR`]).
async fn answer_and_drain<S>(stream: &mut LimitedStream<S>, answer: &[u8])
where
    LimitedStream<S>: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let answered = async {
        stream.write_all(answer).await?;
        stream.shutdown().await?;
        let mut drained = 0;
        let mut buf = [0u8; 4096];
        while drained < DRAINED {
            match stream.read(&mut buf).await? {
                0 => break,
                read => drained += read,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(DRAIN_FOR, answered).await;
}

/// Nanoseconds since the first call, for [`Every`].
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
