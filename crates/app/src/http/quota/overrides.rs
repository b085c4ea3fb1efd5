//! Overrides through the quota API: set (`PUT`), list (`GET`) and remove (`DELETE`) a limit for
//! one descriptor until it expires, applied on top of the rules without a reload. With Redis an
//! override is written there first (with a TTL to its expiry), then applied here; every instance
//! asks every `shared::POLL_INTERVAL` whether the set changed and reads it back when it did
//! ([`keep_shared_overrides`]), so a change made on one applies on the others within that, and a
//! restarted instance finds them. With the
//! memory store they live in the process ([`keep_overrides`] drops the expired ones).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::forms::{DescriptorForm, OverrideForm};
use super::shared::{FULL_READ_EVERY, POLL_INTERVAL, Shared};
use super::{ApiState, QuotaApi, error, read_form};
use ratelimit_core::clock::{NANOS_PER_SECOND, Nanos};
use ratelimit_core::engine::Engine;
use ratelimit_core::overrides::{Override, Overrides};
use ratelimit_core::store::Backend;
use ratelimit_core::wire::time::format_second;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    domain: Option<String>,
}

/// An override as the API shows it.
fn view(o: &Override, now: Nanos) -> Value {
    json!({
        "domain": o.domain,
        "descriptor": o.descriptor(),
        "entries": o.entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
        "limit": {"unit": o.unit.0.name(), "requests_per_unit": o.requests_per_unit},
        "expires_in_seconds": o.seconds_left(now),
        "expires_at": format_second(o.expires_at / NANOS_PER_SECOND),
    })
}

/// `PUT /v1/overrides`.
pub(super) async fn set<B: Backend>(
    State(api): ApiState<B>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (form, entries) = match read_form::<_, OverrideForm>(&api, &headers, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let now = api.engine.now();
    let current = api.engine.overrides();
    if current.len() >= api.max_overrides && !current.holds(&form.domain, &entries) {
        return api.refuse(
            "full",
            StatusCode::CONFLICT,
            format!(
                "{} overrides are in force, the most MAX_OVERRIDES allows: remove some, let \
                 them expire, or put these limits in the rules",
                current.len()
            ),
        );
    }
    let set = Override {
        domain: form.domain,
        entries,
        unit: form.limit.unit,
        requests_per_unit: form.limit.requests_per_unit,
        expires_at: now.saturating_add(form.ttl_seconds.saturating_mul(NANOS_PER_SECOND)),
    };
    if let Some(shared) = &api.shared
        && let Err(e) = shared.put(set.clone(), form.ttl_seconds * 1000).await
    {
        return api.refuse(
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        );
    }
    api.engine
        .change_overrides(|current| Some(current.with(set.clone())));
    api.local_changes.fetch_add(1, Ordering::AcqRel);
    api.changed(
        "override_set",
        &format!(
            "override set domain={} descriptor={} requests_per_unit={} unit={} ttl_seconds={}",
            set.domain,
            set.descriptor(),
            set.requests_per_unit,
            set.unit.0.name(),
            form.ttl_seconds
        ),
    );
    Json(view(&set, now)).into_response()
}

/// `GET /v1/overrides?domain=D` (every domain without `domain`): those in force here.
pub(super) async fn list<B: Backend>(
    State(api): ApiState<B>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return api.refuse("invalid", StatusCode::BAD_REQUEST, e.body_text()),
    };
    let now = api.engine.now();
    let overrides = api.engine.overrides();
    let listed: Vec<Value> = overrides
        .listed(q.domain.as_deref(), now)
        .into_iter()
        .map(|o| view(o, now))
        .collect();
    Json(json!({ "overrides": listed })).into_response()
}

/// `DELETE /v1/overrides`: 404 when the descriptor has none.
pub(super) async fn remove<B: Backend>(
    State(api): ApiState<B>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (form, entries) = match read_form::<_, DescriptorForm>(&api, &headers, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let mut removed = false;
    if let Some(shared) = &api.shared {
        match shared.delete(form.domain.clone(), entries.clone()).await {
            Ok(r) => removed = r,
            Err(e) => {
                return api.refuse(
                    "unavailable",
                    StatusCode::SERVICE_UNAVAILABLE,
                    e.to_string(),
                );
            }
        }
    }
    removed |= api
        .engine
        .change_overrides(|current| current.without(&form.domain, &entries));
    api.local_changes.fetch_add(1, Ordering::AcqRel);
    let descriptor = ratelimit_core::overrides::describe(&entries);
    if !removed {
        return error(
            StatusCode::NOT_FOUND,
            format!("no override for '{descriptor}' in domain '{}'", form.domain),
        );
    }
    api.changed(
        "override_delete",
        &format!(
            "override removed domain={} descriptor={descriptor}",
            form.domain
        ),
    );
    Json(json!({"domain": form.domain, "descriptor": descriptor, "removed": true})).into_response()
}

/// How often the memory store's expired overrides are dropped and the counter names of states
/// gone are forgotten.
const KEEP_INTERVAL: Duration = Duration::from_secs(5);

/// With the memory store: drops expired overrides and forgets the names of counters whose state
/// is gone, every [`KEEP_INTERVAL`], until `stop`.
pub(crate) async fn keep_overrides<B: Backend>(
    engine: Arc<Engine<B>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(KEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let now = engine.now();
        engine.change_overrides(|current| current.without_expired(now));
        if let Some(names) = engine.counter_names() {
            for name in names.all() {
                let key = engine.store().key(&name.id());
                let state = engine.store().state(&key).await;
                if matches!(state, Ok(None))
                    || matches!(state, Ok(Some(s)) if s.expires_at() <= now)
                {
                    names.forget(&name);
                }
            }
        }
    }
}

/// With a shared store: asks every [`POLL_INTERVAL`] whether the overrides changed (their count
/// of changes, one `GET`) and, when they did or [`FULL_READ_EVERY`] has passed, reads them back and
/// puts those live in force (when they differ), until `stop`; between reads it drops the expired
/// ones. (Reading the whole set at each tick cost, with 20,000 overrides, 11 % of a core of each
/// instance and 6 % of Redis's, at rest.) A read that a change made here overtook is dropped (it
/// may predate the change). While the store does not answer, the last set read stays (its
/// overrides still expire on time).
pub(crate) async fn keep_shared_overrides<B: Backend>(
    api: Arc<QuotaApi<B>>,
    shared: Arc<dyn Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let engine = &api.engine;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    // The count of changes of the last set put in force, and when it was read.
    let mut read: Option<(u64, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let now = engine.now();
        let changes = api.local_changes.load(Ordering::Acquire);
        let version = shared.version().await;
        let unchanged = matches!((&version, read), (Ok(v), Some((seen, at)))
            if *v == seen && at.elapsed() < FULL_READ_EVERY);
        if unchanged {
            engine.change_overrides(|current| current.without_expired(now));
            continue;
        }
        let stored = match version {
            Ok(version) => shared.load().await.map(|stored| (version, stored)),
            Err(e) => Err(e),
        };
        if api.local_changes.load(Ordering::Acquire) != changes {
            continue;
        }
        match stored {
            Ok((version, stored)) => {
                if failing {
                    tracing::info!("overrides read from the shared store again");
                    failing = false;
                }
                read = Some((version, tokio::time::Instant::now()));
                let live = Overrides::new(stored.into_iter().filter(|o| o.is_live(now)));
                engine.change_overrides(|current| (live != *current).then_some(live));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the overrides from the shared store; the last ones read stay in force");
                    failing = true;
                }
                engine.change_overrides(|current| current.without_expired(now));
            }
        }
    }
}
