//! Rules from xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`) against a real ADS management server in the test
//! (support/ads.rs), over loopback in plaintext and with mutual TLS 1.3: the first response
//! applied and ACKed; a pushed change applied with the counters kept; an invalid push NACKed (the
//! next request carries error_detail and the previous version) while decisions follow the last
//! good rules; the management server stopped and started again (decisions go on, the client
//! reconnects and resubscribes with the version it holds); FORCE_START_WITHOUT_INITIAL_CONFIG
//! both ways; MERGE_DOMAIN_CONFIG across resources. Each test prints the exchange it saw.

use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use ratelimit_server::settings::ServeSettings;
use serde_json::Value;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::{self, Code, TestServer};
use crate::support::ads::{Ads, Received, tls13_requiring_client_certs};
use crate::support::certs::Ca;

/// Envoy Gateway's node id.
const NODE: &str = "envoy-ratelimit";

pub fn user_limit(name: &str, domain: &str, rpu: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

pub fn limits(rpu: u32) -> RateLimitConfig {
    user_limit("default/eg", "eg", rpu, RateLimitUnit::Minute)
}

/// Short waits, so reconnections happen within the test.
fn quick(s: &mut ServeSettings, url: &str) {
    crate::support::ads::quick_xds(s, url, NODE);
}

async fn server(ads: &Ads, adjust: impl FnOnce(&mut ServeSettings)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("unused");
    let url = ads.url();
    common::start_at(dir, config, |s| {
        quick(s, &url);
        adjust(s);
    })
    .await
}

async fn rlconfig(t: &TestServer) -> Value {
    reqwest::get(t.http("/rlconfig"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn grpc_health(t: &TestServer) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", t.server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let r = client
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

async fn healthcheck(t: &TestServer) -> u16 {
    reqwest::get(t.http("/healthcheck"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn print_exchange(test: &str, ads: &Ads) {
    eprintln!(
        "--- {test}: the ADS exchange seen by the management server ---\n{}",
        ads.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_response_is_applied_acked_and_reported() {
    let ads = Ads::start(None).await;
    ads.set("1", &[limits(2)]);
    let mut t = server(&ads, |_| {}).await;
    let ack = ads.wait_ack("1").await;
    print_exchange("first response", &ads);
    let received = ads.received();
    let first = &received[0];
    assert_eq!(first.request.node.as_ref().unwrap().id, NODE);
    assert_eq!(first.request.type_url, crate::support::ads::TYPE_URL);
    assert!(first.request.version_info.is_empty() && first.request.response_nonce.is_empty());
    assert!(first.request.resource_names.is_empty());
    assert_eq!(ack.request.response_nonce, ads.sent()[0].2);
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 0));
    assert_eq!(t.hit("eg", &[("user", "a")]).await.0, Code::OverLimit);
    assert_eq!(t.server.metrics.config_load_success.get(), 1);
    let report = rlconfig(&t).await;
    let last = &report["last_load"];
    assert_eq!(last["source"], "xds");
    assert_eq!(last["version"], "1");
    assert_eq!(last["nonce"], ack.request.response_nonce.as_str());
    assert_eq!(report["domains"][0]["domain"], "eg");
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_change_is_applied_with_the_counters_kept() {
    let ads = Ads::start(None).await;
    ads.set("1", &[limits(5)]);
    let mut t = server(&ads, |_| {}).await;
    ads.wait_ack("1").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 4));
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 3));
    ads.set("2", &[limits(10)]);
    ads.wait_ack("2").await;
    print_exchange("pushed change", &ads);
    // Two hits already counted against the raised limit: as a file reload keeps them.
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 7));
    assert_eq!(t.server.metrics.config_load_success.get(), 2);
    assert_eq!(rlconfig(&t).await["last_load"]["version"], "2");
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_push_is_nacked_and_the_last_good_rules_keep_deciding() {
    let ads = Ads::start(None).await;
    ads.set("1", &[limits(3)]);
    let mut t = server(&ads, |_| {}).await;
    ads.wait_ack("1").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 2));
    let mut bad = limits(100);
    bad.descriptors[0].rate_limit.as_mut().unwrap().unit = RateLimitUnit::Unknown as i32;
    ads.set("2", &[bad]);
    let received = ads
        .wait_for("the NACK of 2", |r| r.iter().any(Received::is_nack))
        .await;
    print_exchange("invalid push", &ads);
    let nack = received.iter().find(|r| r.is_nack()).unwrap();
    assert_eq!(
        nack.request.version_info, "1",
        "the NACK repeats the last good version"
    );
    let nonce_of_2 = ads.sent().into_iter().find(|s| s.1 == "2").unwrap().2;
    assert_eq!(nack.request.response_nonce, nonce_of_2);
    let detail = nack.request.error_detail.as_ref().unwrap();
    assert_eq!(detail.code, 3);
    assert!(
        detail.message.starts_with(
            "RateLimitConfig 'default/eg': descriptors[0].rate_limit.unit: invalid rate limit \
             unit 'UNKNOWN'"
        ),
        "{}",
        detail.message
    );
    // Still the limit of 3, and its counter.
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    assert_eq!(t.server.metrics.config_load_error.get(), 1);
    let last = rlconfig(&t).await["last_load"].clone();
    assert_eq!(
        (last["ok"].clone(), last["version"].clone()),
        (false.into(), "2".into())
    );
    assert!(
        last["errors"][0]
            .as_str()
            .unwrap()
            .contains("rate_limit.unit")
    );
    // The next good push is taken.
    ads.set("3", &[limits(4)]);
    ads.wait_ack("3").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_management_server_leaves_the_rules_and_a_restarted_one_is_resubscribed() {
    let mut ads = Ads::start(None).await;
    ads.set("1", &[limits(5)]);
    let mut t = server(&ads, |_| {}).await;
    ads.wait_ack("1").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 4));
    ads.stop().await;
    // No management server: the rules in force keep deciding.
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 3));
    assert_eq!(t.hit("eg", &[("user", "b")]).await, (Code::Ok, 4));
    let streams_before = ads.received().iter().map(|r| r.stream).max().unwrap();
    ads.restart().await;
    let received = ads
        .wait_for("a resubscription on a new stream", |r| {
            r.iter().any(|r| r.stream > streams_before)
        })
        .await;
    let again = received.iter().find(|r| r.stream > streams_before).unwrap();
    assert_eq!(
        again.request.version_info, "1",
        "resubscribes with the version it holds"
    );
    assert!(again.request.response_nonce.is_empty() && again.request.error_detail.is_none());
    // The server holds version 1 too, so it sends nothing until a change; then it is taken.
    ads.set("2", &[limits(6)]);
    ads.wait_ack("2").await;
    print_exchange("stop and restart", &ads);
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 3));
    assert_eq!(t.server.metrics.config_load_success.get(), 2);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_health_fails_until_the_first_good_rules() {
    let ads = Ads::start(None).await;
    let mut bad = limits(1);
    bad.domain.clear();
    ads.set("0", &[bad]);
    let t = server(&ads, |s| s.force_start_without_initial_config = false).await;
    ads.wait_for("the NACK of 0", |r| r.iter().any(Received::is_nack))
        .await;
    assert_eq!(grpc_health(&t).await, ServingStatus::NotServing);
    assert_eq!(healthcheck(&t).await, 500);
    ads.set("1", &[limits(1)]);
    ads.wait_ack("1").await;
    print_exchange("no force start", &ads);
    assert_eq!(grpc_health(&t).await, ServingStatus::Serving);
    assert_eq!(healthcheck(&t).await, 200);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_force_start_it_serves_before_any_response() {
    let ads = Ads::start(None).await;
    let mut t = server(&ads, |s| s.force_start_without_initial_config = true).await;
    // Subscribed, nothing sent yet: healthy, and every request is allowed.
    ads.wait_for("the subscription", |r| !r.is_empty()).await;
    let last = rlconfig(&t).await["last_load"].clone();
    assert_eq!(last["source"], "xds");
    assert!(
        last["summary"]
            .as_str()
            .unwrap()
            .starts_with("waiting for the first response")
    );
    assert_eq!(grpc_health(&t).await, ServingStatus::Serving);
    assert_eq!(healthcheck(&t).await, 200);
    let r = t.call(common::request("eg", &[&[("user", "a")]])).await;
    assert_eq!(common::code(r.overall_code), Code::Ok);
    ads.set("1", &[limits(1)]);
    ads.wait_ack("1").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 0));
    assert_eq!(t.hit("eg", &[("user", "a")]).await.0, Code::OverLimit);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_applies_to_resources() {
    let ads = Ads::start(None).await;
    let mut other = user_limit("default/eg-2", "eg", 1, RateLimitUnit::Second);
    other.descriptors[0].key = "path".into();
    ads.set("1", &[limits(2), other.clone()]);
    let unmerged = server(&ads, |_| {}).await;
    let received = ads
        .wait_for("the NACK of two resources of one domain", |r| {
            r.iter().any(Received::is_nack)
        })
        .await;
    let detail = &received
        .iter()
        .find(|r| r.is_nack())
        .unwrap()
        .request
        .error_detail;
    let message = &detail.as_ref().unwrap().message;
    assert!(
        message.starts_with("RateLimitConfig 'default/eg-2': domain: duplicate domain 'eg'"),
        "{message}"
    );
    unmerged.server.shutdown().await;
    let ads = Ads::start(None).await;
    ads.set("1", &[limits(2), other]);
    let mut merged = server(&ads, |s| s.rules_files.merge_domain_config = true).await;
    ads.wait_ack("1").await;
    assert_eq!(merged.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    assert_eq!(merged.hit("eg", &[("path", "/")]).await, (Code::Ok, 0));
    merged.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_over_mutual_tls_1_3_as_envoy_gateway_serves_them() {
    let ca = Ca::new("envoy-gateway CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let (cert, key) = ca.client(&["envoy-ratelimit"]).write(dir.path(), "tls");
    let leaf = ca.server("envoy-gateway");
    let mut ads = Ads::start(Some(tls13_requiring_client_certs(&ca.cert_pem(), &leaf))).await;
    ads.set("1", &[limits(2)]);
    let mut t = server(&ads, |s| {
        s.xds.xds_server_use_tls = true;
        s.xds.xds_server_tls_cacert = Some(ca_file.clone());
        s.xds.xds_client_tls_cert = Some(cert.clone());
        s.xds.xds_client_tls_key = Some(key.clone());
        s.xds.xds_server_tls_san = Some("localhost".into());
    })
    .await;
    ads.wait_ack("1").await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    // Over TLS too: stopped and restarted, resubscribed from the version held.
    ads.stop().await;
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 0));
    ads.restart().await;
    ads.set("2", &[limits(4)]);
    ads.wait_ack("2").await;
    print_exchange("mTLS", &ads);
    let resubscribed = ads.received().into_iter().any(|r| {
        r.stream > 1 && r.request.response_nonce.is_empty() && r.request.version_info == "1"
    });
    assert!(resubscribed, "{}", ads.log());
    assert_eq!(t.hit("eg", &[("user", "a")]).await, (Code::Ok, 1));
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_tls_file_stops_the_start_naming_its_setting() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = ServeSettings::for_tests(dir.path().to_path_buf());
    quick(&mut s, "127.0.0.1:1");
    s.xds.xds_server_use_tls = true;
    s.xds.xds_server_tls_cacert = Some(dir.path().join("missing-ca.crt"));
    let clock = ratelimit_server::clock::ManualClock::new(common::START);
    let error = match ratelimit_server::server::start(&s, std::sync::Arc::new(clock)).await {
        Ok(_) => panic!("started without its CA file"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.starts_with("invalid xDS setting CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        "{error}"
    );
    // A client certificate without its key is refused too.
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, Ca::new("a CA").cert_pem()).unwrap();
    s.xds.xds_server_tls_cacert = Some(ca_file);
    s.xds.xds_client_tls_cert = Some(dir.path().join("tls.crt"));
    let clock = ratelimit_server::clock::ManualClock::new(common::START);
    let error = match ratelimit_server::server::start(&s, std::sync::Arc::new(clock)).await {
        Ok(_) => panic!("started with a certificate and no key"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_metadata_and_additional_headers_reach_the_management_server() {
    let ads = Ads::start(None).await;
    ads.set("1", &[limits(1)]);
    let t = server(&ads, |s| {
        s.xds.xds_node_metadata = "zone:eu-1,team=edge".into();
        s.xds.xds_client_additional_headers = "x-eg-token:abc123, x-tenant:t1".into();
    })
    .await;
    let ack = ads.wait_ack("1").await;
    assert_eq!(
        ads.header(ack.stream, "x-eg-token").as_deref(),
        Some("abc123")
    );
    assert_eq!(ads.header(ack.stream, "x-tenant").as_deref(), Some("t1"));
    let node = ads.received()[0].request.node.clone().unwrap();
    let fields = node.metadata.unwrap().fields;
    let text = |k: &str| match fields.get(k).and_then(|v| v.kind.clone()) {
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => s,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!((text("zone"), text("team")), ("eu-1".into(), "edge".into()));
    assert_eq!(node.user_agent_name, "ratelimit-server");
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_message_size_cap_is_not_taken() {
    let ads = Ads::start(None).await;
    let mut big = limits(1);
    big.descriptors[0].value = "v".repeat(4096);
    ads.set("1", &[big]);
    let t = server(&ads, |s| {
        s.xds.xds_client_max_msg_size_in_bytes = Some(1024);
        s.force_start_without_initial_config = false;
    })
    .await;
    // The stream fails on the oversized message and the client opens another: by then the first
    // response has been refused, never ACKed.
    let received = ads
        .wait_for("a second stream", |r| r.iter().any(|r| r.stream >= 2))
        .await;
    print_exchange("message size cap", &ads);
    assert!(
        received
            .iter()
            .all(|r| r.request.response_nonce.is_empty() && r.request.version_info.is_empty()),
        "{}",
        ads.log()
    );
    assert_eq!(grpc_health(&t).await, ServingStatus::NotServing);
    assert!(rlconfig(&t).await["domains"].as_array().unwrap().is_empty());
    t.server.shutdown().await;
}

/// TLS on one side only, the real binary at its default waits: a plaintext client at Envoy
/// Gateway's mTLS management server saw only `Unknown: transport error`, and a TLS client at a
/// plaintext one a reset; each failure's WARN now says what the server speaks and which setting
/// to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_one_side_only_is_said_with_the_setting_to_change() {
    let ca = Ca::new("envoy-gateway CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let leaf = ca.server("envoy-gateway");
    let tls = Ads::start(Some(tls13_requiring_client_certs(&ca.cert_pem(), &leaf))).await;
    let xds = |url: String, extra: &[(&'static str, String)]| {
        let mut env = vec![
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_string()),
            ("CONFIG_GRPC_XDS_SERVER_URL", url),
            ("CONFIG_GRPC_XDS_NODE_ID", NODE.into()),
        ];
        env.extend_from_slice(extra);
        common::process::Served::with_env(dir.path(), &env)
    };
    let said = async |served: &common::process::Served, what: &str| {
        common::wait::eventually(what, || async { served.log_lines(what) > 0 }).await;
        served.lines_with(what).remove(0)
    };

    let plaintext_client = xds(tls.url(), &[]);
    let line = said(
        &plaintext_client,
        "speaks TLS, and this server connects in plaintext",
    )
    .await;
    assert!(
        line.contains("WARN") && line.contains("set CONFIG_GRPC_XDS_SERVER_USE_TLS=true"),
        "{line}"
    );
    drop(plaintext_client);

    let plaintext = Ads::start(None).await;
    let tls_client = xds(
        plaintext.url(),
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                ca_file.display().to_string(),
            ),
        ],
    );
    let line = said(
        &tls_client,
        "answers in plaintext HTTP/2, and this server connects with TLS",
    )
    .await;
    assert!(
        line.contains("set CONFIG_GRPC_XDS_SERVER_USE_TLS=false"),
        "{line}"
    );
}
