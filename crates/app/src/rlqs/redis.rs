//! The RLQS demand exchange on the Redis store (`BACKEND_TYPE=redis`): a round at Redis's time
//! with the moves counter (`ratelimit_redis::DemandRound`), one beat in the instances' hash, the
//! buckets' calls in batches of [`BATCH`] (one pipeline each, one per cluster slot in it),
//! [`IN_FLIGHT`] batches at a time, and the counter's increment; each call bounded by
//! `REDIS_TIMEOUT` and made through the store's breaker ([`Guarded::call`]: none while it is open,
//! failures counted as a decision's). Not connected yet, or the breaker open: the round fails
//! (and the last fractions are kept).

use std::sync::Arc;

use futures_util::StreamExt;
use ratelimit_redis::RedisConnect;
use ratelimit_redis::{BucketCall, Snapshot};

use super::coordinate::{Exchange, Exchanging, Seen};
use super::plan::{Begun, Call};
use super::table::BucketKey;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::store::StoreError;
use ratelimit_remote::Guarded;

/// Buckets in one pipeline.
const BATCH: usize = 256;
/// Batches in flight at once in one round.
const IN_FLIGHT: usize = 4;

/// One batch's answer: per call, what its hash held where it was read.
type BatchAnswer = Result<Vec<Option<Snapshot>>, StoreError>;

/// The exchange through the store's Redis connections.
pub(crate) struct RedisExchange {
    pub(crate) store: Guarded<RedisConnect>,
}

fn seen(snapshot: Snapshot) -> Seen {
    Seen {
        now_ms: snapshot.now_ms,
        peers: snapshot.peers,
    }
}

impl Exchange for RedisExchange {
    /// The store's own id: one registry of the instances on this Redis for RLQS and the failure
    /// mode's shares.
    fn instance(&self) -> InstanceId {
        self.store.instance_id()
    }

    fn begin(&self, instance: InstanceId) -> Exchanging<'_, Result<Begun, String>> {
        Box::pin(async move {
            let store = &self.store;
            let round = store
                .call(|redis| async move { redis.demand_round(instance).await })
                .await
                .map_err(|e| e.to_string())?;
            let moves = round.moves();
            let beat = store
                .call(|_| async move { round.beat().await })
                .await
                .map_err(|e| e.to_string())?;
            Ok(Begun {
                instances: seen(beat.seen),
                moves,
                new: beat.new,
            })
        })
    }

    fn buckets<'a>(
        &'a self,
        instance: InstanceId,
        now_ms: u64,
        calls: &'a [(Arc<BucketKey>, Call)],
    ) -> Exchanging<'a, Vec<Option<Option<Seen>>>> {
        Box::pin(async move {
            let store = &self.store;
            let mut batches: Vec<Exchanging<'a, BatchAnswer>> = Vec::new();
            for batch in calls.chunks(BATCH) {
                batches.push(Box::pin(store.call(move |redis| async move {
                    let asked: Vec<BucketCall<'_>> = batch
                        .iter()
                        .map(|(key, call)| BucketCall {
                            domain: &key.0,
                            entries: &key.1,
                            write: call.write,
                            read: call.read,
                            delete: call.delete,
                        })
                        .collect();
                    redis
                        .demand_round_at(instance, now_ms)
                        .buckets(&asked)
                        .await
                })));
            }
            let answers: Vec<_> = futures_util::stream::iter(batches)
                .buffered(IN_FLIGHT)
                .collect()
                .await;
            let mut out = Vec::with_capacity(calls.len());
            for (batch, answer) in calls.chunks(BATCH).zip(answers) {
                match answer {
                    Ok(read) => out.extend(read.into_iter().map(|s| Some(s.map(seen)))),
                    Err(_) => out.extend(batch.iter().map(|_| None)),
                }
            }
            out
        })
    }

    fn moved(&self, instance: InstanceId, now_ms: u64) -> Exchanging<'_, Result<u64, String>> {
        Box::pin(async move {
            self.store
                .call(|redis| async move { redis.demand_round_at(instance, now_ms).moved().await })
                .await
                .map_err(|e| e.to_string())
        })
    }
}
