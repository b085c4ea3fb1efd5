//! The transport from outside, as a hostile or unlucky client sees it: oversized, stalled and
//! malformed calls are refused with the right gRPC code and counted, calls waiting for their
//! request are bounded in number and in time (health checks too); a call past its
//! `grpc-timeout` is answered DEADLINE_EXCEEDED; a connection past its maximum age is closed
//! gracefully, then cut after the grace; silent connections are closed; a descriptor-limited
//! process survives a connection flood without spinning.

use crate::common;

use common::free_port;

#[path = "../../examples/load/codec.rs"]
mod raw_codec;

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codegen::http;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A raw HTTP/2 connection to the gRPC port.
async fn h2_client(server: &common::TestServer) -> h2::client::SendRequest<Bytes> {
    h2_connection(server).await.0
}

/// A raw HTTP/2 connection to the gRPC port, and the task driving it (it ends when the
/// connection does).
async fn h2_connection(
    server: &common::TestServer,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(server.server.grpc_addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driving = tokio::spawn(connection);
    (client.ready().await.unwrap(), driving)
}

/// Starts a ShouldRateLimit call whose gRPC frame declares `declared` bytes, and sends `sent` of
/// them without ending the stream.
async fn partial_call(
    client: &mut h2::client::SendRequest<Bytes>,
    declared: u32,
    sent: usize,
) -> h2::client::ResponseFuture {
    let (response, body) = started_call(client, declared, sent, &[]).await;
    // Keep the stream open (neither ended nor reset) for the rest of the test.
    std::mem::forget(body);
    response
}

/// Starts a ShouldRateLimit call with `headers` whose gRPC frame declares `declared` bytes and
/// sends `sent` of them; the stream's sending half is returned open.
async fn started_call(
    client: &mut h2::client::SendRequest<Bytes>,
    declared: u32,
    sent: usize,
    headers: &[(&str, &str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    started_call_to(client, PATH, declared, sent, headers).await
}

/// [`started_call`] to the method at `path`.
async fn started_call_to(
    client: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    declared: u32,
    sent: usize,
    headers: &[(&str, &str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(()).unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&declared.to_be_bytes());
    frame.resize(5 + sent, 0x0a);
    body.send_data(Bytes::from(frame), false).unwrap();
    (response, body)
}

/// A ShouldRateLimit request for `k=v` in domain `d`, encoded.
fn encoded_request() -> Vec<u8> {
    use prost::Message;
    common::probe("d", &[("k", "v")]).encode_to_vec()
}

/// The grpc-status of a trailers-only answer.
async fn grpc_status(response: h2::client::ResponseFuture) -> i32 {
    let response = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("the server answers the call")
        .unwrap();
    response
        .headers()
        .get("grpc-status")
        .expect("a trailers-only error answer")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn error_count(server: &common::TestServer, kind: &str) -> u64 {
    let text = reqwest::get(server.http("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("ratelimit_service_should_rate_limit_error{{err_type=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn oversized_calls_are_refused_from_their_length_prefix_without_waiting_for_the_bytes() {
    let s = common::start(&[("d.yaml", RULES)]).await;
    let mut client = h2_client(&s).await;
    // 200 streams on one connection, each announcing a 4 MiB message and sending 1 KiB of it: each
    // is refused at once (OUT_OF_RANGE, tonic's code for it), none is buffered toward its 4 MiB.
    let mut calls = Vec::new();
    for _ in 0..200 {
        calls.push(partial_call(&mut client, 4 << 20, 1024).await);
    }
    for call in calls {
        assert_eq!(grpc_status(call).await, tonic::Code::OutOfRange as i32);
    }
    assert_eq!(error_count(&s, "request_too_large").await, 200);
}

#[tokio::test]
async fn a_call_that_stops_sending_is_ended_after_the_request_timeout() {
    let s = start_with_request_timeout(Duration::from_millis(200)).await;
    let mut client = h2_client(&s).await;
    let stalled = partial_call(&mut client, 100, 10).await;
    assert_eq!(
        grpc_status(stalled).await,
        tonic::Code::DeadlineExceeded as i32
    );
    assert_eq!(error_count(&s, "stalled_request").await, 1);
}

/// What a call waiting for its request counts against the buffer budget beside its bytes
/// (docs/operations.md: its headers and stream).
const WAITING_CALL_BYTES: usize = 16 * 1024;

#[tokio::test]
async fn bytes_past_the_buffer_budget_are_refused_while_small_calls_still_pass() {
    // Room for one stalled call of 50,005 bytes waiting for the rest, and for a real call that
    // has to wait for its request (its bytes came after its headers) or not.
    let budget = 50_005 + WAITING_CALL_BYTES + WAITING_CALL_BYTES + 1000;
    let mut s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.max_buffered_request_bytes = budget;
    })
    .await;
    let mut client = h2_client(&s).await;
    // The first stalled call holds 50,005 bytes and its wait; a second one cannot add its own.
    let first = partial_call(&mut client, 60_000, 50_000).await;
    let second = partial_call(&mut client, 60_000, 50_000).await;
    assert_eq!(
        grpc_status(second).await,
        tonic::Code::ResourceExhausted as i32
    );
    // A real call is small and fits beside the stalled one.
    assert_eq!(s.hit("d", &[("k", "v")]).await.0, common::Code::Ok);
    drop(first);
}

#[tokio::test]
async fn calls_waiting_for_their_request_count_against_the_buffer_budget() {
    // Room for three calls waiting with their 5-byte gRPC prefix, not for a fourth.
    let budget = 3 * (WAITING_CALL_BYTES + 5) + 100;
    let mut s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.max_buffered_request_bytes = budget;
        settings.transport.request_timeout = Duration::from_millis(500);
    })
    .await;
    let mut client = h2_client(&s).await;
    let mut calls = Vec::new();
    for _ in 0..4 {
        calls.push(partial_call(&mut client, 100, 0).await);
    }
    // Whichever the server saw last is refused at once; the others wait out the request timeout.
    let mut codes = Vec::new();
    for call in calls {
        codes.push(grpc_status(call).await);
    }
    codes.sort_unstable();
    let (exhausted, deadline) = (
        tonic::Code::ResourceExhausted as i32,
        tonic::Code::DeadlineExceeded as i32,
    );
    let mut expected = vec![exhausted, deadline, deadline, deadline];
    expected.sort_unstable();
    assert_eq!(codes, expected);
    assert_eq!(error_count(&s, "resource_exhausted").await, 1);
    assert_eq!(error_count(&s, "stalled_request").await, 3);
    // Once they ended, the budget is whole again.
    assert_eq!(s.hit("d", &[("k", "v")]).await.0, common::Code::Ok);
}

#[tokio::test]
async fn a_health_check_whose_request_never_comes_is_ended_after_the_request_timeout() {
    let s = start_with_request_timeout(Duration::from_millis(200)).await;
    let mut client = h2_client(&s).await;
    let (check, _open) =
        started_call_to(&mut client, "/grpc.health.v1.Health/Check", 100, 0, &[]).await;
    assert_eq!(
        grpc_status(check).await,
        tonic::Code::DeadlineExceeded as i32
    );
    // A whole health check is answered as before.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn a_call_past_its_grpc_timeout_is_answered_deadline_exceeded() {
    // The server's own stall timeout is far away: only the caller's deadline can end the call.
    let mut s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.request_timeout = Duration::from_secs(3600);
    })
    .await;
    let mut client = h2_client(&s).await;
    let (stalled, _body) = started_call(&mut client, 100, 10, &[("grpc-timeout", "50m")]).await;
    assert_eq!(
        grpc_status(stalled).await,
        tonic::Code::DeadlineExceeded as i32
    );
    // Not a stalled request of the server's: the caller's deadline passed.
    assert_eq!(error_count(&s, "stalled_request").await, 0);
    assert_eq!(s.hit("d", &[("k", "v")]).await.0, common::Code::Ok);
}

#[tokio::test]
async fn at_its_maximum_age_a_connection_finishes_its_calls_then_closes() {
    let s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.grpc_max_connection_age = Some(Duration::from_millis(200));
        settings.grpc_max_connection_age_grace = Duration::from_secs(3600);
    })
    .await;
    let (mut client, driving) = h2_connection(&s).await;
    let message = encoded_request();
    let declared = u32::try_from(message.len()).unwrap();
    let (response, mut body) = started_call(&mut client, declared, 0, &[]).await;
    // Past the connection's age, the call started before it is still being served…
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!driving.is_finished(), "the connection was cut at its age");
    body.send_data(Bytes::from(message), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("the call in progress is answered")
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut response = response.into_body();
    while response.data().await.is_some() {}
    let trailers = response.trailers().await.unwrap().expect("trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    // …and once it is answered, the connection (told to go away at its age) closes.
    drop(client);
    tokio::time::timeout(Duration::from_secs(20), driving)
        .await
        .expect("the connection closes after its age")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_call_still_running_at_the_end_of_the_ages_grace_is_cut() {
    let s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.request_timeout = Duration::from_secs(3600);
        settings.grpc_max_connection_age = Some(Duration::from_millis(200));
        settings.grpc_max_connection_age_grace = Duration::from_millis(200);
    })
    .await;
    let (mut client, driving) = h2_connection(&s).await;
    let stalled = partial_call(&mut client, 100, 10).await;
    let ended = tokio::time::timeout(Duration::from_secs(20), stalled)
        .await
        .expect("the stalled call ends with its connection");
    assert!(ended.is_err(), "the stalled call was answered: {ended:?}");
    tokio::time::timeout(Duration::from_secs(20), driving)
        .await
        .expect("the connection is cut")
        .unwrap()
        .ok();
}

async fn raw_call(s: &common::TestServer, bytes: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(Bytes::from(bytes)),
        http::uri::PathAndQuery::from_static(PATH),
        raw_codec::RawCodec,
    )
    .await
    .expect_err("the call is refused")
}

#[tokio::test]
async fn malformed_protobuf_is_invalid_argument_and_counted() {
    let s = common::start(&[("d.yaml", RULES)]).await;
    let cases: [(&str, Vec<u8>); 4] = [
        ("not protobuf", vec![0xff, 0xff, 0xff]),
        ("truncated", vec![0x12, 0x10, 0x01]),
        ("domain not UTF-8", vec![0x0a, 0x02, 0xc3, 0x28]),
        ("wrong wire type for descriptors", vec![0x10, 0x01]),
    ];
    for (what, bytes) in cases {
        let status = raw_call(&s, bytes).await;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        assert!(
            status.message().contains("malformed RateLimitRequest"),
            "{what}: {}",
            status.message()
        );
    }
    assert_eq!(error_count(&s, "invalid_argument").await, 4);
}

#[tokio::test]
async fn descriptor_floods_are_refused_before_they_are_decoded() {
    let s = common::start(&[("d.yaml", RULES)]).await;
    // Two million empty descriptors (4 MB): over the request size bound.
    let huge = [0x12u8, 0x00].repeat(2_000_000);
    assert_eq!(raw_call(&s, huge).await.code(), tonic::Code::OutOfRange);
    // Thirty thousand (60 KB, under the size bound): refused by the wire scan, with the engine's
    // own message.
    let mut many = vec![0x0a, 0x01, b'd'];
    many.extend([0x12u8, 0x00].repeat(30_000));
    let status = raw_call(&s, many).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "too many descriptors: 30000 (at most 64)");
}

/// Reads until the server closes the connection; fails the test if it stays open for 20 s.
async fn closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {} // the server's SETTINGS frame or error response
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept a silent connection open");
}

#[tokio::test]
async fn silent_and_half_open_connections_are_closed_on_both_ports() {
    let s = common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.handshake_timeout = Duration::from_millis(200);
        settings.transport.grpc_keepalive_interval = Duration::from_millis(200);
        settings.transport.grpc_keepalive_timeout = Duration::from_millis(200);
    })
    .await;
    // A complete handshake (preface and an empty SETTINGS frame), then a peer that answers
    // nothing, not even the keepalive pings: half-open.
    let mut half_open = TcpStream::connect(s.server.grpc_addr).await.unwrap();
    half_open
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut silent_grpc = TcpStream::connect(s.server.grpc_addr).await.unwrap();
    let mut half_preface = TcpStream::connect(s.server.grpc_addr).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // The whole connection preface, then no SETTINGS frame: the HTTP/2 handshake never completes.
    let mut preface_only = TcpStream::connect(s.server.grpc_addr).await.unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut partial_headers = TcpStream::connect(s.server.http_addr).await.unwrap();
    partial_headers
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    closed_by_server(&mut silent_grpc).await;
    closed_by_server(&mut half_preface).await;
    closed_by_server(&mut preface_only).await;
    closed_by_server(&mut half_open).await;
    closed_by_server(&mut partial_headers).await;
}

/// The real binary with 256 file descriptors, flooded with 300 silent connections: it must not
/// spin, must keep answering health and the connections it already has, and must take new
/// connections again once the silent ones are closed.
#[tokio::test]
async fn a_connection_flood_past_the_descriptor_limit_neither_spins_nor_starves_health() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("d.yaml"), RULES).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let Some(child) = common::process::under_prlimit("--nofile=256:256", |c| {
        c.args(["serve", "--config"])
            .arg(dir.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .env("HANDSHAKE_TIMEOUT", "2s")
            .env("LOG_LEVEL", "error");
    }) else {
        return;
    };
    let health = format!("http://127.0.0.1:{http}/healthcheck");
    common::process::wait_healthy(&health).await;
    let url = format!("http://127.0.0.1:{grpc}");
    let mut client =
        envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(url.clone())
            .await
            .unwrap();
    let call = || common::request("d", &[&[("k", "v")]]);
    client.should_rate_limit(call()).await.unwrap();

    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(("127.0.0.1", grpc)).await.unwrap());
    }
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
    client
        .should_rate_limit(call())
        .await
        .expect("an existing connection is served during the flood");
    drop(flood);
    // Once the silent connections are closed, new ones are taken again. Until the server has seen
    // every close, a new connection from the same address may still meet the per-client cap
    // (accepted, then closed): so until one is served, within 20 s.
    let started = ratelimit_server::clock::monotonic();
    loop {
        let fresh = tokio::time::timeout(
            Duration::from_secs(5),
            envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(url.clone()),
        )
        .await;
        if let Ok(Ok(mut fresh)) = fresh
            && fresh.should_rate_limit(call()).await.is_ok()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no new connection was served after the flood"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A server on `RULES` whose calls must send their whole request within `timeout` (short, so a
/// stalled call's end comes within the test).
async fn start_with_request_timeout(timeout: Duration) -> common::TestServer {
    common::start_with(&[("d.yaml", RULES)], |settings| {
        settings.transport.request_timeout = timeout;
    })
    .await
}
