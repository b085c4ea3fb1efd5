//! `--client h2`: the load as a bare HTTP/2 client sends it (the h2 crate, pre-framed gRPC
//! messages, no tonic, no tower), so the client takes as little CPU from the servers it measures
//! as a client can on a shared machine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use ratelimit_server::clock::monotonic;
use tonic::codegen::http;

use super::{Outcome, PATH, Shape, Traffic, cpu};

/// A gRPC message frame: not compressed, its length, the message.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

pub async fn connect(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    for _ in 0..100 {
        if let Ok(tcp) = tokio::net::TcpStream::connect(addr).await {
            let _ = tcp.set_nodelay(true);
            let (send, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
            tokio::spawn(connection);
            return send;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot connect to {addr}");
}

/// One call: Ok if the answer's grpc-status is 0.
pub async fn call(
    send: h2::client::SendRequest<Bytes>,
    uri: &http::Uri,
    body: Bytes,
) -> Result<(), ()> {
    let mut send = send.ready().await.map_err(drop)?;
    let request = http::Request::post(uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(drop)?;
    let (response, mut stream) = send.send_request(request, false).map_err(drop)?;
    stream.send_data(body, true).map_err(drop)?;
    let response = response.await.map_err(drop)?;
    let headers_status = response.headers().get("grpc-status").cloned();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(drop)?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let status = match headers_status {
        Some(s) => Some(s),
        None => body
            .trailers()
            .await
            .map_err(drop)?
            .and_then(|t| t.get("grpc-status").cloned()),
    };
    match status {
        Some(s) if s == "0" => Ok(()),
        _ => Err(()),
    }
}

pub async fn drive(
    addrs: &[SocketAddr],
    traffic: Arc<Traffic>,
    shape: Shape,
    duration: Duration,
    watched: &cpu::Watched,
) -> Outcome {
    let Shape {
        connections,
        inflight,
    } = shape;
    let mut senders = Vec::new();
    for c in 0..connections.min(inflight).max(1) {
        let addr = addrs[c % addrs.len()];
        let uri: http::Uri = format!("http://{addr}{PATH}").parse().expect("uri");
        senders.push((connect(addr).await, uri));
    }
    let warmup_end = monotonic() + Duration::from_secs(1);
    let end = warmup_end + duration;
    let tasks: Vec<_> = (0..inflight)
        .map(|t| {
            let (send, uri) = senders[t % senders.len()].clone();
            let traffic = traffic.clone();
            tokio::spawn(async move {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let mut hist =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
                let (mut count, mut errors, mut answered) = (0u64, 0u64, 0u64);
                loop {
                    let body = traffic.pick_framed(&mut rng);
                    let started = monotonic();
                    let result = call(send.clone(), &uri, body).await;
                    let now = monotonic();
                    answered += u64::from(result.is_ok());
                    if now >= end {
                        break;
                    }
                    if now >= warmup_end {
                        match result {
                            Ok(()) => {
                                count += 1;
                                let _ = hist.record((now - started).as_nanos() as u64);
                            }
                            Err(()) => errors += 1,
                        }
                    }
                }
                (count, errors, answered, hist)
            })
        })
        .collect();
    let window = watched.window(warmup_end, end);
    Outcome::of_workers(tasks, duration, window).await
}
