//! The record line (docs/record.md, format `VERSION`): its writer ([`encode`]) and its reader
//! ([`parse_into`]: the time and the RateLimitRequest a line holds, written into a request the
//! caller reuses). Two readers, one answer: `scan` reads the lines the writer writes in one pass
//! and declines anything else, which the JSON form's reader (`wire::json`, all of JSON and its
//! error messages) then reads. Pure.

mod scan;
mod write;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

pub use write::{Answer, Decided, HashValue, Values, encode};

use super::json;
use super::time::parse_instant;
use crate::clock::Nanos;

/// The format version written, and the only one read.
pub(crate) const VERSION: u64 = 1;

/// Fills `out` (reusing its strings and vectors) from a record line; returns the line's time.
/// The error says what is wrong with the line (serde's message names the column).
pub fn parse_into(line: &[u8], out: &mut RateLimitRequest) -> Result<Nanos, String> {
    match scan::parse_into(line, out) {
        Some(time) => Ok(time),
        None => parse_with_serde(line, out),
    }
}

/// The complete reader: the JSON form's, then the line's own fields.
fn parse_with_serde(line: &[u8], out: &mut RateLimitRequest) -> Result<Nanos, String> {
    let envelope = json::read_into(line, out)?;
    match envelope.version {
        Some(VERSION) => {}
        Some(v) => return Err(format!("format version {v} (this replay reads {VERSION})")),
        None => return Err("no format version `v` (not a record line)".into()),
    }
    let time = envelope.time.ok_or("no `time`")?;
    parse_instant(&time).map_err(|e| e.describe("time", &time))
}

#[cfg(test)]
mod tests;
