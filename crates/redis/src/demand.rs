//! The RLQS demand exchange: per round, Redis's time (`TIME`, so the instances' clocks need not
//! agree) and the moves counter (`GET`), this instance's beat in the instances' hash, then the
//! buckets' hashes in batches ([`DemandRound::buckets`]: one pipeline per batch, or per cluster
//! slot in it): write this instance's demand (field: the instance, value: `demand:ms`) and renew
//! the key's TTL, read every field back, or delete this instance's field. An instance that
//! changed a demand then increments the moves counter ([`DemandRound::moved`]), so the others
//! know to read the buckets again; one whose demands are at rest writes nothing but its beat
//! (and each entry again every few minutes, `quota::fraction::HELD_MS`). Fields older than their
//! hash's hold are deleted by whoever reads them. Every key written carries a TTL. Plain commands,
//! no script: these calls are not the counters' and show apart from them in Redis's command
//! statistics; nor are they counted in the store's `ratelimit_redis_*` series (the RLQS service
//! counts its failed exchanges).

use std::collections::HashMap;
use std::sync::Arc;

use ratelimit_core::quota::fraction::{HELD_MS, InstanceId, Peer, STALE_AFTER_MS};
use ratelimit_core::store::StoreError;

use crate::calls::Calls;
use crate::key::{TextKey, TextKeyBuilder};
use crate::slot::slot;

/// The instances' hash lives this long after its last write; its fields are dropped once older.
const BEAT_TTL_MS: u64 = 2 * STALE_AFTER_MS;
/// A bucket's hash lives this long after its last write (every holder rewrites its entry within
/// half of it); its fields are dropped once older.
const BUCKET_TTL_MS: u64 = HELD_MS;
/// The moves counter lives this long after its last increment (gone, the next round of every
/// instance reads every bucket once).
const MOVES_TTL_MS: u64 = 24 * 3600 * 1000;

/// What a bucket's hash held after this instance's write.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Redis's time at the round's start, in ms.
    pub now_ms: u64,
    /// Every instance's entry, this one's included (unreadable fields are left out).
    pub peers: Vec<Peer>,
}

/// What the instances' hash held after this instance's beat.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    /// Every instance's beat.
    pub seen: Snapshot,
    /// Whether this instance's field was missing before (its first beat, or Redis lost its data,
    /// or the instance was away longer than the hash keeps a beat): its entries in the buckets'
    /// hashes may be gone too.
    pub new: bool,
}

/// One bucket's part in a batch: its hash's key, and what to do there.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketCall<'a> {
    pub domain: &'a str,
    /// The bucket's entries, sorted by the caller.
    pub entries: &'a [(String, String)],
    /// Write this demand (requests per second) and renew the hash's TTL.
    pub write: Option<f64>,
    /// Read every field (after the write).
    pub read: bool,
    /// Delete this instance's field (before anything else).
    pub delete: bool,
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
    moves: Option<u64>,
}

impl DemandRound {
    /// Starts a round for `instance`: reads Redis's time and the moves counter, in one pipeline.
    pub(crate) async fn start(
        calls: Arc<Calls>,
        keys: TextKeyBuilder,
        instance: InstanceId,
    ) -> Result<DemandRound, StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("TIME")
            .cmd("GET")
            .arg(keys.quota_moves_key().as_str());
        let mut c = calls.conn();
        let ((secs, micros), moves): ((u64, u64), Option<u64>) = calls
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        Ok(DemandRound {
            calls,
            keys,
            instance,
            now_ms: secs.saturating_mul(1000).saturating_add(micros / 1000),
            moves,
        })
    }

    /// The round started at `now_ms` (Redis's time), again, for its later batches.
    pub(crate) fn at(
        calls: Arc<Calls>,
        keys: TextKeyBuilder,
        instance: InstanceId,
        now_ms: u64,
    ) -> DemandRound {
        DemandRound {
            calls,
            keys,
            instance,
            now_ms,
            moves: None,
        }
    }

    /// Redis's time at the round's start, in ms.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The moves counter at the round's start (`None`: not there, or a round taken up again).
    pub fn moves(&self) -> Option<u64> {
        self.moves
    }

    /// Says this instance is alive in the instances' hash (one registry of the server instances
    /// on this Redis, which the failure mode's shares read too) and returns every instance's beat.
    pub async fn beat(&self) -> Result<Beat, StoreError> {
        let key = self.keys.instances_key();
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET")
            .arg(key.as_str())
            .arg(field(self.instance))
            .arg(format!("{:.6}:{}", 0.0, self.now_ms))
            .cmd("PEXPIRE")
            .arg(key.as_str())
            .arg(BEAT_TTL_MS)
            .ignore()
            .cmd("HGETALL")
            .arg(key.as_str());
        let mut c = self.calls.conn();
        let (added, fields): (u64, HashMap<String, String>) = self
            .calls
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        let (seen, stale) = parse(self.now_ms, BEAT_TTL_MS, fields);
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
        Ok(Beat {
            seen,
            new: added > 0,
        })
    }

    /// One batch of buckets: per bucket, this instance's field deleted, its demand written (and
    /// the hash's TTL renewed), every field read, as `calls` asks; one pipeline (one per cluster
    /// slot among them). Returns, per call, what its hash held (`None` where nothing was read).
    /// Fails as a whole if any of its pipelines does.
    pub async fn buckets(
        &self,
        calls: &[BucketCall<'_>],
    ) -> Result<Vec<Option<Snapshot>>, StoreError> {
        let keys: Vec<TextKey> = calls
            .iter()
            .map(|c| self.keys.quota_key(c.domain, c.entries))
            .collect();
        // On a cluster a pipeline holds one slot's keys: the batch in groups, in their order.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        if self.calls.is_cluster() {
            let mut by_slot: HashMap<u16, usize> = HashMap::new();
            for (i, key) in keys.iter().enumerate() {
                let g = *by_slot
                    .entry(slot(key.as_str().as_bytes()))
                    .or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                groups[g].push(i);
            }
        } else {
            groups.push((0..keys.len()).collect());
        }
        let sent = groups
            .iter()
            .map(|group| self.pipeline(calls, &keys, group));
        let mut out = vec![None; calls.len()];
        for (group, answer) in groups
            .iter()
            .zip(futures_util::future::join_all(sent).await)
        {
            for (i, snapshot) in group.iter().zip(answer?) {
                out[*i] = snapshot;
            }
        }
        Ok(out)
    }

    /// One pipeline for the calls at `group` (one slot's on a cluster); deletes the stale fields
    /// it read (best effort: a field left over is deleted by a later read).
    async fn pipeline(
        &self,
        calls: &[BucketCall<'_>],
        keys: &[TextKey],
        group: &[usize],
    ) -> Result<Vec<Option<Snapshot>>, StoreError> {
        let field = field(self.instance);
        let mut pipe = ::redis::pipe();
        for &i in group {
            let (call, key) = (&calls[i], keys[i].as_str());
            if call.delete {
                pipe.cmd("HDEL").arg(key).arg(&field).ignore();
            }
            if let Some(demand) = call.write {
                let demand = if demand.is_finite() && demand > 0.0 {
                    demand
                } else {
                    0.0
                };
                pipe.cmd("HSET")
                    .arg(key)
                    .arg(&field)
                    .arg(format!("{demand:.6}:{}", self.now_ms))
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(key)
                    .arg(BUCKET_TTL_MS)
                    .ignore();
            }
            if call.read {
                pipe.cmd("HGETALL").arg(key);
            }
        }
        let mut c = self.calls.conn();
        let mut read: std::vec::IntoIter<::redis::Value> = self
            .calls
            .quiet(async move { pipe.query_async::<Vec<::redis::Value>>(&mut c).await })
            .await?
            .into_iter();
        let mut out = Vec::with_capacity(group.len());
        let mut hdel = ::redis::pipe();
        let mut stale_fields = false;
        for &i in group {
            if !calls[i].read {
                out.push(None);
                continue;
            }
            let fields: HashMap<String, String> = read
                .next()
                .map(::redis::from_redis_value)
                .transpose()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?
                .unwrap_or_default();
            let (snapshot, stale) = parse(self.now_ms, BUCKET_TTL_MS, fields);
            if !stale.is_empty() {
                hdel.cmd("HDEL").arg(keys[i].as_str()).arg(stale).ignore();
                stale_fields = true;
            }
            out.push(Some(snapshot));
        }
        if stale_fields {
            let mut c = self.calls.conn();
            let _ = self
                .calls
                .quiet(async move { hdel.query_async::<()>(&mut c).await })
                .await;
        }
        Ok(out)
    }

    /// Tells the other instances that this one changed demands in this round (after its writes
    /// landed): increments the moves counter, renews its TTL, and returns its new value.
    pub async fn moved(&self) -> Result<u64, StoreError> {
        let key = self.keys.quota_moves_key();
        let mut pipe = ::redis::pipe();
        pipe.cmd("INCR")
            .arg(key.as_str())
            .cmd("PEXPIRE")
            .arg(key.as_str())
            .arg(MOVES_TTL_MS)
            .ignore();
        let mut c = self.calls.conn();
        let (moves,): (u64,) = self
            .calls
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        Ok(moves)
    }
}

/// An instance id as a hash field.
fn field(instance: InstanceId) -> String {
    format!("{instance:016x}")
}

/// Reads a hash's fields at `now_ms`: the entries younger than `ttl_ms`, and the fields to delete
/// (older, or unreadable).
fn parse(now_ms: u64, ttl_ms: u64, fields: HashMap<String, String>) -> (Snapshot, Vec<String>) {
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
            Some(p) if now_ms.saturating_sub(p.at_ms) <= ttl_ms => peers.push(p),
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
            (field(8), format!("1.0:{}", now - BEAT_TTL_MS - 1)),
            ("zz".to_owned(), "1:1".to_owned()),
            (field(9), "nan-ish".to_owned()),
        ]
        .into_iter()
        .collect();
        let (snapshot, mut stale) = parse(now, BEAT_TTL_MS, fields);
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
