//! `POST /json`: the reference's JSON form of ShouldRateLimit. The body is a proto3-JSON
//! RateLimitRequest (camelCase or original field names, enums by name or number); the answer is a
//! proto3-JSON RateLimitResponse (zero values omitted) with HTTP 200 for OK, 429 for OVER_LIMIT,
//! 400 for bad input and 500 when the store fails. A `serve --record` line is a valid body: its
//! `v`, `time` and `decision` are accepted and ignored.
//!
//! Before the body is read: a `Content-Type` other than `application/json` is refused with 415
//! (a web page can send `text/plain`, form or multipart bodies cross-site without a preflight, and
//! would spend a victim's quota; `application/json` needs a preflight, which this port never
//! grants), and a `Content-Length` above [`MAX_BODY_BYTES`] with 413, so `Expect: 100-continue`
//! gets its refusal instead of `100 Continue`.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
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
use crate::engine::EngineError;
use crate::front::Refused;
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

/// Whether reading a body failed on its length bound.
fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
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

/// The largest `/json` body read: far above any request (`MAX_REQUEST_BYTES` is 64 KiB in
/// protobuf; its JSON, or a record line, is a few times that), and the limit axum applies by
/// default, now checked before reading.
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// Why a body is refused before it is read, if it is: its type is not JSON (415), or it announces
/// more than [`MAX_BODY_BYTES`] (413).
fn refuse_before_reading(headers: &HeaderMap) -> Option<Response> {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = length.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return Some(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body announces {length} bytes; /json reads at most {MAX_BODY_BYTES}"),
        ));
    }
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str());
    let is_json = matches!(content_type, Some(Ok(t)) if is_json_media_type(t));
    if !is_json {
        let got = match content_type {
            None => "none".to_owned(),
            Some(Ok(t)) => format!("'{t}'"),
            Some(Err(_)) => "a value that is not text".to_owned(),
        };
        return Some(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type must be application/json (got {got}): /json refuses other types so \
                 that a web page cannot spend quota from a browser (curl: -H 'Content-Type: \
                 application/json')"
            ),
        ));
    }
    None
}

/// `application/json`, in any case, with or without parameters (`; charset=utf-8`).
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

pub(super) async fn json<B: Backend>(
    State(admin): AdminState<B>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let front = &admin.front;
    let refuse = |why: Refused, status: StatusCode, message: String| {
        front.refused(why);
        error(status, message)
    };
    if let Some(refused) = refuse_before_reading(&headers) {
        let why = if refused.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Refused::TooLarge
        } else {
            Refused::InvalidArgument
        };
        front.refused(why);
        return refused;
    }
    // A body without a Content-Length (chunked) is bounded as it is read.
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(e) if is_length_limit(&e) => {
            let message = format!("cannot read the body: {e}");
            return refuse(Refused::TooLarge, StatusCode::PAYLOAD_TOO_LARGE, message);
        }
        Err(e) => {
            let message = format!("cannot read the body: {e}");
            return refuse(Refused::Transport, StatusCode::BAD_REQUEST, message);
        }
    };
    let parsed: JsonRequest = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            let message = format!("invalid JSON request: {e}");
            return refuse(Refused::InvalidArgument, StatusCode::BAD_REQUEST, message);
        }
    };
    let request = match to_request(parsed) {
        Ok(r) => r,
        Err(e) => return refuse(Refused::InvalidArgument, StatusCode::BAD_REQUEST, e),
    };
    match admin.front.decide(&request).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn refused(pairs: &[(&str, &str)]) -> Option<StatusCode> {
        refuse_before_reading(&headers(pairs)).map(|r| r.status())
    }

    #[test]
    fn only_json_bodies_of_a_bounded_length_are_read() {
        for json in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
        ] {
            assert_eq!(refused(&[("content-type", json)]), None, "{json}");
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert_eq!(
                refused(&[("content-type", other)]),
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{other}"
            );
        }
        assert_eq!(refused(&[]), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
        let json = ("content-type", "application/json");
        assert_eq!(refused(&[json, ("content-length", "2097152")]), None);
        for huge in ["2097153", "100000000000"] {
            assert_eq!(
                refused(&[json, ("content-length", huge)]),
                Some(StatusCode::PAYLOAD_TOO_LARGE)
            );
            // The length is checked first: a huge body of another type is 413 too.
            assert_eq!(
                refused(&[("content-length", huge)]),
                Some(StatusCode::PAYLOAD_TOO_LARGE)
            );
        }
    }
}
