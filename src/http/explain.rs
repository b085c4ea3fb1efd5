//! `GET /explain?domain=D&descriptor=k=v,k2=v2`: which rule one descriptor matches on the live
//! rules, each limit's algorithm and effective numbers, and the current state of its key (what
//! `ratelimit-server explain --server` prints). Reads only: nothing is charged.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AdminState;
use crate::config::Algorithm;
use crate::limiter::{self, human};
use crate::policy::parse_descriptor;
use crate::policy::{Outcome, RuleKind};

#[derive(Debug, Deserialize)]
pub(super) struct ExplainQuery {
    domain: String,
    descriptor: String,
}

pub(super) async fn explain(State(admin): AdminState, Query(q): Query<ExplainQuery>) -> Response {
    let entries = match parse_descriptor(&q.descriptor) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let engine = &admin.engine;
    let policy = engine.policy();
    let defaults = engine.settings().defaults;
    let now = engine.now();
    let mut out = json!({
        "domain": q.domain,
        "descriptor": q.descriptor,
        "now_unix_ns": now,
        "store": engine.store().backend(),
    });
    let Some(rules) = policy.domain(&q.domain) else {
        out["outcome"] = json!("unknown_domain");
        return Json(out).into_response();
    };
    let pairs = || entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let rule = match rules.walk(pairs(), |_| {}) {
        Outcome::Rule(rule) => rule,
        Outcome::NoLimitOnNode => {
            out["outcome"] = json!("no_limit");
            return Json(out).into_response();
        }
        Outcome::Unmatched => {
            out["outcome"] = json!("unmatched");
            return Json(out).into_response();
        }
    };
    out["rule"] = json!(rule.path);
    out["shadow_mode"] = json!(rule.shadow_mode);
    let RuleKind::Limited(limits) = &rule.kind else {
        out["outcome"] = json!("unlimited");
        return Json(out).into_response();
    };
    out["outcome"] = json!("rule");
    let mut out_limits: Vec<Value> = Vec::with_capacity(limits.len());
    for (slot, rl) in limits.iter().enumerate() {
        let params = rl.params(&defaults);
        let state = match engine.look(&q.domain, pairs(), slot, &params).await {
            Ok(state) => state,
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        };
        let outlook = limiter::evaluate(&params, state, now, 0).without_charge;
        let l = &rl.limit;
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
            "remaining": outlook.remaining,
            "reset_after": human(outlook.reset_after),
            "reset_after_ns": outlook.reset_after,
            "state": state.map(|s| json!({"a": s.a, "b": s.b})),
            "state_meaning": params.describe_state(state.as_ref(), now),
        });
        if params.algorithm == Algorithm::LeakyBucket {
            v["max_delay"] = json!(human(params.max_delay));
        }
        out_limits.push(v);
    }
    let limits = out_limits;
    out["limits"] = json!(limits);
    Json(out).into_response()
}
