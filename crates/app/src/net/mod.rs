//! The listening sockets: one accept loop for TCP and Unix sockets alike that sets TCP_NODELAY on
//! every accepted TCP connection, caps how many connections a listener holds and how many one
//! client (source address) holds (`clients`), backs off when accepting fails (out of file
//! descriptors), and closes connections that stay silent (see `limited`). The gRPC listeners (TCP
//! and `--grpc-uds`), the admin and the debug listener all accept through here, so no socket of
//! ours is served with the kernel's defaults.

mod clients;
mod connection_calls;
mod first_bytes;
mod limited;
mod listener;
mod serve;
mod serve_grpc;
mod serve_http;
pub(crate) mod tls;
mod wrong_protocol;

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

pub(crate) use clients::Clients;
pub(crate) use limited::{LimitedStream, Slot, Timeouts};
pub(crate) use listener::Listener;
pub(crate) use serve::ConnectionAge;
pub(crate) use serve_grpc::{Http2Settings, serve_grpc};
pub(crate) use serve_http::serve_http;
pub(crate) use wrong_protocol::{WrongProtocol, counters as wrong_protocol_counters};

/// First wait after a failed accept; it doubles up to [`MAX_ACCEPT_BACKOFF`].
const MIN_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// File descriptors kept free for rules files, the watcher, logs and outgoing connections when
/// connection caps are derived from the process's descriptor limit.
const RESERVED_FDS: u64 = 64;

/// Refusals of a client past its cap are logged at most this often (with how many since).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// How many connections each listener may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionCaps {
    pub(crate) grpc: usize,
    /// The gRPC Unix socket's (`--grpc-uds`); 0 when there is none.
    pub(crate) uds: usize,
    pub(crate) admin: usize,
}

impl ConnectionCaps {
    /// Caps that fit in `fd_limit` descriptors: the admin listener gets an eighth (at most
    /// `admin`), gRPC three quarters (at most `grpc` each), split evenly between TCP and the Unix
    /// socket when there is one, and `RESERVED_FDS` stay free, so a flood of connections on one
    /// listener never starves another or the rules reload of descriptors. `None` (no limit
    /// known) keeps the asked caps.
    pub(crate) fn fitted(
        grpc: usize,
        admin: usize,
        uds: bool,
        fd_limit: Option<u64>,
    ) -> ConnectionCaps {
        let Some(limit) = fd_limit else {
            return ConnectionCaps {
                grpc,
                uds: if uds { grpc } else { 0 },
                admin,
            };
        };
        let usable = limit.saturating_sub(RESERVED_FDS).max(8);
        let fit = |share: u64, asked: usize| {
            asked
                .min(usize::try_from(share).unwrap_or(usize::MAX))
                .max(1)
        };
        let grpc_share = if uds { usable * 3 / 8 } else { usable * 3 / 4 };
        ConnectionCaps {
            grpc: fit(grpc_share, grpc),
            uds: if uds { fit(grpc_share, grpc) } else { 0 },
            admin: fit(usable / 8, admin),
        }
    }
}

/// The per-client cap a listener gets when none is set: a quarter of its connection cap, so one
/// client (one source address) can hold no more than that, stalled TLS handshakes included.
pub(crate) fn default_client_cap(listener_cap: usize) -> usize {
    (listener_cap / 4).max(1)
}

/// `ratelimit_connections_refused_total{listener}`: connections closed at once because their client
/// held its share (`MAX_CONNECTIONS_PER_CLIENT`), registered on `registry`.
pub(crate) fn refusal_counters(registry: &Registry) -> IntCounterVec {
    let counters = IntCounterVec::new(
        Opts::new(
            "ratelimit_connections_refused_total",
            "Connections closed as soon as they were accepted because their client (source \
             address) already held MAX_CONNECTIONS_PER_CLIENT on that listener",
        ),
        &["listener"],
    )
    .expect("valid metric");
    // Registering twice (a second server on one registry) keeps the first; counts still work.
    let _ = registry.register(Box::new(counters.clone()));
    counters
}

/// The soft limit on open file descriptors of this process, if it can be read.
pub(crate) fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_fd_limit(&limits)
}

fn parse_fd_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    soft.parse().ok() // "unlimited" → None
}

/// Refused connections of clients past their cap: counted, and logged at most once per
/// [`REFUSAL_LOG_EVERY`].
struct Refusals {
    counter: Option<IntCounter>,
    /// When the last line was logged, and how many refusals since.
    logged: Mutex<Option<(Instant, u64)>>,
}

impl Refusals {
    fn refused(&self, listener: &'static str, peer: IpAddr, cap: usize) {
        if let Some(c) = &self.counter {
            c.inc();
        }
        let now = Instant::now();
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *logged {
            Some((at, since)) if now.duration_since(*at) < REFUSAL_LOG_EVERY => *since += 1,
            last => {
                let since = last.map_or(0, |(_, n)| n);
                *last = Some((now, 0));
                tracing::warn!(
                    listener,
                    %peer,
                    cap,
                    refused_since_last_log = since,
                    "a client holds its share of connections (MAX_CONNECTIONS_PER_CLIENT); \
                     its new connections are closed at once"
                );
            }
        }
    }
}

/// A listener that hands out limited connections ([`LimitedStream`]).
pub(crate) struct Acceptor<L: Listener = TcpListener> {
    listener: L,
    slots: Arc<Semaphore>,
    clients: Arc<Clients>,
    timeouts: Timeouts,
    name: &'static str,
    at_cap: AtomicBool,
    refusals: Refusals,
}

impl<L: Listener> Acceptor<L> {
    /// At most `cap` connections, of which one client holds at most
    /// [`default_client_cap`]`(cap)` (see [`Acceptor::with_client_cap`]). `name` ("gRPC",
    /// "admin") is used in log lines.
    pub(crate) fn new(listener: L, cap: usize, timeouts: Timeouts, name: &'static str) -> Self {
        let cap = cap.max(1);
        Acceptor {
            listener,
            slots: Arc::new(Semaphore::new(cap)),
            clients: Clients::new(default_client_cap(cap)),
            timeouts,
            name,
            at_cap: AtomicBool::new(false),
            refusals: Refusals {
                counter: None,
                logged: Mutex::new(None),
            },
        }
    }

    /// At most `cap` connections per client (source address; peers of a Unix socket are not
    /// told apart).
    pub(crate) fn with_client_cap(mut self, cap: usize) -> Self {
        self.clients = Clients::new(cap);
        self
    }

    /// Counts the connections refused because their client held its cap.
    pub(crate) fn with_refusal_counter(mut self, counter: IntCounter) -> Self {
        self.refusals.counter = Some(counter);
        self
    }

    /// Waits for a free connection slot, then for a connection. A client that holds its cap
    /// has the new connection closed at once (counted, logged once a minute) and the slot goes to
    /// the next. Accept errors (EMFILE, ENFILE…) are logged and retried after a growing pause
    /// instead of at once, so running out of descriptors cannot make the loop spin.
    pub(crate) async fn accept(&self) -> (LimitedStream<L::Stream>, Option<IpAddr>) {
        let permit = self.slot().await;
        let mut backoff = MIN_ACCEPT_BACKOFF;
        loop {
            match std::future::poll_fn(|cx| self.listener.poll_accept(cx)).await {
                Ok((stream, peer)) => {
                    let client = match peer {
                        None => None,
                        Some(ip) => match self.clients.admit(ip) {
                            Some(slot) => Some(slot),
                            None => {
                                self.refusals.refused(self.name, ip, self.clients.cap());
                                drop(stream);
                                continue;
                            }
                        },
                    };
                    L::prepare(&stream, self.name);
                    let slot = Slot::new(permit, client);
                    return (LimitedStream::new(stream, self.timeouts, slot), peer);
                }
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(listener = self.name, error = %e, ?backoff, "accept failed; retrying after a pause");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                }
            }
        }
    }

    async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return permit;
        }
        // Said once per episode at the cap, not once per waiting connection.
        if !self.at_cap.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                listener = self.name,
                "connection cap reached; new connections wait until one closes"
            );
        }
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        if self.slots.available_permits() > 0 && self.at_cap.swap(false, Ordering::Relaxed) {
            tracing::info!(listener = self.name, "below the connection cap again");
        }
        permit
    }
}

impl Acceptor<TcpListener> {
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// Errors about one connection that went away before it was accepted: nothing to wait for.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests;
