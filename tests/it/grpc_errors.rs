//! Bad input over real gRPC: INVALID_ARGUMENT with a message, never a panic.

use crate::common;

use common::{descriptor, request, start};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Code as GrpcCode;

const RULES: &str =
    "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

#[tokio::test]
async fn empty_domain_and_missing_descriptors_are_invalid_arguments() {
    let mut s = start(&[("api.yaml", RULES)]).await;
    let e = s.call_err(request("", &[&[("k", "v")]])).await;
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(
        e.message().contains("domain must not be empty"),
        "{}",
        e.message()
    );
    let e = s.call_err(request("api", &[])).await;
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(e.message().contains("descriptor list must not be empty"));
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let mut s = start(&[("api.yaml", RULES)]).await;
    let many: Vec<_> = (0..65).map(|_| descriptor(&[("k", "v")])).collect();
    let e = s
        .call_err(RateLimitRequest {
            domain: "api".into(),
            descriptors: many,
            hits_addend: 0,
        })
        .await;
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(
        e.message().contains("too many descriptors: 65"),
        "{}",
        e.message()
    );

    let entries: Vec<(&str, &str)> = (0..33).map(|_| ("k", "v")).collect();
    let e = s.call_err(request("api", &[&entries])).await;
    assert!(e.message().contains("too many entries"), "{}", e.message());

    let long = "x".repeat(4097);
    let e = s.call_err(request("api", &[&[("k", &long)]])).await;
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(e.message().contains("4097 bytes"), "{}", e.message());
    let e = s.call_err(request(&long, &[&[("k", "v")]])).await;
    assert!(
        e.message().contains("domain is 4097 bytes"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn override_without_unit_and_negative_hits_are_refused() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let mut s = start(&[("api.yaml", RULES)]).await;
    let mut d = descriptor(&[("k", "v")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let e = s
        .call_err(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await;
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(e.message().contains("no unit"));
    let mut d = descriptor(&[("k", "v")]);
    d.is_negative_hits = true;
    let e = s
        .call_err(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await;
    assert!(e.message().contains("is_negative_hits"));
}

#[tokio::test]
async fn the_server_keeps_serving_after_bad_requests() {
    let mut s = start(&[("api.yaml", RULES)]).await;
    s.call_err(request("", &[])).await;
    let r = s.call(request("api", &[&[("k", "v")]])).await;
    assert_eq!(r.statuses.len(), 1);
}
