//! The request workers' number (`TOKIO_WORKER_THREADS`, `--worker-threads`): said at start-up and
//! used; a value that is not a whole number of at least 1 (empty included) stops the start naming
//! the setting, where tokio, left to read it, panicked. And the gRPC lanes (`GRPC_LANES`,
//! `--grpc-lanes`): none unless set, said at start-up; connections spread over several lanes share
//! one limit exactly; 0 serves connections on the workers.

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
    // No gRPC lanes unless set.
    assert_eq!(server.log_lines("grpc_lanes=0"), 1, "{}", server.log());
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

/// Admitted calls of `count` on `key`, sent by `connections` clients at once (each its own
/// connection, so the connections take different lanes), 8 in flight on each.
async fn fire_from_connections(
    server: &mut Served,
    connections: usize,
    key: &'static str,
    count: usize,
) -> usize {
    let mut fired = Vec::new();
    for _ in 0..connections {
        let client = server.client().await;
        fired.push(tokio::spawn(fire(client, key, "u".into(), count, 8)));
    }
    let mut admitted = 0;
    for one in fired {
        admitted += one.await.expect("a client's calls");
    }
    admitted
}

#[tokio::test]
async fn connections_on_several_lanes_share_one_limit_exactly() {
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &[("GRPC_LANES", "3".into())]);
    for (key, limit) in SHARED_LIMITS {
        let admitted = fire_from_connections(&mut server, 6, key, limit).await;
        assert_eq!(admitted, limit, "{key}: 6 connections on 3 lanes");
    }
    server.wait_ready().await;
    assert_eq!(server.log_lines("grpc_lanes=3"), 1, "{}", server.log());
}

#[tokio::test]
async fn no_lanes_serves_connections_on_the_workers_exactly() {
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &[("GRPC_LANES", "0".into())]);
    let (key, limit) = SHARED_LIMITS[0];
    let admitted = fire_from_connections(&mut server, 3, key, limit).await;
    assert_eq!(admitted, limit);
    server.wait_ready().await;
    assert_eq!(server.log_lines("grpc_lanes=0"), 1, "{}", server.log());
}

#[tokio::test]
async fn a_bad_lanes_number_stops_the_start_naming_it() {
    let rules = shared_rules();
    for value in ["", "two", "-1"] {
        let mut served = Served::with_env(rules.path(), &[("GRPC_LANES", value.into())]);
        assert!(!served.wait_exit().success(), "{value:?}");
        let log = served.log();
        assert!(log.contains("--grpc-lanes"), "{value:?}: {log}");
        assert!(!log.contains("panicked"), "{value:?}: {log}");
    }
}
