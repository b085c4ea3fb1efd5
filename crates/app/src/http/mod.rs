//! The HTTP admin port (axum): `/metrics`, `/healthcheck`, `/readyz`, `/rlconfig`, `/explain`,
//! `POST /json` and, with a token file, the quota API (`/v1/…`, `quota`).

mod explain;
mod json;
mod quota;
mod rlconfig;
mod stream;

pub(crate) use quota::{QuotaApi, RedisShared, Shared, keep_overrides, keep_shared_overrides};
pub use ratelimit_core::wire::json::response_json;
pub(crate) use stream::Renders;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};

use crate::front::FrontDoor;
use crate::statsd::Mapper;
use crate::statsd::exposition::mapped;
use crate::status::ServerStatus;
use ratelimit_core::engine::Engine;
use ratelimit_core::metrics::Metrics;
use ratelimit_core::store::Backend;

/// What the admin handlers need.
pub struct Admin<B> {
    pub(crate) engine: Arc<Engine<B>>,
    /// Where `POST /json` decisions go (as gRPC ones do).
    pub(crate) front: Arc<FrontDoor<B>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: Arc<ServerStatus>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: `/healthcheck` fails while no domain is loaded.
    pub(crate) healthy_needs_a_domain: bool,
    /// The RLQS buckets, for `/explain?bucket=…`.
    pub(crate) quotas: Option<Arc<dyn ratelimit_core::quota::BucketLookup>>,
    /// `PROMETHEUS_MAPPER_YAML`: how the metrics pages name the reference's stats.
    pub(crate) mapper: Option<Arc<Mapper>>,
    /// The slots for streamed answers (`/rlconfig`).
    pub(crate) renders: Renders,
    /// The quota API (`/v1/…`), with `--admin-token-file`.
    pub(crate) quota: Option<Arc<QuotaApi<B>>>,
}

impl<B> Admin<B> {
    /// What the admin handlers need, with the server's optional parts off: `/healthcheck` healthy
    /// with no domain loaded, no RLQS buckets, the metrics under our names, no streamed renders
    /// in progress.
    pub fn new(
        engine: Arc<Engine<B>>,
        front: Arc<FrontDoor<B>>,
        metrics: Arc<Metrics>,
        status: Arc<ServerStatus>,
    ) -> Self {
        Admin {
            engine,
            front,
            metrics,
            status,
            healthy_needs_a_domain: false,
            quotas: None,
            mapper: None,
            renders: Renders::default(),
            quota: None,
        }
    }
}

type AdminState<B> = State<Arc<Admin<B>>>;

pub fn router<B: Backend>(admin: Arc<Admin<B>>) -> Router {
    let quota = admin.quota.clone();
    let router = Router::new()
        .route("/metrics", get(metrics::<B>))
        .route("/healthcheck", get(healthcheck::<B>))
        .route("/readyz", get(readyz::<B>))
        .route("/rlconfig", get(rlconfig::rlconfig::<B>))
        .route("/explain", get(explain::explain::<B>))
        .route("/json", post(json::json::<B>))
        .with_state(admin);
    match quota {
        Some(api) => router.merge(quota::router(api)),
        None => router,
    }
}

/// The debug listener (`DEBUG_ADDR`, the reference's `DEBUG_PORT`): an index and `/rlconfig`.
pub(crate) fn debug_router<B: Backend>(admin: Arc<Admin<B>>) -> Router {
    Router::new()
        .route("/", get(debug_index))
        .route("/rlconfig", get(rlconfig::rlconfig_text::<B>))
        .with_state(admin)
}

/// The metrics listener (`METRICS_ADDR`; the reference's `PROMETHEUS_ADDR`, where Envoy Gateway's
/// dashboards scrape): the metrics at `path` and nothing else.
pub(crate) fn metrics_router<B: Backend>(admin: Arc<Admin<B>>, path: &str) -> Router {
    Router::new()
        .route(path, get(metrics::<B>))
        .with_state(admin)
}

async fn debug_index() -> &'static str {
    "/rlconfig: the rules in force, one line per limit (JSON on the HTTP port's /rlconfig)\n"
}

async fn metrics<B: Backend>(State(admin): AdminState<B>) -> impl IntoResponse {
    let page = match &admin.mapper {
        None => admin.metrics.encode(),
        Some(mapper) => encode(&mapped(admin.metrics.registry().gather(), mapper)),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], page)
}

/// The Prometheus text exposition of `families`.
fn encode(families: &[prometheus::proto::MetricFamily]) -> String {
    let mut buffer = Vec::new();
    match prometheus::Encoder::encode(&prometheus::TextEncoder::new(), families, &mut buffer) {
        Ok(()) => String::from_utf8(buffer).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The reference's health check: 200 `OK`, or 500 once shutting down.
async fn healthcheck<B: Backend>(State(admin): AdminState<B>) -> impl IntoResponse {
    if admin.status.is_draining() {
        (StatusCode::INTERNAL_SERVER_ERROR, "draining")
    } else if admin.status.is_awaiting_rules() {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "waiting for the first rules",
        )
    } else if admin.healthy_needs_a_domain && admin.engine.policy().domains().is_empty() {
        (StatusCode::INTERNAL_SERVER_ERROR, "no rules loaded")
    } else {
        (StatusCode::OK, "OK")
    }
}

/// Ready once rules are loaded (from files the server does not start without them; from xDS,
/// without `FORCE_START_WITHOUT_INITIAL_CONFIG`, once the first good response came) and not
/// draining.
async fn readyz<B: Backend>(State(admin): AdminState<B>) -> impl IntoResponse {
    if admin.status.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if admin.status.is_awaiting_rules() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first rules",
        )
    } else {
        (StatusCode::OK, "ready")
    }
}
