//! Counters through the quota API: a page of a domain's live counters (memory: from the names
//! the engine noted; Redis: a `SCAN` walk), one descriptor's state (the `/explain` answer, from
//! `Engine::explain`), and a reset (the counters a decision on the descriptor charges, cleared in
//! the store, so every instance sharing it sees the reset at once).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::cursor::Cursor;
use super::forms::{self, DescriptorForm};
use super::{ApiState, QuotaApi, error, read_form};
use ratelimit_core::clock::Nanos;
use ratelimit_core::config::Algorithm;
use ratelimit_core::limiter::{self, State as CounterState, human};
use ratelimit_core::overrides::describe;
use ratelimit_core::policy::parse_descriptor;
use ratelimit_core::store::{Backend, CounterName};
use ratelimit_core::wire::explain::Explanation;

/// Counters per page unless `limit` says.
const DEFAULT_LIMIT: usize = 100;
/// The most counters per page.
const MAX_LIMIT: usize = 1000;
/// Keys Redis is asked to look at per `SCAN` step.
const SCAN_COUNT: usize = 1000;
/// The most `SCAN` steps one page takes: a page may hold fewer than `limit` counters (even none)
/// when the domain's keys are sparse; the walk ends when `next_cursor` is `null`.
const SCAN_STEPS: usize = 32;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    domain: String,
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StateQuery {
    domain: String,
    descriptor: String,
}

/// A query string that did not read, as a JSON 400.
fn bad_query<B: Backend>(api: &QuotaApi<B>, e: &QueryRejection) -> Response {
    api.refuse("invalid", StatusCode::BAD_REQUEST, e.body_text())
}

/// One listed counter.
fn item<B: Backend>(
    api: &QuotaApi<B>,
    domain: &str,
    entries: Option<&[(String, String)]>,
    (slot, algorithm, period): (usize, Algorithm, Nanos),
    state: CounterState,
    now: Nanos,
) -> Value {
    let limit = entries.and_then(|e| {
        api.engine
            .counter_limit(domain, e, slot, algorithm, period, now)
    });
    let outlook = limit.map(|l| limiter::evaluate(&l.params, Some(state), now, 0).without_charge);
    json!({
        "descriptor": entries.map(describe),
        "entries": entries.map(|e| e.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()),
        "slot": slot,
        "algorithm": algorithm.name(),
        "window": human(period),
        "limit": limit.map(|l| json!({
            "requests_per_unit": l.params.requests_per_unit,
            "unit": l.unit.name(),
            "overridden": l.overridden,
        })),
        "remaining": outlook.map(|o| o.remaining),
        "reset_after_ns": outlook.map(|o| o.reset_after),
        "state": {"a": state.a, "b": state.b},
    })
}

/// `GET /v1/counters`.
pub(super) async fn list<B: Backend>(
    State(api): ApiState<B>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return bad_query(&api, &e),
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        let message = format!("'limit' must be 1 to {MAX_LIMIT}, found {limit}");
        return api.refuse("invalid", StatusCode::BAD_REQUEST, message);
    }
    let start = match forms::prefix(&q.prefix) {
        Ok(s) => s,
        Err(m) => return api.refuse("invalid", StatusCode::BAD_REQUEST, m),
    };
    let cursor = match q.cursor.as_deref().map(Cursor::decode).transpose() {
        Ok(c) => c,
        Err(m) => return api.refuse("invalid", StatusCode::BAD_REQUEST, m),
    };
    let page = match &api.shared {
        Some(_) => redis_page(&api, &q.domain, start, limit, cursor).await,
        None => memory_page(&api, &q.domain, &start, limit, cursor).await,
    };
    match page {
        Ok((counters, next)) => Json(json!({
            "domain": q.domain,
            "counters": counters,
            "next_cursor": next.map(|c| c.encode()),
        }))
        .into_response(),
        Err(response) => response,
    }
}

type Page = Result<(Vec<Value>, Option<Cursor>), Response>;

/// Where a counter sorts in a memory listing.
fn sort_key(n: &CounterName) -> (Vec<(String, String)>, usize, u8, u64) {
    (n.entries.clone(), n.slot, n.algorithm.code(), n.period)
}

/// A page from the names the engine noted, sorted by entries; names whose state is gone are
/// forgotten on the way.
async fn memory_page<B: Backend>(
    api: &QuotaApi<B>,
    domain: &str,
    start: &[(String, Option<String>)],
    limit: usize,
    cursor: Option<Cursor>,
) -> Page {
    let after = match cursor {
        None => None,
        Some(Cursor::Memory { after }) => Some(after),
        Some(Cursor::Redis { .. }) => {
            let message = "invalid cursor: it is not this store's".to_owned();
            return Err(api.refuse("invalid", StatusCode::BAD_REQUEST, message));
        }
    };
    let Some(names) = api.engine.counter_names() else {
        return Ok((Vec::new(), None));
    };
    let mut found: Vec<(_, Arc<CounterName>)> = names
        .of_domain(domain)
        .into_iter()
        .filter(|n| forms::starts_with(&n.entries, start))
        .map(|n| (sort_key(&n), n))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(after) = &after {
        found.retain(|(k, _)| k > after);
    }
    let now = api.engine.now();
    let store = api.engine.store();
    let mut page = Vec::new();
    let mut last = None;
    let mut rest = found.into_iter();
    for (sort, name) in rest.by_ref() {
        let key = store.key(&name.id());
        let state = store.state(&key).await.map_err(|e| unavailable(api, &e))?;
        let Some(state) = state.filter(|s| s.expires_at() > now) else {
            names.forget(&name);
            continue;
        };
        let id = (name.slot, name.algorithm, name.period);
        page.push(item(api, domain, Some(&name.entries), id, state, now));
        last = Some(sort);
        if page.len() == limit {
            break;
        }
    }
    let more = rest.next().is_some();
    let next = last.filter(|_| more).map(|after| Cursor::Memory { after });
    Ok((page, next))
}

/// A page of a `SCAN` walk: steps from the cursor until `limit` counters are found, the walk
/// ends, or [`SCAN_STEPS`] steps were taken.
async fn redis_page<B: Backend>(
    api: &QuotaApi<B>,
    domain: &str,
    start: Vec<(String, Option<String>)>,
    limit: usize,
    cursor: Option<Cursor>,
) -> Page {
    let Some(shared) = &api.shared else {
        return Ok((Vec::new(), None));
    };
    let (mut scan, mut after) = match cursor {
        None => (0, None),
        Some(Cursor::Redis { scan, after }) => (scan, after),
        Some(Cursor::Memory { .. }) => {
            let message = "invalid cursor: it is not this store's".to_owned();
            return Err(api.refuse("invalid", StatusCode::BAD_REQUEST, message));
        }
    };
    let now = api.engine.now();
    let mut page = Vec::new();
    for _ in 0..SCAN_STEPS {
        let step = shared
            .scan(domain.to_owned(), start.clone(), scan, SCAN_COUNT)
            .await
            .map_err(|e| unavailable(api, &e))?;
        let mut found = step.counters;
        found.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        if let Some(after) = after.take() {
            found.retain(|c| c.key.as_str() > after.as_str());
        }
        let mut taken = found.into_iter().peekable();
        while let Some(c) = taken.next() {
            let Some(state) = c.state.filter(|s| s.expires_at() > now) else {
                continue;
            };
            let id = (c.slot, c.algorithm, c.period);
            let mut listed = item(api, domain, c.entries.as_deref(), id, state, now);
            listed["key"] = json!(c.key.as_str());
            page.push(listed);
            if page.len() == limit {
                let next = if taken.peek().is_some() {
                    Some(Cursor::Redis {
                        scan,
                        after: Some(c.key.as_str().to_owned()),
                    })
                } else {
                    (step.next != 0).then_some(Cursor::Redis {
                        scan: step.next,
                        after: None,
                    })
                };
                return Ok((page, next));
            }
        }
        if step.next == 0 {
            return Ok((page, None));
        }
        scan = step.next;
    }
    Ok((page, Some(Cursor::Redis { scan, after: None })))
}

/// The store did not answer: 503.
fn unavailable<B: Backend>(api: &QuotaApi<B>, e: &impl std::fmt::Display) -> Response {
    api.refuse(
        "unavailable",
        StatusCode::SERVICE_UNAVAILABLE,
        e.to_string(),
    )
}

/// `GET /v1/counters/state`: the `/explain` answer for one descriptor.
pub(super) async fn state<B: Backend>(
    State(api): ApiState<B>,
    query: Result<Query<StateQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return bad_query(&api, &e),
    };
    let entries = match parse_descriptor(&q.descriptor) {
        Ok(e) => e,
        Err(m) => return api.refuse("invalid", StatusCode::BAD_REQUEST, m),
    };
    let now = api.engine.now();
    match api.engine.explain(&q.domain, &entries, now).await {
        Ok(explained) => Json(Explanation {
            domain: q.domain,
            descriptor: q.descriptor,
            now_unix_ns: now,
            store: B::NAME.into(),
            explained,
        })
        .into_response(),
        Err(e) => unavailable(&api, &e),
    }
}

/// `POST /v1/reset`: clears every counter a decision on the descriptor charges (with an
/// override in force, the override's and the rule's own).
pub(super) async fn reset<B: Backend>(
    State(api): ApiState<B>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (form, entries) = match read_form::<_, DescriptorForm>(&api, &headers, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let descriptor = describe(&entries);
    let now = api.engine.now();
    let keys = api.engine.descriptor_keys(&form.domain, &entries, now);
    if keys.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "no limit applies to '{descriptor}' in domain '{}': nothing to reset",
                form.domain
            ),
        );
    }
    let mut cleared = 0;
    for key in &keys {
        match api.engine.store().reset(key).await {
            Ok(true) => cleared += 1,
            Ok(false) => {}
            Err(e) => return unavailable(&api, &e),
        }
    }
    api.changed(
        "reset",
        &format!(
            "reset domain={} descriptor={descriptor} counters={} cleared={cleared}",
            form.domain,
            keys.len()
        ),
    );
    Json(json!({
        "domain": form.domain,
        "descriptor": descriptor,
        "counters": keys.len(),
        "cleared": cleared,
    }))
    .into_response()
}
