//! Instances sharing RLQS buckets: every second, this instance publishes its demand for each
//! limited bucket and reads every instance's ([`Exchange`], Redis in `rlqs::redis`), then takes
//! its fraction of each bucket's pool (`quota::fraction`, pure). It runs in a task of its own:
//! no gRPC stream ever waits on Redis. When an exchange fails, each bucket keeps the last
//! fraction it had and a new bucket starts at an even split among the instances last seen; the
//! failures are counted (`ratelimit_rlqs_exchange_errors_total`) and said at most once a minute.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::TICK;
use super::table::{BucketKey, Table};
use ratelimit_core::clock::monotonic;
use ratelimit_core::quota::fraction::{self, InstanceId, Peer};
use ratelimit_core::store::Backend;
use ratelimit_remote::Every;

/// How often a failing exchange is said again.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A hash as an exchange left it: its entries, on the clock of the store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    pub(crate) now_ms: u64,
    pub(crate) peers: Vec<Peer>,
}

/// One round of the exchange.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exchanged {
    /// The instances' beats (this one's written in this round).
    pub(crate) instances: Seen,
    /// Per bucket asked, in order: its hash after this instance's write, `None` if that call
    /// failed.
    pub(crate) buckets: Vec<Option<Seen>>,
}

/// Where instances publish and read their demands.
pub(crate) trait Exchange: Send + Sync + 'static {
    /// This instance's id among the instances on the shared store.
    fn instance(&self) -> InstanceId;
    /// Publishes `instance`'s beat and its demand for each bucket; what each hash holds then.
    fn exchange<'a>(
        &'a self,
        instance: InstanceId,
        demands: &'a [(Arc<BucketKey>, f64)],
    ) -> Pin<Box<dyn Future<Output = Result<Exchanged, String>> + Send + 'a>>;
}

/// Each bucket's fraction from one round, and the instances alive.
fn fractions(
    instance: InstanceId,
    demands: &[(Arc<BucketKey>, f64)],
    exchanged: &Exchanged,
) -> (Vec<(Arc<BucketKey>, f64)>, usize, u64) {
    let alive = fraction::live(
        instance,
        &exchanged.instances.peers,
        exchanged.instances.now_ms,
    );
    let mut failed = 0;
    let mut out = Vec::with_capacity(demands.len());
    for ((key, demand), seen) in demands.iter().zip(&exchanged.buckets) {
        match seen {
            Some(seen) => out.push((
                key.clone(),
                fraction::fraction(instance, *demand, &seen.peers, seen.now_ms),
            )),
            None => failed += 1,
        }
    }
    failed += demands.len().saturating_sub(exchanged.buckets.len()) as u64;
    (out, alive, failed)
}

/// Exchanges every [`TICK`] until `stop` turns true.
pub(crate) async fn coordinate<B: Backend>(
    table: Arc<Table<B>>,
    exchange: Arc<dyn Exchange>,
    mut stop: watch::Receiver<bool>,
) {
    let instance = exchange.instance();
    tracing::info!(
        instance = %format!("{instance:016x}"),
        "RLQS buckets are shared with the other instances on this Redis"
    );
    let epoch = monotonic();
    let warn = Every::new(WARN_EVERY);
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let demands = table.demands();
        let round = tokio::select! {
            round = exchange.exchange(instance, &demands) => round,
            _ = stop.wait_for(|s| *s) => break,
        };
        let metrics = table.metrics();
        let failure = match round {
            Ok(exchanged) => {
                let (fractions, alive, failed) = fractions(instance, &demands, &exchanged);
                metrics.instances.set(alive as i64);
                table.set_fractions(fractions, alive);
                metrics.exchange_errors.inc_by(failed);
                (failed > 0).then(|| format!("{failed} of {} buckets", demands.len()))
            }
            Err(e) => {
                metrics.exchange_errors.inc();
                Some(e)
            }
        };
        if let Some(error) = failure
            && warn.due(epoch.elapsed().as_nanos() as u64)
        {
            tracing::warn!(
                %error,
                "the RLQS demand exchange with Redis failed: buckets keep their last fraction of the pool (ratelimit_rlqs_exchange_errors_total counts the failures)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Arc<BucketKey> {
        Arc::new(("d".to_owned(), vec![("k".to_owned(), name.to_owned())]))
    }

    fn peer(instance: InstanceId, demand: f64, at_ms: u64) -> Peer {
        Peer {
            instance,
            demand,
            at_ms,
        }
    }

    #[test]
    fn a_round_gives_each_answered_bucket_its_fraction_and_counts_the_others() {
        let demands = vec![(key("a"), 1.0), (key("b"), 3.0), (key("c"), 1.0)];
        let seen = |peers| {
            Some(Seen {
                now_ms: 10_000,
                peers,
            })
        };
        let exchanged = Exchanged {
            instances: Seen {
                now_ms: 10_000,
                peers: vec![peer(1, 0.0, 10_000), peer(2, 0.0, 9_500)],
            },
            buckets: vec![
                seen(vec![peer(1, 1.0, 10_000), peer(2, 1.0, 9_800)]),
                None,
                seen(vec![peer(1, 1.0, 10_000)]),
            ],
        };
        let (fractions, alive, failed) = fractions(1, &demands, &exchanged);
        assert_eq!(alive, 2);
        assert_eq!(failed, 1);
        assert_eq!(fractions, vec![(key("a"), 0.5), (key("c"), 1.0)]);
    }
}
