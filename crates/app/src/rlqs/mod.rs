//! The gRPC face of the Rate Limit Quota Service:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`, one
//! bidirectional stream per Envoy (and domain). Each usage report goes into the shared [`Table`]
//! (the core's `quota` logic: which rule governs the bucket, each stream's share); the answer and
//! any push to other streams leave through each stream's outbox, which keeps only the newest
//! action per bucket until the client reads it (`outbox`). A ticker moves, every second, the
//! shares that are due (idle streams, TTLs, reloads, shares waiting for the ledger). With Redis, instances share each bucket's pool: each
//! hands out its fraction, from the demands they exchange every second (`coordinate`; a demand
//! at rest is not sent again, `plan`). At shutdown
//! every stream ends, so the drain does not wait on them. Reports and ticks run on blocking
//! threads: the table's lock never holds up the runtime's workers (ShouldRateLimit's).

mod actions;
mod coordinate;
mod metrics;
mod outbox;
mod plan;
mod redis;
mod table;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

pub(crate) use coordinate::{Exchange, coordinate};
pub(crate) use metrics::QuotaMetrics;
pub(crate) use redis::RedisExchange;
pub(crate) use table::Table;

use ratelimit_core::engine::Engine;
use ratelimit_core::store::Backend;

/// Largest usage-report message read.
const MAX_REPORT_BYTES: usize = 4 * 1024 * 1024;
/// How often shares are recomputed without a report.
const TICK: Duration = Duration::from_secs(1);

/// The service around the shared table.
pub(crate) struct QuotaService<B> {
    table: Arc<Table<B>>,
    shutdown: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

impl<B: Backend> QuotaService<B> {
    /// The tonic service; streams end when `shutdown` turns true.
    pub(crate) fn server(
        table: Arc<Table<B>>,
        shutdown: watch::Receiver<bool>,
    ) -> RateLimitQuotaServiceServer<QuotaService<B>> {
        RateLimitQuotaServiceServer::new(QuotaService { table, shutdown })
            .max_decoding_message_size(MAX_REPORT_BYTES)
    }
}

/// The table for `engine`, with its series on the engine's registry (if any).
pub(crate) fn table<B: Backend>(
    engine: Arc<Engine<B>>,
    registry: &prometheus::Registry,
) -> Arc<Table<B>> {
    Arc::new(Table::new(engine, QuotaMetrics::register(registry)))
}

/// Recomputes the shares that are due every [`TICK`] until `stop` turns true.
pub(crate) async fn tick<B: Backend>(table: Arc<Table<B>>, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let table = table.clone();
        // Off the runtime's workers, as reports are.
        let _ = tokio::task::spawn_blocking(move || table.tick()).await;
    }
}

#[tonic::async_trait]
impl<B: Backend> RateLimitQuotaService for QuotaService<B> {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let mut inbound = request.into_inner();
        let outbox = self.table.outbox();
        let stream = self.table.open(outbox.clone());
        let table = self.table.clone();
        let mut stop = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    _ = stop.wait_for(|s| *s) => break,
                };
                match message {
                    Ok(Some(reports)) => {
                        // A report of thousands of buckets holds the table's lock for a while:
                        // off the runtime's workers, so no decision waits on it.
                        let table = table.clone();
                        let read =
                            tokio::task::spawn_blocking(move || table.report(stream, reports));
                        if read.await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream, %status, "RLQS stream ended with an error");
                        break;
                    }
                }
            }
            // The outbox writes what is pending, then the response stream ends.
            table.close(stream);
        });
        Ok(Response::new(Box::pin(futures_util::StreamExt::map(
            outbox::messages(outbox),
            Ok,
        ))))
    }
}
