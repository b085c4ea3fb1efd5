//! The request workers' number (`TOKIO_WORKER_THREADS`, `--worker-threads`): said at start-up and
//! used; a value that is not a whole number of at least 1 (empty included) stops the start naming
//! the setting, where tokio, left to read it, panicked.

use crate::common;

use common::process::Served;
use common::{Code, code, request};

const RULES: &str =
    "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[tokio::test]
async fn the_workers_number_is_taken_and_said_at_start_up() {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("w.yaml"), RULES).unwrap();
    let mut server = Served::with_env(rules.path(), &[("TOKIO_WORKER_THREADS", "1".into())]);
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = client
            .should_rate_limit(request("w", &[&[("k", "v")]]))
            .await
            .unwrap();
        codes.push(code(answer.get_ref().overall_code));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(server.log_lines("workers=1"), 1, "{}", server.log());
}

#[tokio::test]
async fn a_bad_workers_number_stops_the_start_naming_it_without_a_panic() {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("w.yaml"), RULES).unwrap();
    for value in ["", "0", "two", "-1"] {
        let mut served = Served::with_env(rules.path(), &[("TOKIO_WORKER_THREADS", value.into())]);
        assert!(!served.wait_exit().success(), "{value:?}");
        let log = served.log();
        assert!(log.contains("--worker-threads"), "{value:?}: {log}");
        assert!(log.contains("at least 1"), "{value:?}: {log}");
        assert!(!log.contains("panicked"), "{value:?}: {log}");
    }
}
