//! The HTTP admin port (axum): `/healthcheck` as the reference answers it.

use axum::Router;
use axum::routing::get;

pub fn router() -> Router {
    Router::new().route("/healthcheck", get(|| async { "OK" }))
}
