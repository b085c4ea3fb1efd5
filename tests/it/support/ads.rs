//! An xDS management server in the test, as Envoy Gateway runs one for its rate-limit service:
//! ADS only (envoy-types' generated tonic server), State of the World, `RateLimitConfig`
//! resources, over loopback in plaintext or mTLS (TLS 1.3 only, client certificates required).
//! A snapshot set is pushed to every open stream (and sent on a stream's first request unless the
//! client already holds its version); every DiscoveryRequest received is recorded in order with
//! its stream's number; the server can be stopped (its streams end UNAVAILABLE, its port closes)
//! and started again on the same port.
#![allow(dead_code, reason = "each test uses a part")]

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use super::certs::Leaf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status, Streaming};

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// What the server hands out: a version and its resources.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub version: String,
    pub resources: Vec<Any>,
}

/// One request as received: the stream's number (from 1, in order of opening) and the request.
#[derive(Debug, Clone)]
pub struct Received {
    pub stream: u64,
    pub request: DiscoveryRequest,
}

impl Received {
    pub fn is_nack(&self) -> bool {
        self.request.error_detail.is_some()
    }

    /// One line for the test's log.
    pub fn line(&self) -> String {
        let r = &self.request;
        let mut line = format!(
            "stream {} <- DiscoveryRequest node={:?} version_info={:?} response_nonce={:?}",
            self.stream,
            r.node.as_ref().map(|n| n.id.as_str()).unwrap_or(""),
            r.version_info,
            r.response_nonce
        );
        if let Some(d) = &r.error_detail {
            line.push_str(&format!(" error_detail={:?}", d.message));
        }
        line
    }
}

struct Shared {
    snapshot: watch::Sender<Option<Snapshot>>,
    /// Bumped to end every open stream.
    kill: watch::Sender<u64>,
    received: Mutex<Vec<Received>>,
    /// Every response sent: (stream, version, nonce).
    sent: Mutex<Vec<(u64, String, String)>>,
    /// Requests received and responses sent, one line each, in order.
    events: Mutex<Vec<String>>,
    /// Each stream's request headers (gRPC metadata), by stream number.
    headers: Mutex<Vec<(u64, tonic::metadata::MetadataMap)>>,
    streams: AtomicU64,
    nonces: AtomicU64,
}

#[derive(Clone)]
struct Service(Arc<Shared>);

type Out = ReceiverStream<Result<DiscoveryResponse, Status>>;
type DeltaOut = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

impl Shared {
    fn response(&self, stream: u64, snapshot: &Snapshot) -> DiscoveryResponse {
        let nonce = self.nonces.fetch_add(1, Ordering::SeqCst) + 1;
        let nonce = nonce.to_string();
        self.sent
            .lock()
            .unwrap()
            .push((stream, snapshot.version.clone(), nonce.clone()));
        self.events.lock().unwrap().push(format!(
            "stream {stream} -> DiscoveryResponse version_info={:?} nonce={nonce:?} resources={}",
            snapshot.version,
            snapshot.resources.len()
        ));
        DiscoveryResponse {
            version_info: snapshot.version.clone(),
            resources: snapshot.resources.clone(),
            type_url: TYPE_URL.into(),
            nonce,
            ..Default::default()
        }
    }
}

async fn serve_stream(
    shared: Arc<Shared>,
    stream: u64,
    mut inbound: Streaming<DiscoveryRequest>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut snapshot = shared.snapshot.subscribe();
    let mut kill = shared.kill.subscribe();
    kill.borrow_and_update();
    let mut subscribed = false;
    loop {
        tokio::select! {
            message = inbound.message() => {
                let Ok(Some(request)) = message else { return };
                let first = !subscribed;
                subscribed = true;
                let held = request.version_info.clone();
                let received = Received { stream, request };
                shared.events.lock().unwrap().push(received.line());
                shared.received.lock().unwrap().push(received);
                if first {
                    let current = snapshot.borrow_and_update().clone();
                    if let Some(s) = current.filter(|s| s.version != held) {
                        let response = shared.response(stream, &s);
                        if out.send(Ok(response)).await.is_err() { return; }
                    }
                }
            }
            changed = snapshot.changed(), if subscribed => {
                if changed.is_err() { return; }
                let current = snapshot.borrow_and_update().clone();
                if let Some(s) = current {
                    let response = shared.response(stream, &s);
                    if out.send(Ok(response)).await.is_err() { return; }
                }
            }
            _ = kill.changed() => {
                let _ = out.send(Err(Status::unavailable("management server stopped"))).await;
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = Out;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Out>, Status> {
        let stream = self.0.streams.fetch_add(1, Ordering::SeqCst) + 1;
        self.0
            .headers
            .lock()
            .unwrap()
            .push((stream, request.metadata().clone()));
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(serve_stream(
            self.0.clone(),
            stream,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = DeltaOut;

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaOut>, Status> {
        Err(Status::unimplemented("State of the World only"))
    }
}

/// A TLS connection tonic can serve.
struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsConn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The management server.
pub struct Ads {
    shared: Arc<Shared>,
    pub port: u16,
    tls: Option<Arc<ServerConfig>>,
    running: Option<Running>,
}

/// Envoy Gateway's management server TLS: TLS 1.3 only, client certificates signed by `ca_pem`
/// required, `leaf` as the server's certificate.
pub fn tls13_requiring_client_certs(ca_pem: &str, leaf: &Leaf) -> Arc<ServerConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![leaf.cert_der()],
            PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A RateLimitConfig as a resource.
pub fn resource(config: &RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }
}

impl Ads {
    /// Starts on a free loopback port; with `tls`, every connection must complete that TLS.
    pub async fn start(tls: Option<Arc<ServerConfig>>) -> Ads {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            snapshot: watch::channel(None).0,
            kill: watch::channel(0).0,
            received: Mutex::new(Vec::new()),
            sent: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            headers: Mutex::new(Vec::new()),
            streams: AtomicU64::new(0),
            nonces: AtomicU64::new(0),
        });
        let mut ads = Ads {
            shared,
            port,
            tls,
            running: None,
        };
        ads.serve(listener);
        ads
    }

    pub fn url(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn serve(&mut self, listener: TcpListener) {
        let (stop, stopped) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder().add_service(
            AggregatedDiscoveryServiceServer::new(Service(self.shared.clone())),
        );
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = match self.tls.clone() {
            None => tokio::spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
            }),
            Some(config) => tokio::spawn(async move {
                let acceptor = TlsAcceptor::from(config);
                let incoming = futures_util::stream::unfold(
                    (listener, acceptor),
                    |(listener, acceptor)| async move {
                        loop {
                            let Ok((tcp, _)) = listener.accept().await else {
                                continue;
                            };
                            // A client that fails the handshake (no certificate, old TLS) is
                            // dropped; the next one is accepted.
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                return Some((
                                    Ok::<_, io::Error>(TlsConn(tls)),
                                    (listener, acceptor),
                                ));
                            }
                        }
                    },
                );
                let _ = router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
            }),
        };
        self.running = Some(Running { stop, task });
    }

    /// Ends every stream (UNAVAILABLE) and closes the port.
    pub async fn stop(&mut self) {
        self.shared.kill.send_modify(|k| *k += 1);
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(());
            let mut task = running.task;
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }

    /// Listens again on the same port, with the same snapshot.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        self.serve(listener);
    }

    /// Sets the snapshot: pushed to every subscribed stream.
    pub fn set(&self, version: &str, configs: &[RateLimitConfig]) {
        self.set_resources(version, configs.iter().map(resource).collect());
    }

    pub fn set_resources(&self, version: &str, resources: Vec<Any>) {
        self.shared.snapshot.send_replace(Some(Snapshot {
            version: version.into(),
            resources,
        }));
    }

    /// The value of header `name` on stream `stream`.
    pub fn header(&self, stream: u64, name: &str) -> Option<String> {
        let headers = self.shared.headers.lock().unwrap();
        let (_, map) = headers.iter().find(|(s, _)| *s == stream)?;
        map.get(name)?.to_str().ok().map(str::to_owned)
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// (stream, version, nonce) of every response sent.
    pub fn sent(&self) -> Vec<(u64, String, String)> {
        self.shared.sent.lock().unwrap().clone()
    }

    /// The exchange so far, one line per request or response, in order.
    pub fn log(&self) -> String {
        let mut out = self.shared.events.lock().unwrap().join("\n");
        out.push('\n');
        out
    }

    /// Waits until the requests received satisfy `done` (30 s at most); returns them.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let started = tokio::time::Instant::now();
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what}: not seen after 30 s; the exchange:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for the ACK of `version` (a request carrying it and a nonce, without error).
    pub async fn wait_ack(&self, version: &str) -> Received {
        let received = self
            .wait_for(&format!("ACK of {version}"), |r| {
                r.iter().any(|r| is_ack_of(r, version))
            })
            .await;
        received
            .into_iter()
            .find(|r| is_ack_of(r, version))
            .unwrap()
    }
}

fn is_ack_of(r: &Received, version: &str) -> bool {
    !r.is_nack() && r.request.version_info == version && !r.request.response_nonce.is_empty()
}

impl Drop for Ads {
    fn drop(&mut self) {
        self.shared.kill.send_modify(|k| *k += 1);
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(());
            running.task.abort();
        }
    }
}

/// `s` taking its rules from the management server at `url` as `node`, with short waits, so
/// reconnections happen within a test.
pub fn quick_xds(s: &mut ratelimit_server::settings::ServeSettings, url: &str, node: &str) {
    use ratelimit_server::settings::ConfigType;
    s.xds.config_type = ConfigType::GrpcXdsSotw;
    s.xds.xds_server_url = url.to_owned();
    s.xds.xds_node_id = node.into();
    s.xds.xds_server_connect_retry_interval = Duration::from_millis(20);
    s.xds.xds_client_backoff_initial_interval = Duration::from_millis(20);
    s.xds.xds_client_backoff_max_interval = Duration::from_millis(100);
}
