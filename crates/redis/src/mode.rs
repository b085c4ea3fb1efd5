//! Whether the server connected to runs as `REDIS_TYPE` says. A Redis Sentinel or a Redis Cluster
//! node named in `REDIS_URL` with `REDIS_TYPE=single` answers the first `PING`, then refuses
//! every decision (`unknown command 'EVALSHA'`) or redirects it (`MOVED`): the server ran on its
//! failure mode for good, the log naming neither. Asked once connected (`INFO server`, its
//! `redis_mode`, Valkey's `server_mode`); a mismatch is a refusal (the settings must change). A
//! replica named as a single server refuses every write (`READONLY`) until it is promoted, which
//! a failover may do: said at start-up with its master (`INFO replication`), not refused.

use std::sync::Arc;

use ratelimit_core::store::StoreError;

use crate::calls::Calls;
use crate::conn::{RedisConfig, Topology};

/// What `INFO server` says the server runs as (`standalone`, `cluster`, `sentinel`).
fn mode(info: &str) -> Option<&str> {
    info.lines().find_map(|line| {
        line.strip_prefix("redis_mode:")
            .or_else(|| line.strip_prefix("server_mode:"))
            .map(str::trim)
    })
}

/// What is wrong when a server running as `mode` is reached as `config` says, if anything.
fn mismatch(config: &RedisConfig, mode: &str) -> Option<String> {
    let addr = match &config.topology {
        Topology::Single(info) => info.addr().to_string(),
        Topology::Sentinel { master, .. } => {
            return (mode != "standalone").then(|| {
                format!("the master '{master}' the sentinels name runs as {mode}, not standalone")
            });
        }
        Topology::Cluster(_) => return None,
    };
    match mode {
        "sentinel" => Some(format!(
            "REDIS_URL {addr} is a Redis Sentinel, not a Redis server: set REDIS_TYPE=sentinel \
             and REDIS_URL to the master's name and the sentinels (`<master name>,{addr}`)"
        )),
        "cluster" => Some(format!(
            "REDIS_URL {addr} is a node of a Redis Cluster: set REDIS_TYPE=cluster (REDIS_URL: \
             its nodes, comma-separated)"
        )),
        _ => None,
    }
}

/// What `INFO server` says of the server `calls` reach (on a cluster, of one of its nodes);
/// `None` if it does not answer (an ACL, a timeout).
pub(crate) async fn server_info(calls: &Arc<Calls>) -> Option<String> {
    let mut c = calls.conn();
    let info = ::redis::cmd("INFO").arg("server").clone();
    let reply = calls
        .quiet(async move { info.query_async::<::redis::Value>(&mut c).await })
        .await
        .ok()?;
    text(reply)
}

/// The text of an `INFO` reply: a node's own, or the first of a cluster's nodes'.
fn text(reply: ::redis::Value) -> Option<String> {
    match reply {
        ::redis::Value::Map(nodes) => nodes.into_iter().find_map(|(_, info)| text(info)),
        other => ::redis::from_redis_value(other).ok(),
    }
}

/// Fails with `Unavailable` (a refusal: start-up stops) if the server, as `info` (its
/// `server_info`) says, runs otherwise than `config` says. A server that did not answer `INFO`
/// is taken as it is: the decisions' own calls will tell.
pub(crate) fn check(info: Option<&str>, config: &RedisConfig) -> Result<(), StoreError> {
    if matches!(config.topology, Topology::Cluster(_)) {
        return Ok(());
    }
    match info.and_then(mode).and_then(|mode| mismatch(config, mode)) {
        Some(wrong) => Err(StoreError::Unavailable(wrong)),
        None => Ok(()),
    }
}

/// The master's address where `info` (`INFO replication`) says the server is a replica.
fn replica_of(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name).map(str::trim))
    };
    (field("role:")? == "slave").then(|| {
        format!(
            "{}:{}",
            field("master_host:").unwrap_or("?"),
            field("master_port:").unwrap_or("?")
        )
    })
}

/// Warns if the server `calls` reach, named as a single server in `config`, is a replica: every
/// decision is then answered by the failure mode until it is promoted.
pub(crate) async fn warn_if_replica(calls: &Arc<Calls>, config: &RedisConfig) {
    let Topology::Single(info) = &config.topology else {
        return;
    };
    let mut c = calls.conn();
    let ask = ::redis::cmd("INFO").arg("replication").clone();
    let Ok(replication) = calls
        .quiet(async move { ask.query_async::<String>(&mut c).await })
        .await
    else {
        return;
    };
    if let Some(master) = replica_of(&replication) {
        tracing::warn!(
            redis = %info.addr(),
            %master,
            "REDIS_URL names a replica: it refuses every write (READONLY), so decisions are \
             answered by REDIS_FAILURE_MODE until it is promoted. Set REDIS_URL to the master, or \
             REDIS_TYPE=sentinel with the sentinels that follow it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_read_from_redis_and_valkey() {
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_mode:sentinel\r\nos:Linux\r\n";
        assert_eq!(mode(redis), Some("sentinel"));
        let valkey = "# Server\r\nvalkey_version:8.1.1\r\nserver_mode:standalone\r\n";
        assert_eq!(mode(valkey), Some("standalone"));
        assert_eq!(mode("# Server\r\n"), None);
    }

    #[test]
    fn a_replica_is_told_with_its_master() {
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.5\r\nmaster_port:6379\r\n";
        assert_eq!(replica_of(replica).as_deref(), Some("10.0.0.5:6379"));
        assert_eq!(
            replica_of("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n"),
            None
        );
        assert_eq!(replica_of(""), None);
    }

    #[test]
    fn only_a_server_of_another_kind_is_a_mismatch() {
        let single = RedisConfig::single("redis://127.0.0.1:26379/").unwrap();
        assert_eq!(mismatch(&single, "standalone"), None);
        let sentinel = mismatch(&single, "sentinel").unwrap();
        assert!(
            sentinel.contains("is a Redis Sentinel") && sentinel.contains("REDIS_TYPE=sentinel"),
            "{sentinel}"
        );
        let cluster = mismatch(&single, "cluster").unwrap();
        assert!(cluster.contains("REDIS_TYPE=cluster"), "{cluster}");
    }
}
