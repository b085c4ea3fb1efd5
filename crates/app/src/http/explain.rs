//! `GET /explain?domain=D&descriptor=k=v,k2=v2`: `Engine::explain` rendered as JSON — which rule
//! one descriptor matches on the live rules, each limit's algorithm and effective numbers, and the
//! state of the counter a decision would charge (what `ratelimit-server explain --server` prints).
//! With `bucket=k=v,k2=v2` instead of `descriptor`, an RLQS bucket (entries in any order): the
//! descriptor it is read as, the rule and pool that govern it, and each stream's share now.
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
use crate::quota::{Governed, Grant};
use crate::store::Backend;

#[derive(Debug, Deserialize)]
pub(super) struct ExplainQuery {
    domain: String,
    descriptor: Option<String>,
    bucket: Option<String>,
}

pub(super) async fn explain<B: Backend>(
    State(admin): State<Arc<Admin<B>>>,
    Query(q): Query<ExplainQuery>,
) -> Response {
    let descriptor = match (&q.descriptor, &q.bucket) {
        (Some(d), None) => d.clone(),
        (None, Some(bucket)) => return explain_bucket(&admin, &q.domain, bucket),
        _ => {
            let message = "give one of descriptor=k=v,... or bucket=k=v,...";
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    let entries = match parse_descriptor(&descriptor) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let engine = &admin.engine;
    let policy = engine.policy();
    let now = engine.now();
    let mut out = json!({
        "domain": q.domain,
        "descriptor": descriptor,
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

/// `/explain?bucket=…`: how an RLQS bucket is read and what each stream holds of it.
fn explain_bucket<B: Backend>(admin: &Admin<B>, domain: &str, bucket: &str) -> Response {
    let entries = match parse_descriptor(bucket) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let (_, mapping) = admin.engine.map_bucket(domain, &entries);
    let live = admin
        .quotas
        .as_ref()
        .and_then(|quotas| quotas.view(domain, &entries));
    let mut out = json!({
        "domain": domain,
        "bucket": bucket,
        "descriptor": descriptor_text(&mapping.descriptor),
    });
    match &mapping.governed {
        Governed::AllowAll(why) => {
            out["outcome"] = json!("allow_all");
            out["why"] = json!(format!("{why:?}"));
        }
        Governed::Unlimited { path, .. } => {
            out["outcome"] = json!("unlimited");
            out["rule"] = json!(path);
        }
        Governed::Limited {
            path, shadow, pool, ..
        } => {
            out["outcome"] = json!(if *shadow { "shadow" } else { "shared" });
            out["rule"] = json!(path);
            out["pool"] = json!({
                "tokens": pool.tokens,
                "period_secs": pool.period_secs,
                "burst": pool.burst,
                "fill_interval_secs": pool.fill_interval_secs(),
            });
        }
    }
    if let Some(view) = &live {
        // This instance's part of the pool (1 unless instances share it through Redis).
        out["fraction"] = json!(view.fraction);
    }
    let streams: Vec<Value> = live
        .map(|view| view.grants)
        .unwrap_or_default()
        .into_iter()
        .map(|(stream, grant, demand)| {
            let grant = match grant {
                Some(Grant::TokenBucket(g)) => json!({
                    "token_bucket": {
                        "max_tokens": g.max_tokens,
                        "tokens_per_fill": g.tokens_per_fill,
                        "fill_interval_secs": g.fill_interval_secs,
                    }
                }),
                Some(Grant::DenyAll) => json!("deny_all"),
                None => Value::Null,
            };
            json!({"stream": stream, "demand_per_sec": demand, "grant": grant})
        })
        .collect();
    out["streams"] = json!(streams);
    Json(out).into_response()
}

fn descriptor_text(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
