//! A TCP proxy whose faults a test changes while the server runs: a delay each way (Redis that far
//! away, then near), and Redis's `+PONG` replies cut in the middle (half the reply sent, then the
//! connection closed both ways: "Unexpected end of input"). On a runtime thread of its own, so it
//! keeps time whatever the test's runtime is doing; dropped, it stops accepting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::proxy::{Listening, connect_halves};

/// The faults, shared with the relays.
#[derive(Default)]
struct Faults {
    /// Added to each direction, in µs.
    delay_us: AtomicU64,
    /// Cut every reply that starts with `+PONG`.
    cut_pongs: AtomicBool,
    /// Replies cut so far.
    cuts: AtomicU64,
}

/// A proxy on 127.0.0.1 in front of `upstream`, with faults set at any time.
pub struct FaultProxy {
    port: u16,
    _listening: Listening,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// A proxy that passes everything as it comes.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let faults = Arc::new(Faults::default());
        let shared = faults.clone();
        let listening = Listening::start(move |client| relay(client, upstream, shared.clone()));
        FaultProxy {
            port: listening.port,
            _listening: listening,
            faults,
        }
    }

    /// Delays each direction by `delay` from now on (chunks already read keep theirs).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.faults.delay_us.store(us, Ordering::Relaxed);
    }

    /// Cuts (or stops cutting) every `+PONG` reply in the middle.
    pub fn cut_pongs(&self, cut: bool) {
        self.faults.cut_pongs.store(cut, Ordering::Relaxed);
    }

    /// Replies cut so far.
    pub fn cuts(&self) -> u64 {
        self.faults.cuts.load(Ordering::Relaxed)
    }

    /// `host:port` to give as `REDIS_URL`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, faults: Arc<Faults>) {
    let Some(((client_read, client_write), (server_read, server_write))) =
        connect_halves(client, upstream).await
    else {
        return;
    };
    // Either direction ending ends the relay: every half is dropped, so a cut is both ways.
    tokio::select! {
        () = pump(client_read, server_write, &faults, false) => {}
        () = pump(server_read, client_write, &faults, true) => {}
    }
}

/// Copies `from` to `to`, each chunk written the delay after it was read, in order; replies
/// (`replies`) starting with `+PONG` are cut while `cut_pongs` is set.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, faults: &Faults, replies: bool) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>, bool)>();
    let writer = async move {
        while let Some((due, bytes, last)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() || last {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let delay = Duration::from_micros(faults.delay_us.load(Ordering::Relaxed));
            let due = tokio::time::Instant::now() + delay;
            let cut = replies
                && faults.cut_pongs.load(Ordering::Relaxed)
                && buf[..n].starts_with(b"+PONG");
            if cut {
                faults.cuts.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send((due, buf[..n / 2].to_vec(), true));
                return;
            }
            if tx.send((due, buf[..n].to_vec(), false)).is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}
