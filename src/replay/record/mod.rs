//! One record line (format version 1, `docs/record.md`) → its time and the RateLimitRequest it
//! holds, written into a request the caller reuses, so a line costs no allocation once the
//! buffers have grown. Two readers, one answer: `scan` reads the lines `serve --record` writes in
//! one pass and declines anything else, which `serde_line` (serde_json: all of JSON, and the
//! error messages) then reads. Pure.

mod scan;
mod serde_line;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::clock::Nanos;

/// The format version this reader understands.
pub const VERSION: u64 = 1;

/// Copies `text` into `to`, keeping `to`'s allocation.
fn set(to: &mut String, text: &str) {
    to.clear();
    to.push_str(text);
}

/// Fills `out` (reusing its strings and vectors) from a record line; returns the line's time.
/// The error says what is wrong with the line (serde's message names the column).
pub fn parse_into(line: &[u8], out: &mut RateLimitRequest) -> Result<Nanos, String> {
    match scan::parse_into(line, out) {
        Some(time) => Ok(time),
        None => serde_line::parse_into(line, out),
    }
}

#[cfg(test)]
mod tests;
