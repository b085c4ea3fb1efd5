//! Instances sharing RLQS buckets: every second, this instance takes from the table the buckets
//! whose demand moved since the last round (`Table::demands`), beats, publishes the demands that
//! changed and reads the buckets the other instances moved ([`Exchange`], Redis in
//! `rlqs::redis`; which buckets: `plan`), then takes its fraction of each bucket read
//! (`quota::fraction`, pure). A bucket at rest costs no call and no work. It runs in a task of
//! its own: no gRPC stream ever waits on Redis; with a large table its synchronous steps (all
//! 200,000 buckets after a report round at the caps) leave the request worker first
//! (`off_worker`). When an exchange fails, each bucket keeps the last fraction it had and a new
//! bucket starts at an even split among the instances last seen; the failures are counted
//! (`ratelimit_rlqs_exchange_errors_total`) and said at most once a minute.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::TICK;
use super::plan::{Begun, Call, Plan, Settled};
use super::table::{BucketKey, Table};
use ratelimit_core::clock::monotonic;
use ratelimit_core::quota::fraction::{InstanceId, Peer};
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

/// A future of the exchange.
pub(crate) type Exchanging<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where instances publish and read their demands.
pub(crate) trait Exchange: Send + Sync + 'static {
    /// This instance's id among the instances on the shared store.
    fn instance(&self) -> InstanceId;
    /// Starts a round: `instance`'s beat, every instance's, and the moves counter.
    fn begin(&self, instance: InstanceId) -> Exchanging<'_, Result<Begun, String>>;
    /// The round's calls on the buckets' hashes, at the round's time `now_ms`: per call, `None`
    /// where it failed, else what its hash held where it was read.
    fn buckets<'a>(
        &'a self,
        instance: InstanceId,
        now_ms: u64,
        calls: &'a [(Arc<BucketKey>, Call)],
    ) -> Exchanging<'a, Vec<Option<Option<Seen>>>>;
    /// Tells the others this instance changed demands: the moves counter after its increment.
    fn moved(&self, instance: InstanceId, now_ms: u64) -> Exchanging<'_, Result<u64, String>>;
}

/// One round: begin, the deletes, the other calls, the fractions, and the increment if owed.
/// (`big`: its computing leaves the request worker, [`off_worker`].)
async fn round(
    exchange: &dyn Exchange,
    instance: InstanceId,
    plan: &mut Plan,
    big: bool,
) -> Result<Settled, String> {
    let begun = exchange.begin(instance).await?;
    let now_ms = begun.instances.now_ms;
    let round = off_worker(big, || plan.round(instance, &begun));
    let deleted = if round.deletes.is_empty() {
        Vec::new()
    } else {
        exchange.buckets(instance, now_ms, &round.deletes).await
    };
    let answers = if round.calls.is_empty() {
        Vec::new()
    } else {
        exchange.buckets(instance, now_ms, &round.calls).await
    };
    let settled = off_worker(big, || {
        plan.settle(instance, &begun, &round, &deleted, &answers)
    });
    if settled.announce {
        let moved = exchange.moved(instance, now_ms).await.ok();
        plan.announced(&begun, moved);
    }
    Ok(settled)
}

/// Tables of at least this many buckets have a round's computing done off the request worker.
const OFF_WORKER_BUCKETS: i64 = 1000;

/// Runs `work`, the round's own computing (synchronous, and after a report round over every
/// bucket: 200,000 at the caps, with the table's lock held for part of it). When `big` (the table
/// holds [`OFF_WORKER_BUCKETS`] or more), without holding a request worker meanwhile: on a
/// multi-thread runtime the worker hands its queued tasks to another thread first
/// (`block_in_place`), so no ShouldRateLimit call waits behind it. A small table's round takes
/// microseconds and is done in place (as on a test's current-thread runtime).
fn off_worker<T>(big: bool, work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) if big => tokio::task::block_in_place(work),
        _ => work(),
    }
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
    let mut plan = Plan::default();
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let big = table.metrics().buckets.get() >= OFF_WORKER_BUCKETS;
        // What moved since the last round, taken whatever this round's fate.
        off_worker(big, || plan.take(&table.demands()));
        let outcome = tokio::select! {
            outcome = round(&*exchange, instance, &mut plan, big) => outcome,
            _ = stop.wait_for(|s| *s) => break,
        };
        let metrics = table.metrics();
        let failure = match outcome {
            Ok(settled) => {
                metrics.instances.set(settled.alive as i64);
                off_worker(big, || {
                    table.set_fractions(settled.fractions, settled.alive)
                });
                metrics.exchange_errors.inc_by(settled.failed);
                (settled.failed > 0)
                    .then(|| format!("{} of {} bucket calls", settled.failed, settled.asked))
            }
            Err(e) => {
                plan.failed();
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
