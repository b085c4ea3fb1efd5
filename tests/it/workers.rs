//! The request workers' number (`TOKIO_WORKER_THREADS`, `--worker-threads`): said at start-up and
//! used; a value that is not a whole number of at least 1 (empty included) stops the start naming
//! the setting, where tokio, left to read it, panicked. Calls from several connections at once
//! share one limit exactly.

use crate::common;

use common::process::Served;
use common::race::{SHARED_LIMITS, fire, shared_rules};

#[tokio::test]
async fn the_workers_number_is_taken_and_said_at_start_up() {
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &[("TOKIO_WORKER_THREADS", "1".into())]);
    let (key, limit) = SHARED_LIMITS[0];
    let admitted = fire(server.client().await, key, "u".into(), limit + 10, 8).await;
    assert_eq!(admitted, limit, "one worker decides exactly");
    assert_eq!(server.log_lines("workers=1"), 1, "{}", server.log());
}

#[tokio::test]
async fn a_bad_workers_number_stops_the_start_naming_it_without_a_panic() {
    let rules = shared_rules();
    for value in ["", "0", "two", "-1"] {
        let mut served = Served::with_env(rules.path(), &[("TOKIO_WORKER_THREADS", value.into())]);
        assert!(!served.wait_exit().success(), "{value:?}");
        let log = served.log();
        assert!(log.contains("--worker-threads"), "{value:?}: {log}");
        assert!(log.contains("at least 1"), "{value:?}: {log}");
        assert!(!log.contains("panicked"), "{value:?}: {log}");
    }
}

/// Each gRPC connection's calls run in that connection's own task (`net::connection_calls`):
/// calls from several connections at once, on two workers, still share one limit exactly, for
/// every algorithm.
#[tokio::test]
async fn calls_of_several_connections_share_one_limit_exactly() {
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &[("TOKIO_WORKER_THREADS", "2".into())]);
    for (key, limit) in SHARED_LIMITS {
        let mut fired = Vec::new();
        for _ in 0..6 {
            let client = server.client().await;
            fired.push(tokio::spawn(fire(client, key, "u".into(), limit, 8)));
        }
        let mut admitted = 0;
        for one in fired {
            admitted += one.await.expect("a client's calls");
        }
        assert_eq!(
            admitted, limit,
            "{key}: 6 connections, 8 calls in flight each"
        );
    }
}
