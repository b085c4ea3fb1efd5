//! The complete reader of a record line: serde_json, so every JSON form of the line is read
//! (escapes, any whitespace, non-ASCII, numbers as strings) and a bad line gets serde's message,
//! which names the column. `scan` is the fast path in front of it. Pure.

use std::borrow::Cow;
use std::fmt;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::super::time::parse_instant;
use super::{VERSION, set};
use crate::clock::Nanos;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
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
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor<'a> {
    #[serde(borrow, default)]
    entries: Vec<JsonEntry<'a>>,
    #[serde(default)]
    limit: Option<Override>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<Number>,
}

#[derive(Deserialize)]
struct JsonEntry<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    value: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Override {
    #[serde(default, alias = "requests_per_unit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<UnitValue>,
}

/// A proto3-JSON integer: a number, or a string of digits (as 64-bit integers are written).
struct Number(u64);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a whole number (or a string of digits)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Number, E> {
                Ok(Number(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Number, E> {
                s.parse()
                    .map(Number)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// A proto3-JSON `RateLimitUnit`: its name, or any number an `int32` holds (gRPC carries unknown
/// enum numbers, and the server records what it was sent; the engine refuses such a request, and
/// so replay counts it refused rather than skipping the line).
struct UnitValue(i32);

impl<'de> Deserialize<'de> for UnitValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = UnitValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a unit: SECOND, MINUTE, HOUR, DAY, MONTH, YEAR (or its number)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<UnitValue, E> {
                i32::try_from(n)
                    .map(UnitValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<UnitValue, E> {
                i32::try_from(n)
                    .map(UnitValue)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<UnitValue, E> {
                RateLimitUnit::from_str_name(s)
                    .map(|u| UnitValue(u as i32))
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// Fills `out` (reusing its strings and vectors) from a record line; returns the line's time.
/// The error says what is wrong with the line (serde's message names the column).
pub(super) fn parse_into(line: &[u8], out: &mut RateLimitRequest) -> Result<Nanos, String> {
    let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    match parsed.v {
        Some(VERSION) => {}
        Some(v) => return Err(format!("format version {v} (this replay reads {VERSION})")),
        None => return Err("no format version `v` (not a record line)".into()),
    }
    let time = parsed.time.ok_or("no `time`")?;
    let time = parse_instant(&time).map_err(|e| e.describe("time", &time))?;
    set(&mut out.domain, &parsed.domain);
    out.hits_addend = match parsed.hits_addend {
        None => 0,
        Some(Number(n)) => u32::try_from(n).map_err(|_| format!("hitsAddend {n} exceeds u32"))?,
    };
    out.descriptors.truncate(parsed.descriptors.len());
    for (i, d) in parsed.descriptors.into_iter().enumerate() {
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
                requests_per_unit: match o.requests_per_unit {
                    None => 0,
                    Some(Number(n)) => u32::try_from(n).map_err(|_| {
                        format!("descriptors[{i}].limit.requestsPerUnit {n} exceeds u32")
                    })?,
                },
                unit: o.unit.map_or(0, |u| u.0),
            }),
        };
        to.hits_addend = d.hits_addend.map(|Number(value)| UInt64Value { value });
    }
    Ok(time)
}
