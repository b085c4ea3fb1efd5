//! The Redis baseline: a RateLimitService that counts each descriptor as envoyproxy/ratelimit
//! does on Redis — one pipeline of `INCRBY key hits` and `EXPIRE key 1` per call, the key built
//! from the domain, the descriptor's entries and the second — and answers OK below a limit no
//! load reaches. Written as a tonic and redis-rs user would write it (envoy-types' generated
//! server, one redis-rs multiplexed connection shared by every call, which pipelines concurrent
//! calls by itself), none of our code: what one Redis exchange per decision costs a server with
//! well-kept crates and no exactness, against which ours on Redis is read.
//!
//! With [`Exchange::Ping`] (`--backend ping-redis`) the same server asks Redis only `PING`, one per
//! call, and answers OK: the floor of a design that makes one Redis round trip per decision (no
//! key, no command that does any work), what no exact shared counter can cost less than. With
//! [`Driven::OnOwnThread`] (`--backend ping-redis-thread`) that connection is driven by a runtime
//! on a thread of its own, as the server's redis-io thread drove them until 2026-12-06: each call then
//! crosses threads twice (its `PING` handed to that thread, the reply handed back), which is the
//! crossing's own cost beside the floor's.

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use redis::aio::MultiplexedConnection;
use tonic::{Request, Response, Status};

const LIMIT: u64 = 1_000_000_000;

pub struct NoopRedis {
    redis: MultiplexedConnection,
    exchange: Exchange,
}

/// What the server sends Redis per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// The reference's `INCRBY` + `EXPIRE` per descriptor, one pipeline per call.
    ReferenceCommands,
    /// One `PING` per call: a round trip and nothing else.
    Ping,
}

#[tonic::async_trait]
impl RateLimitService for NoopRedis {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let hits = u64::from(request.hits_addend.max(1));
        if self.exchange == Exchange::Ping {
            let _: String = redis::cmd("PING")
                .query_async(&mut self.redis.clone())
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            return Ok(Response::new(answer(&vec![
                hits;
                request.descriptors.len()
            ])));
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "the baseline shares none of our code, the clock included"
        )]
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut pipe = redis::pipe();
        for descriptor in &request.descriptors {
            let mut key = format!("noop:{}_", request.domain);
            for entry in &descriptor.entries {
                key.push_str(&entry.key);
                key.push('_');
                key.push_str(&entry.value);
                key.push('_');
            }
            key.push_str(&second.to_string());
            pipe.cmd("INCRBY").arg(&key).arg(hits);
            pipe.cmd("EXPIRE").arg(&key).arg(1).ignore();
        }
        let counts: Vec<u64> = pipe
            .query_async(&mut self.redis.clone())
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(answer(&counts)))
    }
}

/// The answer for these counts: each descriptor OK below `LIMIT`.
fn answer(counts: &[u64]) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = counts
        .iter()
        .map(|&count| DescriptorStatus {
            code: if count > LIMIT {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: LIMIT as u32,
                unit: Unit::Second as i32,
            }),
            limit_remaining: LIMIT.saturating_sub(count) as u32,
            duration_until_reset: Some(Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .collect();
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..Default::default()
    }
}

/// Which runtime drives the connection (reads and writes its socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The request workers' (tonic's), as a redis-rs user would have it.
    OnWorkers,
    /// A one-thread runtime on a thread of its own.
    OnOwnThread,
}

/// The service on a multiplexed connection to `redis_url` (`host:port`), sending `exchange`,
/// the connection driven as `driven` says.
pub async fn server(
    redis_url: &str,
    exchange: Exchange,
    driven: Driven,
) -> RateLimitServiceServer<NoopRedis> {
    let client = redis::Client::open(format!("redis://{redis_url}")).expect("a Redis URL");
    let redis = match driven {
        Driven::OnWorkers => connect(client).await,
        Driven::OnOwnThread => {
            // redis-rs spawns the connection's driver task on the runtime that connects it.
            let (connected, connection) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("redis-io".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime for the Redis connection");
                    runtime.block_on(async move {
                        let _ = connected.send(connect(client).await);
                        std::future::pending::<()>().await;
                    });
                })
                .expect("a thread for the Redis connection");
            connection.await.expect("the Redis thread connects")
        }
    };
    RateLimitServiceServer::new(NoopRedis { redis, exchange })
}

async fn connect(client: redis::Client) -> MultiplexedConnection {
    client
        .get_multiplexed_async_connection()
        .await
        .expect("the no-op server connects to Redis")
}
