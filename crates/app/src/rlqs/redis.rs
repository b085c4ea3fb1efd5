//! The RLQS demand exchange on the Redis store (`BACKEND_TYPE=redis`): a round at Redis's time
//! (`ratelimit_redis::DemandRound`), one beat in the instances' hash and one write-and-read per
//! bucket, buckets [`IN_FLIGHT`] at a time, each call bounded by `REDIS_TIMEOUT`. Not connected
//! yet: the round fails (and the last fractions are kept).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ratelimit_redis::{RedisConnect, Snapshot};

use super::coordinate::{Exchange, Exchanged, Seen};
use super::table::BucketKey;
use crate::quota::fraction::InstanceId;
use crate::store::guard::Guarded;

/// Bucket calls in flight at once in one round.
const IN_FLIGHT: usize = 64;

/// The exchange through the store's Redis connections.
pub struct RedisExchange {
    pub store: Guarded<RedisConnect>,
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

    fn exchange<'a>(
        &'a self,
        instance: InstanceId,
        demands: &'a [(Arc<BucketKey>, f64)],
    ) -> Pin<Box<dyn Future<Output = Result<Exchanged, String>> + Send + 'a>> {
        Box::pin(async move {
            let redis = self
                .store
                .remote()
                .ok_or_else(|| "not connected to Redis yet".to_owned())?;
            let round = redis
                .demand_round(instance)
                .await
                .map_err(|e| e.to_string())?;
            let instances = round.beat().await.map_err(|e| e.to_string())?;
            let mut buckets = Vec::with_capacity(demands.len());
            for chunk in demands.chunks(IN_FLIGHT) {
                let calls = chunk.iter().map(|(key, demand)| {
                    let round = &round;
                    async move { round.bucket(&key.0, &key.1, *demand).await }
                });
                for answer in futures_util::future::join_all(calls).await {
                    buckets.push(answer.ok().map(seen));
                }
            }
            Ok(Exchanged {
                instances: seen(instances),
                buckets,
            })
        })
    }
}
