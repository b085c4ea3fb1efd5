//! The RLQS demand exchange on the Redis store (`BACKEND_TYPE=redis`): a round at Redis's time
//! (`ratelimit_redis::DemandRound`), one beat in the instances' hash and one write-and-read per
//! bucket, buckets [`IN_FLIGHT`] at a time, each call bounded by `REDIS_TIMEOUT` and made through
//! the store's breaker ([`Guarded::call`]: none while it is open, failures counted as a
//! decision's). Not connected yet, or the breaker open: the round fails (and the last fractions
//! are kept).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ratelimit_redis::{RedisConnect, Snapshot};

use super::coordinate::{Exchange, Exchanged, Seen};
use super::table::BucketKey;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_remote::Guarded;

/// Bucket calls in flight at once in one round.
const IN_FLIGHT: usize = 64;

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

    fn exchange<'a>(
        &'a self,
        instance: InstanceId,
        demands: &'a [(Arc<BucketKey>, f64)],
    ) -> Pin<Box<dyn Future<Output = Result<Exchanged, String>> + Send + 'a>> {
        Box::pin(async move {
            let store = &self.store;
            let round = store
                .call(|redis| async move { redis.demand_round(instance).await })
                .await
                .map_err(|e| e.to_string())?;
            let beat = round.clone();
            let instances = store
                .call(|_| async move { beat.beat().await })
                .await
                .map_err(|e| e.to_string())?;
            let mut buckets = Vec::with_capacity(demands.len());
            for chunk in demands.chunks(IN_FLIGHT) {
                let calls = chunk.iter().map(|(key, demand)| {
                    let round = round.clone();
                    store.call(move |_| async move { round.bucket(&key.0, &key.1, *demand).await })
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
