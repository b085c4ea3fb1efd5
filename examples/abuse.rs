//! Hostile clients, for trying a running server from outside: stalled
//! streams (or calls that never send their request), silent connections, descriptor floods. Bounded in count and time; loopback only.
//!
//! ```sh
//! cargo run --release --example abuse -- stalled-streams --addr 127.0.0.1:8081 --streams 800
//! cargo run --release --example abuse -- stalled-streams --addr 127.0.0.1:8081 --connections 20 \
//!     --streams 1024 --declared 100 --send 0 --hold 12   # calls that send their headers only
//! cargo run --release --example abuse -- silent --addr 127.0.0.1:8081 --count 1300 --hold 60
//! cargo run --release --example abuse -- descriptor-flood --addr 127.0.0.1:8081 --senders 16
//! cargo run --release --example abuse -- silent-uds --path /tmp/rls.sock --count 1100 --hold 30
//! cargo run --release --example abuse -- tls-stall --addr 127.0.0.1:8081 --count 500 --source 127.0.0.2
//! ```
//! Watch the server's RSS and CPU meanwhile (`ps -o rss,pcpu -p PID`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use ratelimit_server::clock::monotonic;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tonic::codegen::http;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    attack: Attack,
}

#[derive(Subcommand)]
enum Attack {
    /// HTTP/2 connections (`--connections`) each opening many calls to `--path`, each announcing
    /// a large message and sending all but its last bytes (at most --send bytes each; `--send 0`:
    /// the 5-byte prefix alone), then holding them open.
    StalledStreams {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 1)]
        connections: usize,
        #[arg(long, default_value = PATH)]
        path: String,
        #[arg(long, default_value_t = 800)]
        streams: usize,
        #[arg(long, default_value_t = 4 << 20)]
        declared: u32,
        #[arg(long, default_value_t = 4 << 20)]
        send: usize,
        #[arg(long, default_value_t = 40)]
        hold: u64,
    },
    /// Many connections that send nothing (or only the HTTP/2 preface), held open; reports how many
    /// the server closed.
    Silent {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 1300)]
        count: usize,
        #[arg(long)]
        preface: bool,
        #[arg(long, default_value_t = 60)]
        hold: u64,
    },
    /// Like `silent`, on a Unix socket (`--grpc-uds`).
    SilentUds {
        #[arg(long)]
        path: std::path::PathBuf,
        #[arg(long, default_value_t = 1100)]
        count: usize,
        #[arg(long)]
        preface: bool,
        #[arg(long, default_value_t = 60)]
        hold: u64,
    },
    /// Many TCP connections from one source address (`--source 127.0.0.2`: any 127/8 address is
    /// loopback) that start a TLS handshake and stall: nothing sent, or with `--partial` the
    /// first bytes of a ClientHello; held open. Reports how many the server closed, and when.
    TlsStall {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 500)]
        count: usize,
        #[arg(long, default_value = "127.0.0.1")]
        source: std::net::IpAddr,
        #[arg(long)]
        partial: bool,
        #[arg(long, default_value_t = 60)]
        hold: u64,
    },
    /// Concurrent calls of 2 million empty descriptors (a 4 MB message) each.
    DescriptorFlood {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 16)]
        senders: usize,
        #[arg(long, default_value_t = 10)]
        rounds: usize,
    },
}

/// What `stalled-streams` sends.
struct Stall<'a> {
    path: &'a str,
    streams: usize,
    declared: u32,
    send: usize,
}

async fn stalled_streams(addr: SocketAddr, connections: usize, stall: Stall<'_>, hold: u64) {
    let mut held = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..connections {
        stalled_connection(addr, &stall, &mut held, &mut responses).await;
    }
    // What each call was answered by now: refused at once, or still held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for response in responses {
        let key = match futures_util::FutureExt::now_or_never(response) {
            Some(Ok(r)) => format!(
                "grpc-status {}",
                r.headers()
                    .get("grpc-status")
                    .map_or("-".into(), |v| v.to_str().unwrap_or("?").to_string())
            ),
            Some(Err(e)) => format!("reset: {e}"),
            None => "no answer yet (stream held)".into(),
        };
        *answered.entry(key).or_default() += 1;
    }
    println!(
        "{} streams opened on {connections} connection(s), 0.5 s later: {answered:?}; holding for {hold} s",
        connections * stall.streams
    );
    tokio::time::sleep(Duration::from_secs(hold)).await;
}

/// One connection of `stalled-streams`: its calls' sending halves go to `held`, their answers
/// to come to `responses`.
async fn stalled_connection(
    addr: SocketAddr,
    stall: &Stall<'_>,
    held: &mut Vec<h2::SendStream<Bytes>>,
    responses: &mut Vec<h2::client::ResponseFuture>,
) {
    let Stall {
        path,
        streams,
        declared,
        send,
    } = *stall;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let chunk = Bytes::from(vec![0x0au8; 16 * 1024]);
    for _ in 0..streams {
        let request = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
        client = client.ready().await.expect("ready");
        let (response, mut body) = client.send_request(request, false).expect("send");
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&declared.to_be_bytes());
        let _ = body.send_data(Bytes::from(prefix), false);
        let mut left = send.min(declared as usize).saturating_sub(1);
        while left > 0 {
            let n = left.min(chunk.len());
            if body.send_data(chunk.slice(..n), false).is_err() {
                break;
            }
            left -= n;
        }
        held.push(body);
        responses.push(response);
    }
}

async fn silent(addr: SocketAddr, count: usize, preface: bool, hold: u64) {
    let mut connections = Vec::new();
    for _ in 0..count {
        match TcpStream::connect(addr).await {
            Ok(mut c) => {
                if preface {
                    let _ = c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
                }
                connections.push(c);
            }
            Err(e) => {
                println!(
                    "connect failed after {} connections: {e}",
                    connections.len()
                );
                break;
            }
        }
    }
    hold_open(connections, hold).await;
}

async fn silent_uds(path: std::path::PathBuf, count: usize, preface: bool, hold: u64) {
    let mut connections = Vec::new();
    for _ in 0..count {
        match tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(&path)).await {
            Ok(Ok(mut c)) => {
                if preface {
                    let _ = c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
                }
                connections.push(c);
            }
            Ok(Err(e)) => {
                println!(
                    "connect failed after {} connections: {e}",
                    connections.len()
                );
                break;
            }
            Err(_) => {
                println!("connect timed out after {} connections", connections.len());
                break;
            }
        }
    }
    hold_open(connections, hold).await;
}

/// The first 16 bytes of a TLS 1.2+ ClientHello record announcing 512 bytes: a handshake begun
/// and never finished.
const PARTIAL_CLIENT_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0, 0, 0, 0, 0,
];

async fn tls_stall(
    addr: SocketAddr,
    count: usize,
    source: std::net::IpAddr,
    partial: bool,
    hold: u64,
) {
    let mut connections = Vec::new();
    for _ in 0..count {
        let socket = match source {
            std::net::IpAddr::V4(_) => TcpSocket::new_v4(),
            std::net::IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .expect("socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .expect("bind the source address");
        match socket.connect(addr).await {
            Ok(mut c) => {
                if partial {
                    let _ = c.write_all(PARTIAL_CLIENT_HELLO).await;
                }
                connections.push(c);
            }
            Err(e) => {
                println!(
                    "connect failed after {} connections: {e}",
                    connections.len()
                );
                break;
            }
        }
    }
    hold_open(connections, hold).await;
}

/// Holds `connections` open for `hold` seconds, reading what the server sends, and reports how
/// many it closed and when.
async fn hold_open<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    connections: Vec<S>,
    hold: u64,
) {
    let opened = connections.len();
    println!("{opened} connections opened; holding them for {hold} s");
    let started = monotonic();
    let tasks: Vec<_> = connections
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                loop {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return Some(started.elapsed()),
                        Ok(_) => {}
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let mut closed = Vec::new();
    for t in tasks {
        if t.is_finished() {
            if let Ok(Some(at)) = t.await {
                closed.push(at);
            }
        } else {
            t.abort();
        }
    }
    closed.sort();
    println!(
        "{opened} connections opened; {} closed by the server within {hold} s (first after {:?}, last after {:?})",
        closed.len(),
        closed.first(),
        closed.last()
    );
}

async fn descriptor_flood(addr: SocketAddr, senders: usize, rounds: usize) {
    let body = Bytes::from([0x12u8, 0x00].repeat(2_000_000));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let tasks: Vec<_> = (0..senders)
        .map(|_| {
            let (channel, body) = (channel.clone(), body.clone());
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..rounds {
                    let mut grpc = tonic::client::Grpc::new(channel.clone())
                        .max_encoding_message_size(usize::MAX);
                    grpc.ready().await.expect("ready");
                    let r = grpc
                        .unary(
                            tonic::Request::new(body.clone()),
                            http::uri::PathAndQuery::from_static(PATH),
                            RawCodec,
                        )
                        .await;
                    codes.push(r.err().map_or(tonic::Code::Ok, |s| s.code()));
                }
                codes
            })
        })
        .collect();
    let started = monotonic();
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        for c in t.await.expect("sender") {
            *codes.entry(format!("{c:?}")).or_default() += 1;
        }
    }
    println!(
        "{} calls of 2,000,000 empty descriptors in {:?}: {codes:?}",
        senders * rounds,
        started.elapsed()
    );
}

#[path = "load/codec.rs"]
mod codec;
use codec::RawCodec;

#[tokio::main]
async fn main() {
    match Args::parse().attack {
        Attack::StalledStreams {
            addr,
            connections,
            path,
            streams,
            declared,
            send,
            hold,
        } => {
            let stall = Stall {
                path: &path,
                streams,
                declared,
                send,
            };
            stalled_streams(addr, connections, stall, hold).await
        }
        Attack::Silent {
            addr,
            count,
            preface,
            hold,
        } => silent(addr, count, preface, hold).await,
        Attack::SilentUds {
            path,
            count,
            preface,
            hold,
        } => silent_uds(path, count, preface, hold).await,
        Attack::TlsStall {
            addr,
            count,
            source,
            partial,
            hold,
        } => tls_stall(addr, count, source, partial, hold).await,
        Attack::DescriptorFlood {
            addr,
            senders,
            rounds,
        } => descriptor_flood(addr, senders, rounds).await,
    }
}
