//! The HTTP admin port (axum): `/metrics`, `/healthcheck`, `/readyz`, `/rlconfig`, `/explain` and
//! `POST /json`.

mod explain;
mod json;
mod rlconfig;

pub use json::response_json;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::status::ServerStatus;
use crate::store::AnyStore;

/// What the admin handlers need.
pub struct Admin {
    pub engine: Arc<Engine<AnyStore>>,
    pub metrics: Arc<Metrics>,
    pub status: Arc<ServerStatus>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: `/healthcheck` fails while no domain is loaded.
    pub healthy_needs_a_domain: bool,
    /// `serve --record`: `POST /json` decisions are recorded too.
    pub recorder: Option<Arc<crate::record::Recorder>>,
}

type AdminState = State<Arc<Admin>>;

pub fn router(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthcheck", get(healthcheck))
        .route("/readyz", get(readyz))
        .route("/rlconfig", get(rlconfig::rlconfig))
        .route("/explain", get(explain::explain))
        .route("/json", post(json::json))
        .with_state(admin)
}

/// The debug listener (`DEBUG_ADDR`, the reference's `DEBUG_PORT`): an index and `/rlconfig`.
pub fn debug_router(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/", get(debug_index))
        .route("/rlconfig", get(rlconfig::rlconfig_text))
        .with_state(admin)
}

async fn debug_index() -> &'static str {
    "/rlconfig: the rules in force, one line per limit (JSON on the HTTP port's /rlconfig)\n"
}

async fn metrics(State(admin): AdminState) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        admin.metrics.encode(),
    )
}

/// The reference's health check: 200 `OK`, or 500 once shutting down.
async fn healthcheck(State(admin): AdminState) -> impl IntoResponse {
    if admin.status.is_draining() {
        (StatusCode::INTERNAL_SERVER_ERROR, "draining")
    } else if admin.healthy_needs_a_domain && admin.engine.policy().domains().is_empty() {
        (StatusCode::INTERNAL_SERVER_ERROR, "no rules loaded")
    } else {
        (StatusCode::OK, "OK")
    }
}

/// Ready once rules are loaded (the server does not start without them) and not draining.
async fn readyz(State(admin): AdminState) -> impl IntoResponse {
    if admin.status.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (StatusCode::OK, "ready")
    }
}
