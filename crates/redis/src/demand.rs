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

use ratelimit_core::quota::fraction::{InstanceId, Peer, STALE_AFTER_MS};

use super::{RedisBackend, StoreError, TextKey, io, within};

/// A demand hash lives this long after its last write; its fields are dropped once older.
pub const KEY_TTL_MS: u64 = 2 * STALE_AFTER_MS;

/// What a bucket's hash held after this instance's write.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Redis's time at the round's start, in ms.
    pub now_ms: u64,
    /// Every instance's entry, this one's included (unreadable fields are left out).
    pub peers: Vec<Peer>,
}

/// An instance id as a hash field.
pub fn field(instance: InstanceId) -> String {
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

impl RedisBackend {
    /// The key of an RLQS bucket's demand hash (entries sorted by the caller).
    pub fn demand_key(&self, domain: &str, entries: &[(String, String)]) -> TextKey {
        self.inner.keys.quota_key(domain, entries)
    }

    /// The key of the instances' hash.
    pub fn instances_key(&self) -> TextKey {
        self.inner.keys.instances_key()
    }

    /// `call` on the Redis I/O thread within `REDIS_TIMEOUT`, not counted as a store call.
    async fn quiet<T: Send + 'static>(
        &self,
        call: impl Future<Output = ::redis::RedisResult<T>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let timeout = self.inner.timeout;
        match io::run(async move { within(timeout, call).await }).await {
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(e))) => Err(StoreError::Unavailable(e.to_string())),
            Some(Err(())) => Err(StoreError::Unreachable(format!(
                "no answer from Redis within {timeout:?}"
            ))),
            None => Err(StoreError::Unavailable(
                "the Redis I/O thread is gone".into(),
            )),
        }
    }

    /// Redis's time, in ms (one round's clock).
    pub async fn time_ms(&self) -> Result<u64, StoreError> {
        let mut c = self.inner.conns.get();
        let (secs, micros): (u64, u64) = self
            .quiet(async move { ::redis::cmd("TIME").query_async(&mut c).await })
            .await?;
        Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
    }

    /// Writes `instance`'s `demand` (requests per second) at `now_ms` (Redis's time, from
    /// [`RedisBackend::time_ms`]) into the hash at `key` and returns what it holds then; bounded
    /// by `REDIS_TIMEOUT`.
    pub async fn exchange_demand(
        &self,
        key: &TextKey,
        instance: InstanceId,
        demand: f64,
        now_ms: u64,
    ) -> Result<Snapshot, StoreError> {
        let demand = if demand.is_finite() && demand > 0.0 {
            demand
        } else {
            0.0
        };
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET")
            .arg(key.as_str())
            .arg(field(instance))
            .arg(format!("{demand:.6}:{now_ms}"))
            .ignore()
            .cmd("PEXPIRE")
            .arg(key.as_str())
            .arg(KEY_TTL_MS)
            .ignore()
            .cmd("HGETALL")
            .arg(key.as_str());
        let mut c = self.inner.conns.get();
        let (fields,): (HashMap<String, String>,) = self
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        let (snapshot, stale) = parse(now_ms, fields);
        if !stale.is_empty() {
            // Best effort: a field left over is deleted by the next round.
            let mut hdel = ::redis::cmd("HDEL");
            hdel.arg(key.as_str()).arg(stale);
            let mut c = self.inner.conns.get();
            let _ = self
                .quiet(async move { hdel.query_async::<i64>(&mut c).await })
                .await;
        }
        Ok(snapshot)
    }
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
