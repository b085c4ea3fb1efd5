//! The quota API on the admin port (`/v1/…`, JSON), on only with `--admin-token-file`: every
//! call carries `Authorization: Bearer <token>`, compared in constant time (401 without it; with
//! no token file the paths are not served, 404).
//!
//! - `GET /v1/counters?domain=D&prefix=P&limit=N&cursor=C`: a page of a domain's live counters
//!   (`counters`);
//! - `GET /v1/counters/state?domain=D&descriptor=k=v,…`: one descriptor's state, the `/explain`
//!   answer (`counters`);
//! - `POST /v1/reset` `{"domain", "entries"}`: clears the counters a decision on the descriptor
//!   charges (`counters`);
//! - `PUT`, `GET`, `DELETE /v1/overrides`: a limit for one descriptor until it expires, on top of
//!   the rules (`overrides`).
//!
//! Bodies are JSON of at most [`MAX_BODY_BYTES`], read strictly (`forms`); a bad one is a 4xx
//! with `{"error": …}` and changes nothing. Each change is one audit log line (target
//! `ratelimit::audit`) and counts in `ratelimit_quota_api_changes_total{action}`.

mod counters;
mod cursor;
mod forms;
mod overrides;
mod shared;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus::{IntCounterVec, Opts, Registry};
use serde_json::json;
use subtle::ConstantTimeEq;

use ratelimit_core::engine::Engine;
use ratelimit_core::store::Backend;

pub(crate) use overrides::{keep_overrides, keep_shared_overrides};
pub(crate) use shared::{RedisShared, Shared};

/// The largest body read: a descriptor and a limit, with room.
pub(crate) const MAX_BODY_BYTES: usize = 64 << 10;

/// The quota API's state.
pub(crate) struct QuotaApi<B> {
    pub(crate) engine: Arc<Engine<B>>,
    /// The bearer token every call must carry.
    token: Vec<u8>,
    /// Where overrides and counters are shared with other instances (Redis); `None`: memory.
    shared: Option<Arc<dyn Shared>>,
    /// `MAX_OVERRIDES`: a new descriptor's override beyond it is refused.
    max_overrides: usize,
    metrics: QuotaApiMetrics,
    /// Override changes made through this instance: a read of the shared store that one
    /// overtook is not put in force.
    local_changes: AtomicU64,
}

impl<B: Backend> QuotaApi<B> {
    /// The API on `engine`, answering calls that carry `token`; `shared`: the shared store's
    /// part, if counters are shared; at most `max_overrides` overrides in force.
    pub(crate) fn new(
        engine: Arc<Engine<B>>,
        token: Vec<u8>,
        shared: Option<Arc<dyn Shared>>,
        max_overrides: usize,
        registry: &Registry,
    ) -> QuotaApi<B> {
        QuotaApi {
            engine,
            token,
            shared,
            max_overrides,
            metrics: QuotaApiMetrics::register(registry),
            local_changes: AtomicU64::new(0),
        }
    }

    /// The bounds of strings (`MAX_STRING_LEN`).
    fn max_len(&self) -> usize {
        self.engine.settings().bounds.max_string_len
    }

    /// Counts a change and writes its audit line.
    fn changed(&self, action: &'static str, what: &str) {
        self.metrics.changes.with_label_values(&[action]).inc();
        tracing::info!(target: "ratelimit::audit", action, "{what}");
    }

    /// A refused call, counted by why.
    fn refuse(&self, reason: &'static str, status: StatusCode, message: String) -> Response {
        self.metrics.refused.with_label_values(&[reason]).inc();
        error(status, message)
    }
}

/// The series: changes made, calls refused.
struct QuotaApiMetrics {
    changes: IntCounterVec,
    refused: IntCounterVec,
}

impl QuotaApiMetrics {
    fn register(registry: &Registry) -> QuotaApiMetrics {
        let metrics = QuotaApiMetrics {
            changes: IntCounterVec::new(
                Opts::new(
                    "ratelimit_quota_api_changes_total",
                    "Changes made through the quota API, by action (reset, override_set, \
                     override_delete)",
                ),
                &["action"],
            )
            .expect("valid metric"),
            refused: IntCounterVec::new(
                Opts::new(
                    "ratelimit_quota_api_refused_total",
                    "Quota API calls refused, by reason (unauthorized, invalid, full, unavailable)",
                ),
                &["reason"],
            )
            .expect("valid metric"),
        };
        let _ = registry.register(Box::new(metrics.changes.clone()));
        let _ = registry.register(Box::new(metrics.refused.clone()));
        metrics
    }
}

/// `{"error": message}` with `status`.
fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

type ApiState<B> = State<Arc<QuotaApi<B>>>;

/// The `/v1/…` routes, each behind the token check.
pub(crate) fn router<B: Backend>(api: Arc<QuotaApi<B>>) -> Router {
    Router::new()
        .route("/v1/counters", get(counters::list::<B>))
        .route("/v1/counters/state", get(counters::state::<B>))
        .route("/v1/reset", post(counters::reset::<B>))
        .route(
            "/v1/overrides",
            get(overrides::list::<B>)
                .put(overrides::set::<B>)
                .delete(overrides::remove::<B>),
        )
        .route_layer(middleware::from_fn_with_state(api.clone(), authorize::<B>))
        .with_state(api)
}

/// Lets a call through only with `Authorization: Bearer <token>` (the scheme in any case, the
/// token compared in constant time).
async fn authorize<B: Backend>(State(api): ApiState<B>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let ok = given.is_some_and(|t| bool::from(t.as_bytes().ct_eq(&api.token)));
    if !ok {
        let mut refused = api.refuse(
            "unauthorized",
            StatusCode::UNAUTHORIZED,
            "the quota API needs 'Authorization: Bearer <token>' with the token of \
             --admin-token-file"
                .into(),
        );
        refused
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid"));
        return refused;
    }
    next.run(request).await
}

/// A JSON body read as the form `F`, and the descriptor's entries it names, checked; or the
/// refusal (415, 413, 400).
async fn read_form<B, F>(
    api: &QuotaApi<B>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(F, Vec<(String, String)>), Response>
where
    B: Backend,
    F: serde::de::DeserializeOwned + forms::WithEntries,
{
    let body = read_body(api, headers, body).await?;
    let form: F =
        forms::read(&body).map_err(|m| api.refuse("invalid", StatusCode::BAD_REQUEST, m))?;
    let entries = form
        .entries(api.max_len())
        .map_err(|m| api.refuse("invalid", StatusCode::BAD_REQUEST, m))?;
    Ok((form, entries))
}

/// A JSON body of at most [`MAX_BODY_BYTES`], or the refusal (415, 413, 400).
async fn read_body<B>(
    api: &QuotaApi<B>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, Response>
where
    B: Backend,
{
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if !content_type.is_some_and(super::json::is_json_media_type) {
        return Err(api.refuse(
            "invalid",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".into(),
        ));
    }
    match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => Ok(bytes.to_vec()),
        Err(e) if super::json::is_length_limit(&e) => Err(api.refuse(
            "invalid",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        )),
        Err(e) => Err(api.refuse(
            "invalid",
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )),
    }
}
