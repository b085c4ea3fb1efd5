//! A TCP proxy for fault tests: between the server and a real redis-server, it delays every byte
//! by a fixed time each way (a Redis that far away), on a runtime thread of its own so it keeps
//! time whatever the test's runtime is doing. Dropped, it stops accepting.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::free_port;

/// A proxy on 127.0.0.1 in front of `upstream`, adding `delay` to each direction.
pub struct LatencyProxy {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl LatencyProxy {
    pub fn start(upstream: SocketAddr, delay: Duration) -> LatencyProxy {
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
                        tokio::spawn(relay(client, upstream, delay));
                    }
                };
                tokio::select! {
                    _ = accepting => {}
                    _ = stopped => {}
                }
            });
        });
        listening.recv().expect("the proxy listens");
        LatencyProxy {
            port,
            stop: Some(stop),
        }
    }

    /// `host:port` to give as `REDIS_URL`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, delay: Duration) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, delay),
        pump(server_read, client_write, delay)
    );
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (chunks keep their order
/// and are not held up by each other's delays).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((read_at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(read_at + delay).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((tokio::time::Instant::now(), buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}
