//! A TCP proxy for fault tests: between the server and a real redis-server, it delays every byte
//! by a fixed time each way (a Redis that far away), or cuts each connection after so many
//! replies, or loses a share of the replies and cuts their connection (a flaky network: the
//! commands reached Redis, their replies did not); on a runtime thread of its own so it keeps time
//! whatever the test's runtime is doing. Dropped, it stops accepting.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::free_port;

/// A proxy on 127.0.0.1 in front of `upstream`.
pub struct LatencyProxy {
    pub port: u16,
    _listening: Listening,
    cuts: Arc<AtomicU64>,
}

/// A listener on 127.0.0.1 on a runtime thread of its own (so it keeps time whatever the test's
/// runtime is doing), each client handed to a task of `serve`'s; dropped, it stops accepting.
/// What the proxies of the harness share.
pub struct Listening {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Listening {
    /// Listens on a free port; returns once it accepts.
    pub fn start<F, R>(serve: F) -> Listening
    where
        F: Fn(TcpStream) -> R + Send + 'static,
        R: Future<Output = ()> + Send + 'static,
    {
        let port = free_port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
                ready.send(()).unwrap();
                let accepting = async {
                    while let Ok((client, _)) = listener.accept().await {
                        tokio::spawn(serve(client));
                    }
                };
                tokio::select! {
                    _ = accepting => {}
                    _ = stopped => {}
                }
            });
        });
        listening.recv().expect("the proxy listens");
        Listening {
            port,
            stop: Some(stop),
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What the proxy does to the traffic.
#[derive(Clone, Copy)]
struct Fault {
    /// Added to each direction.
    delay: Duration,
    /// Cut the connection after this many reads from upstream (replies), if set.
    cut_after: Option<u64>,
    /// Lose this many of every 10,000 reads from upstream (replies), cutting their connection.
    lose_per_10k: u32,
}

impl LatencyProxy {
    /// Adds `delay` to each direction.
    pub fn start(upstream: SocketAddr, delay: Duration) -> LatencyProxy {
        Self::run(
            upstream,
            Fault {
                delay,
                cut_after: None,
                lose_per_10k: 0,
            },
        )
    }

    /// Cuts each connection (both ways, at once) after `replies` to 2 × `replies` reads from
    /// upstream, drawn per connection: a client spreading its calls over a pool round robin
    /// would otherwise have every connection cut at the same moment.
    pub fn cutting(upstream: SocketAddr, replies: u64) -> LatencyProxy {
        Self::run(
            upstream,
            Fault {
                delay: Duration::ZERO,
                cut_after: Some(replies),
                lose_per_10k: 0,
            },
        )
    }

    /// Loses `per_10k` of every 10,000 reads from upstream (replies; pseudo-random, seeded): each
    /// lost one is not forwarded and its connection is cut both ways, so the commands it answered
    /// ran on Redis but their caller never hears so.
    pub fn losing(upstream: SocketAddr, per_10k: u32) -> LatencyProxy {
        Self::run(
            upstream,
            Fault {
                delay: Duration::ZERO,
                cut_after: None,
                lose_per_10k: per_10k,
            },
        )
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    fn run(upstream: SocketAddr, fault: Fault) -> LatencyProxy {
        let cuts = Arc::new(AtomicU64::new(0));
        let counted = cuts.clone();
        let listening =
            Listening::start(move |client| relay(client, upstream, fault, counted.clone()));
        LatencyProxy {
            port: listening.port,
            _listening: listening,
            cuts,
        }
    }

    /// `host:port` to give as `REDIS_URL`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// A connection's read and write halves.
pub type Halves = (OwnedReadHalf, OwnedWriteHalf);

/// The halves of `client` and of a new connection to `upstream` (Nagle off on both, as Redis and
/// its clients run); `None` when `upstream` cannot be reached.
pub async fn connect_halves(client: TcpStream, upstream: SocketAddr) -> Option<(Halves, Halves)> {
    let server = TcpStream::connect(upstream).await.ok()?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    Some((client.into_split(), server.into_split()))
}

async fn relay(client: TcpStream, upstream: SocketAddr, fault: Fault, cuts: Arc<AtomicU64>) {
    let Some(((client_read, client_write), (server_read, server_write))) =
        connect_halves(client, upstream).await
    else {
        return;
    };
    // Either direction ending ends the relay: every half is dropped, so a cut connection is cut
    // both ways at once (and requests sent after it are lost, as on a real network).
    let seed = SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed) | 1;
    let replies = Cut {
        after: fault.cut_after.map(|n| n + (seed >> 32) % n.max(1)),
        lose_per_10k: fault.lose_per_10k,
        seed,
    };
    let cut = tokio::select! {
        _ = pump(client_read, server_write, fault.delay, Cut::NEVER) => false,
        cut = pump(server_read, client_write, fault.delay, replies) => cut,
    };
    if cut {
        cuts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Seeds of the connections' loss draws (each connection its own).
static SEED: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);

/// When one direction is cut: after so many chunks, or at a lost chunk (drawn per chunk).
#[derive(Clone, Copy)]
struct Cut {
    after: Option<u64>,
    lose_per_10k: u32,
    seed: u64,
}

impl Cut {
    const NEVER: Cut = Cut {
        after: None,
        lose_per_10k: 0,
        seed: 1,
    };
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (chunks keep their order
/// and are not held up by each other's delays). With `cut.after`, stops after that many chunks
/// and returns true; with `cut.lose_per_10k`, drops that share of the chunks unsent and stops
/// there, returning true.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration, cut: Cut) -> bool {
    let cut_after = cut.after;
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((read_at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(read_at + delay).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        if cut_after.is_none() && cut.lose_per_10k == 0 {
            let _ = to.shutdown().await;
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut chunks = 0u64;
        let mut draw = cut.seed;
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    if cut.lose_per_10k > 0 {
                        // xorshift64
                        draw ^= draw << 13;
                        draw ^= draw >> 7;
                        draw ^= draw << 17;
                        if draw % 10_000 < u64::from(cut.lose_per_10k) {
                            return true;
                        }
                    }
                    if tx
                        .send((tokio::time::Instant::now(), buf[..n].to_vec()))
                        .is_err()
                    {
                        return false;
                    }
                    chunks += 1;
                    if cut_after.is_some_and(|after| chunks >= after) {
                        return true;
                    }
                }
            }
        }
    };
    let (cut, ()) = tokio::join!(reader, writer);
    cut
}
