//! `GRPC_UDS`: gRPC also served on a Unix socket (Envoy can use it as a pipe address).

use crate::common;

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use common::{Code, code, request, start_with};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use tonic::codegen::Service;
use tonic::transport::{Endpoint, Uri};

/// Connects every channel to one Unix socket.
#[derive(Clone)]
struct Uds(PathBuf);

impl Service<Uri> for Uds {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(TokioIo::new)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_calls_over_a_unix_socket() {
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("rls.sock");
    let rules =
        "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let socket = path.clone();
    let mut s = start_with(&[("u.yaml", rules)], move |settings| {
        settings.grpc_uds = Some(socket);
    })
    .await;
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(Uds(path))
        .await
        .expect("connects over the socket");
    let mut uds = RateLimitServiceClient::new(channel);
    let r = uds
        .should_rate_limit(request("u", &[&[("k", "x")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (code(r.overall_code), r.statuses[0].limit_remaining),
        (Code::Ok, 1)
    );
    // Same engine as the TCP listener: one counter.
    assert_eq!(s.hit("u", &[("k", "x")]).await, (Code::Ok, 0));
}

/// Whether the server closed `stream` within `wait` (it reads what the server sends, its
/// SETTINGS frame, until the end).
async fn closed_within(stream: &mut tokio::net::UnixStream, wait: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
    tokio::time::timeout(wait, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The real binary with 256 file descriptors and `--grpc-uds`, flooded on the Unix socket with
/// more connections than it has descriptors (as many as the kernel's backlog takes, up to 300),
/// saying nothing or only completing the HTTP/2 handshake: the socket has its own connection cap
/// (72 here), so the server keeps its descriptors, does not spin, answers TCP calls on a new
/// connection and `/healthcheck`, and closes every silent connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_flood_neither_spins_nor_starves_tcp_and_silent_ones_are_closed() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let rules = "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    std::fs::write(dir.path().join("u.yaml"), rules).unwrap();
    let socket = dir.path().join("rls.sock");
    let (grpc, http) = (common::free_port(), common::free_port());
    let Some(child) = common::process::under_prlimit("--nofile=256:256", |c| {
        c.args(["serve", "--config"])
            .arg(dir.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .arg("--grpc-uds")
            .arg(&socket)
            .env("HANDSHAKE_TIMEOUT", "2s")
            .env("IDLE_TIMEOUT", "3s")
            .env("LOG_LEVEL", "error");
    }) else {
        return;
    };
    let health = format!("http://127.0.0.1:{http}/healthcheck");
    common::process::wait_healthy(&health).await;
    // 20 that complete the HTTP/2 handshake and then stay idle, 130 that send nothing.
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut c = tokio::net::UnixStream::connect(&socket).await.unwrap();
        c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        idle.push(c);
    }
    let mut silent = Vec::new();
    for _ in 0..280 {
        // Past the cap and the listen backlog, connecting fails: the server has not accepted.
        match tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::UnixStream::connect(&socket),
        )
        .await
        {
            Ok(Ok(c)) => silent.push(c),
            _ => break,
        }
    }
    assert!(silent.len() >= 130, "only {} connected", silent.len());
    let before = common::process::cpu_ticks(child.0.id());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let used = common::process::cpu_ticks(child.0.id()) - before;
    // 1.5 s is 150 ticks of one core; a spinning accept loop used all of them (and more).
    assert!(
        used < 75,
        "the server burned {used} ticks in 150 while flooded"
    );
    let answer = reqwest::get(&health)
        .await
        .expect("health answers during the flood");
    assert_eq!(answer.status(), 200);
    let mut tcp = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("a new TCP connection is accepted during the flood");
    let r = tcp
        .should_rate_limit(request("u", &[&[("k", "tcp")]]))
        .await
        .expect("a TCP call is answered during the flood")
        .into_inner();
    assert_eq!(code(r.overall_code), Code::Ok);
    // Every one of them is closed: the idle ones by the idle timeout, the silent ones by the
    // handshake timeout (those in the backlog once they are accepted).
    for c in idle.iter_mut().chain(silent.iter_mut()) {
        assert!(
            closed_within(c, Duration::from_secs(30)).await,
            "a silent connection was kept open"
        );
    }
    // And the socket serves again.
    let path = socket.clone();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(Uds(path))
        .await
        .expect("connects over the socket after the flood");
    let r = RateLimitServiceClient::new(channel)
        .should_rate_limit(request("u", &[&[("k", "uds")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.overall_code), Code::Ok);
}
