//! `GRPC_UDS`: gRPC also served on a Unix socket (Envoy can use it as a pipe address).

mod common;

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
