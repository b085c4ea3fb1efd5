//! The rest of envoyproxy/ratelimit's config language over real gRPC, one rules fixture each
//! (`tests/fixtures/reference/`): quota_mode (and the global QUOTA_MODE), share_threshold,
//! value_to_metric and detailed_metric labels, metadata in the dynamic metadata, and unlimited
//! with requests_per_unit.

use crate::common;

use common::{Code, code, request, start, start_with};
use envoy_types::pb::google::protobuf::value::Kind as V;
use envoy_types::pb::google::protobuf::{Struct, Value};

const QUOTA: &str = include_str!("../fixtures/reference/quota_mode.yaml");
const SHARE: &str = include_str!("../fixtures/reference/share_threshold.yaml");
const METADATA: &str = include_str!("../fixtures/reference/metadata.yaml");
const UNLIMITED: &str = include_str!("../fixtures/reference/unlimited_with_requests_per_unit.yaml");
const VALUE_TO_METRIC: &str = include_str!("../fixtures/reference/value_to_metric.yaml");

fn codes(
    r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> (Code, Vec<Code>) {
    (
        code(r.overall_code),
        r.statuses.iter().map(|s| code(s.code)).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_descriptor_over_its_limit_denies_only_when_every_quota_one_is() {
    let mut s = start(&[("quota.yaml", QUOTA)]).await;
    let both = request("quota", &[&[("backend", "a")], &[("backend", "b")]]);
    // a: 1/hour, b: 2/hour.
    let r = s.call(both.clone()).await;
    assert_eq!(codes(&r), (Code::Ok, vec![Code::Ok, Code::Ok]));
    // a is over, b still fits: OK overall, a's own status says OVER_LIMIT.
    let r = s.call(both.clone()).await;
    assert_eq!(codes(&r), (Code::Ok, vec![Code::OverLimit, Code::Ok]));
    // both over: denied.
    let r = s.call(both.clone()).await;
    assert_eq!(
        codes(&r),
        (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit])
    );
    // A non-quota descriptor over its limit denies whatever the quota ones say.
    let mixed = request("quota", &[&[("backend", "b")], &[("strict", "s")]]);
    let fresh = request("quota", &[&[("strict", "s")]]);
    assert_eq!(code(s.call(fresh).await.overall_code), Code::Ok);
    let r = s.call(mixed).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_quota_mode_makes_every_descriptor_a_quota_one() {
    let mut s = start_with(&[("quota.yaml", QUOTA)], |settings| {
        settings.quota_mode = true
    })
    .await;
    let r = request("quota", &[&[("strict", "x")], &[("user", "u")]]);
    assert_eq!(code(s.call(r.clone()).await.overall_code), Code::Ok);
    // strict is over, user is not: still OK.
    let answer = s.call(r).await;
    assert_eq!(codes(&answer), (Code::Ok, vec![Code::OverLimit, Code::Ok]));
    // Alone, strict over is every quota descriptor over.
    let alone = request("quota", &[&[("strict", "x")]]);
    assert_eq!(code(s.call(alone).await.overall_code), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_values_share_one_counter() {
    let mut s = start(&[("share.yaml", SHARE)]).await;
    assert_eq!(
        s.hit("share", &[("files", "shared/a.pdf")]).await,
        (Code::Ok, 1)
    );
    assert_eq!(
        s.hit("share", &[("files", "shared/b.csv")]).await,
        (Code::Ok, 0)
    );
    assert_eq!(
        s.hit("share", &[("files", "shared/c")]).await.0,
        Code::OverLimit
    );
    // Without share_threshold, each value has its own counter.
    assert_eq!(s.hit("share", &[("files", "own/a")]).await, (Code::Ok, 1));
    assert_eq!(s.hit("share", &[("files", "own/b")]).await, (Code::Ok, 1));
}

fn field<'a>(s: &'a Struct, name: &str) -> &'a V {
    s.fields
        .get(name)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("no field {name} in {s:?}"))
}

fn text(v: &V) -> &str {
    match v {
        V::StringValue(s) => s,
        other => panic!("not a string: {other:?}"),
    }
}

fn object(v: &V) -> &Struct {
    match v {
        V::StructValue(s) => s,
        other => panic!("not a struct: {other:?}"),
    }
}

fn items(v: &V) -> &[Value] {
    match v {
        V::ListValue(l) => &l.values,
        other => panic!("not a list: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_of_passing_descriptors_is_returned_in_dynamic_metadata() {
    let mut s = start_with(&[("meta.yaml", METADATA)], |settings| {
        settings.response_dynamic_metadata = true;
    })
    .await;
    let mut r = request("meta", &[&[("backend", "a")], &[("backend", "b")]]);
    r.hits_addend = 1;
    let answer = s.call(r.clone()).await;
    let m = answer.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(field(&m, "domain")), "meta");
    let descriptors = items(field(&m, "descriptors"));
    assert_eq!(descriptors.len(), 2);
    let first = object(descriptors[0].kind.as_ref().unwrap());
    assert_eq!(
        text(items(field(first, "entries"))[0].kind.as_ref().unwrap()),
        "backend=a"
    );
    assert_eq!(field(&m, "hitsAddend"), &V::NumberValue(1.0));
    // Both passed: a's values first, b adds what a lacks (mappings merge).
    let merged = object(field(&m, "metadata"));
    assert_eq!(text(field(merged, "name")), "service_a");
    assert_eq!(field(merged, "weight"), &V::NumberValue(2.0));
    let labels = object(field(merged, "labels"));
    assert_eq!(text(field(labels, "tier")), "gold");
    assert_eq!(text(field(labels, "region")), "eu");
    // a is now over (quota: the request still passes): only b's metadata.
    let answer = s.call(r).await;
    assert_eq!(code(answer.overall_code), Code::Ok);
    let m = answer.dynamic_metadata.expect("dynamic metadata");
    let merged = object(field(&m, "metadata"));
    assert_eq!(text(field(merged, "name")), "service_b");
    assert!(!merged.fields.contains_key("weight"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_dynamic_metadata_unless_enabled() {
    let mut s = start(&[("meta.yaml", METADATA)]).await;
    let answer = s.call(request("meta", &[&[("backend", "b")]])).await;
    assert!(answer.dynamic_metadata.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_with_requests_per_unit_loads_and_is_unlimited() {
    let mut s = start(&[("unlimited.yaml", UNLIMITED)]).await;
    for _ in 0..20 {
        assert_eq!(
            s.hit("unlimited", &[("internal", "x")]).await,
            (Code::Ok, u32::MAX)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_and_detailed_metric_label_rule_series() {
    let mut s = start(&[("vtm.yaml", VALUE_TO_METRIC)]).await;
    s.call(request("vtm", &[&[("route", "r1"), ("method", "GET")]]))
        .await;
    s.call(request("vtm", &[&[("path", "/api/users")]])).await;
    s.call(request("vtm", &[&[("client", "c7")]])).await;
    let text = reqwest::get(s.http("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (rule, keys) in [
        ("route_r1.method", r#"key1="route_r1",key2="method""#),
        ("path_/api/users", r#"key1="path_/api/users""#),
        ("client_c7", r#"key1="client_c7""#),
    ] {
        let series = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"vtm\",rule=\"{rule}\",{keys}}} 1"
        );
        assert!(text.contains(&series), "missing {series} in:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_serves_one_domain_from_several_files() {
    let files = [
        (
            "merge_a.yaml",
            include_str!("../fixtures/reference/merge_a.yaml"),
        ),
        (
            "merge_b.yaml",
            include_str!("../fixtures/reference/merge_b.yaml"),
        ),
    ];
    let mut s = start_with(&files, |settings| {
        settings.rules_files.merge_domain_config = true;
    })
    .await;
    assert_eq!(s.hit("merged", &[("a", "x")]).await, (Code::Ok, 0));
    assert_eq!(s.hit("merged", &[("b", "x")]).await, (Code::Ok, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_with_at_least_one_config_loaded_fails_health_without_rules() {
    let health = |s: &common::TestServer| {
        let url = s.http("/healthcheck");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    let empty = start_with(&[], |settings| {
        settings.healthy_with_at_least_one_config_loaded = true;
    })
    .await;
    assert_eq!(health(&empty).await, 500);
    let loaded = start_with(&[("share.yaml", SHARE)], |settings| {
        settings.healthy_with_at_least_one_config_loaded = true;
    })
    .await;
    assert_eq!(health(&loaded).await, 200);
    let default = start(&[]).await;
    assert_eq!(health(&default).await, 200, "off by default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_endpoint_returns_the_dynamic_metadata_too() {
    let s = start_with(&[("meta.yaml", METADATA)], |settings| {
        settings.response_dynamic_metadata = true;
    })
    .await;
    let body = r#"{"domain":"meta","descriptors":[{"entries":[{"key":"backend","value":"b"}]}]}"#;
    let answer: serde_json::Value = reqwest::Client::new()
        .post(s.http("/json"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["dynamicMetadata"]["metadata"]["name"], "service_b",
        "{answer}"
    );
    assert_eq!(
        answer["dynamicMetadata"]["descriptors"][0]["entries"][0],
        "backend=b"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_without_initial_config_serves_until_the_rules_are_fixed() {
    let broken = "domain: share\ndescriptors:\n  - key: files\n    rate_limit: {unit: fortnight}\n";
    let mut s = start_with(&[("share.yaml", broken)], |settings| {
        settings.force_start_without_initial_config = true;
    })
    .await;
    // No rules in force: an unknown domain, allowed without a limit.
    let r = s.call(request("share", &[&[("files", "shared/a")]])).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    std::fs::write(s.dir.path().join("share.yaml"), SHARE).unwrap();
    s.eventually("fixed rules", |mut c| async move {
        c.should_rate_limit(request("share", &[&[("files", "own/x")]]))
            .await
            .is_ok_and(|r| r.into_inner().statuses[0].current_limit.is_some())
    })
    .await;
}
