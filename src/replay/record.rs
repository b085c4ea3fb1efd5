//! One record line (format version 1, `docs/record.md`) → its time and the RateLimitRequest it
//! holds, parsed with borrowed strings and written into a request the caller reuses, so a line
//! costs no allocation once the buffers have grown. Pure.

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

use super::time::parse_rfc3339;
use crate::clock::Nanos;

/// The format version this reader understands.
pub const VERSION: u64 = 1;

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

/// A proto3-JSON `RateLimitUnit`: its name or its number.
struct UnitValue(i32);

impl<'de> Deserialize<'de> for UnitValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = UnitValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a unit: SECOND, MINUTE, HOUR, DAY, MONTH, YEAR (or 0 to 6)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<UnitValue, E> {
                i32::try_from(n)
                    .ok()
                    .filter(|n| RateLimitUnit::try_from(*n).is_ok())
                    .map(UnitValue)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(n), &self))
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

/// Copies `text` into `to`, keeping `to`'s allocation.
fn set(to: &mut String, text: &str) {
    to.clear();
    to.push_str(text);
}

/// Fills `out` (reusing its strings and vectors) from a record line; returns the line's time.
/// The error says what is wrong with the line (serde's message names the column).
pub fn parse_into(line: &[u8], out: &mut RateLimitRequest) -> Result<Nanos, String> {
    let parsed: Line<'_> = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    match parsed.v {
        Some(VERSION) => {}
        Some(v) => return Err(format!("format version {v} (this replay reads {VERSION})")),
        None => return Err("no format version `v` (not a record line)".into()),
    }
    let time = parsed.time.ok_or("no `time`")?;
    let time = parse_rfc3339(&time).ok_or_else(|| format!("`time` {time:?} is not RFC 3339"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND;

    const DOC_EXAMPLE: &str = r#"{"v":1,"time":"2026-12-01T05:00:00.123456789Z","domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]}],"hitsAddend":1,"decision":{"code":"OK","statuses":["OK"]}}"#;

    #[test]
    fn reads_the_documented_example() {
        let mut r = RateLimitRequest::default();
        let t = parse_into(DOC_EXAMPLE.as_bytes(), &mut r).expect("valid line");
        assert_eq!(t, 1_796_101_200 * NANOS_PER_SECOND + 123_456_789);
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 1);
        assert_eq!(r.descriptors.len(), 1);
        assert_eq!(r.descriptors[0].entries[0].key, "remote_address");
        assert_eq!(r.descriptors[0].entries[0].value, "10.0.0.7");
        assert_eq!(r.descriptors[0].limit, None);
    }

    #[test]
    fn a_reused_request_holds_only_the_new_line() {
        let mut r = RateLimitRequest::default();
        let long = r#"{"v":1,"time":"2026-12-01T05:00:00Z","domain":"a","descriptors":[{"entries":[{"key":"k","value":"v"},{"key":"p","value":"/x"}],"limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"3"},{"entries":[{"key":"z","value":"\u0041"}]}]}"#;
        parse_into(long.as_bytes(), &mut r).expect("valid");
        assert_eq!(r.descriptors.len(), 2);
        assert_eq!(r.descriptors[1].entries[0].value, "A");
        let limit = r.descriptors[0].limit.expect("override");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (5, RateLimitUnit::Minute as i32)
        );
        assert_eq!(r.descriptors[0].hits_addend.map(|h| h.value), Some(3));
        let short = r#"{"v":1,"time":"2026-12-01T05:00:01Z","domain":"b","descriptors":[{"entries":[{"key":"k","value":"w"}]}]}"#;
        parse_into(short.as_bytes(), &mut r).expect("valid");
        let mut expected = RateLimitRequest {
            domain: "b".into(),
            ..Default::default()
        };
        expected.descriptors.push(RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "w".into(),
            }],
            ..Default::default()
        });
        assert_eq!(r, expected);
    }

    #[test]
    fn bad_lines_say_why() {
        let mut r = RateLimitRequest::default();
        let why =
            |line: &str| parse_into(line.as_bytes(), &mut RateLimitRequest::default()).unwrap_err();
        assert!(
            why(r#"{"v":1,"time":"2026-12-01T05:00:00Z","domain":"edge","descr"#).contains("EOF")
        );
        assert!(why(r#"{"time":"2026-12-01T05:00:00Z"}"#).contains("no format version"));
        assert!(why(r#"{"v":2,"time":"2026-12-01T05:00:00Z"}"#).contains("version 2"));
        assert!(why(r#"{"v":1}"#).contains("no `time`"));
        assert!(why(r#"{"v":1,"time":"yesterday"}"#).contains("not RFC 3339"));
        assert!(
            why(r#"{"v":1,"time":"2026-12-01T05:00:00Z","hitsAddend":5000000000}"#)
                .contains("exceeds u32")
        );
        assert!(why(r#"{"v":1,"time":"2026-12-01T05:00:00Z","descriptors":[{"entries":[],"limit":{"unit":"FORTNIGHT"}}]}"#).contains("FORTNIGHT"));
        assert!(why("\u{0}").contains("expected value"));
        // A failed line leaves the request usable.
        assert!(parse_into(DOC_EXAMPLE.as_bytes(), &mut r).is_ok());
    }
}
