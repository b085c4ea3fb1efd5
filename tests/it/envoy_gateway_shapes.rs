//! What Envoy Gateway's translator (envoyproxy/gateway `internal/xds/translator/ratelimit.go`)
//! makes both sides say, over real gRPC: the `RateLimitConfig` it serves (one per domain, the
//! listener's name; a route descriptor `key = value = <route name>` holding one chain per rule:
//! `rule-<r>-match-<m>` for header matches, no value when distinct, `rule-<r>-match--1` when the
//! rule matches everything; the policy on the chain's last descriptor; `shadow_mode` on a rule in
//! shadow mode), and the requests Envoy then sends: one descriptor per rule whose actions all
//! produced an entry, `hits_addend` on the descriptor for a request cost (0 = check only), a
//! `limit` override taken from dynamic metadata, and Envoy AI Gateway's token limits (a check
//! with no cost when the request arrives, the response's token count charged when the stream
//! ends). The server runs as Envoy Gateway's environment sets it: fixed windows that count denied
//! hits, as the reference does (`reference_env` pins that translation).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as Descriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit as EnvoyUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use crate::common::{self, Code, TestServer};
use crate::support::ads::Ads;
use ratelimit_server::config::Algorithm;
use ratelimit_server::settings::ConfigType;

/// The listener's name: Envoy Gateway's domain.
const DOMAIN: &str = "default/eg/http";
/// A route's descriptor key and value.
const ROUTE: &str = "httproute/default/backend/rule/0/match/0/www_example_com";

fn policy(unit: RateLimitUnit, rpu: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: rpu,
        ..Default::default()
    })
}

fn rule(key: &str, value: &str, limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: limit,
        ..Default::default()
    }
}

/// A BackendTrafficPolicy with four rules on one route, as the translator writes it: a distinct
/// header (`x-user-id`, 3 an hour), a header value match in shadow mode (2 a minute), a
/// match-everything rule with a request cost (10 a minute), and a CIDR rule, distinct per
/// address (masked_remote_address → remote_address, 1 a minute); and an AI Gateway token limit,
/// distinct per `x-user-id` (100 tokens an hour).
fn gateway_config() -> RateLimitConfig {
    let mut shadow = rule(
        "rule-1-match-0",
        "rule-1-match-0",
        policy(RateLimitUnit::Minute, 2),
    );
    shadow.shadow_mode = true;
    let mut cidr = rule("masked_remote_address", "10.0.0.0/8", None);
    cidr.descriptors = vec![rule("remote_address", "", policy(RateLimitUnit::Minute, 1))];
    let mut route = rule(ROUTE, ROUTE, None);
    route.descriptors = vec![
        rule("rule-0-match-0", "", policy(RateLimitUnit::Hour, 3)),
        shadow,
        rule(
            "rule-2-match--1",
            "rule-2-match--1",
            policy(RateLimitUnit::Minute, 10),
        ),
        cidr,
        rule("rule-4-match-0", "", policy(RateLimitUnit::Hour, 100)),
    ];
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![route],
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

/// One descriptor as Envoy builds it from a rule's actions: the route's generic key first.
fn descriptor(rest: &[(&str, &str)]) -> Descriptor {
    let mut entries = vec![entry(ROUTE, ROUTE)];
    entries.extend(rest.iter().map(|(k, v)| entry(k, v)));
    Descriptor {
        entries,
        ..Default::default()
    }
}

fn send(descriptors: Vec<Descriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn gateway_server() -> (Ads, TestServer) {
    let ads = Ads::start(None).await;
    ads.set("1", &[gateway_config()]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("unused");
    let url = ads.url();
    let t = common::start_at(dir, config, |s| {
        s.xds.config_type = ConfigType::GrpcXdsSotw;
        s.xds.xds_server_url = url;
        s.xds.xds_node_id = "envoy-ratelimit".into();
        // What CONFIG_TYPE=GRPC_XDS_SOTW sets (crates/app/src/reference_env.rs).
        s.defaults.default_algorithm = Algorithm::FixedWindow;
        s.defaults.charge_denied_hits = true;
    })
    .await;
    ads.wait_ack("1").await;
    (ads, t)
}

async fn overall(t: &mut TestServer, descriptors: Vec<Descriptor>) -> (Code, Vec<(Code, u32)>) {
    let r = t.call(send(descriptors)).await;
    let statuses = r
        .statuses
        .iter()
        .map(|s| (common::code(s.code), s.limit_remaining))
        .collect();
    (common::code(r.overall_code), statuses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_header_rule_counts_each_value() {
    let (_ads, mut t) = gateway_server().await;
    let alice = || descriptor(&[("rule-0-match-0", "alice")]);
    for remaining in [2, 1, 0] {
        assert_eq!(
            overall(&mut t, vec![alice()]).await,
            (Code::Ok, vec![(Code::Ok, remaining)])
        );
    }
    assert_eq!(overall(&mut t, vec![alice()]).await.0, Code::OverLimit);
    let bob = descriptor(&[("rule-0-match-0", "bob")]);
    assert_eq!(overall(&mut t, vec![bob]).await.0, Code::Ok);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_mode_rule_never_denies() {
    let (_ads, mut t) = gateway_server().await;
    let shadow = || descriptor(&[("rule-1-match-0", "rule-1-match-0")]);
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(overall(&mut t, vec![shadow()]).await.0);
    }
    assert_eq!(codes, [Code::Ok; 4]);
    // With an enforced rule over its limit in the same request, that one still denies.
    let user = || descriptor(&[("rule-0-match-0", "carol")]);
    for _ in 0..3 {
        overall(&mut t, vec![user()]).await;
    }
    let (code, statuses) = overall(&mut t, vec![shadow(), user()]).await;
    assert_eq!(code, Code::OverLimit);
    assert_eq!(statuses[1].0, Code::OverLimit);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cost_is_the_descriptor_s_hits_addend_and_zero_only_checks() {
    let (_ads, mut t) = gateway_server().await;
    let costing = |hits: u64| {
        let mut d = descriptor(&[("rule-2-match--1", "rule-2-match--1")]);
        d.hits_addend = Some(UInt64Value { value: hits });
        d
    };
    assert_eq!(
        overall(&mut t, vec![costing(4)]).await,
        (Code::Ok, vec![(Code::Ok, 6)])
    );
    // hits_addend 0: a check that charges nothing.
    assert_eq!(
        overall(&mut t, vec![costing(0)]).await,
        (Code::Ok, vec![(Code::Ok, 6)])
    );
    assert_eq!(
        overall(&mut t, vec![costing(4)]).await,
        (Code::Ok, vec![(Code::Ok, 2)])
    );
    assert_eq!(overall(&mut t, vec![costing(4)]).await.0, Code::OverLimit);
    // The denied cost was counted, as the reference counts it: the window is over (12 of 10)
    // for any cost, and for a check.
    assert_eq!(overall(&mut t, vec![costing(2)]).await.0, Code::OverLimit);
    assert_eq!(overall(&mut t, vec![costing(0)]).await.0, Code::OverLimit);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ai_gateway_token_cost_charged_at_stream_end_stays_spent_even_over_the_budget() {
    let (_ads, mut t) = gateway_server().await;
    // The request-time entry: hits_addend 0 (a check); the stream-done entry: the same
    // descriptor with the response's token count.
    let tokens = |user: &str, n: u64| {
        let mut d = descriptor(&[("rule-4-match-0", user)]);
        d.hits_addend = Some(UInt64Value { value: n });
        d
    };
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 0)]).await,
        (Code::Ok, vec![(Code::Ok, 100)])
    );
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 70)]).await,
        (Code::Ok, vec![(Code::Ok, 30)])
    );
    // Within budget still: the next request is let through, and its answer costs 45 tokens
    // against 30 left. Envoy ignores the answer of a stream-done call: the tokens are spent.
    assert_eq!(overall(&mut t, vec![tokens("alice", 0)]).await.0, Code::Ok);
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 45)]).await,
        (Code::OverLimit, vec![(Code::OverLimit, 0)])
    );
    // So alice's next requests are refused at request time, for the rest of the hour.
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 0)]).await.0,
        Code::OverLimit
    );
    t.clock.advance(std::time::Duration::from_secs(1800));
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 0)]).await.0,
        Code::OverLimit
    );
    // Another user's budget is their own.
    assert_eq!(
        overall(&mut t, vec![tokens("bob", 0)]).await,
        (Code::Ok, vec![(Code::Ok, 100)])
    );
    // The next hour's window starts afresh.
    t.clock.advance(std::time::Duration::from_secs(3600));
    assert_eq!(
        overall(&mut t, vec![tokens("alice", 0)]).await,
        (Code::Ok, vec![(Code::Ok, 100)])
    );
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_override_from_dynamic_metadata_replaces_the_rule_s_limit() {
    let (_ads, mut t) = gateway_server().await;
    let overridden = || {
        let mut d = descriptor(&[("rule-0-match-0", "dave")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: EnvoyUnit::Minute as i32,
        });
        d
    };
    assert_eq!(
        overall(&mut t, vec![overridden()]).await,
        (Code::Ok, vec![(Code::Ok, 0)])
    );
    assert_eq!(overall(&mut t, vec![overridden()]).await.0, Code::OverLimit);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_cidr_rule_counts_each_address_inside_the_mask() {
    let (_ads, mut t) = gateway_server().await;
    let from = |ip: &str| {
        descriptor(&[
            ("masked_remote_address", "10.0.0.0/8"),
            ("remote_address", ip),
        ])
    };
    assert_eq!(overall(&mut t, vec![from("10.1.2.3")]).await.0, Code::Ok);
    assert_eq!(
        overall(&mut t, vec![from("10.1.2.3")]).await.0,
        Code::OverLimit
    );
    assert_eq!(overall(&mut t, vec![from("10.9.9.9")]).await.0, Code::Ok);
    t.server.shutdown().await;
}
