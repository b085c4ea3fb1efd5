//! Target `record`: record lines (docs/record.md) read by replay's reader. It must not panic; a
//! line it reads must come back the same through the recorder's encoder (encode the request it
//! read, read that line: the same time and the same request); and it must say why it skips a line.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimit_server::record::{Decided, Values, encode};
use ratelimit_server::wire::record::parse_into;

use crate::input::Choices;

pub const DICTIONARY: &[&[u8]] = &[
    br#"{"v":1,"time":"2026-12-01T05:00:00.123456789Z","#,
    br#""domain":"edge""#,
    br#""descriptors":["#,
    br#"{"entries":["#,
    br#"{"key":"remote_address","value":"10.0.0.7"}"#,
    br#""limit":{"requestsPerUnit":5,"unit":"MINUTE"}"#,
    br#""hitsAddend":"3""#,
    br#""hits_addend":1"#,
    br#""decision":{"code":"OK","statuses":["OK"]}"#,
    br#""isNegativeHits":true"#,
    b"\\u00e9",
    b"\\\"",
    b"null",
    b"1e3",
    b"-1",
    b"18446744073709551616",
    "é".as_bytes(),
    b"]}",
    b"},{",
];

/// A record line from the grammar: the recorder's fields (and others) with values drawn from
/// lists of fitting and unfitting ones.
pub fn generate(c: &mut Choices<'_>) -> Vec<u8> {
    const STRINGS: &[&str] = &[
        r#""k""#,
        r#""10.0.0.7""#,
        r#""""#,
        r#""/v1/search?q=1""#,
        r#""\"q\"""#,
        r#""\u00e9""#,
        "\"é\"",
        r#""h:00ff""#,
    ];
    const NUMBERS: &[&str] = &[
        "0",
        "1",
        "7",
        r#""7""#,
        "4294967295",
        "4294967296",
        "-1",
        "1.5",
    ];
    const UNITS: &[&str] = &[r#""MINUTE""#, r#""SECOND""#, "3", "99", r#""FORTNIGHT""#];
    let mut line = String::from("{");
    let mut fields: Vec<String> = Vec::new();
    if c.chance(90) {
        fields.push(r#""v":1"#.to_owned());
    }
    if c.chance(90) {
        fields.push(r#""time":"2026-12-01T05:00:00.5Z""#.to_owned());
    }
    if c.chance(90) {
        fields.push(format!(r#""domain":{}"#, c.pick(STRINGS)));
    }
    if c.chance(50) {
        fields.push(format!(r#""hitsAddend":{}"#, c.pick(NUMBERS)));
    }
    let mut descriptors = Vec::new();
    for _ in 0..c.below(4) {
        let mut parts = Vec::new();
        let entries: Vec<String> = (0..c.below(4))
            .map(|_| {
                let key = c.pick(STRINGS);
                match c.below(8) {
                    0 => format!(r#"{{"value":{key}}}"#),
                    1 => format!(r#"{{"key":{key}}}"#),
                    _ => format!(r#"{{"key":{key},"value":{}}}"#, c.pick(STRINGS)),
                }
            })
            .collect();
        parts.push(format!(r#""entries":[{}]"#, entries.join(",")));
        if c.chance(25) {
            parts.push(format!(
                r#""limit":{{"requestsPerUnit":{},"unit":{}}}"#,
                c.pick(NUMBERS),
                c.pick(UNITS)
            ));
        }
        if c.chance(25) {
            parts.push(format!(r#""hitsAddend":{}"#, c.pick(NUMBERS)));
        }
        descriptors.push(format!("{{{}}}", parts.join(",")));
    }
    fields.push(format!(r#""descriptors":[{}]"#, descriptors.join(",")));
    if c.chance(70) {
        fields.push(r#""decision":{"code":"OK","statuses":["OK"]}"#.to_owned());
    }
    // Shuffle by rotation, so fields come in any order.
    let turn = c.below(fields.len());
    fields.rotate_left(turn);
    line.push_str(&fields.join(","));
    line.push('}');
    line.into_bytes()
}

pub fn check(input: &[u8]) -> Result<(), String> {
    let mut request = RateLimitRequest::default();
    let time = match parse_into(input, &mut request) {
        Ok(time) => time,
        Err(why) if why.is_empty() => return Err("a line was skipped with no reason".into()),
        Err(_) => return Ok(()),
    };
    let mut line = Vec::new();
    let decided = Decided {
        time,
        request: &request,
        answer: None,
    };
    encode(&decided, &Values::Clear, &mut line);
    let mut again = RateLimitRequest::default();
    match parse_into(line.strip_suffix(b"\n").unwrap_or(&line), &mut again) {
        Ok(t) if t == time && again == request => Ok(()),
        Ok(t) => Err(format!(
            "read back differently: time {t} (was {time}), {again:?} (was {request:?})"
        )),
        Err(why) => Err(format!(
            "the encoder's line {} does not read back: {why}",
            String::from_utf8_lossy(&line)
        )),
    }
}
