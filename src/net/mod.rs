//! The listening sockets: accept loops that set TCP_NODELAY on every accepted connection, cap how
//! many connections a listener holds, back off when accepting fails (out of file descriptors), and
//! close connections that stay silent (see `guard`). Both the gRPC and the admin HTTP listener
//! accept through here, so no socket of ours is served with the kernel's defaults.

mod guard;
mod serve_http;
mod settings;
pub mod tls;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use guard::{GuardedStream, Timeouts};
pub use serve_http::serve_http;
pub use settings::{TransportArgs, byte_size};

/// First wait after a failed accept; it doubles up to [`MAX_ACCEPT_BACKOFF`].
const MIN_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// File descriptors kept free for rules files, the watcher, logs and outgoing connections when
/// connection caps are derived from the process's descriptor limit.
const RESERVED_FDS: u64 = 64;

/// How many connections each listener may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    pub grpc: usize,
    pub admin: usize,
}

impl ConnectionCaps {
    /// Caps that fit in `fd_limit` descriptors: the admin listener gets an eighth (at most
    /// `admin`), gRPC three quarters (at most `grpc`), and `RESERVED_FDS` stay free, so a flood
    /// of connections on one port never starves the other port or the rules reload of
    /// descriptors. `None` (no limit known) keeps the asked caps.
    pub fn fitted(grpc: usize, admin: usize, fd_limit: Option<u64>) -> ConnectionCaps {
        let Some(limit) = fd_limit else {
            return ConnectionCaps { grpc, admin };
        };
        let usable = limit.saturating_sub(RESERVED_FDS).max(8);
        let fit = |share: u64, asked: usize| {
            asked
                .min(usize::try_from(share).unwrap_or(usize::MAX))
                .max(1)
        };
        ConnectionCaps {
            grpc: fit(usable * 3 / 4, grpc),
            admin: fit(usable / 8, admin),
        }
    }
}

/// The soft limit on open file descriptors of this process, if it can be read.
pub fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_fd_limit(&limits)
}

fn parse_fd_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    soft.parse().ok() // "unlimited" → None
}

/// A TCP listener that hands out guarded connections.
pub struct Acceptor {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    timeouts: Timeouts,
    name: &'static str,
    at_cap: AtomicBool,
}

impl Acceptor {
    /// `name` ("gRPC", "admin") is used in log lines.
    pub fn new(listener: TcpListener, cap: usize, timeouts: Timeouts, name: &'static str) -> Self {
        Acceptor {
            listener,
            slots: Arc::new(Semaphore::new(cap.max(1))),
            timeouts,
            name,
            at_cap: AtomicBool::new(false),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits for a free connection slot, then for a connection. Accept errors (EMFILE, ENFILE,
    /// ECONNABORTED…) are logged and retried after a growing pause instead of at once, so running
    /// out of descriptors cannot make the loop spin.
    pub async fn accept(&self) -> (GuardedStream<TcpStream>, SocketAddr) {
        let permit = self.slot().await;
        let mut backoff = MIN_ACCEPT_BACKOFF;
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(listener = self.name, error = %e, "cannot set TCP_NODELAY");
                    }
                    return (GuardedStream::new(stream, self.timeouts, permit), peer);
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

    /// The accepted connections as an endless stream, for tonic's `serve_with_incoming_shutdown`
    /// (accept errors are handled inside [`Acceptor::accept`]). Dropping the stream closes the
    /// listening socket.
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = Result<GuardedStream<TcpStream>, io::Error>> + Send {
        futures_util::stream::unfold(self, |acceptor| async move {
            let (stream, _) = acceptor.accept().await;
            Some((Ok(stream), acceptor))
        })
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
