//! TLS and mTLS on the listeners, from outside: certificates are made in the test, a tonic client
//! talks gRPC over rustls; clients without a certificate, from another CA or with the wrong SAN are
//! refused; certificates rotated on disk are served to new connections while old ones keep
//! working; a broken rotation is refused, counted, and the old certificate keeps serving.

use crate::common;
use crate::support::certs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, Leaf, client_config};
use common::metrics::{labelled, scrape};
use common::wait::eventually;
use common::{Code, code, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use ratelimit_server::clock::ManualClock;
use ratelimit_server::clock::monotonic;
use ratelimit_server::server::{self, Server, StartError};
use ratelimit_server::settings::ServeSettings;
use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, ServerName};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

const RULES: &str = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
const CLIENT_SAN: &str = "ratelimit-client.example";

/// A server with TLS files in a temp dir.
struct Fixture {
    server: Server,
    _dir: TempDir,
    ca: Ca,
    cert: PathBuf,
    key: PathBuf,
}

impl Fixture {
    /// The directory the server's files are in.
    fn server_dir(&self) -> PathBuf {
        self._dir.path().to_owned()
    }
}

fn settings(dir: &Path) -> ServeSettings {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("tls.yaml"), RULES).unwrap();
    let mut s = ServeSettings::for_tests(rules);
    s.tls.tls_reload_interval = Duration::from_millis(50);
    s
}

async fn start(settings: &ServeSettings) -> Result<Server, StartError> {
    let clock = ManualClock::new(common::START);
    server::start(settings, Arc::new(clock)).await
}

/// A gRPC server with TLS; mTLS (client CA, and SAN `CLIENT_SAN`) when `mtls`.
async fn tls_server(mtls: bool, adjust: impl FnOnce(&mut ServeSettings)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.server("server-1").write(dir.path(), "server");
    let mut s = settings(dir.path());
    s.tls.grpc_server_use_tls = true;
    s.tls.grpc_server_tls_cert = Some(cert.clone());
    s.tls.grpc_server_tls_key = Some(key.clone());
    if mtls {
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, ca.cert_pem()).unwrap();
        s.tls.grpc_client_tls_cacert = Some(ca_file);
        s.tls.grpc_client_tls_san = Some(CLIENT_SAN.into());
    }
    adjust(&mut s);
    let server = start(&s).await.expect("server starts");
    Fixture {
        server,
        _dir: dir,
        ca,
        cert,
        key,
    }
}

/// A tonic channel over TLS to `addr` (the URI says http: the connector does the TLS).
async fn channel(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<Channel, String> {
    let connector = TlsConnector::from(config);
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// One ShouldRateLimit over a new TLS connection: Ok(code) or the error.
async fn call_once(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<Code, String> {
    let mut client = RateLimitServiceClient::new(channel(addr, config).await?);
    call(&mut client).await
}

async fn call(client: &mut RateLimitServiceClient<Channel>) -> Result<Code, String> {
    let response = client
        .should_rate_limit(request("tls", &[&[("k", "v")]]))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(code(response.into_inner().overall_code))
}

/// The certificate a new TLS connection to `addr` is served.
async fn served_cert(addr: SocketAddr, config: Arc<ClientConfig>) -> CertificateDer<'static> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(config).connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test]
async fn a_tls_client_gets_answers_and_a_plaintext_one_does_not() {
    let f = tls_server(false, |s| {
        s.transport.handshake_timeout = Duration::from_secs(1)
    })
    .await;
    let addr = f.server.grpc_addr;
    let config = client_config(&f.ca.cert_pem(), None, &[b"h2"]);
    assert_eq!(call_once(addr, config.clone()).await, Ok(Code::Ok));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(config).connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let plaintext = RateLimitServiceClient::connect(format!("http://{addr}")).await;
    match plaintext {
        Err(_) => {}
        Ok(mut client) => assert!(call(&mut client).await.is_err(), "plaintext answered"),
    }
    f.server.shutdown().await;
}

/// Plaintext on the TLS port (an Envoy cluster without its TLS transport socket): an HTTP/1.x
/// request is told so in plaintext, an HTTP/2 preface is closed, both are counted as `plaintext`
/// and never reach a handshake; a TLS client beside them is served.
#[tokio::test]
async fn plaintext_clients_on_the_tls_port_are_told_counted_and_closed() {
    let f = tls_server(false, |_| {}).await;
    let addr = f.server.grpc_addr;
    let told = |bytes: &'static [u8]| async move {
        common::answer_to(TcpStream::connect(addr).await.unwrap(), bytes).await
    };
    let answer = told(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer:?}"
    );
    assert!(
        answer.ends_with("It serves TLS and this request came in plaintext.\n"),
        "{answer:?}"
    );
    let answer = told(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await;
    assert_eq!(answer, "", "an HTTP/2 client is closed without an answer");
    let config = client_config(&f.ca.cert_pem(), None, &[b"h2"]);
    assert_eq!(call_once(addr, config).await, Ok(Code::Ok));
    let text = page(&f.server).await;
    let wrong = "ratelimit_connections_wrong_protocol_total";
    assert_eq!(
        labelled(&text, wrong, "listener=\"gRPC\",protocol=\"plaintext\""),
        2,
        "{text}"
    );
    assert_eq!(
        on_listener(&text, "ratelimit_tls_handshake_errors_total", "gRPC"),
        0,
        "{text}"
    );
    f.server.shutdown().await;
}

/// A client refused at the handshake (no certificate, where mTLS asks for one) is warned of with
/// rustls's reason, once a minute rather than once per connection; a connection closed before its
/// handshake (a TCP health probe) is counted but not warned of.
#[tokio::test]
async fn a_refused_handshake_is_warned_of_once_a_minute_with_its_reason_and_a_probe_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("tls.yaml"), RULES).unwrap();
    let ca = Ca::new("CA");
    let (cert, key) = ca.server("server-1").write(dir.path(), "server");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let arg = |path: &Path| path.to_str().unwrap().to_owned();
    let (cert, key, ca_file) = (arg(&cert), arg(&key), arg(&ca_file));
    let args = [
        "--grpc-server-use-tls",
        "true",
        "--grpc-server-tls-cert",
        &cert,
        "--grpc-server-tls-key",
        &key,
        "--grpc-client-tls-cacert",
        &ca_file,
    ];
    let mut served = common::process::Served::start(&rules, &args);
    served.wait_ready().await;
    let addr: SocketAddr = format!("127.0.0.1:{}", served.grpc).parse().unwrap();
    let without_certificate = client_config(&ca.cert_pem(), None, &[b"h2"]);
    for _ in 0..2 {
        assert!(call_once(addr, without_certificate.clone()).await.is_err());
    }
    drop(TcpStream::connect(addr).await.unwrap());
    served
        .wait_for_metric("ratelimit_tls_handshake_errors_total{listener=\"gRPC\"}", 3)
        .await;
    let log = served.log();
    let warned = served.lines_with("a client's TLS handshake was refused");
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("peer sent no certificates"),
        "{log}"
    );
}

#[tokio::test]
async fn mtls_refuses_no_certificate_another_ca_and_the_wrong_san() {
    let f = tls_server(true, |_| {}).await;
    let addr = f.server.grpc_addr;
    let trust = f.ca.cert_pem();
    let good = f.ca.client(&[CLIENT_SAN]);
    let config = |identity: Option<&Leaf>| client_config(&trust, identity, &[b"h2"]);
    assert_eq!(call_once(addr, config(Some(&good))).await, Ok(Code::Ok));

    let other_ca = Ca::new("another CA").client(&[CLIENT_SAN]);
    let wrong_san = f.ca.client(&["someone-else.example"]);
    for (who, identity) in [
        ("no certificate", None),
        ("another CA", Some(&other_ca)),
        ("wrong SAN", Some(&wrong_san)),
    ] {
        let result = call_once(addr, config(identity)).await;
        assert!(result.is_err(), "{who}: answered {result:?}");
    }
    let text = page(&f.server).await;
    assert!(
        on_listener(&text, "ratelimit_tls_handshake_errors_total", "gRPC") >= 3,
        "{text}"
    );
    // The good client still works after the refusals.
    assert_eq!(call_once(addr, config(Some(&good))).await, Ok(Code::Ok));
    f.server.shutdown().await;
}

#[tokio::test]
async fn a_rotated_certificate_goes_to_new_connections_while_old_ones_keep_working() {
    let f = tls_server(true, |_| {}).await;
    let addr = f.server.grpc_addr;
    let client_cert = f.ca.client(&[CLIENT_SAN]);
    let config = client_config(&f.ca.cert_pem(), Some(&client_cert), &[b"h2"]);
    let first = std::fs::read(&f.cert).unwrap();
    let mut old = RateLimitServiceClient::new(channel(addr, config.clone()).await.unwrap());
    assert_eq!(call(&mut old).await, Ok(Code::Ok));

    // Rotate as a person would: key first, then the certificate, each rewritten in place.
    let next = f.ca.server("server-2");
    std::fs::write(&f.key, &next.key_pem).unwrap();
    std::fs::write(&f.cert, &next.cert_pem).unwrap();
    let want = next.cert_der();
    eventually("the new certificate is served", || {
        let config = config.clone();
        let want = want.clone();
        async move { served_cert(addr, config).await == want }
    })
    .await;
    assert_ne!(first, std::fs::read(&f.cert).unwrap());
    assert_eq!(call_once(addr, config.clone()).await, Ok(Code::Ok));
    // The connection made before the rotation goes on.
    for _ in 0..3 {
        assert_eq!(call(&mut old).await, Ok(Code::Ok));
    }
    let text = page(&f.server).await;
    assert_eq!(
        on_listener(&text, "ratelimit_tls_reload_success_total", "gRPC"),
        1,
        "one reload, none of the half-written states: {text}"
    );
    assert_eq!(
        on_listener(&text, "ratelimit_tls_reload_errors_total", "gRPC"),
        0
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn a_broken_rotation_is_refused_counted_and_the_old_certificate_keeps_serving() {
    let f = tls_server(false, |_| {}).await;
    let addr = f.server.grpc_addr;
    let config = client_config(&f.ca.cert_pem(), None, &[b"h2"]);
    let original = served_cert(addr, config.clone()).await;
    std::fs::write(
        &f.cert,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let server = &f.server;
    eventually("the broken certificate is counted", || async {
        on_listener(
            &page(server).await,
            "ratelimit_tls_reload_errors_total",
            "gRPC",
        ) == 1
    })
    .await;
    // Refused once, not once per poll.
    polled_twice_more(server).await;
    let text = page(server).await;
    assert_eq!(
        on_listener(&text, "ratelimit_tls_reload_errors_total", "gRPC"),
        1
    );
    assert_eq!(served_cert(addr, config.clone()).await, original);
    assert_eq!(call_once(addr, config.clone()).await, Ok(Code::Ok));

    // A key that does not match the certificate is refused as well; a good pair is then taken.
    let other = f.ca.server("server-3");
    std::fs::write(&f.cert, &other.cert_pem).unwrap();
    eventually("the mismatched pair is counted", || async {
        on_listener(
            &page(server).await,
            "ratelimit_tls_reload_errors_total",
            "gRPC",
        ) == 2
    })
    .await;
    assert_eq!(served_cert(addr, config.clone()).await, original);
    std::fs::write(&f.key, &other.key_pem).unwrap();
    let want = other.cert_der();
    eventually("the repaired pair is served", || {
        let (config, want) = (config.clone(), want.clone());
        async move { served_cert(addr, config).await == want }
    })
    .await;
    f.server.shutdown().await;
}

#[tokio::test]
async fn the_handshake_timeout_covers_the_tls_handshake_and_the_first_request_bytes() {
    let f = tls_server(false, |s| {
        s.transport.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let addr = f.server.grpc_addr;
    // A peer that opens TCP and says nothing.
    let started = monotonic();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Bounded far below the 2 minute idle timeout, the other thing that would close it.
    let n = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut [0u8; 16]))
        .await
        .expect("closed by the server")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Not at once: a timer never fires early, so this holds however slow the machine is.
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A peer that completes the TLS handshake but sends no HTTP/2 preface.
    let config = client_config(&f.ca.cert_pem(), None, &[b"h2"]);
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = TlsConnector::from(config).connect(name, tcp).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(30), tls.read(&mut [0u8; 64])).await;
    assert!(
        closed.is_ok(),
        "still open after 30 s: only the 2 minute idle timeout would close it"
    );
    let _ = tls.shutdown().await;
    f.server.shutdown().await;
}

#[tokio::test]
async fn the_admin_listener_serves_https_with_its_own_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("admin CA");
    let (cert, key) = ca.server("admin").write(dir.path(), "admin");
    let mut s = settings(dir.path());
    s.tls.admin_tls_cert = Some(cert);
    s.tls.admin_tls_key = Some(key);
    let server = start(&s).await.unwrap();
    let config = client_config(&ca.cert_pem(), None, &[b"http/1.1"]);
    let tcp = TcpStream::connect(server.http_addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(config).connect(name, tcp).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get("/healthcheck")
        .header("host", "localhost")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // Plain HTTP on the admin port gets no answer.
    let plain = reqwest::get(format!("http://{}/healthcheck", server.http_addr)).await;
    assert!(plain.is_err(), "{plain:?}");
    server.shutdown().await;
}

/// The start-up error for settings adjusted by `adjust` on a TLS server.
async fn start_error(adjust: impl FnOnce(&mut ServeSettings, &Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("CA");
    let (cert, key) = ca.server("s").write(dir.path(), "server");
    let mut s = settings(dir.path());
    s.tls.grpc_server_use_tls = true;
    s.tls.grpc_server_tls_cert = Some(cert);
    s.tls.grpc_server_tls_key = Some(key);
    adjust(&mut s, dir.path());
    match start(&s).await {
        Ok(_) => panic!("started"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn bad_tls_settings_stop_the_start_naming_the_setting() {
    let e = start_error(|s, _| s.tls.grpc_server_tls_key = None).await;
    assert!(e.starts_with("GRPC_SERVER_TLS_KEY is required"), "{e}");
    let e = start_error(|s, d| s.tls.grpc_server_tls_cert = Some(d.join("missing.crt"))).await;
    assert!(
        e.starts_with("GRPC_SERVER_TLS_CERT (") && e.contains("missing.crt"),
        "{e}"
    );
    let e = start_error(|s, d| {
        std::fs::write(d.join("garbage.key"), "not a key").unwrap();
        s.tls.grpc_server_tls_key = Some(d.join("garbage.key"));
    })
    .await;
    assert!(e.starts_with("GRPC_SERVER_TLS_KEY ("), "{e}");
    let e = start_error(|s, d| {
        let (_, key) = Ca::new("x").server("y").write(d, "other");
        s.tls.grpc_server_tls_key = Some(key);
    })
    .await;
    assert!(
        e.starts_with(
            "GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY: the private key does not match"
        ),
        "{e}"
    );
    let e = start_error(|s, _| s.tls.grpc_client_tls_san = Some("bad name!".into())).await;
    assert!(e.starts_with("GRPC_CLIENT_TLS_SAN"), "{e}");
    let e = start_error(|s, d| {
        std::fs::write(d.join("empty.pem"), "").unwrap();
        s.tls.grpc_client_tls_cacert = Some(d.join("empty.pem"));
    })
    .await;
    assert!(
        e.starts_with("GRPC_CLIENT_TLS_CACERT (") && e.contains("no CERTIFICATE"),
        "{e}"
    );
    let e = start_error(|s, _| {
        s.tls.grpc_server_use_tls = false;
        s.tls.grpc_client_tls_cacert = Some("ca.pem".into());
    })
    .await;
    assert!(e.starts_with("GRPC_CLIENT_TLS_CACERT: requires TLS"), "{e}");
    let e = start_error(|s, d| {
        s.tls.admin_tls_cert = Some(d.join("server.crt"));
    })
    .await;
    assert!(
        e.starts_with("ADMIN_TLS_KEY is required when ADMIN_TLS_CERT is set"),
        "{e}"
    );
}

/// The test servers' clock: 2026-01-01T00:00:10Z, in Unix seconds.
const NOW: i64 = (common::START / 1_000_000_000) as i64;
const DAY: i64 = 86_400;

#[tokio::test]
async fn an_expired_or_not_yet_valid_certificate_stops_the_start() {
    let e = start_error(|s, d| {
        let (cert, key) = Ca::new("x")
            .server_valid("old", NOW - 365 * DAY, NOW - DAY)
            .write(d, "old");
        s.tls.grpc_server_tls_cert = Some(cert);
        s.tls.grpc_server_tls_key = Some(key);
    })
    .await;
    assert!(
        e.starts_with("GRPC_SERVER_TLS_CERT (")
            && e.contains("certificate #0 expired at 2025-12-31T00:00:10Z"),
        "{e}"
    );
    let e = start_error(|s, d| {
        let (cert, key) = Ca::new("x")
            .server_valid("early", NOW + DAY, NOW + 365 * DAY)
            .write(d, "early");
        s.tls.grpc_server_tls_cert = Some(cert);
        s.tls.grpc_server_tls_key = Some(key);
    })
    .await;
    assert!(
        e.contains("certificate #0 is not valid before 2026-01-02T00:00:10Z"),
        "{e}"
    );
}

#[tokio::test]
async fn an_expired_certificate_on_rotation_is_refused_and_the_old_one_serves_on() {
    let f = tls_server(false, |s| {
        let dir = s.config.parent().unwrap().to_owned();
        let ca = Ca::new("rotation CA");
        let (cert, key) = ca
            // Valid for the client's real time too (the server's clock is the test's).
            .server_valid("current", NOW - 30 * DAY, NOW + 3650 * DAY)
            .write(&dir, "current");
        std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
        s.tls.grpc_server_tls_cert = Some(cert);
        s.tls.grpc_server_tls_key = Some(key);
    })
    .await;
    let addr = f.server.grpc_addr;
    let dir = f.server_dir();
    let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    let config = client_config(&ca_pem, None, &[b"h2"]);
    let original = served_cert(addr, config.clone()).await;
    let text = page(&f.server).await;
    assert_eq!(
        on_listener(&text, "ratelimit_tls_certificate_expiry_seconds", "gRPC") as i64,
        NOW + 3650 * DAY
    );
    // The rotation writes a certificate that expired yesterday (a renewal job gone wrong).
    let expired = Ca::new("another CA").server_valid("expired", NOW - 90 * DAY, NOW - DAY);
    let cert = dir.join("current.crt");
    let key = dir.join("current.key");
    std::fs::write(&key, &expired.key_pem).unwrap();
    std::fs::write(&cert, &expired.cert_pem).unwrap();
    let server = &f.server;
    eventually("the expired certificate is refused and counted", || async {
        on_listener(
            &page(server).await,
            "ratelimit_tls_reload_errors_total",
            "gRPC",
        ) == 1
    })
    .await;
    assert_eq!(served_cert(addr, config.clone()).await, original);
    assert_eq!(call_once(addr, config).await, Ok(Code::Ok));
    let text = page(server).await;
    assert_eq!(
        on_listener(&text, "ratelimit_tls_reload_success_total", "gRPC"),
        0
    );
    assert_eq!(
        on_listener(&text, "ratelimit_tls_certificate_expiry_seconds", "gRPC") as i64,
        NOW + 3650 * DAY,
        "the served certificate's expiry"
    );
    f.server.shutdown().await;
}

#[tokio::test]
async fn a_client_that_stalls_handshakes_does_not_starve_the_others() {
    // 40 connections at most, so at most 10 from one client (a quarter); stalled handshakes are
    // never timed out in this test (an hour), so only the per-client cap can save the others.
    let f = tls_server(false, |s| {
        s.transport.max_connections = 40;
        s.transport.handshake_timeout = Duration::from_secs(3600);
    })
    .await;
    let addr = f.server.grpc_addr;
    // 40 TCP connections from 127.0.0.2 (any 127/8 address is loopback) that start no handshake.
    let mut stalled = Vec::new();
    for _ in 0..40 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        stalled.push(socket.connect(addr).await.unwrap());
    }
    // A real client from 127.0.0.1 is served while they are all held open.
    let config = client_config(&f.ca.cert_pem(), None, &[b"h2"]);
    let answered = tokio::time::timeout(Duration::from_secs(30), call_once(addr, config)).await;
    assert_eq!(
        answered.expect("a real client answered while one client stalls 40 handshakes"),
        Ok(Code::Ok)
    );
    // The staller holds 10 of them: the 30 others were closed at once, and counted.
    let mut closed = 0;
    for tcp in &mut stalled {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 30);
    let text = page(&f.server).await;
    assert_eq!(
        on_listener(&text, "ratelimit_connections_refused_total", "gRPC"),
        30
    );
    drop(stalled);
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_near_its_end_is_warned_about_and_its_expiry_exported() {
    use ratelimit_server::clock::{Clock, SystemClock};
    let now = (SystemClock.now() / 1_000_000_000) as i64;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("tls.yaml"), RULES).unwrap();
    // 90 days of life, 3 left: past the warning window (a third of the life, at most 7 days).
    let leaf = Ca::new("CA").server_valid("ending", now - 87 * DAY, now + 3 * DAY);
    let (cert, key) = leaf.write(dir.path(), "server");
    let mut served = common::process::Served::start(
        &rules,
        &[
            "--grpc-server-use-tls",
            "true",
            "--grpc-server-tls-cert",
            cert.to_str().unwrap(),
            "--grpc-server-tls-key",
            key.to_str().unwrap(),
        ],
    );
    served.wait_ready().await;
    let metrics = format!("{}/metrics", served.http);
    let text = scrape(&metrics).await;
    assert_eq!(
        on_listener(&text, "ratelimit_tls_certificate_expiry_seconds", "gRPC") as i64,
        now + 3 * DAY
    );
    let log = served.log();
    let warning = log
        .lines()
        .find(|l| l.contains("the TLS certificate served expires in"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warning.contains("WARN") && warning.contains("listener=\"gRPC\""),
        "{warning}"
    );
    // Said once at start, not at every poll (every second): the next is an hour away.
    let polls = on_listener(&text, "ratelimit_tls_polls_total", "gRPC");
    eventually("two more polls of the certificate files", || async {
        on_listener(&scrape(&metrics).await, "ratelimit_tls_polls_total", "gRPC") >= polls + 2
    })
    .await;
    assert_eq!(served.log_lines("the TLS certificate served expires in"), 1);
}

/// A TLS metric's count on one listener.
fn on_listener(page: &str, name: &str, listener: &str) -> u64 {
    labelled(page, name, &format!("listener=\"{listener}\""))
}

/// The server's `/metrics` page.
async fn page(server: &Server) -> String {
    scrape(&format!("http://{}/metrics", server.http_addr)).await
}

/// Waits until the gRPC listener has read its certificate files twice more: whatever those files
/// would make it do has then been done.
async fn polled_twice_more(server: &Server) {
    let polls = on_listener(&page(server).await, "ratelimit_tls_polls_total", "gRPC");
    eventually("two more polls of the certificate files", || async {
        on_listener(&page(server).await, "ratelimit_tls_polls_total", "gRPC") >= polls + 2
    })
    .await;
}
