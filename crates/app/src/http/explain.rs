//! `GET /explain?domain=D&descriptor=k=v,k2=v2`: `Engine::explain` rendered as JSON — which rule
//! one descriptor matches on the live rules, each limit's algorithm and effective numbers, and the
//! state of the counter a decision would charge (what `ratelimit-server explain --server` prints).
//! Reads only: nothing is charged.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use std::sync::Arc;

use super::Admin;
use crate::config::Algorithm;
use crate::engine::Explained;
use crate::limiter::human;
use crate::policy::{RuleKind, parse_descriptor};
use crate::store::Backend;

#[derive(Debug, Deserialize)]
pub(super) struct ExplainQuery {
    domain: String,
    descriptor: String,
}

pub(super) async fn explain<B: Backend>(
    State(admin): State<Arc<Admin<B>>>,
    Query(q): Query<ExplainQuery>,
) -> Response {
    let entries = match parse_descriptor(&q.descriptor) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let engine = &admin.engine;
    let policy = engine.policy();
    let now = engine.now();
    let mut out = json!({
        "domain": q.domain,
        "descriptor": q.descriptor,
        "now_unix_ns": now,
        "store": B::NAME,
    });
    let (explained, rule) = match engine.explain(&policy, &q.domain, &entries, now).await {
        Ok(answer) => answer,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let (path, shadow_mode, limits) = match explained {
        Explained::UnknownDomain => return outcome(out, "unknown_domain"),
        Explained::Unmatched => return outcome(out, "unmatched"),
        Explained::NoLimit => return outcome(out, "no_limit"),
        Explained::Unlimited { rule, shadow_mode } => {
            out["rule"] = json!(rule);
            out["shadow_mode"] = json!(shadow_mode);
            return outcome(out, "unlimited");
        }
        Explained::Limited {
            rule,
            shadow_mode,
            limits,
        } => (rule, shadow_mode, limits),
    };
    out["rule"] = json!(path);
    out["shadow_mode"] = json!(shadow_mode);
    out["outcome"] = json!("rule");
    let configured = match rule.map(|r| &r.kind) {
        Some(RuleKind::Limited(configured)) => &configured[..],
        _ => &[],
    };
    let limits: Vec<Value> = limits
        .iter()
        .filter_map(|e| Some((e, &configured.get(e.slot)?.limit)))
        .map(|(e, l)| {
            let params = &e.params;
            let mut v = json!({
                "name": l.name,
                "algorithm": params.algorithm.name(),
                "algorithm_is_default": l.algorithm.is_none(),
                "requests_per_unit": l.requests_per_unit,
                "unit": l.unit.name(),
                "unit_multiplier": l.unit_multiplier,
                "window": human(params.period),
                "burst": params.burst,
                "effective": params.describe(),
                "remaining": e.outlook.remaining,
                "reset_after": human(e.outlook.reset_after),
                "reset_after_ns": e.outlook.reset_after,
                "state": e.state.map(|s| json!({"a": s.a, "b": s.b})),
                "state_meaning": params.describe_state(e.state.as_ref(), now),
            });
            if params.algorithm == Algorithm::LeakyBucket {
                v["max_delay"] = json!(human(params.max_delay));
            }
            v
        })
        .collect();
    out["limits"] = json!(limits);
    Json(out).into_response()
}

fn outcome(mut out: Value, outcome: &str) -> Response {
    out["outcome"] = json!(outcome);
    Json(out).into_response()
}
