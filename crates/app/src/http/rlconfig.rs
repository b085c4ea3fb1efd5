//! `GET /rlconfig`: the live rules as JSON (`?format=json`, the default) or, with `?format=text`,
//! one line per limit as the reference prints them, plus the last rules load and the overrides
//! in force (set through the quota API). Any other format is
//! refused with 400. Both are written rule by rule into a streamed body ([`super::stream`]), so a
//! rule set of any size costs a few pieces of memory and no async thread.

use std::io::{self, Write};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AdminState;
use ratelimit_core::clock::Nanos;
use ratelimit_core::config::format_duration;
use ratelimit_core::limiter::LimitDefaults;
use ratelimit_core::overrides::{Override, Overrides};
use ratelimit_core::policy::{Policy, Rule, RuleKind};
use ratelimit_core::store::Backend;

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
                if let Some(calendar) = &l.calendar {
                    v["calendar"] = json!({
                        "unit": calendar.unit.name(),
                        "time_zone": calendar.time_zone,
                    });
                }
                if params.algorithm == ratelimit_core::config::Algorithm::LeakyBucket {
                    v["max_delay"] = json!(format_duration(std::time::Duration::from_nanos(
                        params.max_delay
                    )));
                }
                v
            })
            .collect(),
        RuleKind::Concurrency(_) => Vec::new(),
    };
    let mut v = json!({
        "path": rule.path,
        "unlimited": matches!(rule.kind, RuleKind::Unlimited { .. }),
        "limits": limits,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
    });
    if let RuleKind::Concurrency(c) = &rule.kind {
        v["concurrency"] = json!({
            "max_in_flight": c.max_in_flight,
            "lease": format_duration(c.lease),
        });
    }
    v
}

/// An override as `/rlconfig` shows it.
fn override_json(o: &Override, now: Nanos) -> Value {
    json!({
        "domain": o.domain,
        "descriptor": o.descriptor(),
        "unit": o.unit.0.name(),
        "requests_per_unit": o.requests_per_unit,
        "expires_in_seconds": o.seconds_left(now),
    })
}

/// One line per override: `override <domain> <k=v,…>: unit=MINUTE requests_per_unit=3,
/// expires_in_seconds: 60`.
fn write_overrides_text(overrides: &Overrides, now: Nanos, out: &mut dyn Write) -> io::Result<()> {
    for o in overrides.listed(None, now) {
        writeln!(
            out,
            "override {} {}: unit={} requests_per_unit={}, expires_in_seconds: {}",
            o.domain,
            o.descriptor(),
            o.unit.0.name().to_uppercase(),
            o.requests_per_unit,
            o.seconds_left(now)
        )?;
    }
    Ok(())
}

/// One line per limit: `<domain>.<path>: unit=MINUTE requests_per_unit=3, shadow_mode: false, …`.
pub(super) fn write_text(
    policy: &Policy,
    defaults: &LimitDefaults,
    out: &mut dyn Write,
) -> io::Result<()> {
    for domain in policy.domains() {
        for rule in domain.rules() {
            let full = format!("{}.{}", domain.name, rule.path);
            match &rule.kind {
                RuleKind::Unlimited { .. } => {
                    writeln!(
                        out,
                        "{full}: unlimited, shadow_mode: {}, quota_mode: {}",
                        rule.shadow_mode, rule.quota_mode
                    )?;
                }
                RuleKind::Concurrency(c) => {
                    writeln!(
                        out,
                        "{full}: concurrency max_in_flight={} lease={}, shadow_mode: {}",
                        c.max_in_flight,
                        format_duration(c.lease),
                        rule.shadow_mode
                    )?;
                }
                RuleKind::Limited(limits) => {
                    for rl in limits {
                        let l = &rl.limit;
                        writeln!(
                            out,
                            "{full}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}, unit_multiplier: {}, algorithm: {}, burst: {}",
                            l.unit.name().to_uppercase(),
                            l.requests_per_unit,
                            rule.shadow_mode,
                            rule.quota_mode,
                            l.unit_multiplier,
                            rl.params(defaults).algorithm,
                            l.effective_burst(),
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The whole rules document, `{"domains": [{"domain", "rules": […]}…], "overrides", "last_load"}`, one rule
/// at a time (keys in the order `serde_json` gives a whole document).
pub(super) fn write_json(
    policy: &Policy,
    defaults: &LimitDefaults,
    (overrides, now): (&Overrides, Nanos),
    last_load: &Value,
    out: &mut dyn Write,
) -> io::Result<()> {
    out.write_all(b"{\"domains\":[")?;
    for (i, domain) in policy.domains().into_iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"{\"domain\":")?;
        serde_json::to_writer(&mut *out, &domain.name)?;
        out.write_all(b",\"rules\":[")?;
        for (j, rule) in domain.rules().into_iter().enumerate() {
            if j > 0 {
                out.write_all(b",")?;
            }
            serde_json::to_writer(&mut *out, &rule_json(rule, defaults))?;
        }
        out.write_all(b"]}")?;
    }
    out.write_all(b"],\"overrides\":")?;
    let listed: Vec<Value> = overrides
        .listed(None, now)
        .into_iter()
        .map(|o| override_json(o, now))
        .collect();
    serde_json::to_writer(&mut *out, &listed)?;
    out.write_all(b",\"last_load\":")?;
    serde_json::to_writer(&mut *out, last_load)?;
    out.write_all(b"}")
}

/// The text dump, streamed.
async fn stream_text<B: Backend>(admin: &super::Admin<B>) -> Response {
    let policy = admin.engine.policy();
    let defaults = admin.engine.settings().defaults;
    let overrides = admin.engine.overrides();
    let now = admin.engine.now();
    admin
        .renders
        .stream("text/plain; charset=utf-8", move |out| {
            write_text(&policy, &defaults, out)?;
            write_overrides_text(&overrides, now, out)
        })
        .await
}

/// The debug listener's `/rlconfig`: the text dump, as the reference's debug port serves it.
pub(super) async fn rlconfig_text<B: Backend>(State(admin): AdminState<B>) -> Response {
    stream_text(&admin).await
}

pub(super) async fn rlconfig<B: Backend>(
    State(admin): AdminState<B>,
    Query(format): Query<Format>,
) -> Response {
    match format.format.as_deref() {
        None | Some("json") => {}
        Some("text") => return stream_text(&admin).await,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown format '{other}': accepted formats are json, text\n"),
            )
                .into_response();
        }
    }
    let policy = admin.engine.policy();
    let defaults = admin.engine.settings().defaults;
    let last_load = json!(admin.status.last_load());
    let overrides = admin.engine.overrides();
    let now = admin.engine.now();
    admin
        .renders
        .stream("application/json", move |out| {
            write_json(&policy, &defaults, (&overrides, now), &last_load, out)
        })
        .await
}
