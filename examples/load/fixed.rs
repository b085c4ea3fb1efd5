//! `--drive ADDR --calls N`: exactly N calls to a server that is already running (e.g. under
//! `valgrind --tool=callgrind`), spread over the shape's connections and calls in flight, with
//! the bare HTTP/2 client; prints how many were answered. A fixed load makes instruction counts
//! per call comparable between builds: (instructions with N calls − with 0) / N.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::SeedableRng;
use tonic::codegen::http;

use super::{PATH, Shape, Traffic, h2_client};

/// Sends `calls` calls to `addr` in `shape`; returns (answered OK, failed).
pub async fn drive(
    addr: SocketAddr,
    traffic: Arc<Traffic>,
    shape: Shape,
    calls: u64,
) -> (u64, u64) {
    let uri: http::Uri = format!("http://{addr}{PATH}").parse().expect("uri");
    let mut senders = Vec::new();
    for _ in 0..shape.connections.min(shape.inflight).max(1) {
        senders.push(h2_client::connect(addr).await);
    }
    let left = Arc::new(AtomicU64::new(calls));
    let tasks: Vec<_> = (0..shape.inflight)
        .map(|t| {
            let send = senders[t % senders.len()].clone();
            let (traffic, left, uri) = (traffic.clone(), left.clone(), uri.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let (mut ok, mut failed) = (0u64, 0u64);
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    match h2_client::call(send.clone(), &uri, traffic.pick_framed(&mut rng)).await {
                        Ok(()) => ok += 1,
                        Err(()) => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for t in tasks {
        let (o, f) = t.await.expect("worker");
        ok += o;
        failed += f;
    }
    (ok, failed)
}
