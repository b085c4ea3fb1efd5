//! Which master serves each Redis Cluster slot, as `CLUSTER SLOTS` last said: a key's shard, by
//! which the guard keeps a breaker per master (a dead master's keys go to the failure mode while
//! the other masters' keys stay on Redis). Read when the store connects and every
//! [`REFRESH_EVERY`] after, in a task of its own, so a promoted replica is a new shard within
//! a second; parsing is pure ([`owners`]).

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::Value;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use arc_swap::ArcSwap;
use ratelimit_remote::Shard;

use crate::io::within;
use crate::slot::{SLOTS, slot};

/// How often the slots' masters are read again.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The shard of a slot no master serves (its keys fail until one does).
const UNSERVED: Shard = Shard(0);

/// The master of every slot, as last read (none until the first read: no shard, the store-wide
/// breaker alone).
pub(crate) struct Masters {
    by_slot: ArcSwap<Vec<Shard>>,
}

impl Masters {
    pub(crate) fn new() -> Masters {
        Masters {
            by_slot: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// The shard of `key`: the master serving its slot (`None` before the first read).
    pub(crate) fn shard_of(&self, key: &str) -> Option<Shard> {
        let by_slot = self.by_slot.load();
        by_slot.get(usize::from(slot(key.as_bytes()))).copied()
    }

    /// Reads the slots' masters now and then every [`REFRESH_EVERY`], until `masters` is dropped
    /// (run in a task of its own). A read that fails keeps the last map.
    pub(crate) async fn follow(masters: Weak<Masters>, conn: ClusterConnection, timeout: Duration) {
        loop {
            let Some(alive) = masters.upgrade() else {
                return;
            };
            let mut c = conn.clone();
            let read = within(timeout, async move {
                c.route_command(
                    ::redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await
            })
            .await;
            if let Ok(Ok(reply)) = read
                && let Some(by_slot) = owners(&reply)
            {
                alive.by_slot.store(Arc::new(by_slot));
            }
            drop(alive);
            tokio::time::sleep(REFRESH_EVERY).await;
        }
    }
}

/// The shard of every slot from a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id…],
/// replicas…]…]`): the master's address, hashed; [`UNSERVED`] where no range names a master.
/// `None` when the reply is not such a list.
pub(crate) fn owners(reply: &Value) -> Option<Vec<Shard>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut by_slot = vec![UNSERVED; usize::from(SLOTS)];
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let [start, end, master, ..] = fields.as_slice() else {
            return None;
        };
        let (Value::Int(start), Value::Int(end)) = (start, end) else {
            return None;
        };
        let Value::Array(node) = master else {
            return None;
        };
        let [host, port, ..] = node.as_slice() else {
            return None;
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let Value::Int(port) = port else {
            return None;
        };
        let shard = shard_of_master(&host, *port);
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        if start > end || end >= by_slot.len() {
            return None;
        }
        by_slot[start..=end].fill(shard);
    }
    Some(by_slot)
}

/// A master's shard: its address, hashed (never [`UNSERVED`]).
fn shard_of_master(host: &str, port: i64) -> Shard {
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one((host, port));
    Shard(hash.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(port + 100), bulk("r")]),
        ])
    }

    #[test]
    fn each_slot_is_its_master_s_and_a_promoted_replica_is_a_new_shard() {
        let three = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
        ]);
        let by_slot = owners(&three).unwrap();
        assert_eq!(by_slot[0], by_slot[5460]);
        assert_ne!(by_slot[5460], by_slot[5461]);
        assert_ne!(by_slot[10922], by_slot[10923]);
        assert!(by_slot.iter().all(|s| *s != UNSERVED));
        // 7000's replica (7100) promoted.
        let after = Value::Array(vec![
            range(0, 5460, 7100),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
        ]);
        let after = owners(&after).unwrap();
        assert_ne!(after[0], by_slot[0]);
        assert_eq!(after[5461], by_slot[5461]);
    }

    #[test]
    fn slots_no_master_serves_are_unserved_and_garbage_is_refused() {
        let partial = owners(&Value::Array(vec![range(0, 99, 7000)])).unwrap();
        assert_ne!(partial[99], UNSERVED);
        assert_eq!(partial[100], UNSERVED);
        assert_eq!(owners(&Value::Nil), None);
        assert_eq!(owners(&Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(owners(&Value::Array(vec![range(5, 16384, 7000)])), None);
        assert_eq!(owners(&Value::Array(vec![range(9, 5, 7000)])), None);
    }

    #[test]
    fn a_key_s_shard_is_none_until_the_first_read() {
        let masters = Masters::new();
        assert_eq!(masters.shard_of("k"), None);
        masters.by_slot.store(Arc::new(
            owners(&Value::Array(vec![range(0, 16383, 7000)])).unwrap(),
        ));
        assert!(masters.shard_of("k").is_some());
    }
}
