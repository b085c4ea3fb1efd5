//! Whether the Redis connected to may evict the counters when it is full: with a `maxmemory` and
//! any `maxmemory-policy` but `noeviction` (every key here carries a TTL, so the `volatile-*`
//! policies take them too). A counter evicted starts afresh, so the keys under memory pressure
//! are admitted past their limits with nothing said anywhere. Read once connected (`INFO memory`,
//! of every node on a cluster) and said at start-up; not refused, as a shared cache may be meant
//! to evict.

use std::sync::Arc;

use crate::calls::Calls;
use crate::conn::RedisConfig;

/// How a server evicts, where its `INFO memory` says it does: its policy and `maxmemory`
/// (as Redis writes it for people, `maxmemory_human`, else in bytes). `None` where it never
/// evicts: no `maxmemory` (0), or `noeviction`, or the fields are not there.
fn evicting(info: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name).map(str::trim))
    };
    let bytes: u64 = field("maxmemory:")?.parse().ok()?;
    let policy = field("maxmemory_policy:")?;
    if bytes == 0 || policy == "noeviction" {
        return None;
    }
    let size = field("maxmemory_human:").map_or_else(|| format!("{bytes}B"), str::to_owned);
    Some((policy.to_owned(), size))
}

/// Each node's `INFO memory` text: a server's own, or every node's of a cluster.
fn texts(reply: ::redis::Value) -> Vec<String> {
    match reply {
        ::redis::Value::Map(nodes) => nodes.into_iter().flat_map(|(_, v)| texts(v)).collect(),
        other => ::redis::from_redis_value(other).into_iter().collect(),
    }
}

/// Warns if the server `calls` reach (any node of a cluster) evicts keys when full. Says nothing
/// if it does not answer `INFO` (an ACL, a timeout).
pub(crate) async fn warn_if_evicting(calls: &Arc<Calls>, config: &RedisConfig) {
    let mut c = calls.conn();
    let ask = ::redis::cmd("INFO").arg("memory").clone();
    let Ok(reply) = calls
        .quiet(async move { ask.query_async::<::redis::Value>(&mut c).await })
        .await
    else {
        return;
    };
    let nodes = texts(reply);
    let evicting: Vec<(String, String)> = nodes.iter().filter_map(|t| evicting(t)).collect();
    let Some((policy, maxmemory)) = evicting.first() else {
        return;
    };
    tracing::warn!(
        redis = %config.describe(),
        maxmemory_policy = %policy,
        %maxmemory,
        nodes = format!("{} of {}", evicting.len(), nodes.len()),
        "Redis evicts keys when it reaches maxmemory: a counter evicted starts afresh, so keys \
         are admitted past their limits while Redis is full, with nothing said. Set \
         maxmemory-policy noeviction (a full Redis then refuses writes and REDIS_FAILURE_MODE \
         answers, counted in ratelimit_store_errors), or give Redis room for every counter"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bounded_server_that_evicts_is_told() {
        let lru = "# Memory\r\nused_memory:1000\r\nmaxmemory:104857600\r\n\
                   maxmemory_human:100.00M\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(
            evicting(lru),
            Some(("allkeys-lru".to_owned(), "100.00M".to_owned()))
        );
        let ttl = "maxmemory:2048\r\nmaxmemory_policy:volatile-ttl\r\n";
        assert_eq!(
            evicting(ttl),
            Some(("volatile-ttl".to_owned(), "2048B".to_owned()))
        );
        // Unbounded (Redis's default), or bounded but refusing writes when full.
        assert_eq!(
            evicting("maxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n"),
            None
        );
        assert_eq!(
            evicting("maxmemory:2048\r\nmaxmemory_policy:noeviction\r\n"),
            None
        );
        assert_eq!(evicting("# Memory\r\n"), None);
    }

    #[test]
    fn a_clusters_reply_gives_every_nodes_text() {
        use ::redis::Value;
        let node = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let cluster = Value::Map(vec![
            (node("10.0.0.1:6379"), node("maxmemory:0\r\n")),
            (node("10.0.0.2:6379"), node("maxmemory:1\r\n")),
        ]);
        assert_eq!(texts(cluster), ["maxmemory:0\r\n", "maxmemory:1\r\n"]);
        assert_eq!(texts(node("maxmemory:2\r\n")), ["maxmemory:2\r\n"]);
    }
}
