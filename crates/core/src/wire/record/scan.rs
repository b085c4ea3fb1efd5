//! The fast path of reading a record line: one pass over its bytes, writing straight into the
//! reused request, for lines in the form `serve --record` writes them. It reads a subset of JSON
//! exactly as the JSON form's reader (`wire::json`) reads it and declines (`None`) the rest: a line
//! that is not UTF-8; a string with an escape or a control character; a number that is not plain
//! digits; `null` where a field is read; a repeated or unknown field; a `decision` nested deeper
//! than [`MAX_DEPTH`]; and every line that reader refuses (no or another version, a bad time, a
//! number out of range, a missing entry key). A declined line is read again by that reader, so
//! what `record::parse_into` answers is always its answer. Pure.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;

use super::VERSION;
use crate::clock::Nanos;
use crate::wire::json::set;
use crate::wire::time::parse_rfc3339;

/// Deepest nesting of a skipped value (the `decision`); deeper lines are left to serde (whose own
/// limit is 128).
const MAX_DEPTH: usize = 32;

/// Fields seen so far in one object, one bit each: a repeated field is an error for serde.
#[derive(Default)]
struct Seen(u8);

impl Seen {
    /// Marks `field`; `None` if it was already there.
    fn first(&mut self, field: u8) -> Option<()> {
        let bit = 1 << field;
        (self.0 & bit == 0).then(|| self.0 |= bit)
    }

    fn has(&self, field: u8) -> bool {
        self.0 & (1 << field) != 0
    }
}

/// The line, checked as UTF-8 once (so the strings cut from it need no check of their own: they
/// end at a `"`, which is never inside a multi-byte character), and the position read up to.
/// Where a string's text ends: the first `"`, `\\` or control byte of `bytes`. Eight bytes at a
/// time, with the classic "has a zero byte" bit trick on each: in a word, the lowest byte it flags
/// is always a true one (a false flag can only sit above a true one).
fn string_end(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x;
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let x = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let flags = (zero_bytes(x ^ (ONES * u64::from(b'"')))
            | zero_bytes(x ^ (ONES * u64::from(b'\\')))
            // Bytes below 0x20: subtracting 0x20 borrows out of them alone.
            | (x.wrapping_sub(ONES * 0x20) & !x))
            & HIGHS;
        if flags != 0 {
            return Some(at + flags.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let tail = words.remainder();
    tail.iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|p| at + p)
}

struct Cursor<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Skips JSON whitespace.
    #[inline]
    fn blank(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.blank();
        self.bytes.get(self.at).copied()
    }

    /// Consumes `byte` (after whitespace), or declines.
    #[inline]
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// After an item of an object or array: true if `,` (another item follows), false if `close`.
    #[inline]
    fn more(&mut self, close: u8) -> Option<bool> {
        let next = self.peek()?;
        self.at += 1;
        match next {
            b',' => Some(true),
            _ if next == close => Some(false),
            _ => None,
        }
    }

    /// A string with no escape and no control character.
    #[inline]
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let len = string_end(&self.bytes[start..])?;
        if self.bytes[start + len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        self.text.get(start..start + len)
    }

    /// A JSON number of plain digits that fits a u64 (no sign, fraction, exponent or leading zero).
    #[inline]
    fn digits(&mut self) -> Option<u64> {
        self.blank();
        let rest = &self.bytes[self.at..];
        let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0
            || (len > 1 && rest[0] == b'0')
            || matches!(rest.get(len), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        let mut n: u64 = 0;
        for &d in &rest[..len] {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        self.at += len;
        Some(n)
    }

    /// A proto3-JSON integer as `wire::json` reads one: plain digits, or a string that
    /// `str::parse::<u64>` reads.
    fn integer(&mut self) -> Option<u64> {
        match self.peek()? {
            b'"' => self.string()?.parse().ok(),
            _ => self.digits(),
        }
    }

    /// A `RateLimitUnit`: its name, or a number an `int32` holds (negative ones left to serde).
    fn unit(&mut self) -> Option<i32> {
        match self.peek()? {
            b'"' => RateLimitUnit::from_str_name(self.string()?).map(|u| u as i32),
            _ => i32::try_from(self.digits()?).ok(),
        }
    }

    /// `{ "name": value, … }`: `member` reads each value, given its name.
    #[inline]
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let name = self.string()?;
            self.eat(b':')?;
            member(self, name)?;
            if !self.more(b'}')? {
                return Some(());
            }
        }
    }

    /// `[ item, … ]`: `item` reads each.
    #[inline]
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            if !self.more(b']')? {
                return Some(());
            }
        }
    }

    /// `true` or `false`.
    fn boolean(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => None,
        }
    }

    /// Steps over the value of a field read and ignored (a record line's `decision`).
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(|c, _| c.skip(depth + 1)),
            b'[' => self.array(|c| c.skip(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.digits().map(drop),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An array into `out`, each element read by `read` into the one already there (reused) or a
    /// new default one; `out` ends as long as the array.
    fn array_into<T: Default>(
        &mut self,
        out: &mut Vec<T>,
        mut read: impl FnMut(&mut Self, &mut T) -> Option<()>,
    ) -> Option<()> {
        let mut n = 0;
        self.array(|c| {
            if n == out.len() {
                out.push(T::default());
            }
            read(c, &mut out[n])?;
            n += 1;
            Some(())
        })?;
        out.truncate(n);
        Some(())
    }

    fn descriptor(&mut self, to: &mut RateLimitDescriptor) -> Option<()> {
        const ENTRIES: u8 = 0;
        const LIMIT: u8 = 1;
        const HITS: u8 = 2;
        const NEGATIVE: u8 = 3;
        let mut seen = Seen::default();
        to.limit = None;
        to.hits_addend = None;
        to.is_negative_hits = false;
        self.object(|c, name| match name {
            "entries" => {
                seen.first(ENTRIES)?;
                c.array_into(&mut to.entries, Self::entry)
            }
            "limit" => {
                seen.first(LIMIT)?;
                to.limit = Some(c.limit()?);
                Some(())
            }
            "hitsAddend" | "hits_addend" => {
                seen.first(HITS)?;
                to.hits_addend = Some(UInt64Value {
                    value: c.integer()?,
                });
                Some(())
            }
            "isNegativeHits" | "is_negative_hits" => {
                seen.first(NEGATIVE)?;
                to.is_negative_hits = c.boolean()?;
                Some(())
            }
            // An unknown field: the JSON form refuses it.
            _ => None,
        })?;
        if !seen.has(ENTRIES) {
            to.entries.clear();
        }
        Some(())
    }

    fn entry(&mut self, to: &mut Entry) -> Option<()> {
        const KEY: u8 = 0;
        const VALUE: u8 = 1;
        let mut seen = Seen::default();
        self.object(|c, name| match name {
            "key" => {
                seen.first(KEY)?;
                set(&mut to.key, c.string()?);
                Some(())
            }
            "value" => {
                seen.first(VALUE)?;
                set(&mut to.value, c.string()?);
                Some(())
            }
            _ => None,
        })?;
        // serde: "missing field `key`".
        seen.has(KEY).then_some(())?;
        if !seen.has(VALUE) {
            to.value.clear();
        }
        Some(())
    }

    fn limit(&mut self) -> Option<RateLimitOverride> {
        const RPU: u8 = 0;
        const UNIT: u8 = 1;
        let mut seen = Seen::default();
        let mut limit = RateLimitOverride::default();
        self.object(|c, name| match name {
            "requestsPerUnit" | "requests_per_unit" => {
                seen.first(RPU)?;
                limit.requests_per_unit = u32::try_from(c.integer()?).ok()?;
                Some(())
            }
            "unit" => {
                seen.first(UNIT)?;
                limit.unit = c.unit()?;
                Some(())
            }
            _ => None,
        })?;
        Some(limit)
    }
}

/// Fills `out` from `line` and returns the line's time, or `None` when the line is not in the
/// subset this path reads (then `out` may be half written: `wire::json` rewrites all of it).
pub(super) fn parse_into(line: &[u8], out: &mut RateLimitRequest) -> Option<Nanos> {
    const V: u8 = 0;
    const TIME: u8 = 1;
    const DOMAIN: u8 = 2;
    const DESCRIPTORS: u8 = 3;
    const HITS: u8 = 4;
    const DECISION: u8 = 5;
    let text = std::str::from_utf8(line).ok()?;
    let mut c = Cursor {
        text,
        bytes: line,
        at: 0,
    };
    let mut seen = Seen::default();
    let (mut version, mut time, mut hits) = (None, None, None);
    c.object(|c, name| match name {
        "v" => {
            seen.first(V)?;
            version = Some(c.digits()?);
            Some(())
        }
        "time" => {
            seen.first(TIME)?;
            time = Some(c.string()?);
            Some(())
        }
        "domain" => {
            seen.first(DOMAIN)?;
            set(&mut out.domain, c.string()?);
            Some(())
        }
        "descriptors" => {
            seen.first(DESCRIPTORS)?;
            c.array_into(&mut out.descriptors, Cursor::descriptor)
        }
        "hitsAddend" | "hits_addend" => {
            seen.first(HITS)?;
            hits = Some(c.integer()?);
            Some(())
        }
        "decision" => {
            seen.first(DECISION)?;
            c.skip(1)
        }
        _ => None,
    })?;
    c.blank();
    if c.at != line.len() || version != Some(VERSION) {
        return None;
    }
    let time = parse_rfc3339(time?)?;
    out.hits_addend = u32::try_from(hits.unwrap_or(0)).ok()?;
    if !seen.has(DOMAIN) {
        out.domain.clear();
    }
    if !seen.has(DESCRIPTORS) {
        out.descriptors.clear();
    }
    Some(time)
}
