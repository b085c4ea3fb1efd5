//! Clients set up wrong, from outside on the real binary, which must say so rather than let their
//! Envoy fail open in silence. One that speaks another protocol than the gRPC listener serves: an
//! HTTP/1.x request (an Envoy cluster without HTTP/2, or curl) is answered 505 with the reason, on
//! TCP and on the Unix socket; a TLS handshake on the plaintext port is closed; each is counted
//! and warned of once a minute, not once per connection; gRPC clients beside them are served as
//! before. (Plaintext on the TLS port: `tls`; a real Envoy: `envoy_e2e::failure`.) One that asks
//! for a domain no rules file defines is warned of once per domain; a gRPC health check for a
//! service name the server does not answer for, once per name; a descriptor whose entries would
//! match a rule in another order (Envoy's actions in another order than the rules nest), once per
//! order.

use crate::common;

use std::path::Path;

use common::process::Served;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::Channel;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// What Envoy sends on a rate-limit cluster left on HTTP/1.1.
const HTTP1_CALL: &[u8] = b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\n\
    host: ratelimit\r\ncontent-type: application/grpc\r\nte: trailers\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0";

/// The start of a TLS 1.2 ClientHello record, as a client with a TLS transport socket sends it.
const TLS_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
];

/// A rules directory holding `RULES`, and the real binary serving it with `args`, healthy.
async fn served(args: &[&str]) -> (tempfile::TempDir, Served) {
    served_rules(RULES, args).await
}

/// [`served`] of the rules file `rules`.
async fn served_rules(rules: &str, args: &[&str]) -> (tempfile::TempDir, Served) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
    let mut served = Served::start(dir.path(), args);
    served.wait_healthy().await;
    (dir, served)
}

fn wrong(protocol: &str) -> String {
    format!(
        "ratelimit_connections_wrong_protocol_total{{listener=\"gRPC\",protocol=\"{protocol}\"}}"
    )
}

#[tokio::test]
async fn http1_and_tls_on_the_grpc_port_are_answered_counted_and_warned_of_once_a_minute() {
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("grpc.sock");
    let uds = socket.to_str().unwrap();
    let (_rules, mut served) = served(&["--grpc-uds", uds]).await;
    let grpc = format!("127.0.0.1:{}", served.grpc);

    for _ in 0..2 {
        let answer = common::answer_to(TcpStream::connect(&grpc).await.unwrap(), HTTP1_CALL).await;
        assert!(
            answer.starts_with("HTTP/1.1 505 HTTP Version Not Supported\r\n"),
            "{answer:?}"
        );
        assert!(
            answer.ends_with(
                "gRPC needs HTTP/2 and this request came as HTTP/1.x: send it with HTTP/2.\n"
            ),
            "{answer:?}"
        );
    }
    let answer = common::answer_to(TcpStream::connect(&grpc).await.unwrap(), TLS_HELLO).await;
    assert_eq!(answer, "", "a TLS client gets no plaintext answer");
    let answer = common::answer_to(
        UnixStream::connect(Path::new(uds)).await.unwrap(),
        HTTP1_CALL,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 505 "), "{answer:?}");

    served.wait_for_metric(&wrong("http1"), 2).await;
    served.wait_for_metric(&wrong("tls"), 1).await;
    let on_the_socket = "ratelimit_connections_wrong_protocol_total{listener=\"gRPC (Unix socket)\",protocol=\"http1\"}";
    served.wait_for_metric(on_the_socket, 1).await;
    let log = served.log();
    assert_eq!(
        served.log_lines("a client sent an HTTP/1.x request to the gRPC listener"),
        2,
        "once per listener (TCP, the Unix socket), not once per connection:\n{log}"
    );
    assert!(
        log.contains("http2_protocol_options"),
        "says what to change:\n{log}"
    );
    assert!(
        log.contains("request_line=\"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\""),
        "{log}"
    );
    assert_eq!(
        served.log_lines("began a TLS handshake on the gRPC listener"),
        1,
        "{log}"
    );
    assert!(log.contains("GRPC_SERVER_USE_TLS=true"), "{log}");

    // A gRPC client beside them is served as before.
    let mut client = served.client().await;
    let response = client
        .should_rate_limit(common::request("d", &[&[("k", "v")]]))
        .await
        .expect("a gRPC call is answered");
    assert_eq!(
        common::code(response.into_inner().overall_code),
        common::Code::Ok
    );
    assert_eq!(
        served.metric(&wrong("http1")).await,
        2,
        "a gRPC client is not counted"
    );
}

#[tokio::test]
async fn a_domain_without_rules_is_warned_of_once_per_domain() {
    let (_rules, mut served) = served(&[]).await;
    let mut client = served.client().await;
    // A domain is the client's text: a line break in it must not forge a log line.
    for domain in ["D", "d", "D", "other", "D", "evil\nforged ERROR line"] {
        let response = client
            .should_rate_limit(common::request(domain, &[&[("k", "v")]]))
            .await
            .expect("answered");
        assert_eq!(
            common::code(response.into_inner().overall_code),
            common::Code::Ok
        );
    }
    let not_found = "ratelimit_service_rate_limit_domain_not_found";
    served
        .wait_for_metric(&format!("{not_found}{{domain=\"D\"}}"), 3)
        .await;
    let said = "a call for a domain that no rules file defines";
    let log = served.log();
    let warned = served.lines_with(said);
    assert_eq!(warned.len(), 3, "once for D, other and evil:\n{log}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("domain=\"D\""),
        "{log}"
    );
    assert!(warned[1].contains("domain=\"other\""), "{log}");
    assert!(
        warned[2].contains(r#"domain="evil\nforged ERROR line""#),
        "{log}"
    );
    assert!(!log.lines().any(|l| l.starts_with("forged")), "{log}");
}

#[tokio::test]
async fn a_health_check_for_a_name_not_answered_for_is_warned_of_once_per_name() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

    let (_rules, served) = served(&[]).await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", served.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let status = health
            .check(check(service))
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    for _ in 0..2 {
        let refused = health.check(check("rate-limit")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::NotFound);
        assert!(
            refused.message().contains("\"ratelimit\""),
            "{}",
            refused.message()
        );
    }
    let said = "a gRPC health check asked for a service this server does not answer for";
    let log = served.log();
    assert_eq!(served.log_lines(said), 1, "once per name:\n{log}");
    assert!(log.contains("service=\"rate-limit\""), "{log}");
}

/// The overall code the server answers one descriptor of `entries` in the domain `edge` with.
async fn overall_in_edge(
    client: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
) -> common::Code {
    let response = client
        .should_rate_limit(common::request("edge", &[entries]))
        .await
        .expect("answered");
    common::code(response.into_inner().overall_code)
}

/// Rules nested client first, then path, as an Envoy route whose `rate_limits` actions name the
/// path first never matches: its requests went unlimited with nothing said.
const NESTED: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    descriptors:\n      \
    - key: path\n        value: /v1/*\n        rate_limit: {unit: minute, requests_per_unit: 2}\n";

#[tokio::test]
async fn entries_in_another_order_than_the_rules_are_warned_of_once_per_order_and_reload() {
    let (rules, mut served) = served_rules(NESTED, &[]).await;
    let mut client = served.client().await;
    let mut ask = async |entries: &[(&str, &str)]| overall_in_edge(&mut client, entries).await;
    let (path, client_ip) = (("path", "/v1/search"), ("remote_address", "10.0.0.1"));
    for _ in 0..3 {
        assert_eq!(
            ask(&[path, client_ip]).await,
            common::Code::Ok,
            "no rule as sent"
        );
    }
    // In the rules' order the rule applies; other keys or values match nothing and are not said.
    let in_order = [ask(&[client_ip, path]).await, ask(&[client_ip, path]).await];
    assert_eq!(in_order, [common::Code::Ok, common::Code::Ok]);
    assert_eq!(ask(&[client_ip, path]).await, common::Code::OverLimit);
    assert_eq!(ask(&[("path", "/v2"), client_ip]).await, common::Code::Ok);
    assert_eq!(ask(&[path, ("user", "u")]).await, common::Code::Ok);
    served
        .wait_for_metric("ratelimit_service_rate_limit_no_rule{domain=\"edge\"}", 5)
        .await;
    let log = served.log();
    let warned = served.lines_with("came in another order than the rules nest them");
    assert_eq!(warned.len(), 1, "once, for the first order only:\n{log}");
    for said in [
        "WARN",
        "domain=\"edge\"",
        "sent=\"path, remote_address\"",
        "rule=\"remote_address.path_/v1/*\"",
        "rule_order=\"remote_address, path\"",
    ] {
        assert!(warned[0].contains(said), "{said}:\n{log}");
    }

    // A reload that leaves the order as it was says it again, once.
    let loads = "ratelimit_service_config_load_success";
    let before = served.metric(loads).await;
    std::fs::write(
        rules.path().join("rules.yaml"),
        NESTED.replace(": 2}", ": 3}"),
    )
    .unwrap();
    served.wait_for_metric(loads, before + 1).await;
    for _ in 0..2 {
        assert_eq!(ask(&[path, client_ip]).await, common::Code::Ok);
    }
    served
        .wait_for_metric("ratelimit_service_rate_limit_no_rule{domain=\"edge\"}", 7)
        .await;
    let warned = served.lines_with("came in another order than the rules nest them");
    assert_eq!(warned.len(), 2, "again after the reload:\n{}", served.log());
}

/// A rule without nested descriptors, and an Envoy route that adds an action after its entry: the
/// descriptor goes on past the rule and matches nothing (as in the reference), so its requests
/// went unlimited with nothing said.
const LEAF: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    \
    rate_limit: {unit: minute, requests_per_unit: 2}\n";

#[tokio::test]
async fn a_descriptor_longer_than_its_rule_is_warned_of_once_per_order() {
    let (_rules, mut served) = served_rules(LEAF, &[]).await;
    let mut client = served.client().await;
    let mut ask = async |entries: &[(&str, &str)]| overall_in_edge(&mut client, entries).await;
    let (client_ip, path) = (("remote_address", "10.0.0.1"), ("path", "/v1"));
    for _ in 0..3 {
        assert_eq!(
            ask(&[client_ip, path]).await,
            common::Code::Ok,
            "no rule as sent"
        );
    }
    // The rule's entries alone are limited; other first keys are not said.
    for expected in [common::Code::Ok, common::Code::Ok, common::Code::OverLimit] {
        assert_eq!(ask(&[client_ip]).await, expected);
    }
    assert_eq!(ask(&[path, client_ip]).await, common::Code::Ok);
    served
        .wait_for_metric("ratelimit_service_rate_limit_no_rule{domain=\"edge\"}", 4)
        .await;
    let log = served.log();
    let warned = served.lines_with("goes on past the rule its first entries match");
    assert_eq!(warned.len(), 1, "once:\n{log}");
    for said in [
        "WARN",
        "sent=\"remote_address, path\"",
        "rule=\"remote_address\"",
        "rule_entries=1",
    ] {
        assert!(warned[0].contains(said), "{said}:\n{log}");
    }
}
