//! `POST /json`: the reference's JSON form of ShouldRateLimit. The body is a proto3-JSON
//! RateLimitRequest (camelCase or original field names, enums by name or number); the answer is a
//! proto3-JSON RateLimitResponse (zero values omitted) with HTTP 200 for OK, 429 for OVER_LIMIT,
//! 400 for bad input and 500 when the store fails. A `serve --record` line is a valid body: its
//! `v`, `time` and `decision` are accepted and ignored.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};

use super::AdminState;
use crate::engine::{Decision, EngineError};
use crate::store::Backend;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Number>,
    /// A record line's (docs/record.md) format version, time and decision: accepted and ignored,
    /// so a record line POSTs as it is.
    #[serde(default, rename = "v")]
    _version: Option<IgnoredAny>,
    #[serde(default, rename = "time")]
    _time: Option<IgnoredAny>,
    #[serde(default, rename = "decision")]
    _decision: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Number>,
    #[serde(default, alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<EnumValue>,
}

/// A proto3-JSON integer: a JSON number or, as proto3 JSON writes 64-bit integers, a string.
/// Checked after parsing (not by serde), so a bad value gets a message naming its field.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct Number(Value);

impl Number {
    fn get(&self, field: &str, max: u64) -> Result<u64, String> {
        let n = match &self.0 {
            Value::Number(n) => n.as_u64(),
            Value::String(t) => t.parse::<u64>().ok(),
            _ => None,
        };
        n.filter(|n| *n <= max).ok_or_else(|| {
            format!(
                "{field} must be a whole number from 0 to {max}, not {}",
                self.0
            )
        })
    }
}

/// A proto3-JSON enum: its name or its number.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct EnumValue(Value);

fn u32_field(n: &Option<Number>, field: &str) -> Result<u32, String> {
    match n {
        None => Ok(0),
        // `get` bounds the value by u32::MAX.
        Some(n) => Ok(n.get(field, u64::from(u32::MAX))? as u32),
    }
}

fn unit(value: &Option<EnumValue>, field: &str) -> Result<i32, String> {
    let Some(EnumValue(value)) = value else {
        return Ok(0);
    };
    let known = match value {
        Value::String(name) => RateLimitUnit::from_str_name(name).map(|u| u as i32),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| RateLimitUnit::try_from(*n).is_ok()),
        _ => None,
    };
    known.ok_or_else(|| {
        format!(
            "{field} must be one of UNKNOWN, SECOND, MINUTE, HOUR, DAY, MONTH, YEAR (or 0 to 6), not {value}"
        )
    })
}

fn to_request(json: JsonRequest) -> Result<RateLimitRequest, String> {
    let mut descriptors = Vec::with_capacity(json.descriptors.len());
    for (index, d) in json.descriptors.into_iter().enumerate() {
        let field = |name: &str| format!("descriptors[{index}].{name}");
        let limit = match d.limit {
            None => None,
            Some(o) => Some(RateLimitOverride {
                requests_per_unit: u32_field(
                    &o.requests_per_unit,
                    &field("limit.requestsPerUnit"),
                )?,
                unit: unit(&o.unit, &field("limit.unit"))?,
            }),
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend: match d.hits_addend {
                None => None,
                Some(n) => Some(UInt64Value {
                    value: n.get(&field("hitsAddend"), u64::MAX)?,
                }),
            },
            is_negative_hits: d.is_negative_hits,
        });
    }
    Ok(RateLimitRequest {
        domain: json.domain,
        descriptors,
        hits_addend: u32_field(&json.hits_addend, "hitsAddend")?,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// proto3 JSON of a response: camelCase names, enums by name, zero values omitted.
pub fn response_json(response: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                let unit = Unit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
                limit.insert("unit".into(), json!(unit));
                m.insert("currentLimit".into(), Value::Object(limit));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(m)
        })
        .collect();
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(m) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(m));
    }
    Value::Object(out)
}

/// A protobuf Struct as proto3 JSON (a plain JSON object).
fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::NumberValue(n)) => json!(n),
            Some(Kind::StringValue(s)) => json!(s),
            Some(Kind::BoolValue(b)) => json!(b),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
        }
    }
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

pub(super) async fn json<B: Backend>(State(admin): AdminState<B>, body: Bytes) -> Response {
    let parsed: JsonRequest = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON request: {e}"),
            );
        }
    };
    let request = match to_request(parsed) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let Decision { now, result } = admin.engine.decide(&request).await;
    if let Some(recorder) = &admin.recorder {
        recorder.record(now, &request, result.as_ref().ok());
    }
    match result {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(response_json(&response))).into_response()
        }
        Err(EngineError::Invalid(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ EngineError::Store(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
