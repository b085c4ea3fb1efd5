//! The JSON form of a RateLimitRequest — the reference's `POST /json` body, and what a record line
//! holds beside its `v`, `time` and `decision` — read in one place: serde_json (every JSON form:
//! escapes, any whitespace, camelCase or the proto's names, 64-bit integers as numbers or
//! strings, enums by name or number; unknown fields refused), into a request the caller reuses,
//! with messages that name the field. And the JSON form of a response. Pure.

use std::borrow::Cow;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Body<'a> {
    #[serde(default)]
    v: Option<u64>,
    #[serde(borrow, default)]
    time: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    domain: Cow<'a, str>,
    #[serde(borrow, default)]
    descriptors: Vec<Descriptor<'a>>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Number>,
    /// A record line's answer: accepted and ignored, so a record line is a valid body.
    #[serde(default)]
    decision: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Descriptor<'a> {
    #[serde(borrow, default)]
    entries: Vec<JsonEntry<'a>>,
    #[serde(default)]
    limit: Option<Override>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Number>,
    #[serde(default, alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    value: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Override {
    #[serde(default, alias = "requests_per_unit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<Value>,
}

/// A proto3-JSON integer: a JSON number or, as proto3 JSON writes 64-bit integers, a string.
/// Checked after parsing (not by serde), so a bad value gets a message naming its field.
#[derive(Deserialize)]
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

fn u32_field(n: &Option<Number>, field: &str) -> Result<u32, String> {
    match n {
        None => Ok(0),
        // `get` bounds the value by u32::MAX.
        Some(n) => Ok(n.get(field, u64::from(u32::MAX))? as u32),
    }
}

/// A `RateLimitUnit`: its name, or any number an `int32` holds (gRPC carries enum numbers it does
/// not know, and so does this form; the engine refuses a unit it does not know).
fn unit(value: &Option<Value>, field: &str) -> Result<i32, String> {
    let Some(value) = value else {
        return Ok(0);
    };
    let known = match value {
        Value::String(name) => RateLimitUnit::from_str_name(name).map(|u| u as i32),
        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        _ => None,
    };
    known.ok_or_else(|| {
        format!(
            "{field} must be one of UNKNOWN, SECOND, MINUTE, HOUR, DAY, MONTH, YEAR (or its number), not {value}"
        )
    })
}

/// What a body says besides its request: a record line's format version and time.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub(crate) version: Option<u64>,
    pub(crate) time: Option<Cow<'a, str>>,
}

/// Copies `text` into `to`, keeping `to`'s allocation.
pub(crate) fn set(to: &mut String, text: &str) {
    to.clear();
    to.push_str(text);
}

/// Reads a JSON body into `out` (reusing its strings and vectors: a line costs no allocation once
/// they have grown). The error says what is wrong: serde's message (which names the column), or
/// the field whose value is out of range.
pub(crate) fn read_into<'a>(
    json: &'a [u8],
    out: &mut RateLimitRequest,
) -> Result<Envelope<'a>, String> {
    let body: Body<'a> =
        serde_json::from_slice(json).map_err(|e| format!("invalid JSON request: {e}"))?;
    let _ = body.decision;
    set(&mut out.domain, &body.domain);
    out.hits_addend = u32_field(&body.hits_addend, "hitsAddend")?;
    out.descriptors.truncate(body.descriptors.len());
    for (i, d) in body.descriptors.into_iter().enumerate() {
        let field = |name: &str| format!("descriptors[{i}].{name}");
        if i == out.descriptors.len() {
            out.descriptors.push(RateLimitDescriptor::default());
        }
        let to = &mut out.descriptors[i];
        to.entries.truncate(d.entries.len());
        for (j, e) in d.entries.iter().enumerate() {
            if j == to.entries.len() {
                to.entries.push(Entry::default());
            }
            set(&mut to.entries[j].key, &e.key);
            set(&mut to.entries[j].value, &e.value);
        }
        to.limit = match d.limit {
            None => None,
            Some(o) => Some(RateLimitOverride {
                requests_per_unit: u32_field(
                    &o.requests_per_unit,
                    &field("limit.requestsPerUnit"),
                )?,
                unit: unit(&o.unit, &field("limit.unit"))?,
            }),
        };
        to.hits_addend = match d.hits_addend {
            None => None,
            Some(n) => Some(UInt64Value {
                value: n.get(&field("hitsAddend"), u64::MAX)?,
            }),
        };
        to.is_negative_hits = d.is_negative_hits;
    }
    Ok(Envelope {
        version: body.v,
        time: body.time,
    })
}

/// Reads a JSON body into a new request.
pub fn read(json: &[u8]) -> Result<RateLimitRequest, String> {
    let mut request = RateLimitRequest::default();
    read_into(json, &mut request)?;
    Ok(request)
}

/// The name of a response code (`UNKNOWN` for a number it does not know).
pub(crate) fn code_name(code: i32) -> &'static str {
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
