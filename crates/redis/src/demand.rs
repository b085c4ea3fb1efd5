//! The RLQS demand exchange: per round, Redis's time (`TIME`, so the instances' clocks need not
//! agree), then per bucket one pipeline that writes this instance's demand into the bucket's hash
//! (field: the instance, value: `demand:ms`), renews the key's TTL and reads every field back;
//! fields older than the TTL (their instance gone or cut off for that long) are then deleted (had
//! that instance written again in between, its entry is missing for one round). The
//! instances' hash (their beats) is the same write with no demand. Every key written carries a
//! TTL ([`KEY_TTL_MS`]). Plain commands, no script: these calls are not the counters' and show
//! apart from them in Redis's command statistics; nor are they counted in the store's
//! `ratelimit_redis_*` series (the RLQS service counts its failed exchanges).

use std::collections::HashMap;
use std::sync::Arc;

use ratelimit_core::quota::fraction::{InstanceId, Peer, STALE_AFTER_MS};
use ratelimit_core::store::StoreError;

use crate::calls::Calls;
use crate::key::{TextKey, TextKeyBuilder};

/// A demand hash lives this long after its last write; its fields are dropped once older.
const KEY_TTL_MS: u64 = 2 * STALE_AFTER_MS;

/// What a bucket's hash held after this instance's write.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Redis's time at the round's start, in ms.
    pub now_ms: u64,
    /// Every instance's entry, this one's included (unreadable fields are left out).
    pub peers: Vec<Peer>,
}

/// One round of the exchange for one instance, at Redis's time (read once, when the round
/// starts): the instance's beat in the instances' hash, and its demand per bucket. Cheap to
/// clone; each call is bounded by `REDIS_TIMEOUT`.
#[derive(Clone)]
pub struct DemandRound {
    calls: Arc<Calls>,
    keys: TextKeyBuilder,
    instance: InstanceId,
    now_ms: u64,
}

impl DemandRound {
    /// Starts a round for `instance`: reads Redis's time.
    pub(crate) async fn start(
        calls: Arc<Calls>,
        keys: TextKeyBuilder,
        instance: InstanceId,
    ) -> Result<DemandRound, StoreError> {
        let now_ms = time_ms(&calls).await?;
        Ok(DemandRound {
            calls,
            keys,
            instance,
            now_ms,
        })
    }

    /// Says this instance is alive in the instances' hash (one registry of the server instances
    /// on this Redis, which the failure mode's shares read too) and returns every instance's beat.
    pub async fn beat(&self) -> Result<Snapshot, StoreError> {
        self.write(&self.keys.instances_key(), 0.0).await
    }

    /// Writes this instance's `demand` (requests per second) for the RLQS bucket of `domain` and
    /// `entries` (sorted by the caller) and returns what its hash holds then.
    pub async fn bucket(
        &self,
        domain: &str,
        entries: &[(String, String)],
        demand: f64,
    ) -> Result<Snapshot, StoreError> {
        self.write(&self.keys.quota_key(domain, entries), demand)
            .await
    }

    /// Writes this instance's `demand` into the hash at `key` at the round's time and returns
    /// what it holds then; entries older than the TTL are deleted.
    async fn write(&self, key: &TextKey, demand: f64) -> Result<Snapshot, StoreError> {
        let demand = if demand.is_finite() && demand > 0.0 {
            demand
        } else {
            0.0
        };
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET")
            .arg(key.as_str())
            .arg(field(self.instance))
            .arg(format!("{demand:.6}:{}", self.now_ms))
            .ignore()
            .cmd("PEXPIRE")
            .arg(key.as_str())
            .arg(KEY_TTL_MS)
            .ignore()
            .cmd("HGETALL")
            .arg(key.as_str());
        let mut c = self.calls.conn();
        let (fields,): (HashMap<String, String>,) = self
            .calls
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        let (snapshot, stale) = parse(self.now_ms, fields);
        if !stale.is_empty() {
            // Best effort: a field left over is deleted by the next round.
            let mut hdel = ::redis::cmd("HDEL");
            hdel.arg(key.as_str()).arg(stale);
            let mut c = self.calls.conn();
            let _ = self
                .calls
                .quiet(async move { hdel.query_async::<i64>(&mut c).await })
                .await;
        }
        Ok(snapshot)
    }
}

/// Redis's time, in ms (one round's clock).
async fn time_ms(calls: &Calls) -> Result<u64, StoreError> {
    let mut c = calls.conn();
    let (secs, micros): (u64, u64) = calls
        .quiet(async move { ::redis::cmd("TIME").query_async(&mut c).await })
        .await?;
    Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
}

/// An instance id as a hash field.
fn field(instance: InstanceId) -> String {
    format!("{instance:016x}")
}

/// Reads a hash's fields at `now_ms`: the entries younger than the TTL, and the fields to delete
/// (older, or unreadable).
fn parse(now_ms: u64, fields: HashMap<String, String>) -> (Snapshot, Vec<String>) {
    let mut peers = Vec::with_capacity(fields.len());
    let mut stale = Vec::new();
    for (name, value) in fields {
        let peer = (|| {
            let instance = InstanceId::from_str_radix(&name, 16).ok()?;
            let (demand, at) = value.rsplit_once(':')?;
            Some(Peer {
                instance,
                demand: demand.parse().ok()?,
                at_ms: at.parse().ok()?,
            })
        })();
        match peer {
            Some(p) if now_ms.saturating_sub(p.at_ms) <= KEY_TTL_MS => peers.push(p),
            _ => stale.push(name),
        }
    }
    peers.sort_by_key(|p| p.instance);
    (Snapshot { now_ms, peers }, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_and_old_or_unreadable_ones_are_to_delete() {
        let now = 1_700_000_000_123;
        let fields: HashMap<String, String> = [
            (field(7), format!("2.500000:{}", now - 100)),
            (field(8), format!("1.0:{}", now - KEY_TTL_MS - 1)),
            ("zz".to_owned(), "1:1".to_owned()),
            (field(9), "nan-ish".to_owned()),
        ]
        .into_iter()
        .collect();
        let (snapshot, mut stale) = parse(now, fields);
        assert_eq!(snapshot.now_ms, now);
        assert_eq!(
            snapshot.peers,
            vec![Peer {
                instance: 7,
                demand: 2.5,
                at_ms: now - 100
            }]
        );
        stale.sort();
        assert_eq!(stale, vec![field(8), field(9), "zz".to_owned()]);
    }
}
