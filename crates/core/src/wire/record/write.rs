//! The record line's writer (docs/record.md, format [`VERSION`]) as pure code: one request, the
//! instant it was decided at and the answer given → one JSON line, values in clear or as keyed
//! hashes.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use smallvec::SmallVec;

use super::VERSION;
use crate::clock::Nanos;
use crate::wire::time::rfc3339;

/// Writes the keyed hash of a descriptor value (`serve --record --record-hash-values`): the
/// recorder's secret, kept out of this module.
pub trait HashValue {
    /// Appends the hash of `value` as the line writes it (hex digits).
    fn write_hex(&self, value: &str, out: &mut Vec<u8>);
}

/// The answer a request got: the overall code and each descriptor's, or `None` when the engine
/// refused the request (recorded as `UNKNOWN` with no statuses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub code: i32,
    pub statuses: SmallVec<[i32; 4]>,
}

/// One decision to record: what was asked, when it was decided, and what was answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided<'r> {
    pub time: Nanos,
    pub request: &'r RateLimitRequest,
    pub answer: Option<Answer>,
}

/// How descriptor values are written.
pub enum Values<'a> {
    Clear,
    /// Keyed hashes, except the values `named(domain, key, value)` says the live rules name.
    Hashed {
        key: &'a dyn HashValue,
        named: &'a dyn Fn(&str, &str, &str) -> bool,
    },
}

/// Appends the record line of `decided` (with its `\n`) to `out`.
pub fn encode(decided: &Decided<'_>, values: &Values<'_>, out: &mut Vec<u8>) {
    let r = decided.request;
    out.extend_from_slice(b"{\"v\":");
    number(VERSION, out);
    out.extend_from_slice(b",\"time\":\"");
    rfc3339(decided.time, out);
    out.extend_from_slice(b"\",\"domain\":");
    string(&r.domain, out);
    out.extend_from_slice(b",\"descriptors\":[");
    for (i, d) in r.descriptors.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        descriptor(&r.domain, d, values, out);
    }
    out.push(b']');
    if r.hits_addend != 0 {
        out.extend_from_slice(b",\"hitsAddend\":");
        number(u64::from(r.hits_addend), out);
    }
    decision(decided.answer.as_ref(), out);
}

/// One descriptor: its entries, its limit override, its own hits.
fn descriptor(domain: &str, d: &RateLimitDescriptor, values: &Values<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"entries\":[");
    for (j, e) in d.entries.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        string(&e.key, out);
        out.extend_from_slice(b",\"value\":");
        match values {
            Values::Hashed { key, named } if !named(domain, &e.key, &e.value) => {
                out.extend_from_slice(b"\"h:");
                key.write_hex(&e.value, out);
                out.push(b'"');
            }
            _ => string(&e.value, out),
        }
        out.push(b'}');
    }
    out.push(b']');
    if let Some(limit) = &d.limit {
        limit_override(limit, out);
    }
    if let Some(hits) = &d.hits_addend {
        // proto3 JSON writes a 64-bit integer as a string.
        out.extend_from_slice(b",\"hitsAddend\":\"");
        number(hits.value, out);
        out.push(b'"');
    }
    if d.is_negative_hits {
        out.extend_from_slice(b",\"isNegativeHits\":true");
    }
    out.push(b'}');
}

/// A descriptor's `limit` override, its zero fields left out as proto3 JSON does.
fn limit_override(limit: &RateLimitOverride, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"limit\":{");
    let mut comma = false;
    if limit.requests_per_unit != 0 {
        out.extend_from_slice(b"\"requestsPerUnit\":");
        number(u64::from(limit.requests_per_unit), out);
        comma = true;
    }
    if limit.unit != 0 {
        if comma {
            out.push(b',');
        }
        out.extend_from_slice(b"\"unit\":");
        match RateLimitUnit::try_from(limit.unit) {
            Ok(unit) => string(unit.as_str_name(), out),
            Err(_) => {
                if limit.unit < 0 {
                    out.push(b'-');
                }
                number(u64::from(limit.unit.unsigned_abs()), out);
            }
        }
    }
    out.push(b'}');
}

/// The answer and the line's end: `UNKNOWN` with no statuses when the engine refused the request.
fn decision(answer: Option<&Answer>, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"decision\":{\"code\":\"");
    match answer {
        None => out.extend_from_slice(b"UNKNOWN\",\"statuses\":[]}}\n"),
        Some(answer) => {
            out.extend_from_slice(code_name(answer.code).as_bytes());
            out.extend_from_slice(b"\",\"statuses\":[");
            for (i, code) in answer.statuses.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'"');
                out.extend_from_slice(code_name(*code).as_bytes());
                out.push(b'"');
            }
            out.extend_from_slice(b"]}}\n");
        }
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A JSON string literal.
fn string(text: &str, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail, and a &str always serialises.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// A whole number in decimal, without allocating.
fn number(n: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;
    use smallvec::smallvec;

    use super::*;
    use crate::clock::NANOS_PER_SECOND;

    fn time_text(time: Nanos) -> String {
        let mut out = Vec::new();
        rfc3339(time, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_are_written_whole() {
        for n in [0, 7, 10, 4_294_967_295, u64::MAX] {
            let mut out = Vec::new();
            number(n, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
        let mut limit = request();
        let odd = &mut limit.descriptors[1];
        odd.limit = Some(RateLimitOverride {
            requests_per_unit: u32::MAX,
            unit: -5,
        });
        let text = line(
            &Decided {
                time: 0,
                request: &limit,
                answer: None,
            },
            &Values::Clear,
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["descriptors"][1]["limit"]["requestsPerUnit"], u32::MAX);
        assert_eq!(json["descriptors"][1]["limit"]["unit"], -5);
    }

    #[test]
    fn times_are_rfc3339_utc_with_nanoseconds() {
        assert_eq!(time_text(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            time_text(1_767_225_610 * NANOS_PER_SECOND + 5),
            "2026-01-01T00:00:10.000000005Z"
        );
        // A leap day, and the last nanosecond of a year.
        assert_eq!(
            time_text(951_782_400 * NANOS_PER_SECOND + 123_456_789),
            "2000-02-29T00:00:00.123456789Z"
        );
        assert_eq!(
            time_text(1_735_689_600 * NANOS_PER_SECOND - 1),
            "2024-12-31T23:59:59.999999999Z"
        );
        assert_eq!(time_text(u64::MAX), "2554-07-21T23:34:33.709551615Z");
    }

    fn request() -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "remote_address".into(),
                        value: "10.0.0.7".into(),
                    }],
                    ..Default::default()
                },
                RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "path".into(),
                            value: "/a\"b\n".into(),
                        },
                        Entry {
                            key: "user".into(),
                            value: "".into(),
                        },
                    ],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 7,
                        unit: RateLimitUnit::Minute as i32,
                    }),
                    hits_addend: Some(UInt64Value { value: 0 }),
                    is_negative_hits: false,
                },
            ],
            hits_addend: 3,
        }
    }

    fn line(decided: &Decided, values: &Values<'_>) -> String {
        let mut out = Vec::new();
        encode(decided, values, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_documented_example_line() {
        let decided = Decided {
            time: 1_796_101_200 * NANOS_PER_SECOND + 123_456_789,
            request: &RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![request().descriptors[0].clone()],
                hits_addend: 1,
            },
            answer: Some(Answer {
                code: Code::Ok as i32,
                statuses: smallvec![Code::Ok as i32],
            }),
        };
        let doc = include_str!("../../../../../docs/record.md");
        let example = doc
            .lines()
            .find(|l| l.starts_with("{\"v\":1"))
            .expect("docs/record.md has an example line");
        assert_eq!(line(&decided, &Values::Clear), format!("{example}\n"));
    }

    #[test]
    fn overrides_hits_and_escapes_are_kept_and_refusals_are_unknown() {
        let decided = Decided {
            time: 0,
            request: &request(),
            answer: None,
        };
        let text = line(&decided, &Values::Clear);
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["hitsAddend"], 3);
        let d = &json["descriptors"][1];
        assert_eq!(d["entries"][0]["value"], "/a\"b\n");
        assert_eq!(d["entries"][1]["value"], "");
        assert_eq!(d["limit"]["requestsPerUnit"], 7);
        assert_eq!(d["limit"]["unit"], "MINUTE");
        assert_eq!(d["hitsAddend"], "0");
        assert_eq!(json["decision"]["code"], "UNKNOWN");
        assert_eq!(json["decision"]["statuses"], serde_json::json!([]));
    }

    /// A stand-in for the recorder's keyed hash: the value's length in hex.
    struct Lengths;

    impl HashValue for Lengths {
        fn write_hex(&self, value: &str, out: &mut Vec<u8>) {
            out.extend_from_slice(format!("{:x}", value.len()).as_bytes());
        }
    }

    impl Lengths {
        fn hash_hex(&self, value: &str) -> String {
            format!("{:x}", value.len())
        }
    }

    #[test]
    fn hashed_values_hide_all_but_named_ones() {
        let key = Lengths;
        let named =
            |domain: &str, k: &str, v: &str| domain == "edge" && k == "path" && v == "/a\"b\n";
        let values = Values::Hashed {
            key: &key,
            named: &named,
        };
        let decided = Decided {
            time: 0,
            request: &request(),
            answer: Some(Answer {
                code: Code::OverLimit as i32,
                statuses: smallvec![Code::Ok as i32, Code::OverLimit as i32],
            }),
        };
        let text = line(&decided, &values);
        assert!(!text.contains("10.0.0.7"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let hashed = json["descriptors"][0]["entries"][0]["value"]
            .as_str()
            .unwrap();
        assert_eq!(hashed, format!("h:{}", key.hash_hex("10.0.0.7")));
        assert_eq!(json["descriptors"][1]["entries"][0]["value"], "/a\"b\n");
        assert_eq!(
            json["descriptors"][1]["entries"][1]["value"],
            format!("h:{}", key.hash_hex(""))
        );
        assert_eq!(json["decision"]["code"], "OVER_LIMIT");
        assert_eq!(
            json["decision"]["statuses"],
            serde_json::json!(["OK", "OVER_LIMIT"])
        );
    }
}
