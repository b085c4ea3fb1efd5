//! `GET /rlconfig`: the live rules as JSON (`?format=json`, the default) or, with `?format=text`,
//! one line per limit as the reference prints them, plus the last rules load. Any other format is
//! refused with 400.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AdminState;
use crate::config::format_duration;
use crate::limiter::LimitDefaults;
use crate::policy::{Policy, Rule, RuleKind};
use crate::store::Backend;

#[derive(Debug, Deserialize)]
pub(super) struct Format {
    format: Option<String>,
}

/// A rule's limits as served: the algorithm and max delay resolved with the server's defaults.
fn rule_json(rule: &Rule, defaults: &LimitDefaults) -> Value {
    let limits: Vec<Value> = match &rule.kind {
        RuleKind::Unlimited { .. } => Vec::new(),
        RuleKind::Limited(limits) => limits
            .iter()
            .map(|rl| {
                let l = &rl.limit;
                let params = rl.params(defaults);
                let mut v = json!({
                    "name": l.name,
                    "requests_per_unit": l.requests_per_unit,
                    "unit": l.unit.name(),
                    "unit_multiplier": l.unit_multiplier,
                    "algorithm": params.algorithm.name(),
                    "burst": l.effective_burst(),
                    "replaces": l.replaces,
                });
                if params.algorithm == crate::config::Algorithm::LeakyBucket {
                    v["max_delay"] = json!(format_duration(std::time::Duration::from_nanos(
                        params.max_delay
                    )));
                }
                v
            })
            .collect(),
    };
    json!({
        "path": rule.path,
        "unlimited": matches!(rule.kind, RuleKind::Unlimited { .. }),
        "limits": limits,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
    })
}

/// One line per limit: `<domain>.<path>: unit=MINUTE requests_per_unit=3, shadow_mode: false, …`.
pub fn text(policy: &Policy, defaults: &LimitDefaults) -> String {
    let mut out = String::new();
    for domain in policy.domains() {
        for rule in domain.rules() {
            let full = format!("{}.{}", domain.name, rule.path);
            match &rule.kind {
                RuleKind::Unlimited { .. } => {
                    out.push_str(&format!(
                        "{full}: unlimited, shadow_mode: {}, quota_mode: {}\n",
                        rule.shadow_mode, rule.quota_mode
                    ));
                }
                RuleKind::Limited(limits) => {
                    for rl in limits {
                        let l = &rl.limit;
                        out.push_str(&format!(
                            "{full}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}, unit_multiplier: {}, algorithm: {}, burst: {}\n",
                            l.unit.name().to_uppercase(),
                            l.requests_per_unit,
                            rule.shadow_mode,
                            rule.quota_mode,
                            l.unit_multiplier,
                            rl.params(defaults).algorithm,
                            l.effective_burst(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The debug listener's `/rlconfig`: the text dump, as the reference's debug port serves it.
pub(super) async fn rlconfig_text<B: Backend>(State(admin): AdminState<B>) -> Response {
    text(&admin.engine.policy(), &admin.engine.settings().defaults).into_response()
}

pub(super) async fn rlconfig<B: Backend>(
    State(admin): AdminState<B>,
    Query(format): Query<Format>,
) -> Response {
    let policy = admin.engine.policy();
    let defaults = admin.engine.settings().defaults;
    match format.format.as_deref() {
        None | Some("json") => {}
        Some("text") => return text(&policy, &defaults).into_response(),
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown format '{other}': accepted formats are json, text\n"),
            )
                .into_response();
        }
    }
    let domains: Vec<Value> = policy
        .domains()
        .iter()
        .map(|d| json!({"domain": d.name, "rules": d.rules().into_iter().map(|r| rule_json(r, &defaults)).collect::<Vec<_>>()}))
        .collect();
    Json(json!({"domains": domains, "last_load": admin.status.last_load()})).into_response()
}
