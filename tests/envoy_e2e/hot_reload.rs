//! Through Envoy: editing the rules file changes what Envoy enforces, within a second, with no
//! restart of either process.

use std::time::{Duration, Instant};

use crate::harness::{Stack, shout};
use crate::http;
use crate::limits::{assert_limited, assert_passed};

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

/// The promise: an edit is in force within a second (100 ms debounce plus a reload).
const PROMISED: Duration = Duration::from_secs(1);
/// How long the test polls, so that a slow reload is reported with its latency, not just "no".
const POLL_DEADLINE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_edit_of_the_rules_changes_what_envoy_enforces_within_a_second() {
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
    let edited = Instant::now();
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
        "hot edit: Envoy enforced the new rules {latency:?} after the file was written"
    ));
    assert_passed(&response, "4, 4;w=86400", 1);
    assert!(
        latency <= PROMISED,
        "the edit took {latency:?} to take effect, more than {PROMISED:?}"
    );
    assert_passed(&http::get(port, "/", &k1).await.unwrap(), "4, 4;w=86400", 0);
    assert_limited(&http::get(port, "/", &k1).await.unwrap(), "4, 4;w=86400");
}
